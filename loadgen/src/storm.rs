//! `storm`: a reconnect storm. N lean nodes are registered with the `edge` binary; the edge
//! is killed (`SIGKILL`) and started again on the same addresses, and every node, cut off
//! at the same instant, reconnects — either at once (retrying a refused connection every
//! `--retry-ms`, no jitter: a naive node) or as the reference node does
//! (`edge-node`: before every attempt a delay drawn uniformly from zero to a ceiling
//! that starts at `--backoff-min-ms` and doubles up to `--backoff-max-ms`, the library's
//! [`edge::client::Backoff`]). Reported: the time from the kill until every node was
//! registered again, the successful handshakes' p50/p99 (connect to accepted, including
//! any SYN the kernel dropped and the node retransmitted), each node's time without an edge,
//! the kernel's listen-queue counters over the storm, and how many of a few chat
//! completions sent afterwards were served.
//!
//! Each node reconnects from a loopback address of its own (`127.1.x.y`), as nodes on their
//! own hosts do. From one shared address (`--shared-source`) the new connections' ports
//! collide with the killed edge's `TIME_WAIT` entries — on loopback both ends share one
//! connection table — and a third of the SYNs are answered with an ACK instead and resent
//! 1 s later: an artifact of the test's topology, not of the edge.

use std::net::{Ipv4Addr, SocketAddr};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use clap::Args;
use edge::client::{Backoff, NodeClient};

use crate::Common;
use crate::harness::{self, EdgeProcess, Nodes};
use crate::http::{Connection, post_json};
use crate::lean::{self, Plan};
use crate::register::{edge_bin, ensure_open_files, register_all, server_config};
use crate::stats::{Histogram, Record};
use crate::{api, netstat};

#[derive(Debug, Clone, Args)]
pub struct StormArgs {
    /// Connected nodes when the edge is killed.
    #[arg(long, default_value_t = 10_000)]
    pub nodes: usize,
    /// How the nodes reconnect: `immediate`, `jitter` (the reference node's backoff), or both.
    #[arg(long, value_delimiter = ',', default_value = "immediate,jitter")]
    pub reconnect: Vec<String>,
    /// `immediate`: the pause after a failed attempt (a refused connection while the edge
    /// is down), the same for every node.
    #[arg(long, default_value_t = 100)]
    pub retry_ms: u64,
    /// `jitter`: the first delay's ceiling (the reference node's `--reconnect-min-ms`).
    #[arg(long, default_value_t = 500)]
    pub backoff_min_ms: u64,
    /// `jitter`: the largest ceiling (the reference node's `--reconnect-max-ms`).
    #[arg(long, default_value_t = 30_000)]
    pub backoff_max_ms: u64,
    /// `server.listen_backlog` of the edge [default: the edge's own default].
    #[arg(long)]
    pub listen_backlog: Option<u32>,
    /// Chat completions sent through the restarted edge once every node is back.
    #[arg(long, default_value_t = 8)]
    pub runs_after: usize,
    /// How long the nodes may take to come back before the case fails.
    #[arg(long, default_value_t = 120_000)]
    pub limit_ms: u64,
    /// The `edge` binary [default: `edge` beside this program's directory].
    #[arg(long)]
    pub edge_bin: Option<std::path::PathBuf>,
    /// Reconnect from 127.0.0.1 like the first registration, not from an address per node.
    #[arg(long)]
    pub shared_source: bool,
}

/// How a node that lost its edge dials again.
#[derive(Debug, Clone, Copy)]
enum Reconnect {
    Immediate { retry: Duration },
    Jitter { min: Duration, max: Duration },
}

impl Reconnect {
    fn parse(name: &str, args: &StormArgs) -> anyhow::Result<Self> {
        Ok(match name {
            "immediate" => Self::Immediate {
                retry: Duration::from_millis(args.retry_ms),
            },
            "jitter" => Self::Jitter {
                min: Duration::from_millis(args.backoff_min_ms.max(1)),
                max: Duration::from_millis(args.backoff_max_ms.max(1)),
            },
            other => bail!("unknown --reconnect {other:?}: immediate or jitter"),
        })
    }

    fn name(self) -> &'static str {
        match self {
            Self::Immediate { .. } => "immediate",
            Self::Jitter { .. } => "jitter",
        }
    }
}

/// What the nodes of one storm share.
#[derive(Default)]
struct Storm {
    /// The instant the edge was killed.
    killed: OnceLock<Instant>,
    /// Set when the case is over: nodes stop dialling.
    stopping: AtomicBool,
    registered: AtomicUsize,
    attempts: AtomicU64,
    /// The latest registration, in ns after the kill.
    last_ns: AtomicU64,
    handshakes: Mutex<Histogram>,
    downtime: Mutex<Histogram>,
}

impl Storm {
    fn since_kill(&self) -> Duration {
        self.killed.get().map_or(Duration::ZERO, Instant::elapsed)
    }
}

pub fn run(args: &StormArgs, common: &Common) -> anyhow::Result<Vec<Record>> {
    ensure_open_files(args.nodes, args.nodes + 256)?;
    let binary = edge_bin(args.edge_bin.as_ref())?;
    let nodes = Nodes {
        count: args.nodes,
        max_concurrent_runs: 4,
        heartbeat_interval_ms: 600_000,
    };
    let config = harness::config(
        nodes,
        &server_config(args.nodes, args.listen_backlog, &common.edge_log_level),
    );
    args.reconnect
        .iter()
        .map(|name| {
            let policy = Reconnect::parse(name, args)?;
            storm_once(args, common, &binary, &config, policy)
                .with_context(|| format!("the {name} storm"))
        })
        .collect()
}

fn storm_once(
    args: &StormArgs,
    common: &Common,
    binary: &std::path::Path,
    config: &str,
    policy: Reconnect,
) -> anyhow::Result<Record> {
    let total = args.nodes;
    let limit = Duration::from_millis(args.limit_ms);
    let start = |at| {
        EdgeProcess::start_at(
            binary,
            config,
            common.edge_threads,
            &common.edge_log_level,
            at,
            None,
            None,
        )
    };
    let edge = start(None)?;
    let addrs = (edge.node_addr, edge.http_addr, edge.admin_addr);
    let load = harness::crowd_runtime("load", common.load_threads)?;
    let (_, clients) = register_all(&load, addrs.0, total, 64)?;
    let storm = Arc::new(Storm::default());
    let plan = Arc::new(Plan {
        outputs: 2,
        text_bytes: 8,
        stamped: false,
        texts: Vec::new(),
        ping: false,
    });
    for (index, client) in clients.into_iter().enumerate() {
        let (storm, plan) = (Arc::clone(&storm), Arc::clone(&plan));
        let dial = Dial {
            edge: addrs.0,
            source: (!args.shared_source).then(|| source_address(index)),
            token: harness::token(index),
            policy,
            limit,
        };
        load.spawn(node_life(dial, client, plan, storm));
    }

    let counters = netstat::Counters::read();
    let _ = storm.killed.set(Instant::now());
    drop(edge); // SIGKILL, and reaped
    let edge = start(Some(addrs))?;
    let restart = storm.since_kill();
    while storm.registered.load(Ordering::Relaxed) < total && storm.since_kill() < limit {
        std::thread::sleep(Duration::from_millis(5));
    }
    let grown = netstat::Counters::read().grown_since(&counters);
    let registered = storm.registered.load(Ordering::Relaxed);
    if registered < total {
        storm.stopping.store(true, Ordering::Relaxed);
        bail!("{registered} of {total} nodes came back within {limit:?}");
    }
    let connected = harness::metric(&edge.get("/metrics")?, "edge_nodes_connected", "")
        .context("no edge_nodes_connected in /metrics")?;
    let served = load.block_on(runs_after(addrs.1, args.runs_after))?;
    storm.stopping.store(true, Ordering::Relaxed);
    drop(edge);
    load.shutdown_timeout(Duration::from_secs(2));

    let all = Duration::from_nanos(storm.last_ns.load(Ordering::Relaxed));
    let back = all.saturating_sub(restart);
    let lock = |m: &Mutex<Histogram>| m.lock().map(|h| h.clone()).unwrap_or_default();
    let (handshakes, downtime) = (lock(&storm.handshakes), lock(&storm.downtime));
    let backlog = args
        .listen_backlog
        .map_or(String::new(), |b| format!(" backlog={b}"));
    let shared = if args.shared_source {
        " shared_source"
    } else {
        ""
    };
    let record = Record::new(format!(
        "nodes={total} reconnect={}{backlog}{shared}",
        policy.name()
    ))
    .with("all_registered_ms", all.as_secs_f64() * 1e3)
    .with("edge_restart_ms", restart.as_secs_f64() * 1e3)
    .with("registered_after_restart_ms", back.as_secs_f64() * 1e3)
    .with(
        "registrations_per_s_after_restart",
        total as f64 / back.as_secs_f64().max(1e-9),
    )
    .with("handshake_p50_us", handshakes.quantile_us(0.5))
    .with("handshake_p99_us", handshakes.quantile_us(0.99))
    .with("downtime_p50_ms", downtime.quantile_us(0.5) / 1e3)
    .with("downtime_p99_ms", downtime.quantile_us(0.99) / 1e3)
    .with(
        "attempts_per_node",
        storm.attempts.load(Ordering::Relaxed) as f64 / total.max(1) as f64,
    )
    .with("connected_after", connected)
    .with("runs_served_after", served as f64)
    .with("runs_sent_after", args.runs_after as f64);
    Ok(grown.into_iter().fold(record, |r, (n, v)| r.with(n, v)))
}

/// How one node dials again.
struct Dial {
    edge: SocketAddr,
    /// The loopback address it connects from (`None`: the system's choice, 127.0.0.1).
    source: Option<Ipv4Addr>,
    token: String,
    policy: Reconnect,
    /// How long after the kill it keeps trying.
    limit: Duration,
}

impl Dial {
    async fn register(&self) -> anyhow::Result<NodeClient> {
        match self.source {
            Some(source) => lean::register_from(source, self.edge, &self.token).await,
            None => lean::register(self.edge, &self.token).await,
        }
    }
}

/// One node: serves runs until its edge goes away, dials again as `dial` says until it is
/// registered, and serves again until the case is over.
async fn node_life(dial: Dial, client: NodeClient, plan: Arc<Plan>, storm: Arc<Storm>) {
    // Errors and orderly closes alike end the session: the edge is gone.
    let _ = lean::serve(client, &plan).await;
    let lost = Instant::now();
    let (policy, limit) = (dial.policy, dial.limit);
    let mut backoff = match policy {
        Reconnect::Jitter { min, max } => Some(Backoff::new(min, max)),
        Reconnect::Immediate { .. } => None,
    };
    let mut first = true;
    let client = loop {
        if storm.stopping.load(Ordering::Relaxed) || storm.since_kill() >= limit {
            return;
        }
        let delay = match (&mut backoff, policy) {
            (Some(backoff), _) => backoff.next_delay(rand::random::<f64>()),
            (None, Reconnect::Immediate { retry }) if !first => retry,
            _ => Duration::ZERO,
        };
        first = false;
        if !delay.is_zero() {
            tokio::time::sleep(delay).await;
        }
        storm.attempts.fetch_add(1, Ordering::Relaxed);
        let begun = Instant::now();
        let remaining = limit.saturating_sub(storm.since_kill());
        if let Ok(Ok(client)) = tokio::time::timeout(remaining, dial.register()).await {
            let now = Instant::now();
            if let Ok(mut h) = storm.handshakes.lock() {
                h.record_duration(now - begun);
            }
            if let Ok(mut h) = storm.downtime.lock() {
                h.record_duration(now - lost);
            }
            let at = u64::try_from(storm.since_kill().as_nanos()).unwrap_or(u64::MAX);
            storm.last_ns.fetch_max(at, Ordering::Relaxed);
            storm.registered.fetch_add(1, Ordering::Relaxed);
            break client;
        }
    };
    let _ = lean::serve(client, &plan).await;
}

/// The loopback address node `index` reconnects from: `127.1.0.0` plus the index.
fn source_address(index: usize) -> Ipv4Addr {
    let [_, b, c, d] = u32::try_from(index).unwrap_or(u32::MAX).to_be_bytes();
    Ipv4Addr::new(127, b.saturating_add(1), c, d)
}

/// Sends `count` whole chat completions, one after another on one connection; returns how
/// many were answered `200`.
async fn runs_after(http: SocketAddr, count: usize) -> anyhow::Result<usize> {
    let mut connection = Connection::connect(http).await?;
    let request = post_json(http, "/v1/chat/completions", &api::body(2, false));
    let mut served = 0;
    for _ in 0..count {
        let exchange = connection.exchange(&request, false).await?;
        served += usize::from(exchange.status == 200);
    }
    Ok(served)
}
