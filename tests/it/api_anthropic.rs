//! `POST /v1/messages` (Anthropic's Messages API) through a real edge and a mock node over
//! real TCP: whole and streamed answers, thinking, tool use and its round trip, stop
//! reasons, errors in Anthropic's shape, `x-api-key` and Bearer keys, and what the node
//! receives (the chat body the chat endpoint would send).

use crate::api_support;

use api_support::{Edge, Sse, json_with, ok_json, read_events};
use edge::domain::Operation;
use reqwest::StatusCode;
use serde_json::{Value, json};

const MESSAGES: &str = "/v1/messages";

fn messages(model: &str, content: Value, stream: bool) -> Value {
    json!({
        "model": model,
        "max_tokens": 256,
        "stream": stream,
        "system": "you echo",
        "messages": [{"role": "user", "content": content}],
        "tools": [
            {"name": "lookup", "description": "finds", "input_schema": {"type": "object"}},
            {"name": "clock", "input_schema": {"type": "object"}},
        ],
    })
}

/// The events' names, checked against each data's `type`.
fn names(events: &[Sse]) -> Vec<String> {
    events
        .iter()
        .map(|event| {
            let name = event.event.clone().expect("every event is named");
            assert_eq!(event.json()["type"], name.as_str(), "{event:?}");
            name
        })
        .collect()
}

#[crate::common::test]
async fn a_whole_message_reaches_the_node_as_a_chat_body() {
    let edge = Edge::start("").await;
    let response = edge
        .send(
            MESSAGES,
            &messages("echo/default", json!("hello there"), false),
        )
        .await;
    assert!(response.headers().contains_key("x-edge-run-id"));
    let message = ok_json(response).await;
    assert_eq!(message["type"], "message");
    assert_eq!(message["role"], "assistant");
    assert_eq!(message["model"], "echo/default");
    assert!(message["id"].as_str().unwrap().starts_with("msg_"));
    assert_eq!(
        message["content"],
        json!([{"type": "text", "text": "hello there"}])
    );
    assert_eq!(message["stop_reason"], "end_turn");
    assert_eq!(
        message["usage"],
        json!({"input_tokens": 2, "output_tokens": 2})
    );

    let run = edge.runs().pop().unwrap();
    assert_eq!(run.operation, Operation::Chat);
    assert_eq!(run.content_type, "application/json");
    let input: Value = serde_json::from_slice(&run.input).unwrap();
    assert_eq!(
        input["messages"][0],
        json!({"role": "system", "content": "you echo"})
    );
    assert_eq!(
        input["messages"][1],
        json!({"role": "user", "content": "hello there"})
    );
    assert_eq!(input["max_tokens"], 256);
    assert_eq!(input["tools"][0]["function"]["name"], "lookup");
    assert!(input.get("model").is_none() && input.get("stream").is_none());
    edge.stop().await;
}

#[crate::common::test]
async fn a_streamed_message_is_anthropic_s_event_sequence() {
    let edge = Edge::start("").await;
    let body = messages(
        "echo/default",
        json!([{"type": "text", "text": "one two three"}]),
        true,
    );
    let events = read_events(edge.send(MESSAGES, &body).await).await;
    let names = names(&events);
    assert_eq!(names[..3], ["message_start", "ping", "content_block_start"]);
    assert_eq!(
        names[names.len() - 3..],
        ["content_block_stop", "message_delta", "message_stop"]
    );
    let text: String = events
        .iter()
        .filter(|e| e.event.as_deref() == Some("content_block_delta"))
        .map(|e| e.json()["delta"]["text"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(text, "one two three");
    let delta = events[events.len() - 2].json();
    assert_eq!(delta["delta"]["stop_reason"], "end_turn");
    assert_eq!(delta["usage"]["output_tokens"], 3);
    edge.stop().await;
}

#[crate::common::test]
async fn tool_use_whole_and_its_round_trip() {
    let edge = Edge::start("").await;
    let whole = ok_json(
        edge.send(MESSAGES, &messages("echo/tools", json!("Oslo"), false))
            .await,
    )
    .await;
    assert_eq!(whole["stop_reason"], "tool_use");
    let content = whole["content"].as_array().unwrap();
    assert_eq!(content.len(), 2, "{whole}");
    assert_eq!(content[0]["type"], "tool_use");
    assert_eq!(content[0]["name"], "lookup");
    assert_eq!(content[0]["input"], json!({"city": "Oslo0"}));
    assert_eq!(content[1]["input"], json!({"city": "Oslo1"}));

    let id = content[0]["id"].as_str().unwrap();
    let mut round_trip = messages("echo/tools", json!("Oslo"), false);
    round_trip["messages"] = json!([
        {"role": "user", "content": "Oslo"},
        {"role": "assistant", "content": whole["content"]},
        {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": id, "content": "sunny"},
            {"type": "tool_result", "tool_use_id": content[1]["id"], "content": [{"type": "text", "text": "noon"}]},
        ]},
    ]);
    let answer = ok_json(edge.send(MESSAGES, &round_trip).await).await;
    assert_eq!(
        answer["content"][0]["text"],
        "the tools said: sunny and noon"
    );
    assert_eq!(answer["stop_reason"], "end_turn");
    let input = edge.last_input();
    let sent = input["messages"].as_array().unwrap();
    assert_eq!(sent[2]["role"], "assistant");
    assert_eq!(sent[2]["tool_calls"][0]["id"], id);
    assert_eq!(
        sent[2]["tool_calls"][0]["function"]["arguments"],
        r#"{"city":"Oslo0"}"#
    );
    assert_eq!(
        sent[3],
        json!({"role": "tool", "tool_call_id": id, "content": "sunny"})
    );
    edge.stop().await;
}

#[crate::common::test]
async fn tool_use_streams_as_tool_use_blocks() {
    let edge = Edge::start("").await;
    let events = read_events(
        edge.send(MESSAGES, &messages("echo/tools", json!("Oslo"), true))
            .await,
    )
    .await;
    let starts: Vec<Value> = events
        .iter()
        .filter(|e| e.event.as_deref() == Some("content_block_start"))
        .map(Sse::json)
        .collect();
    assert_eq!(starts.len(), 2);
    assert_eq!(starts[1]["index"], 1);
    assert_eq!(starts[1]["content_block"]["type"], "tool_use");
    let json_of = |index: u64| -> String {
        events
            .iter()
            .map(Sse::json)
            .filter(|e| e["type"] == "content_block_delta" && e["index"] == index)
            .map(|e| e["delta"]["partial_json"].as_str().unwrap().to_owned())
            .collect()
    };
    assert_eq!(json_of(0), r#"{"city": "Oslo0"}"#);
    let stop = events
        .iter()
        .map(Sse::json)
        .find(|e| e["type"] == "message_delta")
        .unwrap();
    assert_eq!(stop["delta"]["stop_reason"], "tool_use");

    edge.stop().await;
}

#[crate::common::test]
async fn thinking_is_shown_only_when_asked_for() {
    let edge = Edge::start("").await;
    let mut body = messages("echo/reasoning", json!("hi"), false);
    let plain = ok_json(edge.send(MESSAGES, &body).await).await;
    assert_eq!(plain["content"], json!([{"type": "text", "text": "hi"}]));
    body["thinking"] = json!({"type": "enabled", "budget_tokens": 1024});
    let thought = ok_json(edge.send(MESSAGES, &body).await).await;
    assert_eq!(thought["content"][0]["type"], "thinking");
    assert_eq!(thought["content"][0]["thinking"], "thinking about it");
    assert_eq!(thought["usage"]["cache_read_input_tokens"], 1);
    body["stream"] = json!(true);
    let events = read_events(edge.send(MESSAGES, &body).await).await;
    let first = events
        .iter()
        .map(Sse::json)
        .find(|e| e["type"] == "content_block_start")
        .unwrap();
    assert_eq!(first["content_block"]["type"], "thinking");
    edge.stop().await;
}

#[crate::common::test]
async fn stop_reasons_follow_the_finish_reason() {
    let edge = Edge::start("").await;
    for (model, reason) in [("echo/length", "max_tokens"), ("echo/filtered", "refusal")] {
        let message = ok_json(
            edge.send(MESSAGES, &messages(model, json!("x"), false))
                .await,
        )
        .await;
        assert_eq!(message["stop_reason"], reason);
    }
    edge.stop().await;
}

/// The error of an Anthropic-shaped error body with `status`.
async fn anthropic_error(response: reqwest::Response, status: StatusCode) -> Value {
    let body = json_with(response, status).await;
    assert_eq!(body["type"], "error", "{body}");
    assert!(
        body["error"]["message"]
            .as_str()
            .is_some_and(|m| !m.is_empty()),
        "{body}"
    );
    body["error"].clone()
}

#[crate::common::test]
async fn errors_take_anthropic_s_shape() {
    let edge = Edge::start("").await;
    for raw in [
        "{nope",
        "[1]",
        r#"{"model":"echo/default"}"#,
        r#"{"model":"echo/default","max_tokens":1,"messages":[]}"#,
        r#"{"model":"echo/default","max_tokens":1,"messages":[{"role":"user","content":[{"type":"document"}]}]}"#,
    ] {
        let error =
            anthropic_error(edge.send_raw(MESSAGES, raw).await, StatusCode::BAD_REQUEST).await;
        assert_eq!(error["type"], "invalid_request_error", "{raw}");
    }
    let error = anthropic_error(
        edge.send(MESSAGES, &messages("echo/missing", json!("x"), false))
            .await,
        StatusCode::NOT_FOUND,
    )
    .await;
    assert_eq!(error["type"], "not_found_error");
    for stream in [false, true] {
        let response = edge
            .send(MESSAGES, &messages("echo/bad_request", json!("x"), stream))
            .await;
        let error = anthropic_error(response, StatusCode::BAD_REQUEST).await;
        assert!(
            error["message"]
                .as_str()
                .unwrap()
                .contains("maximum context length")
        );
        let response = edge
            .send(MESSAGES, &messages("echo/node_error", json!("x"), stream))
            .await;
        assert_eq!(
            anthropic_error(response, StatusCode::BAD_GATEWAY).await["type"],
            "api_error"
        );
        let response = edge
            .send(MESSAGES, &messages("echo/refused", json!("x"), stream))
            .await;
        assert_eq!(response.headers()["retry-after"], "1");
        assert_eq!(
            anthropic_error(response, StatusCode::SERVICE_UNAVAILABLE).await["type"],
            "overloaded_error"
        );
    }
    edge.stop().await;
}

#[crate::common::test]
async fn keys_are_taken_from_x_api_key_or_bearer() {
    let edge = Edge::start("[api]\nkeys = [\"sk-ant-test\"]\n").await;
    let body = messages("echo/default", json!("hi"), false);
    let missing = edge.post(MESSAGES, &body).send().await.unwrap();
    assert_eq!(
        anthropic_error(missing, StatusCode::UNAUTHORIZED).await["type"],
        "authentication_error"
    );
    let wrong = edge
        .post(MESSAGES, &body)
        .header("x-api-key", "sk-wrong")
        .send()
        .await
        .unwrap();
    assert_eq!(wrong.status(), StatusCode::UNAUTHORIZED);
    let right = edge
        .post(MESSAGES, &body)
        .header("x-api-key", "sk-ant-test")
        .header("anthropic-version", "2023-06-01")
        .send()
        .await
        .unwrap();
    assert_eq!(ok_json(right).await["content"][0]["text"], "hi");
    let bearer = edge
        .post(MESSAGES, &body)
        .bearer_auth("sk-ant-test")
        .send()
        .await
        .unwrap();
    assert_eq!(bearer.status(), StatusCode::OK);
    edge.stop().await;
}
