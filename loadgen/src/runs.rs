//! `runs`: runs started through the run service and answered at once by lean nodes; runs
//! per second and run latency (start to terminal event at the caller), next to the raw
//! loopback round trip measured in the same process with the same runtimes and codecs: a
//! RunRequest frame written to the same kind of node, and its answer read back, with no
//! edge in between. The difference is what the edge adds.
//!
//! The callers run on the edge's runtime, where the HTTP API's handlers run; the nodes run
//! on the load runtime.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use bytes::Bytes;
use clap::Args;
use edge::AppParts;
use edge::domain::{
    AdapterConfig, AdapterName, Alias, NodeId, NodeRecord, NodeSelector, RunEventKind, RunId,
    RunSpec, RuntimeConfig, Target, Token,
};
use edge::ports::{NodeCommand, RunAssignment};
use edge::settings::SinkKind;
use edge::wire::{EdgeCodec, EdgeFrame, NodeFrame};
use futures::{SinkExt, StreamExt};
use tokio::net::TcpListener;
use tokio_util::codec::Framed;

use crate::Common;
use crate::harness::{self, InProcessEdge, Nodes};
use crate::lean::{self, Plan};
use crate::stats::{Histogram, Record};

#[derive(Debug, Clone, Args)]
pub struct RunsArgs {
    /// Runs in flight at once (each caller starts its next run when the last one ended).
    #[arg(long, default_value_t = 1)]
    pub concurrency: usize,
    /// Simulated nodes.
    #[arg(long, default_value_t = 1)]
    pub nodes: usize,
    /// Output events per run before the terminal one.
    #[arg(long, default_value_t = 0)]
    pub events: usize,
    /// Measured time, for the raw round trip and again for the runs.
    #[arg(long, default_value_t = 5_000)]
    pub duration_ms: u64,
    /// Unmeasured time before each.
    #[arg(long, default_value_t = 500)]
    pub warmup_ms: u64,
}

fn selector() -> anyhow::Result<NodeSelector> {
    Ok(NodeSelector {
        adapter: AdapterName::parse(harness::ADAPTER)?,
        target: Target::parse(harness::TARGET)?,
        pin: None,
    })
}

fn raw_record() -> anyhow::Result<Arc<NodeRecord>> {
    Ok(Arc::new(NodeRecord::new(
        NodeId::parse("raw")?,
        Alias::parse("raw-alias")?,
        Token::new("raw").digest(),
        vec![
            AdapterConfig::new(
                AdapterName::parse(harness::ADAPTER)?,
                vec![Target::parse(harness::TARGET)?],
                BTreeMap::new(),
            )
            .unwrap(),
        ],
        RuntimeConfig::new(1, 600_000, BTreeMap::new()).unwrap(),
    )))
}

/// The window flags every measuring loop reads.
struct Window {
    measuring: AtomicBool,
    stop: AtomicBool,
    done: AtomicU64,
}

impl Window {
    fn new() -> Arc<Self> {
        Arc::new(Self {
            measuring: AtomicBool::new(false),
            stop: AtomicBool::new(false),
            done: AtomicU64::new(0),
        })
    }

    /// Warms up, measures for `duration`, then stops the loops; returns the seconds
    /// measured and the operations done in them.
    fn run(&self, warmup: Duration, duration: Duration) -> (f64, u64) {
        std::thread::sleep(warmup);
        let done_0 = self.done.load(Ordering::Relaxed);
        self.measuring.store(true, Ordering::Relaxed);
        let started = Instant::now();
        std::thread::sleep(duration);
        self.measuring.store(false, Ordering::Relaxed);
        let done = self.done.load(Ordering::Relaxed) - done_0;
        let elapsed = started.elapsed().as_secs_f64();
        self.stop.store(true, Ordering::Relaxed);
        (elapsed, done)
    }
}

/// The edge side of the raw round trip: accepts one node, accepts its registration, then
/// sends RunRequests one at a time and reads each answer to its terminal event.
async fn raw_edge_side(listener: TcpListener, window: Arc<Window>) -> anyhow::Result<Histogram> {
    let (stream, _) = listener.accept().await?;
    stream.set_nodelay(true)?;
    let mut framed = Framed::new(stream, EdgeCodec::new(lean_max_frame()));
    match framed.next().await {
        Some(Ok(NodeFrame::Register(_))) => {}
        other => bail!("expected a register request, got {other:?}"),
    }
    framed
        .send(EdgeFrame::Accepted {
            record: raw_record()?,
            resumed: Vec::new(),
            acknowledges_pings: false,
        })
        .await?;
    let mut latency = Histogram::default();
    let mut n = 0u64;
    while !window.stop.load(Ordering::Relaxed) {
        n += 1;
        let assignment = RunAssignment {
            run_id: RunId::new(format!("raw-{n:06}")),
            adapter: AdapterName::parse(harness::ADAPTER)?,
            target: Target::parse(harness::TARGET)?,
            input: Bytes::new(),
            content_type: "text/plain; charset=utf-8".into(),
            params: BTreeMap::new(),
            deadline_ms: 0,
            operation: edge::domain::Operation::Unspecified,
            continuation: None,
            lora: None,
        };
        let begun = Instant::now();
        framed
            .send(EdgeFrame::Command(NodeCommand::Run(assignment)))
            .await?;
        loop {
            match framed.next().await {
                Some(Ok(NodeFrame::RunEvent(event))) if event.kind.is_terminal() => break,
                Some(Ok(_)) => {}
                Some(Err(error)) => return Err(error.into()),
                None => bail!("the raw node closed the connection"),
            }
        }
        if window.measuring.load(Ordering::Relaxed) {
            latency.record_duration(begun.elapsed());
            window.done.fetch_add(1, Ordering::Relaxed);
        }
    }
    Ok(latency)
}

fn lean_max_frame() -> usize {
    edge::client::MAX_FRAME_BYTES
}

/// A caller: starts runs one after the other and reads each to its terminal event.
async fn caller(parts: AppParts, spec: RunSpec, window: Arc<Window>) -> anyhow::Result<Histogram> {
    let mut latency = Histogram::default();
    while !window.stop.load(Ordering::Relaxed) {
        let begun = Instant::now();
        let mut handle = parts
            .runs
            .start(spec.clone())
            .map_err(|e| anyhow::anyhow!("run not accepted: {e}"))?;
        loop {
            let event = handle
                .events
                .recv()
                .await
                .context("the run's stream ended without a terminal event")?;
            match &event.kind {
                RunEventKind::Completed { .. } => break,
                kind if kind.is_terminal() => bail!("run {} ended with {kind:?}", handle.run_id),
                _ => {}
            }
        }
        if window.measuring.load(Ordering::Relaxed) {
            latency.record_duration(begun.elapsed());
            window.done.fetch_add(1, Ordering::Relaxed);
        }
    }
    Ok(latency)
}

pub fn run(args: &RunsArgs, common: &Common) -> anyhow::Result<Vec<Record>> {
    harness::init_logging(common);
    let concurrency = args.concurrency.max(1);
    let nodes = Nodes {
        count: args.nodes.max(1),
        max_concurrent_runs: u32::try_from(concurrency).unwrap_or(u32::MAX),
        heartbeat_interval_ms: 600_000,
    };
    let edge = InProcessEdge::start(
        &harness::config(nodes, ""),
        &[SinkKind::Null],
        common.edge_threads,
    )?;
    let load = harness::runtime("load", common.load_threads)?;
    let plan = Arc::new(Plan {
        outputs: args.events,
        text_bytes: 32,
        stamped: false,
        texts: Vec::new(),
        ping: false,
    });
    let warmup = Duration::from_millis(args.warmup_ms);
    let duration = Duration::from_millis(args.duration_ms);

    // The raw loopback round trip: same runtimes, same node code, no edge.
    let raw_window = Window::new();
    let listener = edge
        .runtime
        .block_on(TcpListener::bind(SocketAddr::from(([127, 0, 0, 1], 0))))?;
    let raw_addr = listener.local_addr()?;
    let raw_side = edge
        .runtime
        .spawn(raw_edge_side(listener, Arc::clone(&raw_window)));
    let raw_node = {
        let plan = Arc::clone(&plan);
        load.spawn(async move {
            let client = lean::register(raw_addr, "raw").await?;
            lean::serve(client, &plan).await
        })
    };
    let (raw_secs, raw_done) = raw_window.run(warmup, duration);
    let raw = edge.runtime.block_on(raw_side)??;
    raw_node.abort();

    // The same through the edge.
    let addr = edge.node_addr;
    let servers = load.block_on(lean::start_nodes(addr, nodes.count, &plan))?;
    let window = Window::new();
    let spec = RunSpec {
        selector: selector()?,
        input: Bytes::new(),
        content_type: "text/plain; charset=utf-8".into(),
        params: BTreeMap::new(),
        deadline: None,
        operation: edge::domain::Operation::Unspecified,
        routing: Default::default(),
    };
    let callers: Vec<_> = (0..concurrency)
        .map(|_| {
            edge.runtime.spawn(caller(
                edge.parts.clone(),
                spec.clone(),
                Arc::clone(&window),
            ))
        })
        .collect();
    let cpu_0 = harness::threads_cpu_ms("edge");
    let (secs, done) = window.run(warmup, duration);
    // Includes the warm-up: CPU per run over every run the window saw.
    let cpu = harness::threads_cpu_ms("edge") - cpu_0;
    let mut latency = Histogram::default();
    for caller in callers {
        latency.merge(&edge.runtime.block_on(caller)??);
    }
    edge.stop();
    for server in servers {
        let _ = load.block_on(server);
    }
    load.shutdown_timeout(Duration::from_secs(2));

    let added = |q: f64| latency.quantile_us(q) - raw.quantile_us(q);
    Ok(vec![
        Record::new(format!("concurrency={concurrency} events={}", args.events))
            .with("runs_per_s", done as f64 / secs)
            .with("run_p50_us", latency.quantile_us(0.5))
            .with("run_p99_us", latency.quantile_us(0.99))
            .with("raw_round_trips_per_s", raw_done as f64 / raw_secs)
            .with("raw_p50_us", raw.quantile_us(0.5))
            .with("raw_p99_us", raw.quantile_us(0.99))
            .with("added_p50_us", added(0.5))
            .with("added_p99_us", added(0.99))
            .with(
                "edge_cpu_cores",
                cpu as f64 / 1_000.0 / (secs + warmup.as_secs_f64()),
            ),
    ])
}
