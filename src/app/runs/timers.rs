//! Timers: the tasks that end a run the node does not — the deadline, the queue wait, the
//! cancel grace, the resume grace — the deferred ending of a run, and the pump when a
//! breaker's cooldown ends. Each is a task in the service's `TaskTracker` that ends when
//! its run ends (or, for a cooldown, when the drain begins), but the deadlines, which one
//! task keeps for every run (`deadlines.rs`) until the drain stops it; `drain` waits for them.

use std::sync::{Arc, Weak};
use std::time::Duration;

use tokio::time::Instant;
use tracing::Instrument;

use super::deadlines::{Added, Deadlines};
use super::placement::wait_expired;
use super::service::{Inner, RunService};
use super::table::{Run, Waiting, lock};
use crate::domain::routing::WaitCause;
use crate::domain::{EdgeFailure, NodeId, RunEventKind};
use crate::ports::ConnectionId;

/// The reason a cancel sent for a passed deadline gives.
const DEADLINE_EXCEEDED: &str = "deadline exceeded";

impl RunService {
    /// Keeps the run's deadline, if it has one, in the service's set (`deadlines.rs`);
    /// the first one starts the task that keeps them.
    pub(super) fn watch(&self, run: &Arc<Run>) {
        if self.inner.deadlines.add(run) == Added::StartTask {
            let deadlines = Arc::clone(&self.inner.deadlines);
            let service = Arc::downgrade(&self.inner);
            self.inner.timers.spawn(keep_deadlines(deadlines, service));
        }
    }

    /// Ends `run`, whose deadline has passed, on a task of its own: cancelled at the node
    /// and ended with `deadline_exceeded`.
    fn expire_deadline(&self, run: Arc<Run>) {
        let service = self.clone();
        let span = run.span.clone();
        self.inner.timers.spawn(
            async move {
                {
                    let mut table = lock(&service.inner.table);
                    lock(&run.route).cancelling = Some(DEADLINE_EXCEEDED.to_owned());
                    table.unqueue(&run.id);
                }
                let kind = EdgeFailure::DeadlineExceeded.into_event_kind();
                service.end_then_cancel(&run, kind, DEADLINE_EXCEEDED).await;
            }
            .instrument(span),
        );
    }

    /// Starts the timer of the run's current stay in the queue: it ends the run when the
    /// wait for its latest cause expires (`queue_timeout` for a busy node,
    /// `no_node_available` for an absent one), counted from when it was queued.
    pub(super) fn arm_wait(&self, run: &Arc<Run>) {
        let Some(stay) = lock(&run.route).waiting.map(|w| w.stay) else {
            return;
        };
        let service = self.clone();
        let run = Arc::clone(run);
        let span = run.span.clone();
        self.inner.timers.spawn(
            async move {
                while let Some(expires) = service.wait_expires(&run, stay) {
                    tokio::select! {
                        () = run.ended.cancelled() => return,
                        // The cause changed: the expiry may be sooner.
                        () = run.wait_changed.notified() => continue,
                        () = tokio::time::sleep_until(expires) => {}
                    }
                    if let Some(kind) = service.expire_wait(&run, stay) {
                        service.end_run(&run, kind).await;
                        return;
                    }
                }
            }
            .instrument(span),
        );
    }

    /// When `run`'s stay `stay` in the queue expires by its latest cause; `None` once that
    /// stay is over.
    fn wait_expires(&self, run: &Run, stay: u32) -> Option<Instant> {
        let waiting = lock(&run.route).waiting.filter(|w| w.stay == stay)?;
        Some(waiting.since + self.wait_limit(&waiting))
    }

    /// How long a run may wait for its model's load, or else for its cause.
    fn wait_limit(&self, waiting: &Waiting) -> Duration {
        let limits = self.inner.routing.policy.wait;
        match (waiting.cause, waiting.cold_start) {
            (WaitCause::NoNodeAvailable, Some(cold_start)) => cold_start.max(limits.no_node),
            (WaitCause::AllBusy, _) => limits.busy,
            (WaitCause::NoNodeAvailable, None) => limits.no_node,
        }
    }

    /// Takes `run` out of the queue if its stay `stay` has expired by now, and says how it
    /// ends.
    fn expire_wait(&self, run: &Run, stay: u32) -> Option<RunEventKind> {
        let mut table = lock(&self.inner.table);
        let route = lock(&run.route);
        let waiting = route.waiting.filter(|w| w.stay == stay)?;
        if Instant::now() < waiting.since + self.wait_limit(&waiting) {
            return None;
        }
        table
            .unqueue(&run.id)
            .then(|| wait_expired(waiting.cause, &route))
    }

    /// After `cooldown` (a breaker opened), offers the queued runs the nodes again: the
    /// breaker lets its probe through now. Stops early when the drain begins.
    pub(super) fn pump_after(&self, cooldown: Duration) {
        let service = self.clone();
        let stopping = self.inner.stopping.clone();
        self.inner.timers.spawn(async move {
            tokio::select! {
                () = stopping.cancelled() => {}
                () = tokio::time::sleep(cooldown) => service.pump_and_send(),
            }
        });
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

    /// After `run` was detached from `node`'s `connection`: ends it with `node_disconnected`
    /// unless it ends or is resumed within `grace` (`runs.resume_grace_ms`).
    pub(super) fn arm_resume_grace(
        &self,
        run: Arc<Run>,
        node: NodeId,
        connection: ConnectionId,
        grace: Duration,
    ) {
        let service = self.clone();
        let span = run.span.clone();
        self.inner.timers.spawn(
            async move {
                tokio::select! {
                    () = run.ended.cancelled() => {}
                    () = tokio::time::sleep(grace) => {
                        service.expire_detached(&run, &node, connection).await;
                    }
                }
            }
            .instrument(span),
        );
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

/// The task that ends runs whose deadline passed: it sleeps until the soonest, or until a
/// sooner one comes in, and ends when the drain stops it or the service is gone.
async fn keep_deadlines(deadlines: Arc<Deadlines>, service: Weak<Inner>) {
    let mut expired = Vec::new();
    loop {
        let next = deadlines.take_expired(Instant::now(), &mut expired);
        if !expired.is_empty() {
            let Some(inner) = service.upgrade() else {
                return;
            };
            let service = RunService { inner };
            for run in expired.drain(..) {
                service.expire_deadline(run);
            }
        }
        if !deadlines.sleep(next).await {
            return;
        }
    }
}
