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

use super::auth::Caller;
use super::reply::unix_now;
use super::routing::ClientKeys;
use super::run::{self, Step};
use super::sse;
use super::translate::{NamedEvents, chat_run};
use crate::adapters::http::HttpState;
use items::{Outcome, ResponseBase, collected_items, response_json};
use stream::ResponsesStream;

/// `POST /v1/responses`.
pub(super) async fn create(
    State(state): State<HttpState>,
    caller: Caller,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    let prepared = chat_run(
        &state,
        &caller,
        &headers,
        body,
        request::translate,
        |value| ClientKeys::of(value),
    );
    let (translated, spec) = match prepared {
        Ok(prepared) => prepared,
        Err(error) => return error.into_response(),
    };
    let mut run = match run::start(&state, spec, &translated.model) {
        Ok(run) => run,
        Err(error) => return error.into_response(),
    };
    let base = ResponseBase {
        id: format!("resp_{}", run.id()),
        model: translated.model,
        created_at: unix_now(),
        instructions: translated.instructions,
    };
    let (response, headers) = if translated.stream {
        let first = run.next().await;
        let headers = run.headers();
        let response = match first {
            Step::End(Err(error)) => error.into_response(),
            first => sse::respond(run, NamedEvents(ResponsesStream::new(base)), first),
        };
        (response, headers)
    } else {
        let response = match run::collect(&mut run).await {
            Ok((collected, finished)) => {
                let output = collected_items(&base, &collected)
                    .iter()
                    .map(|item| item.to_json(true))
                    .collect();
                Json(response_json(&base, &Outcome::Finished(&finished), output)).into_response()
            }
            Err(error) => error.into_response(),
        };
        (response, run.headers())
    };
    run::with_headers(response, &headers)
}
