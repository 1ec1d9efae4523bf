//! Issue 12 end to end, with nothing scripted: the official `openai` Python SDK
//! (`tests/python/engine_e2e.py`, in the test venv) talks to a real edge (in process, port
//! 0), whose reference node (`edge-node`, in process) forwards runs through its `openai`
//! adapter to a real llama.cpp `llama-server` serving the tiny test model. The answers are
//! the tiny model's own deterministic sentence; usage figures are the engine's.
//!
//! - Chat whole and streamed, `/v1/completions` whole and streamed, `max_tokens` reaching the
//!   engine, usage on every answer.
//! - A client that closes a streamed chat mid-way: the edge cancels the run, the node closes
//!   the engine request, and llama-server stops generating (its `--metrics` gauge
//!   `llamacpp:requests_processing` falls back to 0, long before the slot's context is full).
//! - The engine killed: its model leaves `/v1/models` (the node reports availability in its
//!   heartbeats) and a request gets 503 with `Retry-After` once `runs.no_node_timeout_ms`
//!   passes; the engine back on the same port: listed and answered again.
//!
//! Every wait polls an endpoint until a condition holds, bounded overall (`common::PATIENCE` here,
//! `WAIT_SECONDS` in the script). See docs/engines.md for what this proves and how a user
//! runs the same three programs.

use crate::common;
use crate::node_support;

use std::process::Stdio;
use std::time::Duration;

use common::engines::{LlamaOptions, LlamaServer, TINY_REPLY, prometheus_sample};
use common::python::client_script;
use common::{TestApp, eventually_ok, spawn_app};
use node_support::{RunningNode, spawn_node};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::process::Command;

/// How long one run of the script may take (its own waits are shorter).
const SCRIPT_PATIENCE: Duration = Duration::from_secs(60);

/// The API key the stack's edge wants.
pub(crate) const API_KEY: &str = "sk-edge-engines-e2e";
const NODE_TOKEN: &str = "token-engines-e2e";
/// The model id the edge serves the engine as: the `llama` adapter's `tiny` target.
const MODEL: &str = "llama/tiny";
/// How long a run waits for a node that can serve it before it fails with 503.
const NO_NODE_TIMEOUT_MS: u64 = 1_000;

/// The edge's config: one node whose `llama` adapter points at the engine at `v1_url`, as
/// docs/node.md's llama-server block, with probes and heartbeats quick enough for a test,
/// and the adapter settings lines `settings` besides (the block ends in its settings).
fn edge_config(v1_url: &str, settings: &str) -> String {
    format!(
        "[api]\nkeys = [\"{API_KEY}\"]\n[runs]\nno_node_timeout_ms = {NO_NODE_TIMEOUT_MS}\n{}{settings}\n",
        llama_node("box-1", NODE_TOKEN, v1_url)
    )
}

/// A `[[nodes]]` block: node `id` (its alias too) with `token`, whose `llama` adapter serves
/// `tiny` from the engine at `v1_url`, probed every 200 ms, heartbeating every 500 ms.
pub(crate) fn llama_node(id: &str, token: &str, v1_url: &str) -> String {
    let quick_probes = "probe_interval_ms = \"200\"\nprobe_down_interval_ms = \"100\"\n";
    format!(
        "{}{quick_probes}",
        llama_node_probed_as_shipped(id, token, v1_url)
    )
}

/// [`llama_node`] probed as the node probes by default (every 5 s while the engine is up,
/// which an idle `llama-server` outlasts with its 5 s keep-alive): the block ends in its
/// adapter's settings.
pub(crate) fn llama_node_probed_as_shipped(id: &str, token: &str, v1_url: &str) -> String {
    format!(
        r#"
[[nodes]]
id = "{id}"
alias = "{id}"
token = "{token}"
[nodes.runtime]
max_concurrent_runs = 4
heartbeat_interval_ms = 500
[[nodes.adapters]]
name = "llama"
targets = ["tiny"]
[nodes.adapters.settings]
base_url = "{v1_url}"
availability = "reachable"
"#
    )
}

/// llama-server, the edge and the node, connected (`engines_tokens` runs on it too).
pub(crate) struct Stack {
    pub(crate) llama: LlamaServer,
    pub(crate) app: TestApp,
    node: RunningNode,
    pub(crate) http: reqwest::Client,
}

impl Stack {
    /// llama-server with `llama`, the edge of [`edge_config`] and the node, once the node
    /// is registered.
    pub(crate) async fn start(llama: LlamaOptions) -> Self {
        Self::start_with_settings(llama, "").await
    }

    /// [`Self::start`] with the adapter settings lines `settings` added.
    pub(crate) async fn start_with_settings(llama: LlamaOptions, settings: &str) -> Self {
        let llama = LlamaServer::start_with(llama).await;
        let app = spawn_app(&edge_config(&llama.v1_url(), settings)).await;
        let node = spawn_node(app.node_addr, NODE_TOKEN, |_| {});
        app.wait_for_nodes(1).await;
        let http = crate::common::http()
            .timeout(Duration::from_secs(5))
            .build()
            .expect("http client");
        Self {
            llama,
            app,
            node,
            http,
        }
    }

    /// The script's `command` against this edge, its output piped, killed if dropped.
    async fn script(&self, command: &str) -> Command {
        let edge = format!("http://{}/v1", self.app.http_addr);
        let args = [command, &edge, API_KEY, MODEL, TINY_REPLY];
        let mut child = client_script("engine_e2e.py", &args).await;
        child.stdout(Stdio::piped()).stderr(Stdio::piped());
        child
    }

    /// Runs the script's `command` to its end; it must succeed.
    async fn run(&self, command: &str) {
        let output = self.script(command).await.output();
        let output = tokio::time::timeout(SCRIPT_PATIENCE, output)
            .await
            .unwrap_or_else(|_| panic!("`{command}` finished in time"))
            .expect("the script ran");
        assert_succeeded(command, &output);
    }

    /// The value of the edge's metric `name` with `labels`, from its `/metrics`.
    async fn edge_metric(&self, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
        let url = format!("http://{}/metrics", self.app.http_addr);
        let text = self.http.get(url).send().await.ok()?.text().await.ok()?;
        prometheus_sample(&text, name, labels)
    }

    pub(crate) async fn stop(self) {
        self.node.stop().await.expect("the node stops cleanly");
        self.app.stop().await;
    }
}

fn assert_succeeded(command: &str, output: &std::process::Output) {
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success() && stdout.lines().any(|l| l.starts_with("ok")),
        "engine_e2e.py {command} failed ({}):\nstdout:\n{stdout}\nstderr:\n{stderr}",
        output.status
    );
    // What the script saw, for `--nocapture` runs.
    eprint!("{stdout}");
}

/// llama-server's gauge of the requests its slots are working on.
async fn engine_requests(llama: &LlamaServer) -> Result<f64, String> {
    llama
        .metric("llamacpp:requests_processing")
        .await
        .ok_or_else(|| "llama-server's /metrics has no llamacpp:requests_processing".to_owned())
}

#[crate::common::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_openai_sdk_gets_llama_server_answers_through_the_node_and_the_edge() {
    let stack = Stack::start(LlamaOptions::default()).await;
    stack.run("answers").await;
    stack.stop().await;
}

#[crate::common::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_leaves_mid_stream_stops_llama_server_generating() {
    // One slot with the model's whole context: left alone, the endless answer would go on
    // until 32768 tokens fill it (minutes on a small machine).
    const CONTEXT: u32 = 32_768;
    let options = LlamaOptions::default()
        .parallel(1)
        .context(CONTEXT)
        .arg("--metrics");
    let stack = Stack::start(options).await;
    let predicted = async || {
        stack
            .llama
            .metric("llamacpp:tokens_predicted_total")
            .await
            .ok_or("llama-server's /metrics has no llamacpp:tokens_predicted_total")
    };
    let before = predicted().await.expect("tokens predicted so far");

    leave_mid_stream(&stack).await;

    let cancelled = [
        ("adapter", "llama"),
        ("target", "tiny"),
        ("outcome", "cancelled"),
    ];
    eventually_ok("the edge counts the run cancelled", async || {
        match stack
            .edge_metric("edge_runs_finished_total", &cancelled)
            .await
        {
            Some(1.0) => Ok(()),
            other => Err(format!("edge_runs_finished_total (cancelled) is {other:?}")),
        }
    })
    .await;
    stack.app.assert_settled().await;
    eventually_ok("llama-server ends the request", async || {
        let processing = engine_requests(&stack.llama).await?;
        (processing == 0.0)
            .then_some(())
            .ok_or(format!("requests_processing is {processing}"))
    })
    .await;
    // The engine stopped because the request went, not because it was done: it generated
    // far fewer tokens than its context had room for.
    let generated = eventually_ok(
        "llama-server counts the ended request's tokens",
        async || {
            let now = predicted().await?;
            (now > before)
                .then_some(now - before)
                .ok_or("tokens_predicted_total has not moved")
        },
    )
    .await;
    eprintln!("llama-server generated {generated} tokens for the client that left");
    assert!(
        generated < f64::from(CONTEXT / 2),
        "llama-server generated {generated} tokens: the client leaving did not stop it"
    );
    stack.stop().await;
}

/// Runs the script's `leave`: once it says it is streaming, checks that the engine is
/// generating and the edge has the run open, then lets it close the stream and end.
async fn leave_mid_stream(stack: &Stack) {
    let mut client = stack
        .script("leave")
        .await
        .stdin(Stdio::piped())
        .spawn()
        .expect("start the script");
    let stdout = client.stdout.take().expect("piped stdout");
    let mut lines = BufReader::new(stdout).lines();
    let said = tokio::time::timeout(SCRIPT_PATIENCE, lines.next_line())
        .await
        .expect("the script streams in time")
        .expect("read the script's stdout");
    if said.as_deref() != Some("streaming") {
        let ended = client.wait_with_output();
        let output = common::bounded("engine_e2e.py leave to end", ended)
            .await
            .expect("the script ended");
        panic!("engine_e2e.py leave said {said:?}, not `streaming`: {output:?}");
    }

    // The client holds the stream open: the engine is generating for it.
    assert_eq!(engine_requests(&stack.llama).await, Ok(1.0));
    assert_eq!(stack.app.parts.runs.open_runs(), 1);

    let mut stdin = client.stdin.take().expect("piped stdin");
    stdin.write_all(b"close\n").await.expect("tell the script");
    drop(stdin);
    let ended = async {
        let mut rest = Vec::new();
        while let Some(line) = lines.next_line().await.expect("read the script's stdout") {
            rest.extend_from_slice(line.as_bytes());
            rest.push(b'\n');
        }
        let mut output = client.wait_with_output().await.expect("the script ran");
        output.stdout = rest;
        output
    };
    let output = tokio::time::timeout(SCRIPT_PATIENCE, ended)
        .await
        .expect("the script ends in time");
    assert_succeeded("leave", &output);
}

#[crate::common::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_engine_leaves_the_model_list_and_gets_503_until_it_is_back() {
    let mut stack = Stack::start(LlamaOptions::default()).await;
    stack.run("up").await;

    stack.llama.stop().await;
    stack.run("down").await;
    // The node stays connected while its engine is down; it just gets no runs.
    assert_eq!(stack.app.parts.registry.len(), 1);

    stack.llama.restart().await;
    stack.run("up").await;
    stack.stop().await;
}
