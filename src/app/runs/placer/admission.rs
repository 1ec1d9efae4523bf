//! Admission and placement: a new run counted against its key's limits and budget, routed
//! (the domain's `decide`), seated on a node (its breaker's admission, its slot, the
//! attempt recorded) or queued in fair order; the pump that offers queued runs the nodes;
//! retiring an ended run; and sending runs and cancels to nodes.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;
use tracing::debug;

use super::{Effect, Fallout, Placer, Table, fallout_of, waits};
use crate::app::runs::observer::Refusal;
use crate::app::runs::route::{Placement, Route};
use crate::app::runs::run::{Run, lock};
use crate::domain::models::TooLarge;
use crate::domain::routing::{
    Decision, LimitPolicy, LimitRefusal, NodeStatus, RouteContext, RouteReason, RouteRequest,
    Unroutable, WaitCause, Waiter, decide,
};
use crate::domain::{
    AdapterName, Attempt, EdgeFailure, NodeId, Operation, RunId, RunRouting, RunSpec, Target,
};
use crate::ports::clock::now_ms;
use crate::ports::{ConnectionId, JournalEntry, NodeCommand, Placed, RunAssignment, StartError};

/// Ends `run`'s count against its key's limits and settles what it reserved of its key's
/// budget (as its record says: a taken-back run reserved it again) with the `tokens` it
/// used (none for a run refused after its claim).
fn release_limits(table: &mut Table, run: &Run, tokens: u64) {
    let tenant = &run.spec().routing.tenant;
    table.limits.finish(tenant);
    if let Some(reserve) = run.accepted().budget_reserve {
        table.budgets.settle(tenant, reserve, tokens, now_ms());
    }
}

/// What routing did with a run, under the table lock.
enum Routed {
    /// Placed on this node, its slot reserved: send it after unlocking.
    Placed(NodeId),
    /// It waits, for this reason.
    Waits(WaitCause),
    /// It cannot be placed.
    Refused(Unroutable),
}

impl Placer {
    /// Routes a newly accepted run — places it or queues it — and enters it in the table;
    /// what to do next (send it, or arm its wait and end a run it displaced) comes back.
    ///
    /// # Errors
    /// [`StartError::Limited`] when its key is over a limit, [`StartError::QueueFull`]
    /// when it would wait and the queue is full, [`StartError::NoNode`] when no node is
    /// configured to serve it, [`StartError::NotSupported`] when its operation needs a
    /// declaration and no connected node serving its route made one,
    /// [`StartError::ModelTooLarge`] when it would wait for a model that fits on no node.
    pub(in crate::app::runs) fn admit(
        &self,
        run: &Arc<Run>,
    ) -> Result<(Placed, Fallout), StartError> {
        let now = Instant::now();
        let mut table = lock(&self.table);
        self.claim_limits(&mut table, run, now)?;
        let mut nodes = self.candidates(run);
        if none_declares(run, &nodes) {
            release_limits(&mut table, run, 0);
            let operation = run.spec().operation;
            return Err(StartError::NotSupported { operation });
        }
        let mut route = run.route();
        let placed = match self.route(&mut table, &mut nodes, run, &mut route, now) {
            Routed::Placed(node) => {
                table
                    .fallout
                    .push(Effect::Send(Arc::clone(run), node.clone()));
                Placed::Sent(node)
            }
            Routed::Waits(cause) => {
                if let Some(refusal) = self.too_large(run, cause) {
                    release_limits(&mut table, run, 0);
                    return Err(StartError::ModelTooLarge(refusal));
                }
                if self
                    .enqueue(&mut table, run, &mut route, cause, now)
                    .is_err()
                {
                    release_limits(&mut table, run, 0);
                    self.observer.refused(Refusal::QueueFull);
                    let capacity = table.queue.capacity();
                    return Err(StartError::QueueFull { cause, capacity });
                }
                Placed::Waiting(cause)
            }
            Routed::Refused(refusal) => {
                release_limits(&mut table, run, 0);
                return Err(StartError::NoNode(refusal));
            }
        };
        drop(route);
        // Placed, its acceptance was journaled before its attempt; queued, it is now —
        // under the table's lock, so before a pump can place it.
        self.journal_acceptance(run);
        table.runs.insert(run.id().clone(), Arc::clone(run));
        Ok((placed, fallout_of(&mut table)))
    }

    /// The limits `routing`'s run counts under: its caller's own, else its key's as
    /// configured (a run taken back from the journal keeps only its key's name), else the
    /// edge's `[limits]`.
    pub(super) fn limits_of(&self, routing: &RunRouting) -> LimitPolicy {
        routing
            .limits
            .or_else(|| self.routing.key_limits.get(&routing.tenant).copied())
            .unwrap_or(self.routing.policy.limits)
    }

    /// Counts `run` against its key's limits and reserves its claim on the key's token
    /// budget, or refuses it (counting nothing).
    fn claim_limits(&self, table: &mut Table, run: &Run, now: Instant) -> Result<(), StartError> {
        let routing = &run.spec().routing;
        let limits = self.limits_of(routing);
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
        self.observer.refused(limit);
        Err(StartError::Limited(refusal))
    }

    /// The connected nodes whose config serves `run`'s route, as routing sees them.
    pub(super) fn candidates(&self, run: &Run) -> Vec<NodeStatus> {
        let selector = &run.spec().selector;
        self.registry
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
        let spec = run.spec();
        let request = RouteRequest {
            selector: &spec.selector,
            affinity: spec.routing.affinity,
            tried: route.tried(),
            operation: spec.operation,
            lora: spec.routing.lora.as_ref(),
        };
        let selector = &spec.selector;
        let model_seats = self
            .models()
            .model_seats(nodes, &selector.adapter, &selector.target);
        let ctx = RouteContext {
            catalog: &self.routing.catalog,
            breakers: &table.breakers,
            load_factor: self.routing.policy.load_factor,
            now: now.into_std(),
            turn,
            model_seats: &model_seats,
        };
        decide(nodes, &request, &ctx)
    }

    /// Routes `run` now: places it on the node `decide` chooses, or says why not.
    fn route(
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
        let id = status.record.id().clone();
        let connection = self.registry.connection(&id)?;
        let (admission, transition) = table.breakers.admit(status.hash, &id, now.into_std())?;
        if let Some(transition) = transition {
            self.breaker_changed(table, &id, transition);
        }
        self.registry.adjust_active_runs(&id, connection, 1);
        let selector = &run.spec().selector;
        self.models()
            .placed(&id, &selector.adapter, &selector.target);
        status.active_runs += 1;
        let reason = route.seat(&id, connection, (status.hash, admission), reason, now);
        self.record_attempt(run, &id, &reason);
        let span = run.span();
        span.record("node", tracing::field::display(&id));
        span.record("attempt", reason.attempt);
        debug!(parent: span, run_id = %run.id(), node = %id, route = %reason, "run dispatched");
        let waited = now.saturating_duration_since(run.accepted_at());
        self.observer.dispatched(run, &id, &reason, waited);
        Some(id)
    }

    /// Journals a new `run`'s acceptance once it is admitted (placed or queued), before
    /// anything else of it: a run refused at admission — over its key's limits, the queue
    /// full, no node, a model too large — leaves no record open in the journal (the
    /// nemesis found such records taken back, and failed, by every restart and takeover).
    fn journal_acceptance(&self, run: &Run) {
        if run.take_acceptance_to_journal() && self.journal.enabled() {
            let accepted = Box::new(run.accepted().clone());
            self.journal.record(JournalEntry::Accepted(accepted));
        }
    }

    /// Notes that `run` was just placed on `node` (for the record and the journal).
    fn record_attempt(&self, run: &Run, node: &NodeId, reason: &RouteReason) {
        self.journal_acceptance(run);
        let attempt = Attempt {
            number: u32::try_from(run.attempts_made() + 1).unwrap_or(u32::MAX),
            node: node.clone(),
            route_reason: reason.label().to_owned(),
            started_ms: now_ms(),
        };
        run.add_attempt(attempt.clone());
        if self.journal.enabled() {
            let run_id = run.id().clone();
            self.journal
                .record(JournalEntry::Placed { run_id, attempt });
        }
    }

    /// Queues `run`, which waits for `cause`, and arms its wait; a run it displaced from a
    /// full queue is ended. `Err` when the queue is full and nobody yields.
    pub(super) fn enqueue(
        &self,
        table: &mut Table,
        run: &Arc<Run>,
        route: &mut Route,
        cause: WaitCause,
        now: Instant,
    ) -> Result<(), ()> {
        let spec = run.spec();
        let waiter = Waiter {
            id: run.id().clone(),
            tenant: spec.routing.tenant.clone(),
            priority: spec.routing.priority,
            queued_at: now.into_std(),
            item: Arc::clone(run),
        };
        let displaced = table.queue.push(waiter).map_err(|_| ())?;
        self.observer.queued(table.queue.len());
        route.queue(now, cause, self.cold_start(run, cause));
        debug!(parent: run.span(), run_id = %run.id(), cause = cause.expiry_code(), "run queued");
        table.fallout.push(Effect::ArmWait(Arc::clone(run)));
        if let Some(displaced) = displaced {
            let kind = EdgeFailure::QueueFull.into_event_kind();
            table.fallout.push(Effect::End(displaced.item, kind));
        }
        Ok(())
    }

    /// Offers every queued run a node, in fair order (see `FairQueue::pump`): the runs it
    /// places are sent, and failed-over runs no node is left for end, once the table is
    /// unlocked. A first attempt for a route that already came back "wait" in this pump is
    /// not decided again.
    pub(super) fn pump(&self, table: &mut Table) {
        if table.queue.is_empty() {
            return;
        }
        let now = Instant::now();
        let mut nodes = self.registry.statuses();
        // Routes whose first attempts wait, by the operation's gate (a run that needs a
        // declaration waits for other nodes than the route's other runs).
        let mut blocked: Vec<(AdapterName, Target, Option<Operation>, WaitCause)> = Vec::new();
        let mut exhausted = Vec::new();
        let mut queue =
            std::mem::replace(&mut table.queue, crate::domain::routing::FairQueue::new(1));
        let placed = queue.pump(|waiter| {
            let run = &waiter.item;
            let mut route = run.route();
            let spec = run.spec();
            let selector = &spec.selector;
            let first = route.attempts() == 0 && selector.pin.is_none();
            let gate = Some(spec.operation).filter(|op| op.needs_declaration());
            let known = blocked.iter().find(|(a, t, g, _)| {
                first && *a == selector.adapter && *t == selector.target && *g == gate
            });
            if let Some((_, _, _, cause)) = known {
                let cold_start = route.cold_start();
                waits::set_cause(run, &mut route, *cause, cold_start);
                return None;
            }
            match self.route(table, &mut nodes, run, &mut route, now) {
                Routed::Placed(node) => Some(node),
                Routed::Waits(cause) => {
                    let cold_start = self.cold_start(run, cause);
                    waits::set_cause(run, &mut route, cause, cold_start);
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
            queue.remove(run.id());
        }
        table.queue = queue;
        for (waiter, node) in placed {
            table.fallout.push(Effect::Send(waiter.item, node));
        }
        for run in exhausted {
            let failure = run.route().take_last_failure();
            let kind = failure.unwrap_or_else(|| EdgeFailure::NoNodeAvailable.into_event_kind());
            table.fallout.push(Effect::End(run, kind));
        }
    }

    /// Places queued runs that may fit now (a node connected or changed, a breaker cooled
    /// down).
    pub(in crate::app::runs) fn pump_now(&self) -> Fallout {
        let mut table = lock(&self.table);
        self.pump(&mut table);
        fallout_of(&mut table)
    }

    /// Drains node `id` (it keeps its runs but gets no new ones; the flag outlives its
    /// connection) or undrains it, which offers it the queued runs at once. Says whether the
    /// flag changed.
    pub(in crate::app::runs) fn set_drained(&self, id: &NodeId, drained: bool) -> (bool, Fallout) {
        let changed = self.registry.set_drained(id, drained);
        let fallout = if changed && !drained {
            self.pump_now()
        } else {
            Fallout::default()
        };
        (changed, fallout)
    }

    /// When `run` waits because no node serves its model now, asks the model lifecycle to
    /// load it; returns how long the run may wait for that load, when some node can.
    fn cold_start(&self, run: &Run, cause: WaitCause) -> Option<Duration> {
        let selector = &run.spec().selector;
        (cause == WaitCause::NoNodeAvailable && selector.pin.is_none())
            .then(|| {
                let lora = run.spec().routing.lora.as_ref();
                self.models()
                    .wanted(&selector.adapter, &selector.target, lora)
            })
            .flatten()
    }

    /// When `run` would wait because no node serves its model now, whether the model is too
    /// large for every node that could load it (a run pinned to a node is not asked about).
    fn too_large(&self, run: &Run, cause: WaitCause) -> Option<TooLarge> {
        let selector = &run.spec().selector;
        (cause == WaitCause::NoNodeAvailable && selector.pin.is_none())
            .then(|| self.models().too_large(&selector.adapter, &selector.target))
            .flatten()
    }

    /// Removes an ended run, frees its node's slot and its key's count, settles its claim
    /// on its key's budget with the `tokens` (input plus output) it used, and hands the slot
    /// to queued runs.
    pub(in crate::app::runs) fn retire(&self, run: &Arc<Run>, tokens: u64) -> Fallout {
        let mut table = lock(&self.table);
        // Once per run: a run retired already (let go, then ended late) releases nothing.
        if table.runs.remove(run.id()).is_some() {
            release_limits(&mut table, run, tokens);
        }
        let placement = { run.route().leave() };
        let selector = &run.spec().selector;
        match placement {
            Placement::Dispatched { node, connection } => {
                self.registry.adjust_active_runs(&node, connection, -1);
                self.models()
                    .left(&node, &selector.adapter, &selector.target);
                table.remember_ended(run.id().clone(), node, connection);
            }
            // Its slot went with the connection it was detached from.
            Placement::Detached { since, node, .. } => {
                self.models()
                    .left(&node, &selector.adapter, &selector.target);
                self.observer.ended_detached(since.elapsed());
            }
            Placement::Queued => {}
        }
        self.pump(&mut table);
        let fallout = fallout_of(&mut table);
        drop(table);
        self.run_ended.notify_waiters();
        fallout
    }

    /// Sends a placed run to its node. `Err` with the attempt to end when the node is gone
    /// (ending it as a disconnect may fail it over).
    pub(in crate::app::runs) fn send(
        &self,
        run: &Arc<Run>,
        node: &NodeId,
    ) -> Result<(), (NodeId, ConnectionId)> {
        self.node_spans.dispatched(run);
        let command = NodeCommand::Run(assignment(run));
        let Err(error) = self.transport.send(node, command) else {
            return Ok(());
        };
        debug!(run_id = %run.id(), %error, "could not send the run; the node is leaving");
        match run.route().placement() {
            Placement::Dispatched {
                node: held,
                connection,
            } if held == node => Err((held.clone(), *connection)),
            _ => Ok(()),
        }
    }

    /// Asks the node holding `run`, if any, to cancel it. A detached run's node is asked
    /// when it resumes the run.
    pub(in crate::app::runs) fn send_cancel(&self, run: &Run, reason: &str) {
        let node = match run.route().placement() {
            Placement::Dispatched { node, .. } => node.clone(),
            _ => return,
        };
        self.send_cancel_to(&node, run.id(), reason);
    }

    /// Asks `node` to cancel `run_id`, whatever the run's placement says now.
    pub(in crate::app::runs) fn send_cancel_to(&self, node: &NodeId, run_id: &RunId, reason: &str) {
        let command = NodeCommand::Cancel {
            run_id: run_id.clone(),
            reason: reason.to_owned(),
        };
        // A node that cannot be reached ends its runs through its disconnect.
        let _ = self.transport.send(node, command);
    }
}

/// Whether `run`'s operation needs a declaration and `nodes` (the connected nodes serving
/// its route) are some, none of which declared it: the run would wait for a node that may
/// never come, so it is refused at once instead.
fn none_declares(run: &Run, nodes: &[NodeStatus]) -> bool {
    let operation = run.spec().operation;
    operation.needs_declaration()
        && !nodes.is_empty()
        && nodes.iter().all(|node| !node.operations.serves(operation))
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
        routing,
    } = run.spec();
    RunAssignment {
        run_id: run.id().clone(),
        adapter: selector.adapter.clone(),
        target: selector.target.clone(),
        input: input.clone(),
        content_type: content_type.clone(),
        params: params.clone(),
        deadline_ms: deadline.map_or(0, |d| {
            let left = d
                .saturating_sub(run.accepted_at().elapsed())
                .max(Duration::from_millis(1));
            u32::try_from(left.as_millis()).unwrap_or(u32::MAX)
        }),
        operation: *operation,
        continuation: run.route().continuation().cloned(),
        lora: routing.lora.as_ref().map(|lora| lora.name.clone()),
    }
}
