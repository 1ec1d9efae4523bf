//! `POST /v1/responses`: OpenAI's Responses API, stateless, whole and streamed, with
//! OpenAI's error shape. A request is translated ([`request`]) into the chat body the chat
//! endpoint would send, and runs as a chat run, so any node that serves chat serves
//! Responses; the run's events are translated back ([`stream`], [`items`]).
//!
//! This module is the HTTP plumbing; the translators are pure.

mod items;
mod request;
mod stream;
#[cfg(test)]
mod tests;

use axum::Json;
use axum::extract::State;
use axum::extract::rejection::BytesRejection;
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use serde_json::Value;

use super::error::ApiError;
use super::reply::unix_now;
use super::request::{deadline, read_body, run_spec};
use super::run::{self, Step};
use super::sse;
use super::translate::NamedEvents;
use crate::adapters::http::HttpState;
use crate::domain::Operation;
use items::{Outcome, ResponseBase, collected_items, response_json};
use stream::ResponsesStream;

/// `POST /v1/responses`.
pub(super) async fn create(
    State(state): State<HttpState>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    let prepared = read_body(&state.api, body).and_then(|body| {
        let value: Value = serde_json::from_slice(&body)
            .map_err(|error| ApiError::malformed_json(&error.to_string()))?;
        let translated = request::translate(&value)?;
        let deadline = deadline(&state.api, &headers)?;
        let input = Bytes::from(translated.chat.to_string());
        let spec = run_spec(
            &state.api,
            &translated.model,
            input,
            Operation::Chat,
            deadline,
        )?;
        Ok((translated, spec))
    });
    let (translated, spec) = match prepared {
        Ok(prepared) => prepared,
        Err(error) => return error.into_response(),
    };
    let mut run = match run::start(&state, spec, &translated.model) {
        Ok(run) => run,
        Err(error) => return error.into_response(),
    };
    let run_id = run.id().clone();
    let base = ResponseBase {
        id: format!("resp_{run_id}"),
        model: translated.model,
        created_at: unix_now(),
        instructions: translated.instructions,
    };
    let response = if translated.stream {
        match run.next().await {
            Step::End(Err(error)) => error.into_response(),
            first => sse::respond(run, NamedEvents(ResponsesStream::new(base)), first),
        }
    } else {
        match run::collect(run).await {
            Ok((collected, finished)) => {
                let output = collected_items(&base, &collected)
                    .iter()
                    .map(|item| item.to_json(true))
                    .collect();
                Json(response_json(&base, &Outcome::Finished(&finished), output)).into_response()
            }
            Err(error) => error.into_response(),
        }
    };
    run::with_run_id(response, &run_id)
}
