//! `POST /v1/chat/completions`: the whole chat answer (`chat.completion`; the streamed
//! `chat.completion.chunk`s are written by `sse.rs`). The request itself goes to the node as
//! it came, without `model` and `stream`.

use axum::extract::State;
use axum::extract::rejection::BytesRejection;
use axum::http::HeaderMap;
use axum::response::Response;
use bytes::Bytes;

use super::reply;
use crate::adapters::api::ApiState;
use crate::adapters::api::auth::Caller;
use crate::adapters::api::translators::openai::Endpoint;

/// `POST /v1/chat/completions`.
pub(in crate::adapters::api) async fn create(
    State(state): State<ApiState>,
    caller: Caller,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    reply::respond(state, Endpoint::Chat, caller, headers, body).await
}
