//! Test support for the reference node (`edge-node`, in `node/`): a scripted
//! OpenAI-compatible engine (plain HTTP or HTTPS), fakes of Ollama and of vLLM's sleep mode
//! built from their source (`fake_ollama`, `fake_vllm`), a fake edge, a cuttable TCP relay,
//! and helpers that run the node in process.
//!
//! The node runs in process (its library, a dev-dependency) rather than as a spawned
//! binary: in-process nodes start in milliseconds, and a test can stop one with a token
//! where a process would need a signal. The binary's own code is only the CLI in `main.rs`.
#![allow(dead_code)]

pub mod fake_edge;
pub mod fake_ollama;
pub mod fake_serve;
pub mod fake_vllm;
pub mod relay;
pub mod upstream;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::Duration;

use bytes::Bytes;
use edge::settings::SinkKind;

use edge::domain::{AdapterName, NodeSelector, Operation, RunSpec, Target};
use serde_json::json;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::common::{self, TestApp, settings_on_free_ports};
use crate::node::NodeOptions;
use crate::node::lifecycle::NodeError;
use upstream::Reply;

pub use crate::common::PATIENCE;

/// A node in process for each of `ids`, each with the token `token-<id>`, once the edge of
/// `app` has them all connected.
pub async fn spawn_nodes(app: &TestApp, ids: &[&str]) -> Vec<RunningNode> {
    let nodes = ids
        .iter()
        .map(|id| spawn_node(app.node_addr, &format!("token-{id}"), |_| {}))
        .collect();
    app.wait_for_nodes(ids.len()).await;
    nodes
}

/// A node running in this process.
pub struct RunningNode {
    /// Cancel to drain and stop it (as SIGTERM does).
    pub stop: CancellationToken,
    /// How its connections to the edge ended so far.
    pub links: std::sync::Arc<edge::client::LinkStats>,
    task: JoinHandle<Result<(), NodeError>>,
}

impl RunningNode {
    /// Drains the node and waits for it to return.
    pub async fn stop(self) -> Result<(), NodeError> {
        self.stop.cancel();
        self.ended().await
    }

    /// Ends the node at once, as a killed process: nothing drained, nothing said.
    pub fn kill(self) {
        self.task.abort();
    }

    /// Waits for the node to return on its own.
    pub async fn ended(self) -> Result<(), NodeError> {
        tokio::time::timeout(PATIENCE, self.task)
            .await
            .expect("the node stops in time")
            .expect("the node task")
    }
}

/// Starts a node for `edge` with `token`, reconnecting fast; `tweak` adjusts its options.
pub fn spawn_node(
    edge: SocketAddr,
    token: &str,
    tweak: impl FnOnce(&mut NodeOptions),
) -> RunningNode {
    let mut options = NodeOptions::new(edge.to_string(), token);
    options.reconnect_min = Duration::from_millis(20);
    options.reconnect_max = Duration::from_millis(200);
    options.shutdown_grace = Duration::from_millis(300);
    options.flush_timeout = Duration::from_millis(500);
    tweak(&mut options);
    let stop = CancellationToken::new();
    let links = std::sync::Arc::clone(&options.link_stats);
    let task = tokio::spawn(crate::node::run(options, stop.clone()));
    RunningNode { stop, links, task }
}

/// The `openai` adapter settings for an engine at `base_url`: `qwen` maps to the upstream
/// model `Qwen/Qwen2.5-0.5B-Instruct`, and the engine is probed every `probe_ms`.
pub fn adapter_settings(base_url: &str, probe_ms: u32) -> Vec<(&'static str, String)> {
    vec![
        ("base_url", base_url.to_owned()),
        ("model.qwen", QWEN.to_owned()),
        ("probe_interval_ms", probe_ms.to_string()),
        ("probe_down_interval_ms", probe_ms.to_string()),
    ]
}

/// The upstream name of the `qwen` target.
pub const QWEN: &str = "Qwen/Qwen2.5-0.5B-Instruct";

/// An edge config with one node (`node-1`, token `token-1`, heartbeat `heartbeat_ms`) whose
/// `llama` adapter serves `targets` from the engine at `base_url`.
pub fn edge_config(base_url: &str, targets: &[&str], heartbeat_ms: u32) -> String {
    format!(
        r#"
[[nodes]]
id = "node-1"
alias = "box-1"
token = "token-1"
[nodes.runtime]
max_concurrent_runs = 8
heartbeat_interval_ms = {heartbeat_ms}
[[nodes.adapters]]
name = "llama"
targets = {targets:?}
[nodes.adapters.settings]
base_url = "{base_url}"
"model.qwen" = "{QWEN}"
probe_interval_ms = "60000"
"#
    )
}

/// A `[[nodes]]` entry for a reference node `id` (alias `<id>-box`, token `token-<id>`)
/// whose `llama` adapter manages the llama-server router at `base_url` and serves
/// `targets`; `settings` adds lines to the adapter's settings (a `memory` budget, ...).
pub fn router_node_entry(id: &str, targets: &[&str], base_url: &str, settings: &str) -> String {
    format!(
        r#"
[[nodes]]
id = "{id}"
alias = "{id}-box"
token = "token-{id}"
[nodes.runtime]
max_concurrent_runs = 8
heartbeat_interval_ms = 1000
[[nodes.adapters]]
name = "llama"
targets = {targets:?}
[nodes.adapters.settings]
base_url = "{base_url}"
lifecycle = "llama-router"
{settings}
"#
    )
}

/// The body of a reference node run as a process of its own (the test binary started again,
/// its edges and token in its environment): dials `edges` with `token`, reconnecting after
/// `reconnect` (least, most), logging at INFO to its standard error when `log`.
pub fn node_process(edges: String, token: String, reconnect: (Duration, Duration), log: bool) {
    if log {
        tracing_subscriber::fmt()
            .with_env_filter("info")
            .with_ansi(false)
            .with_writer(std::io::stderr)
            .init();
    }
    let runtime = tokio::runtime::Runtime::new().expect("a runtime");
    runtime.block_on(async move {
        let mut options = crate::node::NodeOptions::new(edges, token);
        (options.reconnect_min, options.reconnect_max) = reconnect;
        let stop = tokio_util::sync::CancellationToken::new();
        let _ = crate::node::run(options, stop).await;
    });
}

/// A real edge with `config` whose node transport listens on `node_addr` (port 0 for any);
/// events go to the `null` sink unless the config has an `[events]` section.
pub async fn edge_on(config: &str, node_addr: SocketAddr) -> TestApp {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut settings = settings_on_free_ports(dir.path(), config);
    settings.server.listen = node_addr;
    settings.server.shutdown_grace_ms = 500;
    if !config.contains("[events]") {
        settings.events.sinks = vec![SinkKind::Null];
    }
    common::serve(settings, dir).await
}

/// One `[[nodes]]` entry: node `id` (alias `<id>-box`, token `token-<id>`, 4 runs at once,
/// a heartbeat a second) whose adapter `adapter` serves `targets` with `settings`.
pub fn node_entry(
    id: &str,
    adapter: &str,
    targets: &[&str],
    settings: &[(&str, String)],
) -> String {
    let settings: String = settings
        .iter()
        .map(|(key, value)| format!("{key:?} = {value:?}\n"))
        .collect();
    format!(
        "\n[[nodes]]\nid = {id:?}\nalias = \"{id}-box\"\ntoken = \"token-{id}\"\n\
         [nodes.runtime]\nmax_concurrent_runs = 4\nheartbeat_interval_ms = 1000\n\
         [[nodes.adapters]]\nname = {adapter:?}\ntargets = {targets:?}\n\
         [nodes.adapters.settings]\n{settings}"
    )
}

/// `POST {path}` with `body` to `app`'s HTTP API: the status, the node that answered
/// (`x-edge-node`, empty when none) and the body as JSON (`null` when it is not).
pub async fn api_post(
    app: &TestApp,
    path: &str,
    body: &serde_json::Value,
) -> (u16, String, serde_json::Value) {
    let response = common::http_client()
        .post(format!("http://{}{path}", app.http_addr))
        .header("anthropic-version", "2023-06-01")
        .json(body)
        .send()
        .await
        .expect("the edge answers");
    let status = response.status().as_u16();
    let node = response
        .headers()
        .get("x-edge-node")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_owned();
    let body = response.json().await.unwrap_or(serde_json::Value::Null);
    (status, node, body)
}

/// Waits until the edge has answered two of the node's pings: the first answer surely
/// reached the node, which from then on judges the link by its pings.
pub async fn pings_answered(app: &TestApp) {
    let stats = app.parts.transport.stats();
    crate::common::eventually("the edge has answered the node's pings", || {
        // The registration answer, then at least two acks (no run was sent).
        stats.frames_out.load(std::sync::atomic::Ordering::Relaxed) >= 3
    })
    .await;
}

pub fn prompt(text: &str) -> RunSpec {
    RunSpec {
        selector: NodeSelector {
            adapter: AdapterName::parse("llama").expect("adapter"),
            target: Target::parse("qwen").expect("target"),
            pin: None,
        },
        input: Bytes::from(text.to_owned()),
        content_type: "text/plain; charset=utf-8".into(),
        params: BTreeMap::new(),
        deadline: None,
        operation: Operation::Unspecified,
        routing: Default::default(),
    }
}

pub fn answer(text: &str) -> Reply {
    let chunks = [
        json!({"choices": [{"index": 0, "delta": {"content": text}}]}),
        json!({"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}),
    ];
    Reply::sse(&chunks, true)
}
