//! `slow-consumer`: a node registers and then never reads its socket again while the edge is
//! offered large runs for it, one at a time; how much the edge's memory grows before it
//! closes the node as a slow consumer, against what buffering every offered run would take.
//!
//! The edge runs in this process (nothing else here allocates while the runs are offered),
//! so the process's resident set is the edge's. This is the measurement the integration
//! tests cannot make: they share one process.

use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use bytes::Bytes;
use clap::Args;
use edge::client::{NodeClient, Registration};
use edge::domain::{AdapterName, NodeSelector, Operation, RunSpec, Target};
use edge::ports::CloseReason;
use edge::ports::StartError;
use edge::settings::SinkKind;

use crate::Common;
use crate::harness::{self, ADAPTER, InProcessEdge, Nodes, TARGET};
use crate::stats::Record;

#[derive(Debug, Clone, Args)]
pub struct SlowArgs {
    /// Runs offered to the node that does not read, at most.
    #[arg(long, default_value_t = 256)]
    pub runs: usize,
    /// Input bytes of each run.
    #[arg(long, default_value_t = 1024 * 1024)]
    pub run_bytes: usize,
    /// The edge's `server.outbound_queue` (commands queued per node).
    #[arg(long, default_value_t = 4)]
    pub outbound_queue: usize,
    /// The edge's `server.write_timeout_ms`.
    #[arg(long, default_value_t = 200)]
    pub write_timeout_ms: u64,
    /// Pause between offers, so the socket's buffers fill before the queue does.
    #[arg(long, default_value_t = 5)]
    pub pause_ms: u64,
}

pub fn run(args: &SlowArgs, common: &Common) -> anyhow::Result<Vec<Record>> {
    harness::init_logging(common);
    let nodes = Nodes {
        count: 1,
        max_concurrent_runs: u32::try_from(args.runs).unwrap_or(u32::MAX).max(1),
        heartbeat_interval_ms: 60_000,
    };
    let extra = format!(
        "[server]\noutbound_queue = {}\nwrite_timeout_ms = {}\n",
        args.outbound_queue, args.write_timeout_ms
    );
    let edge = InProcessEdge::start(
        &harness::config(nodes, &extra),
        &[SinkKind::Null],
        common.edge_threads,
    )?;
    let result = edge.runtime.block_on(offer(&edge, args));
    edge.stop();
    result.map(|record| vec![record])
}

async fn offer(edge: &InProcessEdge, args: &SlowArgs) -> anyhow::Result<Record> {
    // Registers, then holds the connection without reading it (and without closing it).
    let mut node = NodeClient::connect(edge.node_addr).await?;
    let outcome = node
        .register(Registration::with_token(&harness::token(0)))
        .await?;
    if !outcome.accepted {
        bail!("the node was refused: {}", outcome.message);
    }
    let pid = std::process::id();
    let rss_before = harness::rss_kib(pid)?;
    let mut rss_peak = rss_before;
    let input = Bytes::from(vec![b'x'; args.run_bytes]);
    let started = Instant::now();
    let mut offered = 0usize;
    while offered < args.runs {
        match edge.parts.runs.start(spec(&input)?) {
            // The caller's stream is dropped: the run goes on, its events reach the sink.
            Ok(_handle) => offered += 1,
            Err(StartError::NoNode(_)) => break,
            Err(other) => bail!("unexpected refusal: {other}"),
        }
        rss_peak = rss_peak.max(harness::rss_kib(pid)?);
        tokio::time::sleep(Duration::from_millis(args.pause_ms)).await;
    }
    let stats = edge.parts.transport.stats();
    let closed = stats.closed(CloseReason::SlowConsumer);
    drop(node);
    let offered_mib = (offered * args.run_bytes) as f64 / (1024.0 * 1024.0);
    Ok(Record::new(format!(
        "runs={} run_bytes={} outbound_queue={}",
        args.runs, args.run_bytes, args.outbound_queue
    ))
    .with("offered_runs", offered as f64)
    .with("offered_mib", offered_mib)
    .with(
        "rss_growth_mib",
        rss_peak.saturating_sub(rss_before) as f64 / 1024.0,
    )
    .with("closed_as_slow_consumer", closed as f64)
    .with("seconds_to_close", started.elapsed().as_secs_f64()))
}

fn spec(input: &Bytes) -> anyhow::Result<RunSpec> {
    Ok(RunSpec {
        selector: NodeSelector {
            adapter: AdapterName::parse(ADAPTER).context("adapter")?,
            target: Target::parse(TARGET).context("target")?,
            pin: Some("lg-000000".to_owned()),
        },
        input: input.clone(),
        content_type: "text/plain; charset=utf-8".into(),
        params: Default::default(),
        deadline: None,
        operation: Operation::Unspecified,
        routing: Default::default(),
    })
}
