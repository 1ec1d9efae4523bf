//! `register`: N simulated nodes connect and register; registrations per second, handshake
//! latency (TCP connect to the accepted RegisterResponse), and the edge's RSS before and
//! after, hence the cost of one connected idle node; and the kernel's listen-queue
//! counters over the burst (with many handshakes in flight, whether the edge's listen
//! backlog overflowed). `--rig shared-core` is issue 50's topology: the edge's process on
//! core 1, the nodes (this process) on core 0.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use clap::Args;
use edge::client::NodeClient;
use edge::settings::SinkKind;

use crate::Common;
use crate::harness::{self, EdgeProcess, InProcessEdge, Nodes};
use crate::stats::{Histogram, Record};
use crate::{lean, netstat};

#[derive(Debug, Clone, Args)]
pub struct RegisterArgs {
    /// Simulated nodes.
    #[arg(long, default_value_t = 10_000)]
    pub nodes: usize,
    /// Handshakes in flight at once.
    #[arg(long, default_value_t = 64)]
    pub concurrency: usize,
    /// The `edge` binary to measure as its own process [default: `edge` next to this
    /// program's directory, e.g. target/release/edge].
    #[arg(long)]
    pub edge_bin: Option<PathBuf>,
    /// Run the edge inside this process instead (RSS then includes the load generator).
    #[arg(long)]
    pub in_process: bool,
    /// Pause before each RSS reading, letting the edge go idle.
    #[arg(long, default_value_t = 1_000)]
    pub settle_ms: u64,
    /// `server.listen_backlog` of the edge [default: the edge's own default].
    #[arg(long)]
    pub listen_backlog: Option<u32>,
    /// Where the edge runs: `unpinned` (anywhere) or `shared-core` (issue 50: the edge's
    /// process on core 1, the nodes on core 0, as `api --rig shared-core` pins them).
    #[arg(long, default_value = "unpinned", value_parser = ["unpinned", "shared-core"])]
    pub rig: String,
}

/// The cores of `--rig shared-core`: the nodes', and the edge's.
const NODES_CPU: usize = 0;
const EDGE_CPU: usize = 1;

/// The `edge` binary beside this executable (`target/<profile>/edge` for
/// `target/<profile>/loadgen`).
fn default_edge_bin() -> Option<PathBuf> {
    let exe = std::env::current_exe().ok()?;
    let bin = exe.parent()?.join("edge");
    bin.is_file().then_some(bin)
}

/// The soft limit on open files of this process.
fn open_files_limit() -> Option<usize> {
    let limits = std::fs::read_to_string("/proc/self/limits").ok()?;
    let line = limits.lines().find(|l| l.starts_with("Max open files"))?;
    line.split_whitespace().nth(3)?.parse().ok()
}

/// Fails, saying what to do, when this process may not open `needed` files.
pub fn ensure_open_files(nodes: usize, needed: usize) -> anyhow::Result<()> {
    if let Some(limit) = open_files_limit()
        && limit < needed
    {
        bail!(
            "{nodes} nodes need about {needed} open files here, the limit is {limit}: \
             raise it (`ulimit -n {needed}`) or use fewer --nodes"
        );
    }
    Ok(())
}

/// The `[server]` and `[log]` sections of a generated config for `nodes` nodes.
pub fn server_config(nodes: usize, listen_backlog: Option<u32>, log_level: &str) -> String {
    let backlog = listen_backlog.map_or(String::new(), |b| format!("listen_backlog = {b}\n"));
    format!(
        "[server]\nmax_connections = {}\n{backlog}[log]\nlevel = \"{log_level}\"\n",
        nodes + 1_024
    )
}

/// The `edge` binary to run: `explicit`, or the one beside this program.
pub fn edge_bin(explicit: Option<&PathBuf>) -> anyhow::Result<PathBuf> {
    match explicit {
        Some(binary) => Ok(binary.clone()),
        None => default_edge_bin().context("no edge binary found"),
    }
}

/// The handshake latencies of a registration storm: the opening burst (each worker's first
/// handshake: every worker dials at the same instant, as nodes do when an edge comes back)
/// and the rest (a new handshake as each one ends).
#[derive(Default)]
pub struct Handshakes {
    /// Each worker's first handshake.
    pub opening: Histogram,
    /// Every later one.
    pub steady: Histogram,
}

/// Registers nodes `0..total` with the edge at `addr`, `concurrency` handshakes in flight
/// on `load`; returns the handshake latencies and the registered clients.
pub fn register_all(
    load: &tokio::runtime::Runtime,
    addr: std::net::SocketAddr,
    total: usize,
    concurrency: usize,
) -> anyhow::Result<(Handshakes, Vec<NodeClient>)> {
    let next = Arc::new(AtomicUsize::new(0));
    let workers: Vec<_> = (0..concurrency.clamp(1, total.max(1)))
        .map(|_| {
            let next = Arc::clone(&next);
            load.spawn(async move {
                let mut latency = Handshakes::default();
                let mut clients: Vec<NodeClient> = Vec::new();
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    if i >= total {
                        break;
                    }
                    let begun = Instant::now();
                    let client = lean::register(addr, &harness::token(i)).await?;
                    let histogram = if clients.is_empty() {
                        &mut latency.opening
                    } else {
                        &mut latency.steady
                    };
                    histogram.record_duration(begun.elapsed());
                    clients.push(client);
                }
                anyhow::Ok((latency, clients))
            })
        })
        .collect();
    let mut latency = Handshakes::default();
    let mut clients = Vec::with_capacity(total);
    for worker in workers {
        let (histograms, mut held) = load.block_on(worker)??;
        latency.opening.merge(&histograms.opening);
        latency.steady.merge(&histograms.steady);
        clients.append(&mut held);
    }
    Ok((latency, clients))
}

enum Target {
    Process(EdgeProcess),
    InProcess(InProcessEdge),
}

impl Target {
    fn rss_kib(&self) -> anyhow::Result<u64> {
        match self {
            Self::Process(edge) => edge.rss_kib(),
            Self::InProcess(_) => harness::rss_kib(std::process::id()),
        }
    }

    fn cpu_ms(&self) -> u64 {
        match self {
            Self::Process(edge) => edge.cpu_ms(),
            Self::InProcess(_) => harness::threads_cpu_ms("edge"),
        }
    }

    fn connected(&self) -> anyhow::Result<usize> {
        match self {
            Self::Process(edge) => {
                let metrics = edge.get("/metrics")?;
                let value = harness::metric(&metrics, "edge_nodes_connected", "")
                    .context("no edge_nodes_connected in /metrics")?;
                Ok(value as usize)
            }
            Self::InProcess(edge) => Ok(edge.parts.registry.len()),
        }
    }
}

pub fn run(args: &RegisterArgs, common: &Common) -> anyhow::Result<Vec<Record>> {
    let needed = args.nodes + 64;
    let in_process = args.in_process || (args.edge_bin.is_none() && default_edge_bin().is_none());
    let needed = if in_process { 2 * needed } else { needed };
    ensure_open_files(args.nodes, needed)?;
    let shared_core = args.rig == "shared-core";
    if shared_core && in_process {
        bail!("`--rig shared-core` runs the edge as its own process: leave out --in-process");
    }
    let cores = std::thread::available_parallelism().map_or(1, std::num::NonZero::get);
    let pinned = shared_core && cores >= 2;
    if shared_core && !pinned {
        eprintln!("loadgen register: {cores} CPU here: the shared-core rig runs unpinned");
    }
    let nodes = Nodes {
        count: args.nodes,
        max_concurrent_runs: 4,
        heartbeat_interval_ms: 600_000,
    };
    let extra = server_config(args.nodes, args.listen_backlog, &common.edge_log_level);
    let config = harness::config(nodes, &extra);
    let target = if in_process {
        harness::init_logging(common);
        Target::InProcess(InProcessEdge::start(
            &config,
            &[SinkKind::Null],
            common.edge_threads,
        )?)
    } else {
        // The child inherits the affinity of the thread that starts it.
        if pinned {
            edge_thread_slice::pin_to_cpu(EDGE_CPU)
                .with_context(|| format!("cannot pin the edge to CPU {EDGE_CPU}"))?;
        }
        let edge = EdgeProcess::start(
            &edge_bin(args.edge_bin.as_ref())?,
            &config,
            common.edge_threads,
            &common.edge_log_level,
        );
        if pinned {
            edge_thread_slice::pin_to_cpu(NODES_CPU)
                .with_context(|| format!("cannot pin the nodes to CPU {NODES_CPU}"))?;
        }
        Target::Process(edge?)
    };
    let addr = match &target {
        Target::Process(edge) => edge.node_addr,
        Target::InProcess(edge) => edge.node_addr,
    };
    std::thread::sleep(Duration::from_millis(args.settle_ms));
    let rss_before = target.rss_kib()?;

    let load = harness::crowd_runtime("load", common.load_threads)?;
    let total = args.nodes;
    let edge_cpu_0 = target.cpu_ms();
    let load_cpu_0 = harness::threads_cpu_ms("load");
    let counters = netstat::Counters::read();
    let started = Instant::now();
    let (handshakes, clients) = register_all(&load, addr, total, args.concurrency)?;
    let mut latency = Histogram::default();
    latency.merge(&handshakes.opening);
    latency.merge(&handshakes.steady);
    let elapsed = started.elapsed();
    let grown = netstat::Counters::read().grown_since(&counters);
    let edge_cpu = target.cpu_ms() - edge_cpu_0;
    let load_cpu = harness::threads_cpu_ms("load") - load_cpu_0;
    let connected = target.connected()?;
    if connected != total {
        bail!("{connected} of {total} nodes are connected");
    }
    std::thread::sleep(Duration::from_millis(args.settle_ms));
    let rss_after = target.rss_kib()?;
    drop(clients);
    load.shutdown_timeout(Duration::from_secs(2));
    if let Target::InProcess(edge) = target {
        edge.stop();
    }

    let per_node = (rss_after.saturating_sub(rss_before) * 1_024) as f64 / total.max(1) as f64;
    let backlog = args
        .listen_backlog
        .map_or(String::new(), |b| format!(" backlog={b}"));
    let rig = if shared_core { " rig=shared-core" } else { "" };
    let record = Record::new(format!(
        "nodes={total} edge={} in_flight={}{backlog}{rig}",
        if in_process { "in-process" } else { "process" },
        args.concurrency
    ))
    .with("pinned", f64::from(u8::from(pinned)))
    .with(
        "registrations_per_s",
        total as f64 / elapsed.as_secs_f64().max(1e-9),
    )
    .with("handshake_p50_us", latency.quantile_us(0.5))
    .with("handshake_p99_us", latency.quantile_us(0.99))
    .with("opening_p50_us", handshakes.opening.quantile_us(0.5))
    .with("opening_p99_us", handshakes.opening.quantile_us(0.99))
    .with("steady_p99_us", handshakes.steady.quantile_us(0.99))
    .with(
        "edge_cpu_us_per_registration",
        edge_cpu as f64 * 1_000.0 / total.max(1) as f64,
    )
    .with(
        "load_cpu_us_per_registration",
        load_cpu as f64 * 1_000.0 / total.max(1) as f64,
    )
    .with("rss_before_kib", rss_before as f64)
    .with("rss_after_kib", rss_after as f64)
    .with("rss_per_node_bytes", per_node);
    Ok(vec![
        grown.into_iter().fold(record, |r, (n, v)| r.with(n, v)),
    ])
}
