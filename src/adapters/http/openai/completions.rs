//! `POST /v1/completions` (legacy text completions): the `text_completion` shape, whole or
//! in chunks. The request goes to the node as it came, without `model` and `stream`.

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

/// `POST /v1/completions`.
pub(super) async fn create(
    State(state): State<HttpState>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    run::respond(state, Endpoint::Completion, headers, body).await
}

/// A `text_completion` with one choice (usage is added by the caller).
pub(super) fn full(reply: &Reply, text: &str, finish_reason: &str) -> Value {
    json!({
        "id": reply.id,
        "object": "text_completion",
        "created": reply.created,
        "model": reply.model,
        "system_fingerprint": null,
        "choices": [{
            "text": text,
            "index": 0,
            "logprobs": null,
            "finish_reason": finish_reason,
        }],
    })
}

/// A streamed `text_completion`: text pieces, then an empty text with the finish reason.
/// There is no opening chunk.
pub(super) fn chunk(reply: &Reply, piece: Piece<'_>) -> Option<Value> {
    let (text, finish_reason) = match piece {
        Piece::Start | Piece::Usage(_) => return None,
        Piece::Text(text) => (text, Value::Null),
        Piece::Finish(reason) => ("", Value::from(reason)),
    };
    Some(reply.chunk_envelope(json!([{
        "text": text,
        "index": 0,
        "logprobs": null,
        "finish_reason": finish_reason,
    }])))
}
