//! The engine's streamed answer, chunk by chunk, as run events: text deltas, reasoning,
//! tool-call pieces, log probabilities, then one `completed` with the finish reason and
//! usage. Also the one-shot embeddings answer.
//!
//! Pure: each SSE `data` payload in, at most one `output` event out. Only choice 0 is
//! relayed (a run is one answer). Engines differ in small ways that are all accepted here:
//! `reasoning_content` (llama.cpp, DeepSeek) or `reasoning` (newer vLLM), tool calls whole
//! in one piece (Ollama) or in fragments (vLLM, llama.cpp), `null` where a list was expected,
//! and the legacy completions `logprobs` shape.

use bytes::Bytes;
use edge::domain::{
    Embedding, RunEventKind, StructuredOutput, TokenLogprob, ToolCallDelta, TopLogprob, Usage,
};
use serde::Deserialize;
use serde_json::{Map, Value};

use crate::fault::UpstreamFault;

/// The most embedding values put in one `output` event, so a frame stays well under the
/// edge's 4 MiB limit (4 bytes a value).
const MAX_VALUES_PER_EVENT: usize = 256 * 1024;

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct Chunk {
    choices: Option<Vec<Choice>>,
    usage: Option<UsageBody>,
    timings: Option<Timings>,
    error: Option<Value>,
}

/// llama-server's running counts, on every chunk when the request asked for
/// `timings_per_token` (else on the last): prompt tokens evaluated, prompt tokens taken
/// from the cache, tokens generated so far.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct Timings {
    prompt_n: u64,
    cache_n: u64,
    predicted_n: u64,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct Choice {
    index: u32,
    delta: Option<Delta>,
    text: Option<String>,
    logprobs: Option<Value>,
    finish_reason: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct Delta {
    content: Option<String>,
    reasoning_content: Option<String>,
    reasoning: Option<String>,
    tool_calls: Option<Vec<ToolCallChunk>>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct ToolCallChunk {
    index: Option<u32>,
    id: Option<String>,
    function: Option<FunctionChunk>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct FunctionChunk {
    name: Option<String>,
    arguments: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct UsageBody {
    prompt_tokens: u64,
    completion_tokens: u64,
    prompt_tokens_details: Option<CachedDetail>,
    completion_tokens_details: Option<ReasoningDetail>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct CachedDetail {
    cached_tokens: u64,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct ReasoningDetail {
    reasoning_tokens: u64,
}

/// One streamed answer in progress.
#[derive(Debug, Default)]
pub struct AnswerStream {
    finish_reason: Option<String>,
    usage: Option<Usage>,
    counted: Option<Usage>,
    /// Whether an output event carried the engine's counts yet (the first after they came).
    counts_sent: bool,
    done: bool,
}

impl AnswerStream {
    /// A stream before its first chunk.
    pub fn new() -> Self {
        Self::default()
    }

    /// Reads one SSE `data` payload; returns the `output` event it carries, if any.
    ///
    /// # Errors
    /// [`UpstreamFault::Malformed`] for a payload that is not a chunk,
    /// [`UpstreamFault::InStream`] for an error object the engine streamed.
    pub fn apply(&mut self, data: &str) -> Result<Option<RunEventKind>, UpstreamFault> {
        if data.trim() == "[DONE]" {
            self.done = true;
            return Ok(None);
        }
        let chunk: Chunk = serde_json::from_str(data).map_err(|error| {
            UpstreamFault::Malformed(format!(
                "a chunk is not JSON of the expected shape: {error}"
            ))
        })?;
        if let Some(error) = chunk.error {
            let mut body = Map::new();
            body.insert("error".into(), error);
            return Err(UpstreamFault::InStream(Value::Object(body)));
        }
        if let Some(usage) = chunk.usage {
            self.usage = Some(usage_from(usage));
        }
        if let Some(timings) = chunk.timings {
            let cached = saturate(timings.cache_n);
            self.counted = Some(Usage {
                input_tokens: saturate(timings.prompt_n).saturating_add(cached),
                cached_input_tokens: cached,
                output_tokens: saturate(timings.predicted_n),
                reasoning_tokens: 0,
            });
        }
        let Some(choice) = chunk
            .choices
            .unwrap_or_default()
            .into_iter()
            .find(|c| c.index == 0)
        else {
            return Ok(None);
        };
        if let Some(reason) = choice.finish_reason.filter(|r| !r.is_empty()) {
            self.finish_reason = Some(reason);
        }
        let output = output_from(
            choice.delta.unwrap_or_default(),
            choice.text,
            choice.logprobs,
        );
        Ok(output.map(|output| self.with_first_counts(output)))
    }

    /// `output`, carrying the engine's counts when they are the first it reported (the
    /// prompt's, as soon as it was evaluated), so the edge can tell the caller at once.
    fn with_first_counts(&mut self, output: RunEventKind) -> RunEventKind {
        let (Some(counted), false) = (self.counted, self.counts_sent) else {
            return output;
        };
        let RunEventKind::Output {
            text,
            data,
            structured,
        } = output
        else {
            return output;
        };
        self.counts_sent = true;
        let mut structured = structured.map(|boxed| *boxed).unwrap_or_default();
        structured.usage = Some(counted);
        RunEventKind::Output {
            text,
            data,
            structured: Some(Box::new(structured)),
        }
    }

    /// The engine's running counts as of the last chunk that carried them (llama-server's
    /// `timings`): what the run produced so far, should it end before its usage chunk.
    pub fn counted(&self) -> Option<Usage> {
        self.counted
    }

    /// Whether the engine sent `[DONE]`.
    pub fn is_done(&self) -> bool {
        self.done
    }

    /// The terminal `completed` event once the body ended.
    ///
    /// # Errors
    /// [`UpstreamFault::Broken`] when the body ended before `[DONE]` and before any finish
    /// reason: the answer was cut off.
    pub fn finish(self) -> Result<RunEventKind, UpstreamFault> {
        if !self.done && self.finish_reason.is_none() {
            return Err(UpstreamFault::Broken(
                "the stream ended before the answer did".into(),
            ));
        }
        Ok(RunEventKind::Completed {
            finish_reason: normalise(self.finish_reason),
            usage: self.usage,
        })
    }
}

fn output_from(
    delta: Delta,
    text: Option<String>,
    logprobs: Option<Value>,
) -> Option<RunEventKind> {
    let structured = StructuredOutput {
        reasoning: delta
            .reasoning_content
            .or(delta.reasoning)
            .unwrap_or_default(),
        tool_calls: tool_calls_from(delta.tool_calls.unwrap_or_default()),
        logprobs: logprobs.map(|l| logprobs_from(&l)).unwrap_or_default(),
        embeddings: Vec::new(),
        tokens: Vec::new(),
        usage: None,
    };
    let text = delta.content.or(text).unwrap_or_default();
    if text.is_empty() && structured.is_empty() {
        return None;
    }
    Some(RunEventKind::Output {
        text,
        data: Bytes::new(),
        structured: (!structured.is_empty()).then(|| Box::new(structured)),
    })
}

/// Tool-call pieces as the protocol carries them; a piece without an index (an engine that
/// sends whole calls) takes its position in the list.
fn tool_calls_from(calls: Vec<ToolCallChunk>) -> Vec<ToolCallDelta> {
    calls
        .into_iter()
        .enumerate()
        .map(|(position, call)| {
            let function = call.function.unwrap_or_default();
            ToolCallDelta {
                index: call
                    .index
                    .unwrap_or(u32::try_from(position).unwrap_or(u32::MAX)),
                id: call.id.unwrap_or_default(),
                name: function.name.unwrap_or_default(),
                arguments: function.arguments.unwrap_or_default(),
            }
        })
        .collect()
}

/// Chat logprobs (`{"content":[{token, logprob, bytes, top_logprobs}]}`) or the legacy
/// completions shape (`{"tokens":[..], "token_logprobs":[..], "top_logprobs":[{tok: lp}]}`).
fn logprobs_from(logprobs: &Value) -> Vec<TokenLogprob> {
    if let Some(content) = logprobs["content"].as_array() {
        return content
            .iter()
            .map(|entry| TokenLogprob {
                top: entry["top_logprobs"]
                    .as_array()
                    .map_or_else(Vec::new, |top| top.iter().map(top_from).collect()),
                ..token_from(entry)
            })
            .collect();
    }
    let tokens = logprobs["tokens"].as_array().cloned().unwrap_or_default();
    tokens
        .iter()
        .enumerate()
        .map(|(i, token)| {
            let token = token.as_str().unwrap_or_default().to_owned();
            let top =
                logprobs["top_logprobs"][i]
                    .as_object()
                    .map_or_else(Vec::new, |alternatives| {
                        alternatives
                            .iter()
                            .map(|(token, logprob)| TopLogprob {
                                bytes: token.as_bytes().to_vec(),
                                token: token.clone(),
                                logprob: logprob.as_f64().unwrap_or_default(),
                            })
                            .collect()
                    });
            TokenLogprob {
                bytes: token.as_bytes().to_vec(),
                logprob: logprobs["token_logprobs"][i].as_f64().unwrap_or_default(),
                token,
                top,
            }
        })
        .collect()
}

fn token_from(entry: &Value) -> TokenLogprob {
    let top = top_from(entry);
    TokenLogprob {
        token: top.token,
        logprob: top.logprob,
        bytes: top.bytes,
        top: Vec::new(),
    }
}

fn top_from(entry: &Value) -> TopLogprob {
    let token = entry["token"].as_str().unwrap_or_default().to_owned();
    let bytes = entry["bytes"].as_array().map_or_else(
        || token.as_bytes().to_vec(),
        |bytes| {
            bytes
                .iter()
                .filter_map(|b| b.as_u64().and_then(|b| u8::try_from(b).ok()))
                .collect()
        },
    );
    TopLogprob {
        token,
        logprob: entry["logprob"].as_f64().unwrap_or_default(),
        bytes,
    }
}

fn saturate(n: u64) -> u32 {
    u32::try_from(n).unwrap_or(u32::MAX)
}

fn usage_from(usage: UsageBody) -> Usage {
    let count = saturate;
    Usage {
        input_tokens: count(usage.prompt_tokens),
        output_tokens: count(usage.completion_tokens),
        cached_input_tokens: count(usage.prompt_tokens_details.map_or(0, |d| d.cached_tokens)),
        reasoning_tokens: count(
            usage
                .completion_tokens_details
                .map_or(0, |d| d.reasoning_tokens),
        ),
    }
}

/// OpenAI's finish reasons pass through; an engine's end-of-sequence spelling reads as
/// `stop`, and a stream that ended with `[DONE]` but no reason stopped normally.
fn normalise(reason: Option<String>) -> String {
    match reason.as_deref() {
        None | Some("eos" | "eos_token" | "end_turn") => "stop".into(),
        Some(_) => reason.unwrap_or_default(),
    }
}

#[derive(Debug, Deserialize)]
struct EmbeddingsBody {
    data: Vec<EmbeddingItem>,
    #[serde(default)]
    usage: Option<UsageBody>,
}

#[derive(Debug, Deserialize)]
struct EmbeddingItem {
    #[serde(default)]
    index: Option<u32>,
    embedding: Vec<f32>,
}

/// The events of an embeddings answer: the vectors (in as many `output` events as keep each
/// frame small), then `completed` with the prompt's token count.
///
/// # Errors
/// [`UpstreamFault::Malformed`] when the body is not an embeddings list of floats.
pub fn embeddings_events(body: &[u8]) -> Result<Vec<RunEventKind>, UpstreamFault> {
    let parsed: EmbeddingsBody = serde_json::from_slice(body).map_err(|error| {
        UpstreamFault::Malformed(format!("not an embeddings list of floats: {error}"))
    })?;
    let mut events = Vec::new();
    let mut batch: Vec<Embedding> = Vec::new();
    let mut values = 0;
    for (position, item) in parsed.data.into_iter().enumerate() {
        if values + item.embedding.len() > MAX_VALUES_PER_EVENT && !batch.is_empty() {
            events.push(embeddings_output(std::mem::take(&mut batch)));
            values = 0;
        }
        values += item.embedding.len();
        batch.push(Embedding {
            index: item
                .index
                .unwrap_or(u32::try_from(position).unwrap_or(u32::MAX)),
            values: item.embedding,
        });
    }
    if !batch.is_empty() {
        events.push(embeddings_output(batch));
    }
    events.push(RunEventKind::Completed {
        finish_reason: "stop".into(),
        usage: parsed.usage.map(usage_from),
    });
    Ok(events)
}

fn embeddings_output(embeddings: Vec<Embedding>) -> RunEventKind {
    RunEventKind::Output {
        text: String::new(),
        data: Bytes::new(),
        structured: Some(Box::new(StructuredOutput {
            embeddings,
            ..StructuredOutput::default()
        })),
    }
}

#[cfg(test)]
#[path = "chunks_tests.rs"]
mod tests;
