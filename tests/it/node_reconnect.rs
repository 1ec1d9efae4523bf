//! The reference node against a real edge that goes away: after an edge restart the node
//! registers again by itself (backoff with jitter) and serves runs; after a network cut the
//! node claims its run on reconnect, and since this edge does not resume (resume is off),
//! the refused claim makes the node close the engine request while the edge fails the run.
//! (`resume.rs` has the same cut with resume on.)

use crate::common;
#[allow(dead_code, unused_imports)]
use crate::node;
use crate::node_support;

use std::net::SocketAddr;

use common::runs::{failure_code, next_event, only_terminal, rest, start};
use common::{TestApp, eventually};
use edge::domain::RunEventKind;
use node_support::relay::Relay;
use node_support::upstream::{Reply, ScriptedEngine};
use node_support::{QWEN, answer, edge_config, edge_on, prompt, spawn_node};
use serde_json::json;

async fn completes(app: &TestApp, text: &str) {
    let mut handle = start(app, prompt(text));
    let events = rest(&mut handle).await;
    let terminal = only_terminal(&handle.run_id, &events);
    assert!(
        matches!(terminal.kind, RunEventKind::Completed { .. }),
        "{events:#?}"
    );
}

#[crate::common::test]
async fn the_node_registers_again_after_the_edge_restarts() {
    let engine = ScriptedEngine::start(&[QWEN]).await;
    engine.script(QWEN, answer("hi"));
    let config = edge_config(&engine.base_url(), &["qwen"], 500);
    let first = edge_on(&config, SocketAddr::from(([127, 0, 0, 1], 0))).await;
    let node_addr = first.node_addr;
    let node = spawn_node(node_addr, "token-1", |_| {});
    first.wait_for_nodes(1).await;
    completes(&first, "before").await;
    first.stop().await;

    let second = edge_on(&config, node_addr).await;
    second.wait_for_nodes(1).await;
    completes(&second, "after").await;
    node.stop().await.expect("clean stop");
    second.assert_settled().await;
}

#[crate::common::test]
async fn after_a_cut_an_edge_without_resume_fails_the_run_and_the_node_closes_the_engine_request() {
    let engine = ScriptedEngine::start(&[QWEN]).await;
    let first_words =
        json!({"choices": [{"index": 0, "delta": {"content": "long answer..."}}]}).to_string();
    engine.script(
        QWEN,
        Reply::Sse {
            chunks: vec![first_words],
            gate: None,
            hang: true,
        },
    );
    let config = edge_config(&engine.base_url(), &["qwen"], 500) + "[runs]\nresume_grace_ms = 0\n";
    let app = edge_on(&config, SocketAddr::from(([127, 0, 0, 1], 0))).await;
    let relay = Relay::start(app.node_addr).await;
    let node = spawn_node(relay.addr, "token-1", |_| {});
    app.wait_for_nodes(1).await;
    let mut handle = start(&app, prompt("tell me a story"));
    while !matches!(
        next_event(&mut handle).await.kind,
        RunEventKind::Output { .. }
    ) {}

    relay.cut();
    let events = rest(&mut handle).await;
    assert_eq!(
        failure_code(only_terminal(&handle.run_id, &events)),
        "node_disconnected"
    );
    // The node comes back, claims the run, is refused, and lets it go.
    app.wait_for_nodes(1).await;
    eventually("the engine request is closed", || {
        engine.dropped_streams() == 1
    })
    .await;
    node.stop().await.expect("clean stop");
    app.assert_settled().await;
}
