//! What the `openai` adapter asks the engine for: the endpoint and the JSON body, built from
//! a run's operation, content type and input.
//!
//! Pure. The edge sends OpenAI bodies without `model` and `stream`; this adds the upstream
//! model name, always streams chat and completions (so a cancel or a deadline can stop the
//! engine promptly, and the first token arrives as soon as it exists), asks for the usage
//! chunk (and, when set, llama-server's per-chunk counts), and asks embeddings for floats.
//! A console run's plain text becomes one user message. A request for an engine the edge
//! manages through Ollama's own verbs loses Ollama's knobs (`keep_alive`, `options.num_ctx`):
//! either would change what the edge placed. A continuation (a run another node began) goes on from the text already
//! relayed: chat gets it as a trailing assistant message to continue, completions get it
//! after the prompt, and the token budget shrinks by what was generated; nothing else is
//! added.

use edge::client::RunAssignment;
use edge::domain::{Continuation, Operation};

use super::settings::{Lifecycle, OpenAiSettings};
use serde_json::{Map, Value, json};

/// Which OpenAI endpoint a run goes to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Endpoint {
    /// `POST {base_url}/chat/completions`, streamed.
    Chat,
    /// `POST {base_url}/completions`, streamed.
    Completions,
    /// `POST {base_url}/embeddings`, one JSON answer.
    Embeddings,
}

impl Endpoint {
    /// The path below the base URL.
    pub fn path(self) -> &'static str {
        match self {
            Self::Chat => "/chat/completions",
            Self::Completions => "/completions",
            Self::Embeddings => "/embeddings",
        }
    }

    /// Whether the answer is a server-sent event stream.
    pub fn streams(self) -> bool {
        !matches!(self, Self::Embeddings)
    }
}

/// One request to the engine.
#[derive(Debug, Clone, PartialEq)]
pub struct UpstreamCall {
    /// Where it goes.
    pub endpoint: Endpoint,
    /// What it sends.
    pub body: Value,
}

impl UpstreamCall {
    /// Asks llama.cpp's `llama-server` for its running counts on every chunk
    /// (`timings_per_token`), when the answer streams.
    pub fn ask_running_counts(&mut self) {
        if self.endpoint.streams()
            && let Value::Object(body) = &mut self.body
        {
            body.insert("timings_per_token".into(), Value::Bool(true));
        }
    }
}

/// Why a run's input cannot become a request (the caller's fault: a `REQUEST` failure).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct InvalidInput(pub String);

/// The request for `run`, naming `model` upstream, as `settings` say (the usage chunk, how
/// a chat continuation is asked for).
///
/// # Errors
/// [`InvalidInput`] when a JSON input is not a JSON object, or a text input is not UTF-8,
/// or a continued completion's prompt is not one text.
pub fn build(
    run: &RunAssignment,
    model: &str,
    settings: &OpenAiSettings,
) -> Result<UpstreamCall, InvalidInput> {
    let json = run
        .content_type
        .trim_start()
        .starts_with("application/json");
    let endpoint = match run.operation {
        Operation::Chat | Operation::Unspecified => Endpoint::Chat,
        Operation::Completion => Endpoint::Completions,
        Operation::Embeddings => Endpoint::Embeddings,
        Operation::Tokenize | Operation::Detokenize => {
            return Err(InvalidInput(format!(
                "a {} run is not a completion request",
                run.operation.as_str()
            )));
        }
    };
    let mut body = if json {
        object(&run.input)?
    } else {
        text_body(endpoint, &run.input)?
    };
    if let Some(continuation) = &run.continuation {
        continue_from(
            &mut body,
            endpoint,
            continuation,
            settings.continue_final_message,
        )?;
    }
    if settings.lifecycle == Some(Lifecycle::Ollama) {
        without_ollama_knobs(&mut body);
    }
    body.insert("model".into(), Value::String(model.to_owned()));
    if endpoint.streams() {
        body.insert("stream".into(), Value::Bool(true));
        if settings.timings_per_token == Some(true) {
            body.insert("timings_per_token".into(), Value::Bool(true));
        }
        if settings.stream_usage {
            let options = body
                .entry("stream_options")
                .or_insert_with(|| Value::Object(Map::new()));
            if let Value::Object(options) = options {
                options.insert("include_usage".into(), Value::Bool(true));
            }
        }
    } else {
        body.remove("stream");
        body.insert("encoding_format".into(), Value::String("float".into()));
    }
    Ok(UpstreamCall {
        endpoint,
        body: Value::Object(body),
    })
}

/// Makes `body` go on from `continuation`'s text: a trailing assistant message for chat
/// (with vLLM's and SGLang's flags when `final_message_flags`), the prompt followed by the
/// text for completions; the token budget less what was generated (at least 1).
fn continue_from(
    body: &mut Map<String, Value>,
    endpoint: Endpoint,
    continuation: &Continuation,
    final_message_flags: bool,
) -> Result<(), InvalidInput> {
    let text = continuation.text.as_str();
    match endpoint {
        Endpoint::Chat => {
            let Some(Value::Array(messages)) = body.get_mut("messages") else {
                return Err(InvalidInput("a continued chat has no `messages`".into()));
            };
            messages.push(json!({ "role": "assistant", "content": text }));
            if final_message_flags {
                body.insert("continue_final_message".into(), Value::Bool(true));
                body.insert("add_generation_prompt".into(), Value::Bool(false));
            }
        }
        Endpoint::Completions => {
            let prompt = match body.get("prompt") {
                Some(Value::String(prompt)) => prompt.clone(),
                Some(Value::Array(parts)) if parts.len() == 1 => parts[0]
                    .as_str()
                    .map(str::to_owned)
                    .ok_or_else(|| InvalidInput("a continued prompt must be text".into()))?,
                _ => return Err(InvalidInput("a continued prompt must be one text".into())),
            };
            body.insert("prompt".into(), Value::String(prompt + text));
        }
        Endpoint::Embeddings => return Ok(()),
    }
    for key in ["max_tokens", "max_completion_tokens"] {
        if let Some(budget) = body.get(key).and_then(Value::as_u64) {
            let left = budget.saturating_sub(u64::from(continuation.output_tokens));
            body.insert(key.into(), Value::from(left.max(1)));
        }
    }
    Ok(())
}

/// Drops what would make Ollama unload the model or load it again with another window: a
/// client's `keep_alive` (how long the runner stays) and `options.num_ctx` (its window;
/// another one reloads the runner, `sched.go` `needsReload`).
fn without_ollama_knobs(body: &mut Map<String, Value>) {
    body.remove("keep_alive");
    if let Some(Value::Object(options)) = body.get_mut("options") {
        options.remove("num_ctx");
        if options.is_empty() {
            body.remove("options");
        }
    }
}

fn object(input: &[u8]) -> Result<Map<String, Value>, InvalidInput> {
    match serde_json::from_slice(input) {
        Ok(Value::Object(map)) => Ok(map),
        Ok(_) => Err(InvalidInput("the JSON input is not an object".into())),
        Err(error) => Err(InvalidInput(format!(
            "the input is not valid JSON: {error}"
        ))),
    }
}

/// A plain-text prompt as the body of `endpoint`.
fn text_body(endpoint: Endpoint, input: &[u8]) -> Result<Map<String, Value>, InvalidInput> {
    let text = std::str::from_utf8(input)
        .map_err(|_| InvalidInput("the text input is not UTF-8".into()))?;
    let body = match endpoint {
        Endpoint::Chat => json!({ "messages": [{ "role": "user", "content": text }] }),
        Endpoint::Completions => json!({ "prompt": text }),
        Endpoint::Embeddings => json!({ "input": text }),
    };
    match body {
        Value::Object(map) => Ok(map),
        _ => Ok(Map::new()),
    }
}

#[cfg(test)]
mod tests {
    use bytes::Bytes;
    use edge::domain::{AdapterName, RunId, Target};

    use super::*;

    fn run(operation: Operation, content_type: &str, input: &str) -> RunAssignment {
        RunAssignment {
            run_id: RunId::new("r1"),
            adapter: AdapterName::parse("llama").expect("adapter"),
            target: Target::parse("qwen").expect("target"),
            input: Bytes::from(input.to_owned()),
            content_type: content_type.into(),
            params: Default::default(),
            deadline_ms: 0,
            operation,
            continuation: None,
            lora: None,
        }
    }

    fn settings(stream_usage: bool) -> OpenAiSettings {
        let map = [
            ("base_url", "http://127.0.0.1:1/v1"),
            ("stream_usage", if stream_usage { "true" } else { "false" }),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect();
        OpenAiSettings::parse(&map).expect("valid").0
    }

    fn continued(mut run: RunAssignment) -> RunAssignment {
        run.continuation = Some(Continuation {
            text: "Once upon".into(),
            output_tokens: 2,
            number: 1,
        });
        run
    }

    #[test]
    fn ollama_never_gets_a_clients_keep_alive_or_window() {
        let input = r#"{"messages":[{"role":"user","content":"hi"}],"keep_alive":-1,
            "options":{"num_ctx":32768,"temperature":0.2}}"#;
        let chat = run(Operation::Chat, "application/json", input);
        let mut ollama = settings(true);
        ollama.lifecycle = Some(Lifecycle::Ollama);
        let call = build(&chat, "qwen2.5:0.5b", &ollama).expect("builds");
        assert!(call.body.get("keep_alive").is_none(), "{}", call.body);
        assert_eq!(call.body["options"], json!({"temperature": 0.2}));
        let bare = r#"{"messages":[],"options":{"num_ctx":8192}}"#;
        let call = build(
            &run(Operation::Chat, "application/json", bare),
            "m",
            &ollama,
        )
        .expect("builds");
        assert!(call.body.get("options").is_none(), "{}", call.body);
        // Other engines get the body as the client wrote it.
        let call = build(&chat, "m", &settings(true)).expect("builds");
        assert_eq!(call.body["keep_alive"], -1);
    }

    #[test]
    fn a_continued_chat_ends_with_the_text_so_far_as_an_assistant_message() {
        let input = r#"{"messages":[{"role":"user","content":"tell"}],"max_tokens":10}"#;
        let run = continued(run(Operation::Chat, "application/json", input));
        let call = build(&run, "up", &settings(false)).expect("builds");
        assert_eq!(
            call.body["messages"],
            json!([{"role": "user", "content": "tell"}, {"role": "assistant", "content": "Once upon"}])
        );
        assert_eq!(call.body["max_tokens"], 8);
        assert!(call.body.get("continue_final_message").is_none());
        let mut vllm = settings(false);
        vllm.continue_final_message = true;
        let call = build(&run, "up", &vllm).expect("builds");
        assert_eq!(call.body["continue_final_message"], true);
        assert_eq!(call.body["add_generation_prompt"], false);
    }

    #[test]
    fn a_continued_completion_is_the_prompt_then_the_text_so_far() {
        let input = r#"{"prompt":"Tell: ","max_tokens":2}"#;
        let run = continued(run(Operation::Completion, "application/json", input));
        let call = build(&run, "up", &settings(false)).expect("builds");
        assert_eq!(call.body["prompt"], "Tell: Once upon");
        assert_eq!(call.body["max_tokens"], 1);
        let tokens = continued(run_of_prompt(json!([[1, 2, 3]])));
        assert!(build(&tokens, "up", &settings(false)).is_err());
    }

    fn run_of_prompt(prompt: Value) -> RunAssignment {
        let input = json!({ "prompt": prompt }).to_string();
        run(Operation::Completion, "application/json", &input)
    }

    #[test]
    fn a_console_prompt_becomes_one_streamed_user_message() {
        let call = build(
            &run(Operation::Unspecified, "text/plain; charset=utf-8", "hello"),
            "up",
            &settings(true),
        )
        .expect("builds");
        assert_eq!(call.endpoint, Endpoint::Chat);
        assert_eq!(
            call.body,
            json!({
                "messages": [{"role": "user", "content": "hello"}],
                "model": "up", "stream": true, "stream_options": {"include_usage": true}
            })
        );
        let mut llama = settings(true);
        llama.timings_per_token = Some(true);
        let run = run(Operation::Chat, "application/json", r#"{"messages":[]}"#);
        let call = build(&run, "up", &llama).expect("builds");
        assert_eq!(call.body["timings_per_token"], true);
    }

    #[test]
    fn json_bodies_keep_their_fields_and_get_model_and_stream() {
        let input = r#"{"messages":[{"role":"user","content":"hi"}],"tools":[],"logprobs":true,"model":"caller's","stream_options":{"x":1}}"#;
        for operation in [Operation::Unspecified, Operation::Chat] {
            let call = build(
                &run(operation, "application/json", input),
                "up",
                &settings(true),
            )
            .expect("builds");
            assert_eq!(call.endpoint, Endpoint::Chat);
            assert_eq!(call.body["model"], "up");
            assert_eq!(call.body["logprobs"], true);
            assert_eq!(
                call.body["stream_options"],
                json!({"x": 1, "include_usage": true})
            );
        }
        let call = build(
            &run(
                Operation::Completion,
                "application/json",
                r#"{"prompt":"a"}"#,
            ),
            "up",
            &settings(false),
        )
        .expect("builds");
        assert_eq!(call.endpoint, Endpoint::Completions);
        assert_eq!(
            call.body,
            json!({"prompt": "a", "model": "up", "stream": true})
        );
    }

    #[test]
    fn embeddings_are_not_streamed_and_ask_for_floats() {
        let input = r#"{"input":["a","b"],"encoding_format":"base64","stream":true}"#;
        let call = build(
            &run(Operation::Embeddings, "application/json", input),
            "emb",
            &settings(true),
        )
        .expect("builds");
        assert_eq!(call.endpoint, Endpoint::Embeddings);
        assert_eq!(
            call.body,
            json!({"input": ["a", "b"], "model": "emb", "encoding_format": "float"})
        );
    }

    #[test]
    fn inputs_that_are_not_objects_are_invalid() {
        for input in ["[1]", "not json", "\"text\""] {
            assert!(
                build(
                    &run(Operation::Chat, "application/json", input),
                    "m",
                    &settings(true)
                )
                .is_err()
            );
        }
    }
}
