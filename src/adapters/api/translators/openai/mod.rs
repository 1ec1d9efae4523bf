//! OpenAI's own shapes for chat completions and completions: which endpoint an answer is
//! for ([`Endpoint`]), the envelope every part of one answer carries ([`Reply`]), the whole
//! answer (`chat.completion`, `text_completion`) and the streamed chunks ([`chunks`]).

pub(in crate::adapters::api) mod chunks;

use serde_json::{Value, json};

use super::output::{
    Collected, Finished, chat_logprobs_json, legacy_logprobs_json, tool_calls_json, usage_json,
};
use crate::domain::{Operation, RunId};

/// Which endpoint a request came to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(in crate::adapters::api) enum Endpoint {
    /// `POST /v1/chat/completions`.
    Chat,
    /// `POST /v1/completions`.
    Completion,
}

impl Endpoint {
    /// The kind of work the endpoint's runs ask of a node.
    pub fn operation(self) -> Operation {
        match self {
            Self::Chat => Operation::Chat,
            Self::Completion => Operation::Completion,
        }
    }

    /// The field the endpoint cannot do without.
    pub fn required(self) -> &'static str {
        match self {
            Self::Chat => "messages",
            Self::Completion => "prompt",
        }
    }
}

/// What every part of one answer shares.
#[derive(Debug, Clone)]
pub(in crate::adapters::api) struct Reply {
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
    /// The envelope of the answer to run `run_id`, made at `created` (Unix seconds).
    pub fn new(
        endpoint: Endpoint,
        run_id: &RunId,
        model: String,
        created: u64,
        include_usage: bool,
    ) -> Self {
        let prefix = match endpoint {
            Endpoint::Chat => "chatcmpl",
            Endpoint::Completion => "cmpl",
        };
        Self {
            endpoint,
            id: format!("{prefix}-{run_id}"),
            created,
            model,
            include_usage,
        }
    }

    /// The non-streaming answer.
    pub fn full(&self, collected: &Collected, finished: &Finished) -> Value {
        let mut body = match self.endpoint {
            Endpoint::Chat => chat_completion(self, collected, &finished.finish_reason),
            Endpoint::Completion => text_completion(self, collected, &finished.finish_reason),
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

/// A `chat.completion` with one choice (usage is added by the caller): the text, the
/// reasoning as `reasoning_content`, the tool calls (`content` null when there are only
/// tool calls), and the log probabilities.
fn chat_completion(reply: &Reply, collected: &Collected, finish_reason: &str) -> Value {
    let content = if collected.text.is_empty() && !collected.tool_calls.is_empty() {
        Value::Null
    } else {
        Value::from(collected.text.as_str())
    };
    let mut message = json!({ "role": "assistant", "content": content, "refusal": null });
    if !collected.reasoning.is_empty() {
        message["reasoning_content"] = Value::from(collected.reasoning.as_str());
    }
    if !collected.tool_calls.is_empty() {
        message["tool_calls"] = tool_calls_json(&collected.tool_calls);
    }
    json!({
        "id": reply.id,
        "object": "chat.completion",
        "created": reply.created,
        "model": reply.model,
        "system_fingerprint": null,
        "choices": [{
            "index": 0,
            "message": message,
            "logprobs": chat_logprobs_json(&collected.logprobs),
            "finish_reason": finish_reason,
        }],
    })
}

/// A `text_completion` with one choice (usage is added by the caller), with the legacy
/// `logprobs` when the node sent any.
fn text_completion(reply: &Reply, collected: &Collected, finish_reason: &str) -> Value {
    json!({
        "id": reply.id,
        "object": "text_completion",
        "created": reply.created,
        "model": reply.model,
        "system_fingerprint": null,
        "choices": [{
            "text": collected.text,
            "index": 0,
            "logprobs": legacy_logprobs_json(&collected.logprobs, &mut 0),
            "finish_reason": finish_reason,
        }],
    })
}
