//! Issue 32 end to end with a real engine: `llama-server` serving the tiny model (greedy)
//! behind a reference node running as a process of its own, and the real `edge serve`
//! binary with its journal. The official `openai` Python SDK
//! (`tests/python/responses_across_restart.py`) streams a background response
//! (`background: true, stream: true`); once it has read [`BEFORE`] text deltas the test
//! `SIGKILL`s the edge, and the SDK's stream breaks. The edge is started again on the same
//! journal and node address; the node reconnects and claims the run; the SDK's
//! `responses.retrieve(id, stream=True, starting_after=last_seen)` delivers the rest. The
//! whole text is the engine's own greedy answer (asked directly, same prompt, temperature 0,
//! same token limit), and the run's record says completed after one attempt. When the node
//! process is killed too, nothing claims the run: it ends `unknown`/`edge_crashed`, and the
//! SDK is never told it completed.
//!
//! Determinism without sleeps: the [`Gate`] between the node and its engine holds every
//! text event past the [`BEFORE`] it lets through, so the run is mid-answer when the edge
//! dies however fast the model is; the test lets the rest through only while the edge is
//! down, so the node has buffered it all when it claims the run. Before the kill, one read of
//! the run's stored events flushes the journal: everything the SDK saw is on disk (the kill
//! of an edge whose journal has not yet written a run's start is the case the run does not
//! survive; docs/scaling.md).

use std::process::Stdio;

use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader, Lines};
use tokio::process::{Child, ChildStdin, ChildStdout};

use crate::admin_crash::{Edge, get, start_edge_with, text};
use crate::common::engines::{LlamaServer, prometheus_sample};
use crate::common::python::client_script;
use crate::common::{PATIENCE, edge_serve_on, eventually_ok, write_config};
use crate::continuation_engine::{Gate, NodeProcess, next_line};
use crate::engines_e2e::llama_node;

/// Text deltas the SDK reads before the edge is killed (the tiny model's answer has seven).
const BEFORE: usize = 3;
pub(crate) const API_KEY: &str = "sk-readopt-engine";
const MODEL: &str = "llama/tiny";
/// What the SDK asks (the tiny model answers anything with its one sentence).
const PROMPT: &str = "Say hello";
/// The response's token limit, and the engine's when asked directly.
const MAX_TOKENS: u32 = 16;

/// What the SDK read of the response before the edge died.
#[derive(Default)]
pub(crate) struct Read {
    pub(crate) response_id: String,
    pub(crate) last_seen: u64,
    pub(crate) text: String,
}

impl Read {
    pub(crate) fn run_id(&self) -> &str {
        self.response_id
            .strip_prefix("resp_bg_")
            .expect("a background response's id names its run")
    }
}

/// The SDK script `responses_across_restart.py` reading a background stream of [`PROMPT`]
/// (`site_e2e` reads one across a takeover too).
pub(crate) struct SdkStream {
    sdk: Child,
    stdin: ChildStdin,
    lines: Lines<BufReader<ChildStdout>>,
}

impl SdkStream {
    /// Starts the script against the API at `base_url` (`http://…/v1`).
    pub(crate) async fn start(base_url: &str) -> Self {
        let max_tokens = MAX_TOKENS.to_string();
        let mut sdk = client_script(
            "responses_across_restart.py",
            &[base_url, API_KEY, MODEL, PROMPT, &max_tokens],
        )
        .await
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("the SDK script starts");
        let stdin = sdk.stdin.take().expect("piped stdin");
        let lines = BufReader::new(sdk.stdout.take().expect("piped stdout")).lines();
        Self { sdk, stdin, lines }
    }

    /// Reads the SDK's events until `deltas` text deltas have come.
    pub(crate) async fn read_deltas(&mut self, deltas: usize) -> Read {
        let (mut read, mut seen) = (Read::default(), 0);
        while seen < deltas {
            let event = next_line(&mut self.lines).await;
            if let Some(id) = event["id"].as_str() {
                id.clone_into(&mut read.response_id);
            }
            read.last_seen = event["seq"].as_u64().expect("an event, numbered");
            if let Some(delta) = event["delta"].as_str() {
                read.text.push_str(delta);
                seen += 1;
            }
        }
        read
    }

    /// Waits until the SDK says its stream broke (the edge it read from died).
    pub(crate) async fn dropped(&mut self) {
        let dropped = next_line(&mut self.lines).await;
        assert_eq!(
            dropped["dropped"], true,
            "the stream breaks, no more: {dropped}"
        );
    }

    /// Has the SDK resume from the API at `base_url`; returns the events it printed (the
    /// retrieved response last) once it has ended well.
    pub(crate) async fn resume(&mut self, base_url: &str) -> Vec<Value> {
        self.stdin
            .write_all(format!("{base_url}\n").as_bytes())
            .await
            .expect("the SDK reads on");
        let mut resumed = Vec::new();
        loop {
            let line = next_line(&mut self.lines).await;
            let end = line.get("status").is_some();
            resumed.push(line);
            if end {
                break;
            }
        }
        let status = tokio::time::timeout(PATIENCE, self.sdk.wait())
            .await
            .expect("the SDK ends in time")
            .expect("the SDK's status");
        assert!(status.success(), "the SDK script failed: {status}");
        resumed
    }
}

/// Checks what the SDK read after it resumed (`resumed`, the retrieved response last)
/// against what it read before (`read`): every later event once and in order, ending
/// `response.completed`, and the whole text the engine's own greedy answer.
pub(crate) async fn assert_the_greedy_answer(llama: &LlamaServer, read: &Read, resumed: &[Value]) {
    let (events, retrieved) = resumed.split_at(resumed.len() - 1);
    let numbers: Vec<u64> = events.iter().filter_map(|e| e["seq"].as_u64()).collect();
    let expected_numbers: Vec<u64> = (read.last_seen + 1..).take(events.len()).collect();
    assert_eq!(
        numbers, expected_numbers,
        "every later event once, in order"
    );
    assert_eq!(
        events.last().map(|e| e["type"].clone()),
        Some(json!("response.completed"))
    );
    let rest: String = events.iter().filter_map(|e| e["delta"].as_str()).collect();
    assert!(!rest.is_empty(), "the answer went on after the kill");
    let text = format!("{}{rest}", read.text);
    let greedy = greedy_answer(llama).await;
    assert_eq!(text, greedy, "the whole text is the engine's own answer");
    assert_eq!(retrieved[0]["status"], "completed");
    assert_eq!(retrieved[0]["output_text"], greedy);
}

/// The edge (killed mid-answer), its node, engine and gate, and the SDK waiting to resume.
struct Killed {
    llama: LlamaServer,
    gate: Gate,
    config: std::path::PathBuf,
    listen: String,
    node: Option<NodeProcess>,
    sdk: SdkStream,
    read: Read,
    _dir: tempfile::TempDir,
}

/// The edge's config: `node-1` in front of `v1_url` (the `llama` adapter's `tiny` target),
/// an API key, resume grace `grace_ms`.
pub(crate) fn edge_config(v1_url: &str, grace_ms: u64) -> String {
    format!(
        "[api]\nkeys = [\"{API_KEY}\"]\n[runs]\nresume_grace_ms = {grace_ms}\n\
         [events]\nsinks = [\"null\"]\n{}",
        llama_node("node-1", "token-1", v1_url),
    )
}

/// The kinds of the run's events as the edge's journal holds them (reading them flushes
/// the journal).
pub(crate) async fn stored_kinds(admin: std::net::SocketAddr, run_id: &str) -> Vec<String> {
    let path = format!("/admin/v1/runs/{run_id}/events?format=jsonl&follow=false");
    text(admin, &path)
        .await
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter_map(|e| e["kind"].as_str().map(str::to_owned))
        .collect()
}

/// A free loopback address for the edge's node listener, kept across its restart.
fn node_listen() -> String {
    let socket = std::net::TcpListener::bind("127.0.0.1:0").expect("a free port");
    socket.local_addr().expect("its address").to_string()
}

/// The engine, gate, edge (resume grace `grace_ms`) and node process; the SDK's background
/// stream read to [`BEFORE`] deltas; then the edge killed with `SIGKILL`, and the SDK's
/// stream broken.
async fn killed_mid_answer(grace_ms: u64) -> Killed {
    let llama = LlamaServer::start().await;
    let gate = Gate::before(&llama).await;
    let dir = tempfile::tempdir().expect("tempdir");
    let gated_url = format!("http://{}/v1", gate.addr);
    let config = write_config(dir.path(), &edge_config(&gated_url, grace_ms));
    let listen = node_listen();
    let mut edge = start_edge_with(edge_serve_on(&config, &listen)).await;
    let node = NodeProcess::spawn(edge.node, "token-1");

    let mut sdk = SdkStream::start(&format!("http://{}/v1", edge.http)).await;
    gate.allow(BEFORE);
    let read = sdk.read_deltas(BEFORE).await;
    let stored = stored_kinds(edge.admin, read.run_id()).await;
    let outputs = stored.iter().filter(|k| *k == "output").count();
    assert_eq!(stored.first().map(String::as_str), Some("started"));
    assert!(outputs >= BEFORE, "{stored:?}");

    edge.child.start_kill().expect("kill -9");
    crate::common::bounded("the edge process to exit after kill -9", edge.child.wait())
        .await
        .expect("the edge is gone");
    sdk.dropped().await;
    Killed {
        llama,
        gate,
        config,
        listen,
        node: Some(node),
        sdk,
        read,
        _dir: dir,
    }
}

impl Killed {
    /// Starts the edge again on the same config, journal and node address.
    async fn restart(&self) -> Edge {
        start_edge_with(edge_serve_on(&self.config, &self.listen)).await
    }

    /// Has the SDK resume from the restarted `edge`; returns the events it printed (the
    /// retrieved response last) once it has ended well.
    async fn resume(&mut self, edge: &Edge) -> Vec<Value> {
        self.sdk.resume(&format!("http://{}/v1", edge.http)).await
    }
}

/// The tiny model's greedy answer to [`PROMPT`], asked of `llama` directly.
pub(crate) async fn greedy_answer(llama: &LlamaServer) -> String {
    let body = json!({
        "model": llama.model(), "temperature": 0, "max_tokens": MAX_TOKENS,
        "messages": [{"role": "user", "content": PROMPT}],
    });
    let answer = llama.ask("chat/completions", &body).await;
    answer["choices"][0]["message"]["content"]
        .as_str()
        .expect("an answer text")
        .to_owned()
}

/// Waits until run `run_id`'s record has ended; returns it.
async fn ended(edge: &Edge, run_id: &str) -> Value {
    let path = format!("/admin/v1/runs/{run_id}");
    eventually_ok("the run's record says how it ended", || async {
        let record = get(edge.admin, &path).await;
        if record["outcome"] == "open" {
            Err(record.to_string())
        } else {
            Ok(record)
        }
    })
    .await
}

#[crate::common::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_background_response_on_a_real_engine_outlives_a_kill_9_of_its_edge() {
    let mut killed = killed_mid_answer(30_000).await;
    // The engine goes on while the edge is away: the node buffers the rest.
    killed.gate.allow(usize::from(u8::MAX));
    let edge = killed.restart().await;
    let resumed = killed.resume(&edge).await;

    assert_the_greedy_answer(&killed.llama, &killed.read, &resumed).await;

    let record = ended(&edge, killed.read.run_id()).await;
    assert_eq!(record["outcome"], "completed", "{record:#}");
    let attempts = record["attempts"].as_array().expect("attempts");
    assert_eq!(attempts.len(), 1, "taken back, not run again: {record:#}");
    let metrics = crate::common::http_client()
        .get(format!("http://{}/metrics", edge.http))
        .send()
        .await
        .expect("the metrics are answered")
        .text()
        .await
        .expect("a body");
    let reattached = prometheus_sample(&metrics, "edge_runs_reattached_total", &[]);
    assert_eq!(reattached, Some(1.0), "its node claimed it");
    killed.node.take().expect("the node").kill().await;
}

#[crate::common::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_background_response_whose_node_died_with_the_edge_ends_edge_crashed() {
    let mut killed = killed_mid_answer(300).await;
    killed.node.take().expect("the node").kill().await;
    let edge = killed.restart().await;
    let resumed = killed.resume(&edge).await;

    let record = ended(&edge, killed.read.run_id()).await;
    assert_eq!(record["outcome"], "unknown", "{record:#}");
    assert_eq!(record["code"], "edge_crashed", "{record:#}");
    // Never shown completed: the resumed stream goes on to `response.failed`.
    let types: Vec<&str> = resumed.iter().filter_map(|e| e["type"].as_str()).collect();
    assert_eq!(types, ["response.failed"], "{resumed:#?}");
    let retrieved = resumed.last().expect("the retrieved response");
    assert_eq!(retrieved["status"], "failed", "{retrieved}");
}
