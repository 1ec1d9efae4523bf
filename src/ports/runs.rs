//! The runs port, inbound: what the HTTP APIs (and any other caller of the edge) ask of the
//! run service — start a run and follow its events, cancel it — with the handle and the
//! errors they get back. The run service (`crate::app::runs::RunService`) implements it;
//! the adapters hold an `Arc<dyn Runs>` and never name the service.

use std::sync::Arc;

use async_trait::async_trait;
use tokio::sync::mpsc;

use crate::domain::models::TooLarge;
use crate::domain::routing::{LimitRefusal, Unroutable, WaitCause};
use crate::domain::{NodeId, Operation, RunEvent, RunId, RunSpec};

/// Accepts runs and cancels them.
#[cfg_attr(test, mockall::automock)]
#[async_trait]
pub trait Runs: Send + Sync {
    /// Accepts a run: sends it to a node now, or queues it when no eligible node has room.
    /// `spec.deadline` falls back to the edge's default deadline.
    ///
    /// # Errors
    /// [`StartError`] when the run is not accepted; an accepted run reports every outcome,
    /// including waiting too long in the queue, as its terminal event.
    fn start(&self, spec: RunSpec) -> Result<RunHandle, StartError>;

    /// Cancels open run `run_id` for `reason`: a queued run ends at once with `cancelled`,
    /// a dispatched one is asked to stop and ends with its node's terminal event (or the
    /// edge's `cancelled` after the cancel grace). Returns whether the run was open.
    async fn cancel(&self, run_id: &RunId, reason: &str) -> bool;

    /// A reader of open run `run_id`'s client stream went away (its connection dropped):
    /// when it was the last, the run goes on for `runs.client_resume_grace_ms` so that its
    /// caller can resume the stream ([`Runs::reader_back`]), and is cancelled for `reason`
    /// when the grace passes with no reader (at once when the grace is 0).
    async fn reader_gone(&self, run_id: &RunId, reason: &str);

    /// A caller resumed open run `run_id`'s client stream: the run is not cancelled for
    /// want of a reader while it reads (call [`Runs::reader_gone`] when it goes). Returns
    /// whether the run is open.
    fn reader_back(&self, run_id: &RunId) -> bool;

    /// Waits (a bounded time) until a run's end the journal holds may be shown to a
    /// caller who reads it from there (a resumed stream): at once, but on a member of a
    /// site, only once the journal keeps it where a takeover finds it — read from the
    /// member's own file earlier, it could be an end the site never hears of (found by the
    /// nemesis, issue 66). `false`: not yet; the caller breaks the stream off, to be
    /// resumed again.
    async fn ends_kept(&self) -> bool {
        true
    }
}

/// Why a run was not accepted. Accepted runs never fail this way: they end with a terminal
/// event instead.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StartError {
    /// No node is configured to serve it (or the pin names no configured node, or one that
    /// does not serve it). A configured node that is away makes the run wait instead.
    #[error(transparent)]
    NoNode(Unroutable),
    /// It would wait and the queue is full.
    #[error("{}; the run queue is full ({capacity} runs waiting)", waiting_for(*.cause))]
    QueueFull {
        /// Why it would have waited.
        cause: WaitCause,
        /// The queue's capacity.
        capacity: usize,
    },
    /// Its API key is over one of its limits.
    #[error("refused by the key's limits: {0}")]
    Limited(LimitRefusal),
    /// The edge is shutting down.
    #[error("the edge is shutting down")]
    ShuttingDown,
    /// Its model is too large for every node that lists it: its footprint is above each
    /// one's budget (as their reports say), so no load can ever serve it.
    #[error("the model fits on no node: {0}")]
    ModelTooLarge(TooLarge),
    /// Its operation needs a declaration (`Operation::needs_declaration`) and nodes serving
    /// its route are connected, none of which declared it.
    #[error("no connected node serving the route declared the {} operation", .operation.as_str())]
    NotSupported {
        /// The operation.
        operation: Operation,
    },
}

/// What a run waiting for `cause` waits for, for messages.
pub fn waiting_for(cause: WaitCause) -> &'static str {
    match cause {
        WaitCause::AllBusy => "every node serving it is busy",
        WaitCause::NoNodeAvailable => "no node serving it is connected and available now",
    }
}

/// What became of an accepted run at once.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Placed {
    /// Sent to this node.
    Sent(NodeId),
    /// Waiting in the queue, for this reason.
    Waiting(WaitCause),
}

/// An accepted run: its id and the stream of its events, which ends after the terminal one.
#[derive(Debug)]
pub struct RunHandle {
    /// The run's id.
    pub run_id: RunId,
    /// Every event of the run, in order; the last is terminal. Dropping it does not cancel
    /// the run (call [`Runs::cancel`]); the events still reach the sinks.
    pub events: mpsc::Receiver<Arc<RunEvent>>,
    /// Where it went at once.
    pub placed: Placed,
}
