//! What the `tests/api_*.rs` crates share: an edge with one mock node serving a target per
//! scripted behaviour, and an HTTP client that reads JSON answers and SSE streams (data-only
//! or named events).
#![allow(dead_code)]

use std::time::Duration;

use edge::ports::{NodeCommand, RunAssignment};
use reqwest::{RequestBuilder, Response, StatusCode};
use serde_json::Value;

use crate::common::{TestApp, spawn_app};
use crate::mock_node::{MockNode, MockOptions};

/// The longest any single request may take before a test gives up.
pub const PATIENCE: Duration = Duration::from_secs(10);

/// One node (`node-a`, token `token-a`) serving `echo/` plus a target per behaviour.
pub const BEHAVIOUR_NODE: &str = r#"
[[nodes]]
id = "node-a"
alias = "gpu-a"
token = "token-a"
[nodes.runtime]
max_concurrent_runs = 8
heartbeat_interval_ms = 1000
[[nodes.adapters]]
name = "echo"
targets = ["default", "reasoning", "tools", "logprobs", "length", "filtered", "bad_request", "node_error", "refused", "hang"]
"#;

/// A running edge with its one mock node.
pub struct Edge {
    /// The edge.
    pub app: TestApp,
    /// Its node.
    pub node: MockNode,
}

impl Edge {
    /// An edge with [`BEHAVIOUR_NODE`] plus `extra` config, and the node registered.
    pub async fn start(extra: &str) -> Self {
        let app = spawn_app(&format!("{BEHAVIOUR_NODE}\n{extra}\n")).await;
        let node = MockNode::start(app.node_addr, MockOptions::new("token-a"))
            .await
            .expect("the mock node registers");
        app.wait_for_nodes(1).await;
        Self { app, node }
    }

    /// The URL of `path`.
    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.app.http_addr)
    }

    /// A POST of `body` to `path`, ready for headers.
    pub fn post(&self, path: &str, body: &Value) -> RequestBuilder {
        client().post(self.url(path)).json(body)
    }

    /// POSTs `body` to `path`.
    pub async fn send(&self, path: &str, body: &Value) -> Response {
        self.post(path, body).send().await.expect("a response")
    }

    /// POSTs raw `body` (as JSON content) to `path`.
    pub async fn send_raw(&self, path: &str, body: &str) -> Response {
        client()
            .post(self.url(path))
            .header("content-type", "application/json")
            .body(body.to_owned())
            .send()
            .await
            .expect("a response")
    }

    /// The runs the edge sent the node.
    pub fn runs(&self) -> Vec<RunAssignment> {
        self.node
            .commands()
            .into_iter()
            .filter_map(|c| match c {
                NodeCommand::Run(run) => Some(run),
                _ => None,
            })
            .collect()
    }

    /// The JSON input of the last run the node got.
    pub fn last_input(&self) -> Value {
        let run = self.runs().pop().expect("the node got a run");
        serde_json::from_slice(&run.input).expect("the input is JSON")
    }

    /// Checks that the edge forgot its runs, then stops it.
    pub async fn stop(self) {
        self.app.assert_settled().await;
        self.node.kill();
        self.app.stop().await;
    }
}

/// An HTTP client that gives up after [`PATIENCE`].
pub fn client() -> reqwest::Client {
    crate::common::http()
        .timeout(PATIENCE)
        .build()
        .expect("client")
}

/// A chat completion request for `model` with one user message, streamed or not.
pub fn chat(model: &str, content: &str, stream: bool) -> Value {
    serde_json::json!({
        "model": model,
        "stream": stream,
        "messages": [{"role": "user", "content": content}],
    })
}

/// The text of a whole (not streamed) chat answer.
pub fn chat_text(answer: &Value) -> &str {
    answer["choices"][0]["message"]["content"]
        .as_str()
        .unwrap_or_default()
}

/// The text of a chat chunk stream's chunks, joined.
pub fn chunks_text(chunks: &[Value]) -> String {
    chunks
        .iter()
        .filter_map(|c| c["choices"][0]["delta"]["content"].as_str())
        .collect()
}

/// The JSON body of a `200 OK` answer.
pub async fn ok_json(response: Response) -> Value {
    let status = response.status();
    let body = response.text().await.expect("a body");
    assert_eq!(status, StatusCode::OK, "{body}");
    serde_json::from_str(&body).expect("a JSON body")
}

/// The JSON body of an answer that must have `status`.
pub async fn json_with(response: Response, status: StatusCode) -> Value {
    assert_eq!(response.status(), status);
    response.json().await.expect("a JSON body")
}

/// One SSE event: its `event:` name (if any) and its `data:`.
#[derive(Debug, Clone, PartialEq)]
pub struct Sse {
    /// The event name.
    pub event: Option<String>,
    /// The data, as text.
    pub data: String,
}

impl Sse {
    /// The data as JSON.
    pub fn json(&self) -> Value {
        serde_json::from_str(&self.data)
            .unwrap_or_else(|e| panic!("event data is not JSON ({e}): {}", self.data))
    }
}

/// The whole body of an SSE answer, which must be `200 OK` with `text/event-stream`.
pub async fn event_stream_body(response: Response) -> String {
    assert_eq!(response.status(), StatusCode::OK);
    let content_type = response.headers()["content-type"]
        .to_str()
        .unwrap()
        .to_owned();
    assert!(
        content_type.starts_with("text/event-stream"),
        "{content_type}"
    );
    response.text().await.expect("the stream ends")
}

/// The events of a whole SSE answer (which must be `200 OK` with `text/event-stream`).
pub async fn read_events(response: Response) -> Vec<Sse> {
    let body = event_stream_body(response).await;
    body.split("\n\n")
        .filter_map(|block| {
            let mut event = None;
            let mut data = Vec::new();
            for line in block.lines() {
                if let Some(name) = line.strip_prefix("event:") {
                    event = Some(name.trim().to_owned());
                } else if let Some(value) = line.strip_prefix("data:") {
                    data.push(value.strip_prefix(' ').unwrap_or(value));
                }
            }
            (!data.is_empty()).then(|| Sse {
                event,
                data: data.join("\n"),
            })
        })
        .collect()
}

/// The JSON chunks of an OpenAI chunk stream, checking that it ends with `[DONE]`.
pub async fn read_chunks(response: Response) -> Vec<Value> {
    let events = read_events(response).await;
    assert_eq!(
        events.last().map(|e| e.data.as_str()),
        Some("[DONE]"),
        "{events:?}"
    );
    events[..events.len() - 1].iter().map(Sse::json).collect()
}
