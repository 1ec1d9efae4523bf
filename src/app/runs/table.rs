//! The open runs and the queue of runs waiting for capacity: [`Table`], behind the one
//! mutex of the run service, and [`Run`], one open run.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex};

use tokio_util::sync::CancellationToken;

use super::delivery::Delivery;
use crate::domain::{AcceptedRun, Attempt, NodeId, RunId, RunSpec};
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

    /// Whether the run was dispatched to `node` on `connection`.
    fn is_on(&self, node: &NodeId, connection: ConnectionId) -> bool {
        matches!(&*lock(&self.placement), Placement::Dispatched { node: n, connection: c } if n == node && *c == connection)
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
/// `.await`; whatever must happen under it takes `&mut Table`, so selection and capacity
/// reservation are atomic.
#[derive(Default)]
pub(super) struct Table {
    pub(super) runs: HashMap<RunId, Arc<Run>>,
    pub(super) queue: VecDeque<Arc<Run>>,
    /// The most recently ended dispatched runs and the connection that held each, oldest
    /// first; at most [`REMEMBERED_ENDINGS`].
    ended: VecDeque<(RunId, NodeId, ConnectionId)>,
    /// Placements so far: the round-robin turn that breaks ties between equal nodes.
    turn: u64,
}

/// Why an event's run is not one the reporting connection holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Miss {
    /// It recently ended on that connection: a late event after the terminal one.
    Ended,
    /// It never existed, ended long ago, or another node or connection holds it.
    Unknown,
}

impl Table {
    /// The next round-robin turn for a placement.
    pub(super) fn next_turn(&mut self) -> u64 {
        let turn = self.turn;
        self.turn = self.turn.wrapping_add(1);
        turn
    }

    /// The open run `run_id`, if `node` holds it on `connection`.
    pub(super) fn held_by(
        &self,
        run_id: &str,
        node: &NodeId,
        connection: ConnectionId,
    ) -> Result<Arc<Run>, Miss> {
        match self.runs.get(run_id) {
            Some(run) if run.is_on(node, connection) => Ok(Arc::clone(run)),
            _ if self.ended_on(run_id, node, connection) => Err(Miss::Ended),
            _ => Err(Miss::Unknown),
        }
    }

    /// The open runs `node` holds on `connection`.
    pub(super) fn runs_on(&self, node: &NodeId, connection: ConnectionId) -> Vec<Arc<Run>> {
        self.runs
            .values()
            .filter(|run| run.is_on(node, connection))
            .cloned()
            .collect()
    }

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
    fn ended_on(&self, run: &str, node: &NodeId, connection: ConnectionId) -> bool {
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
