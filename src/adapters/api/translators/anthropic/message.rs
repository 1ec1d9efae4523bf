//! Anthropic's shapes, pure: the whole `message` answer, the `stop_reason` a chat finish
//! reason becomes, the usage object, and the error body with the error type a status
//! becomes. The stream translator (`stream.rs`) and the handler (`mod.rs`) both use them.

use serde_json::{Value, json};

use crate::adapters::api::translators::arguments_value;
use crate::adapters::api::translators::output::{Collected, Finished};
use crate::adapters::api::translators::{ApiError, ErrorKind, Overflow};
use crate::domain::Usage;

/// The whole answer: a `message` with thinking (when asked for), text and `tool_use`
/// blocks, the stop reason and usage.
pub(in crate::adapters::api) fn message(
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
pub(in crate::adapters::api) fn stop_reason(
    finish_reason: &str,
    called_tools: bool,
) -> &'static str {
    match finish_reason {
        _ if called_tools => "tool_use",
        "tool_calls" | "function_call" => "tool_use",
        "length" => "max_tokens",
        "content_filter" => "refusal",
        "stop_sequence" => "stop_sequence",
        _ => "end_turn",
    }
}

/// Anthropic's usage object. Anthropic counts the prompt as `input_tokens` (not read from
/// the cache) plus `cache_read_input_tokens`, so the engine's cached tokens are taken out of
/// its prompt count: the two add up to the prompt the engine saw.
pub(in crate::adapters::api) fn usage_json(usage: Usage) -> Value {
    let mut body = json!({
        "input_tokens": usage.input_tokens.saturating_sub(usage.cached_input_tokens),
        "output_tokens": usage.output_tokens,
    });
    if usage.cached_input_tokens > 0 {
        body["cache_read_input_tokens"] = json!(usage.cached_input_tokens);
    }
    body
}

/// Anthropic's error type for a kind of error.
fn error_type(kind: ErrorKind) -> &'static str {
    match kind {
        ErrorKind::InvalidRequest | ErrorKind::Unprocessable => "invalid_request_error",
        ErrorKind::Authentication => "authentication_error",
        ErrorKind::Permission => "permission_error",
        ErrorKind::NotFound => "not_found_error",
        ErrorKind::TooLarge => "request_too_large",
        ErrorKind::RateLimited => "rate_limit_error",
        ErrorKind::Unavailable => "overloaded_error",
        ErrorKind::Timeout => "timeout_error",
        ErrorKind::MethodNotAllowed
        | ErrorKind::Conflict
        | ErrorKind::UpgradeRequired
        | ErrorKind::Internal
        | ErrorKind::NotSupported
        | ErrorKind::Upstream => "api_error",
    }
}

/// Anthropic's error body, `{"type":"error","error":{"type":…,"message":…}}`. A prompt over
/// the context window is said in Anthropic's words, `prompt is too long: N tokens > M
/// maximum`, which Claude Code reads to size its compaction.
pub(in crate::adapters::api) fn error_body(error: &ApiError) -> Value {
    let message = match error.overflow() {
        Some(Overflow {
            prompt: Some(prompt),
            window,
        }) => format!("prompt is too long: {prompt} tokens > {window} maximum"),
        _ => error.message().to_owned(),
    };
    json!({
        "type": "error",
        "error": { "type": error_type(error.kind()), "message": message },
    })
}
