//! Placement and the queue: which node takes a run, reserving its slot, queueing the runs
//! no node has room for, handing freed slots to them, and sending runs and cancels to
//! nodes.
//!
//! Every decision that reads the registry's loads and reserves a slot takes the locked
//! [`Table`] as `&mut Table`, so selection and reservation are atomic by construction
//! (decision 6); sending to a node happens after the lock is released.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use tracing::debug;

use super::service::{RunService, StartError};
use super::table::{Placement, Run, Table, lock};
use crate::domain::{EdgeFailure, NodeId, RunSpec, SelectError, select_node};
use crate::ports::{NodeCommand, RunAssignment};

impl RunService {
    /// Places a newly accepted run on a node or queues it, and enters it in the table.
    /// Returns the node to send it to, if it was placed.
    ///
    /// # Errors
    /// [`StartError::QueueFull`] when it would wait and the queue is full;
    /// [`StartError::NoNode`] when no connected node serves it.
    pub(super) fn admit(
        &self,
        table: &mut Table,
        run: &Arc<Run>,
    ) -> Result<Option<NodeId>, StartError> {
        let placed = match self.place(table, run) {
            Ok(Some(node)) => Some(node),
            // The chosen node left between two registry reads: the run waits like one for
            // a busy node (a rare race, so it may exceed the capacity by a few).
            Ok(None) => {
                table.queue.push_back(Arc::clone(run));
                None
            }
            Err(cause) if cause.is_busy() => {
                let capacity = self.inner.config.queue_capacity;
                if table.queue.len() >= capacity {
                    return Err(StartError::QueueFull { cause, capacity });
                }
                debug!(run_id = %run.id, waiting = table.queued_like(&run.spec), "all serving nodes busy; queued");
                table.queue.push_back(Arc::clone(run));
                None
            }
            Err(cause) => return Err(StartError::NoNode(cause)),
        };
        table.runs.insert(run.id.clone(), Arc::clone(run));
        Ok(placed)
    }

    /// Picks a node for `run` and reserves a slot on it.
    pub(super) fn place(
        &self,
        table: &mut Table,
        run: &Run,
    ) -> Result<Option<NodeId>, SelectError> {
        let inner = &self.inner;
        let loads = inner.registry.loads();
        let turn = table.next_turn();
        let chosen = select_node(&loads, &run.spec.selector, turn)?
            .record
            .id()
            .clone();
        let Some(connection) = inner.registry.get(chosen.as_str()).map(|n| n.connection) else {
            // The node left between the two reads; nobody else can take the slot.
            return Ok(None);
        };
        inner.registry.adjust_active_runs(&chosen, connection, 1);
        run.set_placement(Placement::Dispatched {
            node: chosen.clone(),
            connection,
        });
        run.span.record("node", tracing::field::display(&chosen));
        debug!(parent: &run.span, "run dispatched");
        inner
            .metrics
            .dispatched(&run.spec, run.accepted_at.elapsed());
        Ok(Some(chosen))
    }

    /// Places every queued run that now fits, in queue order; the caller sends the
    /// returned runs after unlocking.
    pub(super) fn pump(&self, table: &mut Table) -> Vec<(Arc<Run>, NodeId)> {
        let mut placed = Vec::new();
        let mut waiting = VecDeque::with_capacity(table.queue.len());
        while let Some(run) = table.queue.pop_front() {
            match self.place(table, &run) {
                Ok(Some(node)) => placed.push((run, node)),
                Ok(None) | Err(_) => waiting.push_back(run),
            }
        }
        table.queue = waiting;
        placed
    }

    /// Removes an ended run, frees its node's slot and hands the slot to a queued run.
    pub(super) fn retire(&self, run: &Run) {
        run.ended.cancel();
        let placed = {
            let mut table = lock(&self.inner.table);
            table.runs.remove(&run.id);
            if let Placement::Dispatched { node, connection } = run.placement() {
                self.inner
                    .registry
                    .adjust_active_runs(&node, connection, -1);
                table.remember_ended(run.id.clone(), node, connection);
            }
            self.pump(&mut table)
        };
        for (queued, node) in placed {
            self.send_run(&queued, &node);
        }
        self.inner.run_ended.notify_waiters();
    }

    /// Sends a placed run to its node; if the node is gone, ends the run.
    pub(super) fn send_run(&self, run: &Arc<Run>, node: &NodeId) {
        self.inner.node_spans.dispatched(run);
        let command = NodeCommand::Run(assignment(run));
        if let Err(error) = self.inner.transport.send(node, command) {
            debug!(run_id = %run.id, %error, "could not send the run; the node is leaving");
            self.end_soon(
                Arc::clone(run),
                EdgeFailure::NodeDisconnected.into_event_kind(),
            );
        }
    }

    /// Asks the node holding `run`, if any, to cancel it.
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
    }
}
