//! Frame encode/decode: the codec work per event on both ends of a node connection.

use std::collections::BTreeMap;
use std::hint::black_box;

use bytes::{Bytes, BytesMut};
use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use edge::client::{NodeFrame, run_event};
use edge::domain::{AdapterName, RunEventKind, RunId, Target};
use edge::ports::{NodeCommand, RunAssignment};
use edge::wire::{EdgeCodec, EdgeFrame, NodeCodec};
use tokio_util::codec::{Decoder, Encoder};

const MAX: usize = 4 * 1024 * 1024;
const BATCH: usize = 64;

/// An output event of 32 bytes of text, as a node sends it.
fn output(seq: u64) -> NodeFrame {
    run_event(
        "run-1a2b3c4d-000042",
        seq,
        RunEventKind::text("0123456789abcdef0123456789abcdef"),
    )
}

fn encoded_batch() -> BytesMut {
    let mut codec = NodeCodec::new(MAX);
    let mut buf = BytesMut::new();
    for seq in 1..=BATCH as u64 {
        codec.encode(output(seq), &mut buf).unwrap();
    }
    buf
}

fn run_request() -> EdgeFrame {
    EdgeFrame::Command(NodeCommand::Run(RunAssignment {
        run_id: RunId::new("run-1a2b3c4d-000042"),
        adapter: AdapterName::parse("echo").unwrap(),
        target: Target::parse("default").unwrap(),
        input: Bytes::from_static(br#"{"messages":[{"role":"user","content":"hello there"}]}"#),
        content_type: "application/json".into(),
        params: BTreeMap::new(),
        deadline_ms: 30_000,
        operation: edge::domain::Operation::Unspecified,
        continuation: None,
        lora: None,
    }))
}

fn frames(c: &mut Criterion) {
    let mut group = c.benchmark_group("frames");
    group.throughput(Throughput::Elements(BATCH as u64));
    let batch = encoded_batch();
    group.bench_function("edge_decode_64_output_events", |b| {
        let mut codec = EdgeCodec::new(MAX);
        b.iter(|| {
            let mut buf = batch.clone();
            let mut n = 0;
            while let Some(frame) = codec.decode(&mut buf).unwrap() {
                black_box(frame);
                n += 1;
            }
            assert_eq!(n, BATCH);
        });
    });
    group.bench_function("node_encode_64_output_events", |b| {
        let mut codec = NodeCodec::new(MAX);
        let mut buf = BytesMut::with_capacity(8 * 1024);
        b.iter(|| {
            buf.clear();
            for seq in 1..=BATCH as u64 {
                codec.encode(output(seq), &mut buf).unwrap();
            }
            black_box(buf.len());
        });
    });
    group.finish();

    let mut group = c.benchmark_group("frames");
    group.throughput(Throughput::Elements(1));
    group.bench_function("edge_encode_run_request", |b| {
        let mut codec = EdgeCodec::new(MAX);
        let mut buf = BytesMut::with_capacity(1024);
        let frame = run_request();
        b.iter(|| {
            buf.clear();
            codec.encode(frame.clone(), &mut buf).unwrap();
            black_box(buf.len());
        });
    });
    group.finish();
}

criterion_group!(benches, frames);
criterion_main!(benches);
