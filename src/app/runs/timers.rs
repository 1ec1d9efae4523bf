//! Timers: the tasks that end a run the node does not — the queue wait, the deadline, the
//! cancel grace — and the deferred ending of a run its node could not be sent. Each is a
//! task in the service's `TaskTracker` that ends when its run ends; `drain` waits for them.

use std::sync::Arc;
use std::time::Duration;

use tracing::Instrument;

use super::service::RunService;
use super::table::{Placement, Run, lock};
use crate::domain::{EdgeFailure, RunEventKind};

/// Stands in for "never" where a timer needs an instant.
const FAR: Duration = Duration::from_secs(86_400 * 365);

impl RunService {
    /// Starts the timers that end a run the node does not: the queue wait (while it is
    /// queued) and the deadline.
    pub(super) fn watch(&self, run: &Arc<Run>) {
        let queued = run.placement() == Placement::Queued;
        let deadline = run.spec.deadline;
        if !queued && deadline.is_none() {
            return;
        }
        let service = self.clone();
        let run = Arc::clone(run);
        let queue_wait = Duration::from_millis(self.inner.config.queue_timeout_ms);
        let span = run.span.clone();
        self.inner.timers.spawn(
            async move {
                let started = run.accepted_at;
                let expires = started + deadline.unwrap_or(FAR);
                let mut queue_expires = queued.then(|| started + queue_wait);
                loop {
                    tokio::select! {
                        () = run.ended.cancelled() => return,
                        () = tokio::time::sleep_until(queue_expires.unwrap_or(started + FAR)), if queue_expires.is_some() => {
                            queue_expires = None;
                            if lock(&service.inner.table).unqueue(&run.id) {
                                service.end_run(&run, EdgeFailure::QueueTimeout.into_event_kind()).await;
                                return;
                            }
                        }
                        () = tokio::time::sleep_until(expires), if deadline.is_some() => {
                            lock(&service.inner.table).unqueue(&run.id);
                            service.send_cancel(&run, "deadline exceeded");
                            service.end_run(&run, EdgeFailure::DeadlineExceeded.into_event_kind()).await;
                            return;
                        }
                    }
                }
            }
            .instrument(span),
        );
    }

    /// After a cancel was sent to the node: ends the run with `cancelled` unless the node
    /// ends it within `runs.cancel_grace_ms`.
    pub(super) fn arm_cancel_grace(&self, run: Arc<Run>, cancelled: RunEventKind) {
        let service = self.clone();
        let grace = Duration::from_millis(self.inner.config.cancel_grace_ms);
        self.inner.timers.spawn(async move {
            tokio::select! {
                () = run.ended.cancelled() => {}
                () = tokio::time::sleep(grace) => service.end_run(&run, cancelled).await,
            }
        });
    }

    /// Ends `run` with `kind` on a task of its own, for callers that must not wait (they
    /// may hold the table).
    pub(super) fn end_soon(&self, run: Arc<Run>, kind: RunEventKind) {
        let service = self.clone();
        self.inner.timers.spawn(async move {
            service.end_run(&run, kind).await;
        });
    }
}
