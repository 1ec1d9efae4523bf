//! The tokenize operation and the prompt cache against a real llama.cpp `llama-server` (the
//! tiny test model), through a real edge and the reference node, compared with what the
//! engine itself answers:
//!
//! - `POST /v1/messages/count_tokens` counts exactly the prompt the engine then sees for the
//!   same Messages request (its `prompt_tokens`), and exactly what llama-server's own
//!   `/apply-template` + `/tokenize` give for the chat it becomes;
//! - `POST /tokenize` and `/detokenize` equal llama-server's own, text and chat;
//! - a second request sharing a long prefix reports the engine's cached prompt tokens in every
//!   API's usage (chat `prompt_tokens_details.cached_tokens`, Messages
//!   `cache_read_input_tokens`, Responses `input_tokens_details.cached_tokens`), equal to what
//!   a twin llama-server reports for the same requests sent to it directly.
//!
//! - a chat stream cancelled mid-way counts what the engine produced: at least the output
//!   pieces relayed, and the prompt tokens the engine counts for the same chat (the node asks
//!   llama-server for its running counts, `timings_per_token`).
//!
//! The stack is `engines_e2e`'s. One slot per engine (`--parallel 1`), so which cache a request meets is not up to
//! llama-server's slot choice: both engines see the same sequence and report the same counts.

use crate::common;
use crate::common::eventually_ok;

use crate::node_support::prompt as plain_run;
use bytes::Bytes;
use common::engines::{LlamaOptions, LlamaServer};
use common::runs::{next_event, rest, start as start_run};
use edge::domain::{NodeSelector, Operation, RunEventKind, RunSpec, Target};
use serde_json::{Value, json};

use crate::engines_e2e::{API_KEY, Stack};

const MODEL: &str = "llama/tiny";

/// The stack of `engines_e2e` with one engine slot.
async fn start() -> Stack {
    Stack::start(LlamaOptions::default().parallel(1)).await
}

/// POSTs `body` to the edge's `path`; the answer must be 200 and JSON.
async fn edge(stack: &Stack, path: &str, body: &Value) -> Value {
    let url = format!("http://{}{path}", stack.app.http_addr);
    post(stack.http.post(url).bearer_auth(API_KEY), body).await
}

/// POSTs `body` to llama-server's `path` (below its root); 200 and JSON.
async fn engine(stack: &Stack, path: &str, body: &Value) -> Value {
    let url = format!("{}{path}", stack.llama.base_url());
    post(stack.http.post(url), body).await
}

async fn post(request: reqwest::RequestBuilder, body: &Value) -> Value {
    let response = request.json(body).send().await.expect("an answer");
    let (status, url) = (response.status(), response.url().clone());
    let text = response.text().await.expect("a body");
    assert_eq!(status, 200, "POST {url} {body}: {text}");
    serde_json::from_str(&text).expect("JSON")
}

/// A long shared prefix: 20 times one sentence (about 240 tokens of the tiny model).
fn long_prefix(topic: &str) -> String {
    format!("About {topic}: the quick brown fox jumps over the lazy dog. ").repeat(20)
}

#[crate::common::test(flavor = "multi_thread", worker_threads = 2)]
async fn count_tokens_tokenize_and_detokenize_are_the_engines_own() {
    let stack = start().await;
    let messages = json!({
        "model": MODEL,
        "max_tokens": 1,
        "system": [{"type": "text", "text": "Be brief."}],
        "messages": [
            {"role": "user", "content": "Hi"},
            {"role": "assistant", "content": "Hello."},
            {"role": "system", "content": "Mind the reminder."},
            {"role": "user", "content": [{"type": "text", "text": "How are you?"}]},
        ],
    });
    let counted = edge(&stack, "/v1/messages/count_tokens", &messages).await;
    let count = counted["input_tokens"].as_u64().expect("input_tokens");
    // The chat the Messages request becomes, as llama-server renders and tokenizes it.
    let chat = json!({"messages": [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello."},
        {"role": "system", "content": "Mind the reminder."},
        {"role": "user", "content": "How are you?"},
    ]});
    let prompt = engine(&stack, "/apply-template", &chat).await["prompt"].clone();
    let body = json!({"content": prompt, "add_special": true, "parse_special": true});
    let engine_tokens = engine(&stack, "/tokenize", &body).await["tokens"].clone();
    assert_eq!(
        Some(count),
        engine_tokens.as_array().map(|t| t.len() as u64)
    );
    // And the engine's prompt for the same Messages request has exactly that many tokens.
    let answer = edge(&stack, "/v1/messages", &messages).await;
    let usage = &answer["usage"];
    let seen = usage["input_tokens"].as_u64().unwrap_or(0)
        + usage["cache_read_input_tokens"].as_u64().unwrap_or(0);
    assert_eq!(seen, count, "count_tokens {count}, the engine saw {usage}");

    // /tokenize and /detokenize, text and chat, equal llama-server's own.
    for add_special in [false, true] {
        let text = "Hello world, how are you?";
        let ours = json!({"model": MODEL, "content": text, "add_special": add_special});
        let theirs = json!({"content": text, "add_special": add_special});
        let tokens = edge(&stack, "/tokenize", &ours).await["tokens"].clone();
        assert_eq!(tokens, engine(&stack, "/tokenize", &theirs).await["tokens"]);
        let ours = json!({"model": MODEL, "tokens": tokens});
        let theirs = json!({"tokens": tokens});
        assert_eq!(
            edge(&stack, "/detokenize", &ours).await["content"],
            engine(&stack, "/detokenize", &theirs).await["content"]
        );
    }
    let mut chat_body = chat.clone();
    chat_body["model"] = json!(MODEL);
    let tokenized = edge(&stack, "/tokenize", &chat_body).await;
    assert_eq!(tokenized["tokens"], engine_tokens);
    assert_eq!(tokenized["count"], count);
    stack.stop().await;
}

/// One API's way to ask with a system text and a user text, and to read the cached prompt
/// tokens and the whole prompt's tokens of its usage.
struct Api {
    path: &'static str,
    request: fn(&str, &str) -> Value,
    cached: fn(&Value) -> u64,
    prompt: fn(&Value) -> u64,
}

fn number(value: &Value, pointer: &str) -> u64 {
    value.pointer(pointer).and_then(Value::as_u64).unwrap_or(0)
}

const APIS: [Api; 3] = [
    Api {
        path: "/v1/chat/completions",
        request: |system, user| {
            json!({"model": MODEL, "max_tokens": 2, "messages": [
                {"role": "system", "content": system}, {"role": "user", "content": user}]})
        },
        cached: |answer| number(answer, "/usage/prompt_tokens_details/cached_tokens"),
        prompt: |answer| number(answer, "/usage/prompt_tokens"),
    },
    Api {
        path: "/v1/messages",
        request: |system, user| {
            json!({"model": MODEL, "max_tokens": 2, "system": system,
                "messages": [{"role": "user", "content": user}]})
        },
        cached: |answer| number(answer, "/usage/cache_read_input_tokens"),
        prompt: |answer| {
            number(answer, "/usage/input_tokens") + number(answer, "/usage/cache_read_input_tokens")
        },
    },
    Api {
        path: "/v1/responses",
        request: |system, user| json!({"model": MODEL, "max_output_tokens": 2, "instructions": system, "input": user}),
        cached: |answer| number(answer, "/usage/input_tokens_details/cached_tokens"),
        prompt: |answer| number(answer, "/usage/input_tokens"),
    },
];

#[crate::common::test(flavor = "multi_thread", worker_threads = 2)]
async fn cached_prompt_tokens_reach_every_apis_usage_as_the_engine_counts_them() {
    let stack = start().await;
    // The engine's own answers to the same chats, sent to it directly in the same order.
    let twin = LlamaServer::start_with(LlamaOptions::default().parallel(1)).await;
    let twin_url = format!("{}/chat/completions", twin.v1_url());
    for api in &APIS {
        let system = long_prefix(api.path);
        for (turn, user) in ["First question?", "Second question?"]
            .into_iter()
            .enumerate()
        {
            let answer = edge(&stack, api.path, &(api.request)(&system, user)).await;
            let direct = (APIS[0].request)(&system, user);
            let engine = post(stack.http.post(&twin_url), &direct).await;
            let engine_cached = number(&engine, "/usage/prompt_tokens_details/cached_tokens");
            let engine_prompt = number(&engine, "/usage/prompt_tokens");
            assert_eq!(
                ((api.cached)(&answer), (api.prompt)(&answer)),
                (engine_cached, engine_prompt),
                "{} turn {turn}: {answer} against the engine's {engine}",
                api.path
            );
            if turn == 1 {
                assert!(
                    engine_cached > 200,
                    "{}: the shared prefix was read from the cache: {engine}",
                    api.path
                );
            }
        }
    }
    drop(twin);
    stack.stop().await;
}

/// Whether `kind` is an output the engine generated (text or reasoning).
fn is_generated(kind: &RunEventKind) -> bool {
    match kind {
        RunEventKind::Output {
            text, structured, ..
        } => !text.is_empty() || structured.as_ref().is_some_and(|s| !s.reasoning.is_empty()),
        _ => false,
    }
}

#[crate::common::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_cancelled_midway_counts_what_the_engine_produced() {
    let llama = LlamaOptions::default().parallel(1).context(4096);
    let stack = Stack::start_with_settings(llama, r#"timings_per_token = "true""#).await;
    let messages = json!([{"role": "user", "content": "Tell me a long story."}]);
    // The prompt's tokens as the engine counts them: the same chat, answered whole.
    let whole = json!({"model": MODEL, "max_tokens": 1, "messages": messages});
    let prompt = number(
        &edge(&stack, "/v1/chat/completions", &whole).await,
        "/usage/prompt_tokens",
    );
    // Far more output than the engine makes before the cancel reaches it.
    let body = json!({"messages": messages, "max_tokens": 3000, "ignore_eos": true});
    let spec = RunSpec {
        selector: NodeSelector {
            target: Target::parse("tiny").expect("target"),
            ..plain_run("").selector
        },
        input: Bytes::from(body.to_string()),
        content_type: "application/json".into(),
        operation: Operation::Chat,
        ..plain_run("")
    };
    let mut handle = start_run(&stack.app, spec);
    let mut relayed = 0;
    while relayed < 3 {
        relayed += usize::from(is_generated(&next_event(&mut handle).await.kind));
    }
    assert!(
        stack
            .app
            .parts
            .runs
            .cancel(&handle.run_id, "client_disconnected")
            .await
    );
    let events = rest(&mut handle).await;
    relayed += events.iter().filter(|e| is_generated(&e.kind)).count();
    let terminal = events.last().expect("a terminal event");
    assert_eq!(terminal.kind.name(), "cancelled", "{terminal:?}");
    let usage = terminal.kind.usage().expect("a cancelled run's usage");
    let output = usage.output_tokens as usize;
    assert!(
        (relayed..3000).contains(&output),
        "{relayed} pieces relayed, {usage:?} counted"
    );
    assert_eq!(u64::from(usage.input_tokens), prompt, "{usage:?}");
    assert!(usage.cached_input_tokens <= usage.input_tokens, "{usage:?}");
    stack.stop().await;
}

#[crate::common::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_messages_stream_says_its_prompt_tokens_at_message_start() {
    // Default settings: the node finds llama-server by its `/props` and asks for its counts.
    let stack = Stack::start(LlamaOptions::default().parallel(1)).await;
    models_listed_with_a_window(&stack).await;
    let body = json!({
        "model": MODEL, "max_tokens": 8, "stream": true,
        "messages": [{"role": "user", "content": long_prefix("tokens")}],
    });
    let url = format!("http://{}/v1/messages", stack.app.http_addr);
    let response = stack
        .http
        .post(url)
        .bearer_auth(API_KEY)
        .json(&body)
        .send()
        .await
        .expect("an answer");
    assert_eq!(response.status(), 200);
    let text = response.text().await.expect("the stream");
    let data = |name: &str| -> Value {
        let event = text
            .split("\n\n")
            .find(|event| event.starts_with(&format!("event: {name}\n")))
            .unwrap_or_else(|| panic!("no {name} in {text}"));
        let line = event
            .lines()
            .find_map(|l| l.strip_prefix("data: "))
            .expect("data");
        serde_json::from_str(line).expect("JSON")
    };
    let start = data("message_start");
    let delta = data("message_delta");
    let prompt =
        |usage: &Value| number(usage, "/input_tokens") + number(usage, "/cache_read_input_tokens");
    let at_start = prompt(&start["message"]["usage"]);
    assert!(at_start > 200, "the prompt's tokens at once: {start}");
    assert_eq!(at_start, prompt(&delta["usage"]), "{start} vs {delta}");
    stack.stop().await;
}

#[crate::common::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_prompt_over_the_engines_window_is_refused_in_each_apis_words() {
    // A 256-token window, and a prompt of about 500.
    let stack = Stack::start(LlamaOptions::default().parallel(1).context(256)).await;
    let user = long_prefix("overflow").repeat(2);
    let send = |path: &str, body: Value| {
        let url = format!("http://{}{path}", stack.app.http_addr);
        let request = stack.http.post(url).bearer_auth(API_KEY).json(&body);
        async move {
            let response = request.send().await.expect("an answer");
            let status = response.status();
            (status, response.json::<Value>().await.expect("JSON"))
        }
    };
    let messages = json!([{"role": "user", "content": user}]);
    let (status, body) = send(
        "/v1/messages",
        json!({"model": MODEL, "max_tokens": 8, "messages": messages}),
    )
    .await;
    assert_eq!(status, 400, "{body}");
    assert_eq!(body["error"]["type"], "invalid_request_error", "{body}");
    let said = body["error"]["message"].as_str().expect("a message");
    let sizes: Vec<u64> = said
        .strip_prefix("prompt is too long: ")
        .and_then(|rest| rest.strip_suffix(" maximum"))
        .map(|rest| {
            rest.split(" tokens > ")
                .filter_map(|n| n.parse().ok())
                .collect()
        })
        .unwrap_or_default();
    assert!(
        matches!(sizes[..], [prompt, 256] if prompt > 256),
        "Anthropic's words with both sizes: {said}"
    );
    let (status, body) = send(
        "/v1/chat/completions",
        json!({"model": MODEL, "max_tokens": 8, "messages": messages}),
    )
    .await;
    assert_eq!(status, 400, "{body}");
    assert_eq!(body["error"]["code"], "context_length_exceeded", "{body}");
    let said = body["error"]["message"].as_str().expect("a message");
    assert!(
        said.starts_with("This model's maximum context length is 256 tokens."),
        "{said}"
    );
    stack.stop().await;
}

/// The model as `/v1/models` lists it once its node has reported its window (its first
/// probe of the engine is done).
async fn models_listed_with_a_window(stack: &Stack) -> Value {
    let url = format!("http://{}/v1/models/{MODEL}", stack.app.http_addr);
    eventually_ok("the node reported its engine's window", || async {
        let model: Value = stack
            .http
            .get(&url)
            .bearer_auth(API_KEY)
            .send()
            .await
            .map_err(|error| error.to_string())?
            .json()
            .await
            .map_err(|error| error.to_string())?;
        match model["context_window"].as_u64() {
            Some(_) => Ok(model),
            None => Err(format!("no window yet: {model}")),
        }
    })
    .await
}

#[crate::common::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_engines_context_window_reaches_the_model_list() {
    let stack = Stack::start(LlamaOptions::default().parallel(1).context(2048)).await;
    let model = models_listed_with_a_window(&stack).await;
    // llama-server's own: a slot's window, as its /props says.
    let props: Value = stack
        .http
        .get(format!("{}/props", stack.llama.base_url()))
        .send()
        .await
        .expect("props")
        .json()
        .await
        .expect("JSON");
    let n_ctx = number(&props, "/default_generation_settings/n_ctx");
    assert_eq!(n_ctx, 2048, "{props}");
    assert_eq!(model["context_window"], n_ctx, "{model}");
    assert_eq!(model["max_input_tokens"], n_ctx, "{model}");
    stack.stop().await;
}
