//! An `axum::serve` listener that hands out TLS streams: a background task accepts TCP
//! connections and runs each handshake in its own task, bounded by the handshake timeout, so a
//! peer that never finishes its handshake holds up no one. Completed streams queue for axum.
//!
//! It does not speak HTTP and never looks inside the TLS session.

use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Semaphore, mpsc};
use tokio::task::JoinHandle;
use tokio_rustls::server::TlsStream;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::{debug, warn};

use crate::adapters::tls::TlsAcceptor;

/// Completed handshakes waiting for axum to take them. When it is full, handshake tasks wait
/// (holding their permit), which in turn makes new connections wait for a permit.
const ACCEPTED_QUEUE: usize = 64;

/// Handshakes in progress (or waiting in the queue) at once; connections beyond that are
/// closed at once.
const MAX_PENDING_HANDSHAKES: usize = 1_024;

/// How long the accept task pauses when the process is out of file descriptors.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(100);

/// The listener axum serves from: TLS streams whose handshake has completed.
pub(crate) struct TlsListener {
    accepted: mpsc::Receiver<(TlsStream<TcpStream>, SocketAddr)>,
    local_addr: SocketAddr,
}

/// The background accept task and its handshake tasks; stop it once axum has stopped.
pub(crate) struct Handshakes {
    stop: CancellationToken,
    task: JoinHandle<()>,
}

impl TlsListener {
    /// Starts accepting on `listener`, handshaking with `tls`.
    ///
    /// # Errors
    /// The socket error when the listener's address cannot be read.
    pub(crate) fn start(
        listener: TcpListener,
        tls: TlsAcceptor,
    ) -> io::Result<(TlsListener, Handshakes)> {
        let local_addr = listener.local_addr()?;
        let (sender, accepted) = mpsc::channel(ACCEPTED_QUEUE);
        let stop = CancellationToken::new();
        let task = tokio::spawn(accept_loop(listener, tls, sender, stop.clone()));
        Ok((
            TlsListener {
                accepted,
                local_addr,
            },
            Handshakes { stop, task },
        ))
    }
}

impl axum::serve::Listener for TlsListener {
    type Io = TlsStream<TcpStream>;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        match self.accepted.recv().await {
            Some(accepted) => accepted,
            // The accept task ends only when told to, after axum stopped asking.
            None => std::future::pending().await,
        }
    }

    fn local_addr(&self) -> io::Result<Self::Addr> {
        Ok(self.local_addr)
    }
}

impl Handshakes {
    /// Stops accepting, abandons the handshakes in progress, and waits for every task.
    pub(crate) async fn stop(self) {
        self.stop.cancel();
        if let Err(error) = self.task.await {
            warn!(%error, "the HTTPS accept task failed");
        }
    }
}

async fn accept_loop(
    listener: TcpListener,
    tls: TlsAcceptor,
    accepted: mpsc::Sender<(TlsStream<TcpStream>, SocketAddr)>,
    stop: CancellationToken,
) {
    let handshakes = TaskTracker::new();
    let pending = Arc::new(Semaphore::new(MAX_PENDING_HANDSHAKES));
    loop {
        let (stream, peer) = tokio::select! {
            () = stop.cancelled() => break,
            result = listener.accept() => match result {
                Ok(connection) => connection,
                Err(error) if matches!(error.raw_os_error(), Some(23 | 24)) => {
                    // EMFILE / ENFILE: out of file descriptors.
                    warn!(%error, "out of file descriptors; pausing HTTPS accept");
                    tokio::time::sleep(ACCEPT_BACKOFF).await;
                    continue;
                }
                Err(error) => {
                    debug!(%error, "HTTPS accept failed");
                    continue;
                }
            },
        };
        let Ok(permit) = Arc::clone(&pending).try_acquire_owned() else {
            debug!(%peer, "too many TLS handshakes in progress; closing the new connection");
            continue;
        };
        // Streamed answers are many small writes: see the plain listener in `server.rs`.
        if let Err(error) = stream.set_nodelay(true) {
            debug!(%peer, %error, "could not disable Nagle's algorithm");
        }
        let tls = tls.clone();
        let accepted = accepted.clone();
        let stop = stop.clone();
        handshakes.spawn(async move {
            let handshake = tokio::select! {
                () = stop.cancelled() => return,
                handshake = tls.accept(stream) => handshake,
            };
            match handshake {
                Ok(stream) => {
                    tokio::select! {
                        () = stop.cancelled() => {}
                        // An error means axum is gone; the stream is dropped (closed).
                        _sent = accepted.send((stream, peer)) => {}
                    }
                }
                Err(error) => debug!(%peer, %error, "closing an HTTPS connection"),
            }
            drop(permit);
        });
    }
    handshakes.close();
    handshakes.wait().await;
}
