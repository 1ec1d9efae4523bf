//! The management API's OpenAPI document: it validates with a real validator
//! (`openapi-spec-validator`, pinned in tests/python/requirements.txt), every documented
//! route answers on a running edge, and every route the edge answers is documented.

use crate::admin_support;
use crate::common;

use std::collections::BTreeSet;

use admin_support::{HandNode, admin, admin_as, echo_run, nodes_config};
use common::runs::{rest, start};
use common::spawn_app;
use reqwest::{Method, StatusCode};
use serde_json::Value;

/// The management API's routes, as the edge serves them.
const ROUTES: [(&str, &str); 16] = [
    ("get", "/admin/v1/nodes"),
    ("get", "/admin/v1/nodes/{node}"),
    ("post", "/admin/v1/nodes/{node}/drain"),
    ("post", "/admin/v1/nodes/{node}/resume"),
    ("get", "/admin/v1/runs"),
    ("get", "/admin/v1/runs/{run}"),
    ("delete", "/admin/v1/runs/{run}"),
    ("get", "/admin/v1/runs/{run}/events"),
    ("get", "/admin/v1/usage"),
    ("get", "/admin/v1/stats"),
    ("get", "/admin/v1/models"),
    ("post", "/admin/v1/models/load"),
    ("post", "/admin/v1/models/unload"),
    ("get", "/admin/v1/models/events"),
    ("get", "/admin/v1/loras"),
    ("get", "/admin/v1/openapi.json"),
];

/// The management API paths the console's scripts call (`api(`/...`)`, `apiLines('/...')`
/// and the run event feed), with each `${...}` as a `{}` placeholder and the query left off.
fn console_calls() -> BTreeSet<String> {
    let dir = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/src/adapters/web_console/assets"
    );
    let mut calls = BTreeSet::new();
    for entry in std::fs::read_dir(dir).expect("the console's assets") {
        let path = entry.expect("an asset").path();
        if path.extension().is_none_or(|e| e != "js") {
            continue;
        }
        let script = std::fs::read_to_string(&path).expect("a script");
        for (at, call) in ["api(`/", "api('/", "apiLines('/"]
            .iter()
            .flat_map(|call| script.match_indices(call))
        {
            let rest = &script[at + call.len() - 1..];
            let end = rest.find(['`', '\'', '?']).expect("a closed path");
            calls.insert(placeholders(&rest[..end]));
        }
        if let Some(at) = script.find("const path = `/runs/") {
            let rest = &script[at + 14..];
            calls.insert(placeholders(&rest[..rest.find('?').expect("a query")]));
        }
    }
    calls
}

fn placeholders(path: &str) -> String {
    let mut out = String::new();
    let mut rest = path;
    while let Some(start) = rest.find("${") {
        out.push_str(&rest[..start]);
        out.push_str("{}");
        let end = rest[start..].find('}').expect("a closed ${}");
        rest = &rest[start + end + 1..];
    }
    out.push_str(rest);
    out
}

/// `template` with each `{name}` as `{}`.
fn unnamed(template: &str) -> String {
    let mut out = String::new();
    let mut inside = false;
    for c in template.chars() {
        match c {
            '{' => {
                inside = true;
                out.push_str("{}");
            }
            '}' => inside = false,
            _ if !inside => out.push(c),
            _ => {}
        }
    }
    out
}

#[crate::common::test]
fn every_route_the_console_calls_is_documented() {
    let documented: BTreeSet<String> = ROUTES
        .iter()
        .map(|(_, path)| unnamed(path.trim_start_matches("/admin/v1")))
        .collect();
    let calls = console_calls();
    assert!(calls.len() >= 6, "found the console's calls: {calls:?}");
    for call in &calls {
        assert!(
            documented.contains(call),
            "the console calls {call}, which is not documented"
        );
    }
}

fn documented(doc: &Value) -> BTreeSet<(String, String)> {
    let paths = doc["paths"].as_object().expect("paths");
    paths
        .iter()
        .flat_map(|(path, item)| {
            let methods = item.as_object().expect("a path item");
            methods
                .keys()
                .filter(|m| ["get", "post", "put", "patch", "delete"].contains(&m.as_str()))
                .map(|m| (m.clone(), path.clone()))
                .collect::<Vec<_>>()
        })
        .collect()
}

#[crate::common::test]
async fn the_openapi_document_validates_and_matches_the_routes_served() {
    let app = spawn_app(&nodes_config("")).await;
    // The document needs no key.
    let (status, doc) = admin_as(&app, None, Method::GET, "/admin/v1/openapi.json", None).await;
    assert_eq!(status, StatusCode::OK, "{doc}");
    assert!(
        doc["openapi"].as_str().is_some_and(|v| v.starts_with("3.")),
        "{doc}"
    );

    let path = app.path("openapi.json");
    std::fs::write(&path, serde_json::to_vec(&doc).expect("JSON")).expect("write the document");
    let validate = tokio::process::Command::new(common::python::python())
        .arg(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/python/validate_openapi.py"
        ))
        .arg(&path)
        .kill_on_drop(true)
        .output();
    let output = common::bounded("the OpenAPI validator (validate_openapi.py)", validate)
        .await
        .expect("run the validator");
    assert!(
        output.status.success(),
        "openapi-spec-validator refused the document:\n{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );

    let expected: BTreeSet<(String, String)> = ROUTES
        .iter()
        .map(|(m, p)| ((*m).to_owned(), (*p).to_owned()))
        .collect();
    assert_eq!(
        documented(&doc),
        expected,
        "the document lists exactly the served routes"
    );
    assert!(doc["components"]["securitySchemes"]["admin_key"].is_object());

    // Every documented route answers (a handler, not the fallback), with real ids.
    let mut node = HandNode::register(&app, "token-a").await;
    app.wait_for_nodes(1).await;
    let mut handle = start(&app, echo_run("doc"));
    let run = node.next_run().await;
    for (method, template) in ROUTES {
        let path = template
            .replace("{node}", "node-a")
            .replace("{run}", run.run_id.as_str());
        let method = Method::from_bytes(method.to_uppercase().as_bytes()).expect("a method");
        let path = if path.ends_with("/events") {
            format!("{path}?follow=false")
        } else {
            path
        };
        if path.starts_with("/admin/v1/models/") && method == Method::POST {
            // A handler answers: node-a's engine is not one the edge loads models on.
            let request = serde_json::json!({"model": "echo/default", "node": "node-a"});
            let (status, body) = admin(&app, method.clone(), &path, Some(request)).await;
            assert_eq!(status, StatusCode::CONFLICT, "{method} {path}: {body}");
            assert_eq!(
                body["error"]["code"], "not_managed",
                "{method} {path}: {body}"
            );
            continue;
        }
        let (status, body) = admin(&app, method.clone(), &path, None).await;
        assert!(status.is_success(), "{method} {path}: {status} {body}");
        if method == Method::DELETE {
            // The cancel went out; let the run end.
            node.send(&run.run_id, edge::domain::RunEventKind::cancelled("doc"))
                .await;
        }
    }
    rest(&mut handle).await;

    // A route that is not documented is not served.
    for (method, path) in [
        (Method::GET, "/admin/v1/unknown"),
        (Method::PUT, "/admin/v1/nodes/node-a"),
        (Method::GET, "/admin/v2/nodes"),
    ] {
        let (status, _) = admin(&app, method.clone(), path, None).await;
        assert!(
            status == StatusCode::NOT_FOUND || status == StatusCode::METHOD_NOT_ALLOWED,
            "{method} {path}: {status}"
        );
    }
    app.stop().await;
}
