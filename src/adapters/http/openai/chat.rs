//! `POST /v1/chat/completions`: the whole chat answer (`chat.completion`; the streamed
//! `chat.completion.chunk`s are written by `sse.rs`). The request itself goes to the node as
//! it came, without `model` and `stream`.

use axum::extract::State;
use axum::extract::rejection::BytesRejection;
use axum::http::HeaderMap;
use axum::response::Response;
use bytes::Bytes;
use serde_json::{Value, json};

use super::reply::Reply;
use super::request::Endpoint;
use super::run;
use crate::adapters::http::HttpState;

/// `POST /v1/chat/completions`.
pub(super) async fn create(
    State(state): State<HttpState>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    run::respond(state, Endpoint::Chat, headers, body).await
}

/// A `chat.completion` with one choice (usage is added by the caller).
pub(super) fn full(reply: &Reply, text: &str, finish_reason: &str) -> Value {
    json!({
        "id": reply.id,
        "object": "chat.completion",
        "created": reply.created,
        "model": reply.model,
        "system_fingerprint": null,
        "choices": [{
            "index": 0,
            "message": { "role": "assistant", "content": text, "refusal": null },
            "logprobs": null,
            "finish_reason": finish_reason,
        }],
    })
}
