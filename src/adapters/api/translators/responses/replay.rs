//! A run's events as the management feed gives them (the event sinks' JSON lines, stored
//! or live) read back as what the Responses translator takes: pieces of output and the
//! run's end. Only what the translators use is read (text, reasoning, tool calls, the
//! counts so far, the terminal event's fields), so a replay feeds them exactly what the
//! first stream fed them.
//!
//! Pure: a line in, a value out.

use serde_json::Value;

use crate::adapters::api::translators::ApiError;
use crate::adapters::api::translators::output::Finished;
use crate::domain::{FailureClass, StructuredOutput, ToolCallDelta, Usage};

/// What one event of the run means to the translator.
#[derive(Debug)]
pub(in crate::adapters::api) enum Replayed {
    /// A piece of output: its text, and its reasoning and tool calls if it has any.
    Output(String, Option<StructuredOutput>),
    /// The run's end.
    End(Result<Finished, ApiError>),
    /// Nothing the answer shows (`started`, output with no text, reasoning or call).
    Skip,
}

/// The event of `kind` whose JSON line is `json`; failures carry `retry_after_secs`.
pub(in crate::adapters::api) fn replayed(
    kind: &str,
    json: &str,
    retry_after_secs: u64,
) -> Replayed {
    let Ok(event) = serde_json::from_str::<Value>(json) else {
        return Replayed::Skip;
    };
    let text = |field: &str| event[field].as_str().unwrap_or_default().to_owned();
    match kind {
        "output" => output(text("text"), &event),
        "completed" => {
            let finish_reason = Some(text("finish_reason"))
                .filter(|reason| !reason.is_empty())
                .unwrap_or_else(|| "stop".to_owned());
            Replayed::End(Ok(Finished {
                finish_reason,
                usage: usage(&event),
            }))
        }
        "failed" => {
            let status = event["status"].as_u64().and_then(|s| u16::try_from(s).ok());
            let (code, message) = (text("code"), text("message"));
            let class = FailureClass::parse(&text("class"));
            let window = event["context_window"]
                .as_u64()
                .and_then(|n| u32::try_from(n).ok());
            let prompt = usage(&event).map(|usage| usage.input_tokens);
            let error = ApiError::run_failed(&code, &message, class, status, retry_after_secs)
                .with_context_window(prompt, window);
            Replayed::End(Err(error))
        }
        "cancelled" => Replayed::End(Err(ApiError::run_cancelled(&text("reason")))),
        _ => Replayed::Skip,
    }
}

fn output(text: String, event: &Value) -> Replayed {
    let reasoning = event["reasoning"].as_str().unwrap_or_default().to_owned();
    let tool_calls: Vec<ToolCallDelta> = event["tool_calls"]
        .as_array()
        .map(|calls| calls.iter().map(tool_call).collect())
        .unwrap_or_default();
    let structured = StructuredOutput {
        reasoning,
        tool_calls,
        usage: usage(event),
        ..StructuredOutput::default()
    };
    if text.is_empty() && structured.reasoning.is_empty() && structured.tool_calls.is_empty() {
        return Replayed::Skip;
    }
    Replayed::Output(text, (!structured.is_empty()).then_some(structured))
}

fn tool_call(call: &Value) -> ToolCallDelta {
    let text = |field: &str| call[field].as_str().unwrap_or_default().to_owned();
    ToolCallDelta {
        index: call["index"]
            .as_u64()
            .and_then(|i| u32::try_from(i).ok())
            .unwrap_or_default(),
        id: text("id"),
        name: text("name"),
        arguments: text("arguments"),
    }
}

fn usage(event: &Value) -> Option<Usage> {
    let count = |field: &str| {
        event[field]
            .as_u64()
            .and_then(|n| u32::try_from(n).ok())
            .unwrap_or_default()
    };
    event.get("input_tokens").map(|_| Usage {
        input_tokens: count("input_tokens"),
        output_tokens: count("output_tokens"),
        cached_input_tokens: count("cached_input_tokens"),
        reasoning_tokens: count("reasoning_tokens"),
    })
}

#[cfg(test)]
mod tests {
    use bytes::Bytes;
    use serde_json::Value;

    use super::*;
    use crate::adapters::api::translators::StreamTranslator;
    use crate::adapters::api::translators::responses::items::ResponseBase;
    use crate::adapters::api::translators::responses::stream::ResponsesStream;
    use crate::adapters::event_format::tests::event;
    use crate::adapters::event_format::write_json_line;
    use crate::domain::{RunEvent, RunEventKind};

    fn base() -> ResponseBase {
        ResponseBase {
            id: "resp_bg_r1".into(),
            model: "echo/m1".into(),
            created_at: 1,
            instructions: Value::Null,
            namespaces: Default::default(),
            background: true,
            compaction: false,
        }
    }

    fn structured(reasoning: &str, call: Option<(u32, &str, &str)>) -> RunEventKind {
        RunEventKind::Output {
            text: String::new(),
            data: Bytes::new(),
            structured: Some(Box::new(StructuredOutput {
                reasoning: reasoning.into(),
                tool_calls: call
                    .map(|(index, name, arguments)| ToolCallDelta {
                        index,
                        id: format!("call_{index}"),
                        name: name.into(),
                        arguments: arguments.into(),
                    })
                    .into_iter()
                    .collect(),
                ..StructuredOutput::default()
            })),
        }
    }

    /// The events the translator makes of `kinds` when fed directly, as a live stream is.
    fn live(kinds: &[RunEventKind]) -> Vec<(String, Value)> {
        let mut stream = ResponsesStream::new(base());
        let mut events = stream.open(None);
        for kind in kinds {
            match kind {
                RunEventKind::Output {
                    text, structured, ..
                } => events.extend(stream.output(text, structured.as_deref())),
                RunEventKind::Completed {
                    finish_reason,
                    usage,
                } => {
                    let finished = Finished {
                        finish_reason: finish_reason.clone(),
                        usage: *usage,
                    };
                    events.extend(stream.close(Ok(&finished)));
                }
                RunEventKind::Cancelled { reason, .. } => {
                    events.extend(stream.close(Err(&ApiError::run_cancelled(reason))));
                }
                _ => {}
            }
        }
        events
            .into_iter()
            .map(|e| (e.name.to_owned(), e.data))
            .collect()
    }

    /// The same, fed from the events' JSON lines, as a replay is.
    /// `kind`'s event as the journal stores it: the `file` sink's line.
    fn line_of(kind: &RunEventKind) -> String {
        let event: RunEvent = event(kind.clone());
        let mut line = Vec::new();
        write_json_line(&event, &mut line);
        String::from_utf8(line).unwrap().trim_end().to_owned()
    }

    fn replayed_from_lines(kinds: &[RunEventKind]) -> Vec<(String, Value)> {
        let mut stream = ResponsesStream::new(base());
        let mut events = stream.open(None);
        for kind in kinds {
            match replayed(kind.name(), &line_of(kind), 1) {
                Replayed::Output(text, structured) => {
                    events.extend(stream.output(&text, structured.as_ref()));
                }
                Replayed::End(end) => events.extend(stream.close(end.as_ref())),
                Replayed::Skip => {}
            }
        }
        events
            .into_iter()
            .map(|e| (e.name.to_owned(), e.data))
            .collect()
    }

    #[test]
    fn a_replay_from_the_event_lines_is_the_live_stream_again() {
        let answers = [
            vec![
                RunEventKind::Started,
                structured("think", None),
                RunEventKind::text("one "),
                RunEventKind::text(""),
                RunEventKind::text("two"),
                structured("", Some((0, "lookup", "{\"a\""))),
                structured("", Some((1, "clock", "{}"))),
                structured("", Some((0, "", ":1}"))),
                RunEventKind::Completed {
                    finish_reason: "tool_calls".into(),
                    usage: Some(Usage {
                        input_tokens: 5,
                        output_tokens: 7,
                        cached_input_tokens: 2,
                        reasoning_tokens: 1,
                    }),
                },
            ],
            vec![
                RunEventKind::text("cut "),
                RunEventKind::Completed {
                    finish_reason: "length".into(),
                    usage: None,
                },
            ],
            vec![
                RunEventKind::text("gone"),
                RunEventKind::Cancelled {
                    reason: "cancelled by its caller".into(),
                    usage: None,
                },
            ],
        ];
        for kinds in answers {
            let live = live(&kinds);
            assert_eq!(replayed_from_lines(&kinds), live);
            let numbers: Vec<u64> = live
                .iter()
                .filter_map(|(_, data)| data["sequence_number"].as_u64())
                .collect();
            assert_eq!(numbers, (0..live.len() as u64).collect::<Vec<_>>());
        }
    }

    #[test]
    fn a_failure_replays_as_it_was_sent_whatever_its_class() {
        for class in [
            FailureClass::Unspecified,
            FailureClass::Request,
            FailureClass::Node,
            FailureClass::Refused,
        ] {
            let failed = RunEventKind::Failed {
                context_window: None,
                code: "engine_error".into(),
                message: "boom".into(),
                class,
                status: Some(400),
                usage: None,
            };
            let kinds = [RunEventKind::text("a"), failed];
            let events = replayed_from_lines(&kinds);
            let (name, data) = events.last().unwrap();
            assert_eq!(name, "response.failed");
            assert_eq!(data["response"]["status"], "failed");
            assert!(
                data["response"]["error"]["message"]
                    .as_str()
                    .unwrap()
                    .contains("boom")
            );
            let Replayed::End(Err(error)) = replayed("failed", &line_of(&kinds[1]), 1) else {
                panic!("a failure replays as an error");
            };
            let sent = ApiError::run_failed("engine_error", "boom", class, Some(400), 1);
            assert_eq!(error, sent, "{class:?}");
        }
        assert!(matches!(replayed("output", "not json", 1), Replayed::Skip));
    }
}
