//! The ports between the run service and the model lifecycle: what the runs tell the
//! lifecycle (a model wanted that no node serves, a run placed on a node and gone from it),
//! and what the lifecycle tells the runs (a model that could not be loaded anywhere).

use std::time::Duration;

use crate::domain::models::{
    FitNote, Footprint, LoadState, ModelAction, ModelName, ModelPolicy, TooLarge,
};
use crate::domain::routing::{ModelSeats, NodeStatus};
use crate::domain::{AdapterName, NodeId, Target};

/// What the model lifecycle hears from the run service. Called under the run table's lock:
/// implementations take only their own locks and never call back into the runs.
pub trait ModelDemand: Send + Sync {
    /// A run of `adapter + target` waits and no connected node serves the model now: load
    /// it somewhere if some node can. Returns how long such a run may wait for the load
    /// (`None`: no node can load it, the usual wait applies).
    fn wanted(&self, adapter: &AdapterName, target: &Target) -> Option<Duration>;

    /// A run of `adapter + target` was placed on `node` (or re-attached there).
    fn placed(&self, node: &NodeId, adapter: &AdapterName, target: &Target);

    /// A run of `adapter + target` left `node` (it ended or moved).
    fn left(&self, node: &NodeId, adapter: &AdapterName, target: &Target);

    /// `adapter + target` is too large for every node that lists it (its footprint above
    /// each one's budget, as their last reports say): a run of it is refused at once rather
    /// than queued for a load that cannot happen. `None` when some node may fit it, or
    /// none knows.
    fn too_large(&self, adapter: &AdapterName, target: &Target) -> Option<TooLarge>;

    /// For each of `nodes`, by position, its runs of `adapter + target` in flight against
    /// how many its managed engine serves at once (the adapter's `parallel`); `None` for a
    /// node without such a cap. Empty when no node caps the model, so routing pays nothing
    /// for it.
    fn model_seats(
        &self,
        nodes: &[NodeStatus],
        adapter: &AdapterName,
        target: &Target,
    ) -> Vec<Option<ModelSeats>>;
}

/// The run service as the model lifecycle reaches it.
pub trait WaitingRuns: Send + Sync {
    /// Every load of `model` failed: ends the runs waiting for it with `reason` (the
    /// engine's words), unless a node serves it by now.
    fn load_failed(&self, model: &ModelName, reason: &str);

    /// `model` turned out too large for every node that lists it (their footprints came
    /// after the runs were queued): ends the runs waiting for it with `model_too_large`.
    fn too_large(&self, model: &ModelName, refusal: TooLarge);

    /// Returns once every placement begun before the call has finished (and told the
    /// lifecycle where it put its run).
    fn placements_settled(&self);
}

/// Hears nothing: the run service without a model lifecycle.
pub struct NoModels;

impl ModelDemand for NoModels {
    fn wanted(&self, _: &AdapterName, _: &Target) -> Option<Duration> {
        None
    }

    fn placed(&self, _: &NodeId, _: &AdapterName, _: &Target) {}

    fn left(&self, _: &NodeId, _: &AdapterName, _: &Target) {}

    fn too_large(&self, _: &AdapterName, _: &Target) -> Option<TooLarge> {
        None
    }

    fn model_seats(
        &self,
        _: &[NodeStatus],
        _: &AdapterName,
        _: &Target,
    ) -> Vec<Option<ModelSeats>> {
        Vec::new()
    }
}

/// A model as the management API shows it: its policy and where it is, node by node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModelView {
    /// The model.
    pub model: ModelName,
    /// Its `[[models]]` entry, if any.
    pub policy: Option<ModelPolicy>,
    /// Each connected node that serves it or can load it, by id.
    pub nodes: Vec<ModelOnNode>,
    /// Why its `[[models]]` entry cannot be met with the footprints and budgets the nodes
    /// reported (a pin where it does not fit, `min_loaded` above the nodes it fits on).
    pub warnings: Vec<String>,
}

/// One model on one node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModelOnNode {
    /// The node.
    pub node: NodeId,
    /// Its state there (an engine the edge does not manage serves it: loaded).
    pub state: LoadState,
    /// Whether the node's engine loads and unloads it on the edge's command.
    pub managed: bool,
    /// While loading, how far in percent, when the engine says.
    pub progress_percent: u8,
    /// With a failed state, the engine's reason.
    pub failure: String,
    /// Since when it is in this state, ms since the Unix epoch (when the edge saw it).
    pub since_ms: u64,
    /// Runs of it in flight there.
    pub in_flight: u32,
    /// When a run of it last ended there, ms since the Unix epoch; `None`: none since the
    /// edge started.
    pub last_used_ms: Option<u64>,
    /// Why it was last loaded or unloaded there (empty: the edge did neither).
    pub reason: String,
    /// A command in progress there.
    pub command: Option<ModelAction>,
    /// Its footprint there, as the node derived it, when the node knows.
    pub footprint: Option<Footprint>,
    /// The budget of its adapter on that node, in bytes, when known.
    pub budget: Option<u64>,
    /// The room there now: the budget less the footprints of what the adapter holds.
    pub room: Option<u64>,
    /// Its footprint and the room at the edge's last decision to load it there.
    pub decided: Option<FitNote>,
}

/// What a line of the model feed tells.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FeedAction {
    /// A load.
    Load,
    /// An unload.
    Unload,
    /// A `[[models]]` entry the pool cannot meet.
    Warning,
}

impl FeedAction {
    /// Its name in the feed (the SSE event's name).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Load => "load",
            Self::Unload => "unload",
            Self::Warning => "warning",
        }
    }
}

impl From<ModelAction> for FeedAction {
    fn from(action: ModelAction) -> Self {
        match action {
            ModelAction::Load => Self::Load,
            ModelAction::Unload => Self::Unload,
        }
    }
}

/// A load, an unload or a warning, as the management feed and the log tell it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModelEvent {
    /// When, ms since the Unix epoch.
    pub at_ms: u64,
    /// The model.
    pub model: ModelName,
    /// The node; `None` for a warning about no one node (`min_loaded`).
    pub node: Option<NodeId>,
    /// Load, unload or warning.
    pub action: FeedAction,
    /// Why (`demand`, `min_loaded`, `pin`, `idle`, `make_room`, `operator`).
    pub reason: String,
    /// `started`, `done` or `failed`; `unmet` for a warning.
    pub outcome: &'static str,
    /// With `failed`: the engine's reason; with a warning, what cannot be met.
    pub message: String,
    /// With `done` or `failed`: how long the command took, in ms.
    pub took_ms: Option<u64>,
    /// With a load: the model's footprint there and the room before it, where known.
    pub fit: Option<FitNote>,
}

/// Why an operator's load or unload was refused or failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ModelCommandError {
    /// No connected node has that id or alias.
    #[error("no connected node has id or alias {0:?}")]
    UnknownNode(String),
    /// The node cannot load or unload that model on command.
    #[error("node {node} cannot load or unload {model}: {why}")]
    NotManaged {
        /// The node.
        node: String,
        /// The model.
        model: String,
        /// Why.
        why: String,
    },
    /// The command conflicts with the pool's state (runs in flight, a pin, no room).
    #[error("{0}")]
    Conflict(String),
    /// The node's engine did not do it.
    #[error("the node's engine did not do it: {0}")]
    Failed(String),
}

/// What operators can ask of the model lifecycle.
#[async_trait::async_trait]
pub trait ManageModels: Send + Sync {
    /// Every model some connected node serves or can load, by name.
    fn models(&self) -> Vec<ModelView>;

    /// The last loads and unloads (oldest first), and a receiver of the next ones.
    fn model_events(
        &self,
    ) -> (
        Vec<ModelEvent>,
        tokio::sync::broadcast::Receiver<ModelEvent>,
    );

    /// Loads `model` on node `node` (id or alias), making room there with its least
    /// recently used idle model if it is full; returns once the engine has loaded it.
    ///
    /// # Errors
    /// See [`ModelCommandError`].
    async fn load(&self, model: &ModelName, node: &str) -> Result<(), ModelCommandError>;

    /// Unloads `model` from node `node`. With runs of it in flight there it refuses, unless
    /// `drain` is set: then it waits up to that long for them to end before unloading.
    ///
    /// # Errors
    /// See [`ModelCommandError`].
    async fn unload(
        &self,
        model: &ModelName,
        node: &str,
        drain: Option<Duration>,
    ) -> Result<(), ModelCommandError>;
}
