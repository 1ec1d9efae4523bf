//! What a managed engine holds and what the operator wants: a model's name
//! (`adapter/target`), its load state (and footprint) on one engine, an adapter's capacity
//! and budget, and the `[[models]]` policy.

use std::collections::BTreeMap;
use std::fmt;
use std::time::Duration;

use super::fit::{Budget, Footprint};
use crate::domain::{AdapterName, NameError, NodeId, Target};

/// A model as the pool knows it: an adapter and one of its targets, written `adapter/target`.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ModelName {
    /// The adapter that serves it.
    pub adapter: AdapterName,
    /// The adapter's target.
    pub target: Target,
}

impl ModelName {
    /// The model `adapter + target`.
    pub fn new(adapter: AdapterName, target: Target) -> Self {
        Self { adapter, target }
    }

    /// Reads `adapter/target` (the adapter is everything before the first `/`; a target may
    /// hold more).
    ///
    /// # Errors
    /// When there is no `/`, or either side is not a valid name.
    pub fn parse(value: &str) -> Result<Self, NameError> {
        let (adapter, target) = value.split_once('/').ok_or(NameError::BadCharacter {
            kind: "model",
            value: value.to_owned(),
            found: ' ',
            allowed: "`adapter/target`",
        })?;
        Ok(Self::new(
            AdapterName::parse(adapter)?,
            Target::parse(target)?,
        ))
    }
}

/// Why a string is not `adapter/target`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ModelNameError {
    /// There is no `/` between an adapter and a target.
    #[error("it has no `/` between the adapter and the target")]
    NoSlash,
    /// The adapter or the target is not a valid name.
    #[error(transparent)]
    Name(#[from] NameError),
}

impl fmt::Display for ModelName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.adapter, self.target)
    }
}

/// A target's state in a managed engine.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum LoadState {
    /// Loaded: it serves now.
    Loaded,
    /// Being loaded.
    Loading,
    /// On the engine's disk, not loaded: it can be loaded.
    Unloaded,
    /// Loaded, its engine asleep; it wakes on a request (llama-server's router).
    Sleeping,
    /// Its last load failed; it can be loaded again.
    Failed,
    /// Asleep and not loaded (vLLM's sleep mode): it is not served — a request reaching it
    /// would be aborted — and holds none of the engine's places, but a load wakes it, much
    /// faster than a cold load.
    Asleep,
}

impl LoadState {
    /// Whether it takes one of the engine's places (loaded, loading or sleeping; never
    /// asleep).
    pub fn holds_a_place(self) -> bool {
        matches!(self, Self::Loaded | Self::Loading | Self::Sleeping)
    }

    /// The state's name in the management API and the metrics.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Loaded => "loaded",
            Self::Loading => "loading",
            Self::Unloaded => "unloaded",
            Self::Sleeping => "sleeping",
            Self::Failed => "failed",
            Self::Asleep => "asleep",
        }
    }
}

/// One target's load state as its node reported it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TargetLoad {
    /// Its state.
    pub state: LoadState,
    /// While loading, how far in percent when the engine says (0 otherwise).
    pub progress_percent: u8,
    /// With [`LoadState::Failed`], the engine's reason.
    pub failure: String,
    /// The context window it is (or will be, once loaded) served with, in tokens, when its
    /// node knows; 0: unknown.
    pub context_window: u32,
    /// Its node never unloads it (a pooling model marked never to sleep): it is never chosen
    /// to make room nor unloaded when idle.
    pub stays_loaded: bool,
    /// The memory it takes once loaded, when its node knows (v1.7); `None`: placement counts
    /// it, as before, only against the engine's `capacity`.
    pub footprint: Option<Footprint>,
}

impl TargetLoad {
    /// A target in `state`, with no progress, failure or window to tell.
    pub fn new(state: LoadState) -> Self {
        Self {
            state,
            progress_percent: 0,
            failure: String::new(),
            context_window: 0,
            stays_loaded: false,
            footprint: None,
        }
    }
}

/// An adapter whose node loads and unloads its targets on the edge's command: how many it
/// holds at once, and every target it may serve with its state.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ManagedAdapter {
    /// How many targets it can hold loaded at once; 0 when no limit is known.
    pub capacity: u32,
    /// How many runs of one target its engine serves at once (Ollama's
    /// `OLLAMA_NUM_PARALLEL`, the adapter's `parallel`): the edge sends no more; 0: no cap.
    pub parallel: u32,
    /// Every target it may serve, loaded or not.
    pub targets: BTreeMap<Target, TargetLoad>,
    /// What it may use for models, on which of its node's devices (v1.7); `None`: no budget
    /// is known, and `capacity` alone limits it.
    pub budget: Option<Budget>,
}

impl ManagedAdapter {
    /// Its budget less the footprints of the targets it holds (loaded, loading or
    /// sleeping; one whose footprint is not known counts 0), in bytes; `None` without a
    /// budget.
    pub fn room(&self) -> Option<u64> {
        let held: u64 = self
            .targets
            .values()
            .filter(|t| t.state.holds_a_place())
            .filter_map(|t| t.footprint.map(|f| f.bytes))
            .sum();
        Some(self.budget.as_ref()?.bytes.saturating_sub(held))
    }
}

/// What the edge asks a node to do with one target.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ModelAction {
    /// Load it.
    Load,
    /// Unload it.
    Unload,
}

impl ModelAction {
    /// The action's name in logs, the feed and the metrics.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Load => "load",
            Self::Unload => "unload",
        }
    }
}

/// The operator's desired state of one model (a `[[models]]` entry).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ModelPolicy {
    /// Kept loaded on at least this many nodes.
    pub min_loaded: u32,
    /// Nodes where it is kept loaded and never unloaded.
    pub pin: Vec<NodeId>,
    /// Unloaded where unused this long, beyond `min_loaded` and the pins.
    pub idle_unload: Option<Duration>,
}

impl ModelPolicy {
    /// Whether it is pinned on `node`.
    pub fn pinned_on(&self, node: &NodeId) -> bool {
        self.pin.contains(node)
    }
}
