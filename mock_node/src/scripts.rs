//! Scripted runs of the mock node: the whole event sequence of a run whose behaviour is one
//! of the structured ones (reasoning, tool calls, log probabilities, classed failures,
//! other finish reasons) or whose operation is embeddings. Pure: the run in, its events out.

use edge::domain::{
    Embedding, FailureClass, Operation, RunEventKind, StructuredOutput, TokenLogprob,
    ToolCallDelta, TopLogprob, Usage,
};
use std::time::Duration;

use edge::client::RunAssignment;
use edge::client::{NodeFrame, run_event};
use serde_json::Value;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::Behaviour;

/// The embedding size when the request does not ask for `dimensions`.
pub const DEFAULT_DIMENSIONS: usize = 8;

/// The events of a scripted run (without `started`), or `None` when `behaviour` streams
/// the echo the usual way.
pub fn script(behaviour: Behaviour, run: &RunAssignment, text: &str) -> Option<Vec<RunEventKind>> {
    let body: Value = serde_json::from_slice(&run.input).unwrap_or(Value::Null);
    match run.operation {
        Operation::Embeddings => return Some(embeddings(&body)),
        Operation::Tokenize => return Some(tokenize(&body)),
        Operation::Detokenize => return Some(detokenize(&body)),
        Operation::Unspecified | Operation::Chat | Operation::Completion => {}
    }
    let words: Vec<&str> = text.split_whitespace().collect();
    Some(match behaviour {
        Behaviour::Reasoning => reasoning(&words),
        Behaviour::Tools => tools(&body, run.run_id.as_str(), &words),
        Behaviour::Logprobs => logprobs(&words),
        Behaviour::Length => finish(&words, "length"),
        Behaviour::Filtered => finish(&words, "content_filter"),
        Behaviour::BadRequest => vec![RunEventKind::Failed {
            context_window: None,
            code: "context_length_exceeded".into(),
            message: format!(
                "This model's maximum context length is 4 tokens. However, you requested {} tokens.",
                words.len() + 4
            ),
            class: FailureClass::Request,
            status: Some(400),
            usage: None,
        }],
        Behaviour::NodeError => vec![RunEventKind::Failed {
            context_window: None,
            code: "engine_unavailable".into(),
            message: "the engine at 127.0.0.1:1 refused the connection".into(),
            class: FailureClass::Node,
            status: Some(503),
            usage: None,
        }],
        Behaviour::Refused => vec![RunEventKind::Failed {
            context_window: None,
            code: "busy".into(),
            message: "every engine slot is taken".into(),
            class: FailureClass::Refused,
            status: None,
            usage: None,
        }],
        _ => return None,
    })
}

fn count(n: usize) -> u32 {
    u32::try_from(n).unwrap_or(u32::MAX)
}

fn structured(structured: StructuredOutput) -> RunEventKind {
    RunEventKind::Output {
        text: String::new(),
        data: bytes::Bytes::new(),
        structured: Some(Box::new(structured)),
    }
}

/// The words as text pieces (`word ` but the last).
fn pieces(words: &[&str]) -> Vec<String> {
    words
        .iter()
        .enumerate()
        .map(|(i, word)| {
            if i + 1 < words.len() {
                format!("{word} ")
            } else {
                (*word).to_owned()
            }
        })
        .collect()
}

fn completed(reason: &str, usage: Usage) -> RunEventKind {
    RunEventKind::Completed {
        finish_reason: reason.into(),
        usage: Some(usage),
    }
}

/// Reasoning about the words first (`thinking about: w1 w2`), then the echo; usage with
/// the reasoning tokens and one cached prompt token.
fn reasoning(words: &[&str]) -> Vec<RunEventKind> {
    let mut events: Vec<RunEventKind> = ["thinking ", "about ", "it"]
        .into_iter()
        .map(|piece| {
            structured(StructuredOutput {
                reasoning: piece.into(),
                ..StructuredOutput::default()
            })
        })
        .collect();
    events.extend(pieces(words).into_iter().map(RunEventKind::text));
    let usage = Usage {
        input_tokens: count(words.len()),
        output_tokens: count(words.len() + 3),
        cached_input_tokens: 1,
        reasoning_tokens: 3,
    };
    events.push(completed("stop", usage));
    events
}

/// Two parallel tool calls streamed in pieces (the request's first two tools, or
/// `get_weather` and `get_time`), each with `{"city": "<word>"}`; or, when the last message
/// is a tool result, an answer saying what the tools returned.
fn tools(body: &Value, run_id: &str, words: &[&str]) -> Vec<RunEventKind> {
    let messages = body["messages"]
        .as_array()
        .map(Vec::as_slice)
        .unwrap_or(&[]);
    let results: Vec<&str> = messages
        .iter()
        .rev()
        .take_while(|m| m["role"] == "tool")
        .filter_map(|m| m["content"].as_str())
        .collect();
    if !results.is_empty() {
        let mut results = results;
        results.reverse();
        let answer = format!("the tools said: {}", results.join(" and "));
        let n = count(answer.split_whitespace().count());
        return vec![
            RunEventKind::text(answer),
            completed("stop", Usage::new(n, n)),
        ];
    }
    let name = |i: usize, default: &str| {
        body["tools"][i]["function"]["name"]
            .as_str()
            .unwrap_or(default)
            .to_owned()
    };
    let city = words.first().copied().unwrap_or("Paris");
    let mut events = Vec::new();
    for (index, name) in [name(0, "get_weather"), name(1, "get_time")]
        .into_iter()
        .enumerate()
    {
        let index = count(index);
        let piece = |id: String, name: String, arguments: String| {
            structured(StructuredOutput {
                tool_calls: vec![ToolCallDelta {
                    index,
                    id,
                    name,
                    arguments,
                }],
                ..StructuredOutput::default()
            })
        };
        events.push(piece(format!("call_{run_id}_{index}"), name, String::new()));
        events.push(piece(String::new(), String::new(), "{\"city\": ".into()));
        events.push(piece(
            String::new(),
            String::new(),
            format!("\"{city}{index}\"}}"),
        ));
    }
    events.push(completed("tool_calls", Usage::new(count(words.len()), 12)));
    events
}

/// The echo, each word with its log probability and two alternatives.
fn logprobs(words: &[&str]) -> Vec<RunEventKind> {
    let mut events: Vec<RunEventKind> = pieces(words)
        .into_iter()
        .enumerate()
        .map(|(i, piece)| {
            let logprob = -0.125 * (i as f64 + 1.0);
            let alternative = |token: &str, logprob: f64| TopLogprob {
                token: token.into(),
                logprob,
                bytes: token.as_bytes().to_vec(),
            };
            let token = TokenLogprob {
                token: piece.clone(),
                logprob,
                bytes: piece.as_bytes().to_vec(),
                top: vec![
                    alternative(&piece, logprob),
                    alternative("other", logprob - 2.0),
                ],
            };
            RunEventKind::Output {
                text: piece,
                data: bytes::Bytes::new(),
                structured: Some(Box::new(StructuredOutput {
                    logprobs: vec![token],
                    ..StructuredOutput::default()
                })),
            }
        })
        .collect();
    let n = count(words.len());
    events.push(completed("stop", Usage::new(n, n)));
    events
}

/// The echo, ending with `reason`.
fn finish(words: &[&str], reason: &str) -> Vec<RunEventKind> {
    let mut events: Vec<RunEventKind> = pieces(words).into_iter().map(RunEventKind::text).collect();
    let n = count(words.len());
    events.push(completed(reason, Usage::new(n, n)));
    events
}

/// The mock's tokens of a tokenize input: one per byte of `content`, or of a chat body's
/// prompt as the mock's template renders it (`"{role}: {content}\n"` per message whose
/// content is text, `"assistant:"` at the end); all in one output event.
pub fn tokenize(body: &Value) -> Vec<RunEventKind> {
    let text = match (&body["content"], &body["messages"]) {
        (Value::String(content), _) => content.clone(),
        (_, Value::Array(messages)) => mock_template(messages),
        _ => {
            return vec![RunEventKind::Failed {
                context_window: None,
                code: "invalid_input".into(),
                message: "neither `content` nor `messages`".into(),
                class: FailureClass::Request,
                status: Some(400),
                usage: None,
            }];
        }
    };
    let tokens: Vec<u32> = text.bytes().map(u32::from).collect();
    let usage = Usage::new(count(tokens.len()), 0);
    let structured = StructuredOutput {
        tokens,
        ..StructuredOutput::default()
    };
    vec![
        RunEventKind::Output {
            text: String::new(),
            data: bytes::Bytes::new(),
            structured: Some(Box::new(structured)),
        },
        complete(usage),
    ]
}

/// The mock's chat template (see [`tokenize`]).
pub fn mock_template(messages: &[Value]) -> String {
    let mut prompt = String::new();
    for message in messages {
        if let (Some(role), Some(content)) = (message["role"].as_str(), message["content"].as_str())
        {
            prompt.push_str(&format!("{role}: {content}\n"));
        }
    }
    prompt.push_str("assistant:");
    prompt
}

/// The text of `tokens` (each token one byte), in one output event.
pub fn detokenize(body: &Value) -> Vec<RunEventKind> {
    let bytes: Vec<u8> = body["tokens"]
        .as_array()
        .map(|tokens| {
            tokens
                .iter()
                .filter_map(|token| token.as_u64().and_then(|t| u8::try_from(t).ok()))
                .collect()
        })
        .unwrap_or_default();
    vec![
        RunEventKind::Output {
            text: String::from_utf8_lossy(&bytes).into_owned(),
            data: bytes::Bytes::new(),
            structured: None,
        },
        complete(Usage::new(0, 0)),
    ]
}

fn complete(usage: Usage) -> RunEventKind {
    RunEventKind::Completed {
        finish_reason: "stop".into(),
        usage: Some(usage),
    }
}

/// One deterministic vector per input, of `dimensions` (default [`DEFAULT_DIMENSIONS`])
/// values: value `j` of input `i` is `(i + 1) * (j + 1) / 100`, plus the input's length in
/// bytes at position 0. All vectors in one output event.
pub fn embeddings(body: &Value) -> Vec<RunEventKind> {
    let inputs: Vec<usize> = match &body["input"] {
        Value::String(text) => vec![text.len()],
        Value::Array(items) if items.iter().all(Value::is_number) => vec![items.len()],
        Value::Array(items) => items
            .iter()
            .map(|item| {
                item.as_str()
                    .map_or_else(|| item.as_array().map_or(0, Vec::len), str::len)
            })
            .collect(),
        _ => Vec::new(),
    };
    let dimensions = body["dimensions"].as_u64().map_or(DEFAULT_DIMENSIONS, |d| {
        usize::try_from(d).unwrap_or(DEFAULT_DIMENSIONS)
    });
    let vectors: Vec<Embedding> = inputs
        .iter()
        .enumerate()
        .map(|(i, len)| Embedding {
            index: count(i),
            values: (0..dimensions)
                .map(|j| {
                    let base = ((i + 1) * (j + 1)) as f32 / 100.0;
                    if j == 0 { base + *len as f32 } else { base }
                })
                .collect(),
        })
        .collect();
    let tokens = count(inputs.iter().sum::<usize>());
    vec![
        structured(StructuredOutput {
            embeddings: vectors,
            ..StructuredOutput::default()
        }),
        completed("stop", Usage::new(tokens, 0)),
    ]
}

/// Sends `started` and `events` (pausing `options.delay` before each output), or
/// `cancelled` once the edge cancels the run.
pub async fn play(
    id: &str,
    events: Vec<RunEventKind>,
    delay: Duration,
    frames: &mpsc::Sender<NodeFrame>,
    cancel: &CancellationToken,
) {
    let mut seq = 1;
    let _ = frames.send(run_event(id, seq, RunEventKind::Started)).await;
    for kind in events {
        if !delay.is_zero() && !kind.is_terminal() {
            tokio::select! {
                () = tokio::time::sleep(delay) => {}
                () = cancel.cancelled() => {}
            }
        }
        seq += 1;
        if cancel.is_cancelled() {
            let cancelled = RunEventKind::cancelled("cancelled by the edge");
            let _ = frames.send(run_event(id, seq, cancelled)).await;
            return;
        }
        let _ = frames.send(run_event(id, seq, kind)).await;
    }
}
