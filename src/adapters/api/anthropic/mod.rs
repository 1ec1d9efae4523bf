//! `POST /v1/messages`: Anthropic's Messages API, whole and streamed, with Anthropic's
//! error shape. A request is translated ([`request`]) into the chat body the chat endpoint
//! would send, and runs as a chat run, so any node that serves chat serves Messages; the
//! run's events are translated back ([`stream`], [`message`]).
//!
//! This module is the HTTP plumbing; the translators are pure.

mod request;
mod stream;
#[cfg(test)]
mod tests;

use axum::Json;
use axum::extract::State;
use axum::extract::rejection::BytesRejection;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use serde_json::{Value, json};

use super::auth::Caller;
use super::error::ApiError;
use super::output::Collected;
use super::routing::ClientKeys;
use super::run::Finished;
use super::translate::{ChatApi, arguments_value, serve_chat_run};
use crate::adapters::http::HttpState;
use crate::domain::{RunId, Usage};
use request::MessagesRequest;
use stream::MessagesStream;

/// `POST /v1/messages`.
pub(super) async fn create(
    State(state): State<HttpState>,
    caller: Caller,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    serve_chat_run(&MESSAGES, &state, &caller, &headers, body).await
}

/// Messages as a chat run: `metadata.user_id` is the client's user key.
const MESSAGES: ChatApi<MessagesRequest, MessagesStream> = ChatApi {
    translate: request::translate,
    keys: |value| ClientKeys {
        user: value.pointer("/metadata/user_id").and_then(Value::as_str),
        ..ClientKeys::default()
    },
    error_response,
    stream: |request, run_id| {
        MessagesStream::new(message_id(run_id), request.model, request.thinking)
    },
    whole: |request, run_id, collected, finished| {
        let id = message_id(run_id);
        message(&id, &request.model, request.thinking, collected, finished)
    },
};

/// The id of the message answering run `run_id`.
fn message_id(run_id: &RunId) -> String {
    format!("msg_{run_id}")
}

/// The whole answer: a `message` with thinking (when asked for), text and `tool_use`
/// blocks, the stop reason and usage.
pub(super) fn message(
    id: &str,
    model: &str,
    thinking: bool,
    collected: &Collected,
    finished: &Finished,
) -> Value {
    let mut content = Vec::new();
    if thinking && !collected.reasoning.is_empty() {
        content
            .push(json!({ "type": "thinking", "thinking": collected.reasoning, "signature": "" }));
    }
    if !collected.text.is_empty() || collected.tool_calls.is_empty() {
        content.push(json!({ "type": "text", "text": collected.text }));
    }
    for call in &collected.tool_calls {
        let id = if call.id.is_empty() {
            format!("toolu_{id}_{}", call.index)
        } else {
            call.id.clone()
        };
        content.push(json!({
            "type": "tool_use",
            "id": id,
            "name": call.name,
            "input": arguments_value(&call.arguments),
        }));
    }
    json!({
        "id": id,
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": content,
        "stop_reason": stop_reason(&finished.finish_reason, !collected.tool_calls.is_empty()),
        "stop_sequence": null,
        "usage": finished.usage.map_or_else(|| json!({ "input_tokens": 0, "output_tokens": 0 }), usage_json),
    })
}

/// A chat `finish_reason` as Anthropic's `stop_reason`: `tool_use` whenever the answer
/// called tools; `length` → `max_tokens`; `content_filter` → `refusal`; a node's own
/// `stop_sequence` passes; anything else → `end_turn`.
pub(super) fn stop_reason(finish_reason: &str, called_tools: bool) -> &'static str {
    match finish_reason {
        _ if called_tools => "tool_use",
        "tool_calls" | "function_call" => "tool_use",
        "length" => "max_tokens",
        "content_filter" => "refusal",
        "stop_sequence" => "stop_sequence",
        _ => "end_turn",
    }
}

/// Anthropic's usage object.
pub(super) fn usage_json(usage: Usage) -> Value {
    let mut body = json!({
        "input_tokens": usage.input_tokens,
        "output_tokens": usage.output_tokens,
    });
    if usage.cached_input_tokens > 0 {
        body["cache_read_input_tokens"] = json!(usage.cached_input_tokens);
    }
    body
}

/// Anthropic's error type for a status.
fn error_type(status: StatusCode) -> &'static str {
    match status.as_u16() {
        400 | 422 => "invalid_request_error",
        401 => "authentication_error",
        403 => "permission_error",
        404 => "not_found_error",
        413 => "request_too_large",
        429 => "rate_limit_error",
        503 | 529 => "overloaded_error",
        504 => "timeout_error",
        _ => "api_error",
    }
}

/// Anthropic's error body, `{"type":"error","error":{"type":…,"message":…}}`.
pub(super) fn error_body(error: &ApiError) -> Value {
    json!({
        "type": "error",
        "error": { "type": error_type(error.status()), "message": error.message() },
    })
}

/// The error as an Anthropic-shaped response, with its status and `Retry-After`.
pub(super) fn error_response(error: &ApiError) -> Response {
    let mut response = (error.status(), Json(error_body(error))).into_response();
    error.add_headers(&mut response);
    response
}
