//! `POST /v1/chat/completions`: the chat shapes (`chat.completion` and
//! `chat.completion.chunk`). The request itself goes to the node as it came, without
//! `model` and `stream`.

use axum::extract::State;
use axum::extract::rejection::BytesRejection;
use axum::http::HeaderMap;
use axum::response::Response;
use bytes::Bytes;
use serde_json::{Value, json};

use super::reply::{Piece, Reply};
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

/// A `chat.completion.chunk`: the role first, then content deltas, then an empty delta
/// with the finish reason.
pub(super) fn chunk(reply: &Reply, piece: Piece<'_>) -> Option<Value> {
    let (delta, finish_reason) = match piece {
        Piece::Start => (json!({ "role": "assistant", "content": "" }), Value::Null),
        Piece::Text(text) => (json!({ "content": text }), Value::Null),
        Piece::Finish(reason) => (json!({}), Value::from(reason)),
        Piece::Usage(_) => return None,
    };
    Some(reply.chunk_envelope(json!([{
        "index": 0,
        "delta": delta,
        "logprobs": null,
        "finish_reason": finish_reason,
    }])))
}
