//! Continuation over real TCP: a real edge with the file sink, two reference nodes, each in
//! front of its own scripted OpenAI engine, and a client streaming a chat completion. The
//! first node's link is cut mid-answer (resume off, so its run is lost for good); the edge
//! continues the run on the second node, which asks its engine to go on from the text the
//! client has (a trailing assistant message) and drops the engine's echo of it, as
//! `llama-server` sends one. The client's stream completes with nothing repeated or lost,
//! and one terminal event reaches the sink.

use std::net::SocketAddr;
use std::sync::Arc;

use serde_json::json;
use tokio::sync::Semaphore;

use crate::node_support::relay::Relay;
use crate::node_support::upstream::{Reply, ScriptedEngine};
use crate::node_support::{QWEN, edge_config, edge_on, spawn_node};
use crate::resume::{Stream, is_terminal, sunk};

/// Deltas the first engine has; the client reads [`BEFORE`] of them before the cut.
const DELTAS: usize = 20;
const BEFORE: usize = 6;

fn delta(n: usize) -> String {
    format!("d{n} ")
}

fn content(text: &str) -> String {
    json!({"choices": [{"index": 0, "delta": {"content": text}}]}).to_string()
}

fn finished(chunks: &mut Vec<String>) {
    chunks
        .push(json!({"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}).to_string());
    chunks.push("[DONE]".to_owned());
}

/// `edge_config`'s node, as `node-2` with `token-2` in front of `base_url`.
fn second_node(base_url: &str) -> String {
    edge_config(base_url, &["qwen"], 1_000)
        .replace("node-1", "node-2")
        .replace("box-1", "box-2")
        .replace("token-1", "token-2")
}

#[tokio::test]
async fn a_stream_whose_node_is_lost_mid_answer_is_finished_by_another_node() {
    let first = ScriptedEngine::start(&[QWEN]).await;
    let gate = Arc::new(Semaphore::new(0));
    let mut chunks: Vec<String> = (0..DELTAS).map(|n| content(&delta(n))).collect();
    finished(&mut chunks);
    let gate_for_engine = Some(Arc::clone(&gate));
    first.script(
        QWEN,
        Reply::Sse {
            chunks,
            gate: gate_for_engine,
            hang: false,
        },
    );
    let prefix: String = (0..BEFORE).map(delta).collect();
    let second = ScriptedEngine::start(&[QWEN]).await;
    // llama-server streams the continued text back first, then what it adds.
    let mut chunks = vec![content(&format!("{prefix}e0 ")), content("e1")];
    finished(&mut chunks);
    second.script(
        QWEN,
        Reply::Sse {
            chunks,
            gate: None,
            hang: false,
        },
    );

    let events_dir = tempfile::tempdir().expect("tempdir");
    let events_file = events_dir.path().join("events.jsonl");
    let config = format!(
        "{}{}\n[runs]\nresume_grace_ms = 0\n[events]\nsinks = [\"file\"]\n[events.file]\npath = {:?}\nflush_interval_ms = 20\n",
        edge_config(&first.base_url(), &["qwen"], 1_000),
        second_node(&second.base_url()),
        events_file.display().to_string(),
    );
    let app = edge_on(&config, SocketAddr::from(([127, 0, 0, 1], 0))).await;
    let relay = Relay::start(app.node_addr).await;
    let node_1 = spawn_node(relay.addr, "token-1", |_| {});
    app.wait_for_nodes(1).await;

    gate.add_permits(BEFORE);
    let mut stream = Stream::open(&app).await;
    let (mut texts, _) = stream.read(Some(BEFORE)).await;
    // The second node arrives once the run is on the first.
    let node_2 = spawn_node(app.node_addr, "token-2", |_| {});
    app.wait_for_nodes(2).await;
    relay.cut();
    let (rest, finishes) = stream.read(None).await;
    texts.extend(rest);

    let mut expected: Vec<String> = (0..BEFORE).map(delta).collect();
    expected.extend(["e0 ".to_owned(), "e1".to_owned()]);
    assert_eq!(texts, expected, "the prefix, then only the continuation");
    assert_eq!(finishes, ["stop"]);
    let asked = second.seen();
    assert_eq!(asked.len(), 1);
    let messages = asked[0].body["messages"].as_array().expect("messages");
    assert_eq!(
        messages.last(),
        Some(&json!({"role": "assistant", "content": prefix}))
    );

    let lines = sunk(&events_file, &stream.run_id).await;
    assert_eq!(lines.iter().filter(|l| is_terminal(l)).count(), 1);
    assert_eq!(
        lines.last().map(|l| l["kind"].clone()),
        Some(json!("completed"))
    );
    let reasons: Vec<_> = lines
        .iter()
        .filter(|l| l["kind"] == "started")
        .map(|l| l["route"]["reason"].clone())
        .collect();
    assert_eq!(reasons.len(), 2, "{lines:?}");

    gate.add_permits(DELTAS + 2);
    node_2.stop().await.expect("clean stop");
    node_1.stop.cancel();
    app.assert_settled().await;
}
