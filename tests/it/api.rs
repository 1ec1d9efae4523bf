//! The OpenAI-compatible API over real HTTP: a real edge on port 0, mock nodes speaking the
//! real node protocol over real TCP, and `reqwest` as the client.
//!
//! Every scenario checks what a client sees (status, body, SSE chunks, headers) and, where
//! it matters, what the node received (the run's adapter, target, input and deadline, or a
//! `CancelRun`); each ends by checking that the edge forgot its runs.

use crate::common;
use crate::mock_node;

use std::time::Duration;

use common::runs::words;
use common::{TWO_NODES, TestApp, eventually, eventually_ok, spawn_app};
use edge::ports::{NodeCommand, RunAssignment};
use futures::StreamExt;
use mock_node::{Behaviour, MockNode, MockOptions};
use reqwest::{RequestBuilder, Response, StatusCode};
use serde_json::{Value, json};
use tokio::task::JoinHandle;

/// The longest any single asynchronous effect may take before a test gives up.
const PATIENCE: Duration = Duration::from_secs(10);

/// The chat completions endpoint.
const CHAT: &str = "/v1/chat/completions";
/// The (legacy) text completions endpoint.
const COMPLETIONS: &str = "/v1/completions";
/// The reason the edge gives a node when it cancels a run whose client went away.
const CLIENT_DISCONNECTED: &str = "client disconnected";

// ---------------------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------------------

/// An edge config with `TWO_NODES` plus `extra` sections.
fn config(extra: &str) -> String {
    format!("{TWO_NODES}\n{extra}\n")
}

/// Starts a mock node for `token` behaving as `behaviour`, pausing `delay` between words.
async fn node(app: &TestApp, token: &str, behaviour: Behaviour, delay: Duration) -> MockNode {
    let options = MockOptions {
        behaviour,
        delay,
        ..MockOptions::new(token)
    };
    MockNode::start(app.node_addr, options)
        .await
        .expect("mock node registers")
}

/// An echo node for `token` that answers at once.
async fn echo(app: &TestApp, token: &str) -> MockNode {
    node(app, token, Behaviour::Echo, Duration::ZERO).await
}

/// Starts an edge with `config` and a registered `node-a` behaving as `behaviour` at once.
async fn edge_with_node_a(config: &str, behaviour: Behaviour) -> (TestApp, MockNode) {
    let app = spawn_app(config).await;
    let node_a = node(&app, "token-a", behaviour, Duration::ZERO).await;
    app.wait_for_nodes(1).await;
    (app, node_a)
}

/// Kills `nodes`, then stops the edge.
async fn kill_and_stop(app: TestApp, nodes: impl IntoIterator<Item = MockNode>) {
    for node in nodes {
        node.kill();
    }
    app.stop().await;
}

/// Checks that the edge forgot its runs, then kills `nodes` and stops the edge.
async fn settle_and_stop(app: TestApp, nodes: impl IntoIterator<Item = MockNode>) {
    app.assert_settled().await;
    kill_and_stop(app, nodes).await;
}

/// An HTTP client that gives up after [`PATIENCE`].
fn client() -> reqwest::Client {
    crate::common::http()
        .timeout(PATIENCE)
        .build()
        .expect("client")
}

/// The edge's HTTP URL for `path`.
fn url(app: &TestApp, path: &str) -> String {
    format!("http://{}{path}", app.http_addr)
}

/// A POST to `path`, ready for a body and headers.
fn post_request(app: &TestApp, path: &str) -> RequestBuilder {
    client().post(url(app, path))
}

/// A GET of `path`, ready for headers.
fn get_request(app: &TestApp, path: &str) -> RequestBuilder {
    client().get(url(app, path))
}

/// Sends `request`, which must get a response.
async fn send(request: RequestBuilder) -> Response {
    request.send().await.expect("request")
}

/// POSTs `body` as JSON to `path`.
async fn post(app: &TestApp, path: &str, body: &Value) -> Response {
    send(post_request(app, path).json(body)).await
}

/// POSTs `body` as JSON to the chat completions endpoint.
async fn post_chat(app: &TestApp, body: &Value) -> Response {
    post(app, CHAT, body).await
}

/// GETs `path`.
async fn get(app: &TestApp, path: &str) -> Response {
    send(get_request(app, path)).await
}

/// The JSON body of a response that must be `200 OK`.
async fn ok_json(response: Response) -> Value {
    assert_eq!(response.status(), StatusCode::OK);
    response.json().await.expect("json")
}

/// The run id the edge names in a response's `x-edge-run-id` header.
fn run_id_of(response: &Response) -> String {
    response.headers()["x-edge-run-id"]
        .to_str()
        .unwrap()
        .to_owned()
}

/// A chat request for `model` whose last message says `content`.
fn chat(model: &str, content: &str) -> Value {
    json!({
        "model": model,
        "messages": [
            {"role": "system", "content": "you echo"},
            {"role": "user", "content": content},
        ],
    })
}

/// `body` with `stream: true` (and `stream_options.include_usage` when `usage`).
fn streaming(mut body: Value, usage: bool) -> Value {
    body["stream"] = json!(true);
    if usage {
        body["stream_options"] = json!({"include_usage": true});
    }
    body
}

/// `body` made [`streaming`] (with `usage`) when `stream`, else `body` unchanged.
fn streaming_if(stream: bool, body: Value, usage: bool) -> Value {
    if stream { streaming(body, usage) } else { body }
}

/// The error object of an OpenAI-shaped error body, checked for its four fields.
async fn error_of(response: Response) -> Value {
    let body: Value = response.json().await.expect("a JSON error body");
    let error = body["error"].clone();
    for field in ["message", "type", "param", "code"] {
        assert!(error.get(field).is_some(), "error lacks `{field}`: {body}");
    }
    assert!(
        error["message"].as_str().is_some_and(|m| !m.is_empty()),
        "{body}"
    );
    error
}

/// Asserts `response` is an OpenAI error with `status`; returns the error.
async fn assert_error_status(response: Response, status: StatusCode) -> Value {
    assert_eq!(response.status(), status);
    error_of(response).await
}

/// Asserts `response` is an OpenAI error with `status` and `code`; returns the error.
async fn assert_error(response: Response, status: StatusCode, code: &str) -> Value {
    let error = assert_error_status(response, status).await;
    assert_eq!(error["code"], code, "{error}");
    error
}

/// The `data:` payloads of an SSE body, in order.
fn sse_data(body: &str) -> Vec<String> {
    body.split("\n\n")
        .filter(|event| !event.trim().is_empty())
        .filter_map(|event| {
            let data: Vec<&str> = event
                .lines()
                .filter_map(|line| line.strip_prefix("data:"))
                .map(|d| d.strip_prefix(' ').unwrap_or(d))
                .collect();
            (!data.is_empty()).then(|| data.join("\n"))
        })
        .collect()
}

/// Reads a whole SSE response: the JSON chunks, and whether it ended with `[DONE]`.
async fn read_sse(response: Response) -> (Vec<Value>, bool) {
    let body = crate::api_support::event_stream_body(response).await;
    let data = sse_data(&body);
    let done = data.last().is_some_and(|d| d == "[DONE]");
    assert_eq!(
        data.iter().filter(|d| *d == "[DONE]").count(),
        usize::from(done),
        "[DONE] only at the end: {body}"
    );
    let chunks = data
        .iter()
        .filter(|d| *d != "[DONE]")
        .map(|d| serde_json::from_str(d).unwrap_or_else(|e| panic!("chunk is not JSON ({e}): {d}")))
        .collect();
    (chunks, done)
}

/// The runs the edge sent `node`.
fn runs_sent(node: &MockNode) -> Vec<RunAssignment> {
    node.commands()
        .into_iter()
        .filter_map(|c| match c {
            NodeCommand::Run(run) => Some(run),
            _ => None,
        })
        .collect()
}

/// The `(run id, reason)` of every cancel the edge sent `node`.
fn cancels_sent(node: &MockNode) -> Vec<(String, String)> {
    node.commands()
        .into_iter()
        .filter_map(|c| match c {
            NodeCommand::Cancel { run_id, reason } => Some((run_id.to_string(), reason)),
            _ => None,
        })
        .collect()
}

/// Waits until the edge has sent `node` a cancel; returns [`cancels_sent`] then.
async fn awaited_cancels(node: &MockNode) -> Vec<(String, String)> {
    eventually("the node received CancelRun", || {
        !cancels_sent(node).is_empty()
    })
    .await;
    cancels_sent(node)
}

/// The ids of `GET /v1/models`.
async fn model_ids(app: &TestApp) -> Vec<String> {
    let response = get(app, "/v1/models").await;
    assert_eq!(response.status(), StatusCode::OK);
    let body: Value = response.json().await.expect("json");
    assert_eq!(body["object"], "list");
    body["data"]
        .as_array()
        .expect("data is a list")
        .iter()
        .map(|m| {
            assert_eq!(m["object"], "model", "{m}");
            assert!(m["created"].is_u64(), "{m}");
            assert_eq!(m["owned_by"], "echo", "{m}");
            m["id"].as_str().expect("id").to_owned()
        })
        .collect()
}

/// The content of a list of chat chunks, concatenated.
fn chat_text(chunks: &[Value]) -> String {
    chunks
        .iter()
        .filter_map(|c| c["choices"][0]["delta"]["content"].as_str())
        .collect()
}

// ---------------------------------------------------------------------------------------
// GET /v1/models
// ---------------------------------------------------------------------------------------

#[crate::common::test]
async fn models_lists_what_the_connected_nodes_serve_right_now() {
    let app = spawn_app(&config(
        "[api.models]\n\"gpt-4o-mini\" = \"echo/fast\"\n\"ghost\" = \"ollama/llama3.1:8b\"\n",
    ))
    .await;
    assert!(model_ids(&app).await.is_empty());

    let node_a = echo(&app, "token-a").await;
    app.wait_for_nodes(1).await;
    assert_eq!(model_ids(&app).await, ["echo/default"]);

    let node_b = echo(&app, "token-b").await;
    app.wait_for_nodes(2).await;
    assert_eq!(
        model_ids(&app).await,
        ["echo/default", "echo/fast", "gpt-4o-mini"]
    );

    let one: Value = get(&app, "/v1/models/echo/fast")
        .await
        .json()
        .await
        .expect("json");
    assert_eq!(one["id"], "echo/fast");
    assert_eq!(one["object"], "model");
    assert_error(
        get(&app, "/v1/models/ghost").await,
        StatusCode::NOT_FOUND,
        "model_not_found",
    )
    .await;

    node_b.kill();
    app.wait_for_nodes(1).await;
    assert_eq!(model_ids(&app).await, ["echo/default"]);
    kill_and_stop(app, [node_a]).await;
}

#[crate::common::test]
async fn models_carry_the_smallest_context_window_their_nodes_reported() {
    use crate::admin_support::HandNode;
    use crate::common::NodeTable;
    // Hand-driven nodes send no heartbeats of their own: a long interval keeps them.
    let a = NodeTable::new("node-a", "gpu-a", "token-a")
        .runtime(2, 60_000)
        .echo(&["default"]);
    let b = NodeTable::new("node-b", "gpu-b", "token-b")
        .runtime(2, 60_000)
        .echo(&["default", "fast"]);
    let app = spawn_app(&format!(
        "{a}\n{b}\n[api.models]\n\"local\" = \"echo/default\"\n"
    ))
    .await;
    let mut a = HandNode::register(&app, "token-a").await;
    let mut b = HandNode::register(&app, "token-b").await;
    app.wait_for_nodes(2).await;
    // Before any report (a v1 node never sends one): no window.
    let one = |path: &'static str| {
        let app = &app;
        async move { get(app, path).await.json::<Value>().await.expect("json") }
    };
    assert!(
        one("/v1/models/echo/default")
            .await
            .get("context_window")
            .is_none()
    );
    a.report_windows(&[("echo", "default", 32_768)]).await;
    b.report_windows(&[("echo", "default", 8_192), ("echo", "fast", 0)])
        .await;
    let windows = |model: Value| {
        let field = |name: &str| model[name].as_u64();
        (
            field("context_window"),
            field("max_input_tokens"),
            field("max_tokens"),
        )
    };
    let smallest = (Some(8_192), Some(8_192), Some(8_192));
    eventually_ok("both reports are in", || async {
        let seen = windows(one("/v1/models/local").await);
        (seen == smallest).then_some(()).ok_or(format!("{seen:?}"))
    })
    .await;
    assert_eq!(windows(one("/v1/models/echo/default").await), smallest);
    // A target whose node knows no window has none.
    assert_eq!(
        windows(one("/v1/models/echo/fast").await),
        (None, None, None)
    );
    app.stop().await;
}

#[crate::common::test]
async fn a_prompt_clearly_over_the_models_window_is_refused_before_any_node_sees_it() {
    use crate::admin_support::HandNode;
    use crate::common::NodeTable;
    let a = NodeTable::new("node-a", "gpu-a", "token-a")
        .runtime(2, 60_000)
        .echo(&["default"]);
    let app = spawn_app(&a.to_string()).await;
    let mut node = HandNode::register(&app, "token-a").await;
    app.wait_for_nodes(1).await;
    node.report_windows(&[("echo", "default", 1_024)]).await;
    eventually_ok("the window is reported", || async {
        let model: Value = get(&app, "/v1/models/echo/default")
            .await
            .json()
            .await
            .map_err(|e| e.to_string())?;
        model["context_window"].as_u64().ok_or(format!("{model}"))
    })
    .await;
    // 100 kB: at least 3,200 tokens in any vocabulary, over a 1,024-token window.
    let long = "word ".repeat(20_000);
    let chat = json!({"model": "echo/default", "messages": [{"role": "user", "content": long}]});
    let response = post_chat(&app, &chat).await;
    assert_eq!(response.status(), StatusCode::BAD_REQUEST);
    let body: Value = response.json().await.expect("json");
    assert_eq!(body["error"]["code"], "context_length_exceeded", "{body}");
    let messages = json!({"model": "echo/default", "max_tokens": 8,
        "messages": [{"role": "user", "content": long}]});
    let response = send(post_request(&app, "/v1/messages").json(&messages)).await;
    assert_eq!(response.status(), StatusCode::BAD_REQUEST);
    let body: Value = response.json().await.expect("json");
    let said = body["error"]["message"].as_str().unwrap_or_default();
    assert!(
        said.starts_with("prompt is too long: ") && said.ends_with(" tokens > 1024 maximum"),
        "{said}"
    );
    // A prompt that may fit goes to the node, which judges it.
    let short = json!({"model": "echo/default", "messages": [{"role": "user", "content": "hi"}]});
    let answered = tokio::spawn({
        let request = post_request(&app, "/v1/chat/completions").json(&short);
        async move { send(request).await.status() }
    });
    let run = node.next_run().await;
    node.complete(&run.run_id, "hello").await;
    let answered = crate::common::bounded("the answer", answered).await;
    assert_eq!(answered.expect("the answer's task"), StatusCode::OK);
    app.stop().await;
}

// ---------------------------------------------------------------------------------------
// POST /v1/chat/completions
// ---------------------------------------------------------------------------------------

#[crate::common::test]
async fn chat_completion_answers_with_the_whole_completion() {
    let (app, node_a) = edge_with_node_a(TWO_NODES, Behaviour::Echo).await;

    let mut body = chat("echo/default", "hello brave new world");
    body["max_tokens"] = json!(64);
    body["max_completion_tokens"] = json!(32);
    body["temperature"] = json!(0.5);
    body["stream"] = json!(false);
    let response = post_chat(&app, &body).await;
    assert_eq!(response.status(), StatusCode::OK);
    let run_id = run_id_of(&response);
    // A whole answer has a known length (the request-slot wrapper keeps the size hint).
    let length = response.content_length().expect("content-length");
    let answer: Value = response.json().await.expect("json");
    assert_eq!(length, serde_json::to_vec(&answer).unwrap().len() as u64);
    assert_eq!(answer["object"], "chat.completion");
    assert_eq!(answer["id"], format!("chatcmpl-{run_id}"));
    assert_eq!(answer["model"], "echo/default");
    assert!(answer["created"].is_u64());
    let choice = &answer["choices"][0];
    assert_eq!(choice["index"], 0);
    assert_eq!(choice["message"]["role"], "assistant");
    assert_eq!(choice["message"]["content"], "hello brave new world");
    assert_eq!(choice["finish_reason"], "stop");
    assert_eq!(
        answer["usage"],
        json!({"prompt_tokens": 4, "completion_tokens": 4, "total_tokens": 8})
    );

    // The node got adapter + target and the body without `model` and `stream`.
    let runs = runs_sent(&node_a);
    assert_eq!(runs.len(), 1);
    let run = &runs[0];
    assert_eq!(run.run_id.as_str(), run_id);
    assert_eq!(
        (run.adapter.as_str(), run.target.as_str()),
        ("echo", "default")
    );
    assert_eq!(run.content_type, "application/json");
    // The default [api] deadline; the node gets what is left of it.
    assert!(
        (299_000..=300_000).contains(&run.deadline_ms),
        "{}",
        run.deadline_ms
    );
    let input: Value = serde_json::from_slice(&run.input).expect("JSON input");
    assert!(
        input.get("model").is_none() && input.get("stream").is_none(),
        "{input}"
    );
    assert_eq!(input["max_tokens"], 64);
    assert_eq!(input["max_completion_tokens"], 32);
    assert_eq!(input["temperature"], 0.5);
    assert_eq!(input["messages"], body["messages"]);

    settle_and_stop(app, [node_a]).await;
}

#[crate::common::test]
async fn chat_completion_streams_chunks_ending_with_done() {
    let (app, node_a) = edge_with_node_a(TWO_NODES, Behaviour::Echo).await;

    let response = post_chat(
        &app,
        &streaming(chat("echo/default", "one two three"), false),
    )
    .await;
    let run_id = run_id_of(&response);
    let (chunks, done) = read_sse(response).await;
    assert!(done, "{chunks:#?}");
    assert!(chunks.len() >= 3, "{chunks:#?}");
    for chunk in &chunks {
        assert_eq!(chunk["object"], "chat.completion.chunk");
        assert_eq!(chunk["id"], format!("chatcmpl-{run_id}"));
        assert_eq!(chunk["model"], "echo/default");
        assert!(
            chunk.get("usage").is_none(),
            "no usage unless asked: {chunk}"
        );
    }
    assert_eq!(chunks[0]["choices"][0]["delta"]["role"], "assistant");
    assert_eq!(chat_text(&chunks), "one two three");
    let last = chunks.last().unwrap();
    assert_eq!(last["choices"][0]["finish_reason"], "stop");
    assert!(
        chunks[..chunks.len() - 1]
            .iter()
            .all(|c| c["choices"][0]["finish_reason"].is_null())
    );

    settle_and_stop(app, [node_a]).await;
}

#[crate::common::test]
async fn include_usage_ends_the_stream_with_a_usage_chunk() {
    let (app, node_a) = edge_with_node_a(TWO_NODES, Behaviour::Echo).await;

    let response = post_chat(&app, &streaming(chat("echo/default", "a b c"), true)).await;
    let (chunks, done) = read_sse(response).await;
    assert!(done);
    let (usage, rest) = chunks.split_last().unwrap();
    assert_eq!(usage["choices"], json!([]));
    assert_eq!(
        usage["usage"],
        json!({"prompt_tokens": 3, "completion_tokens": 3, "total_tokens": 6})
    );
    assert!(
        rest.iter()
            .all(|c| c["usage"].is_null() && c.get("usage").is_some()),
        "{rest:#?}"
    );
    assert_eq!(rest.last().unwrap()["choices"][0]["finish_reason"], "stop");
    assert_eq!(chat_text(rest), "a b c");

    settle_and_stop(app, [node_a]).await;
}

// ---------------------------------------------------------------------------------------
// POST /v1/completions
// ---------------------------------------------------------------------------------------

#[crate::common::test]
async fn completions_answer_whole_and_streamed() {
    let (app, node_a) = edge_with_node_a(TWO_NODES, Behaviour::Echo).await;

    let body = json!({"model": "echo/default", "prompt": "say this please", "max_tokens": 5});
    let answer = ok_json(post(&app, COMPLETIONS, &body).await).await;
    assert_eq!(answer["object"], "text_completion");
    assert!(answer["id"].as_str().unwrap().starts_with("cmpl-"));
    assert_eq!(answer["choices"][0]["text"], "say this please");
    assert_eq!(answer["choices"][0]["finish_reason"], "stop");
    assert_eq!(answer["usage"]["total_tokens"], 6);
    let input: Value = serde_json::from_slice(&runs_sent(&node_a)[0].input).expect("JSON input");
    assert_eq!(input, json!({"prompt": "say this please", "max_tokens": 5}));

    let response = post(&app, COMPLETIONS, &streaming(body, true)).await;
    let (chunks, done) = read_sse(response).await;
    assert!(done);
    let (usage, rest) = chunks.split_last().unwrap();
    assert_eq!(usage["usage"]["completion_tokens"], 3);
    assert_eq!(usage["choices"], json!([]));
    let text: String = rest
        .iter()
        .filter_map(|c| c["choices"][0]["text"].as_str())
        .collect();
    assert_eq!(text, "say this please");
    assert!(rest.iter().all(|c| c["object"] == "text_completion"));
    assert_eq!(rest.last().unwrap()["choices"][0]["finish_reason"], "stop");

    settle_and_stop(app, [node_a]).await;
}

// ---------------------------------------------------------------------------------------
// Model mapping
// ---------------------------------------------------------------------------------------

#[crate::common::test]
async fn an_alias_routes_to_its_adapter_and_target() {
    let app = spawn_app(&config("[api.models]\n\"gpt-4o-mini\" = \"echo/fast\"\n")).await;
    let node_a = echo(&app, "token-a").await;
    let node_b = echo(&app, "token-b").await;
    app.wait_for_nodes(2).await;

    for _ in 0..3 {
        let answer = ok_json(post_chat(&app, &chat("gpt-4o-mini", "via alias")).await).await;
        assert_eq!(
            answer["model"], "gpt-4o-mini",
            "answers name the model as asked"
        );
        assert_eq!(answer["choices"][0]["message"]["content"], "via alias");
    }
    // Only node-b serves echo/fast.
    assert!(runs_sent(&node_a).is_empty());
    let runs = runs_sent(&node_b);
    assert_eq!(runs.len(), 3);
    assert!(
        runs.iter()
            .all(|r| r.adapter.as_str() == "echo" && r.target.as_str() == "fast")
    );

    settle_and_stop(app, [node_a, node_b]).await;
}

// ---------------------------------------------------------------------------------------
// Errors before a run starts
// ---------------------------------------------------------------------------------------

#[crate::common::test]
async fn malformed_json_and_missing_fields_are_400() {
    let (app, node_a) = edge_with_node_a(TWO_NODES, Behaviour::Echo).await;

    for path in [CHAT, COMPLETIONS] {
        let response = send(
            post_request(&app, path)
                .header("content-type", "application/json")
                .body("{\"model\": \"echo/default\", \"messages\": ["),
        )
        .await;
        let error = assert_error_status(response, StatusCode::BAD_REQUEST).await;
        assert_eq!(error["type"], "invalid_request_error");
    }

    for (path, body, missing) in [
        (CHAT, json!({"model": "echo/default"}), "messages"),
        (COMPLETIONS, json!({"model": "echo/default"}), "prompt"),
        (
            CHAT,
            json!({"messages": [{"role": "user", "content": "x"}]}),
            "model",
        ),
    ] {
        let error = assert_error(
            post(&app, path, &body).await,
            StatusCode::BAD_REQUEST,
            "missing_required_parameter",
        )
        .await;
        assert_eq!(error["param"], missing);
    }

    assert!(runs_sent(&node_a).is_empty(), "no run for a bad request");
    kill_and_stop(app, [node_a]).await;
}

#[crate::common::test]
async fn api_keys_are_required_when_configured_and_ops_endpoints_stay_open() {
    let (app, node_a) = edge_with_node_a(
        &config("[api]\nkeys = [\"sk-test-one\", \"sk-test-two\"]\n"),
        Behaviour::Echo,
    )
    .await;

    let body = chat("echo/default", "secret stuff");
    let missing = post_chat(&app, &body).await;
    assert!(missing.headers().contains_key("www-authenticate"));
    assert_error(missing, StatusCode::UNAUTHORIZED, "invalid_api_key").await;
    let wrong = send(
        post_request(&app, CHAT)
            .bearer_auth("sk-test-three")
            .json(&body),
    )
    .await;
    assert_error(wrong, StatusCode::UNAUTHORIZED, "invalid_api_key").await;
    let models = get(&app, "/v1/models").await;
    assert_error(models, StatusCode::UNAUTHORIZED, "invalid_api_key").await;
    assert!(runs_sent(&node_a).is_empty());

    let right = send(
        post_request(&app, CHAT)
            .bearer_auth("sk-test-two")
            .json(&body),
    )
    .await;
    assert_eq!(right.status(), StatusCode::OK);
    let models = send(get_request(&app, "/v1/models").bearer_auth("sk-test-one")).await;
    assert_eq!(models.status(), StatusCode::OK);

    for path in ["/healthz", "/readyz", "/metrics"] {
        assert_eq!(get(&app, path).await.status(), StatusCode::OK, "{path}");
    }
    settle_and_stop(app, [node_a]).await;
}

#[crate::common::test]
async fn an_unknown_model_is_404() {
    let (app, node_a) = edge_with_node_a(TWO_NODES, Behaviour::Echo).await;

    // (`echo/fast` is configured on node-b, which is away: not unknown, its runs wait; see
    // tests/it/routing.rs.)
    for model in [
        "echo/other",
        "ollama/llama3.1:8b",
        "gpt-4o",
        "bad adapter/x",
    ] {
        let error = assert_error(
            post_chat(&app, &chat(model, "hi")).await,
            StatusCode::NOT_FOUND,
            "model_not_found",
        )
        .await;
        assert!(
            error["message"].as_str().unwrap().contains(model),
            "{error}"
        );
        let streamed = post(
            &app,
            COMPLETIONS,
            &streaming(json!({"model": model, "prompt": "x"}), false),
        )
        .await;
        assert_error(streamed, StatusCode::NOT_FOUND, "model_not_found").await;
    }
    let unknown = get(&app, "/v1/nothing-here").await;
    assert_error(unknown, StatusCode::NOT_FOUND, "unknown_url").await;

    assert!(runs_sent(&node_a).is_empty());
    kill_and_stop(app, [node_a]).await;
}

#[crate::common::test]
async fn an_oversized_body_is_413() {
    let (app, node_a) =
        edge_with_node_a(&config("[api]\nmax_body_bytes = 1024\n"), Behaviour::Echo).await;

    let big = "word ".repeat(400);
    assert_error(
        post_chat(&app, &chat("echo/default", &big)).await,
        StatusCode::PAYLOAD_TOO_LARGE,
        "request_too_large",
    )
    .await;
    let fits = post_chat(&app, &chat("echo/default", "small")).await;
    assert_eq!(fits.status(), StatusCode::OK);

    assert_eq!(runs_sent(&node_a).len(), 1);
    settle_and_stop(app, [node_a]).await;
}

// ---------------------------------------------------------------------------------------
// No capacity: 429 and 503 with Retry-After
// ---------------------------------------------------------------------------------------

/// Sends a chat request in the background; its result comes back through the handle.
fn background(app: &TestApp, body: Value) -> JoinHandle<reqwest::Result<Response>> {
    tokio::spawn(post_request(app, CHAT).json(&body).send())
}

/// Sends `count` chat requests in the background (`hang 0`, `hang 1`, ...).
fn background_chats(app: &TestApp, count: usize) -> Vec<JoinHandle<reqwest::Result<Response>>> {
    (0..count)
        .map(|i| background(app, chat("echo/default", &format!("hang {i}"))))
        .collect()
}

/// Aborts `requests`, as clients that give up waiting.
fn abort_all(requests: Vec<JoinHandle<reqwest::Result<Response>>>) {
    for request in requests {
        request.abort();
    }
}

#[crate::common::test]
async fn a_full_queue_is_429_with_retry_after() {
    let (app, node_a) = edge_with_node_a(
        &config("[runs]\nqueue_capacity = 1\n[api]\nretry_after_secs = 3\n"),
        Behaviour::Hang,
    )
    .await;

    // Two runs fill node-a's two slots, a third waits in the one-place queue.
    let waiting = background_chats(&app, 3);
    let runs = app.parts.runs.clone();
    eventually("two runs on the node and one queued", || {
        runs.open_runs() == 3 && runs.queued_runs() == 1
    })
    .await;

    let full = post_chat(&app, &chat("echo/default", "one too many")).await;
    assert_eq!(full.headers()["retry-after"], "3");
    let error = assert_error(full, StatusCode::TOO_MANY_REQUESTS, "queue_full").await;
    assert_eq!(error["type"], "rate_limit_error");

    // The waiting clients give up; their runs are cancelled and the edge settles.
    abort_all(waiting);
    app.assert_settled().await;
    assert_eq!(
        cancels_sent(&node_a).len(),
        2,
        "the two dispatched runs were cancelled"
    );
    kill_and_stop(app, [node_a]).await;
}

#[crate::common::test]
async fn an_expired_queue_wait_is_503_with_retry_after() {
    let (app, node_a) =
        edge_with_node_a(&config("[runs]\nqueue_timeout_ms = 200\n"), Behaviour::Hang).await;

    let holding = background_chats(&app, 2);
    let runs = app.parts.runs.clone();
    eventually("both slots taken", || runs.open_runs() == 2).await;

    for stream in [false, true] {
        let body = streaming_if(stream, chat("echo/default", "waits too long"), true);
        let expired = post_chat(&app, &body).await;
        assert_eq!(expired.headers()["retry-after"], "1");
        assert_error(expired, StatusCode::SERVICE_UNAVAILABLE, "queue_timeout").await;
    }

    abort_all(holding);
    settle_and_stop(app, [node_a]).await;
}

// ---------------------------------------------------------------------------------------
// Deadlines: 504
// ---------------------------------------------------------------------------------------

#[crate::common::test]
async fn a_missed_deadline_is_504_and_the_header_is_capped() {
    let (app, node_a) = edge_with_node_a(
        &config("[api]\ndefault_deadline_ms = 100\nmax_deadline_ms = 150\n"),
        Behaviour::Hang,
    )
    .await;

    for (header, stream) in [("100", false), ("100", true), ("999999", false)] {
        let body = streaming_if(stream, chat("echo/default", "too slow"), false);
        let response = send(
            post_request(&app, CHAT)
                .header("x-edge-deadline-ms", header)
                .json(&body),
        )
        .await;
        assert_error(response, StatusCode::GATEWAY_TIMEOUT, "deadline_exceeded").await;
    }
    // The header's deadline, capped at max_deadline_ms (the node gets what is left of it).
    let deadlines: Vec<u32> = runs_sent(&node_a).iter().map(|r| r.deadline_ms).collect();
    assert_eq!(deadlines.len(), 3);
    for (deadline, asked) in deadlines.iter().zip([100, 100, 150]) {
        assert!((asked - 20..=asked).contains(deadline), "{deadlines:?}");
    }
    assert!(
        cancels_sent(&node_a)
            .iter()
            .all(|(_, reason)| reason == "deadline exceeded")
    );

    let bad = send(
        post_request(&app, CHAT)
            .header("x-edge-deadline-ms", "soon")
            .json(&chat("echo/default", "x")),
    )
    .await;
    assert_error_status(bad, StatusCode::BAD_REQUEST).await;

    settle_and_stop(app, [node_a]).await;
}

// ---------------------------------------------------------------------------------------
// Node failures: 502 before streaming, an error chunk after
// ---------------------------------------------------------------------------------------

#[crate::common::test]
async fn a_node_failure_before_streaming_is_502() {
    // Non-streaming: the node fails the run after some output.
    let (app, failing) = edge_with_node_a(
        &config("[runs]\nno_node_timeout_ms = 300\n"),
        Behaviour::Fail,
    )
    .await;
    let error = assert_error(
        post_chat(&app, &chat("echo/default", "fail please")).await,
        StatusCode::BAD_GATEWAY,
        "mock_failure",
    )
    .await;
    assert_eq!(error["type"], "server_error");
    app.assert_settled().await;
    failing.kill();
    app.wait_for_nodes(0).await;

    // Streaming: the node dies before its first output, so no stream has begun. The run is
    // failed over, but no other node is there: 503 once the wait for one expires.
    let hanging = node(&app, "token-b", Behaviour::Hang, Duration::ZERO).await;
    app.wait_for_nodes(1).await;
    let request = background(
        &app,
        streaming(chat("echo/default", "never answered"), true),
    );
    eventually("the run reached the node", || {
        !runs_sent(&hanging).is_empty()
    })
    .await;
    hanging.kill();
    let response = common::bounded("the streamed request to be answered", request)
        .await
        .expect("task")
        .expect("request");
    assert_eq!(response.headers()["retry-after"], "1");
    let error = assert_error(
        response,
        StatusCode::SERVICE_UNAVAILABLE,
        "no_node_available",
    )
    .await;
    assert!(
        error["message"]
            .as_str()
            .is_some_and(|m| m.contains("node_disconnected")),
        "{error}"
    );

    settle_and_stop(app, []).await;
}

#[crate::common::test]
async fn a_node_failure_after_streaming_began_is_an_error_chunk() {
    let (app, failing) = edge_with_node_a(TWO_NODES, Behaviour::Fail).await;

    for path in [CHAT, COMPLETIONS] {
        let body = json!({
            "model": "echo/default",
            "messages": [{"role": "user", "content": "partial answer"}],
            "prompt": "partial answer",
        });
        let (chunks, done) = read_sse(post(&app, path, &streaming(body, true)).await).await;
        assert!(!done, "no [DONE] after a failure: {chunks:#?}");
        let (error, before) = chunks.split_last().unwrap();
        assert!(
            before.iter().any(|c| {
                c["choices"][0]["delta"]["content"] == "partial "
                    || c["choices"][0]["text"] == "partial "
            }),
            "the output before the failure was streamed: {chunks:#?}"
        );
        assert_eq!(error["error"]["code"], "mock_failure", "{error}");
        assert_eq!(error["error"]["type"], "server_error");
        assert!(error["error"].get("param").is_some());
    }

    settle_and_stop(app, [failing]).await;
}

// ---------------------------------------------------------------------------------------
// Client disconnects cancel the run on the node
// ---------------------------------------------------------------------------------------

#[crate::common::test]
async fn a_client_disconnecting_mid_stream_cancels_the_run() {
    // No grace for a resume: the run is cancelled as soon as its reader goes.
    let app = spawn_app(&config("[runs]\nclient_resume_grace_ms = 0")).await;
    let slow = node(&app, "token-a", Behaviour::Echo, Duration::from_millis(20)).await;
    app.wait_for_nodes(1).await;

    let response = post_chat(&app, &streaming(chat("echo/default", &words(500)), false)).await;
    assert_eq!(response.status(), StatusCode::OK);
    let run_id = run_id_of(&response);
    let mut body = response.bytes_stream();
    let mut seen = String::new();
    while !seen.contains("w1 ") {
        let bytes = tokio::time::timeout(PATIENCE, body.next())
            .await
            .expect("a chunk in time")
            .expect("the stream goes on")
            .expect("bytes");
        seen.push_str(&String::from_utf8_lossy(&bytes));
    }
    drop(body);

    assert_eq!(
        awaited_cancels(&slow).await,
        [(run_id, CLIENT_DISCONNECTED.to_owned())]
    );
    settle_and_stop(app, [slow]).await;
}

#[crate::common::test]
async fn a_client_giving_up_on_a_whole_answer_cancels_the_run() {
    let (app, hanging) = edge_with_node_a(TWO_NODES, Behaviour::Hang).await;

    let impatient = crate::common::http()
        .timeout(Duration::from_millis(300))
        .build()
        .expect("client");
    let outcome = impatient
        .post(url(&app, COMPLETIONS))
        .json(&json!({"model": "echo/default", "prompt": "never answered"}))
        .send()
        .await;
    assert!(outcome.is_err_and(|e| e.is_timeout()));

    let cancels = awaited_cancels(&hanging).await;
    let run_id = runs_sent(&hanging)[0].run_id.to_string();
    assert_eq!(cancels, [(run_id, CLIENT_DISCONNECTED.to_owned())]);
    settle_and_stop(app, [hanging]).await;
}
