//! `POST /v1/responses`: OpenAI's Responses API, whole and streamed, with OpenAI's error
//! shape. A request is translated ([`request`]) into the chat body the chat endpoint would
//! send, and runs as a chat run, so any node that serves chat serves Responses; the run's
//! events are translated back ([`stream`], [`items`]). A `background: true` response
//! outlives its caller's connection and is found again by its id ([`stored`]:
//! `GET /v1/responses/{id}`, resumable streams, `POST /v1/responses/{id}/cancel`).
//!
//! `GET /v1/responses` with a WebSocket upgrade (Codex's built-in provider tries one first) is
//! answered 426, which sends Codex to HTTP at once ([`websocket`]).
//!
//! This module is the HTTP plumbing; the translators are pure.

mod stored;

use axum::http::{HeaderMap, HeaderValue, header};
use axum::response::{IntoResponse, Response};

use super::ApiError;
use super::openai::reply::unix_now;
use super::response::ErrorShape;
use super::routing::ClientKeys;
use super::translate::ChatApi;
use crate::adapters::api::translators::responses::items::{
    ItemState, Outcome, ResponseBase, collected_items, response_json,
};
pub(super) use crate::adapters::api::translators::responses::replay::{Replayed, replayed};
use crate::adapters::api::translators::responses::request::{self, ResponsesRequest};
use crate::adapters::api::translators::responses::stream::ResponsesStream;
use crate::domain::RunId;
pub(super) use stored::{cancel, retrieve};

/// The prefix of a background response's id; the run's id follows it.
const BACKGROUND_ID_PREFIX: &str = "resp_bg_";

/// Responses as a chat run, with OpenAI's error shape.
pub(super) const RESPONSES: ChatApi<ResponsesRequest, ResponsesStream> = ChatApi {
    translate: request::translate,
    keys: |value| ClientKeys::of(value),
    error_shape: ErrorShape::OpenAi,
    stream: |request, run_id| ResponsesStream::new(base(request, run_id)),
    whole: |request, run_id, collected, finished| {
        let base = base(request, run_id);
        let output = collected_items(&base, collected)
            .iter()
            .map(|item| item.to_json(ItemState::Completed))
            .collect();
        response_json(&base, &Outcome::Finished(finished), output)
    },
    accepted: Some(|request, run_id| {
        response_json(&base(request, run_id), &Outcome::InProgress, Vec::new())
    }),
};

/// What every form of the response to `request` (run `run_id`) starts from.
fn base(request: ResponsesRequest, run_id: &RunId) -> ResponseBase {
    ResponseBase {
        id: response_id(run_id, request.background),
        model: request.model,
        created_at: unix_now(),
        instructions: request.instructions,
        namespaces: request.namespaces,
        background: request.background,
        compaction: request.compaction,
    }
}

/// The id of run `run_id`'s response: `resp_bg_<run id>` for a background one (so the run
/// is found from the id alone, after an edge restart too), else `resp_<run id>`.
fn response_id(run_id: &RunId, background: bool) -> String {
    if background {
        format!("{BACKGROUND_ID_PREFIX}{run_id}")
    } else {
        format!("resp_{run_id}")
    }
}

/// `GET /v1/responses`: Responses are served over HTTP only. A WebSocket upgrade gets 426
/// (with `Upgrade: HTTP/1.1`, the protocol to use): Codex then falls back to HTTP for the
/// session at once, where any other refusal costs it five retries, about 6.5 s, every turn.
/// A plain `GET` gets 405.
pub(super) async fn websocket(headers: HeaderMap) -> Response {
    const PATH: &str = "/v1/responses";
    let upgrade = headers
        .get_all(header::UPGRADE)
        .iter()
        .filter_map(|value| value.to_str().ok())
        .flat_map(|value| value.split(','))
        .any(|protocol| protocol.trim().eq_ignore_ascii_case("websocket"));
    let (error, name, value) = if upgrade {
        let error = ApiError::websocket_not_supported(PATH);
        (error, header::UPGRADE, "HTTP/1.1")
    } else {
        (
            ApiError::method_not_allowed("GET", PATH, "POST"),
            header::ALLOW,
            "POST",
        )
    };
    let mut response = error.into_response();
    response
        .headers_mut()
        .insert(name, HeaderValue::from_static(value));
    response
}
