//! Chat completion and Messages streams resumed after `Last-Event-ID` through
//! `GET /v1/runs/{run_id}/stream`, over real HTTP against a mock node that streams slowly:
//! read part-way, the connection dropped, resumed — the whole text is the uninterrupted
//! stream's, no event twice; and a stream dropped with nobody resuming it ends cancelled
//! once `runs.client_resume_grace_ms` has passed. A stream is resumable only when asked
//! for (`x-edge-resumable: true`, or the key's `resumable = true`); any other stream whose
//! client goes away is cancelled on its node at once, grace or not.

use std::net::SocketAddr;
use std::time::Duration;

use edge::ports::NodeCommand;
use futures::StreamExt;
use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::common::runs::words;
use crate::common::{TWO_NODES, TestApp, eventually, spawn_app};
use crate::mock_node::{Behaviour, MockNode, MockOptions};

const PATIENCE: Duration = Duration::from_secs(10);

/// The header a client asks for a resumable stream with.
pub const RESUMABLE: &str = "x-edge-resumable";

/// One SSE event: its id, name and data.
#[derive(Debug, Clone, PartialEq)]
pub struct Event {
    pub id: String,
    pub name: Option<String>,
    pub data: String,
}

impl Event {
    /// Its id as `(position, part)`, for ordering.
    pub fn order(&self) -> (u64, u32) {
        let (position, part) = self.id.split_once('.').unwrap_or((&self.id, "0"));
        (
            position.parse().expect("a position"),
            part.parse().expect("a part"),
        )
    }
}

/// The complete events in `text` (an event ends with a blank line).
pub fn events_in(text: &str) -> Vec<Event> {
    text.split("\n\n")
        .filter(|block| !block.trim().is_empty() && !block.starts_with(':'))
        .map(|block| {
            let field = |name: &str| {
                block
                    .lines()
                    .find_map(|line| line.strip_prefix(name).map(str::to_owned))
            };
            Event {
                id: field("id: ").expect("every event has an id"),
                name: field("event: "),
                data: field("data: ").expect("every event has data"),
            }
        })
        .collect()
}

/// An edge (`runs.client_resume_grace_ms` = `grace_ms`, and `extra` config) with a mock
/// node that streams slowly.
async fn edge_with(grace_ms: u64, extra: &str) -> (TestApp, MockNode) {
    slow_echo_edge(&format!(
        "{TWO_NODES}\n{extra}\n[runs]\nclient_resume_grace_ms = {grace_ms}\n"
    ))
    .await
}

/// An edge of `config` with its node `token-a` connected: a mock node that echoes slowly (5
/// ms a word).
pub async fn slow_echo_edge(config: &str) -> (TestApp, MockNode) {
    let app = spawn_app(config).await;
    let options = MockOptions {
        behaviour: Behaviour::Echo,
        delay: Duration::from_millis(5),
        ..MockOptions::new("token-a")
    };
    let node = MockNode::start(app.node_addr, options)
        .await
        .expect("the mock node registers");
    app.wait_for_nodes(1).await;
    (app, node)
}

async fn edge(grace_ms: u64) -> (TestApp, MockNode) {
    edge_with(grace_ms, "").await
}

fn client() -> reqwest::Client {
    crate::common::http()
        .timeout(PATIENCE)
        .build()
        .expect("client")
}

fn chat_body(text: &str) -> (&'static str, Value) {
    let body = json!({
        "model": "echo/default",
        "stream": true,
        "messages": [{"role": "user", "content": text}],
    });
    ("/v1/chat/completions", body)
}

fn messages_body(text: &str) -> (&'static str, Value) {
    let body = json!({
        "model": "echo/default",
        "max_tokens": 1000,
        "stream": true,
        "messages": [{"role": "user", "content": text}],
    });
    ("/v1/messages", body)
}

/// The text the events carry, in either API's shape.
pub fn text_of(events: &[Event]) -> String {
    let mut text = String::new();
    for event in events {
        let Ok(data) = serde_json::from_str::<Value>(&event.data) else {
            continue;
        };
        let piece = data["choices"][0]["delta"]["content"]
            .as_str()
            .or_else(|| data["delta"]["text"].as_str());
        text.push_str(piece.unwrap_or_default());
    }
    text
}

/// Starts the stream of `request`, reads events until `at_least` have come, drops the
/// connection; returns the run's id and the complete events read.
async fn read_part(
    app: &TestApp,
    (path, body): &(&str, Value),
    at_least: usize,
) -> (String, Vec<Event>) {
    read_part_as(app, None, &(path, body.clone()), at_least).await
}

/// [`read_part`] with API key `key` (whose table makes its streams resumable); without a
/// key the request asks for a resumable stream itself.
async fn read_part_as(
    app: &TestApp,
    key: Option<&str>,
    (path, body): &(&str, Value),
    at_least: usize,
) -> (String, Vec<Event>) {
    let mut request = client()
        .post(format!("http://{}{path}", app.http_addr))
        .json(body);
    request = match key {
        Some(key) => request.bearer_auth(key),
        None => request.header(RESUMABLE, "true"),
    };
    let response = request.send().await.expect("a response");
    assert_eq!(response.status(), StatusCode::OK);
    let run_id = response.headers()["x-edge-run-id"]
        .to_str()
        .unwrap()
        .to_owned();
    (
        run_id,
        read_until(response, |events| events.len() >= at_least).await,
    )
}

/// Reads `response`'s events until `enough` says so, then drops the connection; the
/// complete events read.
pub async fn read_until(
    response: reqwest::Response,
    enough: impl Fn(&[Event]) -> bool,
) -> Vec<Event> {
    let mut stream = response.bytes_stream();
    let mut seen = String::new();
    while !enough(&events_in(&complete(&seen))) {
        let bytes = tokio::time::timeout(PATIENCE, stream.next())
            .await
            .expect("a chunk in time")
            .expect("the stream goes on")
            .expect("bytes");
        seen.push_str(&String::from_utf8_lossy(&bytes));
    }
    events_in(&complete(&seen))
}

/// `text` up to its last complete event.
pub fn complete(text: &str) -> String {
    text.rfind("\n\n")
        .map_or_else(String::new, |end| text[..end + 2].to_owned())
}

/// Resumes run `run_id`'s stream from the edge at `http` after `last` (from the start
/// without); every event.
pub async fn resume(http: SocketAddr, run_id: &str, last: Option<&str>) -> Vec<Event> {
    let mut request = client().get(format!("http://{http}/v1/runs/{run_id}/stream"));
    if let Some(last) = last {
        request = request.header("last-event-id", last);
    }
    let response = request.send().await.expect("a response");
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(response.headers()["x-edge-run-id"], run_id);
    events_in(&response.text().await.expect("the whole stream"))
}

/// Reads part of `request`'s stream, drops it, resumes: the events are the uninterrupted
/// stream's, none twice.
async fn dropped_and_resumed(request: (&str, Value)) {
    let (app, node) = edge(60_000).await;
    let (run_id, first) = read_part(&app, &request, 4).await;
    let last = first.last().map(|e| e.id.clone());
    let rest = resume(app.http_addr, &run_id, last.as_deref()).await;
    let whole = resume(app.http_addr, &run_id, None).await;
    let joined: Vec<Event> = first.iter().chain(&rest).cloned().collect();
    assert_eq!(
        joined, whole,
        "the resumed stream continues the first, event for event"
    );
    let ids: std::collections::HashSet<&str> = joined.iter().map(|e| e.id.as_str()).collect();
    assert_eq!(ids.len(), joined.len(), "no id twice");
    assert_eq!(text_of(&whole), words(40));
    app.assert_settled().await;
    node.kill();
    app.stop().await;
}

#[crate::common::test]
async fn a_dropped_chat_stream_resumes_after_its_last_event_id() {
    let (path, body) = chat_body(&words(40));
    dropped_and_resumed((path, body)).await;
}

#[crate::common::test]
async fn a_dropped_messages_stream_resumes_after_its_last_event_id() {
    let (path, body) = messages_body(&words(40));
    dropped_and_resumed((path, body)).await;
}

#[crate::common::test]
async fn a_dropped_stream_nobody_resumes_is_cancelled_after_the_grace() {
    let (app, node) = edge(50).await;
    let (run_id, _) = read_part(&app, &chat_body(&words(2_000)), 3).await;
    eventually("the node got the cancel", || {
        node.commands().iter().any(|c| {
            matches!(c, NodeCommand::Cancel { run_id: id, reason } if id.as_str() == run_id && reason == "client disconnected")
        })
    })
    .await;
    // The run ended cancelled: its resumed stream says so.
    let events = resume(app.http_addr, &run_id, None).await;
    let last = events.last().expect("events");
    assert!(last.data.contains("cancel"), "{last:?}");
    app.assert_settled().await;
    node.kill();
    app.stop().await;
}

#[crate::common::test]
async fn only_a_resumable_run_of_the_caller_s_own_key_is_found() {
    let (app, node) = edge(0).await;
    let response = client()
        .get(format!(
            "http://{}/v1/runs/no-such-run/stream",
            app.http_addr
        ))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::NOT_FOUND);
    let response = client()
        .get(format!("http://{}/v1/runs/x/stream", app.http_addr))
        .header("last-event-id", "not an id")
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::BAD_REQUEST);
    node.kill();
    app.stop().await;
}

#[crate::common::test]
async fn only_the_key_that_started_a_run_resumes_its_stream() {
    let keys = "[[api.keys]]\nkey = \"sk-a\"\nname = \"team-a\"\nresumable = true\n\
                [[api.keys]]\nkey = \"sk-b\"\nname = \"team-b\"\n";
    let (app, node) = edge_with(60_000, keys).await;
    let (run_id, first) = read_part_as(&app, Some("sk-a"), &chat_body(&words(40)), 3).await;
    let url = format!("http://{}/v1/runs/{run_id}/stream", app.http_addr);
    let status = |key: Option<&'static str>| {
        let mut request = client().get(&url);
        if let Some(key) = key {
            request = request.bearer_auth(key);
        }
        async move { request.send().await.expect("a response").status() }
    };
    assert_eq!(status(None).await, StatusCode::UNAUTHORIZED);
    assert_eq!(status(Some("sk-b")).await, StatusCode::NOT_FOUND);
    let last = &first.last().expect("events").id;
    let rest = client()
        .get(&url)
        .bearer_auth("sk-a")
        .header("last-event-id", last)
        .send()
        .await
        .expect("a response");
    assert_eq!(rest.status(), StatusCode::OK);
    let rest = events_in(&rest.text().await.expect("the rest"));
    let joined: Vec<Event> = first.into_iter().chain(rest).collect();
    assert_eq!(text_of(&joined), words(40));
    app.assert_settled().await;
    node.kill();
    app.stop().await;
}

#[crate::common::test]
async fn a_resumed_messages_stream_opens_with_the_prompt_counts_of_the_first() {
    use crate::admin_support::HandNode;
    use crate::common::NodeTable;
    use edge::domain::{RunEventKind, StructuredOutput, Usage};
    let node = NodeTable::new("node-a", "gpu-a", "token-a")
        .runtime(2, 60_000)
        .echo(&["default"]);
    let app = spawn_app(&format!("{node}\n[runs]\nclient_resume_grace_ms = 60000\n")).await;
    let mut node = HandNode::register(&app, "token-a").await;
    app.wait_for_nodes(1).await;
    let (path, body) = messages_body("hello");
    let request = client()
        .post(format!("http://{}{path}", app.http_addr))
        .header(RESUMABLE, "true")
        .json(&body);
    let first = tokio::spawn(async move {
        let response = request.send().await.expect("a response");
        let run_id = response.headers()["x-edge-run-id"]
            .to_str()
            .unwrap()
            .to_owned();
        (
            run_id,
            events_in(&response.text().await.expect("the whole stream")),
        )
    });
    let run = node.next_run().await;
    // The engine's counts come with the first output (protocol v1.3).
    let prompt = Usage {
        input_tokens: 12,
        output_tokens: 1,
        cached_input_tokens: 3,
        reasoning_tokens: 0,
    };
    let counted = RunEventKind::Output {
        text: "hello ".into(),
        data: bytes::Bytes::new(),
        structured: Some(Box::new(StructuredOutput {
            usage: Some(prompt),
            ..StructuredOutput::default()
        })),
    };
    node.send(&run.run_id, RunEventKind::Started).await;
    node.send(&run.run_id, counted).await;
    node.send(&run.run_id, RunEventKind::text("world")).await;
    let ended = RunEventKind::Completed {
        finish_reason: "stop".into(),
        usage: Some(Usage {
            output_tokens: 2,
            ..prompt
        }),
    };
    node.send(&run.run_id, ended).await;
    let (run_id, first) = crate::common::bounded("the first stream", first)
        .await
        .expect("the first stream's task");
    let start: Value = serde_json::from_str(&first[0].data).expect("message_start");
    assert_eq!(start["message"]["usage"]["input_tokens"], 9, "{start}");
    assert_eq!(
        start["message"]["usage"]["cache_read_input_tokens"], 3,
        "{start}"
    );
    // Replayed from the journal, it opens the same way, event for event.
    assert_eq!(resume(app.http_addr, &run_id, None).await, first);
    app.stop().await;
}
