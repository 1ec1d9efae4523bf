//! The placement cases, filters, pins, failover, and least busy without a key.

use super::*;

#[test]
fn tells_unknown_from_unavailable_from_busy() {
    let a = status("a", &["t"], 1, 1);
    let offline = status("b", &["u"], 1, 0);
    let setup = Setup::new(Catalog::new([
        Arc::clone(&a.record),
        Arc::clone(&offline.record),
    ]));
    let nodes = [a];
    assert!(matches!(
        setup.decide(&nodes, &want("nope", None), None, 0),
        Decision::Refuse(Unroutable::UnknownRoute { .. })
    ));
    // `u` is configured on a node that is not connected: wait for it.
    assert_eq!(
        setup.decide(&nodes, &want("u", None), None, 0),
        Decision::Wait {
            cause: WaitCause::NoNodeAvailable,
            filtered: Filtered::default()
        }
    );
    let busy = setup.decide(&nodes, &want("t", None), None, 0);
    assert!(matches!(
        busy,
        Decision::Wait { cause: WaitCause::AllBusy, filtered } if filtered.full == 1 && filtered.serving == 1
    ));
}

#[test]
fn availability_drain_and_breakers_filter_with_counts() {
    let mut reported = status("a", &["t", "u"], 2, 0);
    reported.availability = Some(Arc::new(Availability::new([pair("u")])));
    let mut drained = status("b", &["t"], 2, 0);
    drained.drained = true;
    let tripped = status("c", &["t"], 2, 0);
    let nodes = [reported, drained, tripped];
    let mut setup = Setup::new(catalog_of(&nodes));
    setup.trip("c");
    let Decision::Wait { cause, filtered } = setup.decide(&nodes, &want("t", None), None, 0) else {
        panic!("expected a wait");
    };
    assert_eq!(cause, WaitCause::NoNodeAvailable);
    assert_eq!(
        (
            filtered.serving,
            filtered.unavailable,
            filtered.drained,
            filtered.breaker_open
        ),
        (3, 1, 1, 1)
    );
    // The reported availability is honoured both ways.
    assert_eq!(
        placed(&setup.decide(&nodes, &want("u", None), None, 0)),
        Some(0)
    );
    // After the cooldown the tripped node may take one probe.
    setup.now += Duration::from_secs(5);
    assert_eq!(
        placed(&setup.decide(&nodes, &want("t", None), None, 0)),
        Some(2)
    );
}

#[test]
fn a_node_whose_engine_runs_its_cap_of_the_model_is_full_for_that_model_only() {
    let a = status("a", &["t"], 4, 1);
    let b = status("b", &["t"], 4, 3);
    let nodes = [a, b];
    let mut setup = Setup::new(catalog_of(&nodes));
    let at = |running| {
        Some(ModelSeats {
            running,
            parallel: 1,
        })
    };
    // a runs one run of t with `parallel = 1`: b takes the next, though busier.
    setup.model_seats = vec![at(1), at(0)];
    assert_eq!(
        placed(&setup.decide(&nodes, &want("t", None), None, 0)),
        Some(1)
    );
    // Both at their cap: the run waits in the queue, as for busy nodes.
    setup.model_seats = vec![at(1), at(1)];
    assert!(matches!(
        setup.decide(&nodes, &want("t", None), None, 0),
        Decision::Wait { cause: WaitCause::AllBusy, filtered } if filtered.full == 2
    ));
    // Pinned, it waits for its node too.
    assert!(matches!(
        setup.decide(&nodes, &want("t", Some("a")), None, 0),
        Decision::Wait {
            cause: WaitCause::AllBusy,
            ..
        }
    ));
    // No cap (0) is no limit.
    setup.model_seats = vec![
        Some(ModelSeats {
            running: 9,
            parallel: 0,
        }),
        None,
    ];
    assert_eq!(
        placed(&setup.decide(&nodes, &want("t", None), None, 0)),
        Some(0)
    );
}

#[test]
fn pins() {
    let a = status("a", &["t"], 1, 0);
    let b = status("b", &["t"], 1, 1);
    let offline = status("c", &["t"], 1, 0);
    let mut setup = Setup::new(Catalog::new(
        [&a, &b, &offline].map(|n| Arc::clone(&n.record)),
    ));
    let nodes = [a, b];
    let d = setup.decide(&nodes, &want("t", Some("alias-a")), Some(key(1)), 0);
    assert!(matches!(d, Decision::Place { index: 0, reason } if reason.rule == RouteRule::Pinned));
    assert_eq!(
        setup.decide(&nodes, &want("t", Some("zzz")), None, 0),
        Decision::Refuse(Unroutable::UnknownNode { pin: "zzz".into() })
    );
    assert!(matches!(
        setup.decide(&nodes, &want("u", Some("a")), None, 0),
        Decision::Refuse(Unroutable::PinDoesNotServe { .. })
    ));
    assert!(matches!(
        setup.decide(&nodes, &want("t", Some("c")), None, 0),
        Decision::Wait {
            cause: WaitCause::NoNodeAvailable,
            ..
        }
    ));
    assert!(matches!(
        setup.decide(&nodes, &want("t", Some("b")), None, 0),
        Decision::Wait {
            cause: WaitCause::AllBusy,
            ..
        }
    ));
    setup.tried.push(NodeId::parse("a").unwrap());
    assert_eq!(
        setup.decide(&nodes, &want("t", Some("a")), None, 0),
        Decision::Refuse(Unroutable::Exhausted { tried: 1 })
    );
}

#[test]
fn failover_waits_only_for_configured_nodes_it_has_not_tried() {
    let a = status("a", &["t"], 4, 0);
    let b = status("b", &["t"], 4, 0);
    let mut setup = Setup::new(catalog_of(&[a.clone(), b]));
    setup.tried.push(NodeId::parse("a").unwrap());
    // `a` failed it (and may have left); `b` is configured and away: wait for it.
    for nodes in [vec![a.clone()], vec![]] {
        assert!(matches!(
            setup.decide(&nodes, &want("t", None), None, 0),
            Decision::Wait {
                cause: WaitCause::NoNodeAvailable,
                ..
            }
        ));
    }
    // Every configured node tried, connected or not: nothing to wait for.
    setup.tried.push(NodeId::parse("b").unwrap());
    for nodes in [vec![a.clone()], vec![]] {
        assert_eq!(
            setup.decide(&nodes, &want("t", None), None, 0),
            Decision::Refuse(Unroutable::Exhausted { tried: 2 })
        );
    }
    // A pinned run whose node left after its attempt does not wait for it.
    let mut pinned = Setup::new(catalog_of(&[a]));
    pinned.tried.push(NodeId::parse("a").unwrap());
    assert_eq!(
        pinned.decide(&[], &want("t", Some("a")), None, 0),
        Decision::Refuse(Unroutable::Exhausted { tried: 1 })
    );
}

#[test]
fn failover_excludes_tried_nodes_and_ends_when_none_is_left() {
    let nodes = [status("a", &["t"], 4, 0), status("b", &["t"], 4, 3)];
    let mut setup = Setup::new(catalog_of(&nodes));
    setup.tried.push(NodeId::parse("a").unwrap());
    let d = setup.decide(&nodes, &want("t", None), Some(key(7)), 0);
    let Decision::Place { index: 1, reason } = d else {
        panic!("expected b, got {d:?}");
    };
    assert_eq!((reason.attempt, reason.eligible), (2, 1));
    setup.tried.push(NodeId::parse("b").unwrap());
    assert_eq!(
        setup.decide(&nodes, &want("t", None), None, 0),
        Decision::Refuse(Unroutable::Exhausted { tried: 2 })
    );
    // With a drained node that might come back, the run waits instead.
    let mut nodes = nodes.to_vec();
    let mut c = status("c", &["t"], 4, 0);
    c.drained = true;
    nodes.push(c);
    assert!(matches!(
        setup.decide(&nodes, &want("t", None), None, 0),
        Decision::Wait {
            cause: WaitCause::NoNodeAvailable,
            ..
        }
    ));
}

#[test]
fn affinity_outcomes_are_explained() {
    let nodes: Vec<NodeStatus> = (0..4)
        .map(|i| status(&format!("n{i}"), &["t"], 4, 0))
        .collect();
    let mut setup = Setup::new(catalog_of(&nodes));
    let k = key(42);
    let home = placed(&setup.decide(&nodes, &want("t", None), Some(k), 0)).unwrap();
    let reason_of = |d: Decision| match d {
        Decision::Place { reason, .. } => reason,
        other => panic!("{other:?}"),
    };
    let hit = reason_of(setup.decide(&nodes, &want("t", None), Some(k), 0));
    assert_eq!(hit.label(), "affinity_hit");
    // Home over its bound: ⌈1.25 · (3 + 1) / 4⌉ = 2, and it holds 2 already.
    let mut loaded = nodes.clone();
    loaded[home].active_runs = 2;
    loaded[(home + 1) % 4].active_runs = 1;
    let over = reason_of(setup.decide(&loaded, &want("t", None), Some(k), 0));
    assert!(
        matches!(over.rule, RouteRule::Affinity { outcome: AffinityOutcome::Overloaded { rank }, .. } if rank >= 2)
    );
    // Home drained: a miss.
    let mut drained = nodes.clone();
    drained[home].drained = true;
    let miss = reason_of(setup.decide(&drained, &want("t", None), Some(k), 0));
    assert_eq!(miss.label(), "affinity_miss");
    setup.tried.push(nodes[home].record.id().clone());
    let retry = setup.decide(&nodes, &want("t", None), Some(k), 0);
    assert_ne!(placed(&retry), Some(home));
    assert_eq!(reason_of(retry).label(), "affinity_miss");
}

#[test]
fn wait_limits_follow_the_latest_cause() {
    let limits = WaitLimits::default();
    let at = Instant::now();
    assert_eq!(
        limits.expires(at, WaitCause::AllBusy),
        at + Duration::from_secs(30)
    );
    assert_eq!(
        limits.expires(at, WaitCause::NoNodeAvailable),
        at + Duration::from_secs(10)
    );
    assert_eq!(
        WaitCause::NoNodeAvailable.expiry_code(),
        "no_node_available"
    );
}

/// One connected node in a generated fleet.
#[derive(Debug, Clone)]
struct Gen {
    serves: [bool; 3],
    connected: bool,
    slots: u32,
    active: u32,
    drained: bool,
    reported: Option<[bool; 3]>,
    open: bool,
}

fn gen_node() -> impl Strategy<Value = Gen> {
    (
        any::<[bool; 3]>(),
        any::<bool>(),
        1u32..4,
        0u32..5,
        prop::bool::weighted(0.2),
        prop::option::weighted(0.3, any::<[bool; 3]>()),
        prop::bool::weighted(0.2),
    )
        .prop_map(
            |(serves, connected, slots, active, drained, reported, open)| Gen {
                serves,
                connected,
                slots,
                active: active.min(slots),
                drained,
                reported,
                open,
            },
        )
}

const TARGETS: [&str; 3] = ["t0", "t1", "t2"];

fn build(fleet: &[Gen]) -> (Vec<NodeStatus>, Setup) {
    let records: Vec<Arc<NodeRecord>> = fleet
        .iter()
        .enumerate()
        .map(|(i, g)| {
            let targets: Vec<&str> = (0..3)
                .filter(|&t| g.serves[t])
                .map(|t| TARGETS[t])
                .collect();
            record(&format!("n{i:02}"), &targets, g.slots)
        })
        .collect();
    let mut setup = Setup::new(Catalog::new(records.iter().cloned()));
    let mut nodes = Vec::new();
    for (g, r) in fleet.iter().zip(&records) {
        if !g.connected {
            continue;
        }
        let mut node = NodeStatus::new(Arc::clone(r), g.active);
        node.drained = g.drained;
        node.availability = g.reported.map(|on| {
            Arc::new(Availability::new(
                (0..3).filter(|&t| on[t]).map(|t| pair(TARGETS[t])),
            ))
        });
        if g.open {
            setup.trip(r.id().as_str());
        }
        nodes.push(node);
    }
    (nodes, setup)
}

proptest! {
    /// Unknown, configured-but-unavailable and all-busy are told apart exactly, and a placed
    /// run always lands on an eligible node with room.
    #[test]
    fn the_three_placement_cases(
        fleet in proptest::collection::vec(gen_node(), 0..10),
        target in 0usize..4,
        keyed in prop::option::of(any::<u64>()),
        turn in any::<u64>(),
    ) {
        let (nodes, setup) = build(&fleet);
        let name = ["t0", "t1", "t2", "t3"][target];
        let known = target < 3 && fleet.iter().any(|g| g.serves[target]);
        let eligible: Vec<usize> = fleet.iter().filter(|g| g.connected).enumerate()
            .filter(|(_, g)| target < 3 && g.serves[target] && !g.drained && !g.open
                && g.reported.is_none_or(|on| on[target]))
            .map(|(i, _)| i)
            .collect();
        let with_room: Vec<usize> = eligible.iter().copied()
            .filter(|&i| nodes[i].active_runs < nodes[i].slots()).collect();
        let decision = setup.decide(&nodes, &want(name, None), keyed.map(key), turn);
        match decision {
            Decision::Refuse(Unroutable::UnknownRoute { .. }) => prop_assert!(!known),
            Decision::Wait { cause: WaitCause::NoNodeAvailable, filtered } => {
                prop_assert!(known && eligible.is_empty());
                prop_assert_eq!(filtered.eligible(), 0);
            }
            Decision::Wait { cause: WaitCause::AllBusy, .. } => {
                prop_assert!(known && !eligible.is_empty() && with_room.is_empty());
            }
            Decision::Place { index, reason } => {
                prop_assert!(with_room.contains(&index));
                prop_assert_eq!(reason.eligible as usize, eligible.len());
            }
            other => prop_assert!(false, "unexpected {:?}", other),
        }
    }

    /// Failover never places a run on a node it tried, and never makes more than
    /// `max_attempts` attempts, whatever the attempts' endings.
    #[test]
    fn failover_never_repeats_a_node_or_exceeds_max_attempts(
        fleet in proptest::collection::vec(gen_node(), 1..8),
        ends in proptest::collection::vec(0usize..6, 10),
        keyed in prop::option::of(any::<u64>()),
        max in 1u32..5,
    ) {
        let (nodes, mut setup) = build(&fleet);
        let max = MaxAttempts::new(max).unwrap();
        let selector = want("t0", None);
        for end in ends {
            let index = match setup.decide(&nodes, &selector, keyed.map(key), 0) {
                Decision::Place { index, reason } => {
                    prop_assert_eq!(reason.attempt, setup.tried.attempts() + 1);
                    index
                }
                _ => break,
            };
            let id = nodes[index].record.id();
            prop_assert!(!setup.tried.contains(NodeHash::of(id), id));
            setup.tried.push(id.clone());
            prop_assert!(setup.tried.attempts() <= max.get());
            let end = [
                AttemptEnd::Failed(FailureClass::Node),
                AttemptEnd::Failed(FailureClass::Refused),
                AttemptEnd::Disconnected,
                AttemptEnd::Failed(FailureClass::Request),
                AttemptEnd::Failed(FailureClass::Unspecified),
                AttemptEnd::Completed,
            ][end];
            match after_attempt(end, false, &setup.tried, max, None) {
                Failover::Retry { attempt } => prop_assert_eq!(attempt, setup.tried.attempts() + 1),
                Failover::Final(_) => break,
            }
        }
    }

    /// On equal nodes with no key, no availability, drain or breaker, a run goes where the
    /// edge sent runs before routing (phase 1 checked this against the old `select_node`,
    /// since removed): the serving node with room and the fewest active runs, ties rotating
    /// with the turn in node order; nobody with room means all busy.
    #[test]
    fn keyless_runs_go_to_the_least_busy_node_with_ties_rotating(
        fleet in proptest::collection::vec((0u32..4, any::<bool>()), 1..20),
        turn in any::<u64>(),
    ) {
        let nodes: Vec<NodeStatus> = fleet.iter().enumerate().map(|(i, (active, serves))| {
            status(&format!("n{i:02}"), if *serves { &["t"] } else { &["u"] }, 3, (*active).min(3))
        }).collect();
        let setup = Setup::new(catalog_of(&nodes));
        let with_room: Vec<usize> = (0..nodes.len())
            .filter(|&i| fleet[i].1 && nodes[i].active_runs < 3)
            .collect();
        let least = with_room.iter().map(|&i| nodes[i].active_runs).min();
        let ties: Vec<usize> = with_room.iter().copied()
            .filter(|&i| Some(nodes[i].active_runs) == least).collect();
        let decision = setup.decide(&nodes, &want("t", None), None, turn);
        match decision {
            Decision::Place { index, .. } => {
                let expected = ties[usize::try_from(turn % ties.len() as u64).unwrap()];
                prop_assert_eq!(index, expected);
            }
            Decision::Wait { cause: WaitCause::AllBusy, .. } => {
                prop_assert!(ties.is_empty() && fleet.iter().any(|f| f.1));
            }
            Decision::Refuse(Unroutable::UnknownRoute { .. }) => {
                prop_assert!(fleet.iter().all(|f| !f.1));
            }
            other => prop_assert!(false, "unexpected {:?}", other),
        }
    }
}

#[test]
fn no_key_spreads_least_busy_by_slots() {
    // 1 of 4 slots busy (25 %) is less busy than 1 of 2 (50 %).
    let nodes = [status("a", &["t"], 2, 1), status("b", &["t"], 4, 1)];
    let setup = Setup::new(catalog_of(&nodes));
    for turn in 0..4 {
        assert_eq!(
            placed(&setup.decide(&nodes, &want("t", None), None, turn)),
            Some(1)
        );
    }
}
