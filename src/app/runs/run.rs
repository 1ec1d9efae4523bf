//! [`Run`]: one open run as every part of the run service shares it — what was asked (its
//! id, spec and acceptance), its route (the placer's, `route.rs`), its delivery (the
//! relay's, `delivery.rs`), who reads its stream, and what it relayed. Its fields are
//! private: each part reaches the state it owns through the methods here, and no part can
//! reach another's.

use std::any::Any;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};

use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::delivery::Delivery;
use super::route::Route;
use crate::domain::routing::{AffinityKey, TenantKey};
use crate::domain::{AcceptedRun, Attempt, RunId, RunOutcome, RunRecord, RunSpec};
use crate::ports::clock::now_ms;

/// Locks a std mutex, recovering from poisoning: every critical section in the run service
/// leaves the data consistent at each step, so a panic elsewhere cannot leave it
/// half-updated.
pub(super) fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// One open run.
pub(super) struct Run {
    id: RunId,
    spec: RunSpec,
    /// When the run was accepted; its deadline and latencies count from here.
    accepted_at: Instant,
    /// How it is routed: changed by the placer only, under its table's lock.
    route: Mutex<Route>,
    /// What is delivered for it, in order: the relay's.
    delivery: tokio::sync::Mutex<Delivery>,
    /// Cancelled when the run has had its terminal event; stops its timers.
    ended: CancellationToken,
    /// Notified when the cause of its wait changes, so its wait timer looks again.
    wait_changed: tokio::sync::Notify,
    /// `run{run_id, adapter, target, node, attempt}`, exported as a trace's span (never
    /// logged: the run's log lines carry `run_id`); its log lines are its span events.
    span: tracing::Span,
    /// What the journal and the management API know of it from acceptance.
    accepted: AcceptedRun,
    /// Its acceptance is to be journaled once it is admitted (a new run's, not yet done).
    acceptance_to_journal: AtomicBool,
    /// Its placements so far.
    attempts: Mutex<Vec<Attempt>>,
    /// Events relayed so far (the next event's position); written under `delivery`.
    relayed: AtomicU64,
    /// When its first output was relayed, ms since the Unix epoch; 0 before.
    first_output_ms: AtomicU64,
    /// What the metrics observer keeps for it (its route's bound instruments).
    observed: OnceLock<Arc<dyn Any + Send + Sync>>,
    /// Who reads its client stream.
    readers: Mutex<Readers>,
}

/// The readers of a run's client stream: the caller that started it, and callers that
/// re-read it.
#[derive(Debug, Clone, Copy)]
struct Readers {
    /// Readers attached now.
    count: u32,
    /// Bumped whenever a reader comes or goes, so a grace timer armed when the last one
    /// went knows whether that is still the latest news.
    epoch: u64,
}

impl Run {
    /// A run not yet in the table, accepted at `accepted_at`, delivering as `delivery`
    /// says, read by its caller.
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
            acceptance_to_journal: AtomicBool::new(false),
            attempts: Mutex::new(Vec::new()),
            relayed: AtomicU64::new(0),
            first_output_ms: AtomicU64::new(0),
            observed: OnceLock::new(),
            // The caller that started it reads its stream.
            readers: Mutex::new(Readers { count: 1, epoch: 0 }),
        }
    }

    pub(super) fn id(&self) -> &RunId {
        &self.id
    }

    /// Marks a new run's acceptance as still to be journaled: the placer journals it once
    /// it admits the run, before anything else of it (a run refused at admission leaves
    /// nothing in the journal).
    pub(super) fn journal_acceptance_once_admitted(&self) {
        self.acceptance_to_journal.store(true, Ordering::Relaxed);
    }

    /// Whether the run's acceptance is still to be journaled; from now on it is not.
    pub(super) fn take_acceptance_to_journal(&self) -> bool {
        self.acceptance_to_journal.swap(false, Ordering::Relaxed)
    }

    pub(super) fn spec(&self) -> &RunSpec {
        &self.spec
    }

    pub(super) fn accepted_at(&self) -> Instant {
        self.accepted_at
    }

    pub(super) fn span(&self) -> &tracing::Span {
        &self.span
    }

    pub(super) fn accepted(&self) -> &AcceptedRun {
        &self.accepted
    }

    /// Its route, locked. The placer's table lock, when both are taken, comes first.
    pub(super) fn route(&self) -> MutexGuard<'_, Route> {
        lock(&self.route)
    }

    /// Its delivery, locked (asynchronously: the relay holds it across the caller's send).
    pub(super) async fn delivery(&self) -> tokio::sync::MutexGuard<'_, Delivery> {
        self.delivery.lock().await
    }

    /// Cancelled once the run has had its terminal event.
    pub(super) fn ended(&self) -> &CancellationToken {
        &self.ended
    }

    /// Notified when its wait's cause changes.
    pub(super) fn wait_changed(&self) -> &tokio::sync::Notify {
        &self.wait_changed
    }

    /// What is left of the deadline at `now`; `None` without a deadline.
    pub(super) fn time_left(&self, now: Instant) -> Option<std::time::Duration> {
        let spent = now.saturating_duration_since(self.accepted_at);
        self.spec.deadline.map(|d| d.saturating_sub(spent))
    }

    /// Notes a placement.
    pub(super) fn add_attempt(&self, attempt: Attempt) {
        lock(&self.attempts).push(attempt);
    }

    /// How many placements it had.
    pub(super) fn attempts_made(&self) -> usize {
        lock(&self.attempts).len()
    }

    /// The node of its latest placement.
    pub(super) fn last_node(&self) -> Option<crate::domain::NodeId> {
        lock(&self.attempts).last().map(|a| a.node.clone())
    }

    /// Takes over the placements of a run taken back from the journal.
    pub(super) fn set_attempts(&self, attempts: Vec<Attempt>) {
        *lock(&self.attempts) = attempts;
    }

    /// The position of the next relayed event, counting it as relayed. Called under the
    /// delivery lock, so positions follow relay order.
    pub(super) fn take_position(&self) -> u64 {
        self.relayed.fetch_add(1, Ordering::AcqRel)
    }

    /// The position the next relayed event will have.
    pub(super) fn next_position(&self) -> u64 {
        self.relayed.load(Ordering::Acquire)
    }

    /// When its first output was relayed (ms since the Unix epoch), once it was.
    pub(super) fn first_output_ms(&self) -> Option<u64> {
        let ms = self.first_output_ms.load(Ordering::Acquire);
        (ms > 0).then_some(ms)
    }

    /// Notes when its first output was relayed.
    pub(super) fn set_first_output_ms(&self, at_ms: u64) {
        self.first_output_ms.store(at_ms, Ordering::Release);
    }

    /// What the metrics observer keeps for this run, made by `make` the first time (`None`
    /// only if something of another type was kept first: one observer keeps one type).
    pub(super) fn observed<T: Any + Send + Sync>(
        &self,
        make: impl FnOnce() -> Arc<T>,
    ) -> Option<&T> {
        let kept = self.observed.get_or_init(|| make());
        kept.downcast_ref::<T>()
    }

    /// What the metrics observer keeps for this run, if it made anything yet.
    pub(super) fn observed_yet<T: Any + Send + Sync>(&self) -> Option<&T> {
        self.observed.get().and_then(|kept| kept.downcast_ref())
    }

    /// A run taken back from the journal: relayed up to position `next_index`, its first
    /// output at `first_output_ms`, and read by nobody (its caller died with the previous
    /// edge).
    pub(super) fn restore(&self, next_index: u64, first_output_ms: Option<u64>) {
        self.relayed.store(next_index, Ordering::Release);
        self.first_output_ms
            .store(first_output_ms.unwrap_or(0), Ordering::Release);
        lock(&self.readers).count = 0;
    }

    /// A reader went away: the readers' epoch when it was the last one, `None` while others
    /// read on.
    pub(super) fn reader_left(&self) -> Option<u64> {
        let mut readers = lock(&self.readers);
        readers.count = readers.count.saturating_sub(1);
        readers.epoch += 1;
        (readers.count == 0).then_some(readers.epoch)
    }

    /// A reader came back.
    pub(super) fn reader_came(&self) {
        let mut readers = lock(&self.readers);
        readers.count += 1;
        readers.epoch += 1;
    }

    /// Whether nobody has read its stream since the last reader left at `epoch`.
    pub(super) fn unread_since(&self, epoch: u64) -> bool {
        let readers = lock(&self.readers);
        readers.count == 0 && readers.epoch == epoch
    }

    /// Its record while it is open.
    pub(super) fn record(&self) -> RunRecord {
        let mut record = RunRecord::open(self.accepted.clone());
        record.attempts = lock(&self.attempts).clone();
        record.first_output_ms = self.first_output_ms();
        record.events = self.next_position();
        record.outcome = RunOutcome::Open;
        record
    }
}

/// What is known of a run when it is accepted.
pub(super) fn accepted(id: &RunId, spec: &RunSpec) -> AcceptedRun {
    let queued_ms = now_ms();
    AcceptedRun {
        run_id: id.clone(),
        adapter: spec.selector.adapter.clone(),
        target: spec.model_target().clone(),
        operation: spec.operation,
        pin: spec.selector.pin.clone(),
        api_key_name: (spec.routing.tenant != TenantKey::anonymous())
            .then(|| spec.routing.tenant.as_str().to_owned()),
        queued_ms,
        deadline_ms: spec.deadline.map(|d| queued_ms.saturating_add(millis(d))),
        client_stream: spec.routing.client_stream.as_deref().map(str::to_owned),
        affinity: spec.routing.affinity.map(AffinityKey::source),
        budget_reserve: spec.routing.budget.map(|claim| claim.reserve),
    }
}

/// `duration` in whole milliseconds, for logs and records.
pub(super) fn millis(duration: std::time::Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)
}
