//! The node side of the protocol: a client that dials an edge, registers, and exchanges
//! frames with it.
//!
//! The edge never uses this module. It is the reference Rust implementation of a node's
//! connection, used by the mock node in `examples/`, by the load generator and by the
//! integration tests, so they all speak exactly what real nodes speak.

use std::io;
use std::net::SocketAddr;
use std::path::Path;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use futures::stream::{SplitSink, SplitStream};
use futures::{SinkExt, StreamExt};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio_util::codec::Framed;

use crate::adapters::tls::{
    TlsError, crypto_provider, load_certificates, load_private_key, load_roots,
};

use crate::domain::{
    Availability, PROTOCOL_VERSION, RegisterAttempt, ResumeClaim, RunEventKind, Token,
};
use crate::ports::ReportedEvent;
use crate::wire::NodeCodec;

/// The name a TLS client checks the edge's certificate against (a DNS name or an IP address).
pub use rustls::pki_types::ServerName;

pub use crate::wire::{
    FrameError, NodeFrame, ReceivedAdapter, ReceivedConfig, ReceivedEdgeFrame, RegisterOutcome,
};

/// The frame limit the client applies to what the edge sends.
pub const MAX_FRAME_BYTES: usize = 4 * 1024 * 1024;

/// Why the client could not do what it was asked.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// Reading or writing a frame failed.
    #[error(transparent)]
    Frame(#[from] FrameError),
    /// The edge closed the connection.
    #[error("the edge closed the connection")]
    Closed,
    /// The edge answered the registration with something else.
    #[error("expected a register response, got {0:?}")]
    Unexpected(Box<ReceivedEdgeFrame>),
}

impl From<io::Error> for ClientError {
    fn from(error: io::Error) -> Self {
        Self::Frame(FrameError::Io(error))
    }
}

/// What a node tells the edge about itself when it registers.
#[derive(Debug, Clone)]
pub struct Registration {
    /// The pre-shared token.
    pub token: Token,
    /// The node's id, or empty to let the token decide.
    pub node_id: String,
    /// The node software's version.
    pub node_version: String,
    /// The protocol version (1).
    pub protocol_version: u32,
    /// The adapters the node can run.
    pub adapters: Vec<String>,
    /// This node process's instance id (see [`new_instance_id`]); empty to register as a
    /// v1 node, which cannot take over its own half-open connection.
    pub instance_id: String,
    /// The runs the node still holds after a reconnect, to resume them.
    pub resume: Vec<ResumeClaim>,
}

impl Registration {
    /// A protocol-v1 registration with `token` and nothing else.
    pub fn with_token(token: &str) -> Self {
        Self {
            token: Token::new(token),
            node_id: String::new(),
            node_version: env!("CARGO_PKG_VERSION").into(),
            protocol_version: PROTOCOL_VERSION,
            adapters: Vec::new(),
            instance_id: String::new(),
            resume: Vec::new(),
        }
    }

    /// The same registration, presenting `instance_id`.
    #[must_use]
    pub fn instance(mut self, instance_id: impl Into<String>) -> Self {
        self.instance_id = instance_id.into();
        self
    }
}

/// A fresh random instance id (128 bits, hex), made once per node process start.
pub fn new_instance_id() -> String {
    format!("{:032x}", rand::random::<u128>())
}

/// A connection to an edge.
pub struct NodeClient {
    framed: Framed<ClientStream, NodeCodec>,
}

/// The sending half of a split [`NodeClient`].
pub type NodeSender = SplitSink<Framed<ClientStream, NodeCodec>, NodeFrame>;

/// The receiving half of a split [`NodeClient`].
pub type NodeReceiver = SplitStream<Framed<ClientStream, NodeCodec>>;

/// The byte stream under a [`NodeClient`]: plain TCP, or TLS over TCP. Either way the
/// frames inside are the same.
#[derive(Debug)]
pub enum ClientStream {
    /// Plain TCP.
    Plain(TcpStream),
    /// TLS over TCP (boxed: a TLS session is much larger than a socket).
    Tls(Box<tokio_rustls::client::TlsStream<TcpStream>>),
}

impl AsyncRead for ClientStream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Self::Plain(stream) => Pin::new(stream).poll_read(cx, buf),
            Self::Tls(stream) => Pin::new(stream).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for ClientStream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Self::Plain(stream) => Pin::new(stream).poll_write(cx, buf),
            Self::Tls(stream) => Pin::new(stream).poll_write(cx, buf),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Self::Plain(stream) => Pin::new(stream).poll_flush(cx),
            Self::Tls(stream) => Pin::new(stream).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Self::Plain(stream) => Pin::new(stream).poll_shutdown(cx),
            Self::Tls(stream) => Pin::new(stream).poll_shutdown(cx),
        }
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Self::Plain(stream) => Pin::new(stream).poll_write_vectored(cx, bufs),
            Self::Tls(stream) => Pin::new(stream).poll_write_vectored(cx, bufs),
        }
    }

    fn is_write_vectored(&self) -> bool {
        match self {
            Self::Plain(stream) => stream.is_write_vectored(),
            Self::Tls(stream) => stream.is_write_vectored(),
        }
    }
}

/// A TLS client configuration for [`NodeClient::connect_tls`]: trusts the CA certificates in
/// the PEM file `ca_path`, and presents the certificate chain and key in `identity` (PEM
/// files: certificate, key) when the edge requires mutual TLS.
///
/// # Errors
/// [`TlsError`] naming the file when one cannot be read, holds no usable PEM, or the
/// certificate and key do not belong together.
pub fn tls_client_config(
    ca_path: &Path,
    identity: Option<(&Path, &Path)>,
) -> Result<Arc<rustls::ClientConfig>, TlsError> {
    let roots = load_roots(ca_path, "CA certificate")?;
    let builder = rustls::ClientConfig::builder_with_provider(crypto_provider())
        .with_safe_default_protocol_versions()
        .map_err(|error| TlsError::Internal(error.to_string()))?
        .with_root_certificates(roots);
    let config = match identity {
        None => builder.with_no_client_auth(),
        Some((cert_path, key_path)) => {
            let certificates = load_certificates(cert_path, "client certificate")?;
            let key = load_private_key(key_path, "client key")?;
            builder
                .with_client_auth_cert(certificates, key)
                .map_err(|error| TlsError::Identity {
                    cert_setting: "client certificate".to_owned(),
                    cert_path: cert_path.to_owned(),
                    key_setting: "client key".to_owned(),
                    key_path: key_path.to_owned(),
                    detail: error.to_string(),
                })?
        }
    };
    Ok(Arc::new(config))
}

impl NodeClient {
    /// Dials the edge at `addr`.
    ///
    /// # Errors
    /// The socket error when the edge cannot be reached.
    pub async fn connect(addr: SocketAddr) -> Result<Self, ClientError> {
        Self::over_tcp(TcpStream::connect(addr).await?)
    }

    /// Speaks the protocol over a TCP connection the caller dialled itself (for example
    /// to tune TCP keepalive on it first).
    ///
    /// # Errors
    /// The socket error when `TCP_NODELAY` cannot be set.
    pub fn over_tcp(stream: TcpStream) -> Result<Self, ClientError> {
        stream.set_nodelay(true)?;
        Ok(Self::over(ClientStream::Plain(stream)))
    }

    /// Dials the edge at `addr` and runs the TLS handshake, checking that the edge's
    /// certificate is valid for `server_name` under `config` (see [`tls_client_config`]).
    ///
    /// With TLS 1.3 an edge that refuses the client's certificate (mutual TLS) may only say
    /// so on the first read, so such a refusal can surface from [`NodeClient::register`].
    ///
    /// # Errors
    /// The socket error when the edge cannot be reached, or the handshake's error.
    pub async fn connect_tls(
        addr: SocketAddr,
        server_name: ServerName<'static>,
        config: Arc<rustls::ClientConfig>,
    ) -> Result<Self, ClientError> {
        Self::over_tls(TcpStream::connect(addr).await?, server_name, config).await
    }

    /// Runs the TLS handshake over a TCP connection the caller dialled itself, as
    /// [`NodeClient::connect_tls`] does.
    ///
    /// # Errors
    /// The socket error when `TCP_NODELAY` cannot be set, or the handshake's error.
    pub async fn over_tls(
        stream: TcpStream,
        server_name: ServerName<'static>,
        config: Arc<rustls::ClientConfig>,
    ) -> Result<Self, ClientError> {
        stream.set_nodelay(true)?;
        let stream = tokio_rustls::TlsConnector::from(config)
            .connect(server_name, stream)
            .await?;
        Ok(Self::over(ClientStream::Tls(Box::new(stream))))
    }

    fn over(stream: ClientStream) -> Self {
        Self {
            framed: Framed::new(stream, NodeCodec::new(MAX_FRAME_BYTES)),
        }
    }

    /// Sends a RegisterRequest and returns the edge's answer.
    ///
    /// # Errors
    /// [`ClientError`] when the exchange fails or the edge answers with anything else.
    pub async fn register(
        &mut self,
        registration: Registration,
    ) -> Result<RegisterOutcome, ClientError> {
        let Registration {
            token,
            node_id,
            node_version,
            protocol_version,
            adapters,
            instance_id,
            resume,
        } = registration;
        self.send(NodeFrame::Register(RegisterAttempt {
            token,
            node_id,
            node_version,
            protocol_version,
            adapters,
            instance_id,
            resume,
        }))
        .await?;
        match self.next().await? {
            ReceivedEdgeFrame::Registered(outcome) => Ok(outcome),
            other => Err(ClientError::Unexpected(Box::new(other))),
        }
    }

    /// Sends one frame.
    ///
    /// # Errors
    /// [`ClientError::Frame`] when the write fails.
    pub async fn send(&mut self, frame: NodeFrame) -> Result<(), ClientError> {
        Ok(self.framed.send(frame).await?)
    }

    /// Sends a heartbeat.
    ///
    /// # Errors
    /// [`ClientError::Frame`] when the write fails.
    pub async fn heartbeat(&mut self, active_runs: u32) -> Result<(), ClientError> {
        self.send(heartbeat(active_runs, 0, None)).await
    }

    /// Sends a run event.
    ///
    /// # Errors
    /// [`ClientError::Frame`] when the write fails.
    pub async fn event(
        &mut self,
        run_id: &str,
        seq: u64,
        kind: RunEventKind,
    ) -> Result<(), ClientError> {
        self.send(run_event(run_id, seq, kind)).await
    }

    /// The next frame from the edge.
    ///
    /// # Errors
    /// [`ClientError::Closed`] when the edge closed the connection, [`ClientError::Frame`]
    /// when the read fails.
    pub async fn next(&mut self) -> Result<ReceivedEdgeFrame, ClientError> {
        self.framed
            .next()
            .await
            .ok_or(ClientError::Closed)?
            .map_err(ClientError::from)
    }

    /// Splits the connection so one task can read while another writes.
    pub fn split(self) -> (NodeSender, NodeReceiver) {
        self.framed.split()
    }

    /// The raw stream (TCP or TLS), for tests that send bytes no well-behaved node would.
    pub fn stream_mut(&mut self) -> &mut ClientStream {
        self.framed.get_mut()
    }
}

/// A `RunEvent` frame.
pub fn run_event(run_id: &str, seq: u64, kind: RunEventKind) -> NodeFrame {
    NodeFrame::RunEvent(ReportedEvent {
        run_id: run_id.to_owned(),
        seq,
        kind,
    })
}

/// A `Heartbeat` frame: `ping` not 0 asks the edge for a `HeartbeatAck` carrying it;
/// `availability` reports the targets the node can serve now.
pub fn heartbeat(active_runs: u32, ping: u64, availability: Option<Availability>) -> NodeFrame {
    NodeFrame::Heartbeat {
        active_runs,
        ping,
        availability,
    }
}

/// Judges the link to the edge by the v1.1 link check (`docs/protocol.md`, "Link check"):
/// the node pings with every heartbeat, and the link is dead when nothing at all has arrived
/// from the edge for `dead_after` heartbeat intervals while a ping is unanswered.
///
/// The rule is enforced only once the edge has answered a ping on this connection: an edge
/// that never acks is a v1 edge, and TCP keepalive is then the only check. Pure: the caller
/// passes `now`, so the rule is tested without a clock. One monitor per connection.
#[derive(Debug, Clone)]
pub struct LinkMonitor {
    silence_limit: Duration,
    last_heard: Instant,
    last_ping: u64,
    last_answered: u64,
    answers_pings: bool,
}

impl LinkMonitor {
    /// A monitor for a connection that was registered at `now`, heartbeating every
    /// `interval` and dead after `dead_after` silent intervals (at least 1).
    pub fn new(interval: Duration, dead_after: u32, now: Instant) -> Self {
        Self {
            silence_limit: interval.saturating_mul(dead_after.max(1)),
            last_heard: now,
            last_ping: 0,
            last_answered: 0,
            answers_pings: false,
        }
    }

    /// The `ping` for the next heartbeat (1, 2, 3, ...), counted as unanswered until acked.
    pub fn next_ping(&mut self) -> u64 {
        self.last_ping += 1;
        self.last_ping
    }

    /// Something (any frame) arrived from the edge at `now`.
    pub fn heard(&mut self, now: Instant) {
        self.last_heard = self.last_heard.max(now);
    }

    /// A `HeartbeatAck` carrying `ping` arrived at `now`. Returns whether it answers a ping
    /// this monitor handed out (an ack for anything else is ignored, but still counts as
    /// something heard).
    pub fn acked(&mut self, ping: u64, now: Instant) -> bool {
        self.heard(now);
        if ping == 0 || ping > self.last_ping {
            return false;
        }
        self.answers_pings = true;
        self.last_answered = self.last_answered.max(ping);
        true
    }

    /// Whether the edge has answered a ping on this connection (a v1.1 edge).
    pub fn answers_pings(&self) -> bool {
        self.answers_pings
    }

    /// Whether a ping is still waiting for its ack.
    pub fn ping_outstanding(&self) -> bool {
        self.last_ping > self.last_answered
    }

    /// Whether the link counts as dead at `now`: the edge answers pings, one is unanswered,
    /// and nothing has arrived for `dead_after` intervals.
    pub fn is_dead(&self, now: Instant) -> bool {
        self.answers_pings
            && self.ping_outstanding()
            && now.saturating_duration_since(self.last_heard) >= self.silence_limit
    }
}

/// Reconnect delays: exponential growth from `base`, capped at `cap`, with **full jitter**
/// (each delay is drawn uniformly from zero to the current ceiling), so that thousands of
/// nodes cut off by one edge restart spread their reconnects out instead of arriving in
/// waves.
///
/// Pure: the caller passes the random draw, so the bounds are tested without a generator.
#[derive(Debug, Clone)]
pub struct Backoff {
    base: Duration,
    cap: Duration,
    attempt: u32,
}

impl Backoff {
    /// Delays start below `base` and their ceiling doubles per attempt up to `cap`.
    pub fn new(base: Duration, cap: Duration) -> Self {
        Self {
            base,
            cap: cap.max(base),
            attempt: 0,
        }
    }

    /// The ceiling the next delay is drawn under: `min(cap, base * 2^attempt)`.
    pub fn ceiling(&self) -> Duration {
        let factor = 1u32.checked_shl(self.attempt.min(31)).unwrap_or(u32::MAX);
        self.base.saturating_mul(factor).min(self.cap)
    }

    /// The next delay for a random `unit` in `[0, 1)` (say `rand::random::<f64>()`): a
    /// uniform draw under [`Backoff::ceiling`]. Each call raises the ceiling for the next.
    pub fn next_delay(&mut self, unit: f64) -> Duration {
        let ceiling = self.ceiling();
        self.attempt = self.attempt.saturating_add(1);
        ceiling.mul_f64(unit.clamp(0.0, 1.0))
    }

    /// Back to the first attempt, after a connection succeeded.
    pub fn reset(&mut self) {
        self.attempt = 0;
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    const SECOND: Duration = Duration::from_secs(1);

    #[test]
    fn a_v1_edge_that_never_acks_is_never_judged_dead() {
        let start = Instant::now();
        let mut monitor = LinkMonitor::new(SECOND, 3, start);
        monitor.next_ping();
        monitor.next_ping();
        assert!(monitor.ping_outstanding());
        assert!(!monitor.is_dead(start + 100 * SECOND));
    }

    #[test]
    fn the_link_is_dead_after_n_silent_intervals_with_a_ping_outstanding() {
        let start = Instant::now();
        let mut monitor = LinkMonitor::new(SECOND, 3, start);
        let ping = monitor.next_ping();
        assert!(monitor.acked(ping, start + SECOND));
        assert!(monitor.answers_pings());
        // Answered: silence alone is not death.
        assert!(!monitor.is_dead(start + 10 * SECOND));
        monitor.next_ping();
        assert!(!monitor.is_dead(start + 3 * SECOND));
        assert!(monitor.is_dead(start + 4 * SECOND));
        // Any frame pushes the limit out again.
        monitor.heard(start + 4 * SECOND);
        assert!(!monitor.is_dead(start + 6 * SECOND));
        assert!(monitor.is_dead(start + 7 * SECOND));
    }

    #[test]
    fn acks_for_pings_never_sent_are_ignored() {
        let start = Instant::now();
        let mut monitor = LinkMonitor::new(SECOND, 3, start);
        assert!(!monitor.acked(0, start));
        assert!(!monitor.acked(7, start));
        assert!(!monitor.answers_pings());
        monitor.next_ping();
        let second = monitor.next_ping();
        assert!(monitor.acked(second, start));
        assert!(!monitor.ping_outstanding());
    }

    #[test]
    fn backoff_ceiling_doubles_to_the_cap_and_resets() {
        let mut backoff = Backoff::new(Duration::from_millis(100), Duration::from_millis(1000));
        let ceilings: Vec<u64> = (0..6)
            .map(|_| {
                let ceiling = backoff.ceiling();
                backoff.next_delay(1.0);
                u64::try_from(ceiling.as_millis()).unwrap_or(u64::MAX)
            })
            .collect();
        assert_eq!(ceilings, [100, 200, 400, 800, 1000, 1000]);
        backoff.reset();
        assert_eq!(backoff.ceiling(), Duration::from_millis(100));
        // Far past any shift width, the ceiling stays the cap.
        for _ in 0..100 {
            backoff.next_delay(0.5);
        }
        assert_eq!(backoff.ceiling(), Duration::from_millis(1000));
    }

    proptest! {
        /// Full jitter: every delay lies in `[0, ceiling]`, and a draw of 0 waits not at all.
        #[test]
        fn backoff_delays_stay_within_zero_and_the_ceiling(
            base_ms in 1u64..10_000, cap_ms in 1u64..120_000, attempts in 0usize..80,
            unit in 0.0f64..1.0,
        ) {
            let mut backoff = Backoff::new(Duration::from_millis(base_ms), Duration::from_millis(cap_ms));
            for _ in 0..attempts {
                backoff.next_delay(unit);
            }
            let ceiling = backoff.ceiling();
            prop_assert!(ceiling <= Duration::from_millis(cap_ms.max(base_ms)));
            let mut again = backoff.clone();
            prop_assert!(backoff.next_delay(unit) <= ceiling);
            prop_assert_eq!(again.next_delay(0.0), Duration::ZERO);
        }
    }
}
