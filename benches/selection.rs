//! Routing over 10,000 connected nodes: the placement decision
//! (`edge::domain::routing::decide`) without filters, with availability, drain and breakers
//! busy, and with affinity keys; and the whole placement read as the run service does it
//! (`Registry::statuses_serving` of a `LockRegistry`, then `decide`). The figures from before
//! routing (`select_node`, since removed) are in `docs/benchmarks.md`.

use std::collections::BTreeMap;
use std::hint::black_box;
use std::sync::Arc;

use std::time::{Duration, Instant};

use criterion::{Criterion, criterion_group, criterion_main};
use edge::components::LockRegistry;
use edge::domain::routing::{
    AffinityKey, BreakerBook, Catalog, Decision, KeySource, LoadFactor, NodeStatus, Outcome,
    RouteContext, RouteRequest, Tried, decide,
};
use edge::domain::{
    AdapterConfig, AdapterName, Alias, Availability, NodeId, NodeRecord, NodeSelector,
    RuntimeConfig, Target, Token,
};
use edge::ports::{LastFrame, LinkError, NewConnection, NodeCommand, NodeLink, Registry};

const NODES: usize = 10_000;

/// `NODES` nodes serving `echo/default`, every hundredth also `echo/rare`, with loads 0..4.
fn nodes() -> Vec<NodeStatus> {
    (0..NODES)
        .map(|i| {
            let mut targets = vec![Target::parse("default").unwrap()];
            if i % 100 == 0 {
                targets.push(Target::parse("rare").unwrap());
            }
            NodeStatus::new(
                Arc::new(NodeRecord::new(
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
                (i % 4) as u32,
            )
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

/// The same nodes as routing sees them, with routing's filters busy: every 10th node has
/// reported availability (still listing both targets), every 100th (offset by 25) is drained,
/// and every 100th (offset by 50) has an open breaker.
fn statuses(loads: &[NodeStatus], now: Instant) -> (Vec<NodeStatus>, BreakerBook) {
    let echo = AdapterName::parse("echo").unwrap();
    let reported = Arc::new(Availability::new(
        ["default", "rare"].map(|t| (echo.clone(), Target::parse(t).unwrap())),
    ));
    let mut breakers = BreakerBook::default();
    let statuses = loads
        .iter()
        .enumerate()
        .map(|(i, load)| {
            let mut status = load.clone();
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

#[allow(
    clippy::too_many_lines,
    reason = "one benchmark group: each case's setup sits beside the measurement it feeds"
)]
fn routing(c: &mut Criterion) {
    let loads = nodes();
    let now = Instant::now() + Duration::from_secs(1);
    let (statuses, breakers) = statuses(&loads, now - Duration::from_secs(1));
    let catalog = Catalog::new(loads.iter().map(|l| Arc::clone(&l.record)));
    let tried = Tried::default();
    let mut group = c.benchmark_group("route_10k");
    let mut turn = 0u64;
    let all = selector("default", None);
    let plain = loads.clone();
    let no_breakers = BreakerBook::default();
    group.bench_function("decide_least_busy_no_filters", |b| {
        b.iter(|| {
            turn += 1;
            let request = RouteRequest {
                selector: &all,
                affinity: None,
                tried: &tried,
                operation: edge::domain::Operation::Chat,
            };
            let ctx = RouteContext {
                catalog: &catalog,
                breakers: &no_breakers,
                load_factor: LoadFactor::default(),
                now,
                turn,
                model_seats: &[],
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
            operation: edge::domain::Operation::Chat,
        };
        let ctx = RouteContext {
            catalog: &catalog,
            breakers: &breakers,
            load_factor: LoadFactor::default(),
            now,
            turn,
            model_seats: &[],
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

/// A link that takes every command: the registry needs one per node.
struct NullLink;

impl NodeLink for NullLink {
    fn send(&self, _command: NodeCommand) -> Result<(), LinkError> {
        Ok(())
    }

    fn supersede(&self) {}
}

/// The whole read of a placement as the run service makes it: the registry's statuses of
/// the connected nodes serving the route (all 10,000, or one in 100), then `decide` with an
/// affinity key (the run service holds its breakers, so none are open here).
fn placement(c: &mut Criterion) {
    let loads = nodes();
    let registry = LockRegistry::new();
    for (i, node) in loads.iter().enumerate() {
        let connection = NewConnection {
            record: Arc::clone(&node.record),
            connection: i as u64,
            peer: std::net::SocketAddr::from(([127, 0, 0, 1], 9_000)),
            node_version: "bench".into(),
            link: Arc::new(NullLink),
            instance_id: String::new(),
            last_frame: Arc::new(LastFrame::new(std::time::Instant::now())),
            reserved_runs: 0,
            can_continue: false,
            operations: edge::domain::DeclaredOperations::default(),
            can_manage_models: false,
            inventory: None,
        };
        registry.insert(connection).unwrap();
        registry.adjust_active_runs(node.record.id(), i as u64, node.active_runs as i32);
    }
    let catalog = Catalog::new(loads.iter().map(|l| Arc::clone(&l.record)));
    let breakers = BreakerBook::default();
    let tried = Tried::default();
    let mut group = c.benchmark_group("place_10k");
    let mut turn = 0u64;
    for (name, target) in [
        ("statuses_then_decide_affinity", "default"),
        ("statuses_then_decide_affinity_one_in_100_serves", "rare"),
    ] {
        let route = selector(target, None);
        group.bench_function(name, |b| {
            b.iter(|| {
                turn += 1;
                let statuses = registry.statuses_serving(&route.adapter, &route.target);
                let key =
                    AffinityKey::from_client(KeySource::Session, &format!("s-{}", turn % 1000));
                let request = RouteRequest {
                    selector: &route,
                    affinity: key,
                    tried: &tried,
                    operation: edge::domain::Operation::Chat,
                };
                let ctx = RouteContext {
                    catalog: &catalog,
                    breakers: &breakers,
                    load_factor: LoadFactor::default(),
                    now: Instant::now(),
                    turn,
                    model_seats: &[],
                };
                black_box(decide(&statuses, &request, &ctx));
            });
        });
    }
    group.finish();
}

criterion_group!(benches, routing, placement);
criterion_main!(benches);
