//! Placement and the queue: routing a run (the domain's `decide`), claiming its node's
//! breaker admission and slot, queueing the runs no node can take now, handing freed
//! slots to them in fair order, and sending runs and cancels to nodes.
//!
//! Every step that reads the registry's state and reserves a slot takes the locked
//! [`Table`] as `&mut Table` (and the run's [`Route`], locked after the table), so a
//! decision, the breaker's admission and the reservation are atomic by construction
//! (decision 6); sending to a node happens after the locks are released.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;
use tracing::debug;

use super::routing_metrics::Refusal;
use super::service::{Dispatch, RunService};
use super::table::{Placement, Route, Run, Table, Waiting, lock};
use crate::domain::routing::{
    Decision, LimitRefusal, NodeStatus, RouteContext, RouteReason, RouteRequest, Unroutable,
    WaitCause, Waiter, decide,
};
use crate::domain::{AdapterName, EdgeFailure, NodeId, Operation, RunEventKind, RunSpec, Target};
use crate::ports::StartError;
use crate::ports::clock::now_ms;
use crate::ports::{NodeCommand, RunAssignment};

/// Ends `run`'s count against its key's limits and settles its budget claim with the
/// `tokens` it used (none for a run refused after its claim).
fn release_limits(table: &mut Table, run: &Run, tokens: u64) {
    let routing = &run.spec.routing;
    table.limits.finish(&routing.tenant);
    if let Some(claim) = routing.budget {
        table
            .budgets
            .settle(&routing.tenant, claim.reserve, tokens, now_ms());
    }
}

/// What routing did with a run, under the table lock.
pub(super) enum Routed {
    /// Placed on this node, its slot reserved: send it after unlocking.
    Placed(NodeId),
    /// It waits, for this reason.
    Waits(WaitCause),
    /// It cannot be placed.
    Refused(Unroutable),
}

/// What a pump of the queue did: runs to send, and failed-over runs with no node left.
#[derive(Default)]
pub(super) struct Pumped {
    placed: Vec<(Arc<Run>, NodeId)>,
    exhausted: Vec<Arc<Run>>,
}

impl RunService {
    /// Routes a newly accepted run — places it or queues it — and enters it in the table.
    ///
    /// # Errors
    /// [`StartError::Limited`] when its key is over a limit, [`StartError::QueueFull`]
    /// when it would wait and the queue is full, [`StartError::NoNode`] when no node is
    /// configured to serve it, [`StartError::NotSupported`] when its operation needs a
    /// declaration and no connected node serving its route made one.
    pub(super) fn admit(&self, table: &mut Table, run: &Arc<Run>) -> Result<Dispatch, StartError> {
        let now = Instant::now();
        self.claim_limits(table, run, now)?;
        let mut nodes = self.candidates(run);
        if none_declares(run, &nodes) {
            release_limits(table, run, 0);
            let operation = run.spec.operation;
            return Err(StartError::NotSupported { operation });
        }
        let mut route = lock(&run.route);
        let dispatch = match self.route(table, &mut nodes, run, &mut route, now) {
            Routed::Placed(node) => Dispatch::Sent(node),
            Routed::Waits(cause) => match self.enqueue(table, run, &mut route, cause, now) {
                Ok(displaced) => Dispatch::Waiting { cause, displaced },
                Err(()) => {
                    release_limits(table, run, 0);
                    self.inner.metrics.refused(Refusal::QueueFull);
                    let capacity = table.queue.capacity();
                    return Err(StartError::QueueFull { cause, capacity });
                }
            },
            Routed::Refused(refusal) => {
                release_limits(table, run, 0);
                return Err(StartError::NoNode(refusal));
            }
        };
        drop(route);
        table.runs.insert(run.id.clone(), Arc::clone(run));
        Ok(dispatch)
    }

    /// Counts `run` against its key's limits and reserves its claim on the key's token
    /// budget, or refuses it (counting nothing).
    fn claim_limits(&self, table: &mut Table, run: &Run, now: Instant) -> Result<(), StartError> {
        let routing = &run.spec.routing;
        let limits = routing.limits.unwrap_or(self.inner.routing.policy.limits);
        let tenant = &routing.tenant;
        let mut refused = table
            .limits
            .try_start_with(tenant, limits, now.into_std())
            .err();
        if refused.is_none()
            && let Some(claim) = routing.budget
            && let Err(refusal) = table.budgets.try_reserve(tenant, claim, now_ms())
        {
            table.limits.finish(tenant);
            refused = Some(refusal);
        }
        let Some(refusal) = refused else {
            return Ok(());
        };
        let limit = match refusal {
            LimitRefusal::Concurrency { .. } => Refusal::Concurrency,
            LimitRefusal::Rate { .. } => Refusal::Rate,
            LimitRefusal::Budget { .. } => Refusal::Budget,
        };
        self.inner.metrics.refused(limit);
        Err(StartError::Limited(refusal))
    }

    /// The connected nodes whose config serves `run`'s route, as routing sees them.
    pub(super) fn candidates(&self, run: &Run) -> Vec<NodeStatus> {
        let selector = &run.spec.selector;
        self.inner
            .registry
            .statuses_serving(&selector.adapter, &selector.target)
    }

    /// Decides where `run` goes now, changing nothing but the turn.
    pub(super) fn decide(
        &self,
        table: &mut Table,
        nodes: &[NodeStatus],
        run: &Run,
        route: &Route,
        now: Instant,
    ) -> Decision {
        let turn = table.next_turn();
        let request = RouteRequest {
            selector: &run.spec.selector,
            affinity: run.spec.routing.affinity,
            tried: &route.tried,
            operation: run.spec.operation,
        };
        let ctx = RouteContext {
            catalog: &self.inner.routing.catalog,
            breakers: &table.breakers,
            load_factor: self.inner.routing.policy.load_factor,
            now: now.into_std(),
            turn,
        };
        decide(nodes, &request, &ctx)
    }

    /// Routes `run` now: places it on the node `decide` chooses, or says why not.
    pub(super) fn route(
        &self,
        table: &mut Table,
        nodes: &mut [NodeStatus],
        run: &Run,
        route: &mut Route,
        now: Instant,
    ) -> Routed {
        match self.decide(table, nodes, run, route, now) {
            Decision::Place { index, reason } => {
                let seat = nodes.get_mut(index);
                match seat.and_then(|s| self.take_seat(table, s, reason, run, route, now)) {
                    Some(node) => Routed::Placed(node),
                    // The node left between the registry's two reads: as if it had not been
                    // there (a rare race).
                    None => Routed::Waits(WaitCause::NoNodeAvailable),
                }
            }
            Decision::Wait { cause, .. } => Routed::Waits(cause),
            Decision::Refuse(refusal) => Routed::Refused(refusal),
        }
    }

    /// Puts `run` on the node of `status`: claims its breaker's admission, reserves its
    /// slot and records the attempt and its reason. `None` when the node has left.
    pub(super) fn take_seat(
        &self,
        table: &mut Table,
        status: &mut NodeStatus,
        reason: RouteReason,
        run: &Run,
        route: &mut Route,
        now: Instant,
    ) -> Option<NodeId> {
        let inner = &self.inner;
        let id = status.record.id().clone();
        let connection = inner.registry.connection(&id)?;
        let (admission, transition) = table.breakers.admit(status.hash, &id, now.into_std())?;
        if let Some(transition) = transition {
            self.breaker_changed(&id, transition);
        }
        inner.registry.adjust_active_runs(&id, connection, 1);
        let selector = &run.spec.selector;
        self.models()
            .placed(&id, &selector.adapter, &selector.target);
        status.active_runs += 1;
        route.tried.push(id.clone());
        route.admission = Some((status.hash, admission));
        route.placement = Placement::Dispatched {
            node: id.clone(),
            connection,
        };
        let reason = match route.waiting.take() {
            Some(waiting) => reason.with_queue_wait(now.saturating_duration_since(waiting.since)),
            None => reason,
        };
        route.reason = Some(reason);
        self.record_attempt(run, &id, &reason);
        run.span.record("node", tracing::field::display(&id));
        run.span.record("attempt", reason.attempt);
        debug!(parent: &run.span, run_id = %run.id, node = %id, route = %reason, "run dispatched");
        let waited = now.saturating_duration_since(run.accepted_at);
        inner.metrics.dispatched(run, &id, &reason, waited);
        Some(id)
    }

    /// Queues `run`, which waits for `cause`. Returns the run it displaced from a full
    /// queue (the caller ends it); `Err` when the queue is full and nobody yields.
    pub(super) fn enqueue(
        &self,
        table: &mut Table,
        run: &Arc<Run>,
        route: &mut Route,
        cause: WaitCause,
        now: Instant,
    ) -> Result<Option<Arc<Run>>, ()> {
        let waiter = Waiter {
            id: run.id.clone(),
            tenant: run.spec.routing.tenant.clone(),
            priority: run.spec.routing.priority,
            queued_at: now.into_std(),
            item: Arc::clone(run),
        };
        let displaced = table.queue.push(waiter).map_err(|_| ())?;
        self.inner.metrics.queued(table.queue.len());
        route.placement = Placement::Queued;
        route.stays += 1;
        route.waiting = Some(Waiting {
            since: now,
            cause,
            stay: route.stays,
            cold_start: self.cold_start(run, cause),
        });
        debug!(parent: &run.span, run_id = %run.id, cause = cause.expiry_code(), "run queued");
        Ok(displaced.map(|waiter| waiter.item))
    }

    /// Offers every queued run a node, in fair order (see `FairQueue::pump`); the caller
    /// hands the result to [`RunService::dispatch`] after unlocking. A first attempt for a
    /// route that already came back "wait" in this pump is not decided again.
    pub(super) fn pump(&self, table: &mut Table) -> Pumped {
        if table.queue.is_empty() {
            return Pumped::default();
        }
        let now = Instant::now();
        let mut nodes = self.inner.registry.statuses();
        // Routes whose first attempts wait, by the operation's gate (a run that needs a
        // declaration waits for other nodes than the route's other runs).
        let mut blocked: Vec<(AdapterName, Target, Option<Operation>, WaitCause)> = Vec::new();
        let mut exhausted = Vec::new();
        let mut queue =
            std::mem::replace(&mut table.queue, crate::domain::routing::FairQueue::new(1));
        let placed = queue.pump(|waiter| {
            let run = &waiter.item;
            let mut route = lock(&run.route);
            let selector = &run.spec.selector;
            let first = route.tried.attempts() == 0 && selector.pin.is_none();
            let gate = Some(run.spec.operation).filter(|op| op.needs_declaration());
            let known = blocked.iter().find(|(a, t, g, _)| {
                first && *a == selector.adapter && *t == selector.target && *g == gate
            });
            if let Some((_, _, _, cause)) = known {
                let cold_start = route.waiting.and_then(|w| w.cold_start);
                set_cause(run, &mut route, *cause, cold_start);
                return None;
            }
            match self.route(table, &mut nodes, run, &mut route, now) {
                Routed::Placed(node) => Some(node),
                Routed::Waits(cause) => {
                    let cold_start = self.cold_start(run, cause);
                    set_cause(run, &mut route, cause, cold_start);
                    if first {
                        let (a, t) = (selector.adapter.clone(), selector.target.clone());
                        blocked.push((a, t, gate, cause));
                    }
                    None
                }
                Routed::Refused(_) => {
                    exhausted.push(Arc::clone(run));
                    None
                }
            }
        });
        for run in &exhausted {
            queue.remove(&run.id);
        }
        table.queue = queue;
        let placed = placed.into_iter().map(|(w, node)| (w.item, node)).collect();
        Pumped { placed, exhausted }
    }

    /// When `run` waits because no node serves its model now, asks the model lifecycle to
    /// load it; returns how long the run may wait for that load, when some node can.
    fn cold_start(&self, run: &Run, cause: WaitCause) -> Option<Duration> {
        let selector = &run.spec.selector;
        (cause == WaitCause::NoNodeAvailable && selector.pin.is_none())
            .then(|| self.models().wanted(&selector.adapter, &selector.target))
            .flatten()
    }

    /// Sends the runs a pump placed and ends the failed-over runs it found no node for.
    pub(super) fn dispatch(&self, pumped: Pumped) {
        for (run, node) in pumped.placed {
            self.send_run(&run, &node);
        }
        for run in pumped.exhausted {
            let failure = lock(&run.route).last_failure.take();
            let kind = failure.unwrap_or_else(|| EdgeFailure::NoNodeAvailable.into_event_kind());
            self.end_soon(run, kind);
        }
    }

    /// Removes an ended run, frees its node's slot and its key's count, settles its claim
    /// on its key's budget with the `tokens` (input plus output) it used, and hands the slot
    /// to queued runs.
    pub(super) fn retire(&self, run: &Arc<Run>, tokens: u64) {
        run.ended.cancel();
        self.inner.deadlines.remove(run);
        let pumped = {
            let mut table = lock(&self.inner.table);
            table.runs.remove(&run.id);
            release_limits(&mut table, run, tokens);
            let placement = {
                let mut route = lock(&run.route);
                route.waiting = None;
                route.placement.clone()
            };
            let selector = &run.spec.selector;
            match placement {
                Placement::Dispatched { node, connection } => {
                    self.inner
                        .registry
                        .adjust_active_runs(&node, connection, -1);
                    self.models()
                        .left(&node, &selector.adapter, &selector.target);
                    table.remember_ended(run.id.clone(), node, connection);
                }
                // Its slot went with the connection it was detached from.
                Placement::Detached { since, node, .. } => {
                    self.models()
                        .left(&node, &selector.adapter, &selector.target);
                    let resume = &self.inner.metrics.resume;
                    resume.ended_detached(since.elapsed());
                }
                Placement::Queued => {}
            }
            self.pump(&mut table)
        };
        self.dispatch(pumped);
        self.inner.run_ended.notify_waiters();
    }

    /// Places queued runs that may fit now (a node connected or changed, a breaker cooled
    /// down) and sends them.
    pub(super) fn pump_and_send(&self) {
        let pumped = self.pump(&mut lock(&self.inner.table));
        self.dispatch(pumped);
    }

    /// Sends a placed run to its node; if the node is gone, ends that attempt as a
    /// disconnect (which may fail it over).
    pub(super) fn send_run(&self, run: &Arc<Run>, node: &NodeId) {
        self.inner.node_spans.dispatched(run);
        let command = NodeCommand::Run(assignment(run));
        if let Err(error) = self.inner.transport.send(node, command) {
            debug!(run_id = %run.id, %error, "could not send the run; the node is leaving");
            if let Placement::Dispatched {
                node: held,
                connection,
            } = run.placement()
                && &held == node
            {
                let lost = EdgeFailure::NodeDisconnected.into_event_kind();
                self.end_attempt_soon(Arc::clone(run), held, connection, lost);
            }
        }
    }

    /// Ends `run` with the edge's own terminal `kind` (a deadline, a shutdown), then sends
    /// its node `CancelRun` with `reason` — in that order: a node quick to answer the
    /// cancel must find the run ended, so its `cancelled` is dropped, never taken for the
    /// run's end.
    pub(super) async fn end_then_cancel(&self, run: &Arc<Run>, kind: RunEventKind, reason: &str) {
        self.end_run(run, kind).await;
        self.send_cancel(run, reason);
    }

    /// Asks the node holding `run`, if any, to cancel it. A detached run's node is asked
    /// when it resumes the run.
    pub(super) fn send_cancel(&self, run: &Run, reason: &str) {
        if let Placement::Dispatched { node, .. } = run.placement() {
            let command = NodeCommand::Cancel {
                run_id: run.id.clone(),
                reason: reason.to_owned(),
            };
            // A node that cannot be reached ends its runs through its disconnect.
            let _ = self.inner.transport.send(&node, command);
        }
    }
}

/// Records a waiting run's latest cause; a change wakes its wait timer.
/// Whether `run`'s operation needs a declaration and `nodes` (the connected nodes serving
/// its route) are some, none of which declared it: the run would wait for a node that may
/// never come, so it is refused at once instead.
fn none_declares(run: &Run, nodes: &[NodeStatus]) -> bool {
    let operation = run.spec.operation;
    operation.needs_declaration()
        && !nodes.is_empty()
        && nodes.iter().all(|node| !node.operations.serves(operation))
}

fn set_cause(run: &Run, route: &mut Route, cause: WaitCause, cold_start: Option<Duration>) {
    if let Some(waiting) = route.waiting.as_mut()
        && (waiting.cause, waiting.cold_start) != (cause, cold_start)
    {
        waiting.cause = cause;
        waiting.cold_start = cold_start;
        run.wait_changed.notify_one();
    }
}

/// The terminal event of a run whose wait expired with `cause`, saying how many attempts
/// failed before it waited, if any.
pub(super) fn wait_expired(cause: WaitCause, route: &Route) -> RunEventKind {
    let failure = match cause {
        WaitCause::AllBusy => EdgeFailure::QueueTimeout,
        WaitCause::NoNodeAvailable => EdgeFailure::NoNodeAvailable,
    };
    let mut kind = failure.into_event_kind();
    if let (RunEventKind::Failed { message, .. }, Some(RunEventKind::Failed { code, .. })) =
        (&mut kind, &route.last_failure)
    {
        let attempts = route.tried.attempts();
        message.push_str(&format!(
            " (after {attempts} failed attempt(s); the last ended with {code})"
        ));
    }
    kind
}

/// What the node is sent for `run`: the spec, with what is left of its deadline (the
/// deadline runs from acceptance).
fn assignment(run: &Run) -> RunAssignment {
    let RunSpec {
        selector,
        input,
        content_type,
        params,
        deadline,
        operation,
        routing: _,
    } = &run.spec;
    RunAssignment {
        run_id: run.id.clone(),
        adapter: selector.adapter.clone(),
        target: selector.target.clone(),
        input: input.clone(),
        content_type: content_type.clone(),
        params: params.clone(),
        deadline_ms: deadline.map_or(0, |d| {
            let left = d
                .saturating_sub(run.accepted_at.elapsed())
                .max(Duration::from_millis(1));
            u32::try_from(left.as_millis()).unwrap_or(u32::MAX)
        }),
        operation: *operation,
        continuation: lock(&run.route).continuation.clone(),
    }
}
