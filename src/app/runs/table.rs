//! The open runs and the routing state behind the run service's one mutex: [`Table`]
//! (runs, the fair wait queue, the circuit breakers, the per-key limits) and [`Run`], one
//! open run with its [`Route`] (where it is, which nodes it tried, why it waits).

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex, OnceLock};

use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::delivery::Delivery;
use super::metrics::RouteMetrics;
use crate::domain::routing::{
    Admission, BreakerBook, Budgets, FairQueue, KeyLimits, NodeHash, RouteReason, Tried, WaitCause,
};
use crate::domain::{AcceptedRun, Attempt, Continuation, NodeId, RunEventKind, RunId, RunSpec};
use crate::ports::ConnectionId;

/// Where a run is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Placement {
    /// Waiting in the queue for a node (or ended before reaching one).
    Queued,
    /// Sent to this node's connection.
    Dispatched {
        /// The node.
        node: NodeId,
        /// Its connection at dispatch time (or at the resume that re-attached it).
        connection: ConnectionId,
    },
    /// Its node's connection dropped after the run produced output: held for the node to
    /// reconnect and claim it (see `resume.rs`). The attempt goes on; its slot was freed
    /// with the connection.
    Detached {
        /// The node.
        node: NodeId,
        /// The connection that dropped.
        connection: ConnectionId,
        /// When it dropped.
        since: Instant,
        /// Whether the run's loss, should the node not resume it, counts against the node's
        /// breaker (one departure counts once, with its first run).
        blame: bool,
    },
}

impl Placement {
    /// The node and connection of the current attempt, attached or detached; `None` while
    /// queued.
    pub(super) fn attempt(&self) -> Option<(&NodeId, ConnectionId)> {
        match self {
            Self::Queued => None,
            Self::Dispatched { node, connection }
            | Self::Detached {
                node, connection, ..
            } => Some((node, *connection)),
        }
    }
}

/// Why and since when a run waits in the queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Waiting {
    /// When it entered the queue (this time: a failover queues it again).
    pub(super) since: Instant,
    /// The latest reason it could not be placed; re-decided at every pump.
    pub(super) cause: WaitCause,
    /// Which of the run's stays in the queue this is, so a timer armed for an earlier one
    /// leaves this one alone.
    pub(super) stay: u32,
    /// Set while its model is being loaded for it: how long it may wait for that, instead
    /// of the wait for `cause`.
    pub(super) cold_start: Option<std::time::Duration>,
}

/// How a run is routed: changed only while the table is locked (the table's lock is always
/// taken first), read on its own by the relay.
#[derive(Debug)]
pub(super) struct Route {
    pub(super) placement: Placement,
    /// Every node the run was placed on, in order; its length is the attempts made.
    pub(super) tried: Tried,
    /// The current attempt's leave from its node's breaker, until the attempt's outcome is
    /// recorded (exactly once).
    pub(super) admission: Option<(NodeHash, Admission)>,
    /// Why the current attempt went where it did.
    pub(super) reason: Option<RouteReason>,
    /// Set while the run waits in the queue.
    pub(super) waiting: Option<Waiting>,
    /// Stays in the queue so far.
    pub(super) stays: u32,
    /// The failure of the latest attempt that was failed over, for the run's end when no
    /// further attempt comes.
    pub(super) last_failure: Option<RunEventKind>,
    /// A cancel was asked for (by the caller, the deadline or the edge), with its reason:
    /// no more attempts, and a run resumed meanwhile is sent the cancel again.
    pub(super) cancelling: Option<String>,
    /// Continuations the run had.
    pub(super) continuations: u32,
    /// What the current attempt carries on from, when it is a continuation.
    pub(super) continuation: Option<Continuation>,
}

impl Default for Route {
    fn default() -> Self {
        Self {
            placement: Placement::Queued,
            tried: Tried::default(),
            admission: None,
            reason: None,
            waiting: None,
            stays: 0,
            last_failure: None,
            cancelling: None,
            continuations: 0,
            continuation: None,
        }
    }
}

/// One open run.
pub(super) struct Run {
    pub(super) id: RunId,
    pub(super) spec: RunSpec,
    /// When the run was accepted; its deadline and latencies count from here.
    pub(super) accepted_at: Instant,
    pub(super) route: Mutex<Route>,
    pub(super) delivery: tokio::sync::Mutex<Delivery>,
    /// Cancelled when the run has had its terminal event; stops its timers.
    pub(super) ended: CancellationToken,
    /// Notified when the cause of its wait changes, so its wait timer looks again.
    pub(super) wait_changed: tokio::sync::Notify,
    /// `run{run_id, adapter, target, node, attempt}`, exported as a trace's span (never
    /// logged: the run's log lines carry `run_id`); its log lines are its span events.
    pub(super) span: tracing::Span,
    /// What the journal and the management API know of it from acceptance.
    pub(super) accepted: AcceptedRun,
    /// Its placements so far.
    pub(super) attempts: Mutex<Vec<Attempt>>,
    /// Events relayed so far (the next event's position); written under `delivery`.
    pub(super) relayed: AtomicU64,
    /// When its first output was relayed, ms since the Unix epoch; 0 before.
    pub(super) first_output_ms: AtomicU64,
    /// Its route's bound instruments, found at its first dispatch.
    pub(super) route_metrics: OnceLock<Arc<RouteMetrics>>,
    /// Who reads its client stream (`stream_readers.rs`).
    pub(super) readers: Mutex<Readers>,
}

/// The readers of a run's client stream: the caller that started it, and callers that
/// resumed it.
#[derive(Debug, Clone, Copy)]
pub(super) struct Readers {
    /// Readers attached now.
    pub(super) count: u32,
    /// Bumped whenever a reader comes or goes, so a grace timer armed when the last one
    /// went knows whether that is still the latest news.
    pub(super) epoch: u64,
}

impl Run {
    /// A run not yet in the table, accepted at `accepted_at`, with nothing relayed by
    /// this edge.
    pub(super) fn new(
        id: RunId,
        spec: RunSpec,
        accepted: AcceptedRun,
        delivery: Delivery,
        span: tracing::Span,
        accepted_at: Instant,
    ) -> Self {
        Self {
            id,
            span,
            spec,
            route: Mutex::new(Route::default()),
            accepted_at,
            delivery: tokio::sync::Mutex::new(delivery),
            ended: CancellationToken::new(),
            wait_changed: tokio::sync::Notify::new(),
            accepted,
            attempts: Mutex::new(Vec::new()),
            relayed: AtomicU64::new(0),
            first_output_ms: AtomicU64::new(0),
            route_metrics: OnceLock::new(),
            // The caller that started it reads its stream.
            readers: Mutex::new(Readers { count: 1, epoch: 0 }),
        }
    }

    pub(super) fn placement(&self) -> Placement {
        lock(&self.route).placement.clone()
    }

    /// Whether the run's current attempt is on `node`'s connection `connection`.
    pub(super) fn is_on(&self, node: &NodeId, connection: ConnectionId) -> bool {
        matches!(&lock(&self.route).placement, Placement::Dispatched { node: n, connection: c } if n == node && *c == connection)
    }

    /// Whether the run's current attempt is the one `node` held on `connection`, attached
    /// or detached from it since.
    pub(super) fn is_attempt(&self, node: &NodeId, connection: ConnectionId) -> bool {
        lock(&self.route).placement.attempt() == Some((node, connection))
    }

    /// What is left of the deadline at `now`; `None` without a deadline.
    pub(super) fn time_left(&self, now: Instant) -> Option<std::time::Duration> {
        let spent = now.saturating_duration_since(self.accepted_at);
        self.spec.deadline.map(|d| d.saturating_sub(spent))
    }
}

/// Locks a std mutex, recovering from poisoning: every critical section here leaves the
/// data consistent at each step, so a panic elsewhere cannot leave it half-updated.
pub(super) fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// How many ended attempts the table remembers, so that a node's late events for them count
/// as dropped after the terminal rather than as events for an unknown run.
const REMEMBERED_ENDINGS: usize = 1_024;

/// The open runs, the wait queue, the breakers and the limits. Guarded by one mutex that is
/// never held across an `.await`; whatever must happen under it takes `&mut Table`, so a
/// decision, the breaker's admission and the slot's reservation are atomic.
pub(super) struct Table {
    pub(super) runs: HashMap<RunId, Arc<Run>>,
    pub(super) queue: FairQueue<Arc<Run>>,
    pub(super) breakers: BreakerBook,
    pub(super) limits: KeyLimits,
    /// Every key's token budget: used, and reserved by its open runs.
    pub(super) budgets: Budgets,
    /// The most recently ended attempts and the connection that held each, oldest first;
    /// at most [`REMEMBERED_ENDINGS`].
    ended: VecDeque<(RunId, NodeId, ConnectionId)>,
    /// Placements so far: the turn that rotates ties between equally busy nodes.
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
    /// An empty table.
    pub(super) fn new(queue_capacity: usize, breakers: BreakerBook, limits: KeyLimits) -> Self {
        Self {
            runs: HashMap::new(),
            queue: FairQueue::new(queue_capacity),
            breakers,
            limits,
            budgets: Budgets::default(),
            ended: VecDeque::new(),
            turn: 0,
        }
    }

    /// The next turn for a placement.
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
        self.queue.remove(run).is_some()
    }

    /// Remembers that `run`'s attempt on `node`'s `connection` has ended.
    pub(super) fn remember_ended(&mut self, run: RunId, node: NodeId, connection: ConnectionId) {
        if self.ended.len() == REMEMBERED_ENDINGS {
            self.ended.pop_front();
        }
        self.ended.push_back((run, node, connection));
    }

    /// Whether an attempt of `run` recently ended while `node` held it on `connection`.
    fn ended_on(&self, run: &str, node: &NodeId, connection: ConnectionId) -> bool {
        self.ended
            .iter()
            .any(|(r, n, c)| r.as_str() == run && n == node && *c == connection)
    }

    /// Queued runs by their latest wait cause: `[all busy, no node available]`.
    pub(super) fn waiting_by_cause(&self) -> [usize; 2] {
        let mut counts = [0; 2];
        for run in self.runs.values() {
            match lock(&run.route).waiting.map(|w| w.cause) {
                Some(WaitCause::AllBusy) => counts[0] += 1,
                Some(WaitCause::NoNodeAvailable) => counts[1] += 1,
                None => {}
            }
        }
        counts
    }
}
