//! The NodeTransport port and its companions: sending to nodes, and hearing from them.

use std::collections::BTreeMap;
use std::fmt;

use async_trait::async_trait;
use bytes::Bytes;

use crate::domain::models::{LoadState, ModelAction, ModelName};
use crate::domain::{
    AdapterName, Continuation, LoraName, NodeId, Operation, ResumeAnswer, ResumeClaim,
    RunEventKind, RunId, Target,
};

/// Identifies one connection, so the cleanup of an old connection never removes a newer one.
pub type ConnectionId = u64;

/// A run as it is sent to a node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunAssignment {
    /// The run's id.
    pub run_id: RunId,
    /// The adapter to run it with.
    pub adapter: AdapterName,
    /// The adapter's target.
    pub target: Target,
    /// The input, opaque to the edge.
    pub input: Bytes,
    /// What `input` is.
    pub content_type: String,
    /// Free-form parameters.
    pub params: BTreeMap<String, String>,
    /// Milliseconds the node has for it; 0 for no limit.
    pub deadline_ms: u32,
    /// What kind of work `input` asks for.
    pub operation: Operation,
    /// Set when this attempt carries on from output another node produced; only ever sent
    /// to a node that registered `can_continue`.
    pub continuation: Option<Continuation>,
    /// The LoRA to apply on top of `target` (protocol v1.6); only ever sent to a node that
    /// reported that LoRA. `None`: the target itself, with no LoRA applied.
    pub lora: Option<LoraName>,
}

/// What the edge sends a connected node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NodeCommand {
    /// Run this.
    Run(RunAssignment),
    /// Stop this run and answer with a terminal event.
    Cancel {
        /// The run.
        run_id: RunId,
        /// Why.
        reason: String,
    },
    /// The edge is stopping; the connection closes next.
    Shutdown {
        /// Why.
        reason: String,
    },
    /// Load or unload a target (only to a node that registered `can_manage_models`).
    Model(ModelCommand),
}

/// Load or unload one target of a managed adapter (`ModelCommand`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModelCommand {
    /// Echoed in the node's [`ModelOutcome`].
    pub command_id: String,
    /// The adapter and target.
    pub model: ModelName,
    /// Load or unload.
    pub action: ModelAction,
    /// Why, for the node's log.
    pub reason: String,
}

/// How a [`ModelCommand`] ended, as its node answered (`ModelOutcome`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModelOutcome {
    /// The command's id.
    pub command_id: String,
    /// Whether it did what it was told.
    pub ok: bool,
    /// When not ok: the engine's reason.
    pub message: String,
    /// The target's state afterwards, when the node said.
    pub state: Option<LoadState>,
}

/// Why a connection closed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CloseReason {
    /// The node closed it.
    Eof,
    /// The node broke the protocol (bad frame, wrong message, second registration).
    ProtocolViolation,
    /// A length prefix above the limit.
    OversizedFrame,
    /// No registration within the register timeout.
    RegisterTimeout,
    /// The registration was refused.
    Rejected,
    /// No frame for three heartbeat intervals.
    HeartbeatTimeout,
    /// The node did not read what the edge sent in time.
    SlowConsumer,
    /// The edge is shutting down.
    Shutdown,
    /// A socket error.
    Io,
    /// The TLS handshake failed or did not complete within its timeout (a plaintext peer,
    /// a missing or untrusted client certificate); the connection never reached the node
    /// protocol.
    TlsHandshake,
    /// The same node registered again on a newer connection and took over (its own half-open
    /// connection, or one silent for more than a heartbeat interval).
    Superseded,
    /// This edge stopped acting for its site (a cluster member turned standby): the node was
    /// told `Shutdown { reason: "standby" }` and goes to the active member.
    Standby,
}

impl CloseReason {
    /// Every reason, for metrics that pre-declare their label values.
    pub const ALL: [CloseReason; 12] = [
        Self::Eof,
        Self::ProtocolViolation,
        Self::OversizedFrame,
        Self::RegisterTimeout,
        Self::Rejected,
        Self::HeartbeatTimeout,
        Self::SlowConsumer,
        Self::Shutdown,
        Self::Io,
        Self::TlsHandshake,
        Self::Superseded,
        Self::Standby,
    ];

    /// A stable snake_case name for logs and metric labels.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Eof => "eof",
            Self::ProtocolViolation => "protocol_violation",
            Self::OversizedFrame => "oversized_frame",
            Self::RegisterTimeout => "register_timeout",
            Self::Rejected => "rejected",
            Self::HeartbeatTimeout => "heartbeat_timeout",
            Self::SlowConsumer => "slow_consumer",
            Self::Shutdown => "shutdown",
            Self::Io => "io_error",
            Self::TlsHandshake => "tls_handshake",
            Self::Superseded => "superseded",
            Self::Standby => "standby",
        }
    }
}

impl fmt::Display for CloseReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Why a command could not be queued on a link.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum LinkError {
    /// The connection is closed or closing.
    #[error("connection closed")]
    Closed,
    /// The node is not reading: its outbound queue is full, so the connection is being
    /// closed as a slow consumer.
    #[error("node is not reading (outbound queue full)")]
    Full,
}

/// One connected node's outbound side, held by the registry.
pub trait NodeLink: Send + Sync {
    /// Queues `command` for the node without waiting.
    ///
    /// # Errors
    /// [`LinkError::Closed`] when the connection is gone, [`LinkError::Full`] when the node
    /// has stopped reading (the link then closes the connection).
    fn send(&self, command: NodeCommand) -> Result<(), LinkError>;

    /// The node took over from a newer connection: closes this one without waiting. Its
    /// task leaves as [`CloseReason::Superseded`] (already out of the registry, so its
    /// departure cannot remove the new connection); commands still queued are dropped.
    fn supersede(&self);
}

/// Why a command could not be sent to a node.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TransportError {
    /// The node has no live connection.
    #[error("node {0} is not connected")]
    NotConnected(NodeId),
    /// The node's connection refused the command.
    #[error("node {node}: {error}")]
    Link {
        /// The node.
        node: NodeId,
        /// What the link said.
        error: LinkError,
    },
}

/// Sends commands to connected nodes.
#[cfg_attr(test, mockall::automock)]
pub trait NodeTransport: Send + Sync {
    /// Queues `command` for node `node` without waiting.
    ///
    /// # Errors
    /// [`TransportError`] when the node is not connected or its connection refused it; the
    /// transport then treats the node as disconnecting.
    fn send(&self, node: &NodeId, command: NodeCommand) -> Result<(), TransportError>;
}

/// A run event as a node reported it, before the edge matched it to a run.
#[derive(Debug, Clone, PartialEq)]
pub struct ReportedEvent {
    /// The run id the node gave.
    pub run_id: String,
    /// The node's sequence number.
    pub seq: u64,
    /// What happened.
    pub kind: RunEventKind,
}

/// Hears what connected nodes say and when they come and go; implemented by the run service.
#[async_trait]
pub trait NodeEventHandler: Send + Sync {
    /// A node's registration was accepted and it is in the registry.
    fn node_connected(&self, node: &NodeId);

    /// A connected node's availability changed (or an operator drained or undrained it):
    /// runs waiting for it may fit now.
    fn node_changed(&self, node: &NodeId);

    /// A node answered a [`ModelCommand`]. Ignored by default.
    fn model_outcome(&self, node: &NodeId, outcome: ModelOutcome) {
        let _ = (node, outcome);
    }

    /// A node reported `events` of one run, consecutive in its stream (at least one); the
    /// handler takes them all, leaving `events` empty for the connection to reuse. The
    /// connection reads its next frame only after this returns, which is how a node that
    /// floods the edge is slowed down.
    async fn run_events(
        &self,
        node: &NodeId,
        connection: ConnectionId,
        events: &mut Vec<ReportedEvent>,
    );

    /// Waits (a bounded time) until the events the node reported so far are kept as
    /// durably as the edge keeps them (in the run journal, so a restarted edge can take
    /// their runs back) and says whether they are; the connection calls it before it
    /// acknowledges a ping, which lets the node forget them, and leaves that ping
    /// unanswered when they are not (a later ping asks again); the handshake calls it
    /// before it answers a node's resume claims, which may let the node forget a run, and
    /// refuses the registration when they are not (the node registers again later). `true`
    /// at once by default.
    async fn events_kept(&self) -> bool {
        true
    }

    /// A node's registration on `connection` was accepted and it is in the registry, not
    /// yet answered; `claims` are the runs it says it still holds after a reconnect (none
    /// from a node that does not resume). Re-attaches to `connection` each claimed run the
    /// edge holds for this node, ends the node's runs on its other connections that it did
    /// not claim (or whose claim is refused), and returns one answer per distinct run
    /// claimed, in order, for the `RegisterResponse`.
    async fn resume_runs(
        &self,
        node: &NodeId,
        connection: ConnectionId,
        claims: &[ResumeClaim],
    ) -> Vec<ResumeAnswer>;

    /// A registered node's connection ended (it is already out of the registry).
    /// `resumable` says whether the node may come back and resume its runs (it registered
    /// with an instance id): its runs that produced output are then held for it instead of
    /// ending. Returns once every run the node held has its terminal event or is held.
    async fn node_disconnected(
        &self,
        node: &NodeId,
        connection: ConnectionId,
        reason: CloseReason,
        resumable: bool,
    );
}
