//! Node selection over 10,000 connected nodes (`edge::domain::select_node`).

use std::collections::BTreeMap;
use std::hint::black_box;
use std::sync::Arc;

use criterion::{Criterion, criterion_group, criterion_main};
use edge::domain::{
    AdapterConfig, AdapterName, Alias, NodeId, NodeLoad, NodeRecord, NodeSelector, RuntimeConfig,
    Target, Token, select_node,
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

criterion_group!(benches, selection);
criterion_main!(benches);
