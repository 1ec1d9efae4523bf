//! Event fan-out: publishing into a `SinkSet` of queued null sinks, and formatting an event
//! as the stdout (text) and file (JSON) sinks write it.

use std::hint::black_box;
use std::sync::Arc;

use criterion::{Criterion, criterion_group, criterion_main};
use edge::components::{SinkSet, build_sinks};
use edge::components::{write_json_line, write_text_line};
use edge::domain::EdgeId;
use edge::domain::{AdapterName, EventOrigin, NodeId, RunEvent, RunEventKind, RunId, Target};
use edge::ports::EventSink;
use edge::settings::{EventsConfig, SinkKind};

fn event() -> RunEvent {
    RunEvent {
        run_id: RunId::new("run-1a2b3c4d-000042"),
        node: Some(NodeId::parse("node-a").unwrap()),
        adapter: AdapterName::parse("echo").unwrap(),
        target: Target::parse("default").unwrap(),
        seq: 7,
        origin: EventOrigin::Node,
        kind: RunEventKind::text("0123456789abcdef0123456789abcdef"),
        route: None,
    }
}

fn fanout(c: &mut Criterion) {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let event = Arc::new(event());
    let mut group = c.benchmark_group("fanout");
    for sinks in [1usize, 3] {
        let built = runtime.block_on(async {
            let config = EventsConfig {
                sinks: vec![SinkKind::Null; 1],
                queue_capacity: 1 << 20,
                ..EventsConfig::default()
            };
            build_sinks(&config, &EdgeId::parse("bench").unwrap()).unwrap()
        });
        // Duplicate kinds are refused by the builder, so the set repeats one null sink.
        let set = SinkSet::new((0..sinks).map(|_| Arc::clone(&built[0].sink)).collect());
        group.bench_function(format!("publish_to_{sinks}_null_sinks"), |b| {
            b.iter(|| set.publish(Arc::clone(&event)));
        });
        runtime.block_on(set.flush());
    }
    group.finish();

    let mut group = c.benchmark_group("format");
    let mut out = Vec::with_capacity(4096);
    group.bench_function("text_line", |b| {
        b.iter(|| {
            out.clear();
            write_text_line(&event, &mut out);
            black_box(out.len());
        });
    });
    group.bench_function("json_line", |b| {
        b.iter(|| {
            out.clear();
            write_json_line(&event, &mut out);
            black_box(out.len());
        });
    });
    group.finish();
}

criterion_group!(benches, fanout);
criterion_main!(benches);
