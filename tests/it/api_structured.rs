//! Chat and completions render what nodes send beyond text, in OpenAI's own shapes:
//! reasoning, parallel tool calls, log probabilities, other finish reasons and usage detail,
//! whole and streamed; and a run's failure class decides the status the client gets. A real
//! edge, a mock node over real TCP, `reqwest` as the client.

use crate::api_support;

use api_support::{Edge, json_with, ok_json, read_chunks};
use reqwest::StatusCode;
use serde_json::{Value, json};

const CHAT: &str = "/v1/chat/completions";
const COMPLETIONS: &str = "/v1/completions";

fn chat(model: &str, content: &str, stream: bool) -> Value {
    json!({
        "model": model,
        "stream": stream,
        "messages": [{"role": "user", "content": content}],
        "tools": [
            {"type": "function", "function": {"name": "lookup", "parameters": {"type": "object"}}},
            {"type": "function", "function": {"name": "clock", "parameters": {"type": "object"}}},
        ],
    })
}

fn deltas<'a>(chunks: &'a [Value], field: &str) -> Vec<&'a Value> {
    chunks
        .iter()
        .filter_map(|c| c["choices"][0]["delta"].get(field))
        .collect()
}

#[crate::common::test]
async fn reasoning_reaches_chat_whole_and_streamed_with_usage_details() {
    let edge = Edge::start("").await;
    let whole = ok_json(
        edge.send(CHAT, &chat("echo/reasoning", "two words", false))
            .await,
    )
    .await;
    let message = &whole["choices"][0]["message"];
    assert_eq!(message["content"], "two words");
    assert_eq!(message["reasoning_content"], "thinking about it");
    assert_eq!(
        whole["usage"]["completion_tokens_details"]["reasoning_tokens"],
        3
    );
    assert_eq!(whole["usage"]["prompt_tokens_details"]["cached_tokens"], 1);

    let chunks = read_chunks(
        edge.send(CHAT, &chat("echo/reasoning", "two words", true))
            .await,
    )
    .await;
    let reasoning: String = deltas(&chunks, "reasoning_content")
        .iter()
        .filter_map(|v| v.as_str())
        .collect();
    assert_eq!(reasoning, "thinking about it");
    let text: String = deltas(&chunks, "content")
        .iter()
        .filter_map(|v| v.as_str())
        .collect();
    assert_eq!(text, "two words");
    edge.stop().await;
}

#[crate::common::test]
async fn parallel_tool_calls_cross_the_edge_whole_and_streamed() {
    let edge = Edge::start("").await;
    let whole = ok_json(edge.send(CHAT, &chat("echo/tools", "Oslo", false)).await).await;
    let choice = &whole["choices"][0];
    assert_eq!(choice["finish_reason"], "tool_calls");
    assert_eq!(choice["message"]["content"], Value::Null);
    let calls = choice["message"]["tool_calls"]
        .as_array()
        .expect("tool calls");
    assert_eq!(calls.len(), 2);
    assert_eq!(calls[0]["type"], "function");
    assert_eq!(calls[0]["function"]["name"], "lookup");
    assert_eq!(calls[0]["function"]["arguments"], r#"{"city": "Oslo0"}"#);
    assert_eq!(calls[1]["function"]["name"], "clock");
    assert_eq!(calls[1]["function"]["arguments"], r#"{"city": "Oslo1"}"#);
    assert!(
        calls[0]["id"]
            .as_str()
            .is_some_and(|id| id.starts_with("call_"))
    );
    // The node got the tools as the client sent them.
    assert_eq!(edge.last_input()["tools"][1]["function"]["name"], "clock");

    let chunks = read_chunks(edge.send(CHAT, &chat("echo/tools", "Oslo", true)).await).await;
    let pieces: Vec<&Value> = deltas(&chunks, "tool_calls")
        .into_iter()
        .flat_map(|calls| calls.as_array().expect("an array").iter())
        .collect();
    assert_eq!(pieces.len(), 6, "{pieces:?}");
    assert_eq!(pieces[0]["index"], 0);
    assert_eq!(pieces[0]["type"], "function");
    assert_eq!(pieces[0]["function"]["name"], "lookup");
    assert!(
        pieces[1].get("id").is_none(),
        "later pieces carry no id: {}",
        pieces[1]
    );
    let arguments = |index: u64| -> String {
        pieces
            .iter()
            .filter(|p| p["index"] == index)
            .filter_map(|p| p["function"]["arguments"].as_str())
            .collect()
    };
    assert_eq!(arguments(1), r#"{"city": "Oslo1"}"#);
    let finish = chunks
        .iter()
        .find_map(|c| c["choices"][0]["finish_reason"].as_str());
    assert_eq!(finish, Some("tool_calls"));
    edge.stop().await;
}

#[crate::common::test]
async fn logprobs_take_the_chat_and_the_legacy_shapes() {
    let edge = Edge::start("").await;
    let whole = ok_json(edge.send(CHAT, &chat("echo/logprobs", "a b", false)).await).await;
    let content = &whole["choices"][0]["logprobs"]["content"];
    assert_eq!(content[0]["token"], "a ");
    assert_eq!(content[0]["logprob"], -0.125);
    assert_eq!(content[0]["bytes"], json!([97, 32]));
    assert_eq!(content[1]["top_logprobs"][1]["token"], "other");

    let chunks = read_chunks(edge.send(CHAT, &chat("echo/logprobs", "a b", true)).await).await;
    let streamed: Vec<&Value> = chunks
        .iter()
        .filter_map(|c| c["choices"][0]["logprobs"]["content"].as_array())
        .flatten()
        .collect();
    assert_eq!(streamed.len(), 2);

    let body = json!({"model": "echo/logprobs", "prompt": "x yz", "logprobs": 2});
    let whole = ok_json(edge.send(COMPLETIONS, &body).await).await;
    let logprobs = &whole["choices"][0]["logprobs"];
    assert_eq!(logprobs["tokens"], json!(["x ", "yz"]));
    assert_eq!(logprobs["token_logprobs"], json!([-0.125, -0.25]));
    assert_eq!(logprobs["text_offset"], json!([0, 2]));
    assert_eq!(logprobs["top_logprobs"][0]["other"], -2.125);

    let mut streaming = body.clone();
    streaming["stream"] = json!(true);
    let chunks = read_chunks(edge.send(COMPLETIONS, &streaming).await).await;
    let offsets: Vec<&Value> = chunks
        .iter()
        .filter_map(|c| c["choices"][0]["logprobs"]["text_offset"].as_array())
        .flatten()
        .collect();
    assert_eq!(offsets, [&json!(0), &json!(2)]);
    edge.stop().await;
}

#[crate::common::test]
async fn other_finish_reasons_pass_through() {
    let edge = Edge::start("").await;
    for (model, reason) in [
        ("echo/length", "length"),
        ("echo/filtered", "content_filter"),
    ] {
        let whole = ok_json(edge.send(CHAT, &chat(model, "x", false)).await).await;
        assert_eq!(whole["choices"][0]["finish_reason"], reason);
        let chunks = read_chunks(edge.send(CHAT, &chat(model, "x", true)).await).await;
        let finish = chunks
            .iter()
            .find_map(|c| c["choices"][0]["finish_reason"].as_str());
        assert_eq!(finish, Some(reason));
    }
    edge.stop().await;
}

#[crate::common::test]
async fn failure_classes_decide_the_status() {
    let edge = Edge::start("").await;
    for stream in [false, true] {
        let response = edge
            .send(CHAT, &chat("echo/bad_request", "too long", stream))
            .await;
        assert!(response.headers().contains_key("x-edge-run-id"));
        let error = json_with(response, StatusCode::BAD_REQUEST).await["error"].clone();
        assert_eq!(error["type"], "invalid_request_error");
        assert_eq!(error["code"], "context_length_exceeded");
        assert!(
            error["message"]
                .as_str()
                .unwrap()
                .starts_with("This model's maximum context length"),
            "{error}"
        );

        let response = edge.send(CHAT, &chat("echo/node_error", "x", stream)).await;
        let error = json_with(response, StatusCode::BAD_GATEWAY).await["error"].clone();
        assert_eq!(
            (error["type"].as_str(), error["code"].as_str()),
            (Some("server_error"), Some("engine_unavailable"))
        );

        let response = edge.send(CHAT, &chat("echo/refused", "x", stream)).await;
        assert_eq!(response.headers()["retry-after"], "1");
        let error = json_with(response, StatusCode::SERVICE_UNAVAILABLE).await["error"].clone();
        assert_eq!(error["code"], "busy");
    }
    edge.stop().await;
}

#[crate::common::test]
async fn one_model_can_be_retrieved_by_id_alias_or_escaped_id() {
    let edge = Edge::start("[api.models]\n\"gpt-4o-mini\" = \"echo/tools\"\n").await;
    let client = api_support::client();
    for path in [
        "/v1/models/echo/tools",
        "/v1/models/echo%2Ftools",
        "/v1/models/gpt-4o-mini",
    ] {
        let response = client.get(edge.url(path)).send().await.unwrap();
        let model = ok_json(response).await;
        assert_eq!(model["object"], "model", "{path}");
        assert_eq!(model["owned_by"], "echo", "{path}");
        assert!(model["created"].is_u64(), "{path}");
    }
    let response = client
        .get(edge.url("/v1/models/echo/nothing"))
        .send()
        .await
        .unwrap();
    let error = json_with(response, StatusCode::NOT_FOUND).await;
    assert_eq!(error["error"]["code"], "model_not_found");
    edge.stop().await;
}
