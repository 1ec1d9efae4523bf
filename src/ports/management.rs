//! The management port, inbound: what the management API (`/admin/v1`) asks of the edge —
//! node status, drain and resume, run listings and records, cancels and event feeds — with
//! the views and errors it gets back. The management service
//! (`crate::app::management::Management`) implements it; the admin adapter holds an
//! `Arc<dyn Manage>` and never names the service.

use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use futures::Stream;

use crate::domain::routing::BreakerState;
use crate::domain::{
    AdapterName, Availability, Drain, Inventory, NodeRecord, NodeState, RunEvent, RunId, RunPage,
    RunQuery, RunRecord, StatsWindow, Target, UsageQuery, UsageRow,
};
use crate::ports::JournalError;

/// A run's events as a feed yields them, in order; it ends after the terminal event (or at
/// once, for a finished run whose events have all been yielded).
pub type FeedStream = Pin<Box<dyn Stream<Item = FeedItem> + Send>>;

/// What operators can ask of the edge.
#[async_trait]
pub trait Manage: Send + Sync {
    /// Every configured node, ordered by id, connected or not.
    fn nodes(&self) -> Vec<NodeStatus>;

    /// The configured node with id or alias `name`.
    fn node(&self, name: &str) -> Option<NodeStatus>;

    /// Drains node `name`: it takes no new run; its runs finish, or once `deadline` has
    /// passed move to other nodes (or are cancelled where they cannot move). Draining again replaces the deadline.
    ///
    /// # Errors
    /// [`ManageError::UnknownNode`] when no configured node has that id or alias.
    fn drain(&self, name: &str, deadline: Option<Duration>) -> Result<NodeStatus, ManageError>;

    /// Ends node `name`'s drain: it takes runs again (`POST /admin/v1/nodes/{id}/resume`
    /// and `edge resume` on the wire and the command line, their contract words).
    ///
    /// # Errors
    /// [`ManageError::UnknownNode`] when no configured node has that id or alias.
    fn undrain(&self, name: &str) -> Result<NodeStatus, ManageError>;

    /// One page of runs matching `query`, newest first, open and finished.
    ///
    /// # Errors
    /// [`ManageError::Journal`] when the journal cannot be read.
    async fn runs(&self, query: &RunQuery) -> Result<RunPage, ManageError>;

    /// Run `id`'s record, open or finished; `None` when neither.
    ///
    /// # Errors
    /// [`ManageError::Journal`] when the journal cannot be read.
    async fn run(&self, id: &RunId) -> Result<Option<RunRecord>, ManageError>;

    /// Cancels open run `id`, as a caller's cancel does.
    ///
    /// # Errors
    /// [`ManageError::UnknownRun`] when no run has that id, [`ManageError::RunEnded`] when
    /// it has ended, [`ManageError::Journal`] when the journal cannot be read.
    async fn cancel(&self, id: &RunId) -> Result<(), ManageError>;

    /// Run `id`'s events from position `from` on: stored ones first, then, when `follow`
    /// and the run is open, each as it is relayed until the terminal event.
    ///
    /// # Errors
    /// [`ManageError::UnknownRun`] when the run is neither open nor in the journal.
    async fn events(&self, id: &RunId, from: u64, follow: bool) -> Result<FeedStream, ManageError>;

    /// The usage rollups `query` asks for, every run ended before the call included.
    ///
    /// # Errors
    /// [`ManageError::JournalDisabled`] when the journal keeps nothing,
    /// [`ManageError::Journal`] when it cannot be read.
    async fn usage(&self, query: &UsageQuery) -> Result<Vec<UsageRow>, ManageError>;

    /// The last hour of runs in buckets of [`crate::domain::stats::BUCKET_MS`]: runs
    /// started and ended, errors, output tokens, time to first output and the queue's
    /// peak, for the whole edge and per node. Kept in memory: it starts empty when the edge
    /// starts.
    fn stats(&self) -> StatsWindow;

    /// Now, in milliseconds since the Unix epoch: the clock run records and drains are
    /// stamped with (for "the last N minutes" queries).
    fn now_ms(&self) -> u64;
}

/// Why a management call failed.
#[derive(Debug, thiserror::Error)]
pub enum ManageError {
    /// No configured node has that id or alias.
    #[error("no node has id or alias {0:?}")]
    UnknownNode(String),
    /// No open or journaled run has that id.
    #[error("no run has id {0:?}")]
    UnknownRun(String),
    /// The run has ended already.
    #[error("run {0:?} has already ended")]
    RunEnded(String),
    /// The journal could not be read.
    #[error(transparent)]
    Journal(#[from] JournalError),
    /// The answer needs the journal, and `[journal] enabled = false`.
    #[error("usage is kept in the run journal, and it is disabled (`[journal] enabled = false`)")]
    JournalDisabled,
}

/// One event of a feed.
#[derive(Debug, Clone, PartialEq)]
pub struct FeedItem {
    /// Its position among the run's events.
    pub index: u64,
    /// Its kind (`started`, `output`, ...).
    pub kind: String,
    /// The event, as the journal stored it or as it was relayed.
    pub event: FeedEvent,
}

/// A feed's event: read back from the journal, or live. The adapter that serves the feed
/// writes a live one as the journal wrote the stored ones (the event line), so a reader
/// cannot tell them apart.
#[derive(Debug, Clone, PartialEq)]
pub enum FeedEvent {
    /// As the journal stored it: one JSON object, as the `file` sink writes it (no newline).
    Stored(String),
    /// Relayed while the feed follows the run.
    Live(Box<RunEvent>),
}

/// A configured node as an operator sees it.
#[derive(Debug, Clone)]
pub struct NodeStatus {
    /// Its definition.
    pub record: Arc<NodeRecord>,
    /// Its live connection, if connected.
    pub connection: Option<ConnectedNodeView>,
    /// Its drain, if drained.
    pub drain: Option<Drain>,
    /// Its state.
    pub state: NodeState,
    /// Its circuit breaker (closed, with its recent failures, while it is not connected).
    pub breaker: BreakerState,
}

impl NodeStatus {
    /// Whether its circuit breaker keeps new runs away from it now.
    pub fn breaker_open(&self) -> bool {
        matches!(self.breaker, BreakerState::Open { .. })
    }

    /// Whether the node reports it can serve `target` through `adapter` now; `None` while
    /// it reports nothing (or is not connected).
    pub fn available(&self, adapter: &AdapterName, target: &Target) -> Option<bool> {
        let reported = self.connection.as_ref()?.availability.as_ref()?;
        Some(reported.serves(adapter, target))
    }
}

/// What the registry knows of a connected node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConnectedNodeView {
    /// The node's address.
    pub peer: std::net::SocketAddr,
    /// The node software's version.
    pub node_version: String,
    /// When it registered, ms since the Unix epoch.
    pub connected_since_ms: u64,
    /// When it last sent a frame (a heartbeat or an event), ms since the Unix epoch.
    pub last_seen_ms: u64,
    /// Runs it holds now.
    pub active_runs: u32,
    /// What it last reported it can serve now; `None` until it reports.
    pub availability: Option<Arc<Availability>>,
    /// Its devices as it last reported them (v1.7); `None` from an older node.
    pub inventory: Option<Arc<Inventory>>,
}
