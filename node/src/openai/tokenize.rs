//! Tokenize and detokenize runs against the engine's own tokenizer: llama.cpp's
//! `llama-server` (`POST /tokenize`, `/detokenize`, `/apply-template`) and vLLM (`POST
//! /tokenize` with `prompt` or `messages`, `/detokenize`), below the engine's root.
//!
//! A chat input is counted as the engine would see it for a chat run: llama-server renders it
//! with its chat template (`/apply-template`) and the prompt is tokenized with special tokens
//! added and parsed, as its completion path does; an engine without `/apply-template` (vLLM)
//! gets the messages on `/tokenize` itself. An engine without `/tokenize` (404) makes the run
//! fail `not_supported` (REQUEST, 501). The request bodies and answers are pure functions here;
//! the adapter sends them.

use edge::domain::{FailureClass, RunEventKind, StructuredOutput, Usage};
use serde_json::{Map, Value, json};

use super::request::InvalidInput;
use crate::fault::UpstreamFault;

/// What a tokenize or detokenize run asks for.
#[derive(Debug, Clone, PartialEq)]
pub enum Ask {
    /// Tokenize text as it is.
    Text {
        /// The text.
        content: String,
        /// Whether to add the model's special tokens (BOS).
        add_special: bool,
    },
    /// Tokenize the prompt of a chat body (without `model`).
    Chat(Map<String, Value>),
    /// Turn token ids back into text.
    Tokens(Vec<u32>),
}

/// The ask of a tokenize (`detokenize == false`) or detokenize run's JSON input.
///
/// # Errors
/// [`InvalidInput`] when the input is not such an object.
pub fn ask(input: &[u8], detokenize: bool) -> Result<Ask, InvalidInput> {
    let mut body = match serde_json::from_slice(input) {
        Ok(Value::Object(body)) => body,
        _ => return Err(InvalidInput("the input is not a JSON object".into())),
    };
    if detokenize {
        let tokens = body.remove("tokens").unwrap_or(Value::Null);
        return serde_json::from_value(tokens)
            .map(Ask::Tokens)
            .map_err(|_| InvalidInput("`tokens` must be an array of token ids".into()));
    }
    if body.get("messages").is_some_and(Value::is_array) {
        return Ok(Ask::Chat(body));
    }
    match body.get("content") {
        Some(Value::String(content)) => Ok(Ask::Text {
            content: content.clone(),
            add_special: body
                .get("add_special")
                .and_then(Value::as_bool)
                .unwrap_or(false),
        }),
        _ => Err(InvalidInput("neither `content` nor `messages`".into())),
    }
}

/// The `/tokenize` body for `content`: llama.cpp's fields and vLLM's (each ignores the
/// other's), naming the upstream `model`.
pub fn text_body(model: &str, content: &str, add_special: bool) -> Value {
    json!({
        "model": model,
        "content": content,
        "add_special": add_special,
        "parse_special": true,
        "prompt": content,
        "add_special_tokens": add_special,
    })
}

/// `chat` naming the upstream `model`: the `/apply-template` body, and vLLM's chat
/// `/tokenize` body.
pub fn chat_body(model: &str, mut chat: Map<String, Value>) -> Value {
    chat.insert("model".into(), Value::String(model.to_owned()));
    chat.remove("stream");
    Value::Object(chat)
}

/// The `/detokenize` body.
pub fn tokens_body(model: &str, tokens: &[u32]) -> Value {
    json!({ "model": model, "tokens": tokens })
}

/// The prompt of an `/apply-template` answer (`{"prompt": "..."}`).
///
/// # Errors
/// [`UpstreamFault::Malformed`] when there is none.
pub fn prompt_of(body: &[u8]) -> Result<String, UpstreamFault> {
    field_of(body, "prompt")
        .and_then(|prompt| prompt.as_str().map(str::to_owned))
        .ok_or_else(|| UpstreamFault::Malformed("no `prompt` in /apply-template's answer".into()))
}

/// The token ids of a `/tokenize` answer: `tokens` as numbers, or as `{"id": n, ...}`
/// objects (llama.cpp's `with_pieces`).
///
/// # Errors
/// [`UpstreamFault::Malformed`] when there are none.
pub fn tokens_of(body: &[u8]) -> Result<Vec<u32>, UpstreamFault> {
    let malformed = || UpstreamFault::Malformed("no `tokens` in /tokenize's answer".into());
    let tokens = field_of(body, "tokens").ok_or_else(malformed)?;
    let items = tokens.as_array().ok_or_else(malformed)?;
    items
        .iter()
        .map(|item| {
            item.as_u64()
                .or_else(|| item.get("id").and_then(Value::as_u64))
                .and_then(|id| u32::try_from(id).ok())
                .ok_or_else(malformed)
        })
        .collect()
}

/// The text of a `/detokenize` answer: llama.cpp's `content` or vLLM's `prompt`.
///
/// # Errors
/// [`UpstreamFault::Malformed`] when there is neither.
pub fn text_of(body: &[u8]) -> Result<String, UpstreamFault> {
    let parsed: Value = serde_json::from_slice(body).unwrap_or(Value::Null);
    parsed
        .get("content")
        .or_else(|| parsed.get("prompt"))
        .and_then(Value::as_str)
        .map(str::to_owned)
        .ok_or_else(|| UpstreamFault::Malformed("no text in /detokenize's answer".into()))
}

fn field_of(body: &[u8], name: &str) -> Option<Value> {
    match serde_json::from_slice(body) {
        Ok(Value::Object(mut map)) => map.remove(name),
        _ => None,
    }
}

/// Whether `fault` says the engine has no such endpoint.
pub fn is_missing(fault: &UpstreamFault) -> bool {
    matches!(
        fault,
        UpstreamFault::Status {
            status: 404 | 405,
            ..
        }
    )
}

/// The failure of a run whose engine has no `path`.
pub fn not_supported(adapter: &str, path: &str) -> RunEventKind {
    RunEventKind::Failed {
        context_window: None,
        code: "not_supported".into(),
        message: format!(
            "the engine of adapter {adapter} has no {path} endpoint (llama.cpp's llama-server and vLLM have one)"
        ),
        class: FailureClass::Request,
        status: Some(501),
        usage: None,
    }
}

/// The events of a tokenize run that got `tokens`: one output, then the completion whose
/// usage counts them.
pub fn tokenized(tokens: Vec<u32>) -> [RunEventKind; 2] {
    let count = u32::try_from(tokens.len()).unwrap_or(u32::MAX);
    let structured = StructuredOutput {
        tokens,
        ..StructuredOutput::default()
    };
    [
        RunEventKind::Output {
            text: String::new(),
            data: bytes::Bytes::new(),
            structured: Some(Box::new(structured)),
        },
        completed(count),
    ]
}

/// The events of a detokenize run that got `text`.
pub fn detokenized(text: String) -> [RunEventKind; 2] {
    [
        RunEventKind::Output {
            text,
            data: bytes::Bytes::new(),
            structured: None,
        },
        completed(0),
    ]
}

fn completed(input_tokens: u32) -> RunEventKind {
    RunEventKind::Completed {
        finish_reason: "stop".into(),
        usage: Some(Usage::new(input_tokens, 0)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn inputs_become_asks() {
        let text = ask(br#"{"content":"hi","add_special":true}"#, false).unwrap();
        assert_eq!(
            text,
            Ask::Text {
                content: "hi".into(),
                add_special: true
            }
        );
        let chat = ask(br#"{"messages":[{"role":"user","content":"hi"}]}"#, false).unwrap();
        assert!(matches!(chat, Ask::Chat(body) if body.contains_key("messages")));
        assert_eq!(
            ask(br#"{"tokens":[1,2]}"#, true).unwrap(),
            Ask::Tokens(vec![1, 2])
        );
        for bad in [&br#"{"tokens":[-1]}"#[..], b"[1]", b"{}"] {
            assert!(ask(bad, true).is_err());
        }
        for bad in [&br#"{"content":1}"#[..], b"nope", b"{}"] {
            assert!(ask(bad, false).is_err());
        }
    }

    #[test]
    fn engine_answers_are_read() {
        assert_eq!(tokens_of(br#"{"tokens":[1,15043]}"#).unwrap(), [1, 15043]);
        let pieces = br#"{"tokens":[{"id":5,"piece":"a"}]}"#;
        assert_eq!(tokens_of(pieces).unwrap(), [5]);
        let vllm = br#"{"count":2,"max_model_len":4096,"tokens":[3,4]}"#;
        assert_eq!(tokens_of(vllm).unwrap(), [3, 4]);
        assert!(tokens_of(br#"{"tokens":["a"]}"#).is_err());
        assert_eq!(text_of(br#"{"content":" Hello"}"#).unwrap(), " Hello");
        assert_eq!(text_of(br#"{"prompt":"Hi"}"#).unwrap(), "Hi");
        assert!(text_of(b"{}").is_err());
        assert_eq!(prompt_of(br#"{"prompt":"user: Hi"}"#).unwrap(), "user: Hi");
        assert!(prompt_of(b"[]").is_err());
    }

    #[test]
    fn a_missing_endpoint_is_not_supported() {
        let missing = UpstreamFault::Status {
            status: 404,
            body: Vec::new(),
        };
        assert!(is_missing(&missing));
        let RunEventKind::Failed {
            code,
            class,
            status,
            ..
        } = not_supported("llama", "/tokenize")
        else {
            panic!("a failure");
        };
        assert_eq!(
            (code.as_str(), class, status),
            ("not_supported", FailureClass::Request, Some(501))
        );
        let [output, end] = tokenized(vec![1, 2, 3]);
        assert!(
            matches!(output, RunEventKind::Output { structured: Some(s), .. } if s.tokens == [1, 2, 3])
        );
        assert!(
            matches!(end, RunEventKind::Completed { usage: Some(u), .. } if u.input_tokens == 3)
        );
    }
}
