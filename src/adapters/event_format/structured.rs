//! The structured parts of an output event (reasoning, tool-call pieces, log probabilities,
//! embeddings, token ids, the token counts so far) in the text and JSON lines. Rare next to plain text, so written through
//! `serde_json` values rather than by hand.

use std::io::Write as _;

use serde_json::{Value, json};

use super::push_escaped;
use crate::domain::{StructuredOutput, TokenLogprob};

/// Appends ` reasoning=..`, ` tool_call=INDEX:ID:NAME:ARGUMENTS` per piece, ` logprobs=N`
/// ` embeddings=NxDIM`, ` tokens=N` and the counts so far (` input_tokens=..
/// output_tokens=..`, as a terminal event's) for what `structured` carries (text escaped onto
/// one line).
pub(super) fn push_text(structured: &StructuredOutput, out: &mut Vec<u8>) {
    if !structured.reasoning.is_empty() {
        out.extend_from_slice(b" reasoning=");
        push_escaped(&structured.reasoning, out);
    }
    for call in &structured.tool_calls {
        // Writing into a Vec cannot fail.
        let _ = write!(out, " tool_call={}:", call.index);
        push_escaped(&call.id, out);
        out.push(b':');
        push_escaped(&call.name, out);
        out.push(b':');
        push_escaped(&call.arguments, out);
    }
    if !structured.logprobs.is_empty() {
        let _ = write!(out, " logprobs={}", structured.logprobs.len());
    }
    if let Some(first) = structured.embeddings.first() {
        let count = structured.embeddings.len();
        let _ = write!(out, " embeddings={count}x{}", first.values.len());
    }
    if !structured.tokens.is_empty() {
        let _ = write!(out, " tokens={}", structured.tokens.len());
    }
    super::push_text_usage(structured.usage.as_ref(), out);
}

/// Appends `,"reasoning":..`, `,"tool_calls":[..]`, `,"logprobs":[..]`,
/// `,"embeddings":[..]`, `,"tokens":[..]` and the counts so far (`,"input_tokens":..`, as a
/// terminal event's) for what `structured` carries; empty parts are left out.
pub(super) fn push_json(structured: &StructuredOutput, out: &mut Vec<u8>) {
    if !structured.reasoning.is_empty() {
        push_field(
            "reasoning",
            &Value::from(structured.reasoning.as_str()),
            out,
        );
    }
    if !structured.tool_calls.is_empty() {
        let calls: Vec<Value> = structured
            .tool_calls
            .iter()
            .map(
                |c| json!({"index": c.index, "id": c.id, "name": c.name, "arguments": c.arguments}),
            )
            .collect();
        push_field("tool_calls", &Value::from(calls), out);
    }
    if !structured.logprobs.is_empty() {
        let logprobs: Vec<Value> = structured.logprobs.iter().map(logprob).collect();
        push_field("logprobs", &Value::from(logprobs), out);
    }
    if !structured.embeddings.is_empty() {
        let embeddings: Vec<Value> = structured
            .embeddings
            .iter()
            .map(|e| json!({"index": e.index, "values": e.values}))
            .collect();
        push_field("embeddings", &Value::from(embeddings), out);
    }
    if !structured.tokens.is_empty() {
        push_field("tokens", &Value::from(structured.tokens.clone()), out);
    }
    super::push_json_usage(structured.usage.as_ref(), out);
}

fn logprob(token: &TokenLogprob) -> Value {
    let top: Vec<Value> = token
        .top
        .iter()
        .map(|t| json!({"token": t.token, "logprob": t.logprob}))
        .collect();
    json!({"token": token.token, "logprob": token.logprob, "top": top})
}

/// Appends `,"NAME":VALUE`.
fn push_field(name: &str, value: &Value, out: &mut Vec<u8>) {
    out.extend_from_slice(b",\"");
    out.extend_from_slice(name.as_bytes());
    out.extend_from_slice(b"\":");
    // Serializing a value into a Vec cannot fail.
    let _ = serde_json::to_writer(&mut *out, value);
}
