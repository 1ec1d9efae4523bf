//! The node side of the protocol: a client that dials an edge, registers, and exchanges
//! frames with it.
//!
//! The edge never uses this module. It is the reference Rust implementation of a node's
//! connection, used by the mock node in `examples/`, by the load generator and by the
//! integration tests, so they all speak exactly what real nodes speak.

use std::io;
use std::net::SocketAddr;

use futures::stream::{SplitSink, SplitStream};
use futures::{SinkExt, StreamExt};
use tokio::net::TcpStream;
use tokio_util::codec::Framed;

use crate::domain::{PROTOCOL_VERSION, RegisterAttempt, RunEventKind, Token};
use crate::ports::ReportedEvent;
use crate::wire::NodeCodec;

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
        }
    }
}

/// A connection to an edge.
pub struct NodeClient {
    framed: Framed<TcpStream, NodeCodec>,
}

/// The sending half of a split [`NodeClient`].
pub type NodeSender = SplitSink<Framed<TcpStream, NodeCodec>, NodeFrame>;

/// The receiving half of a split [`NodeClient`].
pub type NodeReceiver = SplitStream<Framed<TcpStream, NodeCodec>>;

impl NodeClient {
    /// Dials the edge at `addr`.
    ///
    /// # Errors
    /// The socket error when the edge cannot be reached.
    pub async fn connect(addr: SocketAddr) -> Result<Self, ClientError> {
        let stream = TcpStream::connect(addr).await?;
        stream.set_nodelay(true)?;
        Ok(Self {
            framed: Framed::new(stream, NodeCodec::new(MAX_FRAME_BYTES)),
        })
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
        } = registration;
        self.send(NodeFrame::Register(RegisterAttempt {
            token,
            node_id,
            node_version,
            protocol_version,
            adapters,
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
        self.send(NodeFrame::Heartbeat { active_runs }).await
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

    /// The raw socket, for tests that send bytes no well-behaved node would.
    pub fn stream_mut(&mut self) -> &mut TcpStream {
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
