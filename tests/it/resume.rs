//! Resume over real TCP: the reference node behind a relay, a real edge with the file sink,
//! and a client streaming a chat completion through the OpenAI API. The node's connection
//! is cut mid-stream (the relay kills both sockets; the node process goes on), or
//! black-holed (nothing forwarded, nothing closed); the node reconnects within the grace,
//! claims its run, and the edge resumes it: the client's stream completes with every delta
//! exactly once and in order, and one terminal event reaches the client and the sink.

use crate::common;
#[allow(dead_code, unused_imports)]
use crate::node;
use crate::node_support;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use common::{PATIENCE, TestApp, eventually};
use node_support::relay::Relay;
use node_support::upstream::{Reply, ScriptedEngine, chat_chunks};
use node_support::{QWEN, RunningNode, edge_config, edge_on, pings_answered, spawn_node};
use serde_json::{Value, json};
use tokio::sync::Semaphore;

/// The node's heartbeat interval; a black-holed node declares its link dead after one.
const HEARTBEAT_MS: u32 = 1_000;

/// Deltas in the answer.
const DELTAS: usize = 40;

/// Deltas the client reads before the connection breaks.
const BEFORE_THE_BREAK: usize = 12;

/// An edge (resume grace far above any reconnect here) with the file sink, an engine that
/// streams [`DELTAS`] deltas one per permit of its gate, and the node behind a relay.
struct Setup {
    app: TestApp,
    engine: ScriptedEngine,
    gate: Arc<Semaphore>,
    relay: Relay,
    node: RunningNode,
    events_file: PathBuf,
    /// Holds the events file.
    _events_dir: tempfile::TempDir,
}

/// The `n`th delta's text.
fn delta(n: usize) -> String {
    format!("d{n} ")
}

async fn setup(dead_after_intervals: u32) -> Setup {
    let engine = ScriptedEngine::start(&[QWEN]).await;
    let gate = Arc::new(Semaphore::new(0));
    let chunks = chat_chunks((0..DELTAS).map(delta));
    engine.script(
        QWEN,
        Reply::Sse {
            chunks,
            gate: Some(Arc::clone(&gate)),
            hang: false,
        },
    );
    let events_dir = tempfile::tempdir().expect("tempdir");
    let events_file = events_dir.path().join("events.jsonl");
    let config = format!(
        "{}\n[runs]\nresume_grace_ms = 30000\n[events]\nsinks = [\"file\"]\n[events.file]\npath = {:?}\nflush_interval_ms = 20\n",
        edge_config(&engine.base_url(), &["qwen"], HEARTBEAT_MS),
        events_file.display().to_string(),
    );
    let app = edge_on(&config, SocketAddr::from(([127, 0, 0, 1], 0))).await;
    let relay = Relay::start(app.node_addr).await;
    let node = spawn_node(relay.addr, "token-1", |o| {
        o.dead_after_intervals = dead_after_intervals;
    });
    app.wait_for_nodes(1).await;
    Setup {
        app,
        engine,
        gate,
        relay,
        node,
        events_file,
        _events_dir: events_dir,
    }
}

/// A client's chat-completion stream, read an SSE event at a time.
struct Stream {
    response: reqwest::Response,
    buffer: String,
    run_id: String,
}

impl Stream {
    async fn open(app: &TestApp) -> Self {
        let body = json!({
            "model": "llama/qwen",
            "stream": true,
            "messages": [{"role": "user", "content": "tell me a long story"}],
        });
        let (response, run_id) = open_stream(app, "/v1/chat/completions", &body).await;
        Self {
            response,
            buffer: String::new(),
            run_id,
        }
    }

    /// The next event's `data`; `None` once the stream ended.
    async fn next(&mut self) -> Option<String> {
        loop {
            if let Some(end) = self.buffer.find("\n\n") {
                let block: String = self.buffer.drain(..end + 2).collect();
                match block.lines().find_map(|l| l.strip_prefix("data: ")) {
                    Some(data) => return Some(data.to_owned()),
                    None => continue,
                }
            }
            let chunk = tokio::time::timeout(PATIENCE, self.response.chunk())
                .await
                .expect("the stream goes on")
                .expect("the stream reads")?;
            self.buffer
                .push_str(std::str::from_utf8(&chunk).expect("UTF-8"));
        }
    }

    /// Reads chunks until `deltas` more content deltas arrived (or, with `None`, to
    /// `[DONE]`); returns the deltas and the finish reasons seen.
    async fn read(&mut self, deltas: Option<usize>) -> (Vec<String>, Vec<String>) {
        let (mut texts, mut finishes) = (Vec::new(), Vec::new());
        while deltas.is_none_or(|n| texts.len() < n) {
            let Some(data) = self.next().await else {
                panic!("the stream ended without [DONE]");
            };
            if data == "[DONE]" {
                assert_eq!(deltas, None, "[DONE] came early");
                break;
            }
            let chunk: Value = serde_json::from_str(&data).expect("a JSON chunk");
            let choice = &chunk["choices"][0];
            // The first chunk carries the role and an empty content.
            if let Some(text) = choice["delta"]["content"]
                .as_str()
                .filter(|t| !t.is_empty())
            {
                texts.push(text.to_owned());
            }
            if let Some(reason) = choice["finish_reason"].as_str() {
                finishes.push(reason.to_owned());
            }
        }
        (texts, finishes)
    }
}

/// Posts a streamed request to the API's `path`: the open response and its run id.
pub(crate) async fn open_stream(
    app: &TestApp,
    path: &str,
    body: &Value,
) -> (reqwest::Response, String) {
    open_stream_at(app.http_addr, path, body).await
}

/// [`open_stream`] to the API at `http`.
pub(crate) async fn open_stream_at(
    http: SocketAddr,
    path: &str,
    body: &Value,
) -> (reqwest::Response, String) {
    let response = crate::common::http_client()
        .post(format!("http://{http}{path}"))
        .header(crate::stream_resume::RESUMABLE, "true")
        .json(body)
        .send()
        .await
        .expect("the request is answered");
    assert_eq!(response.status(), 200);
    let run_id = response.headers()["x-edge-run-id"]
        .to_str()
        .expect("a run id")
        .to_owned();
    (response, run_id)
}

/// The run's events in the file sink, once its terminal event is there.
pub(crate) async fn sunk(events_file: &Path, run_id: &str) -> Vec<Value> {
    let mut lines = Vec::new();
    eventually("the run's terminal event is in the file sink", || {
        let text = std::fs::read_to_string(events_file).unwrap_or_default();
        lines = text
            .lines()
            .filter_map(|l| serde_json::from_str::<Value>(l).ok())
            .filter(|l| l["run_id"] == run_id)
            .collect();
        lines.iter().any(is_terminal)
    })
    .await;
    lines
}

pub(crate) fn is_terminal(line: &Value) -> bool {
    matches!(
        line["kind"].as_str(),
        Some("completed" | "failed" | "cancelled")
    )
}

/// Streams through a break made by `break_link` after [`BEFORE_THE_BREAK`] deltas, and
/// checks what the client and the sink got.
async fn streams_through(setup: Setup, break_link: impl FnOnce(&Relay)) {
    let Setup {
        app,
        engine,
        gate,
        relay,
        node,
        events_file,
        _events_dir,
    } = setup;
    let before = app.parts.registry.get("node-1").expect("live").connection;
    // The API answers once the run has produced something: let the first deltas out.
    gate.add_permits(BEFORE_THE_BREAK);
    let mut stream = Stream::open(&app).await;
    let (mut texts, mut finishes) = stream.read(Some(BEFORE_THE_BREAK)).await;

    break_link(&relay);
    // The engine goes on while the node is away: the node buffers.
    gate.add_permits(DELTAS - BEFORE_THE_BREAK + 2);
    let (rest, rest_finishes) = stream.read(None).await;
    texts.extend(rest);
    finishes.extend(rest_finishes);

    let expected: Vec<String> = (0..DELTAS).map(delta).collect();
    assert_eq!(texts, expected, "every delta once, in order");
    assert_eq!(finishes, ["stop"]);
    let after = app.parts.registry.get("node-1").expect("back").connection;
    assert_ne!(before, after, "the node is on a new connection");
    // Resumed, not run again.
    assert_eq!(engine.seen().len(), 1);

    let lines = sunk(&events_file, &stream.run_id).await;
    assert_eq!(lines.iter().filter(|l| is_terminal(l)).count(), 1);
    assert_eq!(
        lines.last().map(|l| l["kind"].clone()),
        Some(json!("completed"))
    );
    let seqs: Vec<u64> = lines.iter().filter_map(|l| l["seq"].as_u64()).collect();
    assert!(
        seqs.windows(2).all(|w| w[0] < w[1]),
        "the sink's seqs increase: {seqs:?}"
    );
    let outputs = lines.iter().filter(|l| l["kind"] == "output").count();
    assert_eq!(outputs, DELTAS);

    node.stop().await.expect("clean stop");
    app.assert_settled().await;
}

#[crate::common::test]
async fn a_cut_mid_stream_is_invisible_to_the_client() {
    let setup = setup(3).await;
    streams_through(setup, Relay::cut).await;
}

#[crate::common::test]
async fn a_black_hole_mid_stream_is_invisible_to_the_client() {
    // The node judges the link by its pings after one silent interval, well within the
    // edge's own bound: its reconnect takes the half-open connection over, runs and all.
    let setup = setup(1).await;
    pings_answered(&setup.app).await;
    streams_through(setup, Relay::black_hole).await;
}
