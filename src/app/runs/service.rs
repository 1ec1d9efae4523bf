//! [`RunService`]: the public face of the run service — accepting, cancelling and draining
//! runs — and the [`NodeEventHandler`] the node transport calls. The work is done in the
//! modules beside it: placement and the queue (`placement.rs`), failover and breakers
//! (`failover.rs`), the relay of events (`delivery.rs`) and the timers (`timers.rs`).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use async_trait::async_trait;
use opentelemetry::metrics::Meter;
use tokio::sync::{Notify, mpsc};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::{debug, info_span, warn};

use super::config::RunsConfig;
use super::deadlines::Deadlines;
use super::delivery::{CALLER_BUFFER, Delivery, Source};
use super::metrics::RunMetrics;
use super::table::{Miss, Run, Table, lock};
use super::trace::NodeSpans;
use crate::domain::routing::{
    BreakerBook, BreakerState, Catalog, KeyLimits, RoutingPolicy, WaitCause,
};
use crate::domain::{
    EdgeFailure, NodeId, ResumeAnswer, ResumeClaim, RunEvent, RunEventKind, RunId, RunSpec,
};
use crate::ports::{
    CloseReason, ConnectionId, EXPORT_TARGET, EventSink, JournalEntry, ModelDemand, NoModels,
    NodeEventHandler, NodeTransport, NoopJournal, Placed, Registry, ReportedEvent, RunHandle,
    RunJournal, Runs, StartError, WaitingRuns,
};

/// How long a node's ping waits for the journal to hold the events read before it.
const JOURNAL_ACK_WAIT: Duration = Duration::from_millis(250);

/// What placement did with a new run, before it is sent.
pub(super) enum Dispatch {
    /// Send it to this node.
    Sent(NodeId),
    /// It waits; `displaced` left the full queue for it and must be ended.
    Waiting {
        cause: WaitCause,
        displaced: Option<Arc<Run>>,
    },
}

/// How the run service routes: every configured node and the routing settings.
#[derive(Debug, Clone, Default)]
pub struct Routing {
    /// Every node definition, connected or not.
    pub catalog: Catalog,
    /// Failover, waits, affinity, breakers and limits.
    pub policy: RoutingPolicy,
}

/// Counters of the run service, read by the metrics exporter and tests.
#[derive(Debug, Default)]
pub struct RunStats {
    /// Events for runs the edge does not know (never existed, ended long ago, or held by
    /// another node or connection).
    pub dropped_unknown_run: AtomicU64,
    /// Events for a run after its terminal event, from the connection that held it.
    pub dropped_after_terminal: AtomicU64,
    /// Events of a resumed run that the edge had already relayed (a node that sent again
    /// what it was told the edge has).
    pub dropped_duplicate: AtomicU64,
}

/// Accepts runs and relays their events. Cheap to clone.
#[derive(Clone)]
pub struct RunService {
    pub(super) inner: Arc<Inner>,
}

/// What every part of the run service shares.
pub(super) struct Inner {
    pub(super) registry: Arc<dyn Registry>,
    pub(super) transport: Arc<dyn NodeTransport>,
    pub(super) sink: Arc<dyn EventSink>,
    /// Where run records and events are kept (nothing, when disabled).
    pub(super) journal: Arc<dyn RunJournal>,
    pub(super) config: RunsConfig,
    pub(super) routing: Routing,
    /// The open runs and the queue; see [`Table`] for what must happen under it.
    pub(super) table: Mutex<Table>,
    next_id: AtomicU64,
    id_prefix: u32,
    draining: AtomicBool,
    /// Cancelled when the drain begins: stops the timers that wait for breakers to cool.
    pub(super) stopping: CancellationToken,
    /// Signalled whenever a run ends, for the drain wait.
    pub(super) run_ended: Notify,
    pub(super) timers: TaskTracker,
    /// The open runs' deadlines, and what wakes the task that keeps them.
    pub(super) deadlines: Arc<Deadlines>,
    pub(super) stats: RunStats,
    pub(super) metrics: RunMetrics,
    /// Nodes' connection spans, while span export is on.
    pub(super) node_spans: NodeSpans,
    /// The model lifecycle, once attached: told which models runs want and where they run.
    models: OnceLock<Arc<dyn ModelDemand>>,
}

impl RunService {
    /// A run service placing runs on the nodes in `registry` as `routing` says, sending
    /// through `transport` and relaying to `sink`, with its instruments created from
    /// `meter`; it keeps no journal. The waits and attempts come from `routing.policy`;
    /// `config` gives the queue's capacity, the cancel grace and the default deadline.
    pub fn new(
        registry: Arc<dyn Registry>,
        transport: Arc<dyn NodeTransport>,
        sink: Arc<dyn EventSink>,
        config: RunsConfig,
        routing: Routing,
        meter: &Meter,
    ) -> Self {
        let journal = Arc::new(NoopJournal) as Arc<dyn RunJournal>;
        Self::with_journal(registry, transport, sink, journal, config, routing, meter)
    }

    /// [`RunService::new`] that also records every run in `journal`.
    pub fn with_journal(
        registry: Arc<dyn Registry>,
        transport: Arc<dyn NodeTransport>,
        sink: Arc<dyn EventSink>,
        journal: Arc<dyn RunJournal>,
        config: RunsConfig,
        routing: Routing,
        meter: &Meter,
    ) -> Self {
        let table = Table::new(
            config.queue_capacity,
            BreakerBook::new(routing.policy.breaker),
            KeyLimits::new(routing.policy.limits),
        );
        Self {
            inner: Arc::new(Inner {
                registry,
                transport,
                sink,
                journal,
                config,
                routing,
                table: Mutex::new(table),
                next_id: AtomicU64::new(1),
                id_prefix: rand::random(),
                draining: AtomicBool::new(false),
                stopping: CancellationToken::new(),
                run_ended: Notify::new(),
                timers: TaskTracker::new(),
                deadlines: Arc::default(),
                stats: RunStats::default(),
                metrics: RunMetrics::new(meter),
                node_spans: NodeSpans::default(),
                models: OnceLock::new(),
            }),
        }
    }

    /// Tells `models` from now on which models runs want and where they run (once; a
    /// second call is ignored).
    pub fn attach_models(&self, models: Arc<dyn ModelDemand>) {
        let _ = self.inner.models.set(models);
    }

    /// The model lifecycle, or one that hears nothing.
    pub(super) fn models(&self) -> &dyn ModelDemand {
        match self.inner.models.get() {
            Some(models) => models.as_ref(),
            None => &NoModels,
        }
    }

    /// The service as the model lifecycle reaches it (without keeping it alive).
    pub fn waiting_runs(&self) -> Arc<dyn WaitingRuns> {
        Arc::new(super::cold_starts::ColdStarts::of(self))
    }

    /// The service's counters.
    pub fn stats(&self) -> &RunStats {
        &self.inner.stats
    }

    /// How many runs are open (dispatched or queued).
    pub fn open_runs(&self) -> usize {
        lock(&self.inner.table).runs.len()
    }

    /// How many runs wait in the queue.
    pub fn queued_runs(&self) -> usize {
        lock(&self.inner.table).queue.len()
    }

    /// How many circuit breakers are not closed (open or half-open).
    pub fn open_breakers(&self) -> usize {
        lock(&self.inner.table).breakers.not_closed()
    }

    /// The circuit breaker of `node`.
    pub fn breaker_state(&self, node: &NodeId) -> BreakerState {
        let hash = crate::domain::routing::NodeHash::of(node);
        lock(&self.inner.table).breakers.state(hash, node)
    }

    /// Queued runs by why they wait: `[every serving node busy, no node available]`.
    pub fn waiting_by_cause(&self) -> [usize; 2] {
        lock(&self.inner.table).waiting_by_cause()
    }

    /// Drains node `id` (it keeps its runs but gets no new ones; the flag outlives its
    /// connection) or undrains it, which offers it the queued runs at once. Returns whether
    /// the flag changed.
    pub fn set_drained(&self, id: &NodeId, drained: bool) -> bool {
        let changed = self.inner.registry.set_drained(id, drained);
        if changed && !drained {
            self.pump_and_send();
        }
        changed
    }

    /// Accepts a run: sends it to a node now, or queues it when no eligible node has room
    /// (every serving node busy, or none connected and available now).
    ///
    /// `spec.deadline` falls back to `runs.default_deadline_ms`.
    ///
    /// # Errors
    /// [`StartError`] when the run is not accepted; an accepted run reports every outcome,
    /// including waiting too long in the queue, as its terminal event.
    pub fn start(&self, mut spec: RunSpec) -> Result<RunHandle, StartError> {
        let inner = &self.inner;
        if self.is_draining() {
            return Err(StartError::ShuttingDown);
        }
        if spec.deadline.is_none() && inner.config.default_deadline_ms > 0 {
            spec.deadline = Some(Duration::from_millis(inner.config.default_deadline_ms));
        }
        let (caller, events) = mpsc::channel(CALLER_BUFFER);
        let run = Arc::new(self.new_run(spec, caller));
        if inner.journal.enabled() {
            let entry = JournalEntry::Accepted(Box::new(run.accepted.clone()));
            inner.journal.record(entry);
        }
        let dispatch = self.admit(&mut lock(&inner.table), &run)?;
        self.watch(&run);
        let placed = match dispatch {
            Dispatch::Sent(node) => {
                self.send_run(&run, &node);
                Placed::Sent(node)
            }
            Dispatch::Waiting { cause, displaced } => {
                self.arm_wait(&run);
                if let Some(displaced) = displaced {
                    self.end_soon(displaced, EdgeFailure::QueueFull.into_event_kind());
                }
                Placed::Waiting(cause)
            }
        };
        Ok(RunHandle {
            run_id: run.id.clone(),
            events,
            placed,
        })
    }

    /// Whether the drain has begun.
    pub(super) fn is_draining(&self) -> bool {
        self.inner.draining.load(Ordering::Acquire)
    }

    /// A fresh run with the next id, not yet in the table.
    fn new_run(&self, spec: RunSpec, caller: mpsc::Sender<Arc<RunEvent>>) -> Run {
        let n = self.inner.next_id.fetch_add(1, Ordering::Relaxed);
        let id = RunId::new(format!("run-{:08x}-{n:06}", self.inner.id_prefix));
        // For traces only: a span the log layer formats costs ~2 µs per run (decision 27),
        // so the run's log lines name `run_id` themselves.
        let span = info_span!(
            target: EXPORT_TARGET,
            "run",
            run_id = %id,
            adapter = %spec.selector.adapter,
            target = %spec.selector.target,
            node = tracing::field::Empty,
            attempt = tracing::field::Empty,
        );
        let accepted = super::management_view::accepted(&id, &spec);
        let delivery = Delivery::new(caller);
        Run::new(id, spec, accepted, delivery, span, Instant::now())
    }

    /// Cancels a run. A queued run ends at once with `cancelled`; a dispatched run is sent
    /// `CancelRun` and ends with the node's own terminal event, or the edge's `cancelled`
    /// after `runs.cancel_grace_ms`. Returns whether the run was open.
    pub async fn cancel(&self, run_id: &RunId, reason: &str) -> bool {
        let Some(run) = lock(&self.inner.table).runs.get(run_id).cloned() else {
            return false;
        };
        let cancelled = RunEventKind::cancelled(reason);
        let queued = {
            let mut table = lock(&self.inner.table);
            lock(&run.route).cancelling = Some(reason.to_owned());
            table.unqueue(run_id)
        };
        if queued {
            self.end_run(&run, cancelled).await;
            return true;
        }
        self.send_cancel(&run, reason);
        self.arm_cancel_grace(run, cancelled);
        true
    }

    /// Stops accepting runs, waits up to `grace` for open runs to end, then ends the rest
    /// with `failed`/`edge_shutdown` and flushes the sink.
    pub async fn drain(&self, grace: Duration) {
        let inner = &self.inner;
        inner.draining.store(true, Ordering::Release);
        inner.stopping.cancel();
        let deadline = Instant::now() + grace;
        loop {
            let ended = inner.run_ended.notified();
            if self.open_runs() == 0 {
                break;
            }
            if tokio::time::timeout_at(deadline, ended).await.is_err() {
                break;
            }
        }
        let remaining: Vec<Arc<Run>> = {
            let mut table = lock(&inner.table);
            table.queue.drain();
            table.runs.values().cloned().collect()
        };
        if !remaining.is_empty() {
            warn!(
                runs = remaining.len(),
                "ending runs still open after the drain grace period"
            );
        }
        let endings = remaining.iter().map(|run| {
            let kind = EdgeFailure::EdgeShutdown.into_event_kind();
            self.end_then_cancel(run, kind, "edge shutting down")
        });
        futures::future::join_all(endings).await;
        inner.deadlines.stop();
        inner.timers.close();
        inner.timers.wait().await;
        inner.sink.flush().await;
    }
}

/// The inbound runs port, as the HTTP APIs call it.
#[async_trait]
impl Runs for RunService {
    fn start(&self, spec: RunSpec) -> Result<RunHandle, StartError> {
        RunService::start(self, spec)
    }

    async fn cancel(&self, run_id: &RunId, reason: &str) -> bool {
        RunService::cancel(self, run_id, reason).await
    }

    async fn reader_gone(&self, run_id: &RunId, reason: &str) {
        RunService::reader_gone(self, run_id, reason).await;
    }

    fn reader_back(&self, run_id: &RunId) -> bool {
        RunService::reader_back(self, run_id)
    }
}

#[async_trait]
impl NodeEventHandler for RunService {
    async fn events_kept(&self) -> bool {
        // Only a journal that a restarted edge takes runs back from makes this worth a
        // wait: the node may forget what it acknowledged. The wait is bounded, so a journal
        // that stalls (a checkpoint waiting for readers, a slow disk, a starved machine)
        // cannot hold up the node's connection: past it this ping goes unanswered and the
        // node keeps its copies until a later ping's answer, so no event is ever in neither.
        if self.inner.config.resume_grace().is_some() && self.inner.journal.enabled() {
            let flushed = self.inner.journal.flush();
            return tokio::time::timeout(JOURNAL_ACK_WAIT, flushed)
                .await
                .is_ok();
        }
        true
    }

    fn node_connected(&self, node: &NodeId) {
        let connection = || self.inner.registry.get(node.as_str()).map(|n| n.connection);
        self.inner.node_spans.connected(node, connection);
        self.pump_and_send();
    }

    fn node_changed(&self, _node: &NodeId) {
        self.pump_and_send();
    }

    async fn run_events(
        &self,
        node: &NodeId,
        connection: ConnectionId,
        events: &mut Vec<ReportedEvent>,
    ) {
        let Some(first) = events.first() else {
            return;
        };
        let held = lock(&self.inner.table).held_by(&first.run_id, node, connection);
        let stats = &self.inner.stats;
        let count = events.len() as u64;
        match held {
            Ok(run) => {
                let source = Source::Attempt(node, connection);
                self.relay_node_events(&run, source, events.drain(..)).await;
            }
            Err(Miss::Ended) => {
                stats
                    .dropped_after_terminal
                    .fetch_add(count, Ordering::Relaxed);
                debug!(run_id = first.run_id, %node, count, "dropped events for a run that has ended");
            }
            Err(Miss::Unknown) => {
                stats
                    .dropped_unknown_run
                    .fetch_add(count, Ordering::Relaxed);
                debug!(run_id = first.run_id, %node, count, "dropped events for a run this node does not hold");
            }
        }
        events.clear();
    }

    async fn resume_runs(
        &self,
        node: &NodeId,
        connection: ConnectionId,
        claims: &[ResumeClaim],
    ) -> Vec<ResumeAnswer> {
        self.resume_claims(node, connection, claims).await
    }

    async fn node_disconnected(
        &self,
        node: &NodeId,
        connection: ConnectionId,
        reason: CloseReason,
        resumable: bool,
    ) {
        self.inner.node_spans.disconnected(node, connection);
        let held = lock(&self.inner.table).runs_on(node, connection);
        if !held.is_empty() {
            debug!(%node, %reason, runs = held.len(), resumable, "ending or detaching the runs of a disconnected node");
        }
        for (index, run) in held.iter().enumerate() {
            self.lose_attempt(run, node, connection, index == 0, resumable)
                .await;
        }
    }
}
