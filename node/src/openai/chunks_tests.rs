//! Tests of the chunk mapping: what an engine streams, and the events the run gets.

use serde_json::json;

use super::*;

fn structured(kind: &RunEventKind) -> StructuredOutput {
    match kind {
        RunEventKind::Output { structured, .. } => {
            structured.as_deref().cloned().unwrap_or_default()
        }
        other => panic!("expected output, got {other:?}"),
    }
}

fn text(kind: &RunEventKind) -> &str {
    match kind {
        RunEventKind::Output { text, .. } => text,
        other => panic!("expected output, got {other:?}"),
    }
}

fn delta(delta: serde_json::Value) -> String {
    json!({"choices": [{"index": 0, "delta": delta, "finish_reason": null}]}).to_string()
}

#[test]
fn text_and_reasoning_deltas_then_usage_and_finish() {
    let mut stream = AnswerStream::new();
    assert_eq!(stream.apply(&delta(json!({"role": "assistant"}))), Ok(None));
    let thought = stream
        .apply(&delta(json!({"reasoning_content": "hmm"})))
        .expect("ok")
        .expect("event");
    assert_eq!(structured(&thought).reasoning, "hmm");
    let said = stream
        .apply(&delta(json!({"content": "Hi", "tool_calls": null})))
        .expect("ok")
        .expect("event");
    assert_eq!(text(&said), "Hi");
    let end = json!({"choices": [{"index": 0, "delta": {}, "finish_reason": "length"}]});
    assert_eq!(stream.apply(&end.to_string()), Ok(None));
    let usage = json!({"choices": [], "usage": {"prompt_tokens": 12, "completion_tokens": 7,
        "prompt_tokens_details": {"cached_tokens": 8}, "completion_tokens_details": {"reasoning_tokens": 3}}});
    assert_eq!(stream.apply(&usage.to_string()), Ok(None));
    assert_eq!(stream.apply("[DONE]"), Ok(None));
    assert!(stream.is_done());
    assert_eq!(
        stream.finish(),
        Ok(RunEventKind::Completed {
            finish_reason: "length".into(),
            usage: Some(Usage {
                input_tokens: 12,
                output_tokens: 7,
                cached_input_tokens: 8,
                reasoning_tokens: 3
            }),
        })
    );
}

#[test]
fn two_parallel_tool_calls_keep_their_indexes_and_fragments() {
    let mut stream = AnswerStream::new();
    let pieces = [
        json!([{"index": 0, "id": "call_a", "type": "function", "function": {"name": "weather", "arguments": ""}}]),
        json!([{"index": 1, "id": "call_b", "type": "function", "function": {"name": "time", "arguments": ""}}]),
        json!([{"index": 0, "function": {"arguments": "{\"city\":"}}]),
        json!([{"index": 1, "function": {"arguments": "{\"tz\":\"UTC\"}"}}]),
        json!([{"index": 0, "function": {"arguments": "\"Paris\"}"}}]),
    ];
    let mut calls: Vec<ToolCallDelta> = Vec::new();
    for piece in pieces {
        let event = stream
            .apply(&delta(json!({"tool_calls": piece})))
            .expect("ok")
            .expect("event");
        calls.extend(structured(&event).tool_calls);
    }
    let finished = json!({"choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]});
    stream.apply(&finished.to_string()).expect("ok");
    let arguments = |index: u32| -> String {
        calls
            .iter()
            .filter(|c| c.index == index)
            .map(|c| c.arguments.as_str())
            .collect()
    };
    assert_eq!(arguments(0), "{\"city\":\"Paris\"}");
    assert_eq!(arguments(1), "{\"tz\":\"UTC\"}");
    assert_eq!(
        (calls[0].id.as_str(), calls[0].name.as_str()),
        ("call_a", "weather")
    );
    assert_eq!(
        (calls[1].id.as_str(), calls[1].name.as_str()),
        ("call_b", "time")
    );
    // No [DONE], but a finish reason: the answer is whole.
    assert!(
        matches!(stream.finish(), Ok(RunEventKind::Completed { finish_reason, .. }) if finish_reason == "tool_calls")
    );
}

#[test]
fn whole_calls_without_an_index_take_their_position() {
    let mut stream = AnswerStream::new();
    let calls = json!([
        {"id": "a", "function": {"name": "f", "arguments": "{}"}},
        {"id": "b", "function": {"name": "g", "arguments": "{\"x\":1}"}},
    ]);
    let event = stream
        .apply(&delta(json!({"tool_calls": calls})))
        .expect("ok")
        .expect("event");
    let indexes: Vec<u32> = structured(&event)
        .tool_calls
        .iter()
        .map(|c| c.index)
        .collect();
    assert_eq!(indexes, [0, 1]);
}

#[test]
fn chat_and_legacy_logprobs() {
    let mut stream = AnswerStream::new();
    let chat = json!({"choices": [{"index": 0, "delta": {"content": "Hi"}, "logprobs": {"content": [
        {"token": "Hi", "logprob": -0.25, "bytes": [72, 105], "top_logprobs": [{"token": "Hi", "logprob": -0.25, "bytes": [72, 105]}, {"token": "Yo", "logprob": -2.0}]}
    ]}}]});
    let event = stream.apply(&chat.to_string()).expect("ok").expect("event");
    let logprobs = structured(&event).logprobs;
    assert_eq!(logprobs.len(), 1);
    assert_eq!(
        (
            logprobs[0].token.as_str(),
            logprobs[0].logprob,
            logprobs[0].bytes.as_slice()
        ),
        ("Hi", -0.25, &b"Hi"[..])
    );
    assert_eq!(logprobs[0].top.len(), 2);
    assert_eq!(logprobs[0].top[1].bytes, b"Yo");

    let legacy = json!({"choices": [{"index": 0, "text": " a", "logprobs": {"tokens": [" a"], "token_logprobs": [-1.5], "top_logprobs": [{" a": -1.5, " b": -2.5}]}}]});
    let event = stream
        .apply(&legacy.to_string())
        .expect("ok")
        .expect("event");
    assert_eq!(text(&event), " a");
    let logprobs = structured(&event).logprobs;
    assert_eq!(
        (logprobs[0].token.as_str(), logprobs[0].logprob),
        (" a", -1.5)
    );
    assert_eq!(logprobs[0].top.len(), 2);
}

#[test]
fn other_choices_are_not_relayed() {
    let mut stream = AnswerStream::new();
    let other = json!({"choices": [{"index": 1, "delta": {"content": "second answer"}}]});
    assert_eq!(stream.apply(&other.to_string()), Ok(None));
}

#[test]
fn faults_in_the_stream() {
    let mut stream = AnswerStream::new();
    assert!(matches!(
        stream.apply("{not json"),
        Err(UpstreamFault::Malformed(_))
    ));
    let error = json!({"error": {"code": 500, "message": "oom"}});
    assert!(matches!(
        stream.apply(&error.to_string()),
        Err(UpstreamFault::InStream(_))
    ));
    stream.apply(&delta(json!({"content": "cut"}))).expect("ok");
    assert!(matches!(stream.finish(), Err(UpstreamFault::Broken(_))));
}

#[test]
fn embeddings_become_vectors_then_completed() {
    let body = json!({"object": "list", "data": [
        {"object": "embedding", "index": 0, "embedding": [0.5, -1.0]},
        {"object": "embedding", "index": 1, "embedding": [0.25, 2.0]},
    ], "usage": {"prompt_tokens": 4, "total_tokens": 4}});
    let events = embeddings_events(body.to_string().as_bytes()).expect("valid");
    assert_eq!(events.len(), 2);
    let vectors = structured(&events[0]).embeddings;
    assert_eq!(
        vectors,
        [
            Embedding {
                index: 0,
                values: vec![0.5, -1.0]
            },
            Embedding {
                index: 1,
                values: vec![0.25, 2.0]
            }
        ]
    );
    assert!(
        matches!(&events[1], RunEventKind::Completed { usage: Some(u), .. } if u.input_tokens == 4)
    );
    assert!(embeddings_events(br#"{"data":[{"embedding":"base64=="}]}"#).is_err());
}

#[test]
fn large_embedding_answers_are_split_across_events() {
    let item = json!({"embedding": vec![0.0f32; MAX_VALUES_PER_EVENT / 2 + 1]});
    let body = json!({"data": [item.clone(), item.clone(), item]});
    let events = embeddings_events(body.to_string().as_bytes()).expect("valid");
    assert_eq!(events.len(), 4);
    let indexes: Vec<u32> = events[..3]
        .iter()
        .flat_map(|e| structured(e).embeddings)
        .map(|e| e.index)
        .collect();
    assert_eq!(indexes, [0, 1, 2]);
}

#[test]
fn llama_server_timings_are_the_running_counts() {
    let mut stream = AnswerStream::new();
    assert_eq!(stream.counted(), None);
    let chunk = |predicted: u64| {
        json!({
            "choices": [{"index": 0, "delta": {"content": "x"}, "finish_reason": null}],
            "timings": {"cache_n": 3, "prompt_n": 9, "predicted_n": predicted, "prompt_ms": 1.5}
        })
        .to_string()
    };
    let first = stream.apply(&chunk(1)).expect("ok").expect("an output");
    let second = stream.apply(&chunk(2)).expect("ok").expect("an output");
    // The first output tells the edge the prompt's counts at once; later ones do not repeat them.
    let prompt = Usage {
        input_tokens: 12,
        cached_input_tokens: 3,
        output_tokens: 1,
        reasoning_tokens: 0,
    };
    assert_eq!(structured(&first).usage, Some(prompt));
    assert!(matches!(
        second,
        RunEventKind::Output {
            structured: None,
            ..
        }
    ));
    assert_eq!(
        stream.counted(),
        Some(Usage {
            input_tokens: 12,
            cached_input_tokens: 3,
            output_tokens: 2,
            reasoning_tokens: 0,
        })
    );
}
