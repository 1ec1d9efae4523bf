//! `latency`: the real path's latency, a few callers at a time. A `llama-server` (started
//! here, or `--engine`), an edge in process on the shipped default (journal on, stdout sink:
//! the scenario runs in a child whose standard output is `/dev/null`) and a reference node
//! in process on its own runtime; each caller interleaves streamed chat requests straight
//! to the engine and through the edge (and through SMG with `--smg`, and through the
//! shipped binaries — `edge serve` and an `edge-node` process — with `--binaries`).
//! With `--lora`, the engine started here loads LoRAs, and the engine direct, the edge and
//! the binaries each get a second path asking for the first LoRA (`direct-lora`,
//! `edge-lora`, `edge-bin-lora`: the engine asked with that LoRA at scale 1 and the others
//! at 0, the edge asked for `llama/<lora>`), so a LoRA's cost against its base and the
//! edge's share of each are read in one run. Reported per path:
//! time to the first content and to the end, p50 and p90; for the edge, the overhead over
//! the engine direct and the breakdown of its time to first content into the hops between
//! the edge's and the node's hop events (`edge::hops`, collected by a `tracing` layer here).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use clap::Args;
use edge::settings::SinkKind;
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;
use tracing_subscriber::filter::{LevelFilter, Targets};
use tracing_subscriber::fmt::writer::MakeWriterExt;
use tracing_subscriber::prelude::*;

use crate::Common;
use crate::engine::{Engine, edge_config, wait_listed, wait_serving};
use crate::harness::{EdgeProcess, InProcessEdge, runtime, runtime_with_slice, token};
use crate::hops::{HopLog, SEGMENTS};
use crate::http::{Connection, post_json};
use crate::smg::Smg;
use crate::splice::Splice;
use crate::stats::{Histogram, Record};

#[derive(Debug, Clone, Args)]
pub struct LatencyArgs {
    /// The `llama-server` binary (`bash .ci/engines/llama-server.sh` prints it).
    #[arg(long, required_unless_present = "engine")]
    llama_server: Option<PathBuf>,
    /// The GGUF model it serves (the tests' tiny model).
    #[arg(long, required_unless_present = "engine")]
    model: Option<PathBuf>,
    /// An engine already running (`host:port`, serving the model as `tiny`) instead.
    #[arg(long)]
    engine: Option<SocketAddr>,
    /// Measured requests per path at each concurrency.
    #[arg(long, default_value_t = 80)]
    requests: usize,
    /// Unmeasured requests per path before them.
    #[arg(long, default_value_t = 8)]
    warmup: usize,
    /// Callers at once, each alternating between the paths.
    #[arg(long, value_delimiter = ',', default_value = "1,4")]
    concurrency: Vec<usize>,
    /// Tokens each answer generates.
    #[arg(long, default_value_t = 8)]
    max_tokens: u32,
    /// Slots of the engine started here (`--parallel`).
    #[arg(long, default_value_t = 4)]
    slots: u32,
    /// The `smg` program (`pip install smg==1.13.*`): adds SMG (`smg launch --backend
    /// openai`) in front of the same engine as a third path.
    #[arg(long)]
    smg: Option<PathBuf>,
    /// A directory holding release builds of `edge` and `edge-node` (`target/release`):
    /// adds them as processes — `edge serve` with `--edge-threads` workers, one node
    /// definition and the journal as `--journal` says, and `edge-node` dialling it — as the
    /// path `edge-bin` (no hop breakdown: their logs are not collected).
    #[arg(long)]
    binaries: Option<PathBuf>,
    /// With `--binaries`: the processes log their hop events too (JSON lines, read back
    /// after each concurrency) and `edge-bin` gets its breakdown, `hops-bin`. Each hop is
    /// then a log line written on the path, which `edge-bin`'s figures include.
    #[arg(long, requires = "binaries")]
    binary_hops: bool,
    /// Another directory of `edge` and `edge-node` builds (the build before a change),
    /// started the same way as the path `edge-bin-base` and interleaved with `edge-bin` in
    /// the same rounds, so two builds are compared under the same moment's noise.
    #[arg(long, requires = "binaries")]
    baseline_binaries: Option<PathBuf>,
    /// A LoRA GGUF of the model for the engine started here to load (`--lora`, with
    /// `--lora-init-without-apply`), repeatable; llama-server and the node name each by its
    /// file's stem. Adds the paths `direct-lora`, `edge-lora` (and `edge-bin-lora`) asking
    /// for the first one, and implies `--full-answers`: a LoRA changes what, and how much,
    /// the model answers.
    #[arg(long = "lora", conflicts_with = "engine")]
    loras: Vec<PathBuf>,
    /// Every answer runs to `--max-tokens`: the tiny model's end of text is banned
    /// (`logit_bias`), so paths that answer different text still answer as many tokens.
    #[arg(long)]
    full_answers: bool,
    /// Adds the path `floor`: the engine behind two TCP splices in a row, each on a runtime
    /// thread of its own, forwarding bytes and nothing else — the floor of the edge and
    /// node's two hops, against which their overhead is read (issue 67).
    #[arg(long)]
    floor_hops: bool,
}

/// The end-of-text token of the tests' tiny model (SentencePiece `</s>`), banned with
/// `--full-answers`.
const END_OF_TEXT: &str = "2";

/// `args` as the arguments of the child run.
fn child_args(args: &LatencyArgs) -> Vec<String> {
    let concurrency: Vec<String> = args.concurrency.iter().map(usize::to_string).collect();
    let path = |p: &Option<PathBuf>| p.as_ref().map(|p| p.display().to_string());
    [
        path(&args.llama_server).map(|p| format!("--llama-server={p}")),
        path(&args.model).map(|p| format!("--model={p}")),
        args.engine.map(|a| format!("--engine={a}")),
        path(&args.smg).map(|p| format!("--smg={p}")),
        path(&args.binaries).map(|p| format!("--binaries={p}")),
        args.binary_hops.then(|| "--binary-hops".to_owned()),
        args.full_answers.then(|| "--full-answers".to_owned()),
        args.floor_hops.then(|| "--floor-hops".to_owned()),
        path(&args.baseline_binaries).map(|p| format!("--baseline-binaries={p}")),
    ]
    .into_iter()
    .flatten()
    .chain(args.loras.iter().map(|p| format!("--lora={}", p.display())))
    .chain([
        format!("--requests={}", args.requests),
        format!("--warmup={}", args.warmup),
        format!("--concurrency={}", concurrency.join(",")),
        format!("--max-tokens={}", args.max_tokens),
        format!("--slots={}", args.slots),
    ])
    .collect()
}

pub fn run(args: &LatencyArgs, common: &Common) -> anyhow::Result<Vec<Record>> {
    if !common.child {
        return crate::run_in_child(common, "latency", &child_args(args));
    }
    let log = install_logging(&common.edge_log_level)?;
    let engine = match (&args.engine, &args.llama_server, &args.model) {
        (Some(_), _, _) => None,
        (None, Some(binary), Some(model)) => {
            Some(Engine::start(binary, model, args.slots, &args.loras)?)
        }
        _ => bail!("give --engine, or --llama-server and --model"),
    };
    let engine_addr = match (&engine, args.engine) {
        (Some(engine), _) => engine.addr,
        (None, Some(addr)) => addr,
        (None, None) => bail!("no engine"),
    };
    let smg = args
        .smg
        .as_ref()
        .map(|program| {
            let worker = format!("http://{engine_addr}");
            Smg::start(program, &["--backend", "openai", "--worker-urls", &worker])
        })
        .transpose()?;
    // The outer splice forwards to the inner one, which forwards to the engine.
    let floor = if args.floor_hops {
        let inner = Splice::start("floor-b", engine_addr)?;
        let outer = Splice::start("floor-a", inner.addr)?;
        Some([outer, inner])
    } else {
        None
    };
    let binaries = args
        .binaries
        .as_ref()
        .map(|dir| Binaries::start(dir, engine_addr, common.edge_threads, args.binary_hops))
        .transpose()?;
    let baseline = args
        .baseline_binaries
        .as_ref()
        .map(|dir| Binaries::start(dir, engine_addr, common.edge_threads, false))
        .transpose()?;
    let edge = InProcessEdge::start(
        &edge_config(&[engine_addr], ""),
        &[SinkKind::Stdout],
        common.edge_threads,
    )?;
    // The node on a runtime of its own, as its own process would have, its thread asking
    // for the scheduling slice `edge-node` asks for by default.
    let node_runtime = runtime_with_slice("node", 1, Some(edge_thread_slice::MIN_SLICE))?;
    let stop = CancellationToken::new();
    let options = edge_node::NodeOptions::new(edge.node_addr.to_string(), token(0));
    node_runtime.spawn(edge_node::run(options, stop.clone()));
    let load = runtime("load", common.load_threads)?;
    let paths = Paths {
        direct: engine_addr,
        edge: edge.http_addr,
        smg: smg.as_ref().map(|s| s.addr),
        floor: floor.as_ref().map(|[outer, _]| outer.addr),
        binaries: binaries.as_ref().map(|b| b.edge.http_addr),
        baseline: baseline.as_ref().map(|b| b.edge.http_addr),
        loras: lora_names(&args.loras)?,
    };
    let result = load.block_on(async {
        wait_serving(edge.http_addr).await?;
        for http in paths.binaries.into_iter().chain(paths.baseline) {
            wait_serving(http).await?;
        }
        if let Some(lora) = paths.lora_model() {
            for http in [Some(edge.http_addr), paths.binaries].into_iter().flatten() {
                wait_listed(http, &lora).await?;
            }
        }
        if let Some(smg) = paths.smg {
            wait_answering(smg, "tiny").await?;
        }
        let mut records = Vec::new();
        for &callers in &args.concurrency {
            log.clear();
            let logs = (&log, binaries.as_ref());
            records.extend(measure(args, &paths, callers.max(1), logs).await?);
        }
        anyhow::Ok(records)
    });
    stop.cancel();
    node_runtime.shutdown_timeout(Duration::from_secs(2));
    drop(load);
    edge.stop();
    drop(smg);
    drop(floor);
    drop(binaries);
    drop(baseline);
    drop(engine);
    result
}

/// The edge's and node's logs as `edge serve` and `edge-node` write them at `level`
/// (formatted as ever, only warnings and errors shown), and the hop events into the log
/// returned.
fn install_logging(level: &str) -> anyhow::Result<HopLog> {
    let log = HopLog::default();
    // As `edge serve` filters its logs: export-only spans are never formatted.
    let filter =
        tracing_subscriber::EnvFilter::try_new(level)?.add_directive("edge::otel=off".parse()?);
    let writer = std::io::stderr
        .with_max_level(tracing::Level::WARN)
        .or_else(std::io::sink);
    let logs = tracing_subscriber::fmt::layer()
        .with_ansi(false)
        .with_writer(writer)
        .with_filter(filter);
    let hops = log
        .layer()
        .with_filter(Targets::new().with_target(edge::hops::TARGET, LevelFilter::TRACE));
    tracing_subscriber::registry()
        .with(logs)
        .with(hops)
        .try_init()
        .map_err(|error| anyhow::anyhow!("cannot install the logging: {error}"))?;
    Ok(log)
}

/// The shipped binaries as children: `edge serve` and an `edge-node` dialling it.
struct Binaries {
    edge: EdgeProcess,
    node: Child,
    /// With `--binary-hops`: the directory of their logs (`edge.log`, `node.log`), and this
    /// process's clock read at their start, to put the logs' timestamps on it.
    logs: Option<(tempfile::TempDir, (Instant, std::time::SystemTime))>,
}

impl Binaries {
    fn start(
        dir: &std::path::Path,
        engine: SocketAddr,
        threads: usize,
        hops: bool,
    ) -> anyhow::Result<Self> {
        const HOPS: &str = "info,edge_hop=trace";
        let edge_binary = dir.join("edge");
        let mut node = Command::new(dir.join("edge-node"));
        node.env("EDGE_NODE_TOKEN", token(0)).env_remove("RUST_LOG");
        let (edge, logs) = if hops {
            let logs = tempfile::tempdir().context("cannot make a temporary directory")?;
            let log = |name| std::fs::File::create(logs.path().join(name));
            let config = edge_config(&[engine], "[log]\nformat = \"json\"\n\n");
            let log_file = Some(log("edge.log")?);
            let edge =
                EdgeProcess::start_at(&edge_binary, &config, threads, HOPS, None, None, log_file)?;
            node.args(["--log-format", "json"])
                .env("RUST_LOG", HOPS)
                .stderr(log("node.log")?);
            let clock = (Instant::now(), std::time::SystemTime::now());
            (edge, Some((logs, clock)))
        } else {
            node.stderr(Stdio::null());
            let config = edge_config(&[engine], "");
            let edge = EdgeProcess::start(&edge_binary, &config, threads, "info")?;
            (edge, None)
        };
        let node = node
            .args(["--edge", &edge.node_addr.to_string()])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .spawn()
            .with_context(|| format!("cannot start {}", dir.join("edge-node").display()))?;
        Ok(Self { edge, node, logs })
    }

    /// The hop events the two processes logged so far, when they log them.
    fn hop_log(&self) -> anyhow::Result<Option<HopLog>> {
        let Some((dir, clock)) = &self.logs else {
            return Ok(None);
        };
        let log = HopLog::default();
        for name in ["edge.log", "node.log"] {
            let text = std::fs::read_to_string(dir.path().join(name))
                .with_context(|| format!("cannot read the {name} of the binaries"))?;
            log.read_json_lines(&text, *clock);
        }
        Ok(Some(log))
    }
}

impl Drop for Binaries {
    fn drop(&mut self) {
        // Only the child this struct started; the edge stops with its own drop.
        let _ = self.node.kill();
        let _ = self.node.wait();
    }
}

/// Waits until `addr` answers a chat request for `model` (SMG registers its worker in the
/// background after it is healthy).
pub(crate) async fn wait_answering(addr: SocketAddr, model: &str) -> anyhow::Result<()> {
    let body = json!({"model": model, "max_tokens": 1,
        "messages": [{"role": "user", "content": "x"}]});
    let request = post_json(addr, "/v1/chat/completions", &body.to_string());
    let started = Instant::now();
    while started.elapsed() < Duration::from_secs(30) {
        let mut connection = Connection::connect(addr).await?;
        let answered = connection.exchange(&request, false).await;
        if answered.is_ok_and(|exchange| exchange.status == 200) {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    bail!("{addr} did not answer a chat request within 30 s")
}

/// Where each path's requests go.
struct Paths {
    direct: SocketAddr,
    edge: SocketAddr,
    smg: Option<SocketAddr>,
    /// The outer of the two splices in front of the engine (`--floor-hops`).
    floor: Option<SocketAddr>,
    binaries: Option<SocketAddr>,
    baseline: Option<SocketAddr>,
    /// The engine's LoRAs by id (their files' stems).
    loras: Vec<String>,
}

/// One path: its name, address, and what its requests add to the chat body (the model,
/// and the engine's `lora` scales when asked directly).
struct Path {
    name: &'static str,
    addr: SocketAddr,
    fields: Value,
}

impl Path {
    fn new(name: &'static str, addr: SocketAddr, model: &str, lora: Option<Value>) -> Self {
        let mut fields = json!({ "model": model });
        if let Some(lora) = lora {
            fields["lora"] = lora;
        }
        Self { name, addr, fields }
    }

    /// The path whose figures this one's overhead is read against: the engine asked
    /// directly for the same thing.
    fn reference(&self) -> &'static str {
        if self.name.ends_with("-lora") {
            "direct-lora"
        } else {
            "direct"
        }
    }
}

impl Paths {
    /// The edge's model id of the LoRA the LoRA paths ask for.
    fn lora_model(&self) -> Option<String> {
        self.loras.first().map(|name| format!("llama/{name}"))
    }

    /// The engine's `lora` field with the LoRA `on` at 1 and every other at 0 (all at 0 for
    /// `None`): the engine applies every LoRA to a request that names none (docs/engines.md,
    /// "LoRAs"). `None` when it has no LoRAs.
    fn scales(&self, on: Option<usize>) -> Option<Value> {
        (!self.loras.is_empty()).then(|| {
            let scale = |id| if Some(id) == on { 1.0 } else { 0.0 };
            (0..self.loras.len())
                .map(|id| json!({"id": id, "scale": scale(id)}))
                .collect()
        })
    }

    fn list(&self) -> Vec<Path> {
        let lora = self.lora_model();
        let base = || self.scales(None);
        let mut list = vec![Path::new("direct", self.direct, "tiny", base())];
        if lora.is_some() {
            let first = self.scales(Some(0));
            list.push(Path::new("direct-lora", self.direct, "tiny", first));
        }
        list.push(Path::new("edge", self.edge, "llama/tiny", None));
        if let Some(lora) = &lora {
            list.push(Path::new("edge-lora", self.edge, lora, None));
        }
        if let Some(smg) = self.smg {
            list.push(Path::new("smg", smg, "tiny", base()));
        }
        if let Some(floor) = self.floor {
            list.push(Path::new("floor", floor, "tiny", base()));
        }
        if let Some(binaries) = self.binaries {
            list.push(Path::new("edge-bin", binaries, "llama/tiny", None));
            if let Some(lora) = &lora {
                list.push(Path::new("edge-bin-lora", binaries, lora, None));
            }
        }
        if let Some(baseline) = self.baseline {
            list.push(Path::new("edge-bin-base", baseline, "llama/tiny", None));
        }
        list
    }
}

/// The LoRAs' names by id: their files' stems, as llama-server and the node name them.
fn lora_names(files: &[PathBuf]) -> anyhow::Result<Vec<String>> {
    files
        .iter()
        .map(|file| {
            let stem = file.file_stem().and_then(|stem| stem.to_str());
            stem.map(str::to_owned)
                .with_context(|| format!("{} has no file stem to name it by", file.display()))
        })
        .collect()
}

/// What one path's requests took, and for the edge, each hop.
#[derive(Default, Clone)]
struct Timings {
    first: Histogram,
    total: Histogram,
    hops: Vec<Histogram>,
    unmatched: u64,
    /// Requests that failed (an error status, or the connection), warm-up included.
    errors: u64,
    /// For the processes' path: each measured request's run id, when it was written and
    /// when its first content was read, for the breakdown read from their logs afterwards.
    awaiting_hops: Vec<(String, Instant, Instant)>,
}

impl Timings {
    fn merge(&mut self, mut other: Timings) {
        self.first.merge(&other.first);
        self.total.merge(&other.total);
        self.hops.resize(SEGMENTS.len(), Histogram::default());
        for (mine, theirs) in self.hops.iter_mut().zip(&other.hops) {
            mine.merge(theirs);
        }
        self.unmatched += other.unmatched;
        self.errors += other.errors;
        self.awaiting_hops.append(&mut other.awaiting_hops);
    }

    /// The hops of the request `run_id` (written at `sent`, its first content read at
    /// `first`), from `log`.
    fn record_hops(&mut self, log: &HopLog, run_id: &str, sent: Instant, first: Instant) {
        match log.breakdown(run_id, sent, first) {
            Some(hops) => {
                for (histogram, hop) in self.hops.iter_mut().zip(hops) {
                    histogram.record_duration(hop);
                }
            }
            None => self.unmatched += 1,
        }
    }

    /// Each awaiting request's hops, from `log`.
    fn break_down(&mut self, log: &HopLog) {
        for (run_id, sent, first) in std::mem::take(&mut self.awaiting_hops) {
            self.record_hops(log, &run_id, sent, first);
        }
    }
}

/// `callers` callers, each alternating between the paths (the order rotating every round);
/// one record per path and one of the edge's hops.
async fn measure(
    args: &LatencyArgs,
    paths: &Paths,
    callers: usize,
    (log, binaries): (&HopLog, Option<&Binaries>),
) -> anyhow::Result<Vec<Record>> {
    let list = Arc::new(paths.list());
    let rounds = args.requests.div_ceil(callers);
    let warmup = args.warmup.div_ceil(callers);
    let mut body = json!({
        "stream": true, "max_tokens": args.max_tokens, "temperature": 0,
        "messages": [{"role": "user", "content": "Say something short."}],
    });
    if args.full_answers || !paths.loras.is_empty() {
        body["logit_bias"][END_OF_TEXT] = json!(-100);
    }
    let body = Arc::new(body);
    let mut tasks = tokio::task::JoinSet::new();
    for caller in 0..callers {
        let (list, log, body) = (Arc::clone(&list), log.clone(), Arc::clone(&body));
        let binary_hops = args.binary_hops;
        tasks.spawn(async move {
            let rounds = (warmup, rounds);
            caller_loop(&list, caller, rounds, &body, (&log, binary_hops)).await
        });
    }
    let mut per_path = vec![Timings::default(); list.len()];
    while let Some(done) = tasks.join_next().await {
        for (total, part) in per_path.iter_mut().zip(done??) {
            total.merge(part);
        }
    }
    let binary_hops = binaries.map(Binaries::hop_log).transpose()?.flatten();
    if let Some(hop_log) = &binary_hops {
        let bin = list.iter().position(|path| path.name == "edge-bin");
        if let Some(timings) = bin.and_then(|i| per_path.get_mut(i)) {
            timings.break_down(hop_log);
        }
    }
    Ok(report(&list, &per_path, callers, binary_hops.is_some()))
}

/// The records of one concurrency.
fn report(list: &[Path], per_path: &[Timings], callers: usize, binary_hops: bool) -> Vec<Record> {
    let ms = |h: &Histogram, q| h.quantile_us(q) / 1_000.0;
    let mut records = Vec::new();
    for (path, timings) in list.iter().zip(per_path) {
        let name = path.name;
        let reference = list.iter().position(|p| p.name == path.reference());
        let direct = reference.map_or(&per_path[0], |i| &per_path[i]);
        let mut record = Record::new(format!("path={name} c={callers}"))
            .with("ttft_p50_ms", ms(&timings.first, 0.5))
            .with("ttft_p90_ms", ms(&timings.first, 0.9))
            .with("total_p50_ms", ms(&timings.total, 0.5))
            .with("total_p90_ms", ms(&timings.total, 0.9))
            .with("errors", timings.errors as f64);
        if !name.starts_with("direct") {
            record = record
                .with(
                    "ttft_p50_over_direct_ms",
                    ms(&timings.first, 0.5) - ms(&direct.first, 0.5),
                )
                .with(
                    "ttft_p90_over_direct_ms",
                    ms(&timings.first, 0.9) - ms(&direct.first, 0.9),
                );
        }
        records.push(record);
        let hops_name = match name {
            "edge" => Some("hops"),
            "edge-bin" if binary_hops => Some("hops-bin"),
            _ => None,
        };
        if let Some(hops_name) = hops_name {
            let mut hops = Record::new(format!("{hops_name} c={callers}"));
            for ((p50, p90, _), histogram) in SEGMENTS.iter().zip(&timings.hops) {
                hops = hops
                    .with(p50, histogram.quantile_us(0.5))
                    .with(p90, histogram.quantile_us(0.9));
            }
            records.push(hops.with("unmatched", timings.unmatched as f64));
        }
    }
    records
}

/// A caller's connection to one path. `llama-server` closes the connection after each
/// streamed answer, so a path found to do that gets a fresh connection per request, its
/// connect counted in the request's time (as it is in the node's request to the engine).
struct Link {
    addr: SocketAddr,
    connection: Option<Connection>,
    fresh_each: bool,
}

/// What one request took: from `sent` (before any connect) to the first content and to
/// the end, and the run that answered.
struct Asked {
    sent: Instant,
    first: Duration,
    total: Duration,
    run_id: Option<String>,
}

impl Link {
    async fn ask(&mut self, request: &[u8]) -> anyhow::Result<Asked> {
        loop {
            let sent = Instant::now();
            let reused = self.connection.is_some() && !self.fresh_each;
            let mut connection = match self.connection.take().filter(|_| reused) {
                Some(connection) => connection,
                None => Connection::connect(self.addr).await?,
            };
            let connected = sent.elapsed();
            match connection
                .exchange_watching(request, false, Some(has_content))
                .await
            {
                Ok(exchange) => {
                    if exchange.status != 200 {
                        bail!("status {}", exchange.status);
                    }
                    let first = exchange.watched.context("an answer without content")?;
                    self.connection = Some(connection);
                    return Ok(Asked {
                        sent,
                        first: connected + first,
                        total: connected + exchange.total,
                        run_id: exchange.run_id,
                    });
                }
                // The server closed the connection it kept after the last answer.
                Err(_) if reused => self.fresh_each = true,
                Err(error) => return Err(error),
            }
        }
    }
}

/// One caller: `warmup` unmeasured rounds, then `rounds` measured ones, each a request on
/// every path (`body` with the path's fields), in an order that rotates. The edge's hops
/// come from `log` as it goes; with `binary_hops` the processes' requests are kept for
/// their logs.
async fn caller_loop(
    list: &[Path],
    caller: usize,
    (warmup, rounds): (usize, usize),
    body: &Value,
    (log, binary_hops): (&HopLog, bool),
) -> anyhow::Result<Vec<Timings>> {
    let requests: Vec<Vec<u8>> = list
        .iter()
        .map(|path| {
            let mut body = body.clone();
            for (key, value) in path.fields.as_object().into_iter().flatten() {
                body[key] = value.clone();
            }
            post_json(path.addr, "/v1/chat/completions", &body.to_string())
        })
        .collect();
    let mut links: Vec<Link> = list
        .iter()
        .map(|path| Link {
            addr: path.addr,
            connection: None,
            fresh_each: false,
        })
        .collect();
    let mut timings = vec![
        Timings {
            hops: vec![Histogram::default(); SEGMENTS.len()],
            ..Timings::default()
        };
        list.len()
    ];
    for round in 0..warmup + rounds {
        for k in 0..list.len() {
            let i = (round + caller + k) % list.len();
            let name = list[i].name;
            let asked = match links[i].ask(&requests[i]).await {
                Ok(asked) => asked,
                Err(error) => {
                    // Counted, and the next request on this path opens a fresh connection.
                    links[i].connection = None;
                    timings[i].errors += 1;
                    eprintln!("loadgen latency: {name}: round {round}: {error:#}");
                    continue;
                }
            };
            if round < warmup {
                continue;
            }
            let timing = &mut timings[i];
            timing.first.record_duration(asked.first);
            timing.total.record_duration(asked.total);
            let run_id = asked.run_id.unwrap_or_default();
            let first = asked.sent + asked.first;
            match name {
                "edge" => timing.record_hops(log, &run_id, asked.sent, first),
                // The processes' hops are in their logs, read once the rounds are over.
                "edge-bin" if binary_hops => timing.awaiting_hops.push((run_id, asked.sent, first)),
                _ => {}
            }
        }
    }
    Ok(timings)
}

/// Whether a streamed chat body holds some content yet: a `"content":"` with a character
/// after it (the role-only first chunk has none, or `null`).
pub(crate) fn has_content(body: &[u8]) -> bool {
    const KEY: &[u8] = b"\"content\":\"";
    body.windows(KEY.len() + 1)
        .any(|w| w.starts_with(KEY) && w[KEY.len()] != b'"')
}

#[cfg(test)]
mod tests {
    use std::net::SocketAddr;

    use serde_json::json;

    use super::{Paths, has_content};

    #[test]
    fn with_loras_each_path_asks_for_the_first_one_too_and_the_engine_hears_every_scale() {
        let addr: SocketAddr = "127.0.0.1:1".parse().expect("an address");
        let paths = Paths {
            direct: addr,
            edge: addr,
            smg: None,
            floor: None,
            binaries: Some(addr),
            baseline: None,
            loras: vec!["sql".to_owned(), "support".to_owned()],
        };
        let list = paths.list();
        let asked: Vec<_> = list
            .iter()
            .map(|path| (path.name, path.reference(), path.fields.clone()))
            .collect();
        let scales = |sql: f64| json!([{"id": 0, "scale": sql}, {"id": 1, "scale": 0.0}]);
        assert_eq!(
            asked,
            [
                (
                    "direct",
                    "direct",
                    json!({"model": "tiny", "lora": scales(0.0)})
                ),
                (
                    "direct-lora",
                    "direct-lora",
                    json!({"model": "tiny", "lora": scales(1.0)})
                ),
                ("edge", "direct", json!({"model": "llama/tiny"})),
                ("edge-lora", "direct-lora", json!({"model": "llama/sql"})),
                ("edge-bin", "direct", json!({"model": "llama/tiny"})),
                (
                    "edge-bin-lora",
                    "direct-lora",
                    json!({"model": "llama/sql"})
                ),
            ]
        );
        // Without LoRAs, the paths are as they were: the engine's body names none.
        let plain = Paths {
            loras: Vec::new(),
            ..paths
        };
        let names: Vec<_> = plain.list().iter().map(|path| path.name).collect();
        assert_eq!(names, ["direct", "edge", "edge-bin"]);
        assert_eq!(plain.list()[0].fields, json!({"model": "tiny"}));
    }

    #[test]
    fn content_is_a_non_empty_string() {
        assert!(!has_content(
            br#"data: {"delta":{"role":"assistant","content":null}}"#
        ));
        assert!(!has_content(br#"data: {"delta":{"content":""}}"#));
        assert!(has_content(br#"data: {"delta":{"content":"Hi"}}"#));
    }
}
