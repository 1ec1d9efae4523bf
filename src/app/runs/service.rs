//! [`RunService`]: the run service's public face — accepting, cancelling and draining runs,
//! and what operators and the metrics read of it — a thin façade over its parts: the
//! placer, the relay, recovery and the timers, each owning its state. It builds them,
//! numbers new runs and says which part answers what. The ports it implements for the
//! adapters and the other services are in `handlers.rs`.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use opentelemetry::metrics::Meter;
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::info_span;

use super::cold_starts::ColdStarts;
use super::config::{Routing, RunsConfig};
use super::delivery::Delivery;
use super::metrics::RunMetrics;
use super::observer::RunObserver;
use super::placer::{Placer, PlacerParts};
use super::recovery::{Recovery, RecoveryParts};
use super::relay::{CALLER_BUFFER, Relay, RunStats};
use super::run::{Run, accepted};
use super::timers::Timers;
use crate::domain::routing::BreakerState;
use crate::domain::{NodeId, RunEvent, RunId, RunSpec, StatsWindow};
use crate::ports::{
    EXPORT_TARGET, EventSink, JournalError, ModelDemand, NodeTransport, NoopJournal, Registry,
    RunHandle, RunJournal, StartError, WaitingRuns,
};

/// Accepts runs and relays their events. Cheap to clone.
#[derive(Clone)]
pub struct RunService {
    inner: Arc<Inner>,
}

/// The parts, and what the façade itself keeps.
struct Inner {
    placer: Arc<Placer>,
    relay: Arc<Relay>,
    recovery: Arc<Recovery>,
    timers: Arc<Timers>,
    metrics: Arc<RunMetrics>,
    /// Where accepted runs are recorded (nothing, when disabled).
    journal: Arc<dyn RunJournal>,
    config: RunsConfig,
    next_id: AtomicU64,
    id_prefix: u32,
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
        let metrics = Arc::new(RunMetrics::new(meter));
        let observer: Arc<dyn RunObserver> = metrics.clone();
        let stopping = CancellationToken::new();
        let timers = Arc::new(Timers::new(stopping.clone()));
        let placer = Arc::new(Placer::new(PlacerParts {
            registry,
            transport,
            journal: Arc::clone(&journal),
            routing,
            observer: Arc::clone(&observer),
            queue_capacity: config.queue_capacity,
            stopping,
        }));
        let relay = Arc::new(Relay::new(
            Arc::clone(&placer),
            Arc::clone(&timers),
            sink,
            Arc::clone(&journal),
            Arc::clone(&observer),
            config.cancel_grace(),
        ));
        let recovery = Arc::new(Recovery::new(RecoveryParts {
            placer: Arc::clone(&placer),
            relay: Arc::clone(&relay),
            timers: Arc::clone(&timers),
            journal: Arc::clone(&journal),
            observer,
            resume_grace: config.resume_grace(),
            client_resume_grace: config.client_resume_grace(),
        }));
        let inner = Inner {
            placer,
            relay,
            recovery,
            timers,
            metrics,
            journal,
            config,
            next_id: AtomicU64::new(1),
            id_prefix: rand::random(),
        };
        Self {
            inner: Arc::new(inner),
        }
    }

    /// Tells `models` from now on which models runs want and where they run (once; a
    /// second call is ignored).
    pub fn attach_models(&self, models: Arc<dyn ModelDemand>) {
        self.inner.placer.attach_models(models);
    }

    /// The service as the model lifecycle reaches it (without keeping it alive).
    pub fn waiting_runs(&self) -> Arc<dyn WaitingRuns> {
        Arc::new(ColdStarts::of(&self.inner.placer, &self.inner.relay))
    }

    /// The service's counters.
    pub fn stats(&self) -> &RunStats {
        self.inner.relay.stats()
    }

    /// The last hour's series, as of now.
    pub(super) fn window(&self) -> StatsWindow {
        self.inner.metrics.window()
    }

    /// How many runs are open (dispatched or queued).
    pub fn open_runs(&self) -> usize {
        self.inner.placer.open_runs()
    }

    /// How many runs wait in the queue.
    pub fn queued_runs(&self) -> usize {
        self.inner.placer.queued_runs()
    }

    /// How many circuit breakers are not closed (open or half-open).
    pub fn open_breakers(&self) -> usize {
        self.inner.placer.open_breakers()
    }

    /// The circuit breaker of `node`.
    pub fn breaker_state(&self, node: &NodeId) -> BreakerState {
        self.inner.placer.breaker_state(node)
    }

    /// Queued runs by why they wait: `[every serving node busy, no node available]`.
    pub fn waiting_by_cause(&self) -> [usize; 2] {
        self.inner.placer.waiting_by_cause()
    }

    /// Drains node `id` (it keeps its runs but gets no new ones; the flag outlives its
    /// connection) or undrains it, which offers it the queued runs at once. Returns whether
    /// the flag changed.
    pub fn set_drained(&self, id: &NodeId, drained: bool) -> bool {
        let (changed, fallout) = self.inner.placer.set_drained(id, drained);
        self.inner.relay.settle(fallout);
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
        if inner.placer.is_draining() || inner.placer.is_standing_by() {
            return Err(StartError::ShuttingDown);
        }
        if spec.deadline.is_none() {
            spec.deadline = inner.config.default_deadline();
        }
        let (caller, events) = mpsc::channel(CALLER_BUFFER);
        let run = Arc::new(self.new_run(spec, caller));
        run.journal_acceptance_once_admitted();
        let (placed, fallout) = inner.placer.admit(&run)?;
        inner.relay.watch(&run);
        inner.relay.settle(fallout);
        Ok(RunHandle {
            run_id: run.id().clone(),
            events,
            placed,
        })
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
            target = %spec.model_target(),
            node = tracing::field::Empty,
            attempt = tracing::field::Empty,
        );
        let accepted = accepted(&id, &spec);
        let delivery = Delivery::new(caller);
        Run::new(id, spec, accepted, delivery, span, Instant::now())
    }

    /// Cancels a run. A queued run ends at once with `cancelled`; a dispatched run is sent
    /// `CancelRun` and ends with the node's own terminal event, or the edge's `cancelled`
    /// after `runs.cancel_grace_ms`. Returns whether the run was open.
    pub async fn cancel(&self, run_id: &RunId, reason: &str) -> bool {
        self.inner.relay.cancel(run_id, reason).await
    }

    /// Moves open run `id` off `node`, whose drain deadline passed: to another node (placed
    /// again, queued, or continued), then cancelled on `node` with `reason`. A run that
    /// cannot move is cancelled on `node` as a caller's cancel is, `reason` then ending with
    /// why it did not move. Returns whether the run was open on `node`.
    pub async fn move_off_drained(&self, node: &NodeId, id: &RunId, reason: &str) -> bool {
        self.inner.recovery.move_off_drained(node, id, reason).await
    }

    /// Takes back the runs a previous edge left open in the journal; call once at start,
    /// before nodes may connect. Returns how many are held for their nodes.
    pub async fn adopt_left_open(&self) -> usize {
        self.inner.recovery.adopt_left_open().await
    }

    /// Lets every open run go without ending it, when this member stops acting for its
    /// site (`[cluster]`): new runs are refused from now on, no terminal event is relayed,
    /// journaled or sent, no node is told anything; callers' streams just close, and the
    /// member that acts now completes the runs (their nodes resume there). Returns how many
    /// were let go. [`RunService::act`] admits runs again.
    pub async fn let_go_open_runs(&self) -> usize {
        self.inner.relay.let_go_open().await
    }

    /// Admits runs again: this member of a site acts (after [`RunService::let_go_open_runs`]).
    pub fn act(&self) {
        self.inner.placer.set_standing_by(false);
    }

    /// Loads every key's tokens used this UTC day and month from the journal (nothing when
    /// it is disabled: budgets then start from zero). Call once, before runs are accepted.
    ///
    /// # Errors
    /// [`JournalError`] when the rollups cannot be read.
    pub async fn load_budgets(&self) -> Result<(), JournalError> {
        self.inner.placer.load_budgets().await
    }

    /// Stops accepting runs, waits up to `grace` for open runs to end, then ends the rest
    /// with `failed`/`edge_shutdown` and flushes the sink.
    pub async fn drain(&self, grace: Duration) {
        let inner = &self.inner;
        inner.timers.stopping().cancel();
        inner.placer.all_ended(Instant::now() + grace).await;
        inner.relay.end_left_open().await;
        inner.timers.stop().await;
        inner.relay.sink().flush().await;
    }

    /// The parts, for the handlers beside this file.
    pub(super) fn placer(&self) -> &Arc<Placer> {
        &self.inner.placer
    }

    pub(super) fn relay(&self) -> &Arc<Relay> {
        &self.inner.relay
    }

    pub(super) fn recovery(&self) -> &Arc<Recovery> {
        &self.inner.recovery
    }

    /// Whether a run's end is shown only once the journal keeps it for a takeover (a member
    /// of a site).
    pub(super) fn journal_shows_ends_once_kept(&self) -> bool {
        self.inner.journal.shows_ends_once_kept()
    }

    /// Whether a node's ping is answered only once the journal holds the events read
    /// before it: only a journal a restarted edge takes runs back from makes that worth a
    /// wait.
    pub(super) fn journal_backs_resume(&self) -> Option<&dyn RunJournal> {
        let inner = &self.inner;
        (inner.config.resume_grace().is_some() && inner.journal.enabled())
            .then_some(inner.journal.as_ref())
    }

    /// The timers, for the tests.
    #[cfg(test)]
    pub(super) fn timers(&self) -> &Timers {
        &self.inner.timers
    }
}
