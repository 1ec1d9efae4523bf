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
                    },
                )
            })
            .collect(),
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
    assert_eq!((placement.node, placement.evict), (node("b"), None));
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
    assert_eq!(placement.evict, Some(Target::parse("w").unwrap()));
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
    assert!(steps.iter().any(|s| matches!(s, Step::Load { node: n, evict: Some(e), .. } if n.as_str() == "a" && e.as_str() == "i")), "{steps:?}");
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
    assert_eq!(placement.evict, Some(Target::parse("x").unwrap()));
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
    assert_eq!((placement.node, placement.evict), (node("a"), None));
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

/// Engines whose held targets fit their capacity (as a real engine's do).
fn arb_pool() -> impl Strategy<Value = Vec<Engine>> {
    let slot = (arb_state(), 0u32..3, 0u64..1_000, prop::bool::weighted(0.2));
    let engine = (
        1u32..4,
        prop::collection::vec(prop::option::of(slot), 4),
        any::<bool>(),
    );
    prop::collection::vec(engine, 1..5).prop_map(|engines| {
        let base = Instant::now();
        engines
            .into_iter()
            .enumerate()
            .map(|(i, (capacity, slots, accepts))| {
                let mut held = 0;
                let slots = TARGETS
                    .iter()
                    .zip(slots)
                    .filter_map(|(target, slot)| {
                        let (mut state, in_flight, idle, stays) = slot?;
                        if state.holds_a_place() {
                            held += 1;
                            if held > capacity {
                                state = LoadState::Unloaded;
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

/// Applies `steps` to `engines`, checking each unload and eviction is allowed before it.
fn apply_checked(
    engines: &mut [Engine],
    steps: &[Step],
    policies: &BTreeMap<ModelName, ModelPolicy>,
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
                Some(model.target.clone()),
            ),
        };
        let index = engines
            .iter()
            .position(|e| &e.node == node && &e.adapter == adapter)
            .unwrap();
        if let Some(victim) = &evict {
            prop_assert!(
                super::plan::may_make_room(engines, index, victim, policies),
                "{step:?} unloads what it may not"
            );
            engines[index].slots.get_mut(victim).unwrap().state = LoadState::Unloaded;
        }
        if matches!(step, Step::Load { .. }) {
            let engine = &mut engines[index];
            prop_assert!(engine.accepts_loads);
            let slot = engine.slots.get_mut(target).unwrap();
            prop_assert!(!slot.state.holds_a_place());
            slot.state = LoadState::Loading;
            let held = engine
                .slots
                .values()
                .filter(|s| s.state.holds_a_place())
                .count();
            prop_assert!(
                held <= engine.capacity as usize,
                "{step:?} overfills {}",
                engine.node
            );
        }
    }
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
        apply_checked(&mut engines, &steps, &policies)?;
    }

    #[test]
    fn cold_loads_never_evict_what_they_may_not_and_serve_older_requests_first(
        (pool, policies) in arb_pool().prop_flat_map(|pool| {
            let nodes = pool.len();
            (Just(pool), arb_policies(nodes))
        }),
        order in Just(TARGETS.to_vec()).prop_shuffle(),
    ) {
        let demands: Vec<_> = order.iter().map(|t| (model(t), vec![])).collect();
        let (steps, unplaced) = plan_cold(&pool, &demands, &policies, Instant::now());
        let mut engines = pool.clone();
        apply_checked(&mut engines, &steps, &policies)?;
        // A younger request never took a place with room that an older, unplaced one could
        // have used.
        for (older, why) in &unplaced {
            let rank = order.iter().position(|t| *t == older.target.as_str()).unwrap();
            for step in &steps {
                let Step::Load { node, model, evict: None, .. } = step else { continue };
                let younger = order.iter().position(|t| *t == model.target.as_str()).unwrap();
                let usable = pool.iter().any(|e| &e.node == node && e.could_load(older));
                prop_assert!(!(younger > rank && usable && *why == NoPlace::Full), "{older} waited while {model} took a place on {node}");
            }
        }
    }
}
