//! The endings the edge makes on its own, and the timers that make them: a deadline that
//! passed, a queue wait that expired, a cancel the node did not answer in time, a run ended
//! later because its caller must not wait, the pump after a breaker's cooldown, and a
//! cancel. Each timer is a task on the run service's [`Timers`](super::Timers) that ends
//! when its run ends; the deadlines are kept by one task for every run.

use std::sync::{Arc, Weak};
use std::time::Duration;

use tokio::time::Instant;
use tracing::Instrument;

use super::{Relay, Source};
use crate::app::runs::run::Run;
use crate::app::runs::timers::{Added, Deadlines};
use crate::domain::{EdgeFailure, EventOrigin, NodeId, RunEventKind, RunId};
use crate::ports::ConnectionId;

/// The reason a cancel sent for a passed deadline gives.
const DEADLINE_EXCEEDED: &str = "deadline exceeded";

impl Relay {
    /// Keeps the run's deadline, if it has one, with the timers; the first one starts the
    /// task that keeps them.
    pub(in crate::app::runs) fn watch(self: &Arc<Self>, run: &Arc<Run>) {
        let deadlines = self.timers.deadlines();
        if deadlines.add(run) == Added::StartTask {
            let task = keep_deadlines(Arc::clone(deadlines), Arc::downgrade(self));
            self.timers.spawn(task);
        }
    }

    /// Ends `run`, whose deadline has passed, on a task of its own: cancelled at the node
    /// and ended with `deadline_exceeded`.
    fn expire_deadline(self: &Arc<Self>, run: Arc<Run>) {
        let relay = Arc::clone(self);
        let span = run.span().clone();
        self.timers.spawn(
            async move {
                relay.placer.cancelling(&run, DEADLINE_EXCEEDED);
                let kind = EdgeFailure::DeadlineExceeded.into_event_kind();
                relay.end_then_cancel(&run, kind, DEADLINE_EXCEEDED).await;
            }
            .instrument(span),
        );
    }

    /// Starts the timer of the run's current stay in the queue: it ends the run when the
    /// wait for its latest cause expires, counted from when it was queued.
    pub(super) fn arm_wait(self: &Arc<Self>, run: &Arc<Run>) {
        let Some(stay) = run.route().stay() else {
            return;
        };
        let relay = Arc::clone(self);
        let run = Arc::clone(run);
        let span = run.span().clone();
        self.timers.spawn(
            async move {
                while let Some(expires) = relay.placer.wait_expires(&run, stay) {
                    tokio::select! {
                        () = run.ended().cancelled() => return,
                        // The cause changed: the expiry may be sooner.
                        () = run.wait_changed().notified() => continue,
                        () = tokio::time::sleep_until(expires) => {}
                    }
                    if let Some(kind) = relay.placer.expire_wait(&run, stay) {
                        relay.end_run(&run, kind).await;
                        return;
                    }
                }
            }
            .instrument(span),
        );
    }

    /// After `cooldown` (a breaker opened), offers the queued runs the nodes again: the
    /// breaker lets its probe through now. Stops early when the drain begins.
    pub(super) fn pump_after(self: &Arc<Self>, cooldown: Duration) {
        let relay = Arc::clone(self);
        self.timers.after_unless_stopping(cooldown, async move {
            relay.settle(relay.placer.pump_now());
        });
    }

    /// Cancels a run. A queued run ends at once with `cancelled`; a dispatched run is sent
    /// `CancelRun` and ends with the node's own terminal event, or the edge's `cancelled`
    /// after the cancel grace. Returns whether the run was open.
    pub(in crate::app::runs) async fn cancel(
        self: &Arc<Self>,
        run_id: &RunId,
        reason: &str,
    ) -> bool {
        let Some(run) = self.placer.find(run_id) else {
            return false;
        };
        let cancelled = RunEventKind::cancelled(reason);
        if self.placer.cancelling(&run, reason) {
            self.end_run(&run, cancelled).await;
            return true;
        }
        self.placer.send_cancel(&run, reason);
        let relay = Arc::clone(self);
        let ended = run.ended().clone();
        self.timers.after(&ended, self.cancel_grace, async move {
            relay.end_run(&run, cancelled).await;
        });
        true
    }

    /// Ends `run` with the edge's own terminal `kind` (a deadline, a shutdown), then sends
    /// its node `CancelRun` with `reason` — in that order: a node quick to answer the
    /// cancel must find the run ended, so its `cancelled` is dropped, never taken for the
    /// run's end.
    pub(in crate::app::runs) async fn end_then_cancel(
        self: &Arc<Self>,
        run: &Arc<Run>,
        kind: RunEventKind,
        reason: &str,
    ) {
        self.end_run(run, kind).await;
        self.placer.send_cancel(run, reason);
    }

    /// Ends `run` with `kind` on a task of its own, for callers that must not wait (they
    /// may hold a lock).
    pub(in crate::app::runs) fn end_soon(self: &Arc<Self>, run: Arc<Run>, kind: RunEventKind) {
        let relay = Arc::clone(self);
        self.timers.spawn(async move {
            relay.end_run(&run, kind).await;
        });
    }

    /// Ends the attempt of `run` on `node`'s `connection` with `kind` on a task of its own,
    /// for callers that must not wait (a run that could not be sent).
    pub(super) fn end_attempt_soon(
        self: &Arc<Self>,
        run: Arc<Run>,
        node: NodeId,
        connection: ConnectionId,
        kind: RunEventKind,
    ) {
        let relay = Arc::clone(self);
        self.timers.spawn(async move {
            let source = Source::Attempt(&node, connection);
            relay
                .relay_event(&run, source, None, EventOrigin::Edge, kind)
                .await;
        });
    }

    /// This member stopped acting for its site: every open run is let go without an
    /// ending — nothing relayed, journaled or sent to a node; callers' streams close (they
    /// resume on the member that acts now, which completes the runs). Returns how many.
    pub(in crate::app::runs) async fn let_go_open(self: &Arc<Self>) -> usize {
        self.placer.set_standing_by(true);
        let open = self.placer.left_open();
        for run in &open {
            run.delivery().await.let_go();
            run.ended().cancel();
            self.timers.deadlines().remove(run);
            // Nothing is settled: the budgets are loaded again by the next takeover.
            let _ = self.placer.retire(run, 0);
        }
        open.len()
    }

    /// The drain's end: every run still open ends `failed`/`edge_shutdown` and its node is
    /// asked to cancel it.
    pub(in crate::app::runs) async fn end_left_open(self: &Arc<Self>) {
        let remaining = self.placer.left_open();
        if !remaining.is_empty() {
            tracing::warn!(
                runs = remaining.len(),
                "ending runs still open after the drain grace period"
            );
        }
        let endings = remaining.iter().map(|run| {
            let kind = EdgeFailure::EdgeShutdown.into_event_kind();
            self.end_then_cancel(run, kind, "edge shutting down")
        });
        futures::future::join_all(endings).await;
    }
}

/// The task that ends runs whose deadline passed: it sleeps until the soonest, or until a
/// sooner one comes in, and ends when the drain stops it or the relay is gone.
async fn keep_deadlines(deadlines: Arc<Deadlines>, relay: Weak<Relay>) {
    let mut expired = Vec::new();
    loop {
        let next = deadlines.take_expired(Instant::now(), &mut expired);
        if !expired.is_empty() {
            let Some(relay) = relay.upgrade() else {
                return;
            };
            for run in expired.drain(..) {
                relay.expire_deadline(run);
            }
        }
        if !deadlines.sleep(next).await {
            return;
        }
    }
}
