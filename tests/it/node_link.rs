//! The reference node's side of the link, seen from a fake edge that records every frame:
//! registration with a stable instance id, availability reports as the engine comes and
//! goes, pings and the dead-link rule, retries, resume claims after a cut and what the node
//! does with the edge's answers, refusals, and a graceful stop.

use crate::common;
#[allow(dead_code, unused_imports)]
use crate::node;
use crate::node_support;

use std::sync::Arc;

use bytes::Bytes;
use common::eventually;
use edge::domain::{
    AdapterName, FailureClass, NodeRecord, Operation, RegisterRejection, ResumeAnswer,
    ResumeRefusal, RunEventKind, RunId, Target,
};
use edge::ports::{ReportedEvent, RunAssignment};
use node_support::fake_edge::{EdgeConn, FakeEdge, Heard, record};
use node_support::upstream::{Reply, ScriptedEngine};
use node_support::{QWEN, RunningNode, adapter_settings, spawn_node};
use serde_json::json;
use tokio::sync::Semaphore;

/// The fake edge's definition of the node: `llama` serving `qwen` (and `absent`, which the
/// engine does not list), `max_runs` at once, heartbeat every `heartbeat_ms`.
fn definition(engine: &ScriptedEngine, max_runs: u32, heartbeat_ms: u32) -> Arc<NodeRecord> {
    record(
        "llama",
        &["qwen", "absent"],
        &adapter_settings(&engine.base_url(), 50),
        max_runs,
        heartbeat_ms,
    )
}

fn chat_run(run_id: &str, target: &str) -> RunAssignment {
    RunAssignment {
        run_id: RunId::new(run_id),
        adapter: AdapterName::parse("llama").expect("adapter"),
        target: Target::parse(target).expect("target"),
        input: Bytes::from(json!({"messages": [{"role": "user", "content": "hi"}]}).to_string()),
        content_type: "application/json".into(),
        params: Default::default(),
        deadline_ms: 0,
        operation: Operation::Chat,
        continuation: None,
        lora: None,
    }
}

fn content(text: &str) -> String {
    json!({"choices": [{"index": 0, "delta": {"content": text}}]}).to_string()
}

/// A started node and its first, accepted connection (availability already reported).
async fn connected(
    engine: &ScriptedEngine,
    max_runs: u32,
    heartbeat_ms: u32,
) -> (FakeEdge, EdgeConn, RunningNode, Arc<NodeRecord>) {
    let edge = FakeEdge::bind().await;
    let node = spawn_node(edge.addr, "token-1", |_| {});
    let mut conn = edge.accept().await;
    conn.registration().await;
    let definition = definition(engine, max_runs, heartbeat_ms);
    conn.accept(&definition, Vec::new()).await;
    assert_eq!(conn.availability().await, ["llama/qwen"]);
    (edge, conn, node, definition)
}

/// Scripts the engine to stream `letters` one chunk each, one per permit of the returned gate.
fn gated_letters(engine: &ScriptedEngine, letters: &str) -> Arc<Semaphore> {
    let gate = Arc::new(Semaphore::new(0));
    let mut chunks: Vec<String> = letters.chars().map(|c| content(&c.to_string())).collect();
    let stop = json!({"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]});
    chunks.extend([stop.to_string(), "[DONE]".to_owned()]);
    let reply = Reply::Sse {
        chunks,
        gate: Some(Arc::clone(&gate)),
        hang: false,
    };
    engine.script(QWEN, reply);
    gate
}

fn text_of(events: &[ReportedEvent]) -> String {
    events
        .iter()
        .filter_map(|e| match &e.kind {
            RunEventKind::Output { text, .. } => Some(text.as_str()),
            _ => None,
        })
        .collect()
}

fn failure(event: &ReportedEvent) -> (FailureClass, &str) {
    match &event.kind {
        RunEventKind::Failed { class, code, .. } => (*class, code.as_str()),
        other => panic!("expected failed, got {other:?}"),
    }
}

#[crate::common::test]
async fn availability_follows_the_engine_down_and_back_while_the_node_stays_connected() {
    let mut engine = ScriptedEngine::start(&[QWEN]).await;
    let edge = FakeEdge::bind().await;
    let node = spawn_node(edge.addr, "token-1", |_| {});
    let mut conn = edge.accept().await;
    let registration = conn.registration().await;
    assert_eq!(registration.instance_id.len(), 32);
    assert_eq!(registration.token.expose_secret(), "token-1");
    assert!(registration.resume.is_empty());
    conn.accept(&definition(&engine, 2, 1_000), Vec::new())
        .await;
    // Right after registering: the targets the engine lists (`absent` is not listed).
    assert_eq!(conn.availability().await, ["llama/qwen"]);
    engine.down().await;
    assert_eq!(conn.availability().await, Vec::<String>::new());
    engine.up().await;
    assert_eq!(conn.availability().await, ["llama/qwen"]);
    node.stop().await.expect("clean stop");
}

#[crate::common::test]
async fn heartbeats_ping_and_reconnects_keep_the_instance_id_and_retry_already_connected() {
    let engine = ScriptedEngine::start(&[QWEN]).await;
    let (edge, mut conn, node, definition) = connected(&engine, 2, 50).await;
    let beat = loop {
        if let Heard::Beat(beat) = conn.next().await {
            break beat;
        }
    };
    assert_ne!(beat.ping, 0, "heartbeats carry a ping");
    let first = beat.ping;
    let next = loop {
        if let Heard::Beat(beat) = conn.next().await {
            break beat;
        }
    };
    assert!(next.ping > first, "pings count up");
    drop(conn);
    let mut second = edge.accept().await;
    let again = second.registration().await;
    second.reject(RegisterRejection::AlreadyConnected).await;
    let mut third = edge.accept().await;
    let once_more = third.registration().await;
    assert_eq!(again.instance_id, once_more.instance_id);
    third.accept(&definition, Vec::new()).await;
    assert_eq!(third.availability().await, ["llama/qwen"]);
    node.stop().await.expect("clean stop");
}

#[crate::common::test]
async fn an_edge_that_answered_pings_and_then_falls_silent_is_left_for_a_new_connection() {
    let engine = ScriptedEngine::start(&[QWEN]).await;
    let (edge, mut conn, node, definition) = connected(&engine, 2, 50).await;
    // The availability heartbeat was acked; now the edge stops answering and reading.
    conn.ack_pings = false;
    let mut second = edge.accept().await;
    let registration = second.registration().await;
    assert_eq!(registration.instance_id.len(), 32);
    second.accept(&definition, Vec::new()).await;
    drop(conn);
    node.stop().await.expect("clean stop");
}

#[crate::common::test]
async fn after_a_cut_the_node_claims_its_run_and_an_accepted_resume_continues_the_stream() {
    let engine = ScriptedEngine::start(&[QWEN]).await;
    let gate = gated_letters(&engine, "abcdef");
    let (edge, mut conn, node, definition) = connected(&engine, 2, 1_000).await;
    conn.run(chat_run("r1", "qwen")).await;
    gate.add_permits(2);
    let mut before = Vec::new();
    while before.len() < 3 {
        before.push(conn.event().await);
    }
    assert_eq!(before.iter().map(|e| e.seq).collect::<Vec<_>>(), [1, 2, 3]);
    drop(conn);
    gate.add_permits(2);
    let mut conn = edge.accept().await;
    let registration = conn.registration().await;
    let claim = registration
        .resume
        .iter()
        .find(|c| c.run_id == "r1")
        .expect("the run is claimed");
    assert!(claim.next_seq >= 4, "{claim:?}");
    assert!(
        claim.first_buffered_seq <= 4,
        "the node still holds everything after seq 3: {claim:?}"
    );
    conn.accept(
        &definition,
        vec![ResumeAnswer {
            run_id: "r1".into(),
            outcome: Ok(4),
        }],
    )
    .await;
    gate.add_permits(10);
    let after = conn.events_until_terminal().await;
    let seqs: Vec<u64> = after.iter().map(|e| e.seq).collect();
    assert_eq!(
        seqs,
        (4..4 + after.len() as u64).collect::<Vec<_>>(),
        "nothing lost, nothing repeated"
    );
    assert_eq!(format!("{}{}", text_of(&before), text_of(&after)), "abcdef");
    assert!(
        matches!(&after.last().expect("terminal").kind, RunEventKind::Completed { finish_reason, .. } if finish_reason == "stop")
    );
    node.stop().await.expect("clean stop");
}

#[crate::common::test]
async fn refused_and_unanswered_claims_close_the_engine_requests() {
    let engine = ScriptedEngine::start(&[QWEN]).await;
    engine.script(
        QWEN,
        Reply::Sse {
            chunks: vec![content("x")],
            gate: None,
            hang: true,
        },
    );
    let (edge, mut conn, node, definition) = connected(&engine, 2, 1_000).await;
    conn.run(chat_run("r1", "qwen")).await;
    conn.run(chat_run("r2", "qwen")).await;
    let mut outputs = 0;
    while outputs < 2 {
        if matches!(conn.event().await.kind, RunEventKind::Output { .. }) {
            outputs += 1;
        }
    }
    drop(conn);
    let mut conn = edge.accept().await;
    let registration = conn.registration().await;
    let mut claimed: Vec<&str> = registration
        .resume
        .iter()
        .map(|c| c.run_id.as_str())
        .collect();
    claimed.sort_unstable();
    assert_eq!(claimed, ["r1", "r2"]);
    // r1 refused, r2 left unanswered (as an edge without resume does).
    let refused = ResumeAnswer {
        run_id: "r1".into(),
        outcome: Err(ResumeRefusal::UnknownRun),
    };
    conn.accept(&definition, vec![refused]).await;
    eventually("both engine streams are closed", || {
        engine.dropped_streams() == 2
    })
    .await;
    node.stop().await.expect("clean stop");
}

#[crate::common::test]
async fn runs_the_node_cannot_take_are_refused_without_trying() {
    let engine = ScriptedEngine::start(&[QWEN]).await;
    engine.script(
        QWEN,
        Reply::Sse {
            chunks: Vec::new(),
            gate: None,
            hang: true,
        },
    );
    let (_edge, mut conn, node, _definition) = connected(&engine, 1, 1_000).await;
    conn.run(chat_run("r1", "qwen")).await;
    assert_eq!(conn.event().await.kind, RunEventKind::Started);
    conn.run(chat_run("busy", "qwen")).await;
    let busy = conn.event().await;
    assert_eq!(
        (busy.run_id.as_str(), busy.seq, failure(&busy)),
        ("busy", 1, (FailureClass::Refused, "node_busy"))
    );
    conn.run(chat_run("absent", "absent")).await;
    let absent = conn.event().await;
    assert_eq!(
        (absent.run_id.as_str(), failure(&absent)),
        ("absent", (FailureClass::Refused, "target_unavailable"))
    );
    let mut other = chat_run("other", "qwen");
    other.adapter = AdapterName::parse("vllm").expect("adapter");
    conn.run(other).await;
    assert_eq!(
        failure(&conn.event().await),
        (FailureClass::Refused, "unknown_adapter")
    );
    node.stop().await.expect("clean stop");
}

#[crate::common::test]
async fn a_graceful_stop_offers_nothing_cancels_what_still_runs_and_returns() {
    let engine = ScriptedEngine::start(&[QWEN]).await;
    engine.script(
        QWEN,
        Reply::Sse {
            chunks: vec![content("x")],
            gate: None,
            hang: true,
        },
    );
    let edge = FakeEdge::bind().await;
    let node = spawn_node(edge.addr, "token-1", |options| {
        options.shutdown_grace = std::time::Duration::from_millis(100)
    });
    let mut conn = edge.accept().await;
    conn.registration().await;
    conn.accept(&definition(&engine, 2, 1_000), Vec::new())
        .await;
    assert_eq!(conn.availability().await, ["llama/qwen"]);
    conn.run(chat_run("r1", "qwen")).await;
    assert_eq!(conn.event().await.kind, RunEventKind::Started);
    node.stop.cancel();
    assert_eq!(
        conn.availability().await,
        Vec::<String>::new(),
        "a draining node offers nothing"
    );
    let events = conn.events_until_terminal().await;
    // With the one piece the engine produced before the shutdown.
    assert_eq!(
        events.last().expect("terminal").kind,
        RunEventKind::Cancelled {
            reason: "node_shutdown".into(),
            usage: Some(edge::domain::Usage::new(0, 1)),
        }
    );
    node.ended().await.expect("the node returns cleanly");
    eventually("the engine stream is closed", || {
        engine.dropped_streams() == 1
    })
    .await;
}
