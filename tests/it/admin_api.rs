//! The management API over real HTTP, with nodes over real TCP: nodes listed and
//! inspected, drain and resume, runs listed, inspected and cancelled, admin keys enforced.

use crate::admin_support;
use crate::common;

use admin_support::{
    ADMIN_KEY, API_KEY, HandNode, admin, admin_as, admin_until, echo_run, get_ok, nodes_config,
    run_until,
};
use common::runs::{rest, start};
use common::{TestApp, spawn_app};
use edge::domain::RunEventKind;
use edge::ports::NodeCommand;
use reqwest::{Method, StatusCode};
use serde_json::{Value, json};

async fn app() -> TestApp {
    spawn_app(&nodes_config("")).await
}

fn node<'a>(list: &'a Value, id: &str) -> &'a Value {
    list["nodes"]
        .as_array()
        .and_then(|nodes| nodes.iter().find(|n| n["id"] == id))
        .unwrap_or_else(|| panic!("no node {id} in {list}"))
}

#[crate::common::test]
async fn nodes_are_listed_with_their_state_and_found_by_id_or_alias() {
    let app = app().await;
    let mut hand_a = HandNode::register(&app, "token-a").await;
    app.wait_for_nodes(1).await;
    let list = get_ok(&app, "/admin/v1/nodes").await;
    let target = &node(&list, "node-a")["adapters"][0]["targets"][0];
    assert_eq!(
        target["available"],
        Value::Null,
        "nothing reported yet: {target}"
    );
    hand_a.report_available(&[]).await;
    let unavailable = "node-a reports echo/default unavailable";
    let list = admin_until(&app, "/admin/v1/nodes", unavailable, |list| {
        node(list, "node-a")["adapters"][0]["targets"][0]["available"] == false
    })
    .await;
    hand_a.report_available(&[("echo", "default")]).await;
    admin_until(
        &app,
        "/admin/v1/nodes",
        "echo/default available again",
        |list| node(list, "node-a")["adapters"][0]["targets"][0]["available"] == true,
    )
    .await;

    let a = node(&list, "node-a");
    assert_eq!(a["state"], "serving");
    assert_eq!(a["alias"], "gpu-a");
    assert!(
        a["peer"]
            .as_str()
            .is_some_and(|p| p.starts_with("127.0.0.1:")),
        "{a}"
    );
    assert!(
        a["connected_since_ms"].as_u64().is_some() && a["last_heartbeat_ms"].as_u64().is_some()
    );
    assert_eq!(a["limits"]["max_concurrent_runs"], 2);
    assert_eq!(a["adapters"][0]["name"], "echo");
    assert_eq!(a["adapters"][0]["targets"][0]["name"], "default");
    assert_eq!(node(&list, "node-b")["state"], "disconnected");

    let by_alias = get_ok(&app, "/admin/v1/nodes/gpu-a").await;
    assert_eq!(by_alias["id"], "node-a");
    let (status, body) = admin(&app, Method::GET, "/admin/v1/nodes/nobody", None).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert_eq!(body["error"]["code"], "not_found");
    app.stop().await;
}

#[crate::common::test]
async fn admin_keys_open_the_management_api_and_api_keys_do_not_and_vice_versa() {
    let app = app().await;
    for key in [None, Some(API_KEY), Some("adm-wrong")] {
        let (status, body) = admin_as(&app, key, Method::GET, "/admin/v1/nodes", None).await;
        assert_eq!(status, StatusCode::UNAUTHORIZED, "{key:?}: {body}");
        assert_eq!(body["error"]["code"], "unauthorized");
    }
    let (status, _) = admin_as(&app, Some(ADMIN_KEY), Method::GET, "/admin/v1/runs", None).await;
    assert_eq!(status, StatusCode::OK);
    // The admin key does not open the model API.
    let models = admin_support::client()
        .get(format!("http://{}/v1/models", app.http_addr))
        .bearer_auth(ADMIN_KEY)
        .send()
        .await
        .expect("an answer");
    assert_eq!(models.status(), StatusCode::UNAUTHORIZED);
    // The management API is not on the HTTP listener unless configured so.
    let elsewhere = admin_support::client()
        .get(format!("http://{}/admin/v1/nodes", app.http_addr))
        .bearer_auth(ADMIN_KEY)
        .send()
        .await
        .expect("an answer");
    assert_eq!(elsewhere.status(), StatusCode::NOT_FOUND);
    app.stop().await;
}

#[crate::common::test]
async fn the_management_api_can_share_the_http_listener() {
    let config = nodes_config("").replace("[admin]\n", "[admin]\non_http_listener = true\n");
    let app = spawn_app(&config).await;
    assert_eq!(app.admin_addr, app.http_addr);
    let list = get_ok(&app, "/admin/v1/nodes").await;
    assert_eq!(list["nodes"].as_array().map(Vec::len), Some(2));
    let (status, _) = admin_as(&app, Some(API_KEY), Method::GET, "/admin/v1/nodes", None).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    app.stop().await;
}

#[crate::common::test]
async fn runs_are_listed_inspected_and_cancelled_through_the_api() {
    let app = app().await;
    let mut a = HandNode::register(&app, "token-a").await;
    app.wait_for_nodes(1).await;
    let mut done = start(&app, echo_run("one"));
    let run = a.next_run().await;
    a.complete(&run.run_id, "one").await;
    rest(&mut done).await;
    let mut open = start(&app, echo_run("two"));
    let second = a.next_run().await;
    a.send(&second.run_id, RunEventKind::Started).await;

    let finished = run_until(&app, &run.run_id, "is completed", |r| {
        r["outcome"] == "completed"
    })
    .await;
    assert_eq!(finished["node"], "node-a");
    assert_eq!(finished["route_reason"], "least_busy");
    assert_eq!(finished["attempts"].as_array().map(Vec::len), Some(1));
    assert_eq!(finished["usage"]["input_tokens"], 3);
    assert_eq!(finished["events"], 3);
    for field in [
        "queued_at_ms",
        "started_at_ms",
        "first_output_at_ms",
        "finished_at_ms",
    ] {
        assert!(finished[field].as_u64().is_some(), "{field}: {finished}");
    }

    let listed = get_ok(&app, "/admin/v1/runs").await;
    let ids: Vec<&str> = listed["runs"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|r| r["id"].as_str())
        .collect();
    assert_eq!(
        ids,
        [second.run_id.as_str(), run.run_id.as_str()],
        "newest first"
    );
    let open_only = get_ok(&app, "/admin/v1/runs?state=open").await;
    assert_eq!(open_only["runs"][0]["outcome"], "open");
    assert_eq!(open_only["runs"].as_array().map(Vec::len), Some(1));
    let page = get_ok(&app, "/admin/v1/runs?limit=1").await;
    let cursor = page["next_cursor"]
        .as_str()
        .expect("a next page")
        .to_owned();
    let next = get_ok(&app, &format!("/admin/v1/runs?limit=1&cursor={cursor}")).await;
    assert_eq!(next["runs"][0]["id"], run.run_id.as_str());
    let (status, body) = admin(&app, Method::GET, "/admin/v1/runs?outcome=bogus", None).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");

    let path = format!("/admin/v1/runs/{}", second.run_id);
    let (status, body) = admin(&app, Method::DELETE, &path, None).await;
    assert_eq!(status, StatusCode::ACCEPTED, "{body}");
    match a.next_command().await {
        NodeCommand::Cancel { run_id, .. } => assert_eq!(run_id, second.run_id),
        other => panic!("expected a cancel, got {other:?}"),
    }
    a.send(&second.run_id, RunEventKind::cancelled("asked"))
        .await;
    rest(&mut open).await;
    run_until(&app, &second.run_id, "is cancelled", |r| {
        r["outcome"] == "cancelled"
    })
    .await;
    let (status, body) = admin(&app, Method::DELETE, &path, None).await;
    assert_eq!(status, StatusCode::CONFLICT, "{body}");
    let (status, _) = admin(&app, Method::DELETE, "/admin/v1/runs/run-nope", None).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    app.stop().await;
}

#[crate::common::test]
async fn a_drained_node_gets_no_new_run_finishes_its_own_and_is_used_again_once_resumed() {
    let app = app().await;
    let mut a = HandNode::register(&app, "token-a").await;
    app.wait_for_nodes(1).await;
    let mut first = start(&app, echo_run("first"));
    let running = a.next_run().await;

    let drained = admin(&app, Method::POST, "/admin/v1/nodes/gpu-a/drain", None).await;
    assert_eq!(drained.0, StatusCode::OK, "{}", drained.1);
    assert_eq!(drained.1["state"], "draining");
    // No other node serves echo/default now: a new run waits rather than go to node-a,
    // and goes to node-b once it connects.
    let mut elsewhere = start(&app, echo_run("to b"));
    assert_eq!(app.parts.runs.waiting_by_cause(), [0, 1]);
    let mut b = HandNode::register(&app, "token-b").await;
    let on_b = b.next_run().await;

    // The running one finishes on node-a; node-a is then drained, still registered.
    a.complete(&running.run_id, "first").await;
    let events = rest(&mut first).await;
    assert!(matches!(
        events.last().map(|e| &e.kind),
        Some(RunEventKind::Completed { .. })
    ));
    let node_a = get_ok(&app, "/admin/v1/nodes/node-a").await;
    assert_eq!(node_a["state"], "drained");
    assert!(node_a["drain"]["since_ms"].as_u64().is_some());
    assert!(app.parts.registry.get("node-a").is_some());

    let resumed = admin(&app, Method::POST, "/admin/v1/nodes/node-a/resume", None).await;
    assert_eq!(resumed.1["state"], "serving", "{}", resumed.1);
    // node-b holds a run, node-a none: the least busy, node-a, takes the next.
    let mut again = start(&app, echo_run("again"));
    let back_on_a = a.next_run().await;
    a.complete(&back_on_a.run_id, "again").await;
    b.complete(&on_b.run_id, "to b").await;
    rest(&mut again).await;
    rest(&mut elsewhere).await;
    app.stop().await;
}

#[crate::common::test]
async fn a_drain_deadline_moves_the_runs_left_on_the_node_to_another() {
    let app = app().await;
    let mut a = HandNode::register(&app, "token-a").await;
    app.wait_for_nodes(1).await;
    let mut handle = start(&app, echo_run("long"));
    let run = a.next_run().await;
    let body = json!({"deadline_seconds": 0});
    let (status, node) = admin(
        &app,
        Method::POST,
        "/admin/v1/nodes/node-a/drain",
        Some(body),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{node}");
    assert!(node["drain"]["deadline_ms"].as_u64().is_some());
    match a.next_command().await {
        NodeCommand::Cancel { run_id, reason } => {
            assert_eq!(run_id, run.run_id);
            assert!(reason.contains("drain"), "{reason}");
        }
        other => panic!("expected a cancel, got {other:?}"),
    }
    // Its answer to the cancel comes from an attempt that has ended: dropped.
    a.send(&run.run_id, RunEventKind::cancelled("drain")).await;
    // Nothing of the run reached its caller: it waits for another node, as a lost
    // attempt's run does, and node-b finishes it.
    let mut b = HandNode::register(&app, "token-b").await;
    let moved = b.next_run().await;
    assert_eq!(moved.run_id, run.run_id);
    assert_eq!(moved.continuation, None);
    b.complete(&moved.run_id, "on b").await;
    let events = rest(&mut handle).await;
    let kinds: Vec<&str> = events.iter().map(|e| e.kind.name()).collect();
    assert_eq!(
        kinds,
        ["started", "output", "completed"],
        "only node-b's answer"
    );
    let (status, body) = admin(
        &app,
        Method::POST,
        "/admin/v1/nodes/node-a/drain",
        Some(json!({"deadline": 1})),
    )
    .await;
    assert_eq!(
        status,
        StatusCode::BAD_REQUEST,
        "unknown fields are refused: {body}"
    );
    app.stop().await;
}

#[crate::common::test]
async fn stats_count_runs_tokens_errors_and_the_queue_per_bucket_and_node() {
    let app = app().await;
    let mut a = HandNode::register(&app, "token-a").await;
    app.wait_for_nodes(1).await;
    // node-a has two slots and node-b is away: the third run waits in the queue.
    let mut one = start(&app, echo_run("one"));
    let first = a.next_run().await;
    let mut two = start(&app, echo_run("two"));
    let second = a.next_run().await;
    let mut three = start(&app, echo_run("three"));
    a.complete(&first.run_id, "one").await;
    rest(&mut one).await;
    let third = a.next_run().await;
    a.send(
        &second.run_id,
        RunEventKind::failed("engine_error", "out of memory"),
    )
    .await;
    rest(&mut two).await;
    a.complete(&third.run_id, "three").await;
    rest(&mut three).await;

    let stats = get_ok(&app, "/admin/v1/stats").await;
    assert_eq!(stats["bucket_ms"], 10_000);
    let sum = |points: &Value, field: &str| -> u64 {
        points
            .as_array()
            .expect("points")
            .iter()
            .map(|p| p[field].as_u64().unwrap_or_default())
            .sum()
    };
    let edge = &stats["edge"];
    let counts = [
        "started",
        "completed",
        "failed",
        "cancelled",
        "output_tokens",
    ]
    .map(|field| sum(edge, field));
    assert_eq!(counts, [3, 2, 1, 0, 4], "{stats}");
    let peak = edge
        .as_array()
        .expect("points")
        .iter()
        .map(|p| &p["queue_peak"]);
    assert!(peak.clone().any(|p| p == 1), "{stats}");
    assert!(
        edge.as_array()
            .expect("points")
            .iter()
            .any(|p| p["ttft_p50_ms"].is_u64())
    );
    assert_eq!(stats["nodes"].as_array().map(Vec::len), Some(1), "{stats}");
    assert_eq!(stats["nodes"][0]["node"], "node-a");
    assert_eq!(sum(&stats["nodes"][0]["points"], "started"), 3);
    assert_eq!(sum(&stats["nodes"][0]["points"], "queue_peak"), 0);
    app.stop().await;
}
