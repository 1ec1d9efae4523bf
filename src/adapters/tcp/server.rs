//! The accept loop and the handle the application uses to drain and stop the transport.

use std::io;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::{Instrument, debug, info, info_span, warn};

use super::config::ServerConfig;
use super::connection::{Connection, NodeIo};
use super::shared::{ServerDeps, Shared};
use super::stats::TransportStats;
use crate::adapters::tls::TlsAcceptor;
use crate::domain::RegistrationThrottle;
use crate::ports::{CloseReason, NodeCommand, Readiness};
use crate::wire::keepalive::Keepalive;

/// How long the accept loop pauses when the process is out of file descriptors.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(100);

/// At most this many accepted connections wait for their task's first turn; the accept loop
/// takes no more until some have run, and later connections wait in the kernel's accept
/// queue, which hands them over in the order they came. Well under the 256 tasks a tokio
/// worker's local run queue holds: past that, tokio moves tasks to its global queue, which a
/// busy worker looks at once every few dozen polls — in a reconnect storm the accept loop
/// (up to 128 accepts a turn) overflowed it, and the connections moved there waited for the
/// whole burst to be served before their first poll (docs/benchmarks.md, the storm's tail).
const MAX_UNSTARTED: usize = 64;

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

    /// Serves an accepted connection on a task of its own, holding `permit` (its place under
    /// `max_connections`) while it lives; the task's first step drops `waiting`.
    ///
    /// Nothing else is awaited or set up in the accept loop: the socket options, the TLS and
    /// registration handshakes all run on the connection's own task.
    fn spawn_connection(
        &self,
        stream: TcpStream,
        peer: SocketAddr,
        tls: Option<TlsAcceptor>,
        permit: OwnedSemaphorePermit,
        waiting: NotStarted,
    ) {
        let control = self.clone();
        self.connections.spawn(async move {
            drop(waiting);
            tune(&stream, control.shared.config.keepalive().as_ref());
            match tls {
                None => control.serve_stream(stream, peer).await,
                // Boxed: the TLS state machine is several KiB, and inline it would make
                // every plain connection's task as large (this task lives as long as its
                // node stays connected).
                Some(tls) => Box::pin(control.serve_tls(&tls, stream, peer)).await,
            }
            drop(permit);
        });
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
    /// task, never more than [`MAX_UNSTARTED`] ahead of the tasks that have started.
    pub async fn run(self) {
        let TcpServer {
            listener,
            control,
            tls,
        } = self;
        let limit = Arc::new(Semaphore::new(control.shared.config.max_connections.max(1)));
        let unstarted = Unstarted::default();
        loop {
            unstarted.wait_for_turns().await;
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
                    let waiting = unstarted.accepted();
                    control.spawn_connection(stream, peer, tls.clone(), permit, waiting);
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

/// Counts the accepted connections whose task has not run yet, for the accept loop's bound
/// (see [`MAX_UNSTARTED`]).
#[derive(Default)]
struct Unstarted(Arc<AtomicUsize>);

/// An accepted connection whose task has not run yet; dropped by the task's first step.
struct NotStarted(Arc<AtomicUsize>);

impl Unstarted {
    /// Counts a connection just accepted until its [`NotStarted`] is dropped.
    fn accepted(&self) -> NotStarted {
        self.0.fetch_add(1, Ordering::Relaxed);
        NotStarted(Arc::clone(&self.0))
    }

    /// Returns once fewer than [`MAX_UNSTARTED`] accepted connections wait for their first
    /// turn, yielding meanwhile: a task that yields is polled again only after its worker
    /// next turns to the I/O driver (when its queue is empty, or every few dozen polls), so
    /// the accept loop falls in behind the tasks already queued. Those are runnable, so this
    /// always ends.
    async fn wait_for_turns(&self) {
        while self.0.load(Ordering::Relaxed) >= MAX_UNSTARTED {
            tokio::task::yield_now().await;
        }
    }
}

impl Drop for NotStarted {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
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
