//! The routes of runs held for their node: detached when the node's connection drops,
//! re-attached to its new connection when it claims them, sent again when it never got
//! them, and the runs a previous edge left open, entered in the table and held for their
//! nodes. Recovery (`recovery/`) decides when; these are its steps under the table's lock.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use super::Placer;
use crate::app::runs::route::Route;
use crate::app::runs::run::{Run, lock};
use crate::domain::{NodeId, ResumeRefusal};
use crate::ports::ConnectionId;
use crate::ports::clock::now_ms;

/// A claim that re-attached its run.
pub(in crate::app::runs) struct Reattached {
    /// The connection the run was held on.
    pub held_on: ConnectionId,
    /// When it was detached; `None` when it was still attached to that connection.
    pub detached_since: Option<Instant>,
    /// The reason of a cancel asked for meanwhile, to send again.
    pub cancel: Option<String>,
}

/// Why a claim did not re-attach its run.
pub(in crate::app::runs) enum NotReattached {
    /// The run is not the node's to claim (or has ended): nothing changes.
    Unknown,
    /// The node's run, claimed in a way it cannot resume from: it ends.
    Lost(ResumeRefusal, ConnectionId),
}

impl Placer {
    /// Detaches `run` from `node`'s `connection`, which has dropped, if it is still on it.
    /// `blame` says whether its loss, should it come to that, counts against the node's
    /// breaker. Returns whether it did.
    pub(in crate::app::runs) fn detach(
        &self,
        run: &Run,
        node: &NodeId,
        connection: ConnectionId,
        blame: bool,
    ) -> bool {
        let _table = lock(&self.table);
        run.route().detach(node, connection, blame)
    }

    /// Moves `run` to `node`'s `connection` if the node holds it on another connection
    /// (detached, or still attached to an older one) and `resumable` — asked under the
    /// lock, with the connection it was held on — says from where the node may resume it;
    /// the new connection's slot is taken.
    pub(in crate::app::runs) fn reattach(
        &self,
        run: &Run,
        node: &NodeId,
        connection: ConnectionId,
        resumable: impl FnOnce() -> Result<(), Option<ResumeRefusal>>,
    ) -> Result<Reattached, NotReattached> {
        let _table = lock(&self.table);
        let mut route = run.route();
        let Some((held_on, detached_since)) = route.held_elsewhere(node, connection) else {
            return Err(NotReattached::Unknown);
        };
        match resumable() {
            Ok(()) => {}
            Err(None) => return Err(NotReattached::Unknown),
            Err(Some(refusal)) => return Err(NotReattached::Lost(refusal, held_on)),
        }
        self.move_attempt(&mut route, node, connection);
        Ok(Reattached {
            held_on,
            detached_since,
            cancel: route.cancelling().map(str::to_owned),
        })
    }

    /// Puts the attempt in `route` on `node`'s `connection`, taking a slot there (the
    /// connection it leaves took its slot with it, or is leaving).
    fn move_attempt(&self, route: &mut Route, node: &NodeId, connection: ConnectionId) {
        route.attach(node, connection);
        self.registry.adjust_active_runs(node, connection, 1);
    }

    /// Moves `run`, whose node never got it, to `node`'s new `connection` to be sent again.
    pub(in crate::app::runs) fn move_to(&self, run: &Run, node: &NodeId, connection: ConnectionId) {
        let _table = lock(&self.table);
        self.move_attempt(&mut run.route(), node, connection);
    }

    /// The open runs `node` holds on a connection other than `connection` (detached, or
    /// attached to an older one), that `keep` does not keep out.
    pub(in crate::app::runs) fn held_elsewhere(
        &self,
        node: &NodeId,
        connection: ConnectionId,
        keep: impl Fn(&Run) -> bool,
    ) -> Vec<Arc<Run>> {
        lock(&self.table)
            .runs
            .values()
            .filter(|run| keep(run) && held_on_other(run, node, connection).is_some())
            .cloned()
            .collect()
    }

    /// Enters a run taken back from the journal in the table, its route pinned to `node`
    /// (tried already) and never continued: it has no input to send again. It counts among
    /// its key's open runs, its start in its key's rate, and it reserves again what
    /// admission reserved of its key's budget (its record says how much); its place and
    /// reservation are released when it ends.
    pub(in crate::app::runs) fn take_back(&self, run: &Arc<Run>, node: Option<&NodeId>) {
        run.route().taken_back(node);
        let routing = &run.spec().routing;
        let tenant = &routing.tenant;
        let policy = self.limits_of(routing);
        let ago = Duration::from_millis(now_ms().saturating_sub(run.accepted().queued_ms));
        let started = Instant::now().checked_sub(ago).map(Instant::into_std);
        let mut table = lock(&self.table);
        table.limits.count_taken_back(tenant, policy, started);
        if let Some(reserve) = run.accepted().budget_reserve {
            table.budgets.reserve_taken_back(tenant, reserve);
        }
        table.runs.insert(run.id().clone(), Arc::clone(run));
    }

    /// Holds a taken-back run detached from `node`'s connection to the previous edge
    /// (`connection`), as if that connection had just dropped.
    pub(in crate::app::runs) fn hold_taken_back(
        &self,
        run: &Run,
        node: &NodeId,
        connection: ConnectionId,
    ) {
        let selector = &run.spec().selector;
        self.models()
            .placed(node, &selector.adapter, &selector.target);
        let _table = lock(&self.table);
        run.route().hold(node, connection, false);
    }
}

/// The connection other than `connection` on which `node` holds `run`, if it does.
pub(in crate::app::runs) fn held_on_other(
    run: &Run,
    node: &NodeId,
    connection: ConnectionId,
) -> Option<ConnectionId> {
    run.route()
        .held_elsewhere(node, connection)
        .map(|(held_on, _)| held_on)
}
