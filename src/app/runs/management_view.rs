//! What the management service sees of the run service: records of the open runs, their
//! placements, following one run's events, cancelling — and what the run service hands
//! the journal. Off the relay's path except for [`RunService::tap`] and
//! [`RunService::hand_to_journal`], which only enqueue.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use async_trait::async_trait;
use tokio::sync::mpsc;

use super::resume::millis;
use super::service::RunService;
use super::table::{Run, lock};
use crate::app::management::{Follow, LiveRuns};
use crate::domain::routing::{AffinityKey, BreakerState, RouteReason, TenantKey};
use crate::domain::{
    AcceptedRun, Attempt, NodeId, RunEvent, RunId, RunOutcome, RunRecord, RunSpec, StatsWindow,
};
use crate::ports::clock::now_ms;
use crate::ports::{JournalEntry, RelayedEvent};

/// Events a management follower may be behind before it is dropped (it can reconnect and
/// resume from the journal).
const FOLLOWER_BUFFER: usize = 1_024;

/// What is known of a run when it is accepted.
pub(super) fn accepted(id: &RunId, spec: &RunSpec) -> AcceptedRun {
    let queued_ms = now_ms();
    AcceptedRun {
        run_id: id.clone(),
        adapter: spec.selector.adapter.clone(),
        target: spec.selector.target.clone(),
        operation: spec.operation,
        pin: spec.selector.pin.clone(),
        api_key_name: (spec.routing.tenant != TenantKey::anonymous())
            .then(|| spec.routing.tenant.as_str().to_owned()),
        queued_ms,
        deadline_ms: spec.deadline.map(|d| queued_ms.saturating_add(millis(d))),
        client_stream: spec.routing.client_stream.as_deref().map(str::to_owned),
        affinity: spec.routing.affinity.map(AffinityKey::source),
    }
}

impl RunService {
    /// Notes that `run` was just placed on `node` (for the record and the journal).
    pub(super) fn record_attempt(&self, run: &Run, node: &NodeId, reason: &RouteReason) {
        let mut attempts = lock(&run.attempts);
        let attempt = Attempt {
            number: u32::try_from(attempts.len() + 1).unwrap_or(u32::MAX),
            node: node.clone(),
            route_reason: reason.label().to_owned(),
            started_ms: now_ms(),
        };
        attempts.push(attempt.clone());
        drop(attempts);
        if self.inner.journal.enabled() {
            let run_id = run.id.clone();
            self.inner
                .journal
                .record(JournalEntry::Placed { run_id, attempt });
        }
    }

    /// Hands a relayed event to the run's followers and keeps it in `journal` for the
    /// journal (a terminal one hands what is kept to the journal first), never waiting.
    /// Called under the run's delivery lock, so positions follow relay order.
    pub(super) fn tap(
        &self,
        run: &Run,
        followers: &mut Vec<mpsc::Sender<(u64, Arc<RunEvent>)>>,
        journal: &mut Vec<RelayedEvent>,
        event: &Arc<RunEvent>,
        first_output: bool,
    ) {
        let index = run.relayed.fetch_add(1, Ordering::AcqRel);
        // Asked once per event: the port's answer is a dynamic call.
        let journaled = self.inner.journal.enabled();
        if first_output || journaled {
            let at_ms = now_ms();
            if first_output {
                run.first_output_ms.store(at_ms, Ordering::Release);
            }
            if journaled {
                journal.push(RelayedEvent {
                    index,
                    at_ms,
                    event: Arc::clone(event),
                    first_output,
                });
            }
        }
        // A run's end reaches the journal before any follower or caller sees it: one that
        // saw the end and then reads the run (after a flush) finds the end there too.
        if event.kind.is_terminal() {
            self.hand_to_journal(run, journal);
        }
        if !followers.is_empty() {
            // A follower that is full or gone is dropped: it resumes from the journal.
            followers.retain(|f| f.try_send((index, Arc::clone(event))).is_ok());
        }
    }

    /// Hands the events [`Self::tap`] kept to the journal as one entry. Called before the
    /// run's delivery lock is let go, so a follower registered next finds every earlier
    /// event on its way to the journal, and by `tap` as soon as a run's terminal event is
    /// kept (before anyone sees it, and so before the run leaves the table), so a reader
    /// finds the run's end in one or the other.
    pub(super) fn hand_to_journal(&self, run: &Run, journal: &mut Vec<RelayedEvent>) {
        if journal.is_empty() {
            return;
        }
        let events = std::mem::take(journal);
        self.inner.journal.record(JournalEntry::Events {
            run_id: run.id.clone(),
            events,
        });
    }

    fn open_runs_list(&self) -> Vec<Arc<Run>> {
        lock(&self.inner.table).runs.values().cloned().collect()
    }
}

/// The record of an open run.
fn record_of(run: &Run) -> RunRecord {
    let first_output = run.first_output_ms.load(Ordering::Acquire);
    let mut record = RunRecord::open(run.accepted.clone());
    record.attempts = lock(&run.attempts).clone();
    record.first_output_ms = (first_output > 0).then_some(first_output);
    record.events = run.relayed.load(Ordering::Acquire);
    record.outcome = RunOutcome::Open;
    record
}

#[async_trait]
impl LiveRuns for RunService {
    fn open_records(&self) -> Vec<RunRecord> {
        self.open_runs_list().iter().map(|r| record_of(r)).collect()
    }

    fn open_record(&self, id: &RunId) -> Option<RunRecord> {
        let run = lock(&self.inner.table).runs.get(id).cloned()?;
        Some(record_of(&run))
    }

    fn runs_on(&self, node: &NodeId) -> Vec<RunId> {
        self.open_runs_list()
            .iter()
            .filter(|run| run.placement().attempt().is_some_and(|(n, _)| n == node))
            .map(|run| run.id.clone())
            .collect()
    }

    async fn cancel(&self, id: &RunId, reason: &str) -> bool {
        RunService::cancel(self, id, reason).await
    }

    async fn move_off_drained(&self, node: &NodeId, id: &RunId, reason: &str) -> bool {
        RunService::move_off_drained(self, node, id, reason).await
    }

    async fn follow(&self, id: &RunId) -> Option<Follow> {
        let run = lock(&self.inner.table).runs.get(id).cloned()?;
        let mut delivery = run.delivery.lock().await;
        let (sender, events) = mpsc::channel(FOLLOWER_BUFFER);
        if !delivery.follow(sender) {
            return None;
        }
        Some(Follow {
            next_index: run.relayed.load(Ordering::Acquire),
            events,
        })
    }

    fn set_drained(&self, node: &NodeId, drained: bool) {
        RunService::set_drained(self, node, drained);
    }

    fn breaker_state(&self, node: &NodeId) -> BreakerState {
        RunService::breaker_state(self, node)
    }

    fn stats(&self) -> StatsWindow {
        self.inner.metrics.window()
    }
}
