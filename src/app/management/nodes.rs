//! Node status, drain and resume.

use std::sync::Arc;
use std::time::Duration;

use tracing::info;

use super::{ManageError, Management};
use crate::domain::routing::BreakerState;
use crate::domain::{Drain, NodeId, NodeRecord, NodeState};
use crate::ports::clock::{now_ms, unix_ms};
use crate::ports::{ConnectedNode, ConnectedNodeView, NodeStatus};

impl ConnectedNodeView {
    fn of(node: &ConnectedNode) -> Self {
        Self {
            peer: node.peer,
            node_version: node.node_version.clone(),
            connected_since_ms: unix_ms(node.connected_since),
            last_seen_ms: unix_ms(node.last_seen),
            active_runs: node.active_runs,
            availability: node.availability.clone(),
            inventory: node.inventory.clone(),
        }
    }
}

impl Management {
    /// Every configured node, ordered by id, connected or not.
    pub fn nodes(&self) -> Vec<NodeStatus> {
        let connected = self.inner.registry.snapshot();
        let mut connected = connected.iter().peekable();
        let mut records = self.inner.store.records();
        records.sort_by(|a, b| a.id().cmp(b.id()));
        records
            .into_iter()
            .map(|record| {
                // Both lists are ordered by id: walk them together.
                while connected.next_if(|c| c.record.id() < record.id()).is_some() {}
                let live = connected.next_if(|c| c.record.id() == record.id());
                self.status(record, live)
            })
            .collect()
    }

    /// The configured node with id or alias `name`.
    pub fn node(&self, name: &str) -> Option<NodeStatus> {
        let record = self
            .inner
            .store
            .records()
            .into_iter()
            .find(|r| r.is_named(name))?;
        let live = self.inner.registry.get(record.id().as_str());
        Some(self.status(record, live.as_ref()))
    }

    fn status(&self, record: Arc<NodeRecord>, live: Option<&ConnectedNode>) -> NodeStatus {
        let drain = self.inner.drains.get(record.id());
        let connection = live.map(ConnectedNodeView::of);
        let active = connection.as_ref().map_or(0, |c| c.active_runs);
        let breaker = self.inner.live.breaker_state(record.id());
        let breaker_open = matches!(breaker, BreakerState::Open { .. });
        let state = NodeState::of(connection.is_some(), drain.as_ref(), active, breaker_open);
        NodeStatus {
            record,
            connection,
            drain,
            state,
            breaker,
        }
    }

    /// Drains node `name`: it takes no new run; its runs finish, or once `deadline` has
    /// passed are moved to other nodes (placed again, or continued), or cancelled where
    /// they cannot move. Draining again replaces the deadline. The node stays
    /// registered (and a node not connected now stays drained when it connects).
    ///
    /// # Errors
    /// [`ManageError::UnknownNode`] when no configured node has that id or alias.
    pub fn drain(&self, name: &str, deadline: Option<Duration>) -> Result<NodeStatus, ManageError> {
        let status = self
            .node(name)
            .ok_or_else(|| ManageError::UnknownNode(name.to_owned()))?;
        let id = status.record.id().clone();
        let since_ms = now_ms();
        let deadline_ms = deadline
            .map(|d| since_ms.saturating_add(u64::try_from(d.as_millis()).unwrap_or(u64::MAX)));
        let drain = Drain {
            since_ms,
            deadline_ms,
        };
        self.inner.drains.drain(id.clone(), drain);
        self.inner.live.set_drained(&id, true);
        info!(node = %id, deadline_secs = deadline.map(|d| d.as_secs()), "node drained");
        if let Some(deadline) = deadline {
            self.move_off_at_deadline(id.clone(), drain, deadline);
        }
        self.node(id.as_str())
            .ok_or_else(|| ManageError::UnknownNode(name.to_owned()))
    }

    /// Ends node `id`'s drain: it takes runs again.
    ///
    /// # Errors
    /// [`ManageError::UnknownNode`] when no configured node has that id or alias.
    pub fn undrain(&self, name: &str) -> Result<NodeStatus, ManageError> {
        let status = self
            .node(name)
            .ok_or_else(|| ManageError::UnknownNode(name.to_owned()))?;
        if self.inner.drains.undrain(status.record.id()).is_some() {
            info!(node = %status.record.id(), "node undrained: it takes runs again");
            // Queued runs may fit on it now.
            self.inner.live.set_drained(status.record.id(), false);
        }
        self.node(status.record.id().as_str())
            .ok_or_else(|| ManageError::UnknownNode(name.to_owned()))
    }

    /// At `deadline`, moves the runs still on the node off it (or cancels them), unless the
    /// drain was replaced or ended meanwhile.
    fn move_off_at_deadline(&self, node: NodeId, drain: Drain, deadline: Duration) {
        let this = self.clone();
        self.inner.timers.spawn(async move {
            tokio::time::sleep(deadline).await;
            if this.inner.drains.get(&node) != Some(drain) {
                return;
            }
            let runs = this.inner.live.runs_on(&node);
            info!(node = %node, runs = runs.len(), "drain deadline passed; moving the node's runs off it");
            for run in runs {
                let reason = "node drain deadline passed";
                this.inner.live.move_off_drained(&node, &run, reason).await;
            }
        });
    }
}
