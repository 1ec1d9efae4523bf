//! The queue's waits as the placer keeps them: why each queued run waits and until when
//! (`queue_timeout` for a busy node, `no_node_available` for an absent one, longer while
//! its model is loaded for it), taking runs out of the queue when their wait expires, a
//! cancel comes or their model cannot be loaded anywhere. The timers that act on these
//! live in the relay; nothing here waits.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use super::Placer;
use crate::app::runs::route::{Route, Waiting};
use crate::app::runs::run::{Run, lock};
use crate::domain::models::ModelName;
use crate::domain::routing::WaitCause;
use crate::domain::{EdgeFailure, RunEventKind};

/// Records a waiting run's latest cause; a change wakes its wait timer.
pub(super) fn set_cause(
    run: &Run,
    route: &mut Route,
    cause: WaitCause,
    cold_start: Option<Duration>,
) {
    if route.wait_for(cause, cold_start) {
        run.wait_changed().notify_one();
    }
}

/// The terminal event of a run whose wait expired with `cause`, saying how many attempts
/// failed before it waited, if any.
fn wait_expired(cause: WaitCause, route: &Route) -> RunEventKind {
    let failure = match cause {
        WaitCause::AllBusy => EdgeFailure::QueueTimeout,
        WaitCause::NoNodeAvailable => EdgeFailure::NoNodeAvailable,
    };
    let mut kind = failure.into_event_kind();
    if let (RunEventKind::Failed { message, .. }, Some(RunEventKind::Failed { code, .. })) =
        (&mut kind, route.last_failure())
    {
        let attempts = route.attempts();
        message.push_str(&format!(
            " (after {attempts} failed attempt(s); the last ended with {code})"
        ));
    }
    kind
}

impl Placer {
    /// When `run`'s stay `stay` in the queue expires by its latest cause; `None` once that
    /// stay is over.
    pub(in crate::app::runs) fn wait_expires(&self, run: &Run, stay: u32) -> Option<Instant> {
        let waiting = run.route().waiting_in(stay)?;
        Some(waiting.since() + self.wait_limit(&waiting))
    }

    /// How long a run may wait for its model's load, or else for its cause.
    fn wait_limit(&self, waiting: &Waiting) -> Duration {
        let limits = self.routing.policy.wait;
        match (waiting.cause(), waiting.cold_start()) {
            (WaitCause::NoNodeAvailable, Some(cold_start)) => cold_start.max(limits.no_node),
            (WaitCause::AllBusy, _) => limits.busy,
            (WaitCause::NoNodeAvailable, None) => limits.no_node,
        }
    }

    /// Takes `run` out of the queue if its stay `stay` has expired by now, and says how it
    /// ends.
    pub(in crate::app::runs) fn expire_wait(&self, run: &Run, stay: u32) -> Option<RunEventKind> {
        let mut table = lock(&self.table);
        let route = run.route();
        let waiting = route.waiting_in(stay)?;
        if Instant::now() < waiting.since() + self.wait_limit(&waiting) {
            return None;
        }
        table
            .unqueue(run.id())
            .then(|| wait_expired(waiting.cause(), &route))
    }

    /// Notes that `run` is being cancelled for `reason` (no further attempt; a run resumed
    /// meanwhile is sent the cancel again) and takes it out of the queue. Returns whether
    /// it was queued (it then ends at once).
    pub(in crate::app::runs) fn cancelling(&self, run: &Run, reason: &str) -> bool {
        let mut table = lock(&self.table);
        run.route().cancel(reason);
        table.unqueue(run.id())
    }

    /// Takes out of the queue the runs waiting for `model` to be loaded — every load of it
    /// failed — unless some node serves it now; the caller ends them.
    pub(in crate::app::runs) fn unqueue_cold(&self, model: &ModelName) -> Vec<Arc<Run>> {
        let served = self
            .registry
            .statuses_serving(&model.adapter, &model.target)
            .iter()
            .any(|node| {
                node.availability
                    .as_ref()
                    .is_none_or(|a| a.serves(&model.adapter, &model.target))
                    && !node.drained
            });
        if served {
            return Vec::new();
        }
        let mut table = lock(&self.table);
        let cold: Vec<Arc<Run>> = table
            .runs
            .values()
            .filter(|run| waits_for(run, model))
            .cloned()
            .collect();
        cold.into_iter()
            .filter(|run| table.unqueue(run.id()))
            .collect()
    }
}

/// Whether `run` waits in the queue for `model` to be loaded.
fn waits_for(run: &Run, model: &ModelName) -> bool {
    let selector = &run.spec().selector;
    let route = run.route();
    selector.adapter == model.adapter
        && selector.target == model.target
        && selector.pin.is_none()
        && route.waits_cold()
}
