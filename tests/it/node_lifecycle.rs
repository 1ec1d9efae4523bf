//! The reference node's side of the model lifecycle (issue 48), between a fake edge that
//! records every frame and a real `llama-server` in router mode: the node registers as one
//! that manages models, reports its managed adapter's catalogue (capacity and every target's
//! load state), carries out load and unload commands through the router, and answers each
//! with one outcome, after the availability report that shows its effect. What the node
//! says is checked against the router's own `GET /models` and `GET /props?model=`.

use crate::common;
use crate::node_support;

use std::sync::Arc;

use bytes::Bytes;
use common::PATIENCE;
use common::engines::{LlamaOptions, LlamaServer, TINY_REPLY};
use edge::domain::models::{LoadState, ManagedAdapter, ModelAction, ModelName};
use edge::domain::{AdapterName, Availability, NodeRecord, Operation, RunEventKind, RunId, Target};
use edge::ports::{ModelCommand, ModelOutcome, RunAssignment};
use node_support::fake_edge::{EdgeConn, FakeEdge, Heard, adapter_config, record_of};
use node_support::{RunningNode, spawn_node};
use serde_json::json;

/// The managed adapter's targets: three copies of the tiny model and a garbage file.
const TARGETS: &[&str] = &["alpha", "beta", "gamma", "broken"];

/// A router with `alpha`, `beta` and `gamma` (the tiny model) and `broken` (no model), at
/// most two loaded at once, none loaded at start.
async fn router() -> LlamaServer {
    let options = LlamaOptions::default()
        .router(&["alpha", "beta", "gamma"], 2)
        .broken_model("broken");
    LlamaServer::start_with(options).await
}

/// The node's definition: `llama`, managed through the router, and `plain`, the same
/// engine without a lifecycle, serving `omega` (which the router does not list).
fn definition(llama: &LlamaServer) -> Arc<NodeRecord> {
    let managed = [
        ("base_url", llama.v1_url()),
        ("lifecycle", "llama-router".to_owned()),
        ("load_timeout_ms", "60000".to_owned()),
    ];
    let plain = [("base_url", llama.v1_url())];
    record_of(
        vec![
            adapter_config("llama", TARGETS, &managed),
            adapter_config("plain", &["omega"], &plain),
        ],
        4,
        1_000,
    )
}

/// A node registered with a fake edge in front of `llama`.
async fn connected(llama: &LlamaServer) -> (FakeEdge, EdgeConn, RunningNode) {
    let edge = FakeEdge::bind().await;
    let node = spawn_node(edge.addr, "token-1", |_| {});
    let mut conn = edge.accept().await;
    let registration = conn.registration().await;
    assert!(
        registration.can_manage_models,
        "the node registers as one that manages models"
    );
    conn.accept(&definition(llama), Vec::new()).await;
    (edge, conn, node)
}

fn llama() -> AdapterName {
    AdapterName::parse("llama").expect("adapter")
}

fn target(name: &str) -> Target {
    Target::parse(name).expect("target")
}

/// The first availability report that carries the `llama` adapter's catalogue.
async fn catalogue(conn: &mut EdgeConn) -> (Availability, ManagedAdapter) {
    let wait = async {
        loop {
            let report = conn.report().await;
            if let Some(managed) = report.managed(&llama()).cloned() {
                return (report, managed);
            }
        }
    };
    tokio::time::timeout(PATIENCE, wait)
        .await
        .expect("the node reports the managed adapter's catalogue in time")
}

fn state(managed: &ManagedAdapter, name: &str) -> Option<LoadState> {
    managed.targets.get(&target(name)).map(|load| load.state)
}

fn command(id: &str, model: &str, action: ModelAction) -> ModelCommand {
    ModelCommand {
        command_id: id.to_owned(),
        model: ModelName::parse(model).expect("model"),
        action,
        reason: "the test says so".to_owned(),
    }
}

/// Sends `command` and reads until its outcome; returns the availability reports that came
/// before it, in order, and the outcome.
async fn carried_out(
    conn: &mut EdgeConn,
    command: ModelCommand,
) -> (Vec<Availability>, ModelOutcome) {
    let id = command.command_id.clone();
    conn.model_command(command).await;
    let mut reports = Vec::new();
    let wait = async {
        loop {
            match conn.next().await {
                Heard::Beat(beat) => reports.extend(beat.report),
                Heard::ModelOutcome(outcome) => return outcome,
                other => panic!("expected heartbeats and an outcome, got {other:?}"),
            }
        }
    };
    let outcome = tokio::time::timeout(PATIENCE * 4, wait)
        .await
        .expect("the node answers the model command in time");
    assert_eq!(outcome.command_id, id, "the outcome echoes its command");
    (reports, outcome)
}

fn chat_run(run_id: &str, target_name: &str) -> RunAssignment {
    RunAssignment {
        run_id: RunId::new(run_id),
        adapter: llama(),
        target: target(target_name),
        input: Bytes::from(json!({"messages": [{"role": "user", "content": "hi"}]}).to_string()),
        content_type: "application/json".into(),
        params: Default::default(),
        deadline_ms: 0,
        operation: Operation::Chat,
        continuation: None,
        lora: None,
    }
}

#[crate::common::test]
async fn a_managed_adapter_reports_its_catalogue_then_loads_serves_and_unloads_on_command() {
    let llama_server = router().await;
    let (_edge, mut conn, node) = connected(&llama_server).await;

    // At first: nothing loaded, so nothing served; every target unloaded, capacity 2.
    let (first, managed) = catalogue(&mut conn).await;
    assert!(first.pairs().is_empty(), "{:?}", first.pairs());
    assert_eq!(managed.capacity, 2);
    for name in TARGETS {
        assert_eq!(state(&managed, name), Some(LoadState::Unloaded), "{name}");
    }

    // Load: the report that shows alpha loaded and served comes before the ok.
    let (reports, outcome) = carried_out(
        &mut conn,
        command("load-alpha", "llama/alpha", ModelAction::Load),
    )
    .await;
    assert!(outcome.ok, "{outcome:?}");
    assert_eq!(outcome.state, Some(LoadState::Loaded));
    let last = reports.last().expect("a report before the outcome");
    assert!(
        last.serves(&llama(), &target("alpha")),
        "{:?}",
        last.pairs()
    );
    let after = last.managed(&llama()).expect("the catalogue");
    assert_eq!(state(after, "alpha"), Some(LoadState::Loaded));
    assert_eq!(state(after, "beta"), Some(LoadState::Unloaded));
    assert_eq!(
        llama_server.router_status("alpha").await.as_deref(),
        Some("loaded")
    );
    // Its context window is the one the loaded model's own props give.
    let props = llama_server.get("/props?model=alpha").await;
    let n_ctx = props["default_generation_settings"]["n_ctx"]
        .as_u64()
        .expect("n_ctx");
    assert_eq!(
        last.context_window(&llama(), &target("alpha"))
            .map(u64::from),
        Some(n_ctx)
    );

    // A run to the loaded target is answered by it.
    conn.run(chat_run("run-alpha", "alpha")).await;
    let events = conn.events_until_terminal().await;
    let text: String = events
        .iter()
        .filter_map(|event| match &event.kind {
            RunEventKind::Output { text, .. } => Some(text.as_str()),
            _ => None,
        })
        .collect();
    assert_eq!(text, TINY_REPLY);
    assert!(
        matches!(
            events.last().map(|e| &e.kind),
            Some(RunEventKind::Completed { .. })
        ),
        "{events:?}"
    );

    // A second load of it is ok at once.
    let (_, again) = carried_out(
        &mut conn,
        command("load-alpha-again", "llama/alpha", ModelAction::Load),
    )
    .await;
    assert!(
        again.ok && again.state == Some(LoadState::Loaded),
        "{again:?}"
    );

    // Unload: alpha is no longer served when the ok comes.
    let (reports, outcome) = carried_out(
        &mut conn,
        command("unload-alpha", "llama/alpha", ModelAction::Unload),
    )
    .await;
    assert!(outcome.ok, "{outcome:?}");
    assert_eq!(outcome.state, Some(LoadState::Unloaded));
    let last = reports.last().expect("a report before the outcome");
    assert!(last.pairs().is_empty(), "{:?}", last.pairs());
    let after = last.managed(&llama()).expect("the catalogue");
    assert_eq!(state(after, "alpha"), Some(LoadState::Unloaded));
    assert_eq!(
        llama_server.router_status("alpha").await.as_deref(),
        Some("unloaded")
    );
    node.stop().await.expect("clean stop");
}

#[crate::common::test]
async fn a_broken_model_fails_to_load_with_the_engines_reason_and_unmanaged_commands_are_refused() {
    let llama_server = router().await;
    let (_edge, mut conn, node) = connected(&llama_server).await;
    catalogue(&mut conn).await;

    let (reports, outcome) = carried_out(
        &mut conn,
        command("load-broken", "llama/broken", ModelAction::Load),
    )
    .await;
    assert!(!outcome.ok, "{outcome:?}");
    assert_eq!(outcome.state, Some(LoadState::Failed));
    assert!(
        outcome.message.contains("broken") && outcome.message.contains("exited with code"),
        "the router's reason: {}",
        outcome.message
    );
    let last = reports.last().expect("a report before the outcome");
    let failed = &last.managed(&llama()).expect("the catalogue").targets[&target("broken")];
    assert_eq!(failed.state, LoadState::Failed);
    assert_eq!(failed.failure, outcome.message);
    assert!(last.pairs().is_empty(), "{:?}", last.pairs());
    assert_eq!(
        llama_server.router_status("broken").await.as_deref(),
        Some("unloaded")
    );

    // An adapter without a lifecycle, and a target the managed one does not have.
    let (_, plain) = carried_out(
        &mut conn,
        command("load-plain", "plain/omega", ModelAction::Load),
    )
    .await;
    assert!(!plain.ok, "{plain:?}");
    assert!(plain.message.contains("`lifecycle`"), "{}", plain.message);
    assert_eq!(plain.state, None);
    let (_, stranger) = carried_out(
        &mut conn,
        command("load-omega", "llama/omega", ModelAction::Load),
    )
    .await;
    assert!(!stranger.ok, "{stranger:?}");
    assert_eq!(stranger.message, "omega is not a target of adapter llama");
    // None of it loaded anything.
    for name in ["alpha", "beta", "gamma"] {
        assert_eq!(
            llama_server.router_status(name).await.as_deref(),
            Some("unloaded"),
            "{name}"
        );
    }
    node.stop().await.expect("clean stop");
}
