//! The placer: the part of the run service that owns the table of open runs (`table.rs`)
//! and every run's route (`route.rs`) — admission against the keys' limits and budgets,
//! routing (the domain's `decide`), the node's breaker admission and slot, the bounded
//! fair queue of runs waiting for a node, failover (`failover.rs`), continuation
//! (`continuation.rs`), the queue's waits (`waits.rs`), the routes of runs held across a
//! node's reconnect or taken back from the journal (`held.rs`), and sending runs and
//! cancels to nodes.
//!
//! Every step that reads the registry's state and reserves a slot holds the locked
//! [`Table`] (and the run's [`route::Route`], locked after the table), so a decision, the
//! breaker's admission and the reservation are atomic by construction (decision 6). What
//! must happen once the lock is let go — a run to send, a wait to arm, a run to end, a pump
//! after a breaker's cooldown — is collected as [`Fallout`], which the relay carries out.
//! The placer never ends a run itself and never waits.

mod admission;
mod budgets;
mod continuation;
mod failover;
pub(super) mod held;
mod table;
#[cfg(test)]
mod tests;
mod waits;

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::config::Routing;
use super::observer::RunObserver;
use super::run::{Run, lock};
use super::trace::NodeSpans;
use crate::domain::routing::{BreakerBook, BreakerState, Budgets, FairQueue, KeyLimits, NodeHash};
use crate::domain::{NodeId, RunEventKind, RunId};
use crate::ports::{ConnectionId, ModelDemand, NoModels, NodeTransport, Registry, RunJournal};

/// One thing to do once the table is unlocked.
pub(super) enum Effect {
    /// Send the run to the node it was placed on.
    Send(Arc<Run>, NodeId),
    /// Arm the wait timer of a run that entered the queue.
    ArmWait(Arc<Run>),
    /// End the run with the edge's own terminal event (a run the full queue displaced, a
    /// failed-over run no node is left for).
    End(Arc<Run>, RunEventKind),
    /// Offer the queued runs the nodes again after a breaker's cooldown.
    PumpAfter(Duration),
}

/// What must be done once the table is unlocked, in the order it came about.
#[derive(Default)]
#[must_use = "the relay carries out what placement left to do"]
pub(super) struct Fallout(Vec<Effect>);

impl Fallout {
    fn push(&mut self, effect: Effect) {
        self.0.push(effect);
    }

    /// The effects, in order.
    pub(super) fn into_effects(self) -> std::vec::IntoIter<Effect> {
        self.0.into_iter()
    }
}

/// Takes what must be done now that `table` is about to be unlocked.
fn fallout_of(table: &mut Table) -> Fallout {
    std::mem::take(&mut table.fallout)
}

/// The open runs, the wait queue, the breakers and the limits. Guarded by one mutex that is
/// never held across an `.await`; whatever must happen under it takes `&mut Table`, so a
/// decision, the breaker's admission and the slot's reservation are atomic.
struct Table {
    runs: HashMap<RunId, Arc<Run>>,
    queue: FairQueue<Arc<Run>>,
    breakers: BreakerBook,
    limits: KeyLimits,
    /// Every key's token budget: used, and reserved by its open runs.
    budgets: Budgets,
    /// The most recently ended attempts and the connection that held each, oldest first;
    /// at most [`REMEMBERED_ENDINGS`].
    ended: VecDeque<(RunId, NodeId, ConnectionId)>,
    /// Placements so far: the turn that rotates ties between equally busy nodes.
    turn: u64,
    /// What must be done once the table is unlocked, in order.
    fallout: Fallout,
}

/// Why an event's run is not one the reporting connection holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(in crate::app::runs) enum Miss {
    /// It recently ended on that connection: a late event after the terminal one.
    Ended,
    /// It never existed, ended long ago, or another node or connection holds it.
    Unknown,
}

/// Places runs on nodes and keeps the open runs. Built once per run service.
pub(super) struct Placer {
    registry: Arc<dyn Registry>,
    transport: Arc<dyn NodeTransport>,
    /// Where placements are recorded (nothing, when disabled).
    journal: Arc<dyn RunJournal>,
    routing: Routing,
    observer: Arc<dyn RunObserver>,
    /// The open runs and the queue; see [`Table`] for what must happen under it.
    table: Mutex<Table>,
    /// The model lifecycle, once attached: told which models runs want and where they run.
    models: OnceLock<Arc<dyn ModelDemand>>,
    /// Cancelled when the edge begins to drain: no new run, no further attempt.
    stopping: CancellationToken,
    /// Signalled whenever a run leaves the table, for the drain's wait.
    run_ended: Notify,
    /// Nodes' connection spans, while span export is on.
    node_spans: NodeSpans,
    /// Set while this member of a site lets its runs go (it stopped acting): no new run.
    standing_by: std::sync::atomic::AtomicBool,
}

/// What a [`Placer`] is built from.
pub(super) struct PlacerParts {
    pub registry: Arc<dyn Registry>,
    pub transport: Arc<dyn NodeTransport>,
    pub journal: Arc<dyn RunJournal>,
    pub routing: Routing,
    pub observer: Arc<dyn RunObserver>,
    pub queue_capacity: usize,
    pub stopping: CancellationToken,
}

impl Placer {
    /// A placer with an empty table.
    pub(super) fn new(parts: PlacerParts) -> Self {
        let PlacerParts {
            registry,
            transport,
            journal,
            routing,
            observer,
            queue_capacity,
            stopping,
        } = parts;
        let table = Table::new(
            queue_capacity,
            BreakerBook::new(routing.policy.breaker),
            KeyLimits::new(routing.policy.limits),
        );
        Self {
            registry,
            transport,
            journal,
            routing,
            observer,
            table: Mutex::new(table),
            models: OnceLock::new(),
            stopping,
            run_ended: Notify::new(),
            node_spans: NodeSpans::default(),
            standing_by: std::sync::atomic::AtomicBool::new(false),
        }
    }

    /// Tells `models` from now on which models runs want and where they run (once).
    pub(super) fn attach_models(&self, models: Arc<dyn ModelDemand>) {
        let _ = self.models.set(models);
    }

    /// The model lifecycle, or one that hears nothing.
    fn models(&self) -> &dyn ModelDemand {
        match self.models.get() {
            Some(models) => models.as_ref(),
            None => &NoModels,
        }
    }

    /// Whether the drain has begun.
    pub(super) fn is_draining(&self) -> bool {
        self.stopping.is_cancelled()
    }

    /// Whether new runs are refused because this member of a site stopped acting.
    pub(super) fn is_standing_by(&self) -> bool {
        self.standing_by.load(std::sync::atomic::Ordering::Acquire)
    }

    /// Refuses new runs while this member does not act (`true`), or admits them again.
    pub(super) fn set_standing_by(&self, standing_by: bool) {
        let ordering = std::sync::atomic::Ordering::Release;
        self.standing_by.store(standing_by, ordering);
    }

    /// The open run `id`.
    pub(super) fn find<Q>(&self, id: &Q) -> Option<Arc<Run>>
    where
        RunId: std::borrow::Borrow<Q>,
        Q: std::hash::Hash + Eq + ?Sized,
    {
        lock(&self.table).runs.get(id).cloned()
    }

    /// Every open run.
    pub(super) fn open_list(&self) -> Vec<Arc<Run>> {
        lock(&self.table).runs.values().cloned().collect()
    }

    /// The open run `run_id`, if `node` holds it on `connection`.
    pub(super) fn held_by(
        &self,
        run_id: &str,
        node: &NodeId,
        connection: ConnectionId,
    ) -> Result<Arc<Run>, Miss> {
        lock(&self.table).held_by(run_id, node, connection)
    }

    /// The open runs `node` holds on `connection`.
    pub(super) fn runs_on(&self, node: &NodeId, connection: ConnectionId) -> Vec<Arc<Run>> {
        lock(&self.table).runs_on(node, connection)
    }

    /// How many runs are open (dispatched or queued).
    pub(super) fn open_runs(&self) -> usize {
        lock(&self.table).runs.len()
    }

    /// How many runs wait in the queue.
    pub(super) fn queued_runs(&self) -> usize {
        lock(&self.table).queue.len()
    }

    /// How many circuit breakers are not closed (open or half-open).
    pub(super) fn open_breakers(&self) -> usize {
        lock(&self.table).breakers.not_closed()
    }

    /// The circuit breaker of `node`.
    pub(super) fn breaker_state(&self, node: &NodeId) -> BreakerState {
        lock(&self.table).breakers.state(NodeHash::of(node), node)
    }

    /// Queued runs by why they wait: `[every serving node busy, no node available]`.
    pub(super) fn waiting_by_cause(&self) -> [usize; 2] {
        lock(&self.table).waiting_by_cause()
    }

    /// Waits until no run is open or `deadline` passes.
    pub(super) async fn all_ended(&self, deadline: Instant) {
        loop {
            let ended = self.run_ended.notified();
            if self.open_runs() == 0 {
                return;
            }
            if tokio::time::timeout_at(deadline, ended).await.is_err() {
                return;
            }
        }
    }

    /// Empties the queue and lists the runs still open, for the drain to end them.
    pub(super) fn left_open(&self) -> Vec<Arc<Run>> {
        let mut table = lock(&self.table);
        table.queue.drain();
        table.runs.values().cloned().collect()
    }

    /// Waits out the placements under way (they happen under the table's lock).
    pub(super) fn placements_settled(&self) {
        drop(lock(&self.table));
    }

    /// `node` connected: keeps its connection's span (while span export is on).
    pub(super) fn node_connected(&self, node: &NodeId) {
        let connection = || self.registry.get(node.as_str()).map(|n| n.connection);
        self.node_spans.connected(node, connection);
    }

    /// `node`'s `connection` closed: forgets its span.
    pub(super) fn node_disconnected(&self, node: &NodeId, connection: ConnectionId) {
        self.node_spans.disconnected(node, connection);
    }
}
