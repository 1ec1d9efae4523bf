//! The management API's own listener (`[admin] listen`), with the `[http]` connection
//! limits and its own optional TLS.

use std::io;
use std::net::SocketAddr;

use axum::Router;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tower_http::timeout::RequestBodyTimeoutLayer;

#[cfg(doc)]
use super::routes;
use super::unknown_route;
use crate::adapters::http::HttpConfig;
use crate::adapters::http::serve::serve;
use crate::adapters::http::tls::TlsListener;
use crate::adapters::tls::TlsAcceptor;

/// The bound admin listener.
pub struct AdminServer {
    listener: TcpListener,
    router: Router,
    limits: HttpConfig,
    tls: Option<TlsAcceptor>,
}

impl AdminServer {
    /// Binds `listen` to serve `router` (the management API's [`routes`], and whatever is
    /// served beside it); connections live under `limits` (the `[http]` header and body
    /// timeouts, connection cap and listen backlog). Other paths get the API's 404.
    ///
    /// # Errors
    /// The socket error when the address cannot be bound.
    pub async fn bind(
        listen: SocketAddr,
        limits: HttpConfig,
        router: Router,
    ) -> io::Result<AdminServer> {
        let listener = crate::adapters::listen::bind(listen, limits.listen_backlog)?;
        let router = router
            .fallback(unknown_route)
            .layer(RequestBodyTimeoutLayer::new(limits.body_read_timeout()));
        Ok(AdminServer {
            listener,
            router,
            limits,
            tls: None,
        })
    }

    /// Serves HTTPS only.
    pub fn with_tls(mut self, tls: TlsAcceptor) -> Self {
        self.tls = Some(tls);
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
        let AdminServer {
            listener,
            router,
            limits,
            tls,
        } = self;
        match tls {
            None => serve(listener, router, &limits, stop).await,
            Some(tls) => {
                let (listener, handshakes) = TlsListener::start(listener, tls)?;
                serve(listener, router, &limits, stop).await;
                handshakes.stop().await;
            }
        }
        Ok(())
    }
}
