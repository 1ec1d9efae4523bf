//! The tokenize operation over real TCP: `POST /v1/messages/count_tokens`, `/tokenize` and
//! `/detokenize` through a real edge and mock nodes (whose tokenizer gives one token per
//! byte, see `mock_node::scripts::tokenize`), and the capability gate: a node that did not
//! declare tokenize at registration (a v1-style node) never gets a tokenize run, and a model
//! whose connected nodes all lack it is answered 501 `not_supported` at once.

use crate::api_support;

use api_support::{client, ok_json};
use edge::domain::Operation;
use edge::ports::{NodeCommand, RunAssignment};
use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::common::{TWO_NODES, TestApp, spawn_app};
use crate::mock_node::{MockNode, MockOptions};

const MODEL: &str = "echo/default";

/// Starts a mock node for `token`, declaring tokenize or not.
async fn node(app: &TestApp, token: &str, tokenize: bool) -> MockNode {
    let options = MockOptions {
        tokenize,
        ..MockOptions::new(token)
    };
    MockNode::start(app.node_addr, options)
        .await
        .expect("the mock node registers")
}

async fn post(app: &TestApp, path: &str, body: &Value) -> reqwest::Response {
    client()
        .post(format!("http://{}{path}", app.http_addr))
        .json(body)
        .send()
        .await
        .expect("a response")
}

fn runs(node: &MockNode) -> Vec<RunAssignment> {
    node.commands()
        .into_iter()
        .filter_map(|command| match command {
            NodeCommand::Run(run) => Some(run),
            _ => None,
        })
        .collect()
}

fn messages_request() -> Value {
    json!({
        "model": MODEL,
        "system": [{"type": "text", "text": "Be brief."}],
        "messages": [
            {"role": "user", "content": "Hi"},
            {"role": "system", "content": "Reminder."},
        ],
        "tools": [{"name": "Read", "input_schema": {"type": "object"}}],
        "thinking": {"type": "adaptive"},
    })
}

#[crate::common::test]
async fn count_tokenize_and_detokenize_go_through_a_declaring_node() {
    let app = spawn_app(TWO_NODES).await;
    let declaring = node(&app, "token-a", true).await;
    app.wait_for_nodes(1).await;

    let answer = ok_json(post(&app, "/v1/messages/count_tokens", &messages_request()).await).await;
    // The mock's template: "{role}: {content}\n" per message, then "assistant:".
    let prompt = "system: Be brief.\nuser: Hi\nsystem: Reminder.\nassistant:";
    assert_eq!(answer, json!({"input_tokens": prompt.len()}));
    let run = runs(&declaring).pop().expect("a run");
    assert_eq!(run.operation, Operation::Tokenize);
    let input: Value = serde_json::from_slice(&run.input).expect("JSON input");
    assert_eq!(
        input["messages"][2],
        json!({"role": "system", "content": "Reminder."})
    );
    assert_eq!(input["tools"][0]["function"]["name"], "Read");

    let body = json!({"model": MODEL, "content": "Hi!", "add_special": true});
    let answer = ok_json(post(&app, "/tokenize", &body).await).await;
    assert_eq!(answer, json!({"tokens": [72, 105, 33], "count": 3}));
    let run = runs(&declaring).pop().expect("a run");
    let input: Value = serde_json::from_slice(&run.input).expect("JSON input");
    assert_eq!(input, json!({"content": "Hi!", "add_special": true}));

    let body = json!({"model": MODEL, "tokens": [72, 105, 33]});
    let answer = ok_json(post(&app, "/detokenize", &body).await).await;
    assert_eq!(answer, json!({"content": "Hi!", "prompt": "Hi!"}));
    assert_eq!(
        runs(&declaring).pop().unwrap().operation,
        Operation::Detokenize
    );

    declaring.kill();
    app.stop().await;
}

#[crate::common::test]
async fn a_node_that_did_not_declare_tokenize_never_gets_one() {
    let app = spawn_app(TWO_NODES).await;
    let v1 = node(&app, "token-a", false).await;
    app.wait_for_nodes(1).await;

    // Only the v1-style node is connected: 501 at once, in each API's shape.
    let response = post(&app, "/v1/messages/count_tokens", &messages_request()).await;
    assert_eq!(response.status(), StatusCode::NOT_IMPLEMENTED);
    let error: Value = response.json().await.expect("JSON");
    assert_eq!(error["type"], "error", "Anthropic's shape: {error}");
    assert_eq!(
        error["error"]["type"], "api_error",
        "Anthropic names a 501 so: {error}"
    );
    assert!(
        error["error"]["message"]
            .as_str()
            .unwrap()
            .contains("tokenize"),
        "{error}"
    );
    let body = json!({"model": MODEL, "content": "Hi"});
    let response = post(&app, "/tokenize", &body).await;
    assert_eq!(response.status(), StatusCode::NOT_IMPLEMENTED);
    let error: Value = response.json().await.expect("JSON");
    assert_eq!(error["error"]["code"], "not_supported", "{error}");
    let body = json!({"model": MODEL, "tokens": [1]});
    let response = post(&app, "/detokenize", &body).await;
    assert_eq!(response.status(), StatusCode::NOT_IMPLEMENTED);

    // With a declaring node beside it, every tokenize run goes to that one.
    let declaring = node(&app, "token-b", true).await;
    app.wait_for_nodes(2).await;
    for _ in 0..6 {
        let body = json!({"model": MODEL, "content": "Hi"});
        let response = post(&app, "/tokenize", &body).await;
        assert_eq!(response.headers()["x-edge-node"], "node-b");
        assert_eq!(ok_json(response).await["count"], 2);
    }
    assert!(
        runs(&v1).is_empty(),
        "the v1-style node got a run: {:?}",
        runs(&v1)
    );
    assert_eq!(runs(&declaring).len(), 6);
    // Chat still goes to both (each prompt keyed to its node, deterministically).
    for n in 0..8 {
        let content = format!("question {n}");
        let body = json!({"model": MODEL, "messages": [{"role": "user", "content": content}]});
        ok_json(post(&app, "/v1/chat/completions", &body).await).await;
    }
    assert!(
        !runs(&v1).is_empty(),
        "chat runs still reach the v1-style node"
    );

    v1.kill();
    declaring.kill();
    app.stop().await;
}

#[crate::common::test]
async fn a_queued_tokenize_run_waits_for_a_declaring_node_not_a_free_v1_one() {
    let app = spawn_app(TWO_NODES).await;
    let v1 = node(&app, "token-a", false).await;
    // node-b declares tokenize and takes a while over each run (2 slots), so a third
    // concurrent run queues and is placed by the queue's pump when a slot frees.
    let options = MockOptions {
        tokenize: true,
        delay: std::time::Duration::from_millis(300),
        ..MockOptions::new("token-b")
    };
    let declaring = MockNode::start(app.node_addr, options)
        .await
        .expect("the mock node registers");
    app.wait_for_nodes(2).await;
    let requests = (0..5).map(|n| {
        let body = json!({"model": MODEL, "content": format!("text {n}")});
        let app = &app;
        async move { post(app, "/tokenize", &body).await }
    });
    let answered = futures::future::join_all(requests);
    for response in crate::common::bounded("the five tokenize requests", answered).await {
        assert_eq!(response.status(), StatusCode::OK);
        assert_eq!(response.headers()["x-edge-node"], "node-b");
    }
    assert!(runs(&v1).is_empty(), "{:?}", runs(&v1));
    assert_eq!(runs(&declaring).len(), 5);
    v1.kill();
    declaring.kill();
    app.stop().await;
}

#[crate::common::test]
async fn bad_bodies_and_unknown_models_are_answered_in_each_apis_shape() {
    let app = spawn_app(TWO_NODES).await;
    let declaring = node(&app, "token-a", true).await;
    app.wait_for_nodes(1).await;
    let response = post(&app, "/v1/messages/count_tokens", &json!({"model": MODEL})).await;
    assert_eq!(response.status(), StatusCode::BAD_REQUEST);
    let error: Value = response.json().await.expect("JSON");
    assert_eq!(error["type"], "error", "{error}");
    let unknown = json!({"model": "nope/none", "messages": [{"role": "user", "content": "x"}]});
    let response = post(&app, "/v1/messages/count_tokens", &unknown).await;
    assert_eq!(response.status(), StatusCode::NOT_FOUND);
    let response = post(&app, "/tokenize", &json!({"model": MODEL})).await;
    assert_eq!(response.status(), StatusCode::BAD_REQUEST);
    let error: Value = response.json().await.expect("JSON");
    assert_eq!(error["error"]["param"], "content", "{error}");
    assert!(runs(&declaring).is_empty());
    declaring.kill();
    app.stop().await;
}

#[crate::common::test]
async fn without_a_key_each_route_answers_401_in_its_apis_shape() {
    let app = spawn_app(&format!("{TWO_NODES}\n[api]\nkeys = [\"sk-tokens\"]\n")).await;
    let response = post(&app, "/v1/messages/count_tokens", &messages_request()).await;
    assert_eq!(response.status(), StatusCode::UNAUTHORIZED);
    let error: Value = response.json().await.expect("JSON");
    assert_eq!(error["error"]["type"], "authentication_error", "{error}");
    let body = json!({"model": MODEL, "content": "Hi"});
    let response = post(&app, "/tokenize", &body).await;
    assert_eq!(response.status(), StatusCode::UNAUTHORIZED);
    let error: Value = response.json().await.expect("JSON");
    assert_eq!(error["error"]["code"], "invalid_api_key", "{error}");
    app.stop().await;
}
