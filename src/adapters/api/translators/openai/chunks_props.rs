//! The property the Anthropic and Responses writers have, for OpenAI's chunk writer: any
//! sequence of run output and any end becomes a well-formed chunk stream.

use proptest::prelude::*;
use serde_json::Value;

use super::{ChunkWriter, Piece};
use crate::adapters::api::translators::frame::{EventWriter, SseFrame};
use crate::adapters::api::translators::openai::Endpoint;
use crate::adapters::api::translators::openai::Reply;
use crate::adapters::api::translators::strategies::{self, end, output_of, piece};
use crate::domain::RunId;

/// Writes `pieces` and `end` as the SSE body would; returns each event's data.
fn stream(
    reply: &Reply,
    pieces: &[strategies::Piece],
    end: &Result<super::Finished, super::ApiError>,
) -> Vec<String> {
    let mut writer = ChunkWriter::new(reply);
    let mut frame = SseFrame::default();
    writer.open(None, &mut frame);
    for generated in pieces {
        let (text, structured) = output_of(generated);
        match structured.as_ref().filter(|s| !s.is_empty()) {
            None => writer.push(Piece::Text(text), &mut frame),
            Some(structured) => writer.push(Piece::Structured(text, structured), &mut frame),
        }
    }
    writer.close(end.clone(), &mut frame);
    let body = String::from_utf8(frame.split().to_vec()).expect("the stream is UTF-8");
    body.split_terminator("\n\n")
        .map(|event| {
            event
                .strip_prefix("data: ")
                .unwrap_or_else(|| panic!("an event without `data: `: {event:?}"))
                .to_owned()
        })
        .collect()
}

/// The concatenation of `field` over the chunks' first choices (`delta.content`, ...).
fn joined(chunks: &[Value], pointer: &str) -> String {
    chunks
        .iter()
        .filter_map(|chunk| chunk.pointer(pointer).and_then(Value::as_str))
        .collect()
}

proptest! {
    /// Every event is `data: ` and one JSON chunk of this stream (its id, model and
    /// object), text, reasoning and tool arguments arrive whole, and the stream ends with
    /// one finish chunk, the usage chunk when asked for and `[DONE]` — or, after a failure,
    /// with one error chunk and no `[DONE]`.
    #[test]
    fn any_event_sequence_becomes_a_well_formed_chunk_stream(
        pieces in proptest::collection::vec(piece(), 0..24),
        end in end(),
        chat in any::<bool>(),
        include_usage in any::<bool>(),
    ) {
        let endpoint = if chat { Endpoint::Chat } else { Endpoint::Completion };
        let reply = Reply::new(endpoint, &RunId::new("run-p"), "echo/m".to_owned(), 0, include_usage);
        let mut events = stream(&reply, &pieces, &end);
        let last = events.pop().expect("a last event");
        let chunks: Vec<Value> = events
            .iter()
            .map(|data| serde_json::from_str(data).expect("each chunk is JSON"))
            .collect();
        for chunk in &chunks {
            prop_assert_eq!(chunk["id"].as_str(), Some(reply.id.as_str()));
            prop_assert_eq!(chunk["model"].as_str(), Some("echo/m"));
            prop_assert_eq!(chunk["object"].as_str(), Some(reply.chunk_object()));
            prop_assert_eq!(chunk.get("usage").is_some(), include_usage);
        }
        if chat {
            prop_assert_eq!(chunks[0]["choices"][0]["delta"]["role"].as_str(), Some("assistant"));
        }
        let finishes: Vec<&Value> = chunks
            .iter()
            .filter_map(|c| c["choices"].get(0)?.get("finish_reason").filter(|r| !r.is_null()))
            .collect();
        match &end {
            Err(_) => {
                let error: Value = serde_json::from_str(&last).expect("the error chunk is JSON");
                prop_assert!(error["error"]["message"].is_string(), "{}", last);
                prop_assert!(finishes.is_empty());
            }
            Ok(finished) => {
                prop_assert_eq!(last.as_str(), "[DONE]");
                prop_assert_eq!(finishes.len(), 1);
                prop_assert_eq!(finishes[0].as_str(), Some(finished.finish_reason.as_str()));
                let usage = chunks.last().expect("a closing chunk");
                if include_usage {
                    prop_assert_eq!(&usage["choices"], &Value::Array(Vec::new()));
                    prop_assert!(usage["usage"]["prompt_tokens"].is_number(), "{}", usage);
                }
            }
        }
        let sent = |keep: fn(&strategies::Piece) -> Option<&str>| -> String {
            pieces.iter().filter_map(keep).collect()
        };
        let text = sent(|p| match p { strategies::Piece::Text(t) => Some(t), _ => None });
        if chat {
            prop_assert_eq!(joined(&chunks, "/choices/0/delta/content"), text);
            let reasoning = sent(|p| match p { strategies::Piece::Reasoning(r) => Some(r), _ => None });
            prop_assert_eq!(joined(&chunks, "/choices/0/delta/reasoning_content"), reasoning);
            let arguments: usize = chunks
                .iter()
                .filter_map(|c| c.pointer("/choices/0/delta/tool_calls")?.as_array())
                .flatten()
                .filter_map(|call| call.pointer("/function/arguments")?.as_str())
                .map(str::len)
                .sum();
            let sent_arguments: usize = pieces
                .iter()
                .map(|p| match p { strategies::Piece::Tool { arguments, .. } => arguments.len(), _ => 0 })
                .sum();
            prop_assert_eq!(arguments, sent_arguments);
        } else {
            prop_assert_eq!(joined(&chunks, "/choices/0/text"), text);
        }
    }
}
