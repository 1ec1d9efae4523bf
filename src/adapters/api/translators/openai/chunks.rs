//! OpenAI's streamed chunks (`chat.completion.chunk`, streamed `text_completion`), the
//! [`EventWriter`] of the chat and completions endpoints: an opening chunk (chat), one chunk
//! per piece of output, a closing chunk with the `finish_reason`, the usage chunk of
//! `stream_options.include_usage`, and `data: [DONE]`; or, after a failure, one error chunk.
//!
//! The text path is the benchmarked hot path: a text-only chunk is written straight into
//! the frame. Chunks with structured parts (reasoning, tool calls, log probabilities) build
//! their one choice as a JSON value.

use bytes::{BufMut, BytesMut};
use serde::Serialize;
use serde_json::{Map, Value};

use super::Endpoint;
use super::Reply;
use crate::adapters::api::translators::ApiError;
use crate::adapters::api::translators::frame::{EventWriter, SseFrame, push_event, write_json};
use crate::adapters::api::translators::output::Finished;
use crate::adapters::api::translators::output::{
    chat_logprobs_json, legacy_logprobs_json, tool_call_deltas_json, usage_json,
};
use crate::domain::{StructuredOutput, Usage};

/// The data of the stream's last event after success.
const DONE: &str = "[DONE]";

/// One chunk of a streamed answer.
#[derive(Debug, Clone, Copy)]
pub(in crate::adapters::api) enum Piece<'a> {
    /// The opening chunk (chat: the assistant role).
    Start,
    /// Some text.
    Text(&'a str),
    /// Some text (maybe empty) with structured parts.
    Structured(&'a str, &'a StructuredOutput),
    /// The closing chunk with the finish reason.
    Finish(&'a str),
    /// The usage chunk of `stream_options.include_usage`.
    Usage(Option<Usage>),
}

/// Writes `text` as a JSON string.
fn write_json_string(frame: &mut BytesMut, text: &str) {
    write_json(frame, &text);
}

/// Writes the chunks of one stream without building a `serde_json::Value` tree per text
/// chunk (which cost more than everything else the edge does per streamed token).
///
/// A chunk is an object whose keys serde_json writes in order: `choices` first, then the
/// envelope (`created`, `id`, `model`, `object`, `system_fingerprint`), the same for every
/// chunk of the stream, then `usage` when asked for. So the envelope is serialized once and
/// each chunk is its `choices`, the envelope and its `usage` — byte for byte what
/// serializing the chunk's `Value` gives (the tests compare both).
pub(in crate::adapters::api) struct ChunkWriter {
    endpoint: Endpoint,
    /// `"created":…,"system_fingerprint":null`: the chunk between `"choices":[…],` and
    /// `usage` or the closing brace.
    envelope: String,
    /// Every chunk carries `usage` (`stream_options.include_usage`).
    include_usage: bool,
    /// Completions: where the next token with a log probability starts in the text.
    text_offset: usize,
}

/// The fields every chunk of a stream shares, in serde_json's key order.
#[derive(Serialize)]
struct Envelope<'a> {
    created: u64,
    id: &'a str,
    model: &'a str,
    object: &'static str,
    system_fingerprint: (),
}

impl EventWriter for ChunkWriter {
    fn open(&mut self, _counts: Option<Usage>, frame: &mut SseFrame) {
        if self.endpoint == Endpoint::Chat {
            self.push(Piece::Start, frame);
        }
    }

    fn output(&mut self, text: &str, structured: Option<&StructuredOutput>, frame: &mut SseFrame) {
        match structured {
            None => self.push(Piece::Text(text), frame),
            Some(structured) => self.push(Piece::Structured(text, structured), frame),
        }
    }

    fn close(&mut self, end: Result<Finished, ApiError>, frame: &mut SseFrame) {
        match end {
            Ok(finished) => {
                self.push(Piece::Finish(&finished.finish_reason), frame);
                if self.include_usage {
                    self.push(Piece::Usage(finished.usage), frame);
                }
                push_event(frame, |frame| frame.put_slice(DONE.as_bytes()));
            }
            Err(error) => {
                let error = error.to_json();
                push_event(frame, |frame| frame.put_slice(error.as_bytes()));
            }
        }
    }
}

impl ChunkWriter {
    /// The writer of the stream answering with `reply`.
    pub fn new(reply: &Reply) -> Self {
        let envelope = Envelope {
            created: reply.created,
            id: &reply.id,
            model: &reply.model,
            object: reply.chunk_object(),
            system_fingerprint: (),
        };
        // Serializing strings and numbers into a `String` cannot fail.
        let envelope = serde_json::to_string(&envelope).unwrap_or_default();
        Self {
            endpoint: reply.endpoint,
            envelope: envelope
                .get(1..envelope.len().saturating_sub(1))
                .unwrap_or_default()
                .to_owned(),
            include_usage: reply.include_usage,
            text_offset: 0,
        }
    }

    /// Appends the SSE event of `piece`.
    fn push(&mut self, piece: Piece<'_>, frame: &mut SseFrame) {
        push_event(frame, |frame| self.render(piece, frame));
    }

    /// Writes the chunk of `piece`.
    fn render(&mut self, piece: Piece<'_>, frame: &mut BytesMut) {
        frame.put_slice(b"{\"choices\":[");
        if let Piece::Usage(usage) = piece {
            frame.put_slice(b"],");
            frame.put_slice(self.envelope.as_bytes());
            frame.put_slice(b",\"usage\":");
            write_json(frame, &usage.map_or(Value::Null, usage_json));
            frame.put_slice(b"}");
            return;
        }
        if let Piece::Structured(text, structured) = piece {
            let choice = self.structured_choice(text, structured);
            write_json(frame, &choice);
        } else {
            frame.put_slice(b"{");
            self.render_choice(piece, frame);
            frame.put_slice(b"}");
        }
        frame.put_slice(b"],");
        frame.put_slice(self.envelope.as_bytes());
        if self.include_usage {
            frame.put_slice(b",\"usage\":null");
        }
        frame.put_slice(b"}");
    }

    /// The one choice of a chunk with structured parts: chat's `delta` with
    /// `reasoning_content` and `tool_calls`, or the completion's `text`; and `logprobs`.
    fn structured_choice(&mut self, text: &str, structured: &StructuredOutput) -> Value {
        let mut choice = Map::new();
        choice.insert("finish_reason".into(), Value::Null);
        choice.insert("index".into(), 0.into());
        if self.endpoint == Endpoint::Completion {
            let logprobs = legacy_logprobs_json(&structured.logprobs, &mut self.text_offset);
            choice.insert("logprobs".into(), logprobs);
            choice.insert("text".into(), text.into());
            return Value::Object(choice);
        }
        let mut delta = Map::new();
        if !text.is_empty() {
            delta.insert("content".into(), text.into());
        }
        if !structured.reasoning.is_empty() {
            delta.insert(
                "reasoning_content".into(),
                structured.reasoning.clone().into(),
            );
        }
        if !structured.tool_calls.is_empty() {
            let calls = tool_call_deltas_json(&structured.tool_calls);
            delta.insert("tool_calls".into(), calls);
        }
        choice.insert("delta".into(), Value::Object(delta));
        choice.insert("logprobs".into(), chat_logprobs_json(&structured.logprobs));
        Value::Object(choice)
    }

    /// Writes the one choice of an opening (chat only), text or closing chunk.
    fn render_choice(&self, piece: Piece<'_>, frame: &mut BytesMut) {
        let (text, finish_reason) = match piece {
            Piece::Start | Piece::Usage(_) | Piece::Structured(..) => ("", None),
            Piece::Text(text) => (text, None),
            Piece::Finish(reason) => ("", Some(reason)),
        };
        if self.endpoint == Endpoint::Chat {
            frame.put_slice(b"\"delta\":");
            match piece {
                Piece::Start => frame.put_slice(b"{\"content\":\"\",\"role\":\"assistant\"}"),
                Piece::Text(text) => {
                    frame.put_slice(b"{\"content\":");
                    write_json_string(frame, text);
                    frame.put_slice(b"}");
                }
                Piece::Finish(_) | Piece::Usage(_) | Piece::Structured(..) => {
                    frame.put_slice(b"{}");
                }
            }
            frame.put_slice(b",");
        }
        frame.put_slice(b"\"finish_reason\":");
        match finish_reason {
            Some(reason) => write_json_string(frame, reason),
            None => frame.put_slice(b"null"),
        }
        frame.put_slice(b",\"index\":0,\"logprobs\":null");
        if self.endpoint == Endpoint::Completion {
            frame.put_slice(b",\"text\":");
            write_json_string(frame, text);
        }
    }
}

#[cfg(test)]
#[path = "chunks_props.rs"]
mod props;

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::domain::{RunId, TokenLogprob, ToolCallDelta};

    /// A chunk built as a `serde_json::Value` tree, the plain way: what the writer must
    /// match byte for byte once serialized. `None` for the completion's opening chunk.
    fn value_chunk(reply: &Reply, piece: Piece<'_>) -> Option<Value> {
        let (text, delta, finish_reason) = match piece {
            Piece::Start => ("", json!({"role": "assistant", "content": ""}), Value::Null),
            Piece::Text(text) => (text, json!({"content": text}), Value::Null),
            Piece::Finish(reason) => ("", json!({}), Value::from(reason)),
            Piece::Usage(_) | Piece::Structured(..) => ("", Value::Null, Value::Null),
        };
        let choices = match (reply.endpoint, piece) {
            (_, Piece::Usage(_)) => json!([]),
            (Endpoint::Completion, Piece::Start) => return None,
            (Endpoint::Chat, _) => json!([{
                "index": 0, "delta": delta, "logprobs": null, "finish_reason": finish_reason,
            }]),
            (Endpoint::Completion, _) => json!([{
                "text": text, "index": 0, "logprobs": null, "finish_reason": finish_reason,
            }]),
        };
        let mut chunk = json!({
            "id": reply.id,
            "object": reply.chunk_object(),
            "created": reply.created,
            "model": reply.model,
            "system_fingerprint": null,
            "choices": choices,
        });
        if let Piece::Usage(usage) = piece {
            chunk["usage"] = usage.map_or(Value::Null, usage_json);
        } else if reply.include_usage {
            chunk["usage"] = Value::Null;
        }
        Some(chunk)
    }

    #[test]
    fn a_written_chunk_is_the_serialized_chunk() {
        let models = ["echo/target", "echo/\"quoted\"\\ ✓", "\u{0}odd\u{0}"];
        for endpoint in [Endpoint::Chat, Endpoint::Completion] {
            for include_usage in [false, true] {
                for model in models {
                    let reply = Reply::new(
                        endpoint,
                        &RunId::new("run-\"1\""),
                        model.to_owned(),
                        1_700_000_000,
                        include_usage,
                    );
                    let mut chunks = ChunkWriter::new(&reply);
                    let texts = ["hello ", "", "a\"b\\c\nd\u{1}é✓"];
                    let reasons = ["stop", "length", "we\"ird\n"];
                    let pieces = texts
                        .iter()
                        .map(|text| Piece::Text(text))
                        .chain(reasons.iter().map(|reason| Piece::Finish(reason)))
                        .chain([Piece::Start, Piece::Usage(None)])
                        .chain([Piece::Usage(Some(Usage::new(3, 4)))]);
                    for piece in pieces {
                        if let Piece::Structured(..) = piece {
                            continue;
                        }
                        let Some(expected) = value_chunk(&reply, piece) else {
                            continue;
                        };
                        let mut frame = BytesMut::new();
                        chunks.render(piece, &mut frame);
                        assert_eq!(
                            std::str::from_utf8(&frame).unwrap(),
                            expected.to_string(),
                            "{endpoint:?} {piece:?} usage={include_usage}"
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn structured_pieces_render_in_openai_shapes() {
        let structured = StructuredOutput {
            reasoning: "think".into(),
            tool_calls: vec![
                ToolCallDelta {
                    index: 0,
                    id: "call_1".into(),
                    name: "f".into(),
                    arguments: String::new(),
                },
                ToolCallDelta {
                    index: 0,
                    arguments: "{}".into(),
                    ..ToolCallDelta::default()
                },
            ],
            logprobs: vec![TokenLogprob {
                token: "hi".into(),
                logprob: -0.25,
                ..TokenLogprob::default()
            }],
            ..StructuredOutput::default()
        };
        let chunk = |endpoint| {
            let reply = Reply::new(endpoint, &RunId::new("r"), "m".to_owned(), 0, false);
            let mut frame = BytesMut::new();
            ChunkWriter::new(&reply).render(Piece::Structured("hi", &structured), &mut frame);
            serde_json::from_slice::<Value>(&frame).unwrap()
        };
        let chat = chunk(Endpoint::Chat);
        let choice = &chat["choices"][0];
        assert_eq!(choice["delta"]["content"], "hi");
        assert_eq!(choice["delta"]["reasoning_content"], "think");
        assert_eq!(
            choice["delta"]["tool_calls"],
            json!([
                {"index": 0, "id": "call_1", "type": "function",
                 "function": {"name": "f", "arguments": ""}},
                {"index": 0, "function": {"arguments": "{}"}},
            ])
        );
        assert_eq!(choice["logprobs"]["content"][0]["token"], "hi");
        assert_eq!(chat["object"], "chat.completion.chunk");
        let completion = chunk(Endpoint::Completion);
        let choice = &completion["choices"][0];
        assert_eq!(choice["text"], "hi");
        assert_eq!(choice["logprobs"]["tokens"], json!(["hi"]));
        assert_eq!(choice["logprobs"]["text_offset"], json!([0]));
    }
}
