//! The lifecycle's decisions: examples, and properties over random pools (never evict what
//! is in use, pinned or held by `min_loaded`; never overfill an engine; older cold requests
//! first).

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use proptest::prelude::*;

use super::*;
use crate::domain::{AdapterName, NodeId, Target};

fn node(id: &str) -> NodeId {
    NodeId::parse(id).unwrap()
}

fn model(target: &str) -> ModelName {
    ModelName::parse(&format!("llama/{target}")).unwrap()
}

fn engine(id: &str, capacity: u32, slots: &[(&str, LoadState, u32, u64)], base: Instant) -> Engine {
    Engine {
        node: node(id),
        adapter: AdapterName::parse("llama").unwrap(),
        capacity,
        accepts_loads: true,
        slots: slots
            .iter()
            .map(|&(target, state, in_flight, idle_ms)| {
                let idle_since = base + Duration::from_millis(idle_ms);
                (
                    Target::parse(target).unwrap(),
                    Slot {
                        state,
                        in_flight,
                        idle_since,
                        stays: false,
                        footprint: None,
                    },
                )
            })
            .collect(),
        budget: None,
    }
}

use LoadState::{Loaded, Unloaded};

#[test]
fn a_model_goes_to_the_node_with_room_holding_the_fewest() {
    let t = Instant::now();
    let engines = [
        engine("a", 2, &[("x", Loaded, 0, 0), ("y", Unloaded, 0, 0)], t),
        engine("b", 2, &[("y", Unloaded, 0, 0)], t),
    ];
    let placement = place_load(&engines, &model("y"), &BTreeMap::new(), &[]).unwrap();
    assert_eq!((placement.node, placement.evict), (node("b"), vec![]));
}

#[test]
fn a_full_pool_makes_room_with_the_least_recently_used_idle_model() {
    let t = Instant::now();
    let engines = [
        engine("a", 1, &[("x", Loaded, 0, 50), ("z", Unloaded, 0, 0)], t),
        engine("b", 1, &[("w", Loaded, 0, 10), ("z", Unloaded, 0, 0)], t),
        engine("c", 1, &[("v", Loaded, 1, 0), ("z", Unloaded, 0, 0)], t),
    ];
    let placement = place_load(&engines, &model("z"), &BTreeMap::new(), &[]).unwrap();
    assert_eq!(placement.node, node("b"));
    assert_eq!(placement.evict, vec![Target::parse("w").unwrap()]);
}

#[test]
fn in_use_pinned_and_min_loaded_models_never_make_room() {
    let t = Instant::now();
    let engines = [
        engine(
            "a",
            1,
            &[("busy", Loaded, 1, 0), ("cold", Unloaded, 0, 0)],
            t,
        ),
        engine(
            "b",
            1,
            &[("pinned", Loaded, 0, 0), ("cold", Unloaded, 0, 0)],
            t,
        ),
        engine(
            "c",
            1,
            &[("kept", Loaded, 0, 0), ("cold", Unloaded, 0, 0)],
            t,
        ),
    ];
    let policies = BTreeMap::from([
        (
            model("pinned"),
            ModelPolicy {
                pin: vec![node("b")],
                ..ModelPolicy::default()
            },
        ),
        (
            model("kept"),
            ModelPolicy {
                min_loaded: 1,
                ..ModelPolicy::default()
            },
        ),
    ]);
    assert_eq!(
        place_load(&engines, &model("cold"), &policies, &[]),
        Err(NoPlace::Full)
    );
    assert_eq!(
        place_load(
            &engines,
            &model("cold"),
            &policies,
            &[node("a"), node("b"), node("c")]
        ),
        Err(NoPlace::Nowhere)
    );
}

fn policy(min_loaded: u32, pin: &[&str], idle_secs: Option<u64>) -> ModelPolicy {
    ModelPolicy {
        min_loaded,
        pin: pin.iter().map(|id| node(id)).collect(),
        idle_unload: idle_secs.map(Duration::from_secs),
    }
}

#[test]
fn reconcile_loads_pins_and_min_loaded_and_unloads_the_idle() {
    let t = Instant::now();
    let engines = [
        engine(
            "a",
            2,
            &[
                ("p", Unloaded, 0, 0),
                ("m", Unloaded, 0, 0),
                ("i", Loaded, 0, 0),
            ],
            t,
        ),
        engine("b", 2, &[("m", Unloaded, 0, 0), ("i", Loaded, 0, 0)], t),
    ];
    let policies = BTreeMap::from([
        (model("p"), policy(0, &["a"], None)),
        (model("m"), policy(2, &[], None)),
        (model("i"), policy(0, &[], Some(60))),
    ]);
    let later = t + Duration::from_secs(61);
    let steps = reconcile(&engines, &policies, later);
    let loads: Vec<_> = steps
        .iter()
        .filter_map(|s| match s {
            Step::Load {
                node,
                model,
                reason,
                ..
            } => Some((node.as_str(), model.target.as_str(), *reason)),
            Step::Unload { .. } => None,
        })
        .collect();
    assert!(loads.contains(&("a", "p", LoadReason::Pinned)), "{steps:?}");
    assert!(
        loads.contains(&("b", "m", LoadReason::MinLoaded)),
        "{steps:?}"
    );
    // Node a is full with p and i once i is idle: m makes room by unloading i.
    assert!(steps.iter().any(|s| matches!(s, Step::Load { node: n, evict, .. } if n.as_str() == "a" && evict.len() == 1 && evict[0].as_str() == "i")), "{steps:?}");
    let early = reconcile(&engines, &policies, t + Duration::from_secs(59));
    assert!(!early.iter().any(|s| matches!(
        s,
        Step::Unload {
            reason: UnloadReason::Idle,
            ..
        }
    )));
}

#[test]
fn the_older_cold_request_gets_the_one_free_place() {
    let t = Instant::now();
    let engines = [engine(
        "a",
        1,
        &[("x", Unloaded, 0, 0), ("y", Unloaded, 0, 0)],
        t,
    )];
    let demands = vec![(model("y"), vec![]), (model("x"), vec![])];
    let (steps, unplaced) = plan_cold(&engines, &demands, &BTreeMap::new(), t);
    assert!(matches!(&steps[..], [Step::Load { model, .. }] if model.target.as_str() == "y"));
    assert_eq!(unplaced, vec![(model("x"), NoPlace::Full)]);
}

#[test]
fn an_asleep_copy_is_woken_rather_than_a_cold_load_elsewhere_even_when_it_must_make_room() {
    let t = Instant::now();
    let engines = [
        engine("a", 2, &[("y", Unloaded, 0, 0)], t),
        engine(
            "b",
            1,
            &[("x", Loaded, 0, 10), ("y", LoadState::Asleep, 0, 0)],
            t,
        ),
    ];
    let placement = place_load(&engines, &model("y"), &BTreeMap::new(), &[]).unwrap();
    assert_eq!(placement.node, node("b"), "the wake, after x sleeps");
    assert_eq!(placement.evict, vec![Target::parse("x").unwrap()]);
    // Where the asleep copy cannot make room (x is in use), the cold load goes elsewhere.
    let busy = [
        engines[0].clone(),
        engine(
            "b",
            1,
            &[("x", Loaded, 1, 10), ("y", LoadState::Asleep, 0, 0)],
            t,
        ),
    ];
    let placement = place_load(&busy, &model("y"), &BTreeMap::new(), &[]).unwrap();
    assert_eq!((placement.node, placement.evict), (node("a"), vec![]));
    // An asleep copy holds no place: an engine of capacity 1 with one awake and one asleep
    // is full, and the asleep one is never chosen to make room.
    assert!(!super::plan::may_make_room(
        &busy,
        1,
        &Target::parse("y").unwrap(),
        &BTreeMap::new()
    ));
}

#[test]
fn a_model_its_node_keeps_loaded_never_makes_room() {
    let t = Instant::now();
    let mut engines = [engine(
        "a",
        1,
        &[("embed", Loaded, 0, 0), ("chat", Unloaded, 0, 0)],
        t,
    )];
    let embed = Target::parse("embed").unwrap();
    engines[0].slots.get_mut(&embed).unwrap().stays = true;
    let policies = BTreeMap::from([(model("embed"), policy(0, &[], Some(0)))]);
    assert_eq!(
        place_load(&engines, &model("chat"), &policies, &[]),
        Err(NoPlace::Full)
    );
    assert!(reconcile(&engines, &policies, t + Duration::from_secs(5)).is_empty());
}

#[test]
fn model_names_read_and_write_adapter_slash_target() {
    let name = ModelName::parse("llama/Qwen/Qwen2.5-7B").unwrap();
    assert_eq!(name.adapter.as_str(), "llama");
    assert_eq!(name.target.as_str(), "Qwen/Qwen2.5-7B");
    assert_eq!(name.to_string(), "llama/Qwen/Qwen2.5-7B");
    assert!(ModelName::parse("alpha").is_err());
    assert!(ModelName::parse("/alpha").is_err());
}

/// `engine` with `budget` bytes and each target's footprint in bytes.
fn sized(mut engine: Engine, budget: u64, footprints: &[(&str, u64)]) -> Engine {
    engine.budget = Some(budget);
    for (target, bytes) in footprints {
        let slot = engine
            .slots
            .get_mut(&Target::parse(target).unwrap())
            .unwrap();
        slot.footprint = Some(*bytes);
    }
    engine
}

#[test]
fn a_model_goes_only_where_it_fits_and_to_the_node_it_leaves_the_fewest_bytes_stranded() {
    let t = Instant::now();
    let small = sized(
        engine(
            "small",
            0,
            &[("big", Unloaded, 0, 0), ("mid", Unloaded, 0, 0)],
            t,
        ),
        100,
        &[("big", 250), ("mid", 60)],
    );
    let large = sized(
        engine(
            "large",
            0,
            &[("big", Unloaded, 0, 0), ("mid", Unloaded, 0, 0)],
            t,
        ),
        400,
        &[("big", 250), ("mid", 60)],
    );
    let engines = [small, large];
    let big = place_load(&engines, &model("big"), &BTreeMap::new(), &[]).unwrap();
    assert_eq!((big.node.as_str(), big.evict.len()), ("large", 0));
    assert_eq!(
        big.fit,
        Some(FitNote {
            footprint: 250,
            budget: 400,
            room: 400
        })
    );
    // Both fit the 60: the small node is left with 40 stranded, the large with 340.
    let mid = place_load(&engines, &model("mid"), &BTreeMap::new(), &[]).unwrap();
    assert_eq!(mid.node.as_str(), "small");
    // Where it fits on no node, it is too large, with its footprint and the largest budget.
    let only_small = [engines[0].clone()];
    assert_eq!(
        place_load(&only_small, &model("big"), &BTreeMap::new(), &[]),
        Err(NoPlace::TooLarge(TooLarge {
            footprint: 250,
            largest_budget: 100
        }))
    );
    assert_eq!(
        too_large(&only_small, &model("big")),
        Some(TooLarge {
            footprint: 250,
            largest_budget: 100
        })
    );
    assert_eq!(too_large(&engines, &model("big")), None);
}

#[test]
fn two_small_models_share_a_node_where_a_large_one_would_not_fit_beside_them() {
    let t = Instant::now();
    let slots = [
        ("a", Loaded, 0, 10),
        ("b", Unloaded, 0, 0),
        ("big", Unloaded, 0, 0),
    ];
    let engines = [sized(
        engine("n", 0, &slots, t),
        200,
        &[("a", 60), ("b", 60), ("big", 150)],
    )];
    let b = place_load(&engines, &model("b"), &BTreeMap::new(), &[]).unwrap();
    assert_eq!((b.evict.len(), b.fit.unwrap().room), (0, 140));
    // The large one needs `a` gone (140 free < 150), an idle model: one unload, no more.
    let big = place_load(&engines, &model("big"), &BTreeMap::new(), &[]).unwrap();
    assert_eq!(big.evict, vec![Target::parse("a").unwrap()]);
    // In use, `a` never makes room: the node is full for it.
    let busy = [sized(
        engine(
            "n",
            0,
            &[
                ("a", Loaded, 1, 10),
                ("b", Unloaded, 0, 0),
                ("big", Unloaded, 0, 0),
            ],
            t,
        ),
        200,
        &[("a", 60), ("b", 60), ("big", 150)],
    )];
    assert_eq!(
        place_load(&busy, &model("big"), &BTreeMap::new(), &[]),
        Err(NoPlace::Full)
    );
}

#[test]
fn room_is_made_with_the_fewest_unloads_least_recently_used_first() {
    let t = Instant::now();
    let slots = [
        ("old", Loaded, 0, 0),
        ("small", Loaded, 0, 5),
        ("large", Loaded, 0, 10),
        ("new", Unloaded, 0, 0),
    ];
    let footprints = [("old", 30), ("small", 30), ("large", 100), ("new", 100)];
    let engines = [sized(engine("n", 0, &slots, t), 200, &footprints)];
    // 40 free, 100 needed: the one large model frees enough, where the two older small ones
    // would be two unloads.
    let placement = place_load(&engines, &model("new"), &BTreeMap::new(), &[]).unwrap();
    assert_eq!(placement.evict, vec![Target::parse("large").unwrap()]);
}

#[test]
fn an_entry_that_cannot_be_met_is_found_once_the_footprints_are_known() {
    let t = Instant::now();
    let a = sized(
        engine("a", 0, &[("big", Unloaded, 0, 0)], t),
        100,
        &[("big", 250)],
    );
    let b = sized(
        engine("b", 0, &[("big", Unloaded, 0, 0)], t),
        400,
        &[("big", 250)],
    );
    let policies = BTreeMap::from([(model("big"), policy(2, &["a"], None))]);
    let found = unmet(&[a.clone(), b.clone()], &policies);
    assert_eq!(found.len(), 2, "{found:?}");
    assert!(
        matches!(&found[0], Unmet::Pin { node, footprint: 250, budget: 100, .. } if node.as_str() == "a")
    );
    assert!(matches!(
        &found[1],
        Unmet::MinLoaded {
            min_loaded: 2,
            fits_on: 1,
            ..
        }
    ));
    assert!(
        found[0].to_string().contains("250.0 B") || found[0].to_string().contains("250 B"),
        "{}",
        found[0]
    );
    // Unknown footprints: nothing to say yet.
    let mut unknown = a;
    unknown.budget = None;
    assert!(unmet(&[unknown, b], &policies).is_empty());
}

const TARGETS: [&str; 4] = ["t0", "t1", "t2", "t3"];

fn arb_state() -> impl Strategy<Value = LoadState> {
    prop_oneof![
        Just(LoadState::Loaded),
        Just(LoadState::Loading),
        Just(LoadState::Unloaded),
        Just(LoadState::Sleeping),
        Just(LoadState::Failed),
        Just(LoadState::Asleep),
    ]
}

/// Engines whose held targets fit their capacity and budget (as a real engine's do); some
/// with no capacity, some with no budget, some targets with no footprint.
fn arb_pool() -> impl Strategy<Value = Vec<Engine>> {
    let footprint = prop::option::weighted(0.8, 10u64..120);
    let slot = (
        arb_state(),
        0u32..3,
        0u64..1_000,
        prop::bool::weighted(0.2),
        footprint,
    );
    let engine = (
        0u32..4,
        prop::option::weighted(0.7, 40u64..300),
        prop::collection::vec(prop::option::of(slot), 4),
        any::<bool>(),
    );
    prop::collection::vec(engine, 1..5).prop_map(|engines| {
        let base = Instant::now();
        engines
            .into_iter()
            .enumerate()
            .map(|(i, (capacity, budget, slots, accepts))| {
                let (mut held, mut bytes) = (0, 0);
                let slots = TARGETS
                    .iter()
                    .zip(slots)
                    .filter_map(|(target, slot)| {
                        let (mut state, in_flight, idle, stays, footprint) = slot?;
                        if state.holds_a_place() {
                            let size = footprint.unwrap_or(0);
                            let over_budget = budget.is_some_and(|b| bytes + size > b);
                            if (capacity > 0 && held == capacity) || over_budget {
                                state = LoadState::Unloaded;
                            } else {
                                held += 1;
                                bytes += size;
                            }
                        }
                        let idle_since = base + Duration::from_millis(idle);
                        Some((
                            Target::parse(target).unwrap(),
                            Slot {
                                state,
                                in_flight,
                                idle_since,
                                stays,
                                footprint,
                            },
                        ))
                    })
                    .collect();
                Engine {
                    node: node(&format!("n{i}")),
                    adapter: AdapterName::parse("llama").unwrap(),
                    capacity,
                    accepts_loads: accepts || i == 0,
                    slots,
                    budget,
                }
            })
            .collect()
    })
}

fn arb_policies(nodes: usize) -> impl Strategy<Value = BTreeMap<ModelName, ModelPolicy>> {
    let policy = (
        0u32..3,
        prop::collection::vec(0..nodes, 0..2),
        prop::option::of(0u64..2_000),
    );
    prop::collection::vec(prop::option::of(policy), 4).prop_map(|policies| {
        TARGETS
            .iter()
            .zip(policies)
            .filter_map(|(target, policy)| {
                let (min_loaded, pin, idle) = policy?;
                let pin = pin.into_iter().map(|i| node(&format!("n{i}"))).collect();
                let idle_unload = idle.map(Duration::from_millis);
                Some((
                    model(target),
                    ModelPolicy {
                        min_loaded,
                        pin,
                        idle_unload,
                    },
                ))
            })
            .collect()
    })
}

/// The fewest idle models of engine `index` whose unloading lets `target` fit there, found
/// by trying every set; `None` when none does.
fn fewest_by_search(
    engines: &[Engine],
    index: usize,
    target: &Target,
    policies: &BTreeMap<ModelName, ModelPolicy>,
) -> Option<usize> {
    let engine = &engines[index];
    let need = engine.slots[target].footprint;
    let held: Vec<(&Target, &Slot)> = engine
        .slots
        .iter()
        .filter(|(_, s)| s.state.holds_a_place())
        .collect();
    let victims: Vec<usize> = (0..held.len())
        .filter(|&i| super::plan::may_make_room(engines, index, held[i].0, policies))
        .collect();
    (0u32..1 << victims.len())
        .filter(|set| {
            let gone = |i: usize| {
                victims
                    .iter()
                    .enumerate()
                    .any(|(b, &v)| v == i && set & (1 << b) != 0)
            };
            let kept = (0..held.len()).filter(|&i| !gone(i));
            let count = kept.clone().count();
            let bytes: u64 = kept.filter_map(|i| held[i].1.footprint).sum();
            let places_ok = engine.capacity == 0 || count < engine.capacity as usize;
            let bytes_ok = match (engine.budget, need) {
                (Some(budget), Some(need)) => bytes + need <= budget,
                _ => true,
            };
            places_ok && bytes_ok
        })
        .map(|set| set.count_ones() as usize)
        .min()
}

/// Replays `steps` on `engines`, checking each unload and eviction is allowed before it,
/// that a load unloads no more models than it must there, and that no engine goes over its
/// capacity or its budget; `before` sees the pool before each load.
fn replay(
    engines: &mut [Engine],
    steps: &[Step],
    policies: &BTreeMap<ModelName, ModelPolicy>,
    mut before: impl FnMut(&[Engine], &Step) -> Result<(), TestCaseError>,
) -> Result<(), TestCaseError> {
    for step in steps {
        let (node, adapter, target, evict) = match step {
            Step::Load {
                node, model, evict, ..
            } => (node, &model.adapter, &model.target, evict.clone()),
            Step::Unload { node, model, .. } => (
                node,
                &model.adapter,
                &model.target,
                vec![model.target.clone()],
            ),
        };
        let index = engines
            .iter()
            .position(|e| &e.node == node && &e.adapter == adapter)
            .unwrap();
        for victim in &evict {
            prop_assert!(
                super::plan::may_make_room(engines, index, victim, policies),
                "{step:?} unloads what it may not"
            );
        }
        if matches!(step, Step::Load { .. }) {
            before(engines, step)?;
            let fewest = fewest_by_search(engines, index, target, policies);
            prop_assert_eq!(
                Some(evict.len()),
                fewest,
                "{:?} unloads more than it must",
                step
            );
        }
        for victim in &evict {
            engines[index].slots.get_mut(victim).unwrap().state = LoadState::Unloaded;
        }
        if matches!(step, Step::Load { .. }) {
            load_checked(&mut engines[index], target, step)?;
        }
    }
    Ok(())
}

/// Loads `target` on `engine`, checking it takes loads, does not hold it, and goes over
/// neither its capacity nor (where the footprint is known) its budget.
fn load_checked(engine: &mut Engine, target: &Target, step: &Step) -> Result<(), TestCaseError> {
    prop_assert!(engine.accepts_loads);
    let slot = engine.slots.get_mut(target).unwrap();
    prop_assert!(!slot.state.holds_a_place());
    slot.state = LoadState::Loading;
    let held: Vec<&Slot> = engine
        .slots
        .values()
        .filter(|s| s.state.holds_a_place())
        .collect();
    prop_assert!(
        engine.capacity == 0 || held.len() <= engine.capacity as usize,
        "{step:?} overfills {}",
        engine.node
    );
    if let (Some(budget), Some(_)) = (engine.budget, engine.slots[target].footprint) {
        let bytes: u64 = held.iter().filter_map(|s| s.footprint).sum();
        prop_assert!(
            bytes <= budget,
            "{step:?} puts {} over its budget",
            engine.node
        );
    }
    Ok(())
}

fn no_check(_: &[Engine], _: &Step) -> Result<(), TestCaseError> {
    Ok(())
}

proptest! {
    #[test]
    fn reconciling_never_evicts_what_it_may_not_nor_overfills(
        (pool, policies) in arb_pool().prop_flat_map(|pool| {
            let nodes = pool.len();
            (Just(pool), arb_policies(nodes))
        }),
        elapsed in 0u64..3_000,
    ) {
        let now = pool[0].slots.values().map(|s| s.idle_since).min().unwrap_or_else(Instant::now)
            + Duration::from_millis(elapsed);
        let steps = reconcile(&pool, &policies, now);
        let mut engines = pool.clone();
        replay(&mut engines, &steps, &policies, no_check)?;
    }

    #[test]
    fn cold_loads_never_evict_what_they_may_not_nor_go_over_a_budget_and_serve_older_requests_first(
        (pool, policies) in arb_pool().prop_flat_map(|pool| {
            let nodes = pool.len();
            (Just(pool), arb_policies(nodes))
        }),
        order in Just(TARGETS.to_vec()).prop_shuffle(),
    ) {
        let demands: Vec<_> = order.iter().map(|t| (model(t), vec![])).collect();
        let (steps, unplaced) = plan_cold(&pool, &demands, &policies, Instant::now());
        let mut engines = pool.clone();
        // A younger request never took, as it was, a place where an older one that found
        // every node full would have fitted as it was.
        let rank = |target: &Target| order.iter().position(|t| *t == target.as_str()).unwrap();
        replay(&mut engines, &steps, &policies, |now, step| {
            let Step::Load { node, model, evict, .. } = step else { return Ok(()) };
            if !evict.is_empty() {
                return Ok(());
            }
            let index = now.iter().position(|e| &e.node == node).unwrap();
            for (older, why) in &unplaced {
                let fits = now[index].could_load(older)
                    && super::plan::fits_as_it_is(now, index, older, &policies);
                prop_assert!(
                    !(rank(&older.target) < rank(&model.target) && fits && *why == NoPlace::Full),
                    "{older} waited while {model} took a place on {node}"
                );
            }
            Ok(())
        })?;
    }

    #[test]
    fn a_model_is_too_large_only_where_it_fits_on_no_engine_that_lists_it(
        pool in arb_pool(),
        target in prop::sample::select(TARGETS.to_vec()),
    ) {
        let model = model(target);
        let listing: Vec<&Engine> = pool.iter().filter(|e| e.slots.contains_key(&model.target)).collect();
        match too_large(&pool, &model) {
            Some(refusal) => {
                prop_assert!(!listing.is_empty());
                for engine in &listing {
                    let footprint = engine.slots[&model.target].footprint.unwrap();
                    prop_assert!(footprint > engine.budget.unwrap());
                    prop_assert!(refusal.footprint <= footprint && refusal.largest_budget >= engine.budget.unwrap());
                }
                prop_assert!(refusal.footprint > refusal.largest_budget);
            }
            None => {
                let may_fit = listing.iter().any(|e| {
                    match (e.budget, e.slots[&model.target].footprint) {
                        (Some(budget), Some(footprint)) => footprint <= budget,
                        _ => true,
                    }
                });
                prop_assert!(listing.is_empty() || may_fit);
            }
        }
    }
}
