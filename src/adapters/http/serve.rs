//! The HTTP connection loop: hyper with limits that `axum::serve` does not offer.
//!
//! Every connection gets a header-read timeout (slow-header clients are closed), the
//! number of connections is bounded (excess ones are closed at once), a graceful stop
//! lets open requests finish before the loop returns, and a connection that wakes itself
//! while it runs is polled again in place (`poll_again.rs`).

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::serve::Listener;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto::Builder;
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;
use tracing::debug;

use super::config::HttpConfig;
use super::poll_again::PollAgain;

/// How long a graceful stop waits for open HTTP requests before dropping them. Streams
/// end on their own first: the edge drains runs before it stops HTTP.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(5);

/// Serves `router` on connections from `listener` until `stop` is cancelled.
pub(crate) async fn serve<L>(
    mut listener: L,
    router: Router,
    config: &HttpConfig,
    stop: CancellationToken,
) where
    L: Listener,
{
    let mut builder = Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(config.header_read_timeout());
    builder.http2().timer(TokioTimer::new());
    let graceful = GracefulShutdown::new();
    let connections = Arc::new(Semaphore::new(config.max_connections.max(1)));
    loop {
        let (io, _peer) = tokio::select! {
            () = stop.cancelled() => break,
            accepted = listener.accept() => accepted,
        };
        let Ok(permit) = Arc::clone(&connections).try_acquire_owned() else {
            debug!("HTTP connection limit reached; closing the new connection");
            continue;
        };
        let service = TowerToHyperService::new(router.clone());
        let connection = builder
            .serve_connection_with_upgrades(TokioIo::new(io), service)
            .into_owned();
        let connection = PollAgain::new(graceful.watch(connection));
        tokio::spawn(async move {
            if let Err(error) = connection.await {
                debug!(%error, "HTTP connection ended with an error");
            }
            drop(permit);
        });
    }
    drop(listener);
    if tokio::time::timeout(SHUTDOWN_GRACE, graceful.shutdown())
        .await
        .is_err()
    {
        debug!("HTTP connections still open after the grace period were dropped");
    }
}
