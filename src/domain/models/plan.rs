//! The lifecycle's decisions, pure: where a model that is loaded nowhere goes (a node where
//! it fits as it is first, then one where the fewest idle models can make room for it), the
//! order cold requests are served in, and what reconciling the desired state takes (pins,
//! `min_loaded`, idle unloads).
//!
//! An engine has room for a model while it holds fewer than its `capacity` (when it has one)
//! and, where its budget and the model's footprint are known, while the budget less the
//! footprints of what it holds is at least the model's (`fit.rs`); a model whose footprint
//! is not known is counted only against `capacity`, as before budgets. Among engines where
//! it fits as it is, the one left with the fewest bytes stranded (then the one holding the
//! fewest models) takes it; failing that, the one needing the fewest unloads (then the
//! fewest bytes stranded, then the least recently used victim).
//!
//! A model may make room only when nothing of it is in flight there, it is not pinned
//! there, its node does not keep it loaded of its own (`stays_loaded`) and unloading it
//! keeps its `min_loaded`; a model being loaded never makes room. An engine holding the
//! model asleep (vLLM's sleep mode) is preferred to a cold load anywhere: waking takes
//! seconds where loading takes minutes.
//! Every decision is made on a working copy the previous steps already changed, so a plan
//! of several steps never overfills an engine, in count or in bytes.

use std::collections::BTreeMap;
use std::time::Instant;

use super::fit::{Candidate, FitNote, TooLarge, fewest_evictions};
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
    /// What it may use for models, in bytes; `None`: no budget known (count only).
    pub budget: Option<u64>,
}

impl Engine {
    /// The footprints of what it holds, in bytes (an unknown one counts 0).
    fn held_bytes(&self) -> u64 {
        self.slots
            .values()
            .filter(|s| s.state.holds_a_place())
            .filter_map(|s| s.footprint)
            .sum()
    }

    /// Whether `target` fits at all (`Some(false)`: its footprint is above the budget;
    /// `None`: one of them is not known).
    pub(super) fn fits_at_all(&self, target: &Target) -> Option<bool> {
        let footprint = self.slots.get(target)?.footprint?;
        Some(footprint <= self.budget?)
    }

    fn held(&self) -> usize {
        self.slots
            .values()
            .filter(|s| s.state.holds_a_place())
            .count()
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
    /// The memory it takes loaded, in bytes, when its node knows.
    pub footprint: Option<u64>,
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
    /// Load `model` on `node`, after unloading each of `evict` there.
    Load {
        /// The node.
        node: NodeId,
        /// The model.
        model: ModelName,
        /// The idle targets that make room first, on the same adapter, least recently used
        /// first.
        evict: Vec<Target>,
        /// Why.
        reason: LoadReason,
        /// Its footprint and the engine's room and budget, where both are known.
        fit: Option<FitNote>,
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
    /// The idle targets to unload first, least recently used first; empty when the model
    /// fits as the engine is.
    pub evict: Vec<Target>,
    /// Its footprint and the engine's room and budget, where both are known.
    pub fit: Option<FitNote>,
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
    /// It fits on none of them, even empty: its footprint is above every budget.
    #[error(transparent)]
    TooLarge(TooLarge),
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

/// How a model fits on one engine: what must be unloaded first, and what it finds there.
struct Fit {
    index: usize,
    evict: Vec<Target>,
    note: Option<FitNote>,
    /// The bytes left over once it is loaded, where known.
    stranded: Option<u64>,
    /// The least recently used of the models unloaded for it.
    oldest: Option<Instant>,
}

/// How `model` fits on engine `index`: as the engine is, or after unloading the fewest idle
/// models that make enough room (places and bytes); `None` when it cannot.
fn fit_on(
    engines: &[Engine],
    index: usize,
    model: &ModelName,
    policies: &BTreeMap<ModelName, ModelPolicy>,
) -> Option<Fit> {
    let engine = &engines[index];
    let footprint = engine.slots.get(&model.target).and_then(|s| s.footprint);
    let note = match (engine.budget, footprint) {
        (Some(budget), Some(footprint)) if footprint > budget => return None,
        (Some(budget), Some(footprint)) => Some(FitNote {
            footprint,
            budget,
            room: budget.saturating_sub(engine.held_bytes()),
        }),
        _ => None,
    };
    let bytes = note.map_or(0, |n| n.footprint.saturating_sub(n.room));
    let capacity = engine.capacity as usize;
    let places = if capacity == 0 {
        0
    } else {
        (engine.held() + 1).saturating_sub(capacity)
    };
    let candidates: Vec<Candidate> = engine
        .slots
        .iter()
        .filter(|(target, _)| may_make_room(engines, index, target, policies))
        .map(|(target, slot)| Candidate {
            target: target.clone(),
            idle_since: slot.idle_since,
            bytes: slot.footprint.unwrap_or(0),
        })
        .collect();
    let evict = fewest_evictions(bytes, places, &candidates)?;
    let unloaded = || candidates.iter().filter(|c| evict.contains(&c.target));
    let freed: u64 = unloaded().map(|c| c.bytes).sum();
    Some(Fit {
        index,
        oldest: unloaded().map(|c| c.idle_since).min(),
        stranded: note.map(|n| (n.room + freed).saturating_sub(n.footprint)),
        evict,
        note,
    })
}

/// Whether `model` fits on engine `index` as it is, unloading nothing.
#[cfg(test)]
pub(super) fn fits_as_it_is(
    engines: &[Engine],
    index: usize,
    model: &ModelName,
    policies: &BTreeMap<ModelName, ModelPolicy>,
) -> bool {
    fit_on(engines, index, model, policies).is_some_and(|fit| fit.evict.is_empty())
}

/// The smallest footprint of `target` and the largest budget among `engines`, when each of
/// them knows both and none has room for it even empty.
fn too_large_among<'e>(
    mut engines: impl Iterator<Item = &'e Engine>,
    target: &Target,
) -> Option<TooLarge> {
    engines.try_fold(None, |found: Option<TooLarge>, engine| {
        if engine.fits_at_all(target)? {
            return None;
        }
        let footprint = engine.slots.get(target)?.footprint?;
        let budget = engine.budget?;
        Some(Some(match found {
            None => TooLarge {
                footprint,
                largest_budget: budget,
            },
            Some(seen) => TooLarge {
                footprint: seen.footprint.min(footprint),
                largest_budget: seen.largest_budget.max(budget),
            },
        }))
    })?
}

/// Whether `model` is too large for every engine that lists it (whatever its state there,
/// drained or not): its footprint and the largest budget, to refuse its requests at once.
/// `None` when some engine may fit it, or one does not know the footprint or the budget.
pub fn too_large(engines: &[Engine], model: &ModelName) -> Option<TooLarge> {
    too_large_among(
        engines
            .iter()
            .filter(|e| e.adapter == model.adapter && e.slots.contains_key(&model.target)),
        &model.target,
    )
}

/// Where `model` is loaded: among the engines that take loads, list it, do not hold it and
/// are not in `tried` — those holding it asleep first (a wake), then the others — one where
/// it fits as the engine is, leaving the fewest bytes stranded (then holding the fewest
/// models); failing that, the one where the fewest idle models make room for it (then the
/// fewest bytes stranded, then the oldest least recently used victim).
///
/// # Errors
/// [`NoPlace::Nowhere`] when no such engine exists, [`NoPlace::TooLarge`] when its
/// footprint is above each one's budget, [`NoPlace::Full`] when each is full of models that
/// may not make room.
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
    let (wakes, colds): (Vec<usize>, Vec<usize>) = candidates.iter().partition(|i| asleep(i));
    [wakes, colds]
        .iter()
        .filter(|group| !group.is_empty())
        .find_map(|group| place_among(engines, group, model, policies))
        .ok_or_else(|| {
            let listed = candidates.iter().map(|&i| &engines[i]);
            too_large_among(listed, &model.target).map_or(NoPlace::Full, NoPlace::TooLarge)
        })
}

/// [`place_load`] among `candidates` only; `None` when it fits on none of them.
fn place_among(
    engines: &[Engine],
    candidates: &[usize],
    model: &ModelName,
    policies: &BTreeMap<ModelName, ModelPolicy>,
) -> Option<Placement> {
    let key = |fit: &Fit| {
        let engine = &engines[fit.index];
        let held = if fit.evict.is_empty() {
            engine.held()
        } else {
            0
        };
        let stranded = fit.stranded.unwrap_or(u64::MAX);
        (fit.evict.len(), stranded, held, fit.oldest, &engine.node)
    };
    let best = candidates
        .iter()
        .filter_map(|&i| fit_on(engines, i, model, policies))
        .min_by(|a, b| key(a).cmp(&key(b)))?;
    Some(Placement {
        engine: best.index,
        node: engines[best.index].node.clone(),
        evict: best.evict,
        fit: best.note,
    })
}

/// Applies a load on the working copy: the target loading, the evicted ones unloaded.
fn apply_load(engines: &mut [Engine], placement: &Placement, target: &Target, now: Instant) {
    let engine = &mut engines[placement.engine];
    for evicted in &placement.evict {
        if let Some(slot) = engine.slots.get_mut(evicted) {
            slot.state = LoadState::Unloaded;
        }
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
        fit: placement.fit,
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
