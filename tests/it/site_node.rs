//! The reference node in a site of several edges (issue 49): it obeys the highest epoch it
//! has seen and refuses what an edge under an older one sends (a scripted edge sends a run
//! under epoch 2, then one under epoch 1: only the first runs); given the members' addresses
//! it registers on the one that acts, and when the roles flip it follows the active member
//! and its open run resumes there with every event once.

use crate::admin_crash::{completed_record, text};
use crate::common;
#[allow(dead_code, unused_imports)]
use crate::node;
use crate::node_support;
use crate::readopt::{assert_every_delta_once, engine_with_deltas_behind};
use crate::resume::open_stream_at;
use crate::site_support::free_address;

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;

use bytes::Bytes;
use common::{bounded, eventually, eventually_ok, serve_as, settings_on_free_ports};
use edge::domain::{AdapterName, Operation, RegisterRejection, RunId, Target};
use edge::ports::{ActiveMember, Role, RunAssignment};
use edge::settings::SinkKind;
use node_support::fake_edge::{FakeEdge, Heard, record};
use node_support::upstream::ScriptedEngine;
use node_support::{QWEN, adapter_settings, answer, edge_config, spawn_node};
use serde_json::{Value, json};
use tokio::sync::Semaphore;

fn chat_run(run_id: &str) -> RunAssignment {
    RunAssignment {
        run_id: RunId::new(run_id),
        adapter: AdapterName::parse("llama").expect("adapter"),
        target: Target::parse("qwen").expect("target"),
        input: Bytes::from(json!({"messages": [{"role": "user", "content": "hi"}]}).to_string()),
        content_type: "application/json".into(),
        params: Default::default(),
        deadline_ms: 0,
        operation: Operation::Chat,
        continuation: None,
        lora: None,
    }
}

/// The chat requests the engine has received.
fn chats(engine: &ScriptedEngine) -> usize {
    engine
        .seen()
        .iter()
        .filter(|seen| seen.path.ends_with("/chat/completions"))
        .count()
}

#[crate::common::test]
async fn a_node_runs_the_newer_epochs_command_and_refuses_an_older_ones() {
    let engine = ScriptedEngine::start(&[QWEN]).await;
    engine.script(QWEN, answer("hello"));
    let definition = record(
        "llama",
        &["qwen"],
        &adapter_settings(&engine.base_url(), 50),
        4,
        1_000,
    );
    let edge = FakeEdge::bind().await;
    let node = spawn_node(edge.addr, "token-1", |_| {});

    // An edge acting under epoch 2: its run runs.
    let mut conn = edge.accept().await;
    conn.registration().await;
    conn.set_epoch(2);
    conn.accept(&definition, Vec::new()).await;
    assert_eq!(conn.availability().await, ["llama/qwen"]);
    conn.run(chat_run("under-2")).await;
    let events = conn.events_until_terminal().await;
    assert!(events.iter().all(|e| e.run_id == "under-2"));
    assert_eq!(chats(&engine), 1);

    // The same connection now speaks under epoch 1 (a paused ex-leader): the node does not
    // run it and closes the connection.
    conn.set_epoch(1);
    conn.run(chat_run("under-1")).await;
    loop {
        match conn.next().await {
            Heard::Closed => break,
            Heard::Event(event) => panic!("the node ran a stale command: {event:?}"),
            Heard::Beat(_) | Heard::Register(_) | Heard::ModelOutcome(_) => {}
        }
    }

    // The node remembers epoch 2 across connections: an edge accepting it under epoch 1, or
    // under epoch 0 (a single edge), is refused; under epoch 2 it registers again.
    for stale in [1, 0] {
        let mut old = edge.accept().await;
        old.registration().await;
        old.set_epoch(stale);
        old.accept(&definition, Vec::new()).await;
        loop {
            match old.next().await {
                Heard::Closed => break,
                Heard::Event(event) => panic!("the node ran under epoch {stale}: {event:?}"),
                _ => {}
            }
        }
    }
    let mut current = edge.accept().await;
    current.registration().await;
    current.set_epoch(2);
    current.accept(&definition, Vec::new()).await;
    assert_eq!(current.availability().await, ["llama/qwen"]);
    assert_eq!(chats(&engine), 1, "only the epoch-2 run reached the engine");
    node.stop().await.expect("clean stop");
}

/// Deltas in the answer, and how many are let out before the roles flip.
const DELTAS: usize = 16;
const BEFORE_THE_FLIP: usize = 5;

/// A member of the site on `node_addr`, acting as `role`, keeping its journal in `dir`.
async fn member(
    config: &str,
    node_addr: SocketAddr,
    role: Role,
    dir: tempfile::TempDir,
) -> common::TestApp {
    let mut settings = settings_on_free_ports(dir.path(), config);
    settings.server.listen = node_addr;
    settings.server.shutdown_grace_ms = 500;
    settings.events.sinks = vec![SinkKind::Null];
    serve_as(settings, dir, role).await
}

fn standby_for(active: &common::TestApp, edge_id: &str) -> Role {
    Role::Standby {
        active: Some(ActiveMember {
            edge_id: edge_id.into(),
            node_address: active.node_addr.to_string(),
            api_address: active.http_addr.to_string(),
        }),
        reason: format!("{edge_id} holds the lease"),
    }
}

/// Copies the journal files (`journal.sqlite3` and its write-ahead log) from `from` to `to`.
fn copy_journal(from: &Path, to: &Path) {
    for name in ["journal.sqlite3", "journal.sqlite3-wal"] {
        if from.join(name).exists() {
            std::fs::copy(from.join(name), to.join(name)).expect("copy the journal");
        }
    }
}

/// The run's stored events on `edge`, as JSON lines.
async fn stored_events(edge: &common::TestApp, run_id: &str) -> Vec<Value> {
    let path = format!("/admin/v1/runs/{run_id}/events?format=jsonl&follow=false");
    text(edge.admin_addr, &path)
        .await
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect()
}

#[crate::common::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_finds_the_active_member_and_follows_a_flip_with_its_open_run() {
    let gate = Arc::new(Semaphore::new(0));
    let engine = engine_with_deltas_behind(DELTAS, &gate).await;
    let config = format!(
        "{}\n[runs]\nresume_grace_ms = 30000\n",
        edge_config(&engine.base_url(), &["qwen"], 500)
    );
    let b_addr = free_address();
    let a_dir = tempfile::tempdir().expect("tempdir");
    let a_journal = a_dir.path().to_owned();
    let a = member(&config, free_address(), Role::Active { epoch: 1 }, a_dir).await;
    let b = member(
        &config,
        b_addr,
        standby_for(&a, "edge-a"),
        tempfile::tempdir().expect("tempdir"),
    )
    .await;

    // Given the standby first, the node is refused there, told of the active member, and
    // registers on it.
    let node = spawn_node(b_addr, "token-1", |options| {
        options.edge = format!("{b_addr},{}", a.node_addr);
    });
    a.wait_for_nodes(1).await;
    assert_eq!(b.parts.registry.len(), 0);
    let b_stats = b.parts.transport.stats();
    assert!(b_stats.rejected(RegisterRejection::ShuttingDown) >= 1);

    // A streamed run on the active member, part-way through its answer.
    gate.add_permits(BEFORE_THE_FLIP);
    let body = json!({
        "model": "llama/qwen",
        "stream": true,
        "messages": [{"role": "user", "content": "tell me a long story"}],
    });
    let (response, run_id) = open_stream_at(a.http_addr, "/v1/chat/completions", &body).await;
    tokio::spawn(async move {
        let mut response = response;
        while let Ok(Some(_)) = response.chunk().await {}
    });
    eventually_ok("the active member has relayed the first deltas", || async {
        let n = stored_events(&a, &run_id)
            .await
            .iter()
            .filter(|e| e["kind"] == "output")
            .count();
        if n >= BEFORE_THE_FLIP { Ok(()) } else { Err(n) }
    })
    .await;

    // The roles flip: A stands by (its node is sent away at once) and B takes over. The
    // replicated journal B would have folded is issue 49's other part; here B is started
    // again on a copy of A's journal, which is what that stream hands it.
    let standby_a = standby_for(&b, "edge-b");
    a.parts.site.set(standby_a);
    a.wait_until_left("node-1").await;
    b.stop().await;
    a.parts.journal.close().await;
    let b_dir = tempfile::tempdir().expect("tempdir");
    copy_journal(&a_journal, b_dir.path());
    gate.add_permits(DELTAS - BEFORE_THE_FLIP + 2);
    let b = member(&config, b_addr, Role::Active { epoch: 2 }, b_dir).await;

    // The node follows: A refuses it naming B, it registers on B and its run resumes there.
    b.wait_for_nodes(1).await;
    assert_eq!(a.parts.registry.len(), 0);
    let record = completed_record(
        b.admin_addr,
        &run_id,
        "the run completes on the new active member",
    )
    .await;
    let stored = stored_events(&b, &run_id).await;
    assert_every_delta_once(&record, &stored, DELTAS);
    assert_eq!(chats(&engine), 1, "taken back, not run again");
    let a_stats = a.parts.transport.stats();
    eventually(
        "the old active member refused the node, naming the new one",
        || a_stats.rejected(RegisterRejection::ShuttingDown) >= 1,
    )
    .await;
    bounded("the node to stop", node.stop())
        .await
        .expect("clean stop");
}
