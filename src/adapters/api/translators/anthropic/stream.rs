//! Run events → Anthropic's streamed Messages events: `message_start` and a `ping`, then
//! content blocks (`content_block_start`, `content_block_delta`s, `content_block_stop`) for
//! text (`text_delta`), reasoning (`thinking` blocks with `thinking_delta`, only when the
//! request asked for thinking) and tool calls (`tool_use` blocks with `input_json_delta`),
//! and `message_delta` (stop reason, usage) with `message_stop`; or `error`.
//!
//! A pure state machine. Block indexes count from 0 in the order blocks start. A text or
//! thinking block closes when any other block starts; a tool block stays open until the
//! end, so that a node's pieces of parallel calls may come in any order and none is lost.

use serde_json::{Value, json};

use super::message::{error_body, stop_reason, usage_json};
use crate::adapters::api::translators::ApiError;
use crate::adapters::api::translators::output::Finished;
use crate::adapters::api::translators::{ApiEvent, StreamTranslator};
use crate::domain::{StructuredOutput, ToolCallDelta, Usage};

/// The kind of the block that is open for deltas (besides tool blocks).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Open {
    Text(u32),
    Thinking(u32),
}

/// The streaming state of one Messages answer.
#[derive(Debug)]
pub(in crate::adapters::api) struct MessagesStream {
    id: String,
    model: String,
    thinking: bool,
    /// The index the next block gets.
    next_index: u32,
    /// The open text or thinking block.
    open: Option<Open>,
    /// Open tool blocks: (the call's index from the node, the block's index).
    tools: Vec<(u32, u32)>,
    /// Whether any tool call was started.
    called: bool,
    ended: bool,
}

impl MessagesStream {
    /// The stream of message `id` for `model`; reasoning shown only when `thinking`.
    pub fn new(id: String, model: String, thinking: bool) -> Self {
        Self {
            id,
            model,
            thinking,
            next_index: 0,
            open: None,
            tools: Vec::new(),
            called: false,
            ended: false,
        }
    }

    fn close_open(&mut self, events: &mut Vec<ApiEvent>) {
        if let Some(Open::Text(index) | Open::Thinking(index)) = self.open.take() {
            events.push(block_stop(index));
        }
    }

    /// Opens a text or thinking block unless one of that kind is open; returns its index.
    fn ensure(&mut self, thinking: bool, events: &mut Vec<ApiEvent>) -> u32 {
        match self.open {
            Some(Open::Thinking(index)) if thinking => return index,
            Some(Open::Text(index)) if !thinking => return index,
            _ => {}
        }
        self.close_open(events);
        let index = self.next_index;
        self.next_index += 1;
        let block = if thinking {
            self.open = Some(Open::Thinking(index));
            json!({ "type": "thinking", "thinking": "", "signature": "" })
        } else {
            self.open = Some(Open::Text(index));
            json!({ "type": "text", "text": "" })
        };
        events.push(block_start(index, block));
        index
    }

    fn tool_piece(&mut self, piece: &ToolCallDelta, events: &mut Vec<ApiEvent>) {
        let block = match self.tools.iter().find(|(call, _)| *call == piece.index) {
            Some((_, block)) => *block,
            None => {
                self.close_open(events);
                let block = self.next_index;
                self.next_index += 1;
                self.tools.push((piece.index, block));
                self.called = true;
                let id = if piece.id.is_empty() {
                    format!("toolu_{}_{}", self.id, piece.index)
                } else {
                    piece.id.clone()
                };
                let start =
                    json!({ "type": "tool_use", "id": id, "name": piece.name, "input": {} });
                events.push(block_start(block, start));
                block
            }
        };
        if !piece.arguments.is_empty() {
            let delta = json!({ "type": "input_json_delta", "partial_json": piece.arguments });
            events.push(block_delta(block, delta));
        }
    }
}

fn block_start(index: u32, block: Value) -> ApiEvent {
    ApiEvent::new(
        "content_block_start",
        json!({ "type": "content_block_start", "index": index, "content_block": block }),
    )
}

fn block_delta(index: u32, delta: Value) -> ApiEvent {
    ApiEvent::new(
        "content_block_delta",
        json!({ "type": "content_block_delta", "index": index, "delta": delta }),
    )
}

fn block_stop(index: u32) -> ApiEvent {
    ApiEvent::new(
        "content_block_stop",
        json!({ "type": "content_block_stop", "index": index }),
    )
}

impl StreamTranslator for MessagesStream {
    fn open(&mut self, counts: Option<Usage>) -> Vec<ApiEvent> {
        // The prompt's counts when the engine reported them with the first output (so
        // Claude Code shows the turn's tokens at once); zeros otherwise, as before.
        let usage = counts.map_or_else(
            || json!({ "input_tokens": 0, "output_tokens": 0 }),
            usage_json,
        );
        let message = json!({
            "id": self.id,
            "type": "message",
            "role": "assistant",
            "model": self.model,
            "content": [],
            "stop_reason": null,
            "stop_sequence": null,
            "usage": usage,
        });
        vec![
            ApiEvent::new(
                "message_start",
                json!({ "type": "message_start", "message": message }),
            ),
            ApiEvent::new("ping", json!({ "type": "ping" })),
        ]
    }

    fn output(&mut self, text: &str, structured: Option<&StructuredOutput>) -> Vec<ApiEvent> {
        let mut events = Vec::new();
        if self.ended {
            return events;
        }
        if let Some(structured) = structured
            && self.thinking
            && !structured.reasoning.is_empty()
        {
            let index = self.ensure(true, &mut events);
            let delta = json!({ "type": "thinking_delta", "thinking": structured.reasoning });
            events.push(block_delta(index, delta));
        }
        if !text.is_empty() {
            let index = self.ensure(false, &mut events);
            events.push(block_delta(
                index,
                json!({ "type": "text_delta", "text": text }),
            ));
        }
        for piece in structured.map_or(&[][..], |s| &s.tool_calls) {
            self.tool_piece(piece, &mut events);
        }
        events
    }

    fn close(&mut self, end: Result<&Finished, &ApiError>) -> Vec<ApiEvent> {
        let mut events = Vec::new();
        if std::mem::replace(&mut self.ended, true) {
            return events;
        }
        let finished = match end {
            Ok(finished) => finished,
            Err(error) => {
                events.push(ApiEvent::new("error", error_body(error)));
                return events;
            }
        };
        self.close_open(&mut events);
        for (_, block) in std::mem::take(&mut self.tools) {
            events.push(block_stop(block));
        }
        let mut usage = finished
            .usage
            .map_or_else(|| json!({ "output_tokens": 0 }), usage_json);
        if usage.get("output_tokens").is_none() {
            usage["output_tokens"] = json!(0);
        }
        let delta = json!({
            "stop_reason": stop_reason(&finished.finish_reason, self.called),
            "stop_sequence": null,
        });
        events.push(ApiEvent::new(
            "message_delta",
            json!({ "type": "message_delta", "delta": delta, "usage": usage }),
        ));
        events.push(ApiEvent::new(
            "message_stop",
            json!({ "type": "message_stop" }),
        ));
        events
    }

    fn keep_alive(&self) -> Option<ApiEvent> {
        Some(ApiEvent::new("ping", json!({ "type": "ping" })))
    }
}
