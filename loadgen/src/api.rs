//! `api`: OpenAI chat completions (streaming and not, K chunks) through the edge's HTTP API
//! at several concurrencies, next to a direct baseline measured in the same process: a
//! minimal HTTP server (axum, the edge's own HTTP stack) on the edge's runtime answering
//! the very bytes the edge answered, with no edge, run or node in between. Both are driven
//! by the same minimal keep-alive client; the report gives requests per second, time to the
//! first response byte and to the last, and the edge's share of the baseline's throughput.

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

use crate::Common;
use crate::harness::{self, InProcessEdge, Nodes};
use crate::http::{Connection, post_json};
use crate::lean::{self, Plan};
use crate::mock_node::{MockNode, MockOptions};
use crate::stats::{Histogram, Record};

const PATH: &str = "/v1/chat/completions";

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
}

/// What the edge's journal files take on disk now, in MiB.
fn journal_mib(edge: &InProcessEdge) -> f64 {
    edge.parts.journal.stats().bytes as f64 / f64::from(1u32 << 20)
}

/// `args` as the arguments of a child run.
fn child_args(args: &ApiArgs) -> Vec<String> {
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
    ]
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

/// What the baseline answers: the edge's own answers, captured.
#[derive(Clone)]
struct Canned {
    full: Bytes,
    /// The SSE events of the streamed answer, each sent as its own chunk.
    events: Vec<Bytes>,
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
async fn capture(addr: SocketAddr, chunks: usize) -> anyhow::Result<Canned> {
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
struct Load {
    requests_per_s: f64,
    /// CPU of the server's runtime (the edge's threads) per request, in µs.
    cpu_us_per_request: f64,
    first_byte: Histogram,
    total: Histogram,
    errors: u64,
}

/// Drives `addr` with `concurrency` connections for warmup + duration.
fn drive(
    load: &Runtime,
    addr: SocketAddr,
    request: Arc<Vec<u8>>,
    concurrency: usize,
    warmup: Duration,
    duration: Duration,
) -> anyhow::Result<Load> {
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
                    let exchange = connection.exchange(&request, false).await?;
                    if !measuring.load(Ordering::Relaxed) {
                        continue;
                    }
                    if exchange.status != 200 {
                        errors.fetch_add(1, Ordering::Relaxed);
                        continue;
                    }
                    first_byte.record_duration(exchange.first_byte);
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
    let cpu_0 = harness::edge_cpu_ms();
    let started = Instant::now();
    std::thread::sleep(duration);
    let finished = done.load(Ordering::Relaxed) - done_0;
    let cpu = harness::edge_cpu_ms() - cpu_0;
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
        first_byte,
        total,
        errors: errors.load(Ordering::Relaxed),
    })
}

pub fn run(args: &ApiArgs, common: &Common) -> anyhow::Result<Vec<Record>> {
    if args.sink == "stdout" && !common.child {
        return crate::run_in_child(common, "api", &child_args(args));
    }
    harness::init_logging(common);
    let sink = match args.sink.as_str() {
        "file" => SinkKind::File,
        "stdout" => SinkKind::Stdout,
        "log" => SinkKind::Log,
        _ => SinkKind::Null,
    };
    let most = args.concurrency.iter().copied().max().unwrap_or(1).max(1);
    let nodes = Nodes {
        count: args.nodes.max(1),
        max_concurrent_runs: u32::try_from(most).unwrap_or(u32::MAX),
        heartbeat_interval_ms: 600_000,
    };
    let extra = "[api]\ndefault_deadline_ms = 0\n";
    let edge = InProcessEdge::start(&harness::config(nodes, extra), &[sink], common.edge_threads)?;
    let load = harness::runtime("load", common.load_threads)?;
    let addr = edge.node_addr;
    let (servers, mocks) = load.block_on(async {
        if args.node == "mock" {
            let mut mocks = Vec::with_capacity(nodes.count);
            for i in 0..nodes.count {
                mocks.push(MockNode::start(addr, MockOptions::new(&harness::token(i))).await?);
            }
            return anyhow::Ok((Vec::new(), mocks));
        }
        let plan = Arc::new(Plan {
            outputs: args.chunks,
            text_bytes: 0,
            stamped: false,
            texts: words(args.chunks),
            ping: false,
        });
        anyhow::Ok((
            lean::start_nodes(addr, nodes.count, &plan).await?,
            Vec::new(),
        ))
    })?;

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
    let mut records = Vec::new();
    for mode in &args.modes {
        let stream = match mode.as_str() {
            "stream" => true,
            "full" => false,
            other => bail!("unknown mode {other:?} (stream, full)"),
        };
        for &concurrency in &args.concurrency {
            let concurrency = concurrency.max(1);
            let baseline = drive(
                &load,
                direct,
                Arc::new(post_json(direct, PATH, &body(args.chunks, stream))),
                concurrency,
                warmup,
                duration,
            )?;
            let through = drive(
                &load,
                http,
                Arc::new(post_json(http, PATH, &body(args.chunks, stream))),
                concurrency,
                warmup,
                duration,
            )?;
            records.push(
                Record::new(format!("mode={mode} c={concurrency}"))
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
