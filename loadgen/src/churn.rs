//! `churn`: mock nodes that drop their connection at random and come back within a few
//! hundred milliseconds while streamed chat completions run a few at a time (issue 19's
//! scenario). Reports the share of requests answered whole, next to the share of runs a
//! dying node cut after their first output — the ones failover before the first output
//! cannot save — and every other ending, by kind.
//!
//! The driver is the one `tests/it/routing.rs` asserts with (`edge_mock_node::churn`);
//! here it runs against an in-process edge in a release build, for the figure in
//! `docs/benchmarks.md` ("Routing under churn").

use edge_mock_node::churn as driver;

use std::time::{Duration, Instant};

use clap::Args;
use edge::settings::SinkKind;

use crate::Common;
use crate::harness::{self, InProcessEdge, Nodes};
use crate::stats::Record;
use driver::{Churn, Ending};

#[derive(Debug, Clone, Args)]
pub struct ChurnArgs {
    /// Churning nodes.
    #[arg(long, default_value_t = 4)]
    pub nodes: usize,
    /// Runs each node takes at once.
    #[arg(long, default_value_t = 4)]
    pub slots: u32,
    /// Streamed chat requests in all.
    #[arg(long, default_value_t = 300)]
    pub requests: usize,
    /// Requests in flight at once.
    #[arg(long, default_value_t = 16)]
    pub concurrency: usize,
    /// Words per answer.
    #[arg(long, default_value_t = 8)]
    pub words: usize,
    /// The nodes' pause between two words, in ms.
    #[arg(long, default_value_t = 5)]
    pub word_delay_ms: u64,
    /// Shortest and longest stay of a node between drops, in ms.
    #[arg(long, num_args = 2, default_values_t = [150, 600])]
    pub up_ms: Vec<u64>,
    /// Shortest and longest absence of a node after a drop, in ms.
    #[arg(long, num_args = 2, default_values_t = [20, 300])]
    pub down_ms: Vec<u64>,
    /// Seeds the nodes' schedules.
    #[arg(long, default_value_t = 19)]
    pub seed: u64,
}

/// `[a, b]` as the range `a..b` (at least one wide).
fn range(bounds: &[u64]) -> std::ops::Range<u64> {
    let low = bounds.first().copied().unwrap_or(0);
    let high = bounds.get(1).copied().unwrap_or(low).max(low + 1);
    low..high
}

pub fn run(args: &ChurnArgs, common: &Common) -> anyhow::Result<Vec<Record>> {
    harness::init_logging(common);
    let nodes = Nodes {
        count: args.nodes.max(1),
        max_concurrent_runs: args.slots.max(1),
        heartbeat_interval_ms: 60_000,
    };
    let edge = InProcessEdge::start(
        &harness::config(nodes, ""),
        &[SinkKind::Null],
        common.edge_threads,
    )?;
    let load = harness::runtime("load", common.load_threads)?;
    let plan = Churn {
        node_addr: edge.node_addr,
        http_addr: edge.http_addr,
        tokens: (0..nodes.count).map(harness::token).collect(),
        model: format!("{}/{}", harness::ADAPTER, harness::TARGET),
        requests: args.requests,
        concurrency: args.concurrency,
        words: args.words,
        word_delay: Duration::from_millis(args.word_delay_ms),
        up_ms: range(&args.up_ms),
        down_ms: range(&args.down_ms),
        seed: args.seed,
    };
    let started = Instant::now();
    let report = load.block_on(driver::run(&plan));
    let elapsed = started.elapsed();
    edge.stop();

    let total = report.answers.len().max(1) as f64;
    let share = |n: usize| n as f64 / total;
    let stream_errors = report.count(|e| matches!(e, Ending::StreamError { .. }));
    let server_errors =
        report.count(|e| matches!(e, Ending::Refused { status, .. } if *status >= 500));
    let other = report.count(|e| {
        matches!(e, Ending::Broken(_))
            || matches!(e, Ending::Refused { status, .. } if *status < 500)
    });
    let key = format!(
        "nodes={} requests={} c={}",
        nodes.count, args.requests, args.concurrency
    );
    Ok(vec![
        Record::new(key)
            .with("completed_share", share(report.completed()))
            .with("cut_after_output_share", share(report.cut_after_output()))
            .with("stream_errors", stream_errors as f64)
            .with("http_5xx", server_errors as f64)
            .with("http_404", report.refused_with(404) as f64)
            .with("other_endings", other as f64)
            .with("node_drops", report.drops as f64)
            .with("elapsed_s", elapsed.as_secs_f64()),
    ])
}
