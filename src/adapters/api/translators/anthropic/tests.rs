//! Tests of the Messages translators: requests translate to the chat body (examples and a
//! property over generated valid requests), and any run-event sequence becomes a
//! well-formed Messages event stream.

use proptest::prelude::*;
use serde_json::{Value, json};

use super::request::translate;
use super::session_in_user_id;
use super::stream::MessagesStream;
use crate::adapters::api::translators::StreamTranslator as _;
use crate::adapters::api::translators::client_fixtures::client_request;
use crate::adapters::api::translators::output::Finished;
use crate::adapters::api::translators::strategies::{Piece, end, piece, play};
use crate::adapters::api::translators::{ApiError, ApiEvent};
use crate::domain::Usage;

#[test]
fn a_conversation_with_tools_becomes_the_chat_body() {
    let request = json!({
        "model": "echo/default", "max_tokens": 64, "stream": true,
        "system": [{"type": "text", "text": "be brief"}],
        "stop_sequences": ["END"], "temperature": 0.5,
        "tools": [{"name": "get_weather", "description": "d", "input_schema": {"type": "object"}}],
        "tool_choice": {"type": "any", "disable_parallel_tool_use": true},
        "messages": [
            {"role": "user", "content": "weather?"},
            {"role": "assistant", "content": [
                {"type": "thinking", "thinking": "hm", "signature": "s"},
                {"type": "text", "text": "checking"},
                {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Oslo"}},
            ]},
            {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": "toolu_1", "content": [{"type": "text", "text": "sunny"}]},
                {"type": "text", "text": "thanks"},
            ]},
        ],
    });
    let translated = translate(&request).unwrap();
    assert!(translated.stream && !translated.thinking);
    assert_eq!(translated.model, "echo/default");
    let chat = translated.chat;
    assert_eq!(chat["max_tokens"], 64);
    assert_eq!(chat["stop"], json!(["END"]));
    assert_eq!(chat["tool_choice"], "required");
    assert_eq!(chat["parallel_tool_calls"], false);
    assert_eq!(
        chat["tools"][0]["function"]["parameters"],
        json!({"type": "object"})
    );
    let messages = chat["messages"].as_array().unwrap();
    let roles: Vec<&str> = messages
        .iter()
        .map(|m| m["role"].as_str().unwrap())
        .collect();
    assert_eq!(roles, ["system", "user", "assistant", "tool", "user"]);
    assert_eq!(messages[0]["content"], "be brief");
    assert_eq!(messages[2]["content"], "checking");
    assert_eq!(
        messages[2]["tool_calls"][0]["function"]["arguments"],
        r#"{"city":"Oslo"}"#
    );
    assert_eq!(
        messages[3],
        json!({"role": "tool", "tool_call_id": "toolu_1", "content": "sunny"})
    );
    assert_eq!(messages[4]["content"], "thanks");
    assert!(chat.get("model").is_none() && chat.get("stream").is_none());
}

#[test]
fn invalid_and_unsupported_requests_are_400s_naming_the_field() {
    let base =
        json!({"model": "m", "max_tokens": 1, "messages": [{"role": "user", "content": "x"}]});
    let with = |field: &str, value: Value| {
        let mut body = base.clone();
        body[field] = value;
        translate(&body).unwrap_err()
    };
    let cases = [
        with("max_tokens", json!(0)),
        with("messages", json!([])),
        with("messages", json!([{"role": "robot", "content": "x"}])),
        with(
            "messages",
            json!([{"role": "user", "content": [{"type": "document"}]}]),
        ),
        with("tool_choice", json!({"type": "sometimes"})),
        with("thinking", json!({"type": "maybe"})),
        with("stream", json!("yes")),
    ];
    for error in cases {
        assert_eq!(error.status().as_u16(), 400, "{error:?}");
        assert!(!error.to_json().contains(r#""param":null"#), "{error:?}");
    }
    assert!(translate(&json!([1])).is_err());
    assert!(translate(&json!({"max_tokens": 1, "messages": []})).is_err());
}

#[test]
fn server_tools_are_left_out_unless_tool_choice_forces_one() {
    let body = json!({"model": "m", "max_tokens": 1, "messages": [{"role": "user", "content": "x"}],
        "tools": [{"type": "web_search_20250305", "name": "web_search"},
                  {"name": "get_weather", "input_schema": {"type": "object"}}]});
    let translated = translate(&body).expect("server tools are left out");
    let tools = translated.chat["tools"].as_array().unwrap();
    assert_eq!(tools.len(), 1);
    assert_eq!(tools[0]["function"]["name"], "get_weather");
    let mut forced = body.clone();
    forced["tool_choice"] = json!({"type": "tool", "name": "web_search"});
    let error = translate(&forced).unwrap_err();
    assert_eq!(error.status().as_u16(), 400);
    assert!(
        error.message().contains("web_search_20250305"),
        "{}",
        error.message()
    );
}

/// Claude Code's first request (tests/fixtures/clients), as captured: `system` blocks, a
/// system turn after the first user turn (kept in place), untyped tools, adaptive thinking,
/// and the options the edge ignores (`context_management`, `output_config`, `metadata`).
#[test]
fn the_claude_code_request_translates() {
    let translated = translate(&client_request("claude-code-2.1.332.json"))
        .expect("Claude Code's request translates");
    let messages = translated.chat["messages"].as_array().unwrap();
    let roles: Vec<&str> = messages
        .iter()
        .map(|m| m["role"].as_str().unwrap())
        .collect();
    assert_eq!(roles, ["system", "user", "system"]);
    assert!(
        messages[2]["content"]
            .as_str()
            .unwrap()
            .starts_with("# Environment")
    );
    assert_eq!(translated.chat["tools"].as_array().unwrap().len(), 12);
    assert!(translated.thinking && translated.stream);
}

#[test]
fn claude_codes_user_id_carries_its_session() {
    let user_id = r#"{"device_id":"d","account_uuid":"","session_id":"316e8cb1"}"#;
    assert_eq!(session_in_user_id(user_id).as_deref(), Some("316e8cb1"));
    assert_eq!(session_in_user_id("user-42"), None);
    assert_eq!(session_in_user_id(r#"{"session_id":""}"#), None);
    assert_eq!(session_in_user_id("{not json"), None);
}

fn text_block() -> impl Strategy<Value = Value> {
    ".{0,12}".prop_map(|text| json!({"type": "text", "text": text}))
}

fn user_turn() -> impl Strategy<Value = Value> {
    let block = prop_oneof![
        text_block(),
        "[a-z]{1,6}"
            .prop_map(|id| json!({"type": "tool_result", "tool_use_id": id, "content": "ok"})),
        Just(
            json!({"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AAAA"}})
        ),
    ];
    prop_oneof![
        ".{0,12}".prop_map(|text| json!({"role": "user", "content": text})),
        proptest::collection::vec(block, 1..4)
            .prop_map(|blocks| json!({"role": "user", "content": blocks})),
    ]
}

fn assistant_turn() -> impl Strategy<Value = Value> {
    let block = prop_oneof![
        text_block(),
        ("[a-z]{1,6}", "[a-z_]{1,8}").prop_map(
            |(id, name)| json!({"type": "tool_use", "id": id, "name": name, "input": {"a": 1}})
        ),
        Just(json!({"type": "thinking", "thinking": "t", "signature": "s"})),
    ];
    proptest::collection::vec(block, 1..4)
        .prop_map(|blocks| json!({"role": "assistant", "content": blocks}))
}

fn request() -> impl Strategy<Value = Value> {
    let turns = proptest::collection::vec(prop_oneof![user_turn(), assistant_turn()], 1..6);
    let tools = proptest::collection::vec("[a-z]{1,8}", 0..3);
    (
        turns,
        tools,
        1u32..100_000,
        any::<bool>(),
        proptest::option::of(".{0,10}"),
    )
        .prop_map(|(messages, tools, max_tokens, stream, system)| {
            let tools: Vec<Value> = tools
                .iter()
                .map(|name| json!({"name": name, "input_schema": {"type": "object"}}))
                .collect();
            json!({
                "model": "echo/default", "max_tokens": max_tokens, "stream": stream,
                "system": system, "messages": messages, "tools": tools,
                "tool_choice": {"type": "auto"}, "stop_sequences": ["x"],
            })
        })
}

proptest! {
    /// Any valid request translates, keeping every turn, tool result and tool.
    #[test]
    fn any_valid_request_translates(body in request()) {
        let translated = translate(&body).unwrap();
        let messages = translated.chat["messages"].as_array().unwrap().clone();
        let results = body["messages"].as_array().unwrap().iter()
            .filter_map(|m| m["content"].as_array())
            .flatten()
            .filter(|b| b["type"] == "tool_result")
            .count();
        prop_assert_eq!(messages.iter().filter(|m| m["role"] == "tool").count(), results);
        prop_assert!(messages.iter().all(|m| ["system", "user", "assistant", "tool"].contains(&m["role"].as_str().unwrap())));
        prop_assert_eq!(&translated.chat["max_tokens"], &body["max_tokens"]);
        prop_assert_eq!(translated.chat["tools"].as_array().map_or(0, Vec::len), body["tools"].as_array().unwrap().len());
    }
}

/// Checks the Messages stream rules; returns the text and each tool block's JSON.
fn check_messages_stream(
    events: &[ApiEvent],
    failed: bool,
) -> Result<(String, Vec<String>), TestCaseError> {
    prop_assert_eq!((events[0].name, events[1].name), ("message_start", "ping"));
    let mut kinds: Vec<String> = Vec::new();
    let mut open: Vec<bool> = Vec::new();
    let (mut text, mut tools) = (String::new(), Vec::new());
    for event in &events[2..events.len() - 1] {
        prop_assert_eq!(event.name, event.data["type"].as_str().unwrap());
        let index = event.data["index"].as_u64().map(|i| i as usize);
        match event.name {
            "content_block_start" => {
                prop_assert_eq!(index, Some(kinds.len()), "indexes count up from 0");
                let kind = event.data["content_block"]["type"]
                    .as_str()
                    .unwrap()
                    .to_owned();
                if kind == "tool_use" {
                    tools.push(String::new());
                }
                kinds.push(kind);
                open.push(true);
            }
            "content_block_delta" => {
                let index = index.unwrap();
                prop_assert!(open.get(index) == Some(&true), "a delta to an open block");
                let delta = &event.data["delta"];
                match (delta["type"].as_str().unwrap(), kinds[index].as_str()) {
                    ("text_delta", "text") => text.push_str(delta["text"].as_str().unwrap()),
                    ("thinking_delta", "thinking") => {}
                    ("input_json_delta", "tool_use") => {
                        let tool = kinds[..index].iter().filter(|k| *k == "tool_use").count();
                        tools[tool].push_str(delta["partial_json"].as_str().unwrap());
                    }
                    other => prop_assert!(false, "delta {:?} in the wrong block", other),
                }
            }
            "content_block_stop" => {
                let index = index.unwrap();
                prop_assert!(open.get(index) == Some(&true), "a block stops once");
                open[index] = false;
            }
            "message_delta" => prop_assert!(
                !failed && open.iter().all(|o| !o),
                "blocks closed before message_delta"
            ),
            other => prop_assert!(false, "unexpected event {}", other),
        }
    }
    let last = events.last().unwrap();
    prop_assert_eq!(last.name, if failed { "error" } else { "message_stop" });
    prop_assert_eq!(
        events
            .iter()
            .filter(|e| e.name == "message_stop" || e.name == "error")
            .count(),
        1
    );
    Ok((text, tools))
}

proptest! {
    /// Any sequence of run output and any end becomes a well-formed Messages stream that
    /// carries all the text and every tool call's arguments.
    #[test]
    fn any_event_sequence_becomes_a_well_formed_messages_stream(
        pieces in proptest::collection::vec(piece(), 0..24),
        end in end(),
        thinking in any::<bool>(),
    ) {
        let mut stream = MessagesStream::new("msg_r".into(), "m".into(), thinking);
        let events = play(&mut stream, &pieces, &end);
        let (text, tools) = check_messages_stream(&events, end.is_err())?;
        let sent: String = pieces.iter().filter_map(|p| match p { Piece::Text(t) => Some(t.as_str()), _ => None }).collect();
        prop_assert_eq!(text, sent);
        let mut order: Vec<u32> = Vec::new();
        for piece in &pieces {
            if let Piece::Tool { index, .. } = piece && !order.contains(index) { order.push(*index); }
        }
        for (n, index) in order.iter().enumerate() {
            let arguments: String = pieces.iter().filter_map(|p| match p {
                Piece::Tool { index: i, arguments, .. } if i == index => Some(arguments.as_str()),
                _ => None,
            }).collect();
            prop_assert_eq!(&tools[n], &arguments);
        }
        if let Ok(finished) = &end {
            let stop = &events[events.len() - 2].data["delta"]["stop_reason"];
            let expected = if order.is_empty() { super::message::stop_reason(&finished.finish_reason, false) } else { "tool_use" };
            prop_assert_eq!(stop.as_str(), Some(expected));
        }
    }
}

#[test]
fn cached_prompt_tokens_are_read_from_the_cache_not_input() {
    let usage = crate::domain::Usage {
        cached_input_tokens: 246,
        ..crate::domain::Usage::new(251, 3)
    };
    assert_eq!(
        super::message::usage_json(usage),
        json!({"input_tokens": 5, "output_tokens": 3, "cache_read_input_tokens": 246})
    );
    let uncached = super::message::usage_json(crate::domain::Usage::new(14, 1));
    assert_eq!(uncached, json!({"input_tokens": 14, "output_tokens": 1}));
}

#[test]
fn message_start_carries_the_prompt_counts_the_first_output_brought() {
    let counts = Usage {
        input_tokens: 12,
        output_tokens: 1,
        cached_input_tokens: 3,
        reasoning_tokens: 0,
    };
    let mut stream = MessagesStream::new("msg_1".into(), "m".into(), false);
    let start = &stream.open(Some(counts))[0];
    assert_eq!(start.name, "message_start");
    let usage = &start.data["message"]["usage"];
    assert_eq!(usage["input_tokens"], 9, "{usage}");
    assert_eq!(usage["cache_read_input_tokens"], 3, "{usage}");
    // The final usage says the same of the prompt.
    let end = stream.close(Ok(&Finished {
        finish_reason: "stop".into(),
        usage: Some(Usage {
            output_tokens: 5,
            ..counts
        }),
    }));
    let delta = end
        .iter()
        .find(|e| e.name == "message_delta")
        .expect("a delta");
    assert_eq!(delta.data["usage"]["input_tokens"], 9);
    // Without counts, zeros as before.
    let start = &MessagesStream::new("msg_2".into(), "m".into(), false).open(None)[0];
    assert_eq!(start.data["message"]["usage"]["input_tokens"], 0);
}

#[test]
fn a_prompt_over_the_window_is_said_as_claude_code_reads_it() {
    let error = ApiError::context_length_exceeded(Some(4339), 2048);
    let body = super::message::error_body(&error);
    assert_eq!(body["error"]["type"], "invalid_request_error");
    assert_eq!(
        body["error"]["message"],
        "prompt is too long: 4339 tokens > 2048 maximum"
    );
}
