//! A run's events as the management feed gives them (the event sinks' JSON lines, stored
//! or live) read back as what the Responses translator takes: pieces of output and the
//! run's end. Only what the translator uses is read (text, reasoning, tool calls, the
//! terminal event's fields), so a replay feeds it exactly what the first stream fed it.
//!
//! Pure: a line in, a value out.

use serde_json::Value;

use super::super::error::ApiError;
use super::super::output::Finished;
use crate::domain::{FailureClass, StructuredOutput, ToolCallDelta, Usage};

/// What one event of the run means to the translator.
#[derive(Debug)]
pub(super) enum Replayed {
    /// A piece of output: its text, and its reasoning and tool calls if it has any.
    Output(String, Option<StructuredOutput>),
    /// The run's end.
    End(Result<Finished, ApiError>),
    /// Nothing the answer shows (`started`, output with no text, reasoning or call).
    Skip,
}

/// The event of `kind` whose JSON line is `json`; failures carry `retry_after_secs`.
pub(super) fn replayed(kind: &str, json: &str, retry_after_secs: u64) -> Replayed {
    let Ok(event) = serde_json::from_str::<Value>(json) else {
        return Replayed::Skip;
    };
    let text = |field: &str| event[field].as_str().unwrap_or_default().to_owned();
    match kind {
        "output" => output(text("text"), &event),
        "completed" => {
            let finish_reason = Some(text("finish_reason"))
                .filter(|reason| !reason.is_empty())
                .unwrap_or_else(|| "stop".to_owned());
            Replayed::End(Ok(Finished {
                finish_reason,
                usage: usage(&event),
            }))
        }
        "failed" => {
            let status = event["status"].as_u64().and_then(|s| u16::try_from(s).ok());
            let (code, message) = (text("code"), text("message"));
            let class = FailureClass::Unspecified;
            let error = ApiError::run_failed(&code, &message, class, status, retry_after_secs);
            Replayed::End(Err(error))
        }
        "cancelled" => Replayed::End(Err(ApiError::run_cancelled(&text("reason")))),
        _ => Replayed::Skip,
    }
}

fn output(text: String, event: &Value) -> Replayed {
    let reasoning = event["reasoning"].as_str().unwrap_or_default().to_owned();
    let tool_calls: Vec<ToolCallDelta> = event["tool_calls"]
        .as_array()
        .map(|calls| calls.iter().map(tool_call).collect())
        .unwrap_or_default();
    let structured = (!reasoning.is_empty() || !tool_calls.is_empty()).then(|| StructuredOutput {
        reasoning,
        tool_calls,
        ..StructuredOutput::default()
    });
    if text.is_empty() && structured.is_none() {
        return Replayed::Skip;
    }
    Replayed::Output(text, structured)
}

fn tool_call(call: &Value) -> ToolCallDelta {
    let text = |field: &str| call[field].as_str().unwrap_or_default().to_owned();
    ToolCallDelta {
        index: call["index"]
            .as_u64()
            .and_then(|i| u32::try_from(i).ok())
            .unwrap_or_default(),
        id: text("id"),
        name: text("name"),
        arguments: text("arguments"),
    }
}

fn usage(event: &Value) -> Option<Usage> {
    let count = |field: &str| {
        event[field]
            .as_u64()
            .and_then(|n| u32::try_from(n).ok())
            .unwrap_or_default()
    };
    event.get("input_tokens").map(|_| Usage {
        input_tokens: count("input_tokens"),
        output_tokens: count("output_tokens"),
        cached_input_tokens: count("cached_input_tokens"),
        reasoning_tokens: count("reasoning_tokens"),
    })
}
