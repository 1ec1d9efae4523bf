//! `api`: OpenAI chat completions (streaming and not, K chunks) through the edge's HTTP API
//! at several concurrencies, next to a direct baseline measured in the same process: a
//! minimal HTTP server (axum, the edge's own HTTP stack) on the edge's runtime answering
//! the very bytes the edge answered, with no edge, run or node in between. Both are driven
//! by the same minimal keep-alive client; the report gives requests per second, time to the
//! first response byte and to the last, and the edge's share of the baseline's throughput.
//!
//! `--rig shared-core` is issue 50's topology instead: the edge, its nodes and a bare hyper
//! baseline in a child process on core 1, the client on core 0 (`crate::shared_core`);
//! with `--floor`, beside them the floor relay (`crate::floor`), the least a relay with a
//! node-protocol hop can do.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use axum::Router;
use axum::body::{Body, Bytes};
use axum::http::{HeaderValue, header};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::serve::ListenerExt;
use clap::Args;
use edge::settings::SinkKind;
use tokio::net::TcpListener;
use tokio::runtime::Runtime;
use tokio::task::JoinHandle;

use crate::Common;
use crate::bare::Canned;
use crate::external::NatsChild;
use crate::harness::{self, InProcessEdge, Nodes};
use crate::http::{Connection, post_json};
use crate::lean::{self, Plan};
use crate::mock_node::{MockNode, MockOptions};
use crate::stats::{Histogram, Record};

pub const PATH: &str = "/v1/chat/completions";

#[derive(Debug, Clone, Args)]
pub struct ApiArgs {
    /// Concurrent keep-alive connections, each with one request at a time.
    #[arg(long, value_delimiter = ',', default_value = "1,16,64")]
    pub concurrency: Vec<usize>,
    /// Content chunks per completion (one output event each).
    #[arg(long, default_value_t = 16)]
    pub chunks: usize,
    /// stream, full, or both.
    #[arg(long, value_delimiter = ',', default_value = "stream,full")]
    pub modes: Vec<String>,
    /// Simulated nodes serving the model.
    #[arg(long, default_value_t = 4)]
    pub nodes: usize,
    /// Which node: `lean` (answers a run in one write) or `mock` (edge-mock-node: one
    /// write per event, echoing the prompt's words).
    #[arg(long, default_value = "lean", value_parser = ["lean", "mock"])]
    pub node: String,
    /// The edge's event sink while serving the API: `stdout`, as the shipped config has it
    /// (that case runs in a child whose standard output is `/dev/null`), or a labelled
    /// variant.
    #[arg(long, default_value = "stdout", value_parser = ["null", "file", "stdout", "log"])]
    pub sink: String,
    /// Measured time per case and server.
    #[arg(long, default_value_t = 3_000)]
    pub duration_ms: u64,
    /// Unmeasured time before each.
    #[arg(long, default_value_t = 500)]
    pub warmup_ms: u64,
    /// Where the servers run: `in-process` (the edge, the nodes and the axum baseline on
    /// runtimes of their own in this process) or `shared-core` (issue 50: the client on
    /// core 0; the edge, its nodes and a bare hyper baseline in a child on core 1; TTFB to
    /// the first non-empty body frame).
    #[arg(long, default_value = "in-process", value_parser = ["in-process", "shared-core"])]
    pub rig: String,
    /// With `--rig shared-core`: drive a third server after the bare one and before the
    /// edge, the floor relay (`crate::floor`: bare hyper, a `RunRequest` to a lean node of its
    /// own over the node protocol, the node's events relayed as the edge's captured SSE
    /// events, nothing else), and report it beside the two (`floor_*`, `floor_ratio` =
    /// floor/bare, `edge_floor_ratio` = edge/floor).
    #[arg(long)]
    pub floor: bool,
    /// Internal: the CPU the shared-core rig's server child pins itself to.
    #[arg(long, hide = true)]
    pub server_cpu: Option<usize>,
    /// A labelled variant (issue 49): the edge is the one member of a site (`[cluster]`, a
    /// site of its own per run) whose lease and replicated journal live on a `nats-server`
    /// with JetStream this program starts (or at `--nats-url`); the load starts once the
    /// edge holds the lease.
    #[arg(long)]
    pub cluster: bool,
    /// The NATS server of `--cluster`, instead of one this program starts.
    #[arg(long, requires = "cluster")]
    pub nats_url: Option<String>,
    /// A labelled variant of `--cluster`: `cluster.snapshot_after_bytes` this many MiB,
    /// looked at every second (the shipped 256 MiB and 30 s take longer than a window), so
    /// the window pays for the snapshots a long-running site takes.
    #[arg(long, requires = "cluster")]
    pub snapshot_after_mib: Option<u64>,
}

/// What the edge's journal files take on disk now, in MiB.
fn journal_mib(edge: &InProcessEdge) -> f64 {
    edge.parts.journal.stats().bytes as f64 / f64::from(1u32 << 20)
}

/// The snapshots of the journal the edge stored so far (0 when it is no member of a site).
fn snapshots(edge: &InProcessEdge) -> f64 {
    harness::http_get(edge.http_addr, "/metrics")
        .ok()
        .and_then(|text| harness::metric(&text, "edge_cluster_journal_snapshots_total", ""))
        .unwrap_or(0.0)
}

/// `args` as the arguments of a child run.
pub fn child_args(args: &ApiArgs) -> Vec<String> {
    let list = |items: &[String]| items.join(",");
    let concurrency: Vec<String> = args.concurrency.iter().map(usize::to_string).collect();
    vec![
        format!("--concurrency={}", list(&concurrency)),
        format!("--chunks={}", args.chunks),
        format!("--modes={}", list(&args.modes)),
        format!("--nodes={}", args.nodes),
        format!("--node={}", args.node),
        format!("--sink={}", args.sink),
        format!("--duration-ms={}", args.duration_ms),
        format!("--warmup-ms={}", args.warmup_ms),
        format!("--rig={}", args.rig),
    ]
    .into_iter()
    .chain(args.floor.then(|| "--floor".to_owned()))
    .chain(args.server_cpu.map(|cpu| format!("--server-cpu={cpu}")))
    .chain(args.cluster.then(|| "--cluster".to_owned()))
    .chain(
        args.nats_url
            .as_ref()
            .map(|url| format!("--nats-url={url}")),
    )
    .chain(
        args.snapshot_after_mib
            .map(|mib| format!("--snapshot-after-mib={mib}")),
    )
    .collect()
}

/// The words of the prompt; the echo mock answers one chunk per word.
fn words(chunks: usize) -> Vec<String> {
    (0..chunks)
        .map(|i| {
            if i + 1 < chunks {
                format!("w{i} ")
            } else {
                format!("w{i}")
            }
        })
        .collect()
}

pub fn body(chunks: usize, stream: bool) -> String {
    let prompt: String = words(chunks).concat();
    format!(
        r#"{{"model":"{}/{}","stream":{stream},"messages":[{{"role":"user","content":"{prompt}"}}]}}"#,
        harness::ADAPTER,
        harness::TARGET
    )
}

async fn baseline(
    axum::extract::State(canned): axum::extract::State<Arc<Canned>>,
    body: Bytes,
) -> Response {
    let stream = body.windows(13).any(|w| w == b"\"stream\":true");
    if stream {
        let events = canned.events.clone();
        let mut response = Body::from_stream(futures::stream::iter(
            events.into_iter().map(Ok::<_, Infallible>),
        ))
        .into_response();
        let headers = response.headers_mut();
        headers.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("text/event-stream"),
        );
        headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
        response
    } else {
        let mut response = canned.full.clone().into_response();
        response.headers_mut().insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
        response
    }
}

async fn start_baseline(canned: Canned) -> anyhow::Result<SocketAddr> {
    let listener = TcpListener::bind(SocketAddr::from(([127, 0, 0, 1], 0))).await?;
    let addr = listener.local_addr()?;
    let router = Router::new()
        .route(PATH, post(baseline))
        .with_state(Arc::new(canned));
    // Small SSE chunks must not wait for Nagle's algorithm.
    let listener = listener.tap_io(|tcp| {
        let _ = tcp.set_nodelay(true);
    });
    // Ends with the edge's runtime.
    tokio::spawn(async move {
        let _ = axum::serve(listener, router).await;
    });
    Ok(addr)
}

/// Splits an SSE body into its events (each with its blank-line terminator).
fn sse_events(body: &[u8]) -> Vec<Bytes> {
    let mut events = Vec::new();
    let mut start = 0;
    let mut i = 0;
    while i + 1 < body.len() {
        if &body[i..i + 2] == b"\n\n" {
            events.push(Bytes::copy_from_slice(&body[start..i + 2]));
            start = i + 2;
            i += 2;
        } else {
            i += 1;
        }
    }
    if start < body.len() {
        events.push(Bytes::copy_from_slice(&body[start..]));
    }
    events
}

/// Asks the edge once in each mode, checks the answers, and keeps them for the baseline.
pub async fn capture(addr: SocketAddr, chunks: usize) -> anyhow::Result<Canned> {
    let mut connection = Connection::connect(addr).await?;
    let full = connection
        .exchange(&post_json(addr, PATH, &body(chunks, false)), true)
        .await?;
    if full.status != 200 {
        bail!(
            "the edge answered {}: {}",
            full.status,
            String::from_utf8_lossy(&full.body)
        );
    }
    let json: serde_json::Value = serde_json::from_slice(&full.body)?;
    let expected: String = words(chunks).concat();
    if json["choices"][0]["message"]["content"] != expected.as_str() {
        bail!("unexpected completion: {json}");
    }
    let streamed = connection
        .exchange(&post_json(addr, PATH, &body(chunks, true)), true)
        .await?;
    if streamed.status != 200 {
        bail!("the edge answered the stream with {}", streamed.status);
    }
    let events = sse_events(&streamed.body);
    let deltas = events
        .iter()
        .filter(|e| e.windows(10).any(|w| w == b"\"content\":"))
        .count();
    // The role chunk carries `"content":""` too; each event may start with its `id:`.
    if deltas != chunks + 1
        || !events
            .last()
            .is_some_and(|e| e.windows(12).any(|w| w == b"data: [DONE]"))
    {
        bail!(
            "unexpected stream ({deltas} content chunks): {}",
            String::from_utf8_lossy(&streamed.body)
        );
    }
    Ok(Canned {
        full: Bytes::from(full.body),
        events,
    })
}

/// The figures of one server at one concurrency.
pub struct Load {
    pub requests_per_s: f64,
    /// CPU of the threads `cpu_ms` counts (the edge's, in process) per request, in µs.
    pub cpu_us_per_request: f64,
    /// The other threads [`Driven::cpu_ms`] counts, per request, in µs.
    pub other_cpu_us_per_request: f64,
    /// To the first response byte, or to the first body frame the watch accepted.
    pub first_byte: Histogram,
    pub total: Histogram,
    pub errors: u64,
}

/// What [`drive`] measures besides the client's own times.
pub struct Driven<'a> {
    /// CPU used so far by the server's threads and by other threads worth reporting beside
    /// them (the rig's nodes), in ms.
    pub cpu_ms: &'a dyn Fn() -> (u64, u64),
    /// When given, the time to first byte is taken when the body first satisfies it (see
    /// [`Connection::exchange_watching`]; a response it never accepts keeps its first byte).
    pub watch: Option<fn(&[u8]) -> bool>,
}

/// The in-process edge's threads, nothing beside them, and times to the first byte.
const IN_PROCESS: Driven<'static> = Driven {
    cpu_ms: &|| (harness::edge_cpu_ms(), 0),
    watch: None,
};

/// Drives `addr` with `concurrency` connections for warmup + duration.
pub fn drive(
    load: &Runtime,
    addr: SocketAddr,
    request: Arc<Vec<u8>>,
    concurrency: usize,
    warmup: Duration,
    duration: Duration,
    driven: &Driven<'_>,
) -> anyhow::Result<Load> {
    let watch = driven.watch;
    let measuring = Arc::new(AtomicBool::new(false));
    let stop = Arc::new(AtomicBool::new(false));
    let done = Arc::new(AtomicU64::new(0));
    let errors = Arc::new(AtomicU64::new(0));
    let clients: Vec<_> = (0..concurrency)
        .map(|_| {
            let (measuring, stop, done, errors) = (
                Arc::clone(&measuring),
                Arc::clone(&stop),
                Arc::clone(&done),
                Arc::clone(&errors),
            );
            let request = Arc::clone(&request);
            load.spawn(async move {
                let mut first_byte = Histogram::default();
                let mut total = Histogram::default();
                let mut connection = Connection::connect(addr).await?;
                while !stop.load(Ordering::Relaxed) {
                    let exchange = connection.exchange_watching(&request, false, watch).await?;
                    if !measuring.load(Ordering::Relaxed) {
                        continue;
                    }
                    if exchange.status != 200 {
                        errors.fetch_add(1, Ordering::Relaxed);
                        continue;
                    }
                    first_byte.record_duration(exchange.watched.unwrap_or(exchange.first_byte));
                    total.record_duration(exchange.total);
                    done.fetch_add(1, Ordering::Relaxed);
                }
                anyhow::Ok((first_byte, total))
            })
        })
        .collect();
    std::thread::sleep(warmup);
    measuring.store(true, Ordering::Relaxed);
    let done_0 = done.load(Ordering::Relaxed);
    let cpu_0 = (driven.cpu_ms)();
    let started = Instant::now();
    std::thread::sleep(duration);
    let finished = done.load(Ordering::Relaxed) - done_0;
    let cpu = (driven.cpu_ms)();
    let (cpu, other_cpu) = (cpu.0.saturating_sub(cpu_0.0), cpu.1.saturating_sub(cpu_0.1));
    let elapsed = started.elapsed().as_secs_f64();
    measuring.store(false, Ordering::Relaxed);
    stop.store(true, Ordering::Relaxed);
    let mut first_byte = Histogram::default();
    let mut total = Histogram::default();
    for client in clients {
        let (f, t) = load.block_on(client)??;
        first_byte.merge(&f);
        total.merge(&t);
    }
    Ok(Load {
        requests_per_s: finished as f64 / elapsed,
        cpu_us_per_request: cpu as f64 * 1_000.0 / finished.max(1) as f64,
        other_cpu_us_per_request: other_cpu as f64 * 1_000.0 / finished.max(1) as f64,
        first_byte,
        total,
        errors: errors.load(Ordering::Relaxed),
    })
}

/// The simulated nodes of `args`, registered with the edge at `addr` from the current
/// runtime: lean nodes' tasks, or mock nodes.
pub async fn start_nodes(
    args: &ApiArgs,
    addr: SocketAddr,
    count: usize,
) -> anyhow::Result<(Vec<JoinHandle<anyhow::Result<u64>>>, Vec<MockNode>)> {
    if args.node == "mock" {
        let mut mocks = Vec::with_capacity(count);
        for i in 0..count {
            mocks.push(MockNode::start(addr, MockOptions::new(&harness::token(i))).await?);
        }
        return Ok((Vec::new(), mocks));
    }
    let plan = Arc::new(Plan {
        outputs: args.chunks,
        text_bytes: 0,
        stamped: false,
        texts: words(args.chunks),
        ping: false,
    });
    Ok((lean::start_nodes(addr, count, &plan).await?, Vec::new()))
}

/// The most runs a node may be sent at once for `args`: the most concurrent requests asked
/// for.
pub fn most_concurrent(args: &ApiArgs) -> u32 {
    let most = args.concurrency.iter().copied().max().unwrap_or(1).max(1);
    u32::try_from(most).unwrap_or(u32::MAX)
}

/// The edge's config for `args`: the shipped defaults, `args.nodes` node definitions
/// that take the most concurrent runs asked for, no default deadline, and, with `nats`
/// (`--cluster`), the `[cluster]` of a site of its own there.
pub fn edge_config(args: &ApiArgs, nats: Option<&str>) -> String {
    let nodes = Nodes {
        count: args.nodes.max(1),
        max_concurrent_runs: most_concurrent(args),
        heartbeat_interval_ms: 600_000,
    };
    let mut extra = String::from("[api]\ndefault_deadline_ms = 0\n");
    if let Some(url) = nats {
        // A site of its own: no lease or journal stream left by an earlier run.
        let started = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |since| since.as_millis());
        let site = format!("loadgen-{}-{started}", std::process::id());
        extra.push_str(&format!(
            "[edge]\nid = \"loadgen-edge\"\n[cluster]\nsite = {site:?}\nnats = {url:?}\n"
        ));
        if let Some(mib) = args.snapshot_after_mib {
            extra.push_str(&format!(
                "snapshot_after_bytes = {}\nsnapshot_check_ms = 1000\n",
                mib << 20
            ));
        }
    }
    harness::config(nodes, &extra)
}

/// The edge's event sink `args` names.
pub fn sink_kind(args: &ApiArgs) -> SinkKind {
    match args.sink.as_str() {
        "file" => SinkKind::File,
        "stdout" => SinkKind::Stdout,
        "log" => SinkKind::Log,
        _ => SinkKind::Null,
    }
}

/// Whether `mode` (`stream` or `full`) streams.
pub fn streams(mode: &str) -> anyhow::Result<bool> {
    match mode {
        "stream" => Ok(true),
        "full" => Ok(false),
        other => bail!("unknown mode {other:?} (stream, full)"),
    }
}

pub fn run(args: &ApiArgs, common: &Common) -> anyhow::Result<Vec<Record>> {
    if args.rig == "shared-core" {
        if args.cluster {
            bail!("--cluster runs on the in-process rig only");
        }
        return crate::shared_core::run(args, common);
    }
    if args.floor {
        bail!("--floor runs on the shared-core rig only (--rig shared-core)");
    }
    if args.sink == "stdout" && !common.child {
        return crate::run_in_child(common, "api", &child_args(args));
    }
    harness::init_logging(common);
    let nats = match (args.cluster, &args.nats_url) {
        (true, None) => Some(NatsChild::start(true)?),
        _ => None,
    };
    let nats_url = args
        .nats_url
        .as_deref()
        .or(nats.as_ref().map(|child| child.url.as_str()));
    let config = edge_config(args, nats_url);
    let edge = InProcessEdge::start(&config, &[sink_kind(args)], common.edge_threads)?;
    if args.cluster {
        edge.wait_acting(Duration::from_secs(30))?;
    }
    let load = harness::runtime("load", common.load_threads)?;
    let (servers, mocks) = load.block_on(start_nodes(args, edge.node_addr, args.nodes.max(1)))?;

    let http = edge.http_addr;
    let canned = load
        .block_on(capture(http, args.chunks))
        .context("the edge's API did not answer as expected")?;
    let direct = {
        let _guard = edge.runtime.enter();
        edge.runtime.block_on(start_baseline(canned))?
    };

    let warmup = Duration::from_millis(args.warmup_ms);
    let duration = Duration::from_millis(args.duration_ms);
    let site = match (args.cluster, args.snapshot_after_mib) {
        (true, Some(mib)) => format!("cluster snapshot_after_mib={mib} "),
        (true, None) => "cluster ".to_owned(),
        (false, _) => String::new(),
    };
    let mut records = Vec::new();
    for mode in &args.modes {
        let stream = streams(mode)?;
        for &concurrency in &args.concurrency {
            let concurrency = concurrency.max(1);
            let baseline = drive(
                &load,
                direct,
                Arc::new(post_json(direct, PATH, &body(args.chunks, stream))),
                concurrency,
                warmup,
                duration,
                &IN_PROCESS,
            )?;
            let through = drive(
                &load,
                http,
                Arc::new(post_json(http, PATH, &body(args.chunks, stream))),
                concurrency,
                warmup,
                duration,
                &IN_PROCESS,
            )?;
            records.push(
                Record::new(format!("{site}mode={mode} c={concurrency}"))
                    .with("edge_rps", through.requests_per_s)
                    .with("direct_rps", baseline.requests_per_s)
                    .with(
                        "ratio",
                        through.requests_per_s / baseline.requests_per_s.max(1e-9),
                    )
                    .with("edge_ttfb_p50_us", through.first_byte.quantile_us(0.5))
                    .with("edge_ttfb_p99_us", through.first_byte.quantile_us(0.99))
                    .with("direct_ttfb_p50_us", baseline.first_byte.quantile_us(0.5))
                    .with("direct_ttfb_p99_us", baseline.first_byte.quantile_us(0.99))
                    .with(
                        "ttfb_p99_overhead_us",
                        through.first_byte.quantile_us(0.99)
                            - baseline.first_byte.quantile_us(0.99),
                    )
                    .with("edge_total_p50_us", through.total.quantile_us(0.5))
                    .with("edge_total_p99_us", through.total.quantile_us(0.99))
                    .with("direct_total_p50_us", baseline.total.quantile_us(0.5))
                    .with("direct_total_p99_us", baseline.total.quantile_us(0.99))
                    .with("edge_cpu_us_per_request", through.cpu_us_per_request)
                    .with("direct_cpu_us_per_request", baseline.cpu_us_per_request)
                    .with("journal_mib", journal_mib(&edge))
                    .with("snapshots", snapshots(&edge))
                    .with("errors", (through.errors + baseline.errors) as f64),
            );
        }
    }
    edge.stop();
    for server in servers {
        let _ = load.block_on(server);
    }
    for mock in mocks {
        mock.kill();
        let _ = load.block_on(mock.ended());
    }
    load.shutdown_timeout(Duration::from_secs(2));
    Ok(records)
}
