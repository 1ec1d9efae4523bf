//! The open runs and the queue of runs waiting for capacity.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex};

use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::domain::{AcceptedRun, Attempt, NodeId, RunEvent, RunId, RunSpec, RunState};
use crate::ports::ConnectionId;

/// Where a run is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Placement {
    /// Waiting in the queue for a node with a free slot.
    Queued,
    /// Sent to this node's connection.
    Dispatched {
        /// The node.
        node: NodeId,
        /// Its connection at dispatch time.
        connection: ConnectionId,
    },
}

/// What is delivered for a run, guarded by one async lock so its events keep their order
/// and exactly one of them is terminal.
pub(super) struct Delivery {
    pub(super) state: RunState,
    /// The caller's stream; `None` once the run ended or the caller stopped listening.
    pub(super) caller: Option<mpsc::Sender<Arc<RunEvent>>>,
    /// Whether an `output` event has been relayed (for time-to-first-output).
    pub(super) saw_output: bool,
    /// Management API followers of the run's events, with each event's position; one that
    /// falls behind is dropped, never waited for.
    pub(super) followers: Vec<mpsc::Sender<(u64, Arc<RunEvent>)>>,
}

/// One open run.
pub(super) struct Run {
    pub(super) id: RunId,
    pub(super) spec: RunSpec,
    /// When the run was accepted; its deadline and latencies count from here.
    pub(super) accepted_at: tokio::time::Instant,
    pub(super) placement: Mutex<Placement>,
    pub(super) delivery: tokio::sync::Mutex<Delivery>,
    /// Cancelled when the run has had its terminal event; stops its timers.
    pub(super) ended: CancellationToken,
    /// `run{run_id, adapter, target, node}`: every log line about the run is inside it.
    pub(super) span: tracing::Span,
    /// What the journal and the management API know of it from acceptance.
    pub(super) accepted: AcceptedRun,
    /// Its placements so far.
    pub(super) attempts: Mutex<Vec<Attempt>>,
    /// Events relayed so far (the next event's position); written under `delivery`.
    pub(super) relayed: AtomicU64,
    /// When its first output was relayed, ms since the Unix epoch; 0 before.
    pub(super) first_output_ms: AtomicU64,
}

impl Run {
    pub(super) fn placement(&self) -> Placement {
        lock(&self.placement).clone()
    }

    pub(super) fn set_placement(&self, placement: Placement) {
        *lock(&self.placement) = placement;
    }
}

/// Locks a std mutex, recovering from poisoning: every critical section here leaves the
/// data consistent at each step, so a panic elsewhere cannot leave it half-updated.
pub(super) fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// How many ended runs the table remembers, so that a node's late events for them count as
/// dropped after the terminal rather than as events for an unknown run.
const REMEMBERED_ENDINGS: usize = 1_024;

/// The open runs and the waiting queue. Guarded by one mutex that is never held across an
/// `.await`, so selection and capacity reservation are atomic.
#[derive(Default)]
pub(super) struct Table {
    pub(super) runs: HashMap<RunId, Arc<Run>>,
    pub(super) queue: VecDeque<Arc<Run>>,
    /// The most recently ended dispatched runs and the connection that held each, oldest
    /// first; at most [`REMEMBERED_ENDINGS`].
    ended: VecDeque<(RunId, NodeId, ConnectionId)>,
}

impl Table {
    /// Takes `run` out of the queue; returns whether it was there.
    pub(super) fn unqueue(&mut self, run: &RunId) -> bool {
        let before = self.queue.len();
        self.queue.retain(|queued| &queued.id != run);
        self.queue.len() != before
    }

    /// Remembers that `run`, held by `node` on `connection`, has ended.
    pub(super) fn remember_ended(&mut self, run: RunId, node: NodeId, connection: ConnectionId) {
        if self.ended.len() == REMEMBERED_ENDINGS {
            self.ended.pop_front();
        }
        self.ended.push_back((run, node, connection));
    }

    /// Whether `run` recently ended while `node` held it on `connection`.
    pub(super) fn ended_on(&self, run: &str, node: &NodeId, connection: ConnectionId) -> bool {
        self.ended
            .iter()
            .any(|(r, n, c)| r.as_str() == run && n == node && *c == connection)
    }

    /// How many queued runs want the same adapter and target as `spec`.
    pub(super) fn queued_like(&self, spec: &RunSpec) -> usize {
        self.queue
            .iter()
            .filter(|r| {
                r.spec.selector.adapter == spec.selector.adapter
                    && r.spec.selector.target == spec.selector.target
            })
            .count()
    }
}
