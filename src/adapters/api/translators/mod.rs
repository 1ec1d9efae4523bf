//! The APIs' translators, pure: each API's request → the chat body a run gets, and a run's
//! output → that API's answer and stream frames (OpenAI chunks, Anthropic Messages events,
//! Responses events), with the error the APIs answer with ([`ApiError`], plain data: a kind,
//! never an HTTP status). Nothing here imports axum, tokio or a handler, and nothing reads a
//! clock or does I/O (the layout test holds it to that): the handlers beside this module put
//! what it returns on the wire.
//!
//! This file holds what the translators of the APIs served as chat runs share: the request
//! translation's face ([`ChatTranslation`]), the typed events they produce ([`ApiEvent`])
//! and the streaming state machine ([`StreamTranslator`]).

pub(in crate::adapters::api) mod anthropic;
#[cfg(test)]
pub(in crate::adapters::api) mod client_fixtures;
mod error;
pub(in crate::adapters::api) mod frame;
pub(in crate::adapters::api) mod openai;
pub(in crate::adapters::api) mod output;
pub(in crate::adapters::api) mod responses;
mod resumable_stream;

pub use error::{ApiError, ErrorKind, Overflow};
pub(in crate::adapters::api) use resumable_stream::ResumableStream;

use serde_json::Value;

use crate::domain::{StructuredOutput, Usage};
use output::Finished;

/// What a request of another API becomes: a chat-completions body for one model.
pub(in crate::adapters::api) trait ChatTranslation {
    /// The model as the client named it.
    fn model(&self) -> &str;
    /// The chat-completions body (without `model` and `stream`) the run gets as input.
    fn chat(&self) -> &Value;
    /// Whether the client asked for a stream.
    fn stream(&self) -> bool;
    /// Whether the run outlives the caller's connection (Responses `background: true`).
    fn background(&self) -> bool {
        false
    }
    /// How its stream is rendered again for a caller that resumes it (`GET
    /// /v1/runs/{run_id}/stream`); `None` where the API resumes its own way, or not at all.
    fn resumable_stream(&self) -> Option<ResumableStream> {
        None
    }
}

/// One event of an API's stream: its SSE event name and its JSON data.
#[derive(Debug, Clone, PartialEq)]
pub(in crate::adapters::api) struct ApiEvent {
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
pub(in crate::adapters::api) trait StreamTranslator:
    Send + Unpin + 'static
{
    /// The events that open the stream, with the run's token counts when they are known by
    /// then (the prompt's, reported with the first output).
    fn open(&mut self, counts: Option<Usage>) -> Vec<ApiEvent>;
    /// The events of one piece of output: its text and its structured parts.
    fn output(&mut self, text: &str, structured: Option<&StructuredOutput>) -> Vec<ApiEvent>;
    /// The events that end the stream, after success or failure. Nothing may follow them.
    fn close(&mut self, end: Result<&Finished, &ApiError>) -> Vec<ApiEvent>;
    /// An event to send when the stream has been silent for a while, if the API has one.
    fn keep_alive(&self) -> Option<ApiEvent> {
        None
    }
}

/// A tool call's arguments as a JSON value: the parsed text, `{}` when empty, or the text
/// itself as a string when it is not JSON (the model's mistake, passed on rather than lost).
pub(in crate::adapters::api) fn arguments_value(arguments: &str) -> Value {
    if arguments.trim().is_empty() {
        return Value::Object(serde_json::Map::new());
    }
    serde_json::from_str(arguments).unwrap_or_else(|_| Value::String(arguments.to_owned()))
}

/// Generators of run-output sequences for the translators' property tests.
#[cfg(test)]
pub(in crate::adapters::api) mod strategies {
    use proptest::prelude::*;

    use super::output::Finished;
    use super::{ApiError, ApiEvent, StreamTranslator};
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
        let mut events = translator.open(None);
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
