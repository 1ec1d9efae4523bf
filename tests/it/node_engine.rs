//! The reference node between a real edge (port 0) and a scripted OpenAI-compatible engine:
//! what the engine streams reaches the edge's run events as text, structured parts and one
//! terminal event; engine failures arrive classified; cancels and deadlines close the
//! engine's connection; after a streamed answer the next request's connection is opened
//! ahead.

use crate::common;
#[allow(dead_code, unused_imports)]
use crate::node;
use crate::node_support;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use common::runs::{only_terminal, rest, start};
use common::{TestApp, eventually, spawn_app};
use edge::domain::{
    AdapterName, FailureClass, NodeSelector, Operation, RunEvent, RunEventKind, RunSpec,
    StructuredOutput, Target, Usage,
};
use node_support::upstream::{Reply, ScriptedEngine};
use node_support::{QWEN, RunningNode, answer, edge_config, spawn_node};
use serde_json::{Value, json};

const TARGETS: &[&str] = &["qwen", "bad", "broken", "busy", "embed"];

async fn setup() -> (TestApp, ScriptedEngine, RunningNode) {
    let engine = ScriptedEngine::start(&[QWEN, "bad", "broken", "busy", "embed"]).await;
    let app = spawn_app(&edge_config(&engine.base_url(), TARGETS, 1_000)).await;
    let node = spawn_node(app.node_addr, "token-1", |_| {});
    app.wait_for_nodes(1).await;
    (app, engine, node)
}

fn spec(target: &str, operation: Operation, input: Value) -> RunSpec {
    let (content_type, input) = match input {
        Value::String(text) => ("text/plain; charset=utf-8", text),
        json => ("application/json", json.to_string()),
    };
    RunSpec {
        selector: NodeSelector {
            adapter: AdapterName::parse("llama").expect("adapter"),
            target: Target::parse(target).expect("target"),
            pin: None,
        },
        input: Bytes::from(input),
        content_type: content_type.into(),
        params: BTreeMap::new(),
        deadline: None,
        operation,
        routing: Default::default(),
    }
}

fn delta(delta: Value) -> Value {
    json!({"choices": [{"index": 0, "delta": delta, "finish_reason": null}]})
}

fn finish(reason: &str) -> Value {
    json!({"choices": [{"index": 0, "delta": {}, "finish_reason": reason}]})
}

async fn run_to_end(app: &TestApp, spec: RunSpec) -> Vec<Arc<RunEvent>> {
    let mut handle = start(app, spec);
    let events = rest(&mut handle).await;
    only_terminal(&handle.run_id, &events);
    events
}

fn text_of(events: &[Arc<RunEvent>]) -> String {
    events
        .iter()
        .filter_map(|e| match &e.kind {
            RunEventKind::Output { text, .. } => Some(text.as_str()),
            _ => None,
        })
        .collect()
}

fn structured_of(events: &[Arc<RunEvent>]) -> Vec<StructuredOutput> {
    events
        .iter()
        .filter_map(|e| match &e.kind {
            RunEventKind::Output {
                structured: Some(s),
                ..
            } => Some((**s).clone()),
            _ => None,
        })
        .collect()
}

fn failure(event: &RunEvent) -> (FailureClass, String, Option<u16>, String) {
    match &event.kind {
        RunEventKind::Failed {
            code,
            message,
            class,
            status,
            ..
        } => (*class, code.clone(), *status, message.clone()),
        other => panic!("expected failed, got {other:?}"),
    }
}

#[crate::common::test]
async fn a_console_prompt_streams_text_in_order_then_completes_with_usage() {
    let (app, engine, node) = setup().await;
    let usage = json!({"choices": [], "usage": {"prompt_tokens": 9, "completion_tokens": 3,
        "prompt_tokens_details": {"cached_tokens": 4}, "completion_tokens_details": {"reasoning_tokens": 0}}});
    let chunks = [
        delta(json!({"role": "assistant"})),
        delta(json!({"content": "Hel"})),
        delta(json!({"content": "lo"})),
        delta(json!({"content": " world"})),
        finish("stop"),
        usage,
    ];
    engine.script(QWEN, Reply::sse(&chunks, true));

    let events = run_to_end(&app, spec("qwen", Operation::Unspecified, json!("hello"))).await;
    assert_eq!(events[0].kind, RunEventKind::Started);
    assert_eq!(text_of(&events), "Hello world");
    let expected = Usage {
        input_tokens: 9,
        output_tokens: 3,
        cached_input_tokens: 4,
        reasoning_tokens: 0,
    };
    assert_eq!(
        events.last().expect("terminal").kind,
        RunEventKind::Completed {
            finish_reason: "stop".into(),
            usage: Some(expected)
        }
    );
    let seen = engine.seen();
    assert_eq!(seen[0].path, "/v1/chat/completions");
    assert_eq!(
        seen[0].body,
        json!({"model": QWEN, "stream": true, "stream_options": {"include_usage": true},
               "messages": [{"role": "user", "content": "hello"}]})
    );
    assert_eq!(seen[0].authorization, None);
    node.stop().await.expect("clean stop");
    app.assert_settled().await;
}

#[crate::common::test]
async fn a_run_is_served_by_an_https_engine_checked_against_the_adapters_ca() {
    let ca = common::pki::Ca::new("engine CA");
    let (cert, key) = ca.issue(
        &["localhost", "127.0.0.1"],
        rcgen::ExtendedKeyUsagePurpose::ServerAuth,
    );
    let dir = tempfile::tempdir().expect("tempdir");
    let ca_path = dir.path().join("engine-ca.pem");
    std::fs::write(&ca_path, &ca.pem).expect("write the CA");
    let engine = ScriptedEngine::start_https(&[QWEN], &cert, &key).await;
    assert!(engine.base_url().starts_with("https://localhost:"));
    // The adapter's settings table ends the config: `tls_ca` joins it.
    let config = format!(
        "{}tls_ca = {:?}\n",
        edge_config(&engine.base_url(), &["qwen"], 1_000),
        ca_path.display().to_string()
    );
    let app = spawn_app(&config).await;
    let node = spawn_node(app.node_addr, "token-1", |_| {});
    app.wait_for_nodes(1).await;
    engine.script(QWEN, answer("over TLS"));

    let events = run_to_end(&app, spec("qwen", Operation::Unspecified, json!("hello"))).await;
    assert_eq!(text_of(&events), "over TLS");
    assert!(
        matches!(
            events.last().expect("terminal").kind,
            RunEventKind::Completed { .. }
        ),
        "{events:?}"
    );
    assert_eq!(engine.seen()[0].path, "/v1/chat/completions");
    node.stop().await.expect("clean stop");
    app.assert_settled().await;
}

#[crate::common::test]
async fn reasoning_parallel_tool_calls_and_logprobs_reach_the_edge() {
    let (app, engine, node) = setup().await;
    let call = |index: u32, id: Option<&str>, name: Option<&str>, arguments: &str| {
        let mut piece = json!({"index": index, "function": {"arguments": arguments}});
        if let (Some(id), Some(name)) = (id, name) {
            piece = json!({"index": index, "id": id, "type": "function", "function": {"name": name, "arguments": arguments}});
        }
        delta(json!({"tool_calls": [piece]}))
    };
    let logprob = json!({"choices": [{"index": 0, "delta": {"content": "ok"}, "logprobs": {"content": [
        {"token": "ok", "logprob": -0.5, "bytes": [111, 107], "top_logprobs": []}]}}]});
    let chunks = [
        delta(json!({"reasoning_content": "think"})),
        logprob,
        call(0, Some("call_a"), Some("weather"), ""),
        call(1, Some("call_b"), Some("time"), ""),
        call(0, None, None, "{\"city\":"),
        call(1, None, None, "{}"),
        call(0, None, None, "\"Paris\"}"),
        finish("tool_calls"),
    ];
    engine.script(QWEN, Reply::sse(&chunks, true));

    let body = json!({"messages": [{"role": "user", "content": "weather and time?"}], "tools": [{"type": "function",
        "function": {"name": "weather"}}], "logprobs": true});
    let events = run_to_end(&app, spec("qwen", Operation::Chat, body)).await;
    let parts = structured_of(&events);
    let reasoning: String = parts.iter().map(|p| p.reasoning.as_str()).collect();
    assert_eq!(reasoning, "think");
    let logprobs: Vec<_> = parts.iter().flat_map(|p| p.logprobs.clone()).collect();
    assert_eq!(
        (logprobs[0].token.as_str(), logprobs[0].logprob),
        ("ok", -0.5)
    );
    let calls: Vec<_> = parts.iter().flat_map(|p| p.tool_calls.clone()).collect();
    let arguments = |index: u32| {
        calls
            .iter()
            .filter(|c| c.index == index)
            .map(|c| c.arguments.clone())
            .collect::<String>()
    };
    assert_eq!(arguments(0), "{\"city\":\"Paris\"}");
    assert_eq!(arguments(1), "{}");
    let names: Vec<_> = calls
        .iter()
        .filter(|c| !c.name.is_empty())
        .map(|c| (c.index, c.id.as_str(), c.name.as_str()))
        .collect();
    assert_eq!(names, [(0, "call_a", "weather"), (1, "call_b", "time")]);
    assert!(
        matches!(&events.last().expect("terminal").kind, RunEventKind::Completed { finish_reason, .. } if finish_reason == "tool_calls")
    );
    assert_eq!(
        engine.seen()[0].body["tools"][0]["function"]["name"],
        "weather"
    );
    node.stop().await.expect("clean stop");
}

#[crate::common::test]
async fn embeddings_come_back_as_vectors() {
    let (app, engine, node) = setup().await;
    let answer = json!({"object": "list", "data": [{"index": 0, "embedding": [0.5, -0.25]}, {"index": 1, "embedding": [1.0, 0.0]}],
        "usage": {"prompt_tokens": 6, "total_tokens": 6}});
    engine.script("embed", Reply::Json(answer));
    let events = run_to_end(
        &app,
        spec("embed", Operation::Embeddings, json!({"input": ["a", "b"]})),
    )
    .await;
    let vectors: Vec<_> = structured_of(&events)
        .into_iter()
        .flat_map(|p| p.embeddings)
        .collect();
    assert_eq!(vectors.len(), 2);
    assert_eq!(
        (vectors[1].index, vectors[1].values.clone()),
        (1, vec![1.0, 0.0])
    );
    assert!(
        matches!(&events.last().expect("terminal").kind, RunEventKind::Completed { usage: Some(u), .. } if u.input_tokens == 6)
    );
    let seen = engine.seen();
    assert_eq!(
        (seen[0].path.as_str(), &seen[0].body["encoding_format"]),
        ("/v1/embeddings", &json!("float"))
    );
    node.stop().await.expect("clean stop");
}

#[crate::common::test]
async fn engine_failures_arrive_classified() {
    let (app, mut engine, node) = setup().await;
    let too_long = json!({"error": {"message": "maximum context length is 4096 tokens", "type": "invalid_request_error",
        "code": "context_length_exceeded"}});
    engine.script("bad", Reply::Status(400, too_long));
    engine.script(
        "broken",
        Reply::Status(500, json!({"error": {"message": "CUDA out of memory"}})),
    );
    engine.script(
        "busy",
        Reply::Status(429, json!({"error": {"message": "slow down"}})),
    );
    let cases = [
        (
            "bad",
            FailureClass::Request,
            "context_length_exceeded",
            Some(400),
        ),
        ("broken", FailureClass::Node, "engine_error", Some(500)),
        ("busy", FailureClass::Refused, "engine_busy", Some(429)),
    ];
    for (target, class, code, status) in cases {
        let events = run_to_end(&app, spec(target, Operation::Chat, json!({"messages": []}))).await;
        let (got_class, got_code, got_status, message) = failure(events.last().expect("terminal"));
        assert_eq!(
            (got_class, got_code.as_str(), got_status),
            (class, code, status),
            "{target}: {message}"
        );
        if target == "bad" {
            assert_eq!(message, "maximum context length is 4096 tokens");
        }
    }
    // The engine goes away between probes: the request cannot connect.
    engine.down().await;
    let events = run_to_end(&app, spec("qwen", Operation::Chat, json!({"messages": []}))).await;
    let (class, code, status, _) = failure(events.last().expect("terminal"));
    assert_eq!(
        (class, code.as_str(), status),
        (FailureClass::Node, "engine_unavailable", None)
    );
    node.stop().await.expect("clean stop");
}

#[crate::common::test]
async fn a_stream_that_breaks_after_output_ends_with_one_failure() {
    let (app, engine, node) = setup().await;
    let chunks = vec![
        delta(json!({"content": "partial"})).to_string(),
        "{not json".to_owned(),
    ];
    engine.script(
        QWEN,
        Reply::Sse {
            chunks,
            gate: None,
            hang: false,
        },
    );
    let events = run_to_end(&app, spec("qwen", Operation::Chat, json!({"messages": []}))).await;
    assert_eq!(text_of(&events), "partial");
    let terminal = events.last().expect("terminal");
    let (class, code, _, _) = failure(terminal);
    assert_eq!((class, code.as_str()), (FailureClass::Node, "engine_error"));
    // What it produced: one output token per piece relayed, the input unknown.
    assert_eq!(terminal.kind.usage(), Some(Usage::new(0, 1)));
    node.stop().await.expect("clean stop");
}

#[crate::common::test]
async fn after_a_streamed_answer_the_next_request_finds_its_connection_open() {
    let (app, engine, node) = setup().await;
    let chunks = [delta(json!({"content": "hi"})), finish("stop")];
    engine.script(QWEN, Reply::sse(&chunks, true));
    const RUNS: usize = 5;
    for _ in 0..RUNS {
        let listed = engine.listed_to().len();
        run_to_end(&app, spec("qwen", Operation::Chat, json!({"messages": []}))).await;
        // The node opens the next request's connection with a `GET /v1/models`.
        eventually("the node opened a connection ahead", || {
            engine.listed_to().len() > listed
        })
        .await;
    }
    // Each run after the first came on a connection opened ahead (the first, perhaps on
    // the probe's); without it, each would have waited for a fresh one.
    let opened_ahead = engine.listed_to();
    let seen = engine.seen();
    assert_eq!(seen.len(), RUNS);
    let on_open_connections = seen
        .iter()
        .filter(|request| opened_ahead.contains(&request.peer))
        .count();
    assert!(on_open_connections >= RUNS - 1, "{seen:?} {opened_ahead:?}");
    node.stop().await.expect("clean stop");
    app.assert_settled().await;
}

#[crate::common::test]
async fn a_cancel_closes_the_engine_connection() {
    let (app, engine, node) = setup().await;
    let chunks = vec![delta(json!({"content": "thinking..."})).to_string()];
    engine.script(
        QWEN,
        Reply::Sse {
            chunks,
            gate: None,
            hang: true,
        },
    );
    let mut handle = start(&app, spec("qwen", Operation::Chat, json!({"messages": []})));
    loop {
        let event = common::runs::next_event(&mut handle).await;
        if matches!(event.kind, RunEventKind::Output { .. }) {
            break;
        }
    }
    assert!(
        app.parts
            .runs
            .cancel(&handle.run_id, "the caller left")
            .await
    );
    let events = rest(&mut handle).await;
    // The node reports the piece it relayed before the cancel.
    assert_eq!(
        events.last().expect("terminal").kind,
        RunEventKind::Cancelled {
            reason: "the caller left".into(),
            usage: Some(Usage::new(0, 1)),
        }
    );
    eventually("the engine saw its stream closed", || {
        engine.dropped_streams() == 1
    })
    .await;
    node.stop().await.expect("clean stop");
    app.assert_settled().await;
}

#[crate::common::test]
async fn a_deadline_closes_the_engine_connection() {
    let (app, engine, node) = setup().await;
    engine.script(
        QWEN,
        Reply::Sse {
            chunks: Vec::new(),
            gate: None,
            hang: true,
        },
    );
    let mut run = spec("qwen", Operation::Chat, json!({"messages": []}));
    run.deadline = Some(Duration::from_millis(300));
    let events = run_to_end(&app, run).await;
    assert_eq!(
        failure(events.last().expect("terminal")).1,
        "deadline_exceeded"
    );
    eventually("the engine saw its stream closed", || {
        engine.dropped_streams() == 1
    })
    .await;
    node.stop().await.expect("clean stop");
}
