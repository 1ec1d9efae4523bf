//! Failover and circuit breakers: what happens when an attempt ends.
//!
//! Every attempt's terminal event (the node's, or the edge's: a disconnect, a deadline, a
//! cancel) passes through [`RunService::fail_over`] before it is relayed. It records the
//! attempt's outcome with the node's breaker — exactly once per attempt — and asks the
//! domain (`after_attempt`) whether the run gets another attempt: only when it failed for
//! a node's reason (class `NODE` or `REFUSED`, or a disconnect), before any output reached
//! the caller, within `runs.max_attempts` and the deadline, and not while it is being
//! cancelled or the edge stops. The next attempt is the same `decide` as the first with
//! every node tried excluded; if it finds none that could ever take the run, the failed
//! attempt's event is relayed as the run's end.
//!
//! A node's departure ends (or, for resume, detaches) each of its attempts through
//! [`RunService::lose_attempt`], the one place where a dropped connection meets a run.

use std::sync::Arc;

use tokio::time::Instant;
use tracing::{info, warn};

use super::continuation::Progress;
use super::delivery::Source;
use super::placement::Pumped;
use super::service::RunService;
use super::table::{Route, Run, Table, lock};
use crate::domain::routing::{AttemptEnd, Decision, Failover, Outcome, Transition, after_attempt};
use crate::domain::{EdgeFailure, EventOrigin, NodeId, RunEventKind};
use crate::ports::ConnectionId;

/// A run placed again after a failed attempt: what to do once the locks are released.
pub(super) struct Next {
    /// The node of the next attempt; `None` when the run waits in the queue.
    sent_to: Option<NodeId>,
    /// A run the queue displaced to make room (it ends with `queue_full`).
    displaced: Option<Arc<Run>>,
    /// What the pump after freeing the failed attempt's slot placed.
    pumped: Pumped,
}

impl RunService {
    /// Records how `run`'s current attempt ended (`kind`, a terminal event) and, if the
    /// run gets another attempt, places or queues it. `None`: relay `kind` as the run's
    /// end. `progress`, set once output reached the caller, is what a continuation carries
    /// on from (`continuation.rs`); without `blame` the ending says nothing to the node's
    /// breaker.
    pub(super) fn fail_over(
        &self,
        run: &Arc<Run>,
        progress: Option<&Progress>,
        kind: &mut RunEventKind,
        blame: bool,
    ) -> Option<Next> {
        let end = AttemptEnd::of(kind)?;
        let now = Instant::now();
        let mut table = lock(&self.inner.table);
        let mut route = lock(&run.route);
        let (node, connection) = route
            .placement
            .attempt()
            .map(|(node, connection)| (node.clone(), connection))?;
        let outcome = if blame {
            end.breaker_outcome()
        } else {
            Outcome::Neutral
        };
        self.record_outcome(&mut table, &mut route, &node, outcome, now);
        let (sent_to, displaced) = if let Some(progress) = progress {
            let next = self.continue_after(&mut table, run, &mut route, end, progress, kind, now);
            (Some(next?), None)
        } else {
            if !self.may_retry(run, &route, end, false, now) {
                return None;
            }
            self.next_attempt(&mut table, run, &mut route, now)?
        };
        // The failed attempt's slot is free; late events from it count as after its end.
        self.inner
            .registry
            .adjust_active_runs(&node, connection, -1);
        let selector = &run.spec.selector;
        self.models()
            .left(&node, &selector.adapter, &selector.target);
        table.remember_ended(run.id.clone(), node.clone(), connection);
        route.last_failure = Some(kind.clone());
        let attempt = route.tried.attempts();
        drop(route);
        if progress.is_none() {
            self.inner.metrics.failed_over(end);
        }
        info!(parent: &run.span, run_id = %run.id, %node, ended = kind.name(), next_attempt = attempt + u32::from(sent_to.is_none()), queued = sent_to.is_none(), "run failed over");
        let pumped = self.pump(&mut table);
        Some(Next {
            sent_to,
            displaced,
            pumped,
        })
    }

    /// Whether `run`, whose current attempt ended with `end`, gets another attempt: not
    /// while it is being cancelled or the edge stops, and only as the domain's
    /// `after_attempt` says (a node's reason, nothing relayed, attempts and time left).
    fn may_retry(
        &self,
        run: &Run,
        route: &Route,
        end: AttemptEnd,
        saw_output: bool,
        now: Instant,
    ) -> bool {
        if route.cancelling.is_some() || self.is_draining() {
            return false;
        }
        let max = self.inner.routing.policy.max_attempts;
        let time_left = run.time_left(now);
        matches!(
            after_attempt(end, saw_output, &route.tried, max, time_left),
            Failover::Retry { .. }
        )
    }

    /// Whether losing `run`'s current attempt to a disconnect (before any output) would
    /// place it again, now or from the queue: some node it has not tried could take it.
    /// Changes nothing but the routing turn.
    pub(super) fn would_fail_over(&self, run: &Run) -> bool {
        let now = Instant::now();
        let mut table = lock(&self.inner.table);
        let route = lock(&run.route);
        if !self.may_retry(run, &route, AttemptEnd::Disconnected, false, now) {
            return false;
        }
        let nodes = self.candidates(run);
        !matches!(
            self.decide(&mut table, &nodes, run, &route, now),
            Decision::Refuse(_)
        )
    }

    /// Places `run`'s next attempt, or queues it. `None` when no node could ever take it
    /// (every serving node tried) or the queue is full: the failed attempt ends the run.
    #[allow(clippy::type_complexity)]
    fn next_attempt(
        &self,
        table: &mut Table,
        run: &Arc<Run>,
        route: &mut Route,
        now: Instant,
    ) -> Option<(Option<NodeId>, Option<Arc<Run>>)> {
        let mut nodes = self.candidates(run);
        let cause = match self.decide(table, &nodes, run, route, now) {
            Decision::Refuse(refusal) => {
                info!(parent: &run.span, run_id = %run.id, %refusal, "no node left to fail over to");
                return None;
            }
            Decision::Place { index, reason } => {
                let seat = nodes.get_mut(index);
                match seat.and_then(|s| self.take_seat(table, s, reason, run, route, now)) {
                    Some(node) => return Some((Some(node), None)),
                    None => crate::domain::routing::WaitCause::NoNodeAvailable,
                }
            }
            Decision::Wait { cause, .. } => cause,
        };
        let displaced = self.enqueue(table, run, route, cause, now).ok()?;
        Some((None, displaced))
    }

    /// Carries on with a failed-over run once the locks are released: sends its next
    /// attempt or arms its wait, ends the run it displaced, sends what the pump placed.
    pub(super) fn continue_run(&self, run: &Arc<Run>, next: Next) {
        let Next {
            sent_to,
            displaced,
            pumped,
        } = next;
        match sent_to {
            Some(node) => self.send_run(run, &node),
            None => self.arm_wait(run),
        }
        if let Some(displaced) = displaced {
            self.end_soon(displaced, EdgeFailure::QueueFull.into_event_kind());
        }
        self.dispatch(pumped);
    }

    /// Hands the current attempt's admission back to its node's breaker with the
    /// attempt's outcome (once: the admission is taken).
    fn record_outcome(
        &self,
        table: &mut Table,
        route: &mut Route,
        node: &NodeId,
        outcome: Outcome,
        now: Instant,
    ) {
        let Some((hash, admission)) = route.admission.take() else {
            return;
        };
        let now = now.into_std();
        if let Some(transition) = table.breakers.record(hash, node, admission, outcome, now) {
            self.breaker_changed(node, transition);
        }
    }

    /// Logs and counts a breaker's change; an opened breaker gets a pump when its cooldown
    /// ends, so runs waiting for it are offered its probe.
    pub(super) fn breaker_changed(&self, node: &NodeId, transition: Transition) {
        self.inner.metrics.breaker(transition);
        match transition {
            Transition::Opened { cooldown, trips } => {
                warn!(%node, cooldown_ms = cooldown.as_millis(), trips, "circuit breaker opened: the node gets no new runs");
                self.pump_after(cooldown);
            }
            Transition::HalfOpened => {
                info!(%node, "circuit breaker half-open: one probe run goes to the node");
            }
            Transition::Closed => info!(%node, "circuit breaker closed: the node is healthy again"),
        }
    }

    /// Ends `run`'s attempt on `node`'s connection `connection`, which has closed: a
    /// disconnect, failed over when nothing was relayed yet. One departure counts once
    /// against the node's breaker, however many runs it held: `first` says whether this is
    /// the run it counts with.
    ///
    /// When the node may come back and resume its runs (`resumable`), a run whose attempt
    /// already produced output, or that failover could place nowhere else, is detached
    /// instead (`resume.rs`): kept open for the node to claim it.
    pub(super) async fn lose_attempt(
        &self,
        run: &Arc<Run>,
        node: &NodeId,
        connection: ConnectionId,
        first: bool,
        resumable: bool,
    ) {
        {
            let delivery = run.delivery.lock().await;
            if !run.is_on(node, connection)
                || (resumable && self.detach(run, &delivery, node, connection, first))
            {
                // Resumed on a newer connection meanwhile, or held for that.
                return;
            }
        }
        // Should a newer connection of the node claim the run in between, the relay finds
        // the attempt moved on and drops this ending.
        let lost = EdgeFailure::NodeDisconnected.into_event_kind();
        let source = if first {
            Source::Attempt(node, connection)
        } else {
            Source::Departed(node, connection)
        };
        self.relay_event(run, source, None, EventOrigin::Edge, lost)
            .await;
    }

    /// Ends the attempt of `run` on `node`'s `connection` with `kind` on a task of its own,
    /// for callers that must not wait (a run that could not be sent).
    pub(super) fn end_attempt_soon(
        &self,
        run: Arc<Run>,
        node: NodeId,
        connection: ConnectionId,
        kind: RunEventKind,
    ) {
        let service = self.clone();
        self.inner.timers.spawn(async move {
            let source = Source::Attempt(&node, connection);
            service
                .relay_event(&run, source, None, EventOrigin::Edge, kind)
                .await;
        });
    }
}
