//! `readopt`: what an edge restart costs the runs open at the crash (issue 32). The `edge`
//! binary with its run journal, reference nodes (`edge-node`, in process, the library's own
//! reconnect backoff) in front of a minimal OpenAI engine in this program, and N streamed
//! chat completions. Each answer is `--deltas` pieces; the engine sends the first `--before`
//! at once and holds the rest. When every run is open with its first pieces relayed (and
//! the journal holds them: the listing that shows it flushes the journal), the edge is
//! killed with `SIGKILL` and started again on the same journal and addresses; the nodes
//! reconnect and claim their runs. Reported: the time from the kill and from the new
//! process's start until the edge serves and until every run is re-attached
//! (`edge_runs_reattached_total`), then — the engine let go — until every run has ended; and
//! from each run's record: runs completed, runs lost (ended otherwise), events stored per run
//! against the events the run sent (missing and repeated events).
//!
//! With `--cluster`, a takeover instead (issue 49): two members of one site on a JetStream
//! `nats-server` this program starts (the lease's default timings), the nodes knowing both;
//! the active member is killed and nothing restarts. "Restart to ready" is then the kill to
//! the standby answering `/readyz` 200 (its lease taken once the killed one's lapsed, the
//! site's journal caught up, the open runs adopted), and the re-attachments are counted on it.

use std::convert::Infallible;
use std::io::{Read as _, Write as _};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use axum::Router;
use axum::body::{Body, Bytes};
use axum::response::Response;
use axum::routing::{get, post};
use clap::Args;
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::Common;
use crate::engine::edge_config;
use crate::external::NatsChild;
use crate::harness::{self, EdgeProcess, token};
use crate::http::post_json;
use crate::register::edge_bin;
use crate::stats::Record;

#[derive(Debug, Clone, Args)]
pub struct ReadoptArgs {
    /// Streamed runs open when the edge is killed (at most 1,000).
    #[arg(long, default_value_t = 200)]
    pub runs: usize,
    /// Reference nodes the runs are spread over.
    #[arg(long, default_value_t = 4)]
    pub nodes: usize,
    /// Pieces of text per answer.
    #[arg(long, default_value_t = 20)]
    pub deltas: usize,
    /// Pieces each run has streamed when the edge is killed.
    #[arg(long, default_value_t = 5)]
    pub before: usize,
    /// The nodes' first reconnect delay ceiling (`edge-node --reconnect-min-ms`).
    #[arg(long, default_value_t = 500)]
    pub reconnect_min_ms: u64,
    /// The nodes' largest reconnect delay ceiling (`edge-node --reconnect-max-ms`).
    #[arg(long, default_value_t = 30_000)]
    pub reconnect_max_ms: u64,
    /// How long each phase may take before the case fails.
    #[arg(long, default_value_t = 120_000)]
    pub limit_ms: u64,
    /// The `edge` binary [default: `edge` beside this program's directory].
    #[arg(long)]
    pub edge_bin: Option<std::path::PathBuf>,
    /// A takeover instead of a restart (issue 49): two members of a site (`[cluster]`, the
    /// lease's default timings) on a JetStream `nats-server` this program starts, the nodes
    /// knowing both; the active member is killed and the standby takes the runs over.
    #[arg(long)]
    pub cluster: bool,
}

/// The engine's chunk carrying `text` (or the finish, without).
fn chunk(text: Option<&str>) -> Bytes {
    let choice = match text {
        Some(text) => json!({"index": 0, "delta": {"content": text}}),
        None => json!({"index": 0, "delta": {}, "finish_reason": "stop"}),
    };
    Bytes::from(format!("data: {}\n\n", json!({"choices": [choice]})))
}

/// The engine: `GET /v1/models` answers; each chat completion streams `deltas` pieces, the
/// first `before` at once, the rest once `release` says so.
async fn start_engine(
    deltas: usize,
    before: usize,
    release: watch::Receiver<bool>,
) -> anyhow::Result<SocketAddr> {
    let listener = TcpListener::bind(SocketAddr::from(([127, 0, 0, 1], 0))).await?;
    let addr = listener.local_addr()?;
    let answer = move || {
        let mut release = release.clone();
        // Bounded by the answer's size: every piece is sent at most once.
        let (tx, rx) = tokio::sync::mpsc::channel::<Bytes>(deltas + 2);
        tokio::spawn(async move {
            for n in 0..deltas {
                if n == before && release.wait_for(|go| *go).await.is_err() {
                    return;
                }
                let _ = tx.send(chunk(Some(&format!("d{n} ")))).await;
            }
            let _ = tx.send(chunk(None)).await;
            let _ = tx.send(Bytes::from_static(b"data: [DONE]\n\n")).await;
        });
        let body = futures::stream::unfold(rx, |mut rx| async move {
            rx.recv().await.map(|b| (Ok::<_, Infallible>(b), rx))
        });
        async move {
            Response::builder()
                .header("content-type", "text/event-stream")
                .body(Body::from_stream(body))
                .unwrap_or_default()
        }
    };
    let models = || async { axum::Json(json!({"object": "list", "data": [{"id": "tiny"}]})) };
    let router = Router::new()
        .route("/v1/models", get(models))
        .route("/v1/chat/completions", post(answer));
    // Ends with the load runtime.
    tokio::spawn(async move {
        let _ = axum::serve(listener, router).await;
    });
    Ok(addr)
}

/// A blocking HTTP/1.0 `GET` (so the body comes unchunked); returns the body.
fn get_body(addr: SocketAddr, path: &str) -> anyhow::Result<String> {
    let mut stream = TcpStream::connect_timeout(&addr, Duration::from_secs(2))?;
    stream.set_read_timeout(Some(Duration::from_secs(10)))?;
    write!(stream, "GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n")?;
    let mut response = String::new();
    stream.read_to_string(&mut response)?;
    let (_, body) = response
        .split_once("\r\n\r\n")
        .context("an HTTP response without a body")?;
    Ok(body.to_owned())
}

/// The runs `GET /admin/v1/runs?state=...` lists (at most 1,000).
fn runs(edge: &EdgeProcess, state: &str) -> anyhow::Result<Vec<Value>> {
    let path = format!("/admin/v1/runs?state={state}&limit=1000");
    let list: Value = serde_json::from_str(&get_body(edge.admin_addr, &path)?)?;
    Ok(list["runs"].as_array().cloned().unwrap_or_default())
}

/// Waits (up to `limit`) until `done` holds; returns how long it took.
fn until(
    limit: Duration,
    what: &str,
    mut done: impl FnMut() -> anyhow::Result<bool>,
) -> anyhow::Result<Duration> {
    let started = Instant::now();
    while started.elapsed() < limit {
        if done()? {
            return Ok(started.elapsed());
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    bail!("not within {limit:?}: {what}")
}

/// Opens `count` streamed chat completions, each read (and dropped) until the edge goes.
fn open_streams(load: &tokio::runtime::Runtime, http: SocketAddr, count: usize) {
    let body = json!({
        "model": "llama/tiny", "stream": true,
        "messages": [{"role": "user", "content": "go on"}],
    })
    .to_string();
    let request = post_json(http, "/v1/chat/completions", &body);
    for _ in 0..count {
        let request = request.clone();
        load.spawn(async move {
            let Ok(mut stream) = tokio::net::TcpStream::connect(http).await else {
                return;
            };
            if stream.write_all(&request).await.is_ok() {
                let mut sink = Vec::new();
                let _ = stream.read_to_end(&mut sink).await;
            }
        });
    }
}

pub fn run(args: &ReadoptArgs, common: &Common) -> anyhow::Result<Vec<Record>> {
    if args.before == 0 || args.before >= args.deltas {
        bail!("--before must be at least 1 and below --deltas");
    }
    if args.runs == 0 || args.runs > 1_000 {
        bail!("--runs must be 1 to 1,000 (one page of the management API's listing)");
    }
    let binary = edge_bin(args.edge_bin.as_ref())?;
    let limit = Duration::from_millis(args.limit_ms);
    let load = harness::runtime("load", common.load_threads)?;
    let (release, released) = watch::channel(false);
    let engine = load.block_on(start_engine(args.deltas, args.before, released))?;
    let slots = args.runs.div_ceil(args.nodes.max(1)) + 1;
    let extra = format!(
        "[runs]\nresume_grace_ms = {}\n[events]\nsinks = [\"null\"]\n",
        args.limit_ms
    );
    let config = edge_config(&vec![engine; args.nodes.max(1)], &extra).replace(
        "max_concurrent_runs = 8",
        &format!("max_concurrent_runs = {slots}"),
    );
    let journal = tempfile::tempdir().context("cannot make the journal's directory")?;
    let journal = journal.path().join("journal.sqlite3");
    let nats = args.cluster.then(|| NatsChild::start(true)).transpose()?;
    let start = |at, member: Option<&str>| {
        let config = match (member, &nats) {
            (Some(id), Some(nats)) => format!(
                "[edge]\nid = {id:?}\n[cluster]\nsite = \"readopt\"\nnats = {:?}\n{config}",
                nats.url
            ),
            _ => config.clone(),
        };
        // Each member keeps a journal of its own (a cache of the site's stream).
        let own = member.map(|id| journal.with_file_name(format!("{id}.sqlite3")));
        EdgeProcess::start_at(
            &binary,
            &config,
            common.edge_threads,
            &common.edge_log_level,
            at,
            Some(own.as_deref().unwrap_or(&journal)),
            None,
        )
    };
    let (edge, standby) = if args.cluster {
        let active = start(None, Some("edge-a"))?;
        until(limit, "the first member holds the lease", || {
            Ok(active.is_ready())
        })?;
        (active, Some(start(None, Some("edge-b"))?))
    } else {
        (start(None, None)?, None)
    };
    let addrs = Some((edge.node_addr, edge.http_addr, edge.admin_addr));
    let stop = CancellationToken::new();
    let dialled = match &standby {
        Some(standby) => format!("{},{}", edge.node_addr, standby.node_addr),
        None => edge.node_addr.to_string(),
    };
    for i in 0..args.nodes.max(1) {
        let mut options = edge_node::NodeOptions::new(dialled.clone(), token(i));
        options.reconnect_min = Duration::from_millis(args.reconnect_min_ms);
        options.reconnect_max = Duration::from_millis(args.reconnect_max_ms);
        load.spawn(edge_node::run(options, stop.clone()));
    }
    open_streams(&load, edge.http_addr, args.runs);
    // Every run open with its first pieces relayed; then a listing of all runs flushes
    // the journal, so it holds them.
    let first = (args.before + 1) as u64;
    until(limit, "every run open with its first pieces", || {
        let open = runs(&edge, "open")?;
        let ready = open.iter().filter(|r| r["events"].as_u64() >= Some(first));
        Ok(ready.count() == args.runs)
    })?;
    let ids: Vec<String> = runs(&edge, "all")?
        .iter()
        .filter_map(|r| r["id"].as_str().map(str::to_owned))
        .collect();

    let killed = Instant::now();
    drop(edge); // SIGKILL, and reaped
    let spawned = Instant::now();
    let edge = match standby {
        // The standby takes over once the killed member's lease lapses.
        Some(standby) => {
            until(limit, "the standby takes over", || Ok(standby.is_ready()))?;
            standby
        }
        None => start(addrs, None)?,
    };
    let ready = spawned.elapsed();
    let reattached = until(limit, "every run re-attached", || {
        let metrics = edge.get("/metrics")?;
        let count = harness::metric(&metrics, "edge_runs_reattached_total", "").unwrap_or(0.0);
        Ok(count >= args.runs as f64)
    })? + ready;
    let reattached_after_kill = killed.elapsed();
    let _ = release.send(true);
    let ended = until(limit, "every run ended", || {
        Ok(runs(&edge, "open")?.is_empty())
    })?;
    let outcome = tally(&edge, &ids, args.deltas)?;
    stop.cancel();
    drop(edge);
    load.shutdown_timeout(Duration::from_secs(2));

    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    Ok(vec![
        Record::new(format!(
            "{}runs={} nodes={} deltas={} before={} reconnect_ms={}-{}",
            if args.cluster { "takeover " } else { "" },
            args.runs,
            args.nodes,
            args.deltas,
            args.before,
            args.reconnect_min_ms,
            args.reconnect_max_ms
        ))
        .with("restart_to_ready_ms", ms(ready))
        .with("restart_to_reattached_ms", ms(reattached))
        .with("kill_to_reattached_ms", ms(reattached_after_kill))
        .with("reattached_to_ended_ms", ms(ended))
        .with("runs_completed", outcome.completed as f64)
        .with("runs_lost", outcome.lost as f64)
        .with("events_missing", outcome.missing as f64)
        .with("events_repeated", outcome.repeated as f64)
        .with("runs_disordered", outcome.disordered as f64),
    ])
}

/// How the runs ended, from their records and stored events.
#[derive(Default)]
struct Outcome {
    completed: usize,
    lost: usize,
    /// Pieces of an answer the journal does not hold.
    missing: usize,
    /// Pieces held more than once, and terminal events past the first.
    repeated: usize,
    /// Runs whose pieces are stored out of order.
    disordered: usize,
}

/// Reads each run's record (its outcome) and stored events (`d0 `.. `d{deltas-1} `, each
/// once and in order, then one terminal event).
fn tally(edge: &EdgeProcess, ids: &[String], deltas: usize) -> anyhow::Result<Outcome> {
    let expected: Vec<String> = (0..deltas).map(|n| format!("d{n} ")).collect();
    let mut outcome = Outcome::default();
    for id in ids {
        let record: Value =
            serde_json::from_str(&get_body(edge.admin_addr, &format!("/admin/v1/runs/{id}"))?)?;
        if record["outcome"] == "completed" {
            outcome.completed += 1;
        } else {
            outcome.lost += 1;
        }
        let path = format!("/admin/v1/runs/{id}/events?format=jsonl&follow=false");
        let events: Vec<Value> = get_body(edge.admin_addr, &path)?
            .lines()
            .filter_map(|line| serde_json::from_str(line).ok())
            .collect();
        let texts: Vec<&str> = events
            .iter()
            .filter(|e| e["kind"] == "output")
            .filter_map(|e| e["text"].as_str())
            .collect();
        let held = expected.iter().filter(|t| texts.contains(&t.as_str()));
        let held = held.count();
        outcome.missing += deltas - held;
        outcome.repeated += texts.len() - held;
        let terminals = events
            .iter()
            .filter(|e| e["kind"] != "output" && e["kind"] != "started")
            .count();
        outcome.repeated += terminals.saturating_sub(1);
        outcome.disordered += usize::from(held == deltas && texts != expected);
    }
    Ok(outcome)
}
