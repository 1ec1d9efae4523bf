//! The Responses API's objects, shared by the whole answer and the stream: output items
//! (`message`, `reasoning`, `function_call`, a compaction's `compaction`), the `response`
//! object, usage and status.
//! Pure JSON building.

use std::collections::BTreeMap;

use serde_json::{Value, json};

use super::compaction::seal;
use crate::adapters::api::translators::ApiError;
use crate::adapters::api::translators::output::{Collected, Finished};
use crate::domain::Usage;

/// What the `response` object says of itself besides its output.
#[derive(Debug, Clone, PartialEq)]
pub(in crate::adapters::api) struct ResponseBase {
    /// `resp_<run id>`.
    pub id: String,
    /// The model as the client named it.
    pub model: String,
    /// Unix seconds.
    pub created_at: u64,
    /// The request's `instructions`, echoed.
    pub instructions: Value,
    /// The namespace of each function that came inside a `namespace` tool, by its name.
    pub namespaces: BTreeMap<String, String>,
    /// `background: true`: the response can be retrieved, resumed and cancelled by its id.
    pub background: bool,
    /// The request asked for a compaction: the answer is one `compaction` item.
    pub compaction: bool,
}

impl ResponseBase {
    /// A new `function_call` item `id` of the function `name`, its namespace looked up.
    pub fn call(&self, id: String, call_id: String, name: &str, arguments: String) -> Item {
        Item::Call {
            id,
            call_id,
            name: name.to_owned(),
            namespace: self.namespaces.get(name).cloned(),
            arguments,
        }
    }
}

/// Where an output item stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(in crate::adapters::api) enum ItemState {
    /// Still growing: shown without its content (the deltas carry it).
    InProgress,
    /// Done.
    Completed,
    /// Cut short by the response's failure: shown with what it had.
    Incomplete,
}

impl ItemState {
    /// The `status` the item shows.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::InProgress => "in_progress",
            Self::Completed => "completed",
            Self::Incomplete => "incomplete",
        }
    }
}

/// One output item as it grows.
#[derive(Debug, Clone, PartialEq)]
pub(in crate::adapters::api) enum Item {
    /// The assistant's text.
    Message { id: String, text: String },
    /// The model's reasoning.
    Reasoning { id: String, text: String },
    /// A function call; `namespace` when the function came inside a `namespace` tool.
    Call {
        id: String,
        call_id: String,
        name: String,
        namespace: Option<String>,
        arguments: String,
    },
    /// A compaction's summary, sealed (`compaction.rs`).
    Compaction {
        id: String,
        encrypted_content: String,
    },
}

impl Item {
    /// The item's id.
    pub fn id(&self) -> &str {
        match self {
            Self::Message { id, .. }
            | Self::Reasoning { id, .. }
            | Self::Call { id, .. }
            | Self::Compaction { id, .. } => id,
        }
    }

    /// The item as JSON in `state`: with its content once it is no longer in progress.
    pub fn to_json(&self, state: ItemState) -> Value {
        let status = state.as_str();
        let done = state != ItemState::InProgress;
        match self {
            Self::Message { id, text } => {
                let content = if done {
                    vec![text_part(text)]
                } else {
                    Vec::new()
                };
                json!({
                    "id": id, "type": "message", "status": status, "role": "assistant",
                    "content": content,
                })
            }
            Self::Reasoning { id, text } => {
                let content = if done {
                    vec![json!({ "type": "reasoning_text", "text": text })]
                } else {
                    Vec::new()
                };
                json!({ "id": id, "type": "reasoning", "summary": [], "content": content })
            }
            Self::Call {
                id,
                call_id,
                name,
                namespace,
                arguments,
            } => {
                let mut call = json!({
                    "id": id, "type": "function_call", "status": status, "call_id": call_id,
                    "name": name, "arguments": if done { arguments.as_str() } else { "" },
                });
                if let Some(namespace) = namespace {
                    call["namespace"] = json!(namespace);
                }
                call
            }
            Self::Compaction {
                id,
                encrypted_content,
            } => json!({ "id": id, "type": "compaction", "encrypted_content": encrypted_content }),
        }
    }
}

/// The one item a compaction answers with: `summary`, sealed.
pub(in crate::adapters::api) fn compaction_item(base: &ResponseBase, summary: &str) -> Item {
    Item::Compaction {
        id: format!("cmp_{}", base.id),
        encrypted_content: seal(summary),
    }
}

/// An `output_text` content part.
pub(in crate::adapters::api) fn text_part(text: &str) -> Value {
    json!({ "type": "output_text", "text": text, "annotations": [], "logprobs": [] })
}

/// The output items of a whole run: reasoning, the message (unless the answer is only
/// tool calls), then the function calls; a compaction's one `compaction` item.
pub(in crate::adapters::api) fn collected_items(
    base: &ResponseBase,
    collected: &Collected,
) -> Vec<Item> {
    if base.compaction {
        return vec![compaction_item(base, &collected.text)];
    }
    let mut items = Vec::new();
    if !collected.reasoning.is_empty() {
        items.push(Item::Reasoning {
            id: format!("rs_{}_0", base.id),
            text: collected.reasoning.clone(),
        });
    }
    if !collected.text.is_empty() || collected.tool_calls.is_empty() {
        items.push(Item::Message {
            id: format!("msg_{}_{}", base.id, items.len()),
            text: collected.text.clone(),
        });
    }
    for call in &collected.tool_calls {
        let id = format!("fc_{}_{}", base.id, items.len());
        let call_id = call_id(base, &call.id, call.index);
        items.push(base.call(id, call_id, &call.name, call.arguments.clone()));
    }
    items
}

/// A call's `call_id`: the node's id, or one made from the response and the call's index.
pub(in crate::adapters::api) fn call_id(base: &ResponseBase, id: &str, index: u32) -> String {
    if id.is_empty() {
        format!("call_{}_{index}", base.id)
    } else {
        id.to_owned()
    }
}

/// How the run ended, as the response's `status`, `incomplete_details` and `error`.
pub(in crate::adapters::api) enum Outcome<'a> {
    /// Still running (`response.created`, `response.in_progress`).
    InProgress,
    /// Completed: `completed`, or `incomplete` for `length` and `content_filter`.
    Finished(&'a Finished),
    /// Failed.
    Failed(&'a ApiError),
}

/// The `response` object.
pub(in crate::adapters::api) fn response_json(
    base: &ResponseBase,
    outcome: &Outcome<'_>,
    output: Vec<Value>,
) -> Value {
    let (status, incomplete, error, usage) = match outcome {
        Outcome::InProgress => ("in_progress", Value::Null, Value::Null, Value::Null),
        Outcome::Finished(finished) => {
            let usage = finished.usage.map_or(Value::Null, usage_json);
            match finished.finish_reason.as_str() {
                "length" => (
                    "incomplete",
                    json!({ "reason": "max_output_tokens" }),
                    Value::Null,
                    usage,
                ),
                "content_filter" => (
                    "incomplete",
                    json!({ "reason": "content_filter" }),
                    Value::Null,
                    usage,
                ),
                _ => ("completed", Value::Null, Value::Null, usage),
            }
        }
        Outcome::Failed(error) => {
            let cancelled = error.error_code() == Some("run_cancelled");
            let error = json!({
                "code": error.error_code().unwrap_or("server_error"),
                "message": error.message(),
            });
            let status = if cancelled { "cancelled" } else { "failed" };
            (status, Value::Null, error, Value::Null)
        }
    };
    json!({
        "id": base.id,
        "object": "response",
        "created_at": base.created_at,
        "status": status,
        "model": base.model,
        "output": output,
        "instructions": base.instructions,
        "incomplete_details": incomplete,
        "error": error,
        "usage": usage,
        "metadata": {},
        "parallel_tool_calls": true,
        "tool_choice": "auto",
        "tools": [],
        "temperature": null,
        "top_p": null,
        "store": base.background,
        "background": base.background,
    })
}

/// The Responses usage object.
pub(in crate::adapters::api) fn usage_json(usage: Usage) -> Value {
    json!({
        "input_tokens": usage.input_tokens,
        "input_tokens_details": { "cached_tokens": usage.cached_input_tokens },
        "output_tokens": usage.output_tokens,
        "output_tokens_details": { "reasoning_tokens": usage.reasoning_tokens },
        "total_tokens": u64::from(usage.input_tokens) + u64::from(usage.output_tokens),
    })
}

/// The terminal event's name for an outcome.
pub(in crate::adapters::api) fn terminal_event(outcome: &Outcome<'_>) -> &'static str {
    match outcome {
        Outcome::InProgress => "response.in_progress",
        Outcome::Finished(finished)
            if matches!(finished.finish_reason.as_str(), "length" | "content_filter") =>
        {
            "response.incomplete"
        }
        Outcome::Finished(_) => "response.completed",
        Outcome::Failed(_) => "response.failed",
    }
}
