//! A run's whole output, collected from its events for the non-streaming answers, and the
//! OpenAI renderings of the structured parts (tool calls, log probabilities, usage) that the
//! chat and completions answers share, whole and streamed.
//!
//! Pure: domain types in, JSON out; no HTTP.

use serde_json::{Map, Value, json};

use crate::domain::{Embedding, StructuredOutput, TokenLogprob, ToolCallDelta, Usage};

/// How a run ended well.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(in crate::adapters::api) struct Finished {
    /// Why generation stopped (`stop`, `length`, `tool_calls`, ...); `stop` when the node
    /// gave none.
    pub finish_reason: String,
    /// Token counts, when the node reported them.
    pub usage: Option<Usage>,
}

/// Everything a run output, concatenated.
#[derive(Debug, Clone, Default, PartialEq)]
pub(in crate::adapters::api) struct Collected {
    /// The text.
    pub text: String,
    /// The reasoning.
    pub reasoning: String,
    /// Whole tool calls, in the order of their indexes.
    pub tool_calls: Vec<ToolCall>,
    /// Log probabilities of every token.
    pub logprobs: Vec<TokenLogprob>,
    /// Embedding vectors, in the order they came.
    pub embeddings: Vec<Embedding>,
    /// Token ids (a tokenize run's answer), in the order they came.
    pub tokens: Vec<u32>,
}

/// A tool call put together from its pieces.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(in crate::adapters::api) struct ToolCall {
    /// The call's index among the answer's calls.
    pub index: u32,
    /// Its id (the first non-empty one the node sent).
    pub id: String,
    /// The function's name (likewise).
    pub name: String,
    /// The arguments' JSON text, concatenated.
    pub arguments: String,
}

impl Collected {
    /// Adds one output event's text and structured parts.
    pub fn push(&mut self, text: &str, structured: Option<&StructuredOutput>) {
        self.text.push_str(text);
        let Some(structured) = structured else {
            return;
        };
        self.reasoning.push_str(&structured.reasoning);
        for piece in &structured.tool_calls {
            self.push_tool_call(piece);
        }
        self.logprobs.extend(structured.logprobs.iter().cloned());
        self.embeddings
            .extend(structured.embeddings.iter().cloned());
        self.tokens.extend_from_slice(&structured.tokens);
    }

    fn push_tool_call(&mut self, piece: &ToolCallDelta) {
        let at = match self
            .tool_calls
            .binary_search_by_key(&piece.index, |call| call.index)
        {
            Ok(at) => at,
            Err(at) => {
                let call = ToolCall {
                    index: piece.index,
                    ..ToolCall::default()
                };
                self.tool_calls.insert(at, call);
                at
            }
        };
        let call = &mut self.tool_calls[at];
        if call.id.is_empty() {
            call.id.clone_from(&piece.id);
        }
        if call.name.is_empty() {
            call.name.clone_from(&piece.name);
        }
        call.arguments.push_str(&piece.arguments);
    }
}

/// OpenAI's usage object, with the cache and reasoning details when they are not zero.
pub(in crate::adapters::api) fn usage_json(usage: Usage) -> Value {
    let mut body = json!({
        "prompt_tokens": usage.input_tokens,
        "completion_tokens": usage.output_tokens,
        "total_tokens": u64::from(usage.input_tokens) + u64::from(usage.output_tokens),
    });
    if usage.cached_input_tokens > 0 {
        body["prompt_tokens_details"] = json!({ "cached_tokens": usage.cached_input_tokens });
    }
    if usage.reasoning_tokens > 0 {
        body["completion_tokens_details"] = json!({ "reasoning_tokens": usage.reasoning_tokens });
    }
    body
}

/// The whole answer's `message.tool_calls`.
pub(in crate::adapters::api) fn tool_calls_json(calls: &[ToolCall]) -> Value {
    calls
        .iter()
        .map(|call| {
            json!({
                "id": call.id,
                "type": "function",
                "function": { "name": call.name, "arguments": call.arguments },
            })
        })
        .collect()
}

/// A streamed chunk's `delta.tool_calls`: each piece as the node sent it; `id`, `type` and
/// `name` only on pieces that carry them (a call's first).
pub(in crate::adapters::api) fn tool_call_deltas_json(pieces: &[ToolCallDelta]) -> Value {
    pieces
        .iter()
        .map(|piece| {
            let mut function = Map::new();
            if !piece.name.is_empty() {
                function.insert("name".into(), piece.name.clone().into());
            }
            function.insert("arguments".into(), piece.arguments.clone().into());
            let mut call = Map::new();
            call.insert("index".into(), piece.index.into());
            if !piece.id.is_empty() || !piece.name.is_empty() {
                call.insert("id".into(), piece.id.clone().into());
                call.insert("type".into(), "function".into());
            }
            call.insert("function".into(), function.into());
            Value::Object(call)
        })
        .collect()
}

/// A token's UTF-8 bytes: the node's, or the token's own when the node sent none.
fn token_bytes(token: &str, bytes: &[u8]) -> Value {
    let bytes = if bytes.is_empty() {
        token.as_bytes()
    } else {
        bytes
    };
    bytes.iter().map(|b| Value::from(*b)).collect()
}

/// A chat choice's `logprobs`: `{"content": [...], "refusal": null}`, or null for none.
pub(in crate::adapters::api) fn chat_logprobs_json(tokens: &[TokenLogprob]) -> Value {
    if tokens.is_empty() {
        return Value::Null;
    }
    let content: Vec<Value> = tokens
        .iter()
        .map(|token| {
            let top: Vec<Value> = token
                .top
                .iter()
                .map(|alt| {
                    json!({
                        "token": alt.token,
                        "logprob": alt.logprob,
                        "bytes": token_bytes(&alt.token, &alt.bytes),
                    })
                })
                .collect();
            json!({
                "token": token.token,
                "logprob": token.logprob,
                "bytes": token_bytes(&token.token, &token.bytes),
                "top_logprobs": top,
            })
        })
        .collect();
    json!({ "content": content, "refusal": null })
}

/// A completion choice's legacy `logprobs` (`tokens`, `token_logprobs`, `top_logprobs`,
/// `text_offset`), or null for none. `offset` is the position (in characters) of the first
/// token in the completion's text; returns it moved past the last one.
pub(in crate::adapters::api) fn legacy_logprobs_json(
    tokens: &[TokenLogprob],
    offset: &mut usize,
) -> Value {
    if tokens.is_empty() {
        return Value::Null;
    }
    let mut text_offset = Vec::with_capacity(tokens.len());
    for token in tokens {
        text_offset.push(*offset);
        *offset += token.token.chars().count();
    }
    let top: Vec<Value> = tokens
        .iter()
        .map(|token| {
            let alternatives: Map<String, Value> = token
                .top
                .iter()
                .map(|alt| (alt.token.clone(), Value::from(alt.logprob)))
                .collect();
            Value::Object(alternatives)
        })
        .collect();
    json!({
        "tokens": tokens.iter().map(|t| t.token.as_str()).collect::<Vec<_>>(),
        "token_logprobs": tokens.iter().map(|t| t.logprob).collect::<Vec<_>>(),
        "top_logprobs": top,
        "text_offset": text_offset,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn piece(index: u32, id: &str, name: &str, arguments: &str) -> ToolCallDelta {
        ToolCallDelta {
            index,
            id: id.into(),
            name: name.into(),
            arguments: arguments.into(),
        }
    }

    #[test]
    fn tool_call_pieces_accumulate_per_index() {
        let mut collected = Collected::default();
        let structured = StructuredOutput {
            tool_calls: vec![
                piece(1, "call_b", "b", ""),
                piece(0, "call_a", "a", "{\"x\":"),
            ],
            reasoning: "hm".into(),
            ..StructuredOutput::default()
        };
        collected.push("", Some(&structured));
        let more = StructuredOutput {
            tool_calls: vec![piece(0, "", "", "1}"), piece(1, "", "", "{}")],
            ..StructuredOutput::default()
        };
        collected.push("t", Some(&more));
        assert_eq!(collected.text, "t");
        assert_eq!(collected.reasoning, "hm");
        let calls = tool_calls_json(&collected.tool_calls);
        assert_eq!(calls[0]["id"], "call_a");
        assert_eq!(calls[0]["function"]["arguments"], "{\"x\":1}");
        assert_eq!(calls[1]["function"]["name"], "b");
        assert_eq!(calls[1]["function"]["arguments"], "{}");
    }

    #[test]
    fn usage_details_only_when_not_zero() {
        let plain = usage_json(Usage::new(3, 4));
        assert!(plain.get("prompt_tokens_details").is_none());
        let detailed = usage_json(Usage {
            input_tokens: 10,
            output_tokens: 5,
            cached_input_tokens: 8,
            reasoning_tokens: 2,
        });
        assert_eq!(detailed["prompt_tokens_details"]["cached_tokens"], 8);
        assert_eq!(detailed["completion_tokens_details"]["reasoning_tokens"], 2);
        assert_eq!(detailed["total_tokens"], 15);
    }

    #[test]
    fn legacy_logprobs_offsets_run_on() {
        let token = |t: &str| TokenLogprob {
            token: t.into(),
            logprob: -0.5,
            ..TokenLogprob::default()
        };
        let mut offset = 3;
        let json = legacy_logprobs_json(&[token("ab"), token("é")], &mut offset);
        assert_eq!(json["text_offset"], json!([3, 5]));
        assert_eq!(offset, 6);
        let chat = chat_logprobs_json(&[token("é")]);
        assert_eq!(chat["content"][0]["bytes"], json!([195, 169]));
    }
}
