//! The node side of the protocol: a client that dials an edge, registers, and exchanges
//! frames with it.
//!
//! The edge's server side never uses this module (its `NodeCommand` and `RunAssignment`
//! are the edge's own port types, re-exported here as the commands a node receives). It is
//! the reference Rust implementation of a node's connection, used by the reference node
//! (`edge-node`, in `node/`), the mock node (`mock_node/`), the load generator
//! (`loadgen/`) and the integration tests, so they all speak exactly what real nodes speak.
//! Besides the connection ([`NodeClient`]) it holds what a node needs around it: the link
//! check ([`LinkMonitor`]), reconnect delays ([`Backoff`]), TCP keepalive ([`Keepalive`])
//! and counts of how links ended ([`LinkStats`]).

mod link;
mod stream;

use std::io;
use std::net::SocketAddr;
use std::sync::Arc;

use futures::stream::{SplitSink, SplitStream};
use futures::{SinkExt, StreamExt};
use tokio::net::{TcpStream, ToSocketAddrs};
use tokio_util::codec::Framed;

pub use crate::wire::keepalive::Keepalive;
pub use crate::wire::tls::{TlsError, platform_client_config};
pub use link::{Backoff, LinkEnd, LinkMonitor, LinkStats};
pub use stream::{ClientStream, tls_client_config};

use crate::domain::{
    Availability, DeclaredOperations, Inventory, Operation, PROTOCOL_VERSION, RegisterAttempt,
    RunEventKind, Token,
};
use crate::ports::ReportedEvent;
use crate::wire::NodeCodec;

/// The name a TLS client checks the edge's certificate against (a DNS name or an IP address).
pub use rustls::pki_types::ServerName;

/// What the edge asks of a node (`Run`, `Cancel`, `Shutdown`, `Model`, ...), a run's
/// assignment, and a model command with the node's answer to it.
pub use crate::ports::{ModelCommand, ModelOutcome, NodeCommand, RunAssignment};

pub use crate::wire::{
    EpochFence, FrameError, NodeFrame, ReceivedAdapter, ReceivedConfig, ReceivedEdgeFrame,
    RegisterOutcome,
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

/// What a node tells the edge about itself when it registers: the very request the edge
/// decides on ([`RegisterAttempt`]: token, node id, versions, adapters, instance id and the
/// runs it claims to resume).
pub type Registration = RegisterAttempt;

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
            can_continue: false,
            operations: DeclaredOperations::default(),
            can_manage_models: false,
            inventory: None,
        }
    }

    /// The same registration, saying whether the node loads and unloads the targets of the
    /// adapters it reports managed, on the edge's model commands.
    #[must_use]
    pub fn managing_models(mut self, can_manage_models: bool) -> Self {
        self.can_manage_models = can_manage_models;
        self
    }

    /// The same registration, telling the node's devices and their memory (v1.7).
    #[must_use]
    pub fn with_inventory(mut self, inventory: Inventory) -> Self {
        self.inventory = Some(inventory);
        self
    }

    /// The same registration, declaring `operations` (those that need a declaration, such
    /// as [`Operation::Tokenize`]; the others are served without one).
    #[must_use]
    pub fn operations(mut self, operations: impl IntoIterator<Item = Operation>) -> Self {
        self.operations = DeclaredOperations::new(operations);
        self
    }

    /// The same registration, presenting `instance_id`.
    #[must_use]
    pub fn instance(mut self, instance_id: impl Into<String>) -> Self {
        self.instance_id = instance_id.into();
        self
    }

    /// The same registration, saying whether the node can carry on runs another node began.
    #[must_use]
    pub fn continuing(mut self, can_continue: bool) -> Self {
        self.can_continue = can_continue;
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

/// Dials the edge at `addr` (resolved now) and turns on TCP keepalive when given: the
/// stream for [`NodeClient::over_tcp`] or [`NodeClient::over_tls`].
///
/// # Errors
/// The socket error when the edge cannot be reached or keepalive cannot be set.
pub async fn dial(
    addr: impl ToSocketAddrs,
    keepalive: Option<&Keepalive>,
) -> io::Result<TcpStream> {
    let stream = TcpStream::connect(addr).await?;
    if let Some(keepalive) = keepalive {
        keepalive.apply(&stream)?;
    }
    Ok(stream)
}

impl NodeClient {
    /// Dials the edge at `addr`.
    ///
    /// # Errors
    /// The socket error when the edge cannot be reached.
    pub async fn connect(addr: SocketAddr) -> Result<Self, ClientError> {
        Self::over_tcp(TcpStream::connect(addr).await?)
    }

    /// Dials the edge at `addr` with TCP keepalive on: the kernel closes the connection when
    /// the edge stops answering probes, a second line under the link check.
    ///
    /// # Errors
    /// The socket error when the edge cannot be reached or keepalive cannot be set.
    pub async fn connect_with_keepalive(
        addr: SocketAddr,
        keepalive: &Keepalive,
    ) -> Result<Self, ClientError> {
        Self::over_tcp(dial(addr, Some(keepalive)).await?)
    }

    /// Speaks the protocol over a TCP connection the caller dialled itself (see [`dial`]).
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

    /// A client over `stream`, fenced by a fence of its own (see [`NodeClient::fenced`]).
    fn over(stream: ClientStream) -> Self {
        let mut codec = NodeCodec::new(MAX_FRAME_BYTES);
        codec.set_fence(EpochFence::new());
        Self {
            framed: Framed::new(stream, codec),
        }
    }

    /// The same client, checking what the edge sends against `fence` — the node's one
    /// fence, shared by every connection it opens, across reconnects (docs/protocol.md,
    /// "Fencing"). A message under an epoch below the highest the fence has seen (a member
    /// of the site that lost its lease since) is not handed to the node: reading it is
    /// [`FrameError::Stale`], and the node closes the connection. Without a shared fence a
    /// client is fenced by one of its own, which remembers only this connection.
    #[must_use]
    pub fn fenced(mut self, fence: EpochFence) -> Self {
        self.framed.codec_mut().set_fence(fence);
        self
    }

    /// Sends a RegisterRequest and returns the edge's answer.
    ///
    /// # Errors
    /// [`ClientError`] when the exchange fails or the edge answers with anything else.
    pub async fn register(
        &mut self,
        registration: Registration,
    ) -> Result<RegisterOutcome, ClientError> {
        self.send(NodeFrame::Register(registration)).await?;
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
        inventory: None,
    }
}
