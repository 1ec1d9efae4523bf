//! The model routes of the management API (`/admin/v1/models`, `/load`, `/unload`,
//! `/events`) and `edge models`, against an edge whose nodes' engines it does not manage:
//! the models they serve are listed loaded and unmanaged; loads and unloads there are
//! refused as not managed, unknown nodes and bad bodies named; the feed answers with its
//! empty history. (Loads and unloads carried out on managed engines belong with the
//! lifecycle's end-to-end tests.)

use crate::admin_support::{
    ADMIN_KEY, API_KEY, HandNode, admin, admin_as, admin_until, client, edge_command, get_ok,
    nodes_config,
};
use crate::common::{TestApp, spawn_app};

use reqwest::header::{ACCEPT, CONTENT_TYPE};
use reqwest::{Method, StatusCode};
use serde_json::{Value, json};

const LOAD: &str = "/admin/v1/models/load";
const UNLOAD: &str = "/admin/v1/models/unload";
const EVENTS: &str = "/admin/v1/models/events";

/// `POST path` with `body` as it is (not necessarily JSON).
async fn post_raw(app: &TestApp, path: &str, body: &'static str) -> (StatusCode, Value) {
    let response = client()
        .post(format!("http://{}{path}", app.admin_addr))
        .bearer_auth(ADMIN_KEY)
        .header(CONTENT_TYPE, "application/json")
        .body(body)
        .send()
        .await
        .expect("the management API answers");
    let status = response.status();
    (status, response.json().await.unwrap_or(Value::Null))
}

/// Asserts `answer` is `status` with error `code`; returns its message.
fn refused(answer: &(StatusCode, Value), status: StatusCode, code: &str) -> String {
    let (got, body) = answer;
    assert_eq!(
        (*got, body["error"]["code"].as_str()),
        (status, Some(code)),
        "{body}"
    );
    body["error"]["message"]
        .as_str()
        .unwrap_or_default()
        .to_owned()
}

/// `node`'s entry in `model`'s view of `list`.
fn on_node<'a>(list: &'a Value, model: &str, node: &str) -> Option<&'a Value> {
    list["models"]
        .as_array()?
        .iter()
        .find(|m| m["model"] == model)?["nodes"]
        .as_array()?
        .iter()
        .find(|n| n["node"] == node)
}

#[crate::common::test]
async fn the_models_a_node_serves_are_listed_loaded_and_unmanaged_by_the_api_and_the_cli() {
    let app = spawn_app(&nodes_config("")).await;
    // No node connected: no model.
    assert_eq!(
        get_ok(&app, "/admin/v1/models").await,
        json!({"models": []})
    );

    let mut node = HandNode::register(&app, "token-a").await;
    app.wait_for_nodes(1).await;
    node.report_available(&[("echo", "default")]).await;
    let list = admin_until(
        &app,
        "/admin/v1/models",
        "node-a's model is listed",
        |list| on_node(list, "echo/default", "node-a").is_some(),
    )
    .await;
    let models = list["models"].as_array().expect("models");
    assert_eq!(models.len(), 1, "{list}");
    assert_eq!(models[0]["policy"], Value::Null, "{list}");
    let on = on_node(&list, "echo/default", "node-a").expect("node-a");
    assert_eq!(on["state"], "loaded", "{on}");
    assert_eq!(on["managed"], false, "{on}");
    assert_eq!(on["in_flight"], 0, "{on}");
    assert_eq!(on["last_used_ms"], Value::Null, "{on}");
    assert_eq!((&on["reason"], &on["command"]), (&json!(""), &Value::Null));
    assert!(on["since_ms"].as_u64().is_some_and(|t| t > 0), "{on}");
    // node-b is configured but not connected: it is not where the model is.
    assert!(on_node(&list, "echo/default", "node-b").is_none(), "{list}");

    // The table of `edge models`, and its JSON.
    let (ok, out, err) = edge_command(&app, Some(ADMIN_KEY), &["models"]).await;
    assert!(ok, "{err}");
    let mut lines = out.lines();
    let header: Vec<&str> = lines
        .next()
        .unwrap_or_default()
        .split_whitespace()
        .collect();
    assert_eq!(
        header,
        [
            "MODEL",
            "NODE",
            "STATE",
            "FOOTPRINT",
            "ROOM",
            "MANAGED",
            "IN_FLIGHT",
            "LAST_USE",
            "REASON",
            "COMMAND"
        ]
    );
    let row: Vec<&str> = lines
        .next()
        .unwrap_or_default()
        .split_whitespace()
        .collect();
    assert_eq!(
        (row.len(), &row[..7], &row[8..]),
        (
            10,
            &["echo/default", "node-a", "loaded", "-", "-", "no", "0"][..],
            &["-", "-"][..]
        ),
        "{out}"
    );
    let (ok, out, err) = edge_command(&app, Some(ADMIN_KEY), &["models", "--json"]).await;
    assert!(ok, "{err}");
    let printed: Value = serde_json::from_str(&out).expect("the API's JSON");
    assert_eq!(printed["models"][0]["model"], "echo/default", "{out}");
    app.stop().await;
}

#[crate::common::test]
async fn loads_and_unloads_on_an_unmanaged_engine_are_refused_and_mistakes_named() {
    let app = spawn_app(&nodes_config("")).await;
    let _node = HandNode::register(&app, "token-a").await;
    app.wait_for_nodes(1).await;
    let load = |node: &str| json!({"model": "echo/default", "node": node});

    // The node's engine is not managed by the edge: 409, by id or alias, either way.
    let message = refused(
        &admin(&app, Method::POST, LOAD, Some(load("gpu-a"))).await,
        StatusCode::CONFLICT,
        "not_managed",
    );
    assert!(
        message.contains("node-a") && message.contains("echo/default"),
        "{message}"
    );
    let unload = json!({"model": "echo/default", "node": "node-a", "drain_deadline_seconds": 5});
    refused(
        &admin(&app, Method::POST, UNLOAD, Some(unload)).await,
        StatusCode::CONFLICT,
        "not_managed",
    );

    // No such node, or not connected: 404.
    for node in ["gpu-z", "node-b"] {
        let message = refused(
            &admin(&app, Method::POST, LOAD, Some(load(node))).await,
            StatusCode::NOT_FOUND,
            "not_found",
        );
        assert!(message.contains(node), "{message}");
        let body = json!({"model": "echo/default", "node": node});
        refused(
            &admin(&app, Method::POST, UNLOAD, Some(body)).await,
            StatusCode::NOT_FOUND,
            "not_found",
        );
    }

    // Bodies that are not requests, and a model that is not `adapter/target`: 400.
    for path in [LOAD, UNLOAD] {
        for body in [
            "",
            "not json",
            r#"{"model": "echo/default"}"#,
            r#"{"model": "echo/default", "node": "node-a", "force": true}"#,
            r#"{"model": "echo", "node": "node-a"}"#,
            r#"{"model": "echo/de fault", "node": "node-a"}"#,
        ] {
            refused(
                &post_raw(&app, path, body).await,
                StatusCode::BAD_REQUEST,
                "bad_request",
            );
        }
    }
    let message = refused(
        &post_raw(&app, LOAD, r#"{"model": "echo", "node": "node-a"}"#).await,
        StatusCode::BAD_REQUEST,
        "bad_request",
    );
    assert!(message.contains("adapter/target"), "{message}");
    let negative = r#"{"model": "echo/default", "node": "node-a", "drain_deadline_seconds": -1}"#;
    refused(
        &post_raw(&app, UNLOAD, negative).await,
        StatusCode::BAD_REQUEST,
        "bad_request",
    );

    // Every model route needs an admin key; an API key is not one.
    for (method, path) in [
        (Method::GET, "/admin/v1/models"),
        (Method::POST, LOAD),
        (Method::POST, UNLOAD),
        (Method::GET, EVENTS),
    ] {
        for key in [None, Some(API_KEY)] {
            let answer = admin_as(&app, key, method.clone(), path, Some(load("node-a"))).await;
            refused(&answer, StatusCode::UNAUTHORIZED, "unauthorized");
        }
    }

    // The same through `edge models load` and `unload`: the API's refusal, exit 1.
    let (ok, _, err) = edge_command(
        &app,
        Some(ADMIN_KEY),
        &["models", "load", "echo/default", "--node", "gpu-a"],
    )
    .await;
    assert!(!ok && err.contains("409 (not_managed)"), "{err}");
    let args = [
        "models",
        "unload",
        "echo/default",
        "--node",
        "gpu-a",
        "--drain-deadline",
        "10m",
    ];
    let (ok, _, err) = edge_command(&app, Some(ADMIN_KEY), &args).await;
    assert!(!ok && err.contains("409 (not_managed)"), "{err}");
    let args = [
        "models",
        "unload",
        "echo/default",
        "--node",
        "gpu-a",
        "--drain-deadline",
        "soon",
    ];
    let (ok, _, err) = edge_command(&app, Some(ADMIN_KEY), &args).await;
    assert!(!ok && err.contains("--drain-deadline \"soon\""), "{err}");
    let (ok, _, err) = edge_command(
        &app,
        Some(ADMIN_KEY),
        &["models", "load", "echo/default", "--node", "gpu-z"],
    )
    .await;
    assert!(!ok && err.contains("404 (not_found)"), "{err}");
    let (ok, _, err) = edge_command(&app, None, &["models"]).await;
    assert!(!ok && err.contains("401"), "{err}");
    app.stop().await;
}

#[crate::common::test]
async fn the_feed_of_loads_and_unloads_answers_its_history_as_json_lines_or_sse() {
    let app = spawn_app(&nodes_config("")).await;
    let get = |query: &str, accept: Option<&str>| {
        let mut request = client()
            .get(format!("http://{}{EVENTS}{query}", app.admin_addr))
            .bearer_auth(ADMIN_KEY);
        if let Some(accept) = accept {
            request = request.header(ACCEPT, accept);
        }
        request.send()
    };
    let content_type = |response: &reqwest::Response| {
        response.headers()[CONTENT_TYPE]
            .to_str()
            .unwrap_or_default()
            .to_owned()
    };

    // Nothing was loaded or unloaded: an empty history, in either form.
    let lines = get("", None).await.expect("an answer");
    assert_eq!(lines.status(), StatusCode::OK);
    assert_eq!(content_type(&lines), "application/jsonl");
    assert_eq!(lines.text().await.expect("a body"), "");
    for (query, accept) in [
        ("?format=sse", None),
        ("?follow=false", Some("text/event-stream")),
    ] {
        let sse = get(query, accept).await.expect("an answer");
        assert_eq!(content_type(&sse), "text/event-stream", "{query}");
        assert_eq!(sse.text().await.expect("a body"), "", "{query}");
    }
    let (status, body) = admin(&app, Method::GET, &format!("{EVENTS}?format=xml"), None).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    let (status, body) = admin(&app, Method::GET, &format!("{EVENTS}?follow=maybe"), None).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");

    // Followed, the answer opens and stays open for what comes next.
    let followed = get("?follow=true", None).await.expect("an answer");
    assert_eq!(followed.status(), StatusCode::OK);
    assert_eq!(content_type(&followed), "application/jsonl");
    drop(followed);

    let (ok, out, err) = edge_command(&app, Some(ADMIN_KEY), &["models", "events"]).await;
    assert!(ok, "{err}");
    assert!(out.starts_with("AGE") && out.lines().count() == 1, "{out}");
    let (ok, out, err) = edge_command(&app, Some(ADMIN_KEY), &["models", "events", "--json"]).await;
    assert!(ok && out.is_empty(), "{out}{err}");
    app.stop().await;
}
