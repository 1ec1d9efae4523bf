//! What every new route shares with the chat endpoint: a client that goes away cancels its
//! run on the node, deadlines end runs, and the body limit answers 413; each in the route's
//! own error shape.

use crate::api_support;
use crate::common;

use api_support::{Edge, json_with};
use common::eventually;
use edge::ports::NodeCommand;
use reqwest::StatusCode;
use serde_json::{Value, json};

fn messages(model: &str, stream: bool) -> Value {
    json!({"model": model, "max_tokens": 8, "stream": stream,
           "messages": [{"role": "user", "content": "wait"}]})
}

fn responses(model: &str, stream: bool) -> Value {
    json!({"model": model, "input": "wait", "stream": stream})
}

/// The reasons of the cancels the node got.
fn cancels(edge: &Edge) -> Vec<String> {
    edge.node
        .commands()
        .into_iter()
        .filter_map(|c| match c {
            NodeCommand::Cancel { reason, .. } => Some(reason),
            _ => None,
        })
        .collect()
}

#[crate::common::test]
async fn a_client_going_away_cancels_its_run_on_every_route() {
    let edge = Edge::start("").await;
    let cases = [
        ("/v1/messages", messages("echo/hang", true)),
        ("/v1/messages", messages("echo/hang", false)),
        ("/v1/responses", responses("echo/hang", true)),
        ("/v1/responses", responses("echo/hang", false)),
    ];
    for (n, (path, body)) in cases.into_iter().enumerate() {
        let request = edge.post(path, &body).send();
        let waiting = tokio::spawn(request);
        eventually("the node got the run", || edge.runs().len() == n + 1).await;
        waiting.abort();
        eventually("the node got a cancel", || cancels(&edge).len() == n + 1).await;
        assert_eq!(cancels(&edge)[n], "client disconnected");
    }
    edge.stop().await;
}

#[crate::common::test]
async fn deadlines_end_runs_in_each_api_s_shape() {
    let edge = Edge::start("").await;
    let late = |path: &str, body: &Value| {
        edge.post(path, body)
            .header("x-edge-deadline-ms", "50")
            .send()
    };
    let response = late("/v1/messages", &messages("echo/hang", true))
        .await
        .unwrap();
    let body = json_with(response, StatusCode::GATEWAY_TIMEOUT).await;
    assert_eq!(body["type"], "error");
    assert_eq!(body["error"]["type"], "timeout_error");
    let response = late("/v1/responses", &responses("echo/hang", false))
        .await
        .unwrap();
    let body = json_with(response, StatusCode::GATEWAY_TIMEOUT).await;
    assert_eq!(body["error"]["code"], "deadline_exceeded");
    let response = edge
        .post("/v1/messages", &messages("echo/default", false))
        .header("x-edge-deadline-ms", "soon")
        .send()
        .await
        .unwrap();
    let body = json_with(response, StatusCode::BAD_REQUEST).await;
    assert_eq!(body["error"]["type"], "invalid_request_error");
    edge.stop().await;
}

#[crate::common::test]
async fn oversized_bodies_are_413_in_each_api_s_shape() {
    let edge = Edge::start("[api]\nmax_body_bytes = 256\n").await;
    let long = "x".repeat(400);
    let response = edge
        .send(
            "/v1/messages",
            &json!({"model": "echo/default", "max_tokens": 8,
        "messages": [{"role": "user", "content": long}]}),
        )
        .await;
    let body = json_with(response, StatusCode::PAYLOAD_TOO_LARGE).await;
    assert_eq!(body["error"]["type"], "request_too_large");
    let response = edge
        .send(
            "/v1/responses",
            &json!({"model": "echo/default", "input": long}),
        )
        .await;
    let body = json_with(response, StatusCode::PAYLOAD_TOO_LARGE).await;
    assert_eq!(body["error"]["code"], "request_too_large");
    let response = edge
        .send(
            "/v1/embeddings",
            &json!({"model": "echo/default", "input": long}),
        )
        .await;
    let body = json_with(response, StatusCode::PAYLOAD_TOO_LARGE).await;
    assert_eq!(body["error"]["code"], "request_too_large");
    edge.stop().await;
}
