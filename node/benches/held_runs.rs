//! The node's resume buffer on the writer's path: what one event of an open run costs to
//! hold and hand to the writer (`Buffers::push` then `take_unsent`) while other runs that
//! ended wait for the edge's acknowledgement. An acknowledging edge answers a ping each
//! heartbeat (5 s as shipped), so at 1,000 runs/s a node holds some 5,000 of them; the
//! writer's cost must not grow with that number (docs/benchmarks.md, "The node's held runs").

use std::hint::black_box;

use criterion::{BenchmarkId, Criterion, criterion_group, criterion_main};
use edge::domain::RunEventKind;
use edge_node::BufferLimits;
use edge_node::buffer::Buffers;

/// Buffers behind an acknowledging edge holding `ended` runs that ended and were written but
/// not yet acknowledged, and one open run; the next write batch's number.
fn holding(ended: usize) -> (Buffers, u64) {
    let mut buffers = Buffers::new(BufferLimits::default());
    buffers.link_up(true);
    buffers.acknowledged(0);
    let mut batch = 0;
    for n in 0..ended {
        let run_id = format!("ended-{n}");
        let _stop = buffers.admit(&run_id, usize::MAX);
        for kind in [
            RunEventKind::Started,
            RunEventKind::text("a few words"),
            RunEventKind::cancelled("done"),
        ] {
            buffers.push(&run_id, &mut Some(kind));
        }
        batch += 1;
        buffers.take_unsent(batch, 64);
    }
    let _stop = buffers.admit("open", usize::MAX);
    (buffers, batch)
}

fn event_of_an_open_run(c: &mut Criterion) {
    let mut group = c.benchmark_group("node_buffer/event_while_runs_await_ack");
    for ended in [0, 1_000, 5_000] {
        let (mut buffers, mut batch) = holding(ended);
        group.bench_function(BenchmarkId::from_parameter(ended), |b| {
            b.iter(|| {
                buffers.push("open", &mut Some(RunEventKind::text("token")));
                batch += 1;
                black_box(buffers.take_unsent(batch, 64));
            });
        });
    }
    group.finish();
}

criterion_group!(benches, event_of_an_open_run);
criterion_main!(benches);
