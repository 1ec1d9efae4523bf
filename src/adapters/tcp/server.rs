//! The accept loop and the handle the application uses to drain and stop the transport.

use std::io;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::{Instrument, debug, info, info_span, warn};

use super::config::ServerConfig;
use super::connection::{Connection, NodeIo};
use super::stats::TransportStats;
use crate::adapters::tls::TlsAcceptor;
use crate::domain::RegistrationThrottle;
use crate::ports::{CloseReason, NodeCommand, NodeEventHandler, NodeStore, Readiness, Registry};
use crate::wire::keepalive::Keepalive;

/// How long the accept loop pauses when the process is out of file descriptors.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(100);

/// What the transport works with.
#[derive(Clone)]
pub struct ServerDeps {
    /// The pre-registered node definitions.
    pub store: Arc<dyn NodeStore>,
    /// The connected nodes.
    pub registry: Arc<dyn Registry>,
    /// Who hears run events and node arrivals and departures.
    pub handler: Arc<dyn NodeEventHandler>,
}

/// State shared by the accept loop and every connection task.
pub(super) struct Shared {
    pub(super) config: ServerConfig,
    pub(super) deps: ServerDeps,
    /// Set when draining: new registrations are refused.
    pub(super) readiness: Readiness,
    /// Cancelled to close every connection at once (the end of a graceful stop).
    pub(super) close_all: CancellationToken,
    pub(super) stats: Arc<TransportStats>,
    /// Failed registrations per peer address, for the brute-force brake.
    pub(super) throttle: Mutex<RegistrationThrottle>,
    next_connection: AtomicU64,
}

/// Drains and stops the transport; cheap to clone.
#[derive(Clone)]
pub struct TransportControl {
    shared: Arc<Shared>,
    stop_accepting: CancellationToken,
    connections: TaskTracker,
}

impl TransportControl {
    /// Refuses new registrations: nodes that connect from now on are told
    /// `SHUTTING_DOWN` (the listener keeps accepting until [`TransportControl::shut_down`],
    /// so they get that clean answer rather than a refused connection).
    pub fn start_draining(&self) {
        self.shared.readiness.start_draining();
    }

    /// The readiness flag this transport sets when draining, for health checks.
    pub fn readiness(&self) -> Readiness {
        self.shared.readiness.clone()
    }

    /// The transport's counters.
    pub fn stats(&self) -> Arc<TransportStats> {
        Arc::clone(&self.shared.stats)
    }

    /// Serves one node connection over an already-accepted stream until it closes: the
    /// registration handshake, then the relay. The accept loop calls it for every TCP
    /// connection; tests and fuzzing call it with in-memory streams.
    pub async fn serve_stream<S: NodeIo>(&self, stream: S, peer: SocketAddr) {
        let shared = &self.shared;
        let id = shared.next_connection.fetch_add(1, Ordering::Relaxed);
        let span = info_span!(
            "connection",
            %peer,
            connection = id,
            node = tracing::field::Empty,
            alias = tracing::field::Empty
        );
        shared
            .stats
            .connections_open
            .fetch_add(1, Ordering::Relaxed);
        let reason = Connection::new(shared, stream, peer, id)
            .serve()
            .instrument(span)
            .await;
        shared
            .stats
            .connections_open
            .fetch_sub(1, Ordering::Relaxed);
        shared.stats.record_close(reason);
    }

    /// Runs the TLS handshake on an accepted TCP stream (bounded by the handshake timeout,
    /// cut short by the final close), then serves the connection over TLS. A failed or
    /// timed-out handshake closes the connection as `tls_handshake`.
    async fn serve_tls(&self, tls: &TlsAcceptor, stream: TcpStream, peer: SocketAddr) {
        let handshake = tokio::select! {
            () = self.shared.close_all.cancelled() => {
                self.shared.stats.record_close(CloseReason::Shutdown);
                return;
            }
            handshake = tls.accept(stream) => handshake,
        };
        match handshake {
            Ok(stream) => self.serve_stream(stream, peer).await,
            Err(error) => {
                info!(%peer, %error, "closing a node connection without a TLS session");
                self.shared.stats.record_close(CloseReason::TlsHandshake);
            }
        }
    }

    /// Whether the transport is draining.
    pub fn is_draining(&self) -> bool {
        self.shared.readiness.is_draining()
    }

    /// Sends `Shutdown` to every registered node, then waits up to `grace` for the
    /// connections to close before closing whatever is left.
    pub async fn shut_down(&self, reason: &str, grace: Duration) {
        self.start_draining();
        self.stop_accepting.cancel();
        for node in self.shared.deps.registry.snapshot() {
            if let Some(link) = self.shared.deps.registry.link(node.record.id()) {
                // A node whose queue is full is closed as a slow consumer instead.
                let _ = link.send(NodeCommand::Shutdown {
                    reason: reason.to_owned(),
                });
            }
        }
        self.connections.close();
        if tokio::time::timeout(grace, self.connections.wait())
            .await
            .is_err()
        {
            warn!(
                open = self.connections.len(),
                "closing connections still open after the grace period"
            );
            self.shared.close_all.cancel();
            self.connections.wait().await;
        }
    }
}

/// The node transport's listening socket and accept loop.
pub struct TcpServer {
    listener: TcpListener,
    control: TransportControl,
    tls: Option<TlsAcceptor>,
}

impl TcpServer {
    /// Binds `config.listen` with `config.listen_backlog`.
    ///
    /// # Errors
    /// The socket error when the address cannot be bound.
    pub async fn bind(config: ServerConfig, deps: ServerDeps) -> io::Result<TcpServer> {
        let listener = crate::adapters::listen::bind(config.listen, config.listen_backlog)?;
        let throttle = RegistrationThrottle::new(
            Duration::from_millis(config.register_failure_delay_ms),
            Duration::from_millis(config.register_failure_max_delay_ms),
        );
        let shared = Arc::new(Shared {
            throttle: Mutex::new(throttle),
            config,
            deps,
            readiness: Readiness::default(),
            close_all: CancellationToken::new(),
            stats: Arc::new(TransportStats::default()),
            next_connection: AtomicU64::new(1),
        });
        let control = TransportControl {
            shared,
            stop_accepting: CancellationToken::new(),
            connections: TaskTracker::new(),
        };
        Ok(TcpServer {
            listener,
            control,
            tls: None,
        })
    }

    /// The address actually bound (tells the port when the config asked for port 0).
    ///
    /// # Errors
    /// The socket error, which does not happen for a bound listener.
    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        self.listener.local_addr()
    }

    /// The handle that drains and stops this server.
    pub fn control(&self) -> TransportControl {
        self.control.clone()
    }

    /// Serves every connection over TLS: each connection's task runs the handshake (bounded
    /// by its timeout) before the node protocol starts, so a slow handshake never holds up
    /// the accept loop. Plaintext peers are closed as `tls_handshake`.
    pub fn with_tls(mut self, tls: TlsAcceptor) -> Self {
        self.tls = Some(tls);
        self
    }

    /// Accepts connections until [`TransportControl::shut_down`], each served by its own
    /// task.
    pub async fn run(self) {
        let TcpServer {
            listener,
            control,
            tls,
        } = self;
        let limit = Arc::new(Semaphore::new(control.shared.config.max_connections.max(1)));
        let keepalive = control.shared.config.keepalive();
        loop {
            let accepted = tokio::select! {
                () = control.stop_accepting.cancelled() => break,
                accepted = listener.accept() => accepted,
            };
            match accepted {
                Ok((stream, peer)) => {
                    let Ok(permit) = Arc::clone(&limit).try_acquire_owned() else {
                        debug!(%peer, "connection limit reached; closing the new connection");
                        control
                            .shared
                            .stats
                            .connections_refused
                            .fetch_add(1, Ordering::Relaxed);
                        drop(stream);
                        continue;
                    };
                    // Nothing else is awaited or set up here: the socket options, the TLS
                    // and registration handshakes all run on the connection's own task, so
                    // the loop drains the kernel's accept queue as fast as it fills.
                    let control = control.clone();
                    let tls = tls.clone();
                    control.connections.clone().spawn(async move {
                        tune(&stream, keepalive.as_ref());
                        match tls {
                            None => control.serve_stream(stream, peer).await,
                            // Boxed: the TLS state machine is several KiB, and inline it
                            // would make every plain connection's task as large (this task
                            // lives as long as its node stays connected).
                            Some(tls) => Box::pin(control.serve_tls(&tls, stream, peer)).await,
                        }
                        drop(permit);
                    });
                }
                Err(error) if is_out_of_descriptors(&error) => {
                    warn!(%error, "out of file descriptors; pausing accept");
                    tokio::time::sleep(ACCEPT_BACKOFF).await;
                }
                Err(error) => debug!(%error, "accept failed"),
            }
        }
        info!("node transport stopped accepting");
    }
}

/// Sets the socket options of an accepted node socket: no Nagle delay, and TCP keepalive
/// when configured. A failure only loses the option.
fn tune(stream: &TcpStream, keepalive: Option<&Keepalive>) {
    if let Err(error) = stream.set_nodelay(true) {
        debug!(%error, "could not disable Nagle's algorithm");
    }
    if let Some(keepalive) = keepalive
        && let Err(error) = keepalive.apply(stream)
    {
        debug!(%error, "could not turn on TCP keepalive");
    }
}

fn is_out_of_descriptors(error: &io::Error) -> bool {
    // EMFILE (per process) and ENFILE (system wide) on Linux.
    matches!(error.raw_os_error(), Some(23 | 24))
}
