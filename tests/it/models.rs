//! The model lifecycle end to end over real TCP (issue 48): a real edge on port 0, mock
//! nodes whose managed engines load and unload on the edge's model commands, refuse a load
//! into a full engine (so the edge must make room first) and fail runs for targets that are
//! not loaded. Each check reads the engines' own state.

use crate::common;
use crate::mock_node;

use common::runs::{echo_to, mocked, next_event, rest, start};
use common::{TestApp, eventually, spawn_app};
use edge::domain::RunEventKind;
use edge::domain::models::LoadState;
use edge::ports::ManageModels as _;
use mock_node::engine::LOAD_FAILURE;
use mock_node::{MockEngine, MockNode, MockOptions};

/// Two nodes whose `echo` adapter may serve alpha, beta and gamma, reconciled every 20 ms
/// (and `lifecycle`, more `[lifecycle]` keys), then `extra` (more sections: `[[models]]`,
/// `[runs]`).
fn config_with(lifecycle: &str, extra: &str) -> String {
    let node = |id: &str| {
        format!(
            r#"
[[nodes]]
id = "{id}"
alias = "{id}-alias"
token = "token-{id}"
[nodes.runtime]
max_concurrent_runs = 4
heartbeat_interval_ms = 1000
[[nodes.adapters]]
name = "echo"
targets = ["alpha", "beta", "gamma"]
[nodes.adapters.settings]
lifecycle = "mock"
"#
        )
    };
    format!(
        "[lifecycle]\nreconcile_interval_ms = 20\n{lifecycle}\n{extra}\n{}{}",
        node("node-a"),
        node("node-b")
    )
}

/// [`config_with`] and no more `[lifecycle]` keys.
fn config(extra: &str) -> String {
    config_with("", extra)
}

/// A mock node `id` whose engine holds `capacity` of alpha, beta and gamma.
async fn managed(app: &TestApp, id: &str, engine: MockEngine) -> MockNode {
    let options = MockOptions {
        engine: Some(engine),
        ..MockOptions::new(&format!("token-{id}"))
    };
    MockNode::start(app.node_addr, options)
        .await
        .expect("mock node registers")
}

fn engine(capacity: u32) -> MockEngine {
    MockEngine::new(capacity, &["alpha", "beta", "gamma"])
}

/// The text a run answered, or its failure.
async fn answer(app: &TestApp, target: &str) -> Result<String, (String, String)> {
    let mut handle = start(app, echo_to(target, "hello there"));
    let events = rest(&mut handle).await;
    let last = events.last().expect("a terminal event");
    match &last.kind {
        RunEventKind::Completed { .. } => Ok(events
            .iter()
            .filter_map(|e| match &e.kind {
                RunEventKind::Output { text, .. } => Some(text.clone()),
                _ => None,
            })
            .collect()),
        RunEventKind::Failed { code, message, .. } => Err((code.clone(), message.clone())),
        other => panic!("unexpected end {other:?}"),
    }
}

fn loads(node: &MockNode) -> Vec<String> {
    node.engine().expect("a managed engine").log()
}

#[crate::common::test]
async fn a_model_loaded_nowhere_is_loaded_on_exactly_one_node_and_answered() {
    let app = spawn_app(&config("")).await;
    let a = managed(&app, "node-a", engine(2)).await;
    let b = managed(&app, "node-b", engine(2)).await;
    app.wait_for_nodes(2).await;
    let models = &app.parts.models;
    eventually("alpha is listed on both nodes, loaded nowhere", || {
        models.models().iter().any(|m| {
            m.model.to_string() == "echo/alpha"
                && m.nodes.len() == 2
                && m.nodes.iter().all(|n| n.state == LoadState::Unloaded)
        })
    })
    .await;

    assert_eq!(answer(&app, "alpha").await, Ok("hello there".to_owned()));
    let holders = [&a, &b]
        .iter()
        .filter(|n| n.engine().unwrap().is_loaded("alpha"))
        .count();
    assert_eq!(holders, 1, "exactly one engine loaded alpha");
    assert_eq!(
        loads(&a).len() + loads(&b).len(),
        1,
        "one load in all: {:?} {:?}",
        loads(&a),
        loads(&b)
    );
    // Loaded now: the next request goes straight to it.
    assert_eq!(answer(&app, "alpha").await, Ok("hello there".to_owned()));
    assert_eq!(loads(&a).len() + loads(&b).len(), 1);
    let (events, _) = app.parts.models.model_events();
    assert!(
        events
            .iter()
            .any(|e| e.reason == "demand" && e.outcome == "done"),
        "{events:?}"
    );
    app.assert_settled().await;
    app.stop().await;
}

#[crate::common::test]
async fn a_load_failing_on_one_node_is_tried_on_the_other_and_failing_everywhere_fails_the_request()
{
    let app = spawn_app(&config("")).await;
    let failing = |targets: &[&str]| MockEngine {
        failing: targets.iter().map(|t| (*t).to_owned()).collect(),
        ..engine(2)
    };
    let a = managed(&app, "node-a", failing(&["alpha", "beta"])).await;
    let b = managed(&app, "node-b", failing(&["beta"])).await;
    app.wait_for_nodes(2).await;

    assert_eq!(answer(&app, "alpha").await, Ok("hello there".to_owned()));
    assert!(b.engine().unwrap().is_loaded("alpha"));

    let (code, message) = answer(&app, "beta")
        .await
        .expect_err("no engine can load beta");
    assert_eq!(code, "model_load_failed");
    assert!(message.contains(LOAD_FAILURE), "{message}");
    assert!(
        loads(&a).contains(&"load beta".to_owned()) && loads(&b).contains(&"load beta".to_owned())
    );
    app.assert_settled().await;
    app.stop().await;
}

#[crate::common::test]
async fn min_loaded_and_pins_are_kept_with_no_request_and_idle_models_unloaded() {
    let models = r#"
[[models]]
model = "echo/alpha"
min_loaded = 2
[[models]]
model = "echo/beta"
pin = ["node-a"]
[[models]]
model = "echo/gamma"
idle_unload_ms = 100
"#;
    let app = spawn_app(&config(models)).await;
    let a = managed(&app, "node-a", engine(3)).await;
    let b = managed(&app, "node-b", engine(3)).await;
    let (ea, eb) = (a.engine().unwrap(), b.engine().unwrap());
    eventually("alpha on both engines and beta on node-a", || {
        ea.is_loaded("alpha") && eb.is_loaded("alpha") && ea.is_loaded("beta")
    })
    .await;
    assert!(!eb.is_loaded("beta"));

    assert_eq!(answer(&app, "gamma").await, Ok("hello there".to_owned()));
    eventually("gamma unloaded once idle", || {
        !ea.is_loaded("gamma") && !eb.is_loaded("gamma")
    })
    .await;
    // The engine may show it unloaded before the node's outcome reaches the edge's feed.
    let models = app.parts.models.clone();
    eventually("the idle unload's outcome is in the feed", || {
        let (events, _) = models.model_events();
        events
            .iter()
            .any(|e| e.reason == "idle" && e.outcome == "done")
    })
    .await;
    let (events, _) = app.parts.models.model_events();
    for reason in ["min_loaded", "pin", "demand", "idle"] {
        assert!(
            events
                .iter()
                .any(|e| e.reason == reason && e.outcome == "done"),
            "{reason}: {events:?}"
        );
    }
    // The desired state holds: alpha and beta were never unloaded.
    assert!(
        !loads(&a)
            .iter()
            .chain(loads(&b).iter())
            .any(|l| l == "unload alpha" || l == "unload beta")
    );
    app.stop().await;
}

#[crate::common::test]
async fn a_model_with_a_run_in_flight_never_makes_room_and_the_cold_request_is_served_after() {
    let app = spawn_app(&config("")).await;
    let a = managed(&app, "node-a", engine(1)).await;
    app.wait_for_nodes(1).await;
    let mut streaming = start(&app, mocked(echo_to("alpha", "a long answer"), "stall"));
    assert_eq!(next_event(&mut streaming).await.kind.name(), "started");

    let mut cold = start(&app, echo_to("beta", "hello there"));
    let engine = a.engine().unwrap();
    // The only place is alpha's, in use: beta waits and alpha stays.
    eventually("beta is wanted", || app.parts.runs.queued_runs() == 1).await;
    tokio::task::yield_now().await;
    assert!(engine.is_loaded("alpha"));
    assert!(!loads(&a).contains(&"unload alpha".to_owned()));

    assert!(
        app.parts
            .runs
            .cancel(&streaming.run_id, "done with it")
            .await
    );
    let _ = rest(&mut streaming).await;
    let events = rest(&mut cold).await;
    assert_eq!(
        events.last().unwrap().kind.name(),
        "completed",
        "{events:?}"
    );
    assert_eq!(loads(&a), ["load alpha", "unload alpha", "load beta"]);
    app.assert_settled().await;
    app.stop().await;
}

#[crate::common::test]
async fn a_pinned_model_survives_pressure() {
    let extra = r#"
[[models]]
model = "echo/alpha"
pin = ["node-a"]
[runs]
no_node_timeout_ms = 200
"#;
    let app = spawn_app(&config_with("cold_start_timeout_ms = 300", extra)).await;
    let a = managed(&app, "node-a", engine(1)).await;
    let engine = a.engine().unwrap();
    eventually("alpha pinned on node-a", || engine.is_loaded("alpha")).await;

    let (code, _) = answer(&app, "beta").await.expect_err("no room for beta");
    assert_eq!(code, "no_node_available");
    assert!(engine.is_loaded("alpha"));
    assert_eq!(loads(&a), ["load alpha"]);
    app.assert_settled().await;
    app.stop().await;
}

#[crate::common::test]
async fn the_api_lists_a_model_loaded_nowhere_answers_it_cold_and_the_metrics_count_the_load() {
    let app = spawn_app(&config("")).await;
    let a = managed(&app, "node-a", engine(2)).await;
    app.wait_for_nodes(1).await;
    let client = common::http_client();
    let url = |path: &str| format!("http://{}{path}", app.http_addr);
    let listed: serde_json::Value = common::eventually_ok("echo/beta is listed", || async {
        let body: serde_json::Value = client.get(url("/v1/models")).send().await?.json().await?;
        let ids = body["data"].to_string();
        if ids.contains("echo/beta") {
            Ok(body)
        } else {
            Err(anyhow::anyhow!("not yet: {ids}"))
        }
    })
    .await;
    assert!(!a.engine().unwrap().is_loaded("beta"), "{listed}");

    let chat = serde_json::json!({
        "model": "echo/beta",
        "messages": [{"role": "user", "content": "cold start"}],
    });
    let answer: serde_json::Value = client
        .post(url("/v1/chat/completions"))
        .json(&chat)
        .send()
        .await
        .expect("an answer")
        .json()
        .await
        .expect("JSON");
    assert_eq!(
        answer["choices"][0]["message"]["content"], "cold start",
        "{answer}"
    );
    assert!(a.engine().unwrap().is_loaded("beta"));

    let labels = [
        ("action", "load"),
        ("model", "echo/beta"),
        ("node", "node-a"),
        ("reason", "demand"),
        ("outcome", "done"),
    ];
    let expected = [crate::metrics::want(
        "edge_model_commands_total",
        &labels,
        1.0,
    )];
    let scrape = crate::metrics::scrape_until(&client, &app, &expected).await;
    let load = [("model", "echo/beta"), ("node", "node-a")];
    assert_eq!(
        scrape.get("edge_model_load_seconds_count", &load),
        Some(1.0)
    );
    let cold = [("model", "echo/beta")];
    assert_eq!(
        scrape.get("edge_model_cold_start_wait_seconds_count", &cold),
        Some(1.0)
    );
    app.assert_settled().await;
    app.stop().await;
}

#[crate::common::test]
async fn operators_load_and_unload_through_the_management_api_and_the_cli_and_read_why() {
    use crate::admin_support::{ADMIN_KEY, admin, edge_command};
    use reqwest::{Method, StatusCode};
    use serde_json::json;

    let app = spawn_app(&config(&format!("[admin]\nkeys = [\"{ADMIN_KEY}\"]\n"))).await;
    let a = managed(&app, "node-a", engine(2)).await;
    app.wait_for_nodes(1).await;
    let engine = a.engine().unwrap();
    let models = &app.parts.models;
    eventually("node-a's catalogue is in", || models.models().len() == 3).await;

    let load = json!({"model": "echo/alpha", "node": "node-a"});
    let (status, view) = admin(&app, Method::POST, "/admin/v1/models/load", Some(load)).await;
    assert_eq!(status, StatusCode::OK, "{view}");
    assert!(engine.is_loaded("alpha"));

    // A run in flight: the unload is refused, then waits for it with a drain deadline.
    let mut held = start(&app, mocked(echo_to("alpha", "held"), "stall"));
    assert_eq!(next_event(&mut held).await.kind.name(), "started");
    let unload = json!({"model": "echo/alpha", "node": "node-a"});
    let (status, body) = admin(
        &app,
        Method::POST,
        "/admin/v1/models/unload",
        Some(unload.clone()),
    )
    .await;
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (StatusCode::CONFLICT, Some("conflict")),
        "{body}"
    );
    assert!(engine.is_loaded("alpha"));
    let draining = json!({"model": "echo/alpha", "node": "node-a", "drain_deadline_seconds": 10});
    let unloading = tokio::spawn({
        let app_admin = app.admin_addr;
        async move {
            crate::admin_support::client()
                .post(format!("http://{app_admin}/admin/v1/models/unload"))
                .bearer_auth(ADMIN_KEY)
                .json(&draining)
                .send()
                .await
                .map(|r| r.status())
        }
    });
    // While it drains, no new run of alpha is placed on node-a: a late one waits, and is
    // served once alpha is loaded again.
    let registry = &app.parts.registry;
    let (echo, alpha) = (
        edge::domain::AdapterName::parse("echo").unwrap(),
        edge::domain::Target::parse("alpha").unwrap(),
    );
    eventually("alpha withheld on node-a", || {
        registry
            .get("node-a")
            .is_some_and(|n| !n.serves_now(&echo, &alpha))
    })
    .await;
    let mut late = start(&app, echo_to("alpha", "late"));
    assert!(app.parts.runs.cancel(&held.run_id, "done").await);
    let _ = rest(&mut held).await;
    let status = common::bounded("the drained unload", unloading)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(status, StatusCode::OK);
    let events = rest(&mut late).await;
    assert_eq!(
        events.last().unwrap().kind.name(),
        "completed",
        "{events:?}"
    );
    assert_eq!(
        engine.log(),
        ["load alpha", "unload alpha", "load alpha"],
        "{:#?}",
        app.parts.models.model_events().0
    );
    let unload = json!({"model": "echo/alpha", "node": "node-a"});
    let (status, _) = admin(&app, Method::POST, "/admin/v1/models/unload", Some(unload)).await;
    assert_eq!(status, StatusCode::OK);
    assert!(!engine.is_loaded("alpha"));

    // The CLI lists by node and state, and loads.
    let (ok, _, stderr) = edge_command(
        &app,
        Some(ADMIN_KEY),
        &["models", "load", "echo/beta", "--node", "node-a"],
    )
    .await;
    assert!(ok, "{stderr}");
    let (ok, table, stderr) = edge_command(&app, Some(ADMIN_KEY), &["models"]).await;
    assert!(ok, "{stderr}");
    let beta = table
        .lines()
        .find(|l| l.contains("echo/beta"))
        .unwrap_or_default();
    assert!(
        beta.contains("node-a") && beta.contains("loaded") && beta.contains("operator"),
        "{table}"
    );

    // The feed says what was done and why.
    let (status, feed) = admin(&app, Method::GET, "/admin/v1/models/events", None).await;
    assert_eq!(status, StatusCode::OK);
    let feed = feed.as_str().expect("JSON lines");
    for line in [
        "\"action\":\"load\"",
        "\"action\":\"unload\"",
        "\"reason\":\"operator\"",
        "\"outcome\":\"done\"",
    ] {
        assert!(feed.contains(line), "{line} in {feed}");
    }
    assert_eq!(
        engine.log(),
        [
            "load alpha",
            "unload alpha",
            "load alpha",
            "unload alpha",
            "load beta"
        ]
    );
    app.assert_settled().await;
    app.stop().await;
}
