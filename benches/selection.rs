//! Node selection over 10,000 connected nodes: today's `edge::domain::select_node` next to
//! the routing decision (`edge::domain::routing::decide`) with affinity, breakers, drain and
//! availability on, measured in the same run.

use std::collections::BTreeMap;
use std::hint::black_box;
use std::sync::Arc;

use std::time::{Duration, Instant};

use criterion::{Criterion, criterion_group, criterion_main};
use edge::domain::routing::{
    AffinityKey, BreakerBook, Catalog, Decision, KeySource, LoadFactor, NodeStatus, Outcome,
    RouteContext, RouteRequest, Tried, decide,
};
use edge::domain::{
    AdapterConfig, AdapterName, Alias, Availability, NodeId, NodeLoad, NodeRecord, NodeSelector,
    RuntimeConfig, Target, Token, select_node,
};

const NODES: usize = 10_000;

/// `NODES` nodes serving `echo/default`, every hundredth also `echo/rare`, with loads 0..4.
fn nodes() -> Vec<NodeLoad> {
    (0..NODES)
        .map(|i| {
            let mut targets = vec![Target::parse("default").unwrap()];
            if i % 100 == 0 {
                targets.push(Target::parse("rare").unwrap());
            }
            NodeLoad {
                record: Arc::new(NodeRecord::new(
                    NodeId::parse(&format!("node-{i:05}")).unwrap(),
                    Alias::parse(&format!("gpu-{i:05}")).unwrap(),
                    Token::new(format!("token-{i}")).digest(),
                    vec![
                        AdapterConfig::new(
                            AdapterName::parse("echo").unwrap(),
                            targets,
                            BTreeMap::new(),
                        )
                        .unwrap(),
                    ],
                    RuntimeConfig::new(4, 5_000, BTreeMap::new()).unwrap(),
                )),
                active_runs: (i % 4) as u32,
            }
        })
        .collect()
}

fn selector(target: &str, pin: Option<&str>) -> NodeSelector {
    NodeSelector {
        adapter: AdapterName::parse("echo").unwrap(),
        target: Target::parse(target).unwrap(),
        pin: pin.map(str::to_owned),
    }
}

fn selection(c: &mut Criterion) {
    let nodes = nodes();
    let mut group = c.benchmark_group("select_node_10k");
    let mut turn = 0u64;
    let all = selector("default", None);
    group.bench_function("all_serve", |b| {
        b.iter(|| {
            turn += 1;
            black_box(select_node(&nodes, &all, turn).unwrap());
        });
    });
    let rare = selector("rare", None);
    group.bench_function("one_in_100_serves", |b| {
        b.iter(|| {
            turn += 1;
            black_box(select_node(&nodes, &rare, turn).unwrap());
        });
    });
    let pinned = selector("default", Some("gpu-09999"));
    group.bench_function("pinned_by_alias", |b| {
        b.iter(|| black_box(select_node(&nodes, &pinned, 0).unwrap()));
    });
    group.finish();
}

/// The same nodes as routing sees them, with routing's filters busy: every 10th node has
/// reported availability (still listing both targets), every 100th (offset by 25) is drained,
/// and every 100th (offset by 50) has an open breaker.
fn statuses(loads: &[NodeLoad], now: Instant) -> (Vec<NodeStatus>, BreakerBook) {
    let echo = AdapterName::parse("echo").unwrap();
    let reported = Arc::new(Availability::new(
        ["default", "rare"].map(|t| (echo.clone(), Target::parse(t).unwrap())),
    ));
    let mut breakers = BreakerBook::default();
    let statuses = loads
        .iter()
        .enumerate()
        .map(|(i, load)| {
            let mut status = NodeStatus::from(load);
            if i % 10 == 0 {
                status.availability = Some(Arc::clone(&reported));
            }
            status.drained = i % 100 == 25;
            if i % 100 == 50 {
                for _ in 0..3 {
                    let (admission, _) = breakers
                        .admit(status.hash, status.record.id(), now)
                        .unwrap();
                    breakers.record(
                        status.hash,
                        status.record.id(),
                        admission,
                        Outcome::NodeFailure,
                        now,
                    );
                }
            }
            status
        })
        .collect();
    (statuses, breakers)
}

fn routing(c: &mut Criterion) {
    let loads = nodes();
    let now = Instant::now() + Duration::from_secs(1);
    let (statuses, breakers) = statuses(&loads, now - Duration::from_secs(1));
    let catalog = Catalog::new(loads.iter().map(|l| Arc::clone(&l.record)));
    let tried = Tried::default();
    let mut group = c.benchmark_group("route_10k");
    let mut turn = 0u64;
    let all = selector("default", None);
    group.bench_function("select_node_today", |b| {
        b.iter(|| {
            turn += 1;
            black_box(select_node(&loads, &all, turn).unwrap());
        });
    });
    let plain: Vec<NodeStatus> = loads.iter().map(NodeStatus::from).collect();
    let no_breakers = BreakerBook::default();
    group.bench_function("decide_least_busy_no_filters", |b| {
        b.iter(|| {
            turn += 1;
            let request = RouteRequest {
                selector: &all,
                affinity: None,
                tried: &tried,
            };
            let ctx = RouteContext {
                catalog: &catalog,
                breakers: &no_breakers,
                load_factor: LoadFactor::default(),
                now,
                turn,
            };
            black_box(decide(&plain, &request, &ctx));
        });
    });
    let place = |selector: &NodeSelector, keyed: bool, turn: u64| {
        let key = keyed.then(|| {
            AffinityKey::from_client(KeySource::Session, &format!("session-{}", turn % 1000))
                .unwrap()
        });
        let request = RouteRequest {
            selector,
            affinity: key,
            tried: &tried,
        };
        let ctx = RouteContext {
            catalog: &catalog,
            breakers: &breakers,
            load_factor: LoadFactor::default(),
            now,
            turn,
        };
        let decision = decide(&statuses, &request, &ctx);
        assert!(matches!(decision, Decision::Place { .. }));
        black_box(decision);
    };
    group.bench_function("decide_least_busy", |b| {
        b.iter(|| {
            turn += 1;
            place(&all, false, turn);
        });
    });
    group.bench_function("decide_affinity", |b| {
        b.iter(|| {
            turn += 1;
            place(&all, true, turn);
        });
    });
    let rare = selector("rare", None);
    group.bench_function("decide_affinity_one_in_100_serves", |b| {
        b.iter(|| {
            turn += 1;
            place(&rare, true, turn);
        });
    });
    group.finish();
}

criterion_group!(benches, selection, routing);
criterion_main!(benches);
