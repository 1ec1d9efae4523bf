//! `cold-start`: what a request for a model loaded nowhere costs. One `llama-server` in
//! router mode (`--models-max 1`, `--no-models-autoload`, two copies of the model as
//! `alpha` and `beta`), a reference node in front of it with `lifecycle = "llama-router"`,
//! and an edge in process on the shipped default (journal on). Each round asks for the
//! model that is not loaded (the edge unloads the other and loads it: cold), then for it
//! again (warm), time to the first content each; then the engine alone does the same
//! switch (unload, load, each until its `GET /models` says so) and is asked directly.
//! Reported: cold and warm p50/p90, the engine's own cold start (switch and first content),
//! and the edge's share: cold through the edge minus the engine's own.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use clap::Args;
use edge::settings::SinkKind;
use serde_json::json;
use tokio_util::sync::CancellationToken;

use crate::Common;
use crate::engine::wait_healthy;
use crate::harness::{InProcessEdge, http_get, runtime, runtime_with_slice, token};
use crate::http::{Connection, post_json};
use crate::latency::has_content;
use crate::stats::{Histogram, Record};

#[derive(Debug, Clone, Args)]
pub struct ColdStartArgs {
    /// The `llama-server` binary (`bash .ci/engines/llama-server.sh` prints it).
    #[arg(long)]
    llama_server: PathBuf,
    /// The GGUF model, copied as `alpha` and `beta` into the router's models directory.
    #[arg(long)]
    model: PathBuf,
    /// Rounds; each measures one cold and one warm request per model, and two switches of
    /// the engine alone.
    #[arg(long, default_value_t = 10)]
    rounds: usize,
}

fn child_args(args: &ColdStartArgs) -> Vec<String> {
    vec![
        format!("--llama-server={}", args.llama_server.display()),
        format!("--model={}", args.model.display()),
        format!("--rounds={}", args.rounds),
    ]
}

/// A `llama-server` router child, killed on drop.
struct Router {
    child: Child,
    addr: SocketAddr,
    _models: tempfile::TempDir,
}

impl Router {
    fn start(binary: &Path, model: &Path) -> anyhow::Result<Self> {
        let models = tempfile::tempdir()?;
        for name in ["alpha", "beta"] {
            std::fs::copy(model, models.path().join(format!("{name}.gguf")))
                .with_context(|| format!("cannot copy {}", model.display()))?;
        }
        let addr = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?;
        let mut child = Command::new(binary)
            .arg("--models-dir")
            .arg(models.path())
            .args([
                "--models-max",
                "1",
                "--no-models-autoload",
                "--host",
                "127.0.0.1",
            ])
            .args(["--port", &addr.port().to_string(), "--threads", "1"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .with_context(|| format!("cannot start {}", binary.display()))?;
        wait_healthy(addr, "/health", &mut child)?;
        Ok(Self {
            child,
            addr,
            _models: models,
        })
    }
}

impl Drop for Router {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn edge_config(engine: SocketAddr) -> String {
    format!(
        "[[nodes]]\nid = \"box-0\"\nalias = \"box-0\"\ntoken = \"{}\"\n\
         [nodes.runtime]\nmax_concurrent_runs = 8\nheartbeat_interval_ms = 1000\n\
         [[nodes.adapters]]\nname = \"llama\"\ntargets = [\"alpha\", \"beta\"]\n\
         [nodes.adapters.settings]\nbase_url = \"http://{engine}/v1\"\nlifecycle = \"llama-router\"\n",
        token(0)
    )
}

pub fn run(args: &ColdStartArgs, common: &Common) -> anyhow::Result<Vec<Record>> {
    if !common.child {
        return crate::run_in_child(common, "cold-start", &child_args(args));
    }
    let router = Router::start(&args.llama_server, &args.model)?;
    let edge = InProcessEdge::start(
        &edge_config(router.addr),
        &[SinkKind::Stdout],
        common.edge_threads,
    )?;
    let node_runtime = runtime_with_slice("node", 1, Some(edge_thread_slice::MIN_SLICE))?;
    let stop = CancellationToken::new();
    let options = edge_node::NodeOptions::new(edge.node_addr.to_string(), token(0));
    node_runtime.spawn(edge_node::run(options, stop.clone()));
    let load = runtime("load", 1)?;
    let result = load.block_on(measure(args, edge.http_addr, router.addr));
    stop.cancel();
    node_runtime.shutdown_timeout(Duration::from_secs(2));
    drop(load);
    edge.stop();
    drop(router);
    result
}

async fn measure(
    args: &ColdStartArgs,
    edge: SocketAddr,
    engine: SocketAddr,
) -> anyhow::Result<Vec<Record>> {
    wait_listed(edge, "llama/beta").await?;
    let (mut cold, mut warm, mut switch) = (
        Histogram::default(),
        Histogram::default(),
        Histogram::default(),
    );
    // The first request loads alpha into an empty engine: not counted.
    first_content(edge, "llama/alpha").await?;
    for _ in 0..args.rounds {
        for model in ["llama/beta", "llama/alpha"] {
            cold.record_duration(first_content(edge, model).await?);
            warm.record_duration(first_content(edge, model).await?);
        }
    }
    // The engine alone: alpha is loaded; switch to beta and back, as the edge did.
    for _ in 0..args.rounds {
        for (from, to) in [("alpha", "beta"), ("beta", "alpha")] {
            switch.record_duration(engine_switch(engine, from, to).await?);
        }
    }
    let ms = |h: &Histogram, q: f64| h.quantile_us(q) / 1_000.0;
    let share = ms(&cold, 0.5) - ms(&switch, 0.5);
    Ok(vec![
        Record::new("cold-start")
            .with("cold_p50_ms", ms(&cold, 0.5))
            .with("cold_p90_ms", ms(&cold, 0.9))
            .with("warm_p50_ms", ms(&warm, 0.5))
            .with("warm_p90_ms", ms(&warm, 0.9))
            .with("engine_cold_p50_ms", ms(&switch, 0.5))
            .with("edge_share_p50_ms", share),
    ])
}

/// Waits until the edge lists `model`.
async fn wait_listed(edge: SocketAddr, model: &'static str) -> anyhow::Result<()> {
    let started = Instant::now();
    while started.elapsed() < Duration::from_secs(30) {
        let models = tokio::task::spawn_blocking(move || http_get(edge, "/v1/models")).await??;
        if models.contains(model) {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    bail!("the edge did not list {model} within 30 s")
}

/// A streamed chat request for `model` through the edge: the time to its first content.
async fn first_content(edge: SocketAddr, model: &str) -> anyhow::Result<Duration> {
    let body = json!({"model": model, "max_tokens": 4, "stream": true,
        "messages": [{"role": "user", "content": "Say hi"}]});
    let request = post_json(edge, "/v1/chat/completions", &body.to_string());
    let mut connection = Connection::connect(edge).await?;
    let exchange = connection
        .exchange_watching(&request, false, Some(has_content))
        .await?;
    if exchange.status != 200 {
        bail!("{model}: status {}", exchange.status);
    }
    exchange.watched.context("no content in the answer")
}

/// The engine alone, as the edge and node do it: unloads `from`, loads `to` (each until
/// `GET /models` says so), then asks `to` directly; the time to its first content.
async fn engine_switch(engine: SocketAddr, from: &str, to: &str) -> anyhow::Result<Duration> {
    let started = Instant::now();
    command(engine, "/models/unload", from).await?;
    wait_state(engine, from, "unloaded").await?;
    command(engine, "/models/load", to).await?;
    wait_state(engine, to, "loaded").await?;
    first_content(engine, to).await?;
    Ok(started.elapsed())
}

async fn command(engine: SocketAddr, path: &str, model: &str) -> anyhow::Result<()> {
    let request = post_json(engine, path, &json!({"model": model}).to_string());
    let mut connection = Connection::connect(engine).await?;
    let exchange = connection.exchange(&request, false).await?;
    if exchange.status != 200 {
        bail!("{path} {model}: status {}", exchange.status);
    }
    Ok(())
}

async fn wait_state(engine: SocketAddr, model: &str, state: &str) -> anyhow::Result<()> {
    let wanted = format!("\"id\":\"{model}\"");
    let started = Instant::now();
    while started.elapsed() < Duration::from_secs(60) {
        let models = tokio::task::spawn_blocking(move || http_get(engine, "/models")).await??;
        let entry = models
            .split("{\"id\":")
            .find(|e| format!("{{\"id\":{e}").contains(&wanted));
        if entry.is_some_and(|e| e.contains(&format!("\"value\":\"{state}\""))) {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    bail!("{model} was not {state} within 60 s")
}
