//! `POST /v1/chat/completions`: the whole chat answer (`chat.completion`; the streamed
//! `chat.completion.chunk`s are written by `sse.rs`). The request itself goes to the node as
//! it came, without `model` and `stream`.

use axum::extract::State;
use axum::extract::rejection::BytesRejection;
use axum::http::HeaderMap;
use axum::response::Response;
use bytes::Bytes;
use serde_json::{Value, json};

use super::super::auth::Caller;
use super::super::output::{Collected, chat_logprobs_json, tool_calls_json};
use super::super::request::Endpoint;
use super::reply::{self, Reply};
use crate::adapters::api::ApiState;

/// `POST /v1/chat/completions`.
pub(in crate::adapters::api) async fn create(
    State(state): State<ApiState>,
    caller: Caller,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    reply::respond(state, Endpoint::Chat, caller, headers, body).await
}

/// A `chat.completion` with one choice (usage is added by the caller): the text, the
/// reasoning as `reasoning_content`, the tool calls (`content` null when there are only
/// tool calls), and the log probabilities.
pub(in crate::adapters::api) fn full(
    reply: &Reply,
    collected: &Collected,
    finish_reason: &str,
) -> Value {
    let content = if collected.text.is_empty() && !collected.tool_calls.is_empty() {
        Value::Null
    } else {
        Value::from(collected.text.as_str())
    };
    let mut message = json!({ "role": "assistant", "content": content, "refusal": null });
    if !collected.reasoning.is_empty() {
        message["reasoning_content"] = Value::from(collected.reasoning.as_str());
    }
    if !collected.tool_calls.is_empty() {
        message["tool_calls"] = tool_calls_json(&collected.tool_calls);
    }
    json!({
        "id": reply.id,
        "object": "chat.completion",
        "created": reply.created,
        "model": reply.model,
        "system_fingerprint": null,
        "choices": [{
            "index": 0,
            "message": message,
            "logprobs": chat_logprobs_json(&collected.logprobs),
            "finish_reason": finish_reason,
        }],
    })
}
