//! `POST /v1/completions` (legacy text completions): the whole `text_completion` (its
//! streamed chunks are written by `sse.rs`). The request goes to the node as it came,
//! without `model` and `stream`.

use axum::extract::State;
use axum::extract::rejection::BytesRejection;
use axum::http::HeaderMap;
use axum::response::Response;
use bytes::Bytes;

use super::reply;
use crate::adapters::api::ApiState;
use crate::adapters::api::auth::Caller;
use crate::adapters::api::translators::openai::Endpoint;

/// `POST /v1/completions`.
pub(in crate::adapters::api) async fn create(
    State(state): State<ApiState>,
    caller: Caller,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    reply::respond(state, Endpoint::Completion, caller, headers, body).await
}
