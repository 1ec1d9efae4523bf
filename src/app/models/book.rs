//! What the lifecycle keeps between decisions: each model's use per node (runs in flight,
//! last use), the commands in progress, the cold requests waiting for a load, what it last
//! saw of each model on each node and why (and what its last load found there), the nodes
//! whose engines it manages, the last loads and unloads, and the `[[models]]` entries the
//! pool cannot meet.

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::time::SystemTime;

use tokio::sync::oneshot;
use tokio::time::Instant;

use crate::domain::NodeId;
use crate::domain::models::{FitNote, LoadState, ModelAction, ModelName, Unmet};
use crate::ports::{ModelEvent, ModelOutcome};

/// How many loads and unloads the feed's history keeps.
const HISTORY: usize = 256;

/// One model's use on one node.
#[derive(Debug, Clone, Copy)]
pub(super) struct Use {
    /// Runs of it there that have not ended.
    pub in_flight: u32,
    /// When the last one ended (or the first began).
    pub last_used: Instant,
    /// The same, on the wall clock.
    pub last_used_wall: SystemTime,
}

/// A model requested while no node served it.
#[derive(Debug, Clone)]
pub(super) struct Cold {
    /// When it was first requested.
    pub since: Instant,
    /// The nodes where a load of it failed for these requests.
    pub tried: Vec<NodeId>,
    /// The last failure's reason.
    pub last_failure: Option<String>,
}

/// What the lifecycle last saw of a model on a node.
#[derive(Debug, Clone)]
pub(super) struct Seen {
    /// The state.
    pub state: LoadState,
    /// When it changed to it.
    pub since: Instant,
    /// The same, on the wall clock.
    pub since_wall: SystemTime,
    /// Why it was last loaded or unloaded there by the edge.
    pub reason: String,
    /// Its footprint and the room there at the edge's last decision to load it.
    pub fit: Option<FitNote>,
}

/// The lifecycle's state, behind one lock.
#[derive(Default)]
pub(super) struct Book {
    /// Use by node, then model.
    pub uses: HashMap<NodeId, HashMap<ModelName, Use>>,
    /// Commands in progress, by node and model.
    pub busy: HashMap<(NodeId, ModelName), ModelAction>,
    /// Commands awaiting their outcome, by command id, with their node.
    pub pending: HashMap<String, (NodeId, oneshot::Sender<ModelOutcome>)>,
    /// Cold requests, by model.
    pub cold: BTreeMap<ModelName, Cold>,
    /// What was last seen, by node and model.
    pub seen: HashMap<(NodeId, ModelName), Seen>,
    /// The models some connected managed engine can hold, with its nodes.
    pub loadable: HashMap<ModelName, BTreeSet<NodeId>>,
    /// The connected nodes with a managed engine.
    pub managed_nodes: BTreeSet<NodeId>,
    /// The last loads and unloads, oldest first.
    pub history: VecDeque<ModelEvent>,
    /// The next command's number.
    pub next_command: u64,
    /// The `[[models]]` entries the pool cannot meet, as last found.
    pub unmet: Vec<Unmet>,
}

impl Book {
    /// A run of `model` began on `node`.
    pub fn placed(&mut self, node: &NodeId, model: ModelName, now: Instant) {
        let by_model = match self.uses.get_mut(node) {
            Some(by_model) => by_model,
            None => self.uses.entry(node.clone()).or_default(),
        };
        let entry = by_model.entry(model).or_insert(Use {
            in_flight: 0,
            last_used: now,
            last_used_wall: SystemTime::now(),
        });
        entry.in_flight += 1;
    }

    /// A run of `model` left `node`.
    pub fn left(&mut self, node: &NodeId, model: &ModelName, now: Instant) {
        if let Some(entry) = self.uses.get_mut(node).and_then(|m| m.get_mut(model)) {
            entry.in_flight = entry.in_flight.saturating_sub(1);
            entry.last_used = now;
            entry.last_used_wall = SystemTime::now();
        }
    }

    /// `model`'s use on `node`.
    pub fn use_of(&self, node: &NodeId, model: &ModelName) -> Option<Use> {
        self.uses.get(node).and_then(|m| m.get(model)).copied()
    }

    /// Records that `model` on `node` is in `state` now, keeping `since` when it was
    /// already; `reason`, when given, replaces the last one.
    pub fn see(
        &mut self,
        node: &NodeId,
        model: &ModelName,
        state: LoadState,
        reason: Option<&str>,
    ) {
        let now = Instant::now();
        let key = (node.clone(), model.clone());
        let seen = self.seen.entry(key).or_insert_with(|| Seen {
            state,
            since: now,
            since_wall: SystemTime::now(),
            reason: String::new(),
            fit: None,
        });
        if seen.state != state {
            seen.state = state;
            seen.since = now;
            seen.since_wall = SystemTime::now();
        }
        if let Some(reason) = reason {
            reason.clone_into(&mut seen.reason);
        }
    }

    /// Keeps what the edge's decision to load `model` on `node` found there (when it knew).
    pub fn decided(&mut self, node: &NodeId, model: &ModelName, fit: Option<FitNote>) {
        if let Some(seen) = self.seen.get_mut(&(node.clone(), model.clone())) {
            seen.fit = fit.or(seen.fit);
        }
    }

    /// A fresh command id.
    pub fn command_id(&mut self) -> String {
        self.next_command += 1;
        format!("model-{}", self.next_command)
    }

    /// Keeps `event` in the history.
    pub fn remember(&mut self, event: ModelEvent) {
        if self.history.len() == HISTORY {
            self.history.pop_front();
        }
        self.history.push_back(event);
    }

    /// Forgets what was loadable on `node` (it left, or reports anew).
    pub fn forget_node(&mut self, node: &NodeId) {
        if self.managed_nodes.remove(node) {
            self.loadable.retain(|_, nodes| {
                nodes.remove(node);
                !nodes.is_empty()
            });
        }
    }
}
