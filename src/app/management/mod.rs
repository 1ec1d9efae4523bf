//! The management service behind `/admin/v1` and the `edge` operator commands: node
//! status, drain and resume, run listings, records, cancels and event feeds.
//!
//! It combines what the edge knows live (the registry, the drains, the open runs of the run
//! service) with what the run journal keeps, and controls nodes only through the edge's own
//! services: a drain changes placement, a cancel goes through the run service and the node
//! protocol. Nothing here talks to a node directly.

mod feed;
pub mod metrics;
mod nodes;
mod port;
mod runs;
#[cfg(test)]
mod tests;

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use tokio::sync::mpsc;
use tokio_util::task::TaskTracker;

use super::drains::Drains;
use crate::domain::routing::BreakerState;
use crate::domain::{NodeId, RunEvent, RunId, RunRecord, StatsWindow};
use crate::ports::{NodeStore, Registry, RunJournal};

pub use crate::ports::ManageError;

/// The run service as the management service sees it: the open runs, and cancelling and
/// following them.
#[cfg_attr(test, mockall::automock)]
#[async_trait]
pub trait LiveRuns: Send + Sync {
    /// The records of every open run (queued or dispatched).
    fn open_records(&self) -> Vec<RunRecord>;

    /// The record of open run `id`.
    fn open_record(&self, id: &RunId) -> Option<RunRecord>;

    /// The open runs placed on `node`.
    fn runs_on(&self, node: &NodeId) -> Vec<RunId>;

    /// Cancels open run `id` (as a caller's cancel does); returns whether it was open.
    async fn cancel(&self, id: &RunId, reason: &str) -> bool;

    /// Moves open run `id` off `node`, whose drain deadline passed, to another node like a
    /// lost attempt (placed again, or continued from what was relayed), then cancels it on
    /// `node` with `reason`; a run that cannot move is cancelled there as before, `reason`
    /// then saying why. Returns whether the run was open on `node`.
    async fn move_off_drained(&self, node: &NodeId, id: &RunId, reason: &str) -> bool;

    /// Follows open run `id` from its next event on; `None` when it is not open.
    async fn follow(&self, id: &RunId) -> Option<Follow>;

    /// Drains `node` (routing passes it over) or undrains it (queued runs that fit may go
    /// to it now).
    fn set_drained(&self, node: &NodeId, drained: bool);

    /// The state of `node`'s circuit breaker.
    fn breaker_state(&self, node: &NodeId) -> BreakerState;

    /// The last hour of runs in buckets, whole edge and per node.
    fn stats(&self) -> StatsWindow;
}

/// A follower of one open run's events.
#[derive(Debug)]
pub struct Follow {
    /// The position of the first event the receiver will get: every event before it has
    /// been relayed (and handed to the journal) already.
    pub next_index: u64,
    /// The run's events from `next_index` on, with their positions; it ends after the
    /// terminal event, or early when this follower fell too far behind.
    pub events: mpsc::Receiver<(u64, Arc<RunEvent>)>,
}

/// The management service. Cheap to clone.
#[derive(Clone)]
pub struct Management {
    inner: Arc<Inner>,
}

struct Inner {
    store: Arc<dyn NodeStore>,
    registry: Arc<dyn Registry>,
    live: Arc<dyn LiveRuns>,
    journal: Arc<dyn RunJournal>,
    drains: Drains,
    /// Drain deadlines waiting to move runs off their nodes.
    timers: TaskTracker,
}

impl Management {
    /// A management service over the edge's parts.
    pub fn new(
        store: Arc<dyn NodeStore>,
        registry: Arc<dyn Registry>,
        live: Arc<dyn LiveRuns>,
        journal: Arc<dyn RunJournal>,
        drains: Drains,
    ) -> Self {
        Self {
            inner: Arc::new(Inner {
                store,
                registry,
                live,
                journal,
                drains,
                timers: TaskTracker::new(),
            }),
        }
    }

    /// The drains this service changes.
    pub fn drains(&self) -> &Drains {
        &self.inner.drains
    }

    /// Whether the journal keeps finished runs.
    pub fn journal_enabled(&self) -> bool {
        self.inner.journal.enabled()
    }

    /// Stops waiting drain deadlines (the edge is stopping; its own drain ends every run).
    pub async fn stop(&self, grace: Duration) {
        self.inner.timers.close();
        let _ = tokio::time::timeout(grace, self.inner.timers.wait()).await;
    }
}
