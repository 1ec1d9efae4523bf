//! `relay`: M simulated nodes each answer runs with K output events as fast as the edge
//! takes them; events per second written by each sink kind (one fresh edge per kind) and
//! received by the callers, and p50/p99 latency from the node's write to the caller's
//! receipt (the run service publishes to the sink just before it hands the event to the
//! caller, in the same step).
//!
//! The `stdout` sink writes this process's standard output, so that case runs in a child
//! process of this program whose standard output is `/dev/null`.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::bail;
use bytes::Bytes;
use clap::Args;
use edge::AppParts;
use edge::domain::{AdapterName, NodeSelector, RunEventKind, RunSpec, Target};
use edge::settings::SinkKind;

use crate::Common;
use crate::external::NatsChild;
use crate::harness::{self, InProcessEdge, Nodes};
use crate::lean::{self, Plan};
use crate::stats::{Histogram, Record};

#[derive(Debug, Clone, Args)]
pub struct RelayArgs {
    /// Simulated nodes.
    #[arg(long, default_value_t = 100)]
    pub nodes: usize,
    /// Output events per run.
    #[arg(long, default_value_t = 64)]
    pub events: usize,
    /// Bytes of text per output event (at least 20: the send stamp).
    #[arg(long, default_value_t = 32)]
    pub bytes: usize,
    /// Runs in flight per node (its max_concurrent_runs).
    #[arg(long, default_value_t = 2)]
    pub runs_per_node: u32,
    /// Measured time per sink.
    #[arg(long, default_value_t = 5_000)]
    pub duration_ms: u64,
    /// Unmeasured time before it.
    #[arg(long, default_value_t = 1_000)]
    pub warmup_ms: u64,
    /// The sinks' `[events] queue_capacity` (0: the edge's default).
    #[arg(long, default_value_t = 0)]
    pub queue_capacity: usize,
    /// Follow every run's events with a pinging heartbeat (answered by an ack), to measure
    /// what the link check costs the relay.
    #[arg(long)]
    pub pings: bool,
    /// Sink kinds, each measured with its own edge: null, file, stdout, log, nats.
    #[arg(long, value_delimiter = ',', default_value = "null,file,stdout")]
    pub sinks: Vec<String>,
    /// The NATS server of the `nats` sink; by default a `nats-server` this program starts
    /// on a free loopback port (and stops).
    #[arg(long)]
    pub nats_url: Option<String>,
    /// Publish into a JetStream stream (with acks) rather than core NATS.
    #[arg(long)]
    pub nats_jetstream: bool,
}

fn sink_kind(name: &str) -> anyhow::Result<SinkKind> {
    Ok(match name {
        "null" => SinkKind::Null,
        "file" => SinkKind::File,
        "stdout" => SinkKind::Stdout,
        "log" => SinkKind::Log,
        "nats" => SinkKind::Nats,
        other => bail!("unknown sink {other:?} (null, file, stdout, log, nats)"),
    })
}

pub fn run(args: &RelayArgs, common: &Common) -> anyhow::Result<Vec<Record>> {
    if args.bytes < lean::STAMP_DIGITS {
        bail!("--bytes must be at least {}", lean::STAMP_DIGITS);
    }
    let mut records = Vec::new();
    for name in &args.sinks {
        let kind = sink_kind(name)?;
        if kind == SinkKind::Stdout && !common.child {
            records.extend(run_in_child(args, common)?);
        } else {
            records.push(measure(args, common, kind)?);
        }
    }
    Ok(records)
}

/// Runs the stdout case in a child whose standard output is `/dev/null`.
fn run_in_child(args: &RelayArgs, common: &Common) -> anyhow::Result<Vec<Record>> {
    let args = [
        format!("--nodes={}", args.nodes),
        format!("--events={}", args.events),
        format!("--bytes={}", args.bytes),
        format!("--runs-per-node={}", args.runs_per_node),
        format!("--duration-ms={}", args.duration_ms),
        format!("--warmup-ms={}", args.warmup_ms),
        format!("--queue-capacity={}", args.queue_capacity),
        "--sinks=stdout".to_owned(),
    ];
    crate::run_in_child(common, "relay", &args)
}

fn spec() -> anyhow::Result<RunSpec> {
    Ok(RunSpec {
        selector: NodeSelector {
            adapter: AdapterName::parse(harness::ADAPTER)?,
            target: Target::parse(harness::TARGET)?,
            pin: None,
        },
        input: Bytes::new(),
        content_type: "text/plain; charset=utf-8".into(),
        params: Default::default(),
        deadline: None,
        operation: edge::domain::Operation::Unspecified,
        routing: Default::default(),
    })
}

/// What the callers share.
struct Shared {
    stop: AtomicBool,
    measuring: AtomicBool,
    events: AtomicU64,
}

/// Starts runs one after the other, reading each to its end.
async fn drive(parts: AppParts, spec: RunSpec, shared: Arc<Shared>) -> anyhow::Result<Histogram> {
    let mut latency = Histogram::default();
    while !shared.stop.load(Ordering::Relaxed) {
        let mut handle = parts
            .runs
            .start(spec.clone())
            .map_err(|e| anyhow::anyhow!("run not accepted: {e}"))?;
        let measuring = shared.measuring.load(Ordering::Relaxed);
        let mut events = 0;
        while let Some(event) = handle.events.recv().await {
            events += 1;
            match &event.kind {
                RunEventKind::Output { text, .. } => {
                    if measuring && let Some(sent) = lean::stamp_of(text) {
                        latency.record(lean::now_nanos().saturating_sub(sent));
                    }
                }
                RunEventKind::Completed { .. } => break,
                other => bail!("run {} ended with {other:?}", handle.run_id),
            }
        }
        shared.events.fetch_add(events, Ordering::Relaxed);
    }
    Ok(latency)
}

/// The sink's counters from the edge's `/metrics`: written, dropped (by its queue, and
/// for NATS also by its backlog) and, for NATS, confirmed by the server.
fn sink_counters(edge: &InProcessEdge, kind: SinkKind) -> anyhow::Result<(f64, f64, f64)> {
    let text = harness::http_get(edge.http_addr, "/metrics")?;
    let label = format!("sink=\"{}\"", kind.as_str());
    let read = |name: &str, label: &str| {
        harness::metric(&text, &format!("{name}_total"), label)
            .or_else(|| harness::metric(&text, name, label))
            .unwrap_or(0.0)
    };
    let nats_dropped = read("edge_sink_nats_dropped", "terminal=\"false\"")
        + read("edge_sink_nats_dropped", "terminal=\"true\"");
    Ok((
        read("edge_sink_events_written", &label),
        read("edge_sink_events_dropped", &label) + nats_dropped,
        read("edge_sink_nats_published", ""),
    ))
}

/// `[events.nats]` for the `nats` sink, and the server this program started for it.
fn nats_config(args: &RelayArgs) -> anyhow::Result<(String, Option<NatsChild>)> {
    let (url, child) = match &args.nats_url {
        Some(url) => (url.clone(), None),
        None => {
            let child = NatsChild::start(args.nats_jetstream)?;
            (child.url.clone(), Some(child))
        }
    };
    let mut toml = format!("[events.nats]\nurl = {url:?}\n");
    if args.nats_jetstream {
        toml.push_str("[events.nats.jetstream]\nstream = \"LOADGEN\"\nmax_bytes = 1073741824\n");
    }
    Ok((toml, child))
}

fn measure(args: &RelayArgs, common: &Common, kind: SinkKind) -> anyhow::Result<Record> {
    harness::init_logging(common);
    let nodes = Nodes {
        count: args.nodes,
        max_concurrent_runs: args.runs_per_node.max(1),
        heartbeat_interval_ms: 600_000,
    };
    let mut extra = format!("[runs]\nqueue_capacity = {}\n", args.nodes * 4 + 64);
    if args.queue_capacity > 0 {
        extra.push_str(&format!(
            "[events]\nqueue_capacity = {}\n",
            args.queue_capacity
        ));
    }
    let nats = if kind == SinkKind::Nats {
        let (toml, child) = nats_config(args)?;
        extra.push_str(&toml);
        child
    } else {
        None
    };
    let edge = InProcessEdge::start(
        &harness::config(nodes, &extra),
        &[kind],
        common.edge_threads,
    )?;
    let load = harness::runtime("load", common.load_threads)?;
    let plan = Arc::new(Plan {
        outputs: args.events,
        text_bytes: args.bytes,
        stamped: true,
        texts: Vec::new(),
        ping: args.pings,
    });
    let addr = edge.node_addr;
    let servers = load.block_on(lean::start_nodes(addr, args.nodes, &plan))?;
    let shared = Arc::new(Shared {
        stop: AtomicBool::new(false),
        measuring: AtomicBool::new(false),
        events: AtomicU64::new(0),
    });
    let spec = spec()?;
    let drivers: Vec<_> = (0..args.nodes * args.runs_per_node.max(1) as usize)
        .map(|_| load.spawn(drive(edge.parts.clone(), spec.clone(), Arc::clone(&shared))))
        .collect();

    std::thread::sleep(Duration::from_millis(args.warmup_ms));
    let (written_0, dropped_0, published_0) = sink_counters(&edge, kind)?;
    let nats_cpu_0 = nats.as_ref().map_or(0, NatsChild::cpu_ms);
    let events_0 = shared.events.load(Ordering::Relaxed);
    let cpu_0 = harness::edge_cpu_ms();
    let load_cpu_0 = harness::threads_cpu_ms("load");
    shared.measuring.store(true, Ordering::Relaxed);
    let started = Instant::now();
    std::thread::sleep(Duration::from_millis(args.duration_ms));
    let (written_1, dropped_1, published_1) = sink_counters(&edge, kind)?;
    let nats_cpu = nats.as_ref().map_or(0, NatsChild::cpu_ms) - nats_cpu_0;
    let events_1 = shared.events.load(Ordering::Relaxed);
    let cpu = harness::edge_cpu_ms() - cpu_0;
    let load_cpu = harness::threads_cpu_ms("load") - load_cpu_0;
    let elapsed = started.elapsed().as_secs_f64();
    shared.measuring.store(false, Ordering::Relaxed);
    shared.stop.store(true, Ordering::Relaxed);

    let mut latency = Histogram::default();
    for driver in drivers {
        latency.merge(&load.block_on(driver)??);
    }
    edge.stop();
    for server in servers {
        // The edge sent Shutdown and closed: every node ends.
        let _ = load.block_on(server);
    }
    load.shutdown_timeout(Duration::from_secs(2));

    let mut key = match args.queue_capacity {
        0 => format!("sink={}", kind.as_str()),
        capacity => format!("sink={} queue_capacity={capacity}", kind.as_str()),
    };
    if args.pings {
        key.push_str(" pings=per_run");
    }
    if kind == SinkKind::Nats && args.nats_jetstream {
        key.push_str(" jetstream");
    }
    Ok(Record::new(key)
        .with("sink_events_per_s", (written_1 - written_0) / elapsed)
        .with(
            "caller_events_per_s",
            (events_1 - events_0) as f64 / elapsed,
        )
        .with("sink_dropped", dropped_1 - dropped_0)
        .with(
            "nats_published_per_s",
            (published_1 - published_0) / elapsed,
        )
        .with("nats_server_cpu_cores", nats_cpu as f64 / 1_000.0 / elapsed)
        .with("edge_cpu_cores", cpu as f64 / 1_000.0 / elapsed)
        .with(
            "edge_cpu_ns_per_event",
            cpu as f64 * 1e6 / (events_1 - events_0).max(1) as f64,
        )
        .with(
            "load_cpu_ns_per_event",
            load_cpu as f64 * 1e6 / (events_1 - events_0).max(1) as f64,
        )
        .with("latency_p50_us", latency.quantile_us(0.5))
        .with("latency_p99_us", latency.quantile_us(0.99)))
}
