//! What the translators of the Anthropic Messages and Responses APIs share: reading a
//! request into the chat run it becomes ([`chat_run`]), the one handler both endpoints are
//! ([`serve_chat_run`] over a [`ChatApi`]), the typed events they produce from run events,
//! and the [`EventWriter`] that writes them as named SSE events. The translators themselves
//! are pure state machines (run output in, API events out); this module is the only place
//! they meet the HTTP body.

use axum::Json;
use axum::extract::rejection::BytesRejection;
use axum::http::HeaderMap;
use axum::response::{IntoResponse as _, Response};
use bytes::{Bytes, BytesMut};
use serde_json::Value;

use super::auth::Caller;
use super::error::ApiError;
use super::output::Collected;
use super::request::{deadline, read_body, run_spec};
use super::routing::{ClientKeys, prefix_of_value, run_routing};
use super::run::{self, Finished, Output, Step};
use super::sse::{self, EventWriter, push_named_event};
use crate::adapters::http::HttpState;
use crate::domain::{Operation, RunId, RunSpec, StructuredOutput};

/// What a request of another API becomes: a chat-completions body for one model.
pub(super) trait ChatTranslation {
    /// The model as the client named it.
    fn model(&self) -> &str;
    /// The chat-completions body (without `model` and `stream`) the run gets as input.
    fn chat(&self) -> &Value;
    /// Whether the client asked for a stream.
    fn stream(&self) -> bool;
}

/// One API served as a chat run: how its requests translate, where its client keys are,
/// its error shape, and its answers — streamed through a translator, or whole.
pub(super) struct ChatApi<T, S> {
    /// The request translator.
    pub translate: fn(&Value) -> Result<T, ApiError>,
    /// The client keys (user, session) in a request.
    pub keys: fn(&Value) -> ClientKeys<'_>,
    /// An error as the API's response.
    pub error_response: fn(&ApiError) -> Response,
    /// The stream translator answering the request of run `run_id`.
    pub stream: fn(T, &RunId) -> S,
    /// The whole answer to the request of run `run_id`.
    pub whole: fn(T, &RunId, &Collected, &Finished) -> Value,
}

/// The handler of an API served as a chat run ([`ChatApi`]): reads and translates the
/// request ([`chat_run`]), starts the run, and answers streamed or whole, with the run's
/// headers; every error in the API's shape.
pub(super) async fn serve_chat_run<T: ChatTranslation, S: StreamTranslator>(
    api: &ChatApi<T, S>,
    state: &HttpState,
    caller: &Caller,
    headers: &HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    let error_response = api.error_response;
    let (translated, spec) = match chat_run(state, caller, headers, body, api.translate, api.keys) {
        Ok(prepared) => prepared,
        Err(error) => return error_response(&error),
    };
    let mut run = match run::start(state, spec, translated.model()) {
        Ok(run) => run,
        Err(error) => return error_response(&error),
    };
    let run_id = run.id().clone();
    let (response, headers) = if translated.stream() {
        let first = run.next().await;
        let headers = run.headers();
        let response = match first {
            Step::End(Err(error)) => error_response(&error),
            first => sse::respond(run, NamedEvents((api.stream)(translated, &run_id)), first),
        };
        (response, headers)
    } else {
        let response = match run::collect(&mut run).await {
            Ok((collected, finished)) => {
                Json((api.whole)(translated, &run_id, &collected, &finished)).into_response()
            }
            Err(error) => error_response(&error),
        };
        (response, run.headers())
    };
    run::with_headers(response, &headers)
}

/// Reads a JSON request `body`, translates it with `translate`, and builds the chat run it
/// becomes: its deadline from `headers`, its routing from `caller`, `headers`, the client
/// keys `keys` finds in the request, or the chat prompt's prefix.
///
/// # Errors
/// The body's or the translation's 4xx, an unknown model, a bad header.
pub(super) fn chat_run<T: ChatTranslation>(
    state: &HttpState,
    caller: &Caller,
    headers: &HeaderMap,
    body: Result<Bytes, BytesRejection>,
    translate: impl FnOnce(&Value) -> Result<T, ApiError>,
    keys: fn(&Value) -> ClientKeys<'_>,
) -> Result<(T, RunSpec), ApiError> {
    let body = read_body(&state.api, body)?;
    let value: Value = serde_json::from_slice(&body)
        .map_err(|error| ApiError::malformed_json(&error.to_string()))?;
    let translated = translate(&value)?;
    let deadline = deadline(&state.api, headers)?;
    let prefix = state.api.prefix_affinity();
    let chat = translated.chat();
    let routing = run_routing(caller, headers, keys(&value), || {
        prefix.then(|| prefix_of_value(chat)).flatten()
    })?;
    let input = Bytes::from(chat.to_string());
    let model = translated.model();
    let spec = run_spec(&state.api, model, input, Operation::Chat, deadline, routing)?;
    Ok((translated, spec))
}

/// One event of an API's stream: its SSE event name and its JSON data.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct ApiEvent {
    /// The SSE `event:` name (`message_start`, `response.output_text.delta`, ...).
    pub name: &'static str,
    /// The SSE `data:`.
    pub data: Value,
}

impl ApiEvent {
    /// An event named `name` with `data`.
    pub fn new(name: &'static str, data: Value) -> Self {
        Self { name, data }
    }
}

/// A per-API streaming state machine: run output in, the API's events out. Pure: no I/O,
/// no clock.
pub(super) trait StreamTranslator: Send + Unpin + 'static {
    /// The events that open the stream.
    fn open(&mut self) -> Vec<ApiEvent>;
    /// The events of one piece of output: its text and its structured parts.
    fn output(&mut self, text: &str, structured: Option<&StructuredOutput>) -> Vec<ApiEvent>;
    /// The events that end the stream, after success or failure. Nothing may follow them.
    fn close(&mut self, end: Result<&Finished, &ApiError>) -> Vec<ApiEvent>;
    /// An event to send when the stream has been silent for a while, if the API has one.
    fn keep_alive(&self) -> Option<ApiEvent> {
        None
    }
}

/// Writes a [`StreamTranslator`]'s events as named SSE events.
pub(super) struct NamedEvents<T>(pub T);

impl<T: StreamTranslator> EventWriter for NamedEvents<T> {
    fn open(&mut self, frame: &mut BytesMut) {
        write_all(frame, self.0.open());
    }

    fn output(&mut self, output: &Output, frame: &mut BytesMut) {
        write_all(frame, self.0.output(output.text(), output.structured()));
    }

    fn close(&mut self, end: Result<Finished, ApiError>, frame: &mut BytesMut) {
        write_all(frame, self.0.close(end.as_ref()));
    }

    fn keep_alive(&self) -> bytes::Bytes {
        match self.0.keep_alive() {
            Some(event) => {
                let mut frame = BytesMut::new();
                push_named_event(&mut frame, event.name, &event.data);
                frame.freeze()
            }
            None => bytes::Bytes::from_static(super::sse::KEEP_ALIVE_COMMENT),
        }
    }
}

fn write_all(frame: &mut BytesMut, events: Vec<ApiEvent>) {
    for event in events {
        push_named_event(frame, event.name, &event.data);
    }
}

/// A tool call's arguments as a JSON value: the parsed text, `{}` when empty, or the text
/// itself as a string when it is not JSON (the model's mistake, passed on rather than lost).
pub(super) fn arguments_value(arguments: &str) -> Value {
    if arguments.trim().is_empty() {
        return Value::Object(serde_json::Map::new());
    }
    serde_json::from_str(arguments).unwrap_or_else(|_| Value::String(arguments.to_owned()))
}

/// Generators of run-output sequences for the translators' property tests.
#[cfg(test)]
pub(super) mod strategies {
    use proptest::prelude::*;

    use super::super::error::ApiError;
    use super::super::run::Finished;
    use super::{ApiEvent, StreamTranslator};
    use crate::domain::{StructuredOutput, ToolCallDelta, Usage};

    /// One piece of run output, for generating event sequences.
    #[derive(Debug, Clone)]
    pub(in crate::adapters::api) enum Piece {
        Text(String),
        Reasoning(String),
        Tool {
            index: u32,
            name: String,
            arguments: String,
        },
    }

    pub(in crate::adapters::api) fn piece() -> impl Strategy<Value = Piece> {
        prop_oneof![
            ".{0,6}".prop_map(Piece::Text),
            ".{0,6}".prop_map(Piece::Reasoning),
            (0u32..3, "[a-z]{0,3}", ".{0,5}").prop_map(|(index, name, arguments)| Piece::Tool {
                index,
                name,
                arguments
            }),
        ]
    }

    /// A terminal: a completion with a finish reason, or a failure.
    pub(in crate::adapters::api) fn end() -> impl Strategy<Value = Result<Finished, ApiError>> {
        prop_oneof![
            prop_oneof![
                Just("stop"),
                Just("length"),
                Just("tool_calls"),
                Just("content_filter"),
                Just("")
            ]
            .prop_map(|reason| Ok(Finished {
                finish_reason: reason.to_owned(),
                usage: Some(Usage::new(2, 3))
            })),
            Just(Err(ApiError::internal("boom"))),
        ]
    }

    /// Feeds `pieces` and `end` to `translator`; returns every event.
    pub(in crate::adapters::api) fn play(
        translator: &mut impl StreamTranslator,
        pieces: &[Piece],
        end: &Result<Finished, ApiError>,
    ) -> Vec<ApiEvent> {
        let mut events = translator.open();
        for piece in pieces {
            let (text, structured) = output_of(piece);
            events.extend(translator.output(text, structured.as_ref()));
        }
        events.extend(translator.close(end.as_ref()));
        events
    }

    /// The run output `piece` stands for: its text and its structured parts.
    pub(in crate::adapters::api) fn output_of(piece: &Piece) -> (&str, Option<StructuredOutput>) {
        match piece {
            Piece::Text(text) => (text.as_str(), None),
            Piece::Reasoning(reasoning) => (
                "",
                Some(StructuredOutput {
                    reasoning: reasoning.clone(),
                    ..StructuredOutput::default()
                }),
            ),
            Piece::Tool {
                index,
                name,
                arguments,
            } => (
                "",
                Some(StructuredOutput {
                    tool_calls: vec![ToolCallDelta {
                        index: *index,
                        id: String::new(),
                        name: name.clone(),
                        arguments: arguments.clone(),
                    }],
                    ..StructuredOutput::default()
                }),
            ),
        }
    }
}
