//! `POST /v1/responses` (OpenAI's Responses API, stateless) through a real edge and a mock
//! node over real TCP: whole and streamed answers, reasoning and function calls, function
//! outputs sent back, incomplete answers, and errors in OpenAI's shape (stored state refused
//! by name).

use crate::api_support;

use api_support::{Edge, Sse, json_with, ok_json, read_events};
use edge::domain::Operation;
use reqwest::StatusCode;
use serde_json::{Value, json};

const RESPONSES: &str = "/v1/responses";

fn request(model: &str, input: Value, stream: bool) -> Value {
    json!({
        "model": model,
        "input": input,
        "instructions": "you echo",
        "stream": stream,
        "tools": [
            {"type": "function", "name": "lookup", "parameters": {"type": "object"}},
            {"type": "function", "name": "clock", "parameters": {"type": "object"}},
        ],
    })
}

#[crate::common::test]
async fn a_whole_response_and_what_the_node_receives() {
    let edge = Edge::start("").await;
    let response = edge
        .send(
            RESPONSES,
            &request("echo/default", json!("hello there"), false),
        )
        .await;
    assert!(response.headers().contains_key("x-edge-run-id"));
    let body = ok_json(response).await;
    assert_eq!(body["object"], "response");
    assert_eq!(body["status"], "completed");
    assert_eq!(body["model"], "echo/default");
    assert_eq!(body["output"][0]["type"], "message");
    assert_eq!(body["output"][0]["content"][0]["type"], "output_text");
    assert_eq!(body["output"][0]["content"][0]["text"], "hello there");
    assert_eq!(body["usage"]["total_tokens"], 4);
    let run = edge.runs().pop().unwrap();
    assert_eq!(run.operation, Operation::Chat);
    let input: Value = serde_json::from_slice(&run.input).unwrap();
    assert_eq!(
        input["messages"],
        json!([
            {"role": "system", "content": "you echo"},
            {"role": "user", "content": "hello there"},
        ])
    );
    assert_eq!(input["tools"][1]["function"]["name"], "clock");
    edge.stop().await;
}

#[crate::common::test]
async fn a_streamed_response_is_the_typed_event_sequence() {
    let edge = Edge::start("").await;
    let events = read_events(
        edge.send(
            RESPONSES,
            &request("echo/reasoning", json!("one two"), true),
        )
        .await,
    )
    .await;
    let data: Vec<Value> = events.iter().map(Sse::json).collect();
    for (n, (event, data)) in events.iter().zip(&data).enumerate() {
        assert_eq!(event.event.as_deref(), data["type"].as_str());
        assert_eq!(data["sequence_number"], n);
    }
    let names: Vec<&str> = data.iter().map(|d| d["type"].as_str().unwrap()).collect();
    assert_eq!(
        names[..3],
        [
            "response.created",
            "response.in_progress",
            "response.output_item.added"
        ]
    );
    assert_eq!(names.last(), Some(&"response.completed"));
    let reasoning: String = data
        .iter()
        .filter(|d| d["type"] == "response.reasoning_text.delta")
        .map(|d| d["delta"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(reasoning, "thinking about it");
    let text: String = data
        .iter()
        .filter(|d| d["type"] == "response.output_text.delta")
        .map(|d| d["delta"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(text, "one two");
    let done = &data.last().unwrap()["response"];
    assert_eq!(done["output"][0]["type"], "reasoning");
    assert_eq!(done["output"][1]["content"][0]["text"], "one two");
    assert_eq!(
        done["usage"]["output_tokens_details"]["reasoning_tokens"],
        3
    );
    edge.stop().await;
}

#[crate::common::test]
async fn function_calls_whole_streamed_and_outputs_sent_back() {
    let edge = Edge::start("").await;
    let whole = ok_json(
        edge.send(RESPONSES, &request("echo/tools", json!("Oslo"), false))
            .await,
    )
    .await;
    let output = whole["output"].as_array().unwrap();
    assert_eq!(output.len(), 2, "{whole}");
    assert_eq!(output[0]["type"], "function_call");
    assert_eq!(output[0]["name"], "lookup");
    assert_eq!(output[0]["arguments"], r#"{"city": "Oslo0"}"#);
    let call_id = output[0]["call_id"].as_str().unwrap().to_owned();

    let events = read_events(
        edge.send(RESPONSES, &request("echo/tools", json!("Oslo"), true))
            .await,
    )
    .await;
    let data: Vec<Value> = events.iter().map(Sse::json).collect();
    let deltas: String = data
        .iter()
        .filter(|d| d["type"] == "response.function_call_arguments.delta" && d["output_index"] == 1)
        .map(|d| d["delta"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(deltas, r#"{"city": "Oslo1"}"#);
    assert_eq!(
        data.iter()
            .filter(|d| d["type"] == "response.output_item.done")
            .count(),
        2
    );

    let mut input = vec![json!({"role": "user", "content": "Oslo"})];
    input.extend(output.iter().cloned());
    input.push(json!({"type": "function_call_output", "call_id": call_id, "output": "sunny"}));
    input.push(
        json!({"type": "function_call_output", "call_id": output[1]["call_id"], "output": "noon"}),
    );
    let answer = ok_json(
        edge.send(
            RESPONSES,
            &request("echo/tools", Value::Array(input), false),
        )
        .await,
    )
    .await;
    assert_eq!(
        answer["output"][0]["content"][0]["text"],
        "the tools said: sunny and noon"
    );
    let sent = edge.last_input();
    assert_eq!(sent["messages"][2]["tool_calls"][0]["id"], call_id.as_str());
    assert_eq!(
        sent["messages"][3],
        json!({"role": "tool", "tool_call_id": call_id, "content": "sunny"})
    );
    edge.stop().await;
}

#[crate::common::test]
async fn a_truncated_answer_is_incomplete() {
    let edge = Edge::start("").await;
    let whole = ok_json(
        edge.send(RESPONSES, &request("echo/length", json!("a b"), false))
            .await,
    )
    .await;
    assert_eq!(whole["status"], "incomplete");
    assert_eq!(whole["incomplete_details"]["reason"], "max_output_tokens");
    let events = read_events(
        edge.send(RESPONSES, &request("echo/length", json!("a b"), true))
            .await,
    )
    .await;
    assert_eq!(
        events.last().unwrap().event.as_deref(),
        Some("response.incomplete")
    );
    edge.stop().await;
}

#[crate::common::test]
async fn errors_take_openai_s_shape_and_name_what_is_unsupported() {
    let edge = Edge::start("").await;
    let error_of = |body: Value| body["error"].clone();
    for raw in [
        "{nope",
        "[]",
        r#"{"model":"echo/default"}"#,
        r#"{"model":"echo/default","input":7}"#,
    ] {
        let error =
            error_of(json_with(edge.send_raw(RESPONSES, raw).await, StatusCode::BAD_REQUEST).await);
        assert_eq!(error["type"], "invalid_request_error", "{raw}");
    }
    for (field, value) in [
        ("store", json!(true)),
        ("previous_response_id", json!("resp_1")),
    ] {
        let mut body = request("echo/default", json!("x"), false);
        body[field] = value;
        let error =
            error_of(json_with(edge.send(RESPONSES, &body).await, StatusCode::BAD_REQUEST).await);
        assert_eq!(error["param"], field);
        assert!(
            error["message"].as_str().unwrap().contains(field),
            "{error}"
        );
    }
    let response = edge
        .send(RESPONSES, &request("echo/bad_request", json!("x"), true))
        .await;
    let error = error_of(json_with(response, StatusCode::BAD_REQUEST).await);
    assert_eq!(error["code"], "context_length_exceeded");
    let response = edge
        .send(RESPONSES, &request("nothing/here", json!("x"), false))
        .await;
    assert_eq!(
        error_of(json_with(response, StatusCode::NOT_FOUND).await)["code"],
        "model_not_found"
    );
    edge.stop().await;
}

/// Codex's built-in provider opens `GET /v1/responses` as a WebSocket first: 426 sends it to
/// HTTP at once (any other status has it retry five times, every turn), naming the protocol
/// to use. A plain `GET` is 405, naming the method to use; `POST` still serves.
#[crate::common::test]
async fn a_websocket_upgrade_is_426_so_codex_falls_back_to_http_at_once() {
    let edge = Edge::start("").await;
    let upgrade = api_support::client()
        .get(edge.url("/v1/responses"))
        .header("connection", "Upgrade")
        .header("upgrade", "websocket")
        .header("sec-websocket-version", "13")
        .header("sec-websocket-key", "dGhlIHNhbXBsZSBub25jZQ==")
        .header("openai-beta", "responses_websockets=2026-02-06")
        .send()
        .await
        .expect("an answer");
    assert_eq!(upgrade.status(), StatusCode::UPGRADE_REQUIRED);
    assert_eq!(upgrade.headers()["upgrade"], "HTTP/1.1");
    let body: Value = upgrade.json().await.expect("OpenAI's error shape");
    assert_eq!(body["error"]["code"], "websocket_not_supported", "{body}");

    let plain = api_support::client()
        .get(edge.url("/v1/responses"))
        .send()
        .await
        .expect("an answer");
    assert_eq!(plain.status(), StatusCode::METHOD_NOT_ALLOWED);
    assert_eq!(plain.headers()["allow"], "POST");
    let body: Value = plain.json().await.expect("OpenAI's error shape");
    assert_eq!(body["error"]["code"], "method_not_allowed", "{body}");

    let served = edge
        .post(
            "/v1/responses",
            &request("echo/default", json!("still served"), false),
        )
        .send()
        .await
        .expect("an answer");
    assert_eq!(served.status(), StatusCode::OK);
}
