//! The HTTP listener and its routes.

use std::io;
use std::net::SocketAddr;
use std::sync::Arc;

use axum::response::Response;
use axum::routing::get;
use axum::serve::ListenerExt;
use axum::{Router, middleware};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tower_http::timeout::RequestBodyTimeoutLayer;

use super::config::HttpConfig;
use super::health::{self, OpsState};
use super::limits::{self, RequestSlots};
use super::serve::serve;
use super::tls::TlsListener;
use crate::adapters::tls::TlsAcceptor;

/// A group of routes served behind the listener's concurrent-request limit (the client
/// APIs), with their own state and layers already applied, and how to refuse a request of
/// theirs when every slot is taken: a `503` with `Retry-After`, in the group's own error
/// shape. The server knows nothing of what the routes serve.
pub struct LimitedRoutes {
    /// The routes.
    pub routes: Router,
    /// The answer to a request that finds no free slot.
    pub refuse: Arc<dyn Fn() -> Response + Send + Sync>,
}

/// The bound HTTP listener.
pub struct HttpServer {
    listener: TcpListener,
    router: Router,
    config: HttpConfig,
    tls: Option<TlsAcceptor>,
}

impl HttpServer {
    /// Binds `config.listen` (with `config.listen_backlog`) and builds the routes: the
    /// operations endpoints, open to all and never limited, the `limited` groups behind the
    /// concurrent-request limit (`config.max_concurrent_requests`, one count for all of
    /// them), and `fallback`'s answer to any other path. Every request body must arrive
    /// within `config.body_read_timeout_ms`.
    ///
    /// # Errors
    /// The socket error when the address cannot be bound.
    pub async fn bind(
        config: HttpConfig,
        ops: OpsState,
        limited: Vec<LimitedRoutes>,
        fallback: Router,
    ) -> io::Result<HttpServer> {
        let listener = crate::adapters::listen::bind(config.listen, config.listen_backlog)?;
        let slots = RequestSlots::new(config.max_concurrent_requests);
        let timeout = RequestBodyTimeoutLayer::new(config.body_read_timeout());
        let mut router = Router::new()
            .route("/healthz", get(health::healthz))
            .route("/readyz", get(health::readyz))
            .route("/metrics", get(health::metrics))
            .with_state(ops)
            .merge(fallback)
            .layer(timeout.clone());
        for group in limited {
            let limit = slots.for_group(group.refuse);
            // One layer of both: axum boxes each route once per `layer` call, and a
            // streamed request pays for every box.
            let layers = (
                middleware::from_fn_with_state(limit, limits::limit),
                timeout.clone(),
            );
            router = router.merge(group.routes.layer(layers));
        }
        Ok(HttpServer {
            listener,
            router,
            config,
            tls: None,
        })
    }

    /// Runs every `/v1` request inside an `api_request` span that continues the client's
    /// W3C `traceparent` (for span export; see `trace.rs`). Without this call no request
    /// pays for tracing.
    pub fn with_request_traces(mut self) -> Self {
        self.router = self.router.layer(middleware::from_fn(super::trace::traced));
        self
    }

    /// The address actually bound.
    ///
    /// # Errors
    /// The socket error, which does not happen for a bound listener.
    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        self.listener.local_addr()
    }

    /// Serves until `stop` is cancelled, then lets open requests finish.
    ///
    /// # Errors
    /// The server failed while serving.
    pub async fn run(self, stop: CancellationToken) -> io::Result<()> {
        let HttpServer {
            listener,
            router,
            config,
            tls,
        } = self;
        let Some(tls) = tls else {
            // Streamed answers are many small writes: without TCP_NODELAY each waits for
            // the client's delayed ACK of the previous one (Nagle), 40 ms at a time.
            let listener = listener.tap_io(|tcp| {
                if let Err(error) = tcp.set_nodelay(true) {
                    tracing::debug!(%error, "could not disable Nagle's algorithm");
                }
            });
            serve(listener, router, &config, stop).await;
            return Ok(());
        };
        let (listener, handshakes) = TlsListener::start(listener, tls)?;
        serve(listener, router, &config, stop).await;
        handshakes.stop().await;
        Ok(())
    }

    /// Adds `routes` (the management API, with `admin.on_http_listener`), under the same
    /// body-read timeout; they are not counted against `max_concurrent_requests`.
    pub fn merge(mut self, routes: Router) -> Self {
        let timeout = RequestBodyTimeoutLayer::new(self.config.body_read_timeout());
        self.router = self.router.merge(routes.layer(timeout));
        self
    }

    /// Serves HTTPS only: every accepted connection completes a TLS handshake (bounded by
    /// its timeout, off the accept path) before HTTP starts.
    pub fn with_tls(mut self, tls: TlsAcceptor) -> Self {
        self.tls = Some(tls);
        self
    }
}
