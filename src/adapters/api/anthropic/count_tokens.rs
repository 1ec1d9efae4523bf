//! `POST /v1/messages/count_tokens`: Anthropic's token count of a Messages request, answered
//! `{"input_tokens": N}` with the engine's own tokenizer. The request is translated exactly as
//! `POST /v1/messages` translates it (its `max_tokens`, which this endpoint does not take, is
//! read as 1, and `stream` is ignored), and the chat body goes to a node as one tokenize run,
//! routed as the Messages request would be; the node counts the prompt the engine would see
//! for it (chat template applied). Errors are in Anthropic's shape.

use axum::Json;
use axum::extract::State;
use axum::extract::rejection::BytesRejection;
use axum::http::HeaderMap;
use axum::response::{IntoResponse as _, Response};
use bytes::Bytes;
use serde_json::{Value, json};

use super::MESSAGES;
use crate::adapters::api::ApiError;
use crate::adapters::api::ApiState;
use crate::adapters::api::auth::Caller;
use crate::adapters::api::response::ErrorShape;
use crate::adapters::api::run;
use crate::adapters::api::translate::chat_run;
use crate::adapters::api::translators::anthropic::request::{self, MessagesRequest};
use crate::domain::Operation;

/// Where Anthropic serves it.
pub(in crate::adapters::api) const COUNT_TOKENS_PATH: &str = "/v1/messages/count_tokens";

/// `POST /v1/messages/count_tokens`.
pub(in crate::adapters::api) async fn count(
    State(state): State<ApiState>,
    caller: Caller,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    let keys = MESSAGES.keys;
    let tokenize = Operation::Tokenize;
    let prepared = chat_run(&state, &caller, &headers, body, counted, keys, tokenize);
    let (request, spec) = match prepared {
        Ok(prepared) => prepared,
        Err(error) => return ErrorShape::Anthropic.render(&error),
    };
    let mut run = match run::start(&state, spec, &request.model) {
        Ok(run) => run,
        Err(error) => return ErrorShape::Anthropic.render(&error),
    };
    let response = match run::tokens(&mut run).await {
        Ok((_, count)) => Json(json!({ "input_tokens": count })).into_response(),
        Err(error) => ErrorShape::Anthropic.render(&error),
    };
    run::with_headers(response, &run.headers())
}

/// The Messages translation of a count request, which carries no `max_tokens` and never
/// streams.
fn counted(body: &Value) -> Result<MessagesRequest, ApiError> {
    let mut body = body.clone();
    if let Some(object) = body.as_object_mut() {
        object.entry("max_tokens").or_insert(json!(1));
        object.remove("stream");
    }
    request::translate(&body)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::adapters::api::translators::ChatTranslation as _;

    #[test]
    fn a_count_request_translates_as_messages_would() {
        let body = json!({
            "model": "llama/tiny",
            "system": [{"type": "text", "text": "Be brief."}],
            "messages": [{"role": "user", "content": "Hi"}],
            "tools": [{"name": "Read", "input_schema": {"type": "object"}}],
            "stream": true,
        });
        let request = counted(&body).unwrap();
        let mut messages = body.clone();
        messages["max_tokens"] = json!(1);
        messages["stream"] = json!(false);
        let whole = request::translate(&messages).unwrap();
        assert_eq!(request.chat(), whole.chat());
        assert!(!request.stream());
        assert!(counted(&json!({"messages": []})).is_err());
    }
}
