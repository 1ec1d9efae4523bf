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

use super::openai::reply::unix_now;
use super::response::ErrorShape;
use super::routing::ClientKeys;
use super::translate::ChatApi;
use crate::domain::RunId;
use items::{Outcome, ResponseBase, collected_items, response_json};
use request::ResponsesRequest;
use stream::ResponsesStream;

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
            .map(|item| item.to_json(true))
            .collect();
        response_json(&base, &Outcome::Finished(finished), output)
    },
};

/// What every form of the response to `request` (run `run_id`) starts from.
fn base(request: ResponsesRequest, run_id: &RunId) -> ResponseBase {
    ResponseBase {
        id: format!("resp_{run_id}"),
        model: request.model,
        created_at: unix_now(),
        instructions: request.instructions,
        namespaces: request.namespaces,
    }
}
