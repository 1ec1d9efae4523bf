//! What the placer does with its [`Table`] under its lock: finding the run a node's event
//! is for (or why there is none), the runs on a connection, taking a run out of the queue,
//! remembering recent endings, and counting the waits.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;

use super::{Fallout, Miss, Table};
use crate::app::runs::run::Run;
use crate::domain::routing::{BreakerBook, Budgets, FairQueue, KeyLimits, WaitCause};
use crate::domain::{NodeId, RunId};
use crate::ports::ConnectionId;

/// How many ended attempts the table remembers, so that a node's late events for them count
/// as dropped after the terminal rather than as events for an unknown run.
const REMEMBERED_ENDINGS: usize = 1_024;

impl Table {
    /// An empty table.
    pub(super) fn new(queue_capacity: usize, breakers: BreakerBook, limits: KeyLimits) -> Self {
        Self {
            runs: HashMap::new(),
            queue: FairQueue::new(queue_capacity),
            breakers,
            limits,
            budgets: Budgets::default(),
            ended: VecDeque::new(),
            turn: 0,
            fallout: Fallout::default(),
        }
    }

    /// The next turn for a placement.
    pub(super) fn next_turn(&mut self) -> u64 {
        let turn = self.turn;
        self.turn = self.turn.wrapping_add(1);
        turn
    }

    /// The open run `run_id`, if `node` holds it on `connection`.
    pub(super) fn held_by(
        &self,
        run_id: &str,
        node: &NodeId,
        connection: ConnectionId,
    ) -> Result<Arc<Run>, Miss> {
        match self.runs.get(run_id) {
            Some(run) if run.route().is_on(node, connection) => Ok(Arc::clone(run)),
            _ if self.ended_on(run_id, node, connection) => Err(Miss::Ended),
            _ => Err(Miss::Unknown),
        }
    }

    /// The open runs `node` holds on `connection`.
    pub(super) fn runs_on(&self, node: &NodeId, connection: ConnectionId) -> Vec<Arc<Run>> {
        self.runs
            .values()
            .filter(|run| run.route().is_on(node, connection))
            .cloned()
            .collect()
    }

    /// Takes `run` out of the queue; returns whether it was there.
    pub(super) fn unqueue(&mut self, run: &RunId) -> bool {
        self.queue.remove(run).is_some()
    }

    /// Remembers that `run`'s attempt on `node`'s `connection` has ended.
    pub(super) fn remember_ended(&mut self, run: RunId, node: NodeId, connection: ConnectionId) {
        if self.ended.len() == REMEMBERED_ENDINGS {
            self.ended.pop_front();
        }
        self.ended.push_back((run, node, connection));
    }

    /// Whether an attempt of `run` recently ended while `node` held it on `connection`.
    fn ended_on(&self, run: &str, node: &NodeId, connection: ConnectionId) -> bool {
        self.ended
            .iter()
            .any(|(r, n, c)| r.as_str() == run && n == node && *c == connection)
    }

    /// Queued runs by their latest wait cause: `[all busy, no node available]`.
    pub(super) fn waiting_by_cause(&self) -> [usize; 2] {
        let mut counts = [0; 2];
        for run in self.runs.values() {
            match run.route().wait_cause() {
                Some(WaitCause::AllBusy) => counts[0] += 1,
                Some(WaitCause::NoNodeAvailable) => counts[1] += 1,
                None => {}
            }
        }
        counts
    }
}
