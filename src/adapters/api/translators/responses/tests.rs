//! Tests of the Responses translators: requests translate to the chat body (examples and a
//! property over generated valid requests), stateful options are refused by name, and any
//! run-event sequence becomes a well-formed Responses event stream.

use proptest::prelude::*;
use serde_json::{Value, json};

use super::items::{ItemState, ResponseBase, collected_items};
use super::request::translate;
use super::stream::ResponsesStream;
use crate::adapters::api::translators::ApiEvent;
use crate::adapters::api::translators::client_fixtures::client_request;
use crate::adapters::api::translators::output::{Collected, Finished, ToolCall};
use crate::adapters::api::translators::strategies::{Piece, end, piece, play};

#[test]
fn items_and_tools_become_the_chat_body() {
    let request = json!({
        "model": "echo/default", "instructions": "be brief", "max_output_tokens": 32,
        "tools": [{"type": "function", "name": "get_weather", "parameters": {"type": "object"}, "strict": true}],
        "tool_choice": {"type": "function", "name": "get_weather"},
        "text": {"format": {"type": "json_schema", "name": "w", "schema": {"type": "object"}}},
        "input": [
            {"role": "developer", "content": "dev"},
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "weather?"}]},
            {"type": "reasoning", "id": "rs_1", "summary": []},
            {"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": "{\"city\":\"Oslo\"}"},
            {"type": "function_call", "call_id": "call_2", "name": "get_weather", "arguments": "{}"},
            {"type": "function_call_output", "call_id": "call_1", "output": "sunny"},
        ],
    });
    let translated = translate(&request).unwrap();
    let chat = translated.chat;
    assert_eq!(chat["max_tokens"], 32);
    assert_eq!(
        chat["tools"][0],
        json!({"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}, "strict": true}})
    );
    assert_eq!(
        chat["tool_choice"],
        json!({"type": "function", "function": {"name": "get_weather"}})
    );
    assert_eq!(chat["response_format"]["json_schema"]["name"], "w");
    let messages = chat["messages"].as_array().unwrap();
    let roles: Vec<&str> = messages
        .iter()
        .map(|m| m["role"].as_str().unwrap())
        .collect();
    assert_eq!(roles, ["system", "system", "user", "assistant", "tool"]);
    assert_eq!(messages[2]["content"], "weather?");
    assert_eq!(messages[3]["tool_calls"].as_array().unwrap().len(), 2);
    assert_eq!(
        messages[4],
        json!({"role": "tool", "tool_call_id": "call_1", "content": "sunny"})
    );
    assert_eq!(translated.instructions, "be brief");
}

#[test]
fn state_and_hosted_tools_are_refused_by_name() {
    let base = json!({"model": "m", "input": "hi"});
    let with = |field: &str, value: Value| {
        let mut body = base.clone();
        body[field] = value;
        translate(&body).unwrap_err()
    };
    for (field, value) in [
        ("store", json!(true)),
        ("previous_response_id", json!("resp_1")),
        ("conversation", json!("conv_1")),
        ("tools", json!([{"type": "custom", "name": "apply_patch"}])),
        ("tool_choice", json!({"type": "web_search"})),
        ("input", json!([{"type": "item_reference", "id": "x"}])),
    ] {
        let error = with(field, value);
        assert_eq!(error.status().as_u16(), 400, "{field}");
        assert_eq!(error.error_code(), Some("unsupported_parameter"), "{field}");
        assert!(
            error.message().contains('`'),
            "{field}: {}",
            error.message()
        );
    }
    assert!(translate(&json!({"model": "m", "input": "x", "store": false})).is_ok());
    let background = json!({"model": "m", "input": "x", "store": true, "background": true});
    assert!(translate(&background).unwrap().background);
    assert_eq!(with("input", json!(5)).error_code(), Some("invalid_value"));
    assert!(translate(&json!({"input": "x"})).is_err());
}

/// The Codex CLI's first request (tests/fixtures/clients), as captured: developer messages
/// become system ones in place, the namespace's functions join the function tools by their
/// own names, web search is left out, and the client-side options are ignored.
#[test]
fn the_codex_cli_request_translates() {
    let translated =
        translate(&client_request("codex-0.171.0.json")).expect("Codex's request translates");
    let chat = &translated.chat;
    let roles: Vec<&str> = chat["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["role"].as_str().unwrap())
        .collect();
    assert_eq!(roles, ["system", "system", "user", "user"]);
    let names: Vec<&str> = chat["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["function"]["name"].as_str().unwrap())
        .collect();
    assert!(
        names.contains(&"exec_command") && names.contains(&"spawn_agent"),
        "{names:?}"
    );
    assert_eq!(
        names.len(),
        12,
        "7 functions and the namespace's 5, no web search: {names:?}"
    );
    assert_eq!(chat["parallel_tool_calls"], true);
    assert!(translated.stream);
    assert_eq!(
        translated.namespaces.get("spawn_agent").map(String::as_str),
        Some("multi_agent_v1")
    );
    assert!(!translated.namespaces.contains_key("exec_command"));
}

/// A call of a function that came inside a `namespace` tool goes back to the client with
/// the namespace (the Codex CLI maps it to its tool by both), whole and streamed; other
/// calls carry none.
#[test]
fn namespaced_calls_go_back_with_their_namespace() {
    let request = translate(&client_request("codex-0.171.0.json")).expect("translates");
    let base = ResponseBase {
        id: "resp_r".into(),
        model: "m".into(),
        created_at: 1,
        instructions: Value::Null,
        namespaces: request.namespaces,
        background: false,
        compaction: false,
    };
    let pieces = [
        Piece::Tool {
            index: 0,
            name: "spawn_agent".into(),
            arguments: "{}".into(),
        },
        Piece::Tool {
            index: 1,
            name: "exec_command".into(),
            arguments: "{}".into(),
        },
    ];
    let ok = Ok(Finished {
        finish_reason: "tool_calls".into(),
        usage: None,
    });
    let events = play(&mut ResponsesStream::new(base.clone()), &pieces, &ok);
    let added: Vec<&Value> = events
        .iter()
        .filter(|e| e.name == "response.output_item.added")
        .map(|e| &e.data["item"])
        .collect();
    assert_eq!(added[0]["namespace"], "multi_agent_v1", "{added:?}");
    assert!(added[1].get("namespace").is_none(), "{added:?}");
    let collected = Collected {
        tool_calls: vec![ToolCall {
            index: 0,
            id: "c1".into(),
            name: "spawn_agent".into(),
            arguments: "{}".into(),
        }],
        ..Collected::default()
    };
    let items = collected_items(&base, &collected);
    assert_eq!(
        items[0].to_json(ItemState::Completed)["namespace"],
        "multi_agent_v1"
    );
}

fn item() -> impl Strategy<Value = Value> {
    prop_oneof![
        (prop_oneof![Just("user"), Just("assistant"), Just("system"), Just("developer")], ".{0,8}")
            .prop_map(|(role, text)| json!({"role": role, "content": text})),
        ".{0,8}".prop_map(|text| json!({"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]})),
        ("[a-z]{1,5}", "[a-z]{1,5}").prop_map(|(id, name)| json!({"type": "function_call", "call_id": id, "name": name, "arguments": "{}"})),
        ("[a-z]{1,5}", ".{0,8}").prop_map(|(id, output)| json!({"type": "function_call_output", "call_id": id, "output": output})),
    ]
}

proptest! {
    /// Any valid request translates, with every function output as a tool message.
    #[test]
    fn any_valid_request_translates(
        items in proptest::collection::vec(item(), 1..8),
        instructions in proptest::option::of(".{0,8}"),
        stream in any::<bool>(),
    ) {
        let body = json!({"model": "echo/x", "input": items, "instructions": instructions, "stream": stream,
                          "tools": [{"type": "function", "name": "f"}], "tool_choice": "auto"});
        let translated = translate(&body).unwrap();
        prop_assert_eq!(translated.stream, stream);
        let messages = translated.chat["messages"].as_array().unwrap().clone();
        let outputs = items.iter().filter(|i| i["type"] == "function_call_output").count();
        prop_assert_eq!(messages.iter().filter(|m| m["role"] == "tool").count(), outputs);
        let calls = items.iter().filter(|i| i["type"] == "function_call").count();
        let translated_calls: usize = messages.iter().filter_map(|m| m["tool_calls"].as_array()).map(Vec::len).sum();
        prop_assert_eq!(translated_calls, calls);
    }
}

/// Checks the Responses stream rules; returns the terminal response.
fn check_responses_stream(events: &[ApiEvent]) -> Result<Value, TestCaseError> {
    for (n, event) in events.iter().enumerate() {
        prop_assert_eq!(event.data["sequence_number"].as_u64(), Some(n as u64));
        prop_assert_eq!(event.data["type"].as_str(), Some(event.name));
    }
    prop_assert_eq!(events[0].name, "response.created");
    prop_assert_eq!(events[1].name, "response.in_progress");
    let mut kinds: Vec<String> = Vec::new();
    let mut done: Vec<bool> = Vec::new();
    for event in &events[2..events.len() - 1] {
        let index = event.data["output_index"].as_u64().unwrap() as usize;
        match event.name {
            "response.output_item.added" => {
                prop_assert_eq!(index, kinds.len());
                kinds.push(event.data["item"]["type"].as_str().unwrap().to_owned());
                done.push(false);
            }
            "response.output_item.done" => {
                prop_assert!(!done[index], "an item is done once");
                done[index] = true;
            }
            name => {
                prop_assert!(!done[index], "{} after the item was done", name);
                let kind = match name {
                    "response.content_part.added"
                    | "response.content_part.done"
                    | "response.output_text.delta"
                    | "response.output_text.done" => "message",
                    "response.reasoning_text.delta" | "response.reasoning_text.done" => "reasoning",
                    "response.function_call_arguments.delta"
                    | "response.function_call_arguments.done" => "function_call",
                    other => {
                        prop_assert!(false, "unexpected {}", other);
                        ""
                    }
                };
                prop_assert_eq!(kinds[index].as_str(), kind);
            }
        }
    }
    let terminal = events.last().unwrap();
    prop_assert!(
        [
            "response.completed",
            "response.incomplete",
            "response.failed"
        ]
        .contains(&terminal.name)
    );
    let response = terminal.data["response"].clone();
    prop_assert_eq!(response["output"].as_array().unwrap().len(), kinds.len());
    if terminal.name != "response.failed" {
        prop_assert!(done.iter().all(|d| *d), "every item is done before the end");
    }
    Ok(response)
}

proptest! {
    /// Any sequence of run output and any end becomes a well-formed Responses stream whose
    /// final response holds all the text and every call's arguments, failed or not.
    #[test]
    fn any_event_sequence_becomes_a_well_formed_responses_stream(
        pieces in proptest::collection::vec(piece(), 0..24),
        end in end(),
    ) {
        let base = ResponseBase { id: "resp_r".into(), model: "m".into(), created_at: 1, instructions: Value::Null, namespaces: Default::default(), background: false, compaction: false };
        let events = play(&mut ResponsesStream::new(base), &pieces, &end);
        let response = check_responses_stream(&events)?;
        let expected_status = match &end {
            Err(_) => "failed",
            Ok(f) if f.finish_reason == "length" || f.finish_reason == "content_filter" => "incomplete",
            Ok(_) => "completed",
        };
        prop_assert_eq!(response["status"].as_str(), Some(expected_status));
        // A failed response, too, carries what it had (its unfinished items `incomplete`).
        let output = response["output"].as_array().unwrap();
        let text: String = output.iter().filter(|i| i["type"] == "message")
            .filter_map(|i| i["content"][0]["text"].as_str()).collect();
        let sent: String = pieces.iter().filter_map(|p| match p { Piece::Text(t) => Some(t.as_str()), _ => None }).collect();
        prop_assert_eq!(text, sent);
        let arguments: String = output.iter().filter(|i| i["type"] == "function_call")
            .filter_map(|i| i["arguments"].as_str()).collect::<Vec<_>>().concat();
        let sent_arguments: usize = pieces.iter().map(|p| match p { Piece::Tool { arguments, .. } => arguments.len(), _ => 0 }).sum();
        prop_assert_eq!(arguments.len(), sent_arguments);
    }
}

/// Codex's compaction request: the conversation, then the trigger.
fn compaction_request(history: Value) -> Value {
    let mut input = history.as_array().cloned().unwrap_or_default();
    input.push(json!({"type": "compaction_trigger"}));
    json!({
        "model": "llama/qwen", "stream": true, "store": false, "input": input,
        "tools": [{"type": "function", "name": "shell", "parameters": {"type": "object"}}],
        "tool_choice": "auto", "parallel_tool_calls": true,
    })
}

#[test]
fn a_compaction_trigger_asks_the_node_for_a_summary_without_tools() {
    let history = json!([
        {"type": "message", "role": "user", "content": "fix the parser"},
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "done"}]},
    ]);
    let request = translate(&compaction_request(history)).unwrap();
    assert!(request.compaction);
    let messages = request.chat["messages"].as_array().unwrap();
    assert_eq!(messages.len(), 3);
    assert_eq!(messages[2]["role"], "user");
    assert_eq!(messages[2]["content"], super::compaction::SUMMARY_PROMPT);
    for field in ["tools", "tool_choice", "parallel_tool_calls"] {
        assert!(request.chat.get(field).is_none(), "{field}");
    }
    // A trigger anywhere but last is refused; a plain request is no compaction.
    let misplaced = json!({"model": "m", "input": [
        {"type": "compaction_trigger"}, {"role": "user", "content": "hi"}]});
    assert_eq!(
        translate(&misplaced).unwrap_err().error_code(),
        Some("invalid_value")
    );
    let plain = json!({"model": "m", "input": "hi"});
    assert!(!translate(&plain).unwrap().compaction);
}

#[test]
fn a_compaction_item_sent_back_becomes_its_summary() {
    let sealed = super::compaction::seal("we fixed the parser in src/parse.rs");
    let body = json!({"model": "m", "input": [
        {"type": "compaction", "encrypted_content": sealed},
        {"role": "user", "content": "now add tests"},
    ]});
    let request = translate(&body).unwrap();
    let messages = request.chat["messages"].as_array().unwrap();
    assert_eq!(
        messages[0]["content"],
        format!(
            "{}we fixed the parser in src/parse.rs",
            super::compaction::SUMMARY_INTRO
        )
    );
    assert_eq!(messages[1]["content"], "now add tests");
    let forged = json!({"model": "m", "input": [
        {"type": "compaction_summary", "encrypted_content": "gAAAA-from-openai"}]});
    assert_eq!(
        translate(&forged).unwrap_err().error_code(),
        Some("invalid_value")
    );
}

proptest! {
    /// A compaction's stream, whatever the run sends: after success exactly one
    /// `response.output_item.done`, a `compaction` item whose content opens to all the text;
    /// no text deltas; the completed response's output is that item.
    #[test]
    fn a_compaction_stream_answers_exactly_one_compaction_item(
        pieces in proptest::collection::vec(piece(), 0..24),
        end in end(),
    ) {
        let base = ResponseBase { id: "resp_c".into(), model: "m".into(), created_at: 1, instructions: Value::Null, namespaces: Default::default(), background: false, compaction: true };
        let events = play(&mut ResponsesStream::new(base), &pieces, &end);
        let response = check_responses_stream(&events)?;
        let done: Vec<&ApiEvent> = events.iter().filter(|e| e.name == "response.output_item.done").collect();
        prop_assert!(events.iter().all(|e| e.name != "response.output_text.delta"));
        if end.is_err() {
            prop_assert!(done.is_empty());
            return Ok(());
        }
        prop_assert_eq!(done.len(), 1);
        let item = &done[0].data["item"];
        prop_assert_eq!(item["type"].as_str(), Some("compaction"));
        let text: String = pieces.iter().filter_map(|p| match p { Piece::Text(t) => Some(t.as_str()), _ => None }).collect();
        let sealed = item["encrypted_content"].as_str().unwrap_or_default();
        prop_assert_eq!(super::compaction::open(sealed), Ok(text));
        prop_assert_eq!(&response["output"][0], item);
        prop_assert_eq!(response["output"].as_array().map(Vec::len), Some(1));
    }
}
