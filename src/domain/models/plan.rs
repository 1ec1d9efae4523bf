//! The lifecycle's decisions, pure: where a model that is loaded nowhere goes (a node with
//! room first, then one where the least recently used idle model can make room), the
//! order cold requests are served in, and what reconciling the desired state takes (pins,
//! `min_loaded`, idle unloads).
//!
//! A model may make room only when nothing of it is in flight there, it is not pinned
//! there, its node does not keep it loaded of its own (`stays_loaded`) and unloading it
//! keeps its `min_loaded`; a model being loaded never makes room. An engine holding the
//! model asleep (vLLM's sleep mode) is preferred to a cold load anywhere: waking takes
//! seconds where loading takes minutes.
//! Every decision is made on a working copy the previous steps already changed, so a plan
//! of several steps never overfills an engine.

use std::collections::BTreeMap;
use std::time::Instant;

use super::state::{LoadState, ModelName, ModelPolicy};
use crate::domain::{AdapterName, NodeId, Target};

/// One adapter of one node whose targets the edge loads and unloads, as a plan sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Engine {
    /// The node.
    pub node: NodeId,
    /// The managed adapter.
    pub adapter: AdapterName,
    /// How many targets it holds at once; 0: no limit known.
    pub capacity: u32,
    /// It may be told to load (connected, obeys commands, not drained).
    pub accepts_loads: bool,
    /// Every target it may serve, loaded or not.
    pub slots: BTreeMap<Target, Slot>,
}

impl Engine {
    fn held(&self) -> usize {
        self.slots
            .values()
            .filter(|s| s.state.holds_a_place())
            .count()
    }

    fn has_room(&self) -> bool {
        self.capacity == 0 || self.held() < self.capacity as usize
    }

    fn holds(&self, target: &Target) -> bool {
        self.slots
            .get(target)
            .is_some_and(|s| s.state.holds_a_place())
    }

    /// Whether `model` could be loaded here, ignoring room.
    pub(super) fn could_load(&self, model: &ModelName) -> bool {
        self.accepts_loads
            && self.adapter == model.adapter
            && self
                .slots
                .get(&model.target)
                .is_some_and(|s| !s.state.holds_a_place())
    }
}

/// One target on one engine.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Slot {
    /// Its state, with the edge's own commands in progress already applied.
    pub state: LoadState,
    /// Runs of it on this node that have not ended.
    pub in_flight: u32,
    /// Since when nothing of it ran here (its last run's end, or when it was loaded).
    pub idle_since: Instant,
    /// Its node never unloads it (`stays_loaded`): it never makes room.
    pub stays: bool,
}

/// Why a model is loaded.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum LoadReason {
    /// A request asked for it and no node had it loaded.
    Demand,
    /// Its `min_loaded`.
    MinLoaded,
    /// It is pinned on the node.
    Pinned,
    /// An operator asked.
    Operator,
}

/// Why a model is unloaded.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum UnloadReason {
    /// Unused for its `idle_unload_ms`.
    Idle,
    /// The least recently used idle model, making room for another's load.
    MakeRoom,
    /// An operator asked.
    Operator,
}

impl LoadReason {
    /// The reason's name in the log, the feed and the metrics.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Demand => "demand",
            Self::MinLoaded => "min_loaded",
            Self::Pinned => "pin",
            Self::Operator => "operator",
        }
    }
}

impl UnloadReason {
    /// The reason's name in the log, the feed and the metrics.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Idle => "idle",
            Self::MakeRoom => "make_room",
            Self::Operator => "operator",
        }
    }
}

/// One thing to tell a node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    /// Load `model` on `node`, after unloading `evict` there when it is set.
    Load {
        /// The node.
        node: NodeId,
        /// The model.
        model: ModelName,
        /// The idle target that makes room first, on the same adapter.
        evict: Option<Target>,
        /// Why.
        reason: LoadReason,
    },
    /// Unload `model` from `node`.
    Unload {
        /// The node.
        node: NodeId,
        /// The model.
        model: ModelName,
        /// Why.
        reason: UnloadReason,
    },
}

/// Where a load goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Placement {
    /// The engine's index in the slice planned over.
    pub engine: usize,
    /// Its node.
    pub node: NodeId,
    /// The idle target to unload first; `None` when the engine has room.
    pub evict: Option<Target>,
}

/// Why a model cannot be loaded now.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum NoPlace {
    /// No connected engine that takes loads lists it (or each one that does was tried).
    #[error("no node that can load it is connected")]
    Nowhere,
    /// Every engine that could load it is full of models that may not make room (in use,
    /// pinned, or held by their `min_loaded`).
    #[error("every node that can load it is full of models in use, pinned or held by min_loaded")]
    Full,
}

/// How many engines that take runs hold `model` (loaded, loading or asleep): a drained
/// node's copy does not count towards `min_loaded`.
pub fn holders(engines: &[Engine], model: &ModelName) -> u32 {
    let count = engines
        .iter()
        .filter(|e| e.accepts_loads && e.adapter == model.adapter && e.holds(&model.target))
        .count();
    u32::try_from(count).unwrap_or(u32::MAX)
}

fn policy_of<'p>(
    policies: &'p BTreeMap<ModelName, ModelPolicy>,
    model: &ModelName,
) -> Option<&'p ModelPolicy> {
    policies.get(model)
}

/// Whether `target` on engine `index` may be unloaded to make room: loaded or asleep, idle,
/// not pinned there, and its other holders still meet its `min_loaded`.
pub(super) fn may_make_room(
    engines: &[Engine],
    index: usize,
    target: &Target,
    policies: &BTreeMap<ModelName, ModelPolicy>,
) -> bool {
    let engine = &engines[index];
    let Some(slot) = engine.slots.get(target) else {
        return false;
    };
    if !matches!(slot.state, LoadState::Loaded | LoadState::Sleeping)
        || slot.in_flight > 0
        || slot.stays
    {
        return false;
    }
    let model = ModelName::new(engine.adapter.clone(), target.clone());
    match policy_of(policies, &model) {
        Some(policy) => {
            !policy.pinned_on(&engine.node) && holders(engines, &model) > policy.min_loaded
        }
        None => true,
    }
}

/// The least recently used target of engine `index` that may make room.
fn victim(
    engines: &[Engine],
    index: usize,
    policies: &BTreeMap<ModelName, ModelPolicy>,
) -> Option<(Target, Instant)> {
    engines[index]
        .slots
        .iter()
        .filter(|(target, _)| may_make_room(engines, index, target, policies))
        .map(|(target, slot)| (target.clone(), slot.idle_since))
        .min_by(|a, b| a.1.cmp(&b.1).then_with(|| a.0.cmp(&b.0)))
}

/// Where `model` is loaded: among the engines that take loads, list it, do not hold it and
/// are not in `tried` — those holding it asleep first (a wake), then the others — the one
/// with room holding the fewest models; failing that, the one whose least recently used
/// idle model is the oldest, which makes room first.
///
/// # Errors
/// [`NoPlace::Nowhere`] when no such engine exists, [`NoPlace::Full`] when each is full of
/// models that may not make room.
pub fn place_load(
    engines: &[Engine],
    model: &ModelName,
    policies: &BTreeMap<ModelName, ModelPolicy>,
    tried: &[NodeId],
) -> Result<Placement, NoPlace> {
    let candidates: Vec<usize> = (0..engines.len())
        .filter(|&i| engines[i].could_load(model) && !tried.contains(&engines[i].node))
        .collect();
    if candidates.is_empty() {
        return Err(NoPlace::Nowhere);
    }
    let asleep = |&i: &usize| {
        engines[i]
            .slots
            .get(&model.target)
            .is_some_and(|s| s.state == LoadState::Asleep)
    };
    let (wakes, colds): (Vec<usize>, Vec<usize>) = candidates.into_iter().partition(asleep);
    [wakes, colds]
        .iter()
        .filter(|group| !group.is_empty())
        .find_map(|group| place_among(engines, group, policies))
        .ok_or(NoPlace::Full)
}

/// [`place_load`] among `candidates` only; `None` when each is full of models that may
/// not make room.
fn place_among(
    engines: &[Engine],
    candidates: &[usize],
    policies: &BTreeMap<ModelName, ModelPolicy>,
) -> Option<Placement> {
    let roomy = candidates
        .iter()
        .filter(|&&i| engines[i].has_room())
        .min_by_key(|&&i| (engines[i].held(), &engines[i].node));
    if let Some(&engine) = roomy {
        let node = engines[engine].node.clone();
        return Some(Placement {
            engine,
            node,
            evict: None,
        });
    }
    candidates
        .iter()
        .filter_map(|&i| victim(engines, i, policies).map(|(target, since)| (i, target, since)))
        .min_by(|a, b| {
            a.2.cmp(&b.2)
                .then_with(|| engines[a.0].node.cmp(&engines[b.0].node))
        })
        .map(|(engine, target, _)| Placement {
            engine,
            node: engines[engine].node.clone(),
            evict: Some(target),
        })
}

/// Applies a load on the working copy: the target loading, the evicted one unloaded.
fn apply_load(engines: &mut [Engine], placement: &Placement, target: &Target, now: Instant) {
    let engine = &mut engines[placement.engine];
    if let Some(evicted) = placement
        .evict
        .as_ref()
        .and_then(|t| engine.slots.get_mut(t))
    {
        evicted.state = LoadState::Unloaded;
    }
    if let Some(slot) = engine.slots.get_mut(target) {
        slot.state = LoadState::Loading;
        slot.idle_since = now;
    }
}

fn load_step(placement: &Placement, model: &ModelName, reason: LoadReason) -> Step {
    Step::Load {
        node: placement.node.clone(),
        model: model.clone(),
        evict: placement.evict.clone(),
        reason,
    }
}

/// What serving the cold requests takes: one load for each model in `demands` (oldest
/// request first, with the nodes each already failed on) that no engine holds yet, so an
/// older request gets the room a younger one would take. The models that cannot be loaded
/// now come back with why.
pub fn plan_cold(
    engines: &[Engine],
    demands: &[(ModelName, Vec<NodeId>)],
    policies: &BTreeMap<ModelName, ModelPolicy>,
    now: Instant,
) -> (Vec<Step>, Vec<(ModelName, NoPlace)>) {
    let mut engines = engines.to_vec();
    let mut steps = Vec::new();
    let mut unplaced = Vec::new();
    for (model, tried) in demands {
        if holders(&engines, model) > 0 {
            continue;
        }
        match place_load(&engines, model, policies, tried) {
            Ok(placement) => {
                apply_load(&mut engines, &placement, &model.target, now);
                steps.push(load_step(&placement, model, LoadReason::Demand));
            }
            Err(why) => unplaced.push((model.clone(), why)),
        }
    }
    (steps, unplaced)
}

/// What bringing the pool to the desired state takes now, in order: each model loaded on
/// the nodes it is pinned to, then on enough nodes for its `min_loaded`, then unloaded
/// where it has been idle for its `idle_unload` (never where pinned, never below
/// `min_loaded`, never with a run in flight).
pub fn reconcile(
    engines: &[Engine],
    policies: &BTreeMap<ModelName, ModelPolicy>,
    now: Instant,
) -> Vec<Step> {
    let mut engines = engines.to_vec();
    let mut steps = Vec::new();
    for (model, policy) in policies {
        for node in &policy.pin {
            let pinned: Vec<NodeId> = engines
                .iter()
                .filter(|e| &e.node != node)
                .map(|e| e.node.clone())
                .collect();
            if let Ok(placement) = place_load(&engines, model, policies, &pinned) {
                apply_load(&mut engines, &placement, &model.target, now);
                steps.push(load_step(&placement, model, LoadReason::Pinned));
            }
        }
        while holders(&engines, model) < policy.min_loaded {
            let Ok(placement) = place_load(&engines, model, policies, &[]) else {
                break;
            };
            apply_load(&mut engines, &placement, &model.target, now);
            steps.push(load_step(&placement, model, LoadReason::MinLoaded));
        }
    }
    steps.extend(idle_unloads(&mut engines, policies, now));
    steps
}

/// The unloads of models idle for their `idle_unload`, applied to `engines`.
fn idle_unloads(
    engines: &mut [Engine],
    policies: &BTreeMap<ModelName, ModelPolicy>,
    now: Instant,
) -> Vec<Step> {
    let mut steps = Vec::new();
    for index in 0..engines.len() {
        let targets: Vec<Target> = engines[index].slots.keys().cloned().collect();
        for target in targets {
            let model = ModelName::new(engines[index].adapter.clone(), target.clone());
            let Some(limit) = policy_of(policies, &model).and_then(|p| p.idle_unload) else {
                continue;
            };
            let slot = engines[index].slots[&target];
            let idle = now.saturating_duration_since(slot.idle_since) >= limit;
            if idle && may_make_room(engines, index, &target, policies) {
                if let Some(slot) = engines[index].slots.get_mut(&target) {
                    slot.state = LoadState::Unloaded;
                }
                steps.push(Step::Unload {
                    node: engines[index].node.clone(),
                    model,
                    reason: UnloadReason::Idle,
                });
            }
        }
    }
    steps
}
