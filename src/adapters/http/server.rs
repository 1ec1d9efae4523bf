//! The HTTP listener and its routes.

use std::io;
use std::net::SocketAddr;
use std::sync::Arc;

use axum::Router;
use axum::routing::get;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use super::health;
use super::openai::{self, Api};
use super::tls::TlsListener;
use crate::adapters::tcp::TransportControl;
use crate::adapters::tls::TlsAcceptor;
use crate::app::runs::RunService;
use crate::ports::Registry;

/// What the handlers work with. Cheap to clone.
#[derive(Clone)]
pub struct HttpState {
    /// The registry `/metrics` renders.
    pub metrics: prometheus::Registry,
    /// For readiness (draining or not).
    pub transport: TransportControl,
    /// Accepts runs.
    pub runs: RunService,
    /// The connected nodes.
    pub registry: Arc<dyn Registry>,
    /// The OpenAI-compatible API's settings and model map.
    pub api: Api,
}

/// The bound HTTP listener.
pub struct HttpServer {
    listener: TcpListener,
    router: Router,
    tls: Option<TlsAcceptor>,
}

impl HttpServer {
    /// Binds `addr` and builds the routes: the operations endpoints, open to all, and the
    /// OpenAI-compatible `/v1` API. Unknown paths get a 404 in OpenAI's error shape.
    ///
    /// # Errors
    /// The socket error when the address cannot be bound.
    pub async fn bind(addr: SocketAddr, state: HttpState) -> io::Result<HttpServer> {
        let listener = TcpListener::bind(addr).await?;
        let router = Router::new()
            .route("/healthz", get(health::healthz))
            .route("/readyz", get(health::readyz))
            .route("/metrics", get(health::metrics))
            .merge(openai::routes(&state))
            .fallback(openai::unknown_route)
            .with_state(state);
        Ok(HttpServer {
            listener,
            router,
            tls: None,
        })
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
            tls,
        } = self;
        let shutdown = {
            let stop = stop.clone();
            async move { stop.cancelled().await }
        };
        let Some(tls) = tls else {
            return axum::serve(listener, router)
                .with_graceful_shutdown(shutdown)
                .await;
        };
        let (listener, handshakes) = TlsListener::start(listener, tls)?;
        let served = axum::serve(listener, router)
            .with_graceful_shutdown(shutdown)
            .await;
        handshakes.stop().await;
        served
    }

    /// Serves HTTPS only: every accepted connection completes a TLS handshake (bounded by
    /// its timeout, off the accept path) before HTTP starts.
    pub fn with_tls(mut self, tls: TlsAcceptor) -> Self {
        self.tls = Some(tls);
        self
    }
}
