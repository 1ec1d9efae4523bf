//! Stop means stop: a streamed answer whose client goes away is cancelled on its node at
//! once — a chat UI's stop button, an interrupted agent turn, an SDK closing its stream —
//! unless the client asked for a resumable stream (`x-edge-resumable: true` or its key's
//! `resumable = true`; `stream_resume.rs` covers those). Every edge here has a resume
//! grace of ten minutes, so only a cancel that does not wait for it can pass.

use edge::ports::NodeCommand;
use futures::StreamExt as _;
use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::common::python::run_client_script;
use crate::common::runs::words;
use crate::common::{NodeTable, TestApp, bounded, eventually, eventually_ok, http_get};
use crate::mock_node::MockNode;
use crate::stream_resume::{RESUMABLE, slow_echo_edge};

/// Far longer than any test may take: a run cancelled only after it never is.
const GRACE_MS: u64 = 600_000;

const API_KEY: &str = "sk-stop";

/// An edge whose node `node-a` runs one run at a time, with the long grace, and that node
/// echoing slowly (5 ms a word).
async fn edge() -> (TestApp, MockNode) {
    let node = NodeTable::new("node-a", "gpu-a", "token-a")
        .runtime(1, 1_000)
        .echo(&["default"]);
    let config = format!(
        "{node}\n[api]\nkeys = [\"{API_KEY}\"]\n[runs]\nclient_resume_grace_ms = {GRACE_MS}\n"
    );
    slow_echo_edge(&config).await
}

fn chat(text: &str) -> (&'static str, Value) {
    let body = json!({
        "model": "echo/default", "stream": true,
        "messages": [{"role": "user", "content": text}],
    });
    ("/v1/chat/completions", body)
}

fn messages(text: &str) -> (&'static str, Value) {
    let body = json!({
        "model": "echo/default", "max_tokens": 4096, "stream": true,
        "messages": [{"role": "user", "content": text}],
    });
    ("/v1/messages", body)
}

/// Starts `request`'s stream (with `resumable` as the header, if any), reads until some
/// text has come, drops the connection; the run's id.
async fn read_a_little(
    app: &TestApp,
    (path, body): (&str, Value),
    resumable: Option<&str>,
) -> String {
    let mut request = crate::common::http_client()
        .post(format!("http://{}{path}", app.http_addr))
        .bearer_auth(API_KEY)
        .json(&body);
    if let Some(value) = resumable {
        request = request.header(RESUMABLE, value);
    }
    let response = request.send().await.expect("a response");
    assert_eq!(response.status(), StatusCode::OK);
    let run_id = response.headers()["x-edge-run-id"]
        .to_str()
        .expect("a run id")
        .to_owned();
    let mut body = response.bytes_stream();
    let mut seen = String::new();
    while seen.matches("data: ").count() < 3 {
        let bytes = bounded("the stream's first events", body.next())
            .await
            .expect("the stream goes on")
            .expect("bytes");
        seen.push_str(&String::from_utf8_lossy(&bytes));
    }
    // Only a resumable stream's events carry ids.
    assert_eq!(
        seen.contains("\nid: ") || seen.starts_with("id: "),
        resumable == Some("true"),
        "{seen}"
    );
    run_id
}

/// Whether the node was told to cancel `run_id` because its client went away.
fn told_to_stop(node: &MockNode, run_id: &str) -> bool {
    node.commands().iter().any(|command| {
        matches!(command, NodeCommand::Cancel { run_id: id, reason }
            if id.as_str() == run_id && reason == "client disconnected")
    })
}

/// Run `run_id`'s record once it has ended.
async fn ended(app: &TestApp, run_id: &str) -> Value {
    let url = format!("http://{}/admin/v1/runs/{run_id}", app.admin_addr);
    eventually_ok("the run has ended", || async {
        let record: Value = http_get(&url)
            .await
            .map_err(|error| error.to_string())?
            .json()
            .await
            .map_err(|error| error.to_string())?;
        if record["outcome"] == "open" {
            Err(format!("still open: {record}"))
        } else {
            Ok(record)
        }
    })
    .await
}

/// A dropped stream that did not ask to be resumable: cancelled at once, having produced a
/// fraction of its 2,000 words, and not resumable afterwards.
async fn dropped_and_stopped(request: (&str, Value)) {
    let (app, node) = edge().await;
    let run_id = read_a_little(&app, request, None).await;
    eventually("the node is told to stop", || told_to_stop(&node, &run_id)).await;
    let record = ended(&app, &run_id).await;
    assert_eq!(record["outcome"], "cancelled", "{record}");
    let events = record["events"].as_u64().expect("an event count");
    assert!(
        events < 1_000,
        "{events} events: the run went on after its client left"
    );
    let resumed = crate::common::http_client()
        .get(format!("http://{}/v1/runs/{run_id}/stream", app.http_addr))
        .bearer_auth(API_KEY)
        .send()
        .await
        .expect("an answer");
    assert_eq!(resumed.status(), StatusCode::NOT_FOUND);
    app.assert_settled().await;
    node.kill();
    app.stop().await;
}

#[crate::common::test]
async fn a_dropped_chat_stream_is_cancelled_on_its_node_at_once() {
    dropped_and_stopped(chat(&words(2_000))).await;
}

#[crate::common::test]
async fn a_dropped_messages_stream_is_cancelled_on_its_node_at_once() {
    dropped_and_stopped(messages(&words(2_000))).await;
}

#[crate::common::test]
async fn a_stream_that_asked_to_be_resumable_waits_for_its_client() {
    let (app, node) = edge().await;
    let run_id = read_a_little(&app, chat(&words(40)), Some("true")).await;
    // Not cancelled: it finishes for a client that may resume it.
    let record = ended(&app, &run_id).await;
    assert_eq!(record["outcome"], "completed", "{record}");
    assert!(!told_to_stop(&node, &run_id));
    let bad = crate::common::http_client()
        .post(format!("http://{}/v1/chat/completions", app.http_addr))
        .bearer_auth(API_KEY)
        .header(RESUMABLE, "maybe")
        .json(&chat("hi").1)
        .send()
        .await
        .expect("an answer");
    assert_eq!(bad.status(), StatusCode::BAD_REQUEST);
    let body: Value = bad.json().await.expect("JSON");
    assert_eq!(body["error"]["code"], "invalid_header", "{body}");
    node.kill();
    app.stop().await;
}

#[crate::common::test]
async fn an_abandoned_stream_does_not_keep_the_next_turn_waiting() {
    // The node runs one run at a time; the abandoned one would hold it for ten minutes.
    let (app, node) = edge().await;
    let abandoned = read_a_little(&app, chat(&words(2_000)), None).await;
    let next = crate::common::http_client()
        .post(format!("http://{}/v1/chat/completions", app.http_addr))
        .bearer_auth(API_KEY)
        .json(&json!({
            "model": "echo/default",
            "messages": [{"role": "user", "content": "the next turn"}],
        }))
        .send()
        .await
        .expect("the next turn is answered");
    assert_eq!(next.status(), StatusCode::OK);
    let answer: Value = next.json().await.expect("JSON");
    assert_eq!(answer["choices"][0]["message"]["content"], "the next turn");
    assert!(told_to_stop(&node, &abandoned));
    app.assert_settled().await;
    node.kill();
    app.stop().await;
}

#[crate::common::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_official_sdks_closing_a_stream_stop_its_run_at_once() {
    let (app, node) = edge().await;
    let base_url = format!("http://{}", app.http_addr);
    let output = run_client_script("sdk_disconnect.py", &[&base_url, API_KEY]).await;
    let run_ids: Vec<&str> = output.lines().skip(1).collect();
    assert_eq!(run_ids.len(), 2, "{output}");
    for run_id in run_ids {
        eventually("the node is told to stop", || told_to_stop(&node, run_id)).await;
        let record = ended(&app, run_id).await;
        assert_eq!(record["outcome"], "cancelled", "{record}");
        let events = record["events"].as_u64().expect("an event count");
        assert!(
            events < 1_000,
            "{events} events after the SDK closed the stream"
        );
    }
    app.assert_settled().await;
    node.kill();
    app.stop().await;
}
