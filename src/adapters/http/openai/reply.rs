//! The answer's envelope: the ids, timestamps and model name every JSON answer and SSE
//! chunk carries, and the choice between the chat and the completion shapes.

use std::time::{SystemTime, UNIX_EPOCH};

use serde_json::{Value, json};

use super::request::Endpoint;
use super::run::Finished;
use super::{chat, completions};
use crate::domain::{RunId, Usage};

/// One part of a streamed answer.
#[derive(Debug, Clone, Copy)]
pub(super) enum Piece<'a> {
    /// The opening chunk (chat: the assistant role).
    Start,
    /// Some text.
    Text(&'a str),
    /// The closing chunk with the finish reason.
    Finish(&'a str),
    /// The usage chunk of `stream_options.include_usage`.
    Usage(Option<Usage>),
}

/// What every part of one answer shares.
#[derive(Debug, Clone)]
pub(super) struct Reply {
    /// Which endpoint's shape.
    pub endpoint: Endpoint,
    /// The answer's id (`chatcmpl-<run id>`, `cmpl-<run id>`).
    pub id: String,
    /// Unix seconds.
    pub created: u64,
    /// The model as the client named it.
    pub model: String,
    /// Whether chunks carry `usage` and a usage chunk closes the stream.
    pub include_usage: bool,
}

impl Reply {
    /// The envelope of the answer to run `run_id`.
    pub fn new(endpoint: Endpoint, run_id: &RunId, model: String, include_usage: bool) -> Self {
        let prefix = match endpoint {
            Endpoint::Chat => "chatcmpl",
            Endpoint::Completion => "cmpl",
        };
        Self {
            endpoint,
            id: format!("{prefix}-{run_id}"),
            created: SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(0, |d| d.as_secs()),
            model,
            include_usage,
        }
    }

    /// The non-streaming answer.
    pub fn full(&self, text: &str, finished: &Finished) -> Value {
        let mut body = match self.endpoint {
            Endpoint::Chat => chat::full(self, text, &finished.finish_reason),
            Endpoint::Completion => completions::full(self, text, &finished.finish_reason),
        };
        if let Some(usage) = finished.usage {
            body["usage"] = usage_json(usage);
        }
        body
    }

    /// The `object` of a chunk.
    pub fn chunk_object(&self) -> &'static str {
        match self.endpoint {
            Endpoint::Chat => "chat.completion.chunk",
            Endpoint::Completion => "text_completion",
        }
    }
}

/// OpenAI's usage object.
pub(super) fn usage_json(usage: Usage) -> Value {
    json!({
        "prompt_tokens": usage.input_tokens,
        "completion_tokens": usage.output_tokens,
        "total_tokens": u64::from(usage.input_tokens) + u64::from(usage.output_tokens),
    })
}
