//! `POST /v1/completions` (legacy text completions): the whole `text_completion` (its
//! streamed chunks are written by `sse.rs`). The request goes to the node as it came,
//! without `model` and `stream`.

use axum::extract::State;
use axum::extract::rejection::BytesRejection;
use axum::http::HeaderMap;
use axum::response::Response;
use bytes::Bytes;
use serde_json::{Value, json};

use super::super::auth::Caller;
use super::super::output::{Collected, legacy_logprobs_json};
use super::super::request::Endpoint;
use super::reply::{self, Reply};
use crate::adapters::api::ApiState;

/// `POST /v1/completions`.
pub(in crate::adapters::api) async fn create(
    State(state): State<ApiState>,
    caller: Caller,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    reply::respond(state, Endpoint::Completion, caller, headers, body).await
}

/// A `text_completion` with one choice (usage is added by the caller), with the legacy
/// `logprobs` when the node sent any.
pub(in crate::adapters::api) fn full(
    reply: &Reply,
    collected: &Collected,
    finish_reason: &str,
) -> Value {
    json!({
        "id": reply.id,
        "object": "text_completion",
        "created": reply.created,
        "model": reply.model,
        "system_fingerprint": null,
        "choices": [{
            "text": collected.text,
            "index": 0,
            "logprobs": legacy_logprobs_json(&collected.logprobs, &mut 0),
            "finish_reason": finish_reason,
        }],
    })
}
