//! Failover and circuit breakers: what happens when an attempt ends.
//!
//! Every attempt's terminal event (the node's, or the edge's: a disconnect, a deadline, a
//! cancel) passes through [`Placer::fail_over`] before it is relayed. It records the
//! attempt's outcome with the node's breaker — exactly once per attempt — and asks the
//! domain (`after_attempt`) whether the run gets another attempt: only when it failed for
//! a node's reason (class `NODE` or `REFUSED`, or a disconnect), before any output reached
//! the caller, within `runs.max_attempts` and the deadline, and not while it is being
//! cancelled or the edge stops. The next attempt is the same `decide` as the first with
//! every node tried excluded; if it finds none that could ever take the run, the failed
//! attempt's event is relayed as the run's end.
//!

use std::sync::Arc;

use tokio::time::Instant;
use tracing::{info, warn};

use super::Table;
use super::{Effect, Fallout, Placer, fallout_of};
use crate::app::runs::progress::Progress;
use crate::app::runs::route::Route;
use crate::app::runs::run::{Run, lock};
use crate::domain::routing::{AttemptEnd, Decision, Failover, Outcome, Transition, after_attempt};
use crate::domain::{NodeId, RunEventKind};

impl Placer {
    /// Records how `run`'s current attempt ended (`kind`, a terminal event) and, if the
    /// run gets another attempt, places or queues it: then the run moved on, and what comes
    /// back is its next attempt's fallout. `None`: relay `kind` as the run's end (what the
    /// breaker's record left to do comes back all the same). `progress`, set once output
    /// reached the caller, is what a continuation carries on from (`continuation.rs`);
    /// without `blame` the ending says nothing to the node's breaker.
    pub(in crate::app::runs) fn fail_over(
        &self,
        run: &Arc<Run>,
        progress: Option<&Progress>,
        kind: &mut RunEventKind,
        blame: bool,
    ) -> (bool, Fallout) {
        // Most terminal events end the run (a completion, a client's cancel): nothing to
        // record or place, and no lock to take.
        if AttemptEnd::of(kind).is_none() {
            return (false, Fallout::default());
        }
        let mut table = lock(&self.table);
        let moved = self.move_on(&mut table, run, progress, kind, blame);
        (moved.is_some(), fallout_of(&mut table))
    }

    /// [`Self::fail_over`] under the table's lock; `Some` when the run moved on.
    fn move_on(
        &self,
        table: &mut Table,
        run: &Arc<Run>,
        progress: Option<&Progress>,
        kind: &mut RunEventKind,
        blame: bool,
    ) -> Option<()> {
        let end = AttemptEnd::of(kind)?;
        let now = Instant::now();
        let mut route = run.route();
        let (node, connection) = route
            .placement()
            .attempt()
            .map(|(node, connection)| (node.clone(), connection))?;
        let outcome = if blame {
            end.breaker_outcome()
        } else {
            Outcome::Neutral
        };
        self.record_outcome(table, &mut route, &node, outcome, now);
        let sent = if let Some(progress) = progress {
            let next = self.continue_after(table, run, &mut route, progress, kind, now)?;
            table.fallout.push(Effect::Send(Arc::clone(run), next));
            true
        } else {
            if !self.may_retry(run, &route, end, false, now) {
                return None;
            }
            self.next_attempt(table, run, &mut route, now)?
        };
        // The failed attempt's slot is free; late events from it count as after its end.
        self.registry.adjust_active_runs(&node, connection, -1);
        let selector = &run.spec().selector;
        self.models()
            .left(&node, &selector.adapter, &selector.target);
        table.remember_ended(run.id().clone(), node.clone(), connection);
        route.failed(kind.clone());
        let attempt = route.attempts();
        drop(route);
        if progress.is_none() {
            self.observer.failed_over(end);
        }
        info!(parent: run.span(), run_id = %run.id(), %node, ended = kind.name(), next_attempt = attempt + u32::from(!sent), queued = !sent, "run failed over");
        self.pump(table);
        Some(())
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
        if route.is_cancelling() || self.is_draining() {
            return false;
        }
        let max = self.routing.policy.max_attempts;
        let time_left = run.time_left(now);
        matches!(
            after_attempt(end, saw_output, route.tried(), max, time_left),
            Failover::Retry { .. }
        )
    }

    /// Whether losing `run`'s current attempt to a disconnect (before any output) would
    /// place it again, now or from the queue: some node it has not tried could take it.
    /// Changes nothing but the routing turn.
    pub(in crate::app::runs) fn would_fail_over(&self, run: &Run) -> bool {
        let now = Instant::now();
        let mut table = lock(&self.table);
        let route = run.route();
        if !self.may_retry(run, &route, AttemptEnd::Disconnected, false, now) {
            return false;
        }
        let nodes = self.candidates(run);
        !matches!(
            self.decide(&mut table, &nodes, run, &route, now),
            Decision::Refuse(_)
        )
    }

    /// Places `run`'s next attempt (`true`: it is to be sent), or queues it (`false`).
    /// `None` when no node could ever take it (every serving node tried) or the queue is
    /// full: the failed attempt ends the run.
    fn next_attempt(
        &self,
        table: &mut Table,
        run: &Arc<Run>,
        route: &mut Route,
        now: Instant,
    ) -> Option<bool> {
        let mut nodes = self.candidates(run);
        let cause = match self.decide(table, &nodes, run, route, now) {
            Decision::Refuse(refusal) => {
                info!(parent: run.span(), run_id = %run.id(), %refusal, "no node left to fail over to");
                return None;
            }
            Decision::Place { index, reason } => {
                let seat = nodes.get_mut(index);
                match seat.and_then(|s| self.take_seat(table, s, reason, run, route, now)) {
                    Some(node) => {
                        table.fallout.push(Effect::Send(Arc::clone(run), node));
                        return Some(true);
                    }
                    None => crate::domain::routing::WaitCause::NoNodeAvailable,
                }
            }
            Decision::Wait { cause, .. } => cause,
        };
        self.enqueue(table, run, route, cause, now).ok()?;
        Some(false)
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
        let Some((hash, admission)) = route.take_admission() else {
            return;
        };
        let now = now.into_std();
        if let Some(transition) = table.breakers.record(hash, node, admission, outcome, now) {
            self.breaker_changed(table, node, transition);
        }
    }

    /// Logs and counts a breaker's change; an opened breaker gets a pump when its cooldown
    /// ends, so runs waiting for it are offered its probe.
    pub(super) fn breaker_changed(&self, table: &mut Table, node: &NodeId, transition: Transition) {
        self.observer.breaker(transition);
        match transition {
            Transition::Opened { cooldown, trips } => {
                warn!(%node, cooldown_ms = cooldown.as_millis(), trips, "circuit breaker opened: the node gets no new runs");
                table.fallout.push(Effect::PumpAfter(cooldown));
            }
            Transition::HalfOpened => {
                info!(%node, "circuit breaker half-open: one probe run goes to the node");
            }
            Transition::Closed => info!(%node, "circuit breaker closed: the node is healthy again"),
        }
    }
}
