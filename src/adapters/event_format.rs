//! How a run event looks as one line of text or one JSON line: the single place the stdout
//! and file sinks, the NATS sink, the run journal and the management API's event feed
//! format events, so every one of them writes the same bytes.
//!
//! Formatting appends to a caller-owned `Vec<u8>` so the hot path reuses one buffer and does
//! not allocate per event: numbers through `itoa`, bytes through `base64`, JSON strings
//! through `serde_json`'s own escaping. Nothing here does I/O; every line ends with `\n` and
//! holds no other newline.

use std::borrow::Cow;
use std::io::Write as _;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use serde::Deserialize;

use crate::domain::routing::RouteReason;
use crate::domain::{EventOrigin, FailureClass, RunEvent, RunEventKind, Usage};
use crate::ports::FeedEvent;

mod structured;

/// Which of the two line formats an event is written in (`[events.stdout] format`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LineFormat {
    /// `run_id node adapter/target kind payload`: [`write_text_line`].
    #[default]
    Text,
    /// One JSON object per line: [`write_json_line`].
    Json,
}

/// Appends `event` as one line in `format` (ending with `\n`) to `out`.
pub fn write_line(format: LineFormat, event: &RunEvent, out: &mut Vec<u8>) {
    match format {
        LineFormat::Text => write_text_line(event, out),
        LineFormat::Json => write_json_line(event, out),
    }
}

/// A feed's event as one JSON object (no newline): the journal's bytes for a stored one,
/// the same event line written now for a live one, so a reader cannot tell them apart.
pub fn feed_json(event: &FeedEvent) -> Cow<'_, str> {
    match event {
        FeedEvent::Stored(json) => Cow::Borrowed(json),
        FeedEvent::Live(event) => {
            let mut line = Vec::with_capacity(128);
            write_json_line(event, &mut line);
            while line.last() == Some(&b'\n') {
                line.pop();
            }
            Cow::Owned(String::from_utf8_lossy(&line).into_owned())
        }
    }
}

/// Appends `event` as `<run_id> <node or -> <adapter>/<target> <kind> <payload>\n`.
///
/// The payload is the output text (with `\`, newlines and other control characters
/// escaped, so one event is one line) or `<N bytes>` for binary output;
/// followed by ` reasoning=.. tool_call=INDEX:ID:NAME:ARGS logprobs=N embeddings=NxDIM tokens=N` for
/// what structured output it carries;
/// `finish_reason=.. input_tokens=.. output_tokens=..` (and `cached_input_tokens=..`,
/// `reasoning_tokens=..` when not zero) for completed runs;
/// `code=.. class=.. status=.. context_window=.. message=..` (class, status and window when the node gave them) for
/// failed ones; `reason=..` for cancelled ones; for `started`,
/// `attempt=.. route=..` (the rule, attempt, eligible nodes and queue wait of its
/// placement) when the edge placed it, else nothing (the line then ends after the kind).
pub fn write_text_line(event: &RunEvent, out: &mut Vec<u8>) {
    out.extend_from_slice(event.run_id.as_str().as_bytes());
    out.push(b' ');
    match &event.node {
        Some(node) => out.extend_from_slice(node.as_str().as_bytes()),
        None => out.push(b'-'),
    }
    out.push(b' ');
    out.extend_from_slice(event.adapter.as_str().as_bytes());
    out.push(b'/');
    out.extend_from_slice(event.target.as_str().as_bytes());
    out.push(b' ');
    out.extend_from_slice(event.kind.name().as_bytes());
    push_text_payload(event, out);
    out.push(b'\n');
}

/// Appends the text line's fields after the kind: what [`write_text_line`] lists per kind.
#[inline]
fn push_text_payload(event: &RunEvent, out: &mut Vec<u8>) {
    match &event.kind {
        RunEventKind::Started => push_text_route(event.route.as_deref(), out),
        RunEventKind::Output {
            text,
            data,
            structured,
        } => {
            out.push(b' ');
            push_escaped(text, out);
            if !data.is_empty() {
                if !text.is_empty() {
                    out.push(b' ');
                }
                out.push(b'<');
                push_u64(data.len() as u64, out);
                out.extend_from_slice(b" bytes>");
            }
            if let Some(structured) = structured {
                structured::push_text(structured, out);
            }
        }
        RunEventKind::Completed {
            finish_reason,
            usage,
        } => {
            out.extend_from_slice(b" finish_reason=");
            push_escaped(finish_reason, out);
            push_text_usage(usage.as_ref(), out);
        }
        RunEventKind::Failed { .. } => push_text_failure(&event.kind, out),
        RunEventKind::Cancelled { reason, usage } => {
            push_text_usage(usage.as_ref(), out);
            out.extend_from_slice(b" reason=");
            push_escaped(reason, out);
        }
    }
}

/// The labels of a usage's counts on a text line: input, output, cached input, reasoning.
const TEXT_USAGE: [&[u8]; 4] = [
    b" input_tokens=",
    b" output_tokens=",
    b" cached_input_tokens=",
    b" reasoning_tokens=",
];

/// The same in a JSON line.
const JSON_USAGE: [&[u8]; 4] = [
    b",\"input_tokens\":",
    b",\"output_tokens\":",
    b",\"cached_input_tokens\":",
    b",\"reasoning_tokens\":",
];

/// Appends a terminal event's usage to a text line, if known.
fn push_text_usage(usage: Option<&Usage>, out: &mut Vec<u8>) {
    push_usage(usage, TEXT_USAGE, out);
}

/// Appends a terminal event's usage to a JSON line, if known.
fn push_json_usage(usage: Option<&Usage>, out: &mut Vec<u8>) {
    push_usage(usage, JSON_USAGE, out);
}

/// Appends `label` and `value` when there is a value.
fn push_some(label: &[u8], value: Option<u64>, out: &mut Vec<u8>) {
    if let Some(value) = value {
        out.extend_from_slice(label);
        push_u64(value, out);
    }
}

/// Appends a terminal event's usage, if known, under `labels`: input and output tokens
/// always, cached input and reasoning tokens only when there are any.
fn push_usage(usage: Option<&Usage>, labels: [&[u8]; 4], out: &mut Vec<u8>) {
    let Some(usage) = usage else {
        return;
    };
    let counts = [
        usage.input_tokens,
        usage.output_tokens,
        usage.cached_input_tokens,
        usage.reasoning_tokens,
    ];
    for (i, (label, count)) in labels.into_iter().zip(counts).enumerate() {
        if i < 2 || count > 0 {
            out.extend_from_slice(label);
            push_u64(u64::from(count), out);
        }
    }
}

/// Appends `text` with `\` as `\\`, newline as `\n`, carriage return as `\r`, tab as `\t`
/// and any other control character as `\u{..}`, so it stays on one line and cannot send
/// terminal escape sequences.
fn push_escaped(text: &str, out: &mut Vec<u8>) {
    let mut start = 0;
    for (i, c) in text.char_indices() {
        let escape: &[u8] = match c {
            '\\' => b"\\\\",
            '\n' => b"\\n",
            '\r' => b"\\r",
            '\t' => b"\\t",
            c if c.is_control() => b"",
            _ => continue,
        };
        out.extend_from_slice(&text.as_bytes()[start..i]);
        if escape.is_empty() {
            // Writing into a Vec cannot fail.
            let _ = write!(out, "\\u{{{:x}}}", u32::from(c));
        } else {
            out.extend_from_slice(escape);
        }
        start = i + c.len_utf8();
    }
    out.extend_from_slice(&text.as_bytes()[start..]);
}

/// Appends `event` as one JSON object and `\n`:
/// `{"run_id":..,"node":..|null,"adapter":..,"target":..,"seq":..,"origin":"node"|"edge",
/// "kind":..,<payload fields>}`. Payload fields: `attempt`, `reason` (the rule's label) and
/// `route` (the whole reason) for started, when the edge placed it; `text` and `data`
/// (standard base64, omitted when empty) and `reasoning`, `tool_calls`, `logprobs`,
/// `embeddings`, `tokens` (each omitted when empty) for output; `finish_reason`, `input_tokens`,
/// `output_tokens` (omitted when the node reported no counts), `cached_input_tokens`,
/// `reasoning_tokens` (omitted when zero) for completed; `code`, `message`, `class`,
/// `status` (the last two omitted when the node gave none) for failed; `reason` for
/// cancelled.
///
/// Written field by field, byte for byte what `serde_json` writes for the same object (a
/// test holds it to that): this runs once per event in the file sink, and serializing a
/// struct through the generic serializer cost several times the rest of the relay.
pub fn write_json_line(event: &RunEvent, out: &mut Vec<u8>) {
    out.extend_from_slice(b"{\"run_id\":");
    push_json_str(event.run_id.as_str(), out);
    out.extend_from_slice(b",\"node\":");
    match &event.node {
        Some(node) => push_json_str(node.as_str(), out),
        None => out.extend_from_slice(b"null"),
    }
    out.extend_from_slice(b",\"adapter\":");
    push_json_str(event.adapter.as_str(), out);
    out.extend_from_slice(b",\"target\":");
    push_json_str(event.target.as_str(), out);
    out.extend_from_slice(b",\"seq\":");
    push_u64(event.seq, out);
    out.extend_from_slice(match event.origin {
        EventOrigin::Node => b",\"origin\":\"node\",\"kind\":\"",
        EventOrigin::Edge => b",\"origin\":\"edge\",\"kind\":\"",
    });
    out.extend_from_slice(event.kind.name().as_bytes());
    out.push(b'"');
    push_json_payload(event, out);
    out.extend_from_slice(b"}\n");
}

/// Appends a failure's text-line fields: its code, class, status, context window, usage and
/// message.
fn push_text_failure(kind: &RunEventKind, out: &mut Vec<u8>) {
    let RunEventKind::Failed {
        context_window,
        code,
        message,
        class,
        status,
        usage,
    } = kind
    else {
        return;
    };
    out.extend_from_slice(b" code=");
    push_escaped(code, out);
    if *class != FailureClass::Unspecified {
        out.extend_from_slice(b" class=");
        out.extend_from_slice(class.as_str().as_bytes());
    }
    push_some(b" status=", status.map(u64::from), out);
    push_some(b" context_window=", context_window.map(u64::from), out);
    push_text_usage(usage.as_ref(), out);
    out.extend_from_slice(b" message=");
    push_escaped(message, out);
}

/// Appends the JSON line's payload fields: what [`write_json_line`] lists per kind.
#[inline]
fn push_json_payload(event: &RunEvent, out: &mut Vec<u8>) {
    match &event.kind {
        RunEventKind::Started => push_json_route(event.route.as_deref(), out),
        RunEventKind::Output {
            text,
            data,
            structured,
        } => {
            out.extend_from_slice(b",\"text\":");
            push_json_str(text, out);
            if !data.is_empty() {
                out.extend_from_slice(b",\"data\":\"");
                push_base64(data, out);
                out.push(b'"');
            }
            if let Some(structured) = structured {
                structured::push_json(structured, out);
            }
        }
        RunEventKind::Completed {
            finish_reason,
            usage,
        } => {
            out.extend_from_slice(b",\"finish_reason\":");
            push_json_str(finish_reason, out);
            push_json_usage(usage.as_ref(), out);
        }
        RunEventKind::Failed {
            context_window,
            code,
            message,
            class,
            status,
            usage,
        } => {
            out.extend_from_slice(b",\"code\":");
            push_json_str(code, out);
            out.extend_from_slice(b",\"message\":");
            push_json_str(message, out);
            if *class != FailureClass::Unspecified {
                out.extend_from_slice(b",\"class\":\"");
                out.extend_from_slice(class.as_str().as_bytes());
                out.push(b'"');
            }
            push_some(b",\"status\":", status.map(u64::from), out);
            push_some(b",\"context_window\":", context_window.map(u64::from), out);
            push_json_usage(usage.as_ref(), out);
        }
        RunEventKind::Cancelled { reason, usage } => {
            out.extend_from_slice(b",\"reason\":");
            push_json_str(reason, out);
            push_json_usage(usage.as_ref(), out);
        }
    }
}

/// Appends a started event's ` attempt=.. route=..`, if the edge placed it.
fn push_text_route(route: Option<&RouteReason>, out: &mut Vec<u8>) {
    if let Some(route) = route {
        out.extend_from_slice(b" attempt=");
        push_u64(u64::from(route.attempt), out);
        out.extend_from_slice(b" route=");
        // Writing into a Vec cannot fail.
        let _ = write!(out, "{route}");
    }
}

/// Appends a started event's `,"attempt":..,"reason":..,"route":..`, if the edge placed it.
fn push_json_route(route: Option<&RouteReason>, out: &mut Vec<u8>) {
    if let Some(route) = route {
        out.extend_from_slice(b",\"attempt\":");
        push_u64(u64::from(route.attempt), out);
        out.extend_from_slice(b",\"reason\":\"");
        out.extend_from_slice(route.label().as_bytes());
        out.extend_from_slice(b"\",\"route\":");
        push_json_str(&route.to_string(), out);
    }
}

/// Appends `text` as a JSON string, escaped by `serde_json`.
fn push_json_str(text: &str, out: &mut Vec<u8>) {
    // Serializing a `str` into a Vec cannot fail.
    let _ = serde_json::to_writer(&mut *out, text);
}

/// Appends `n` in decimal.
fn push_u64(n: u64, out: &mut Vec<u8>) {
    out.extend_from_slice(itoa::Buffer::new().format(n).as_bytes());
}

/// Appends `data` as standard base64 (with padding), straight into `out`.
fn push_base64(data: &[u8], out: &mut Vec<u8>) {
    let start = out.len();
    let len = base64::encoded_len(data.len(), true).unwrap_or(0);
    out.resize(start + len, 0);
    if STANDARD.encode_slice(data, &mut out[start..]).is_err() {
        // Only a length overflow, which no event reaches: write nothing rather than zeros.
        out.truncate(start);
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use std::sync::Arc;

    use bytes::Bytes;

    use super::*;
    use crate::domain::routing::{RouteReason, RouteRule};
    use crate::domain::{
        AdapterName, Embedding, NodeId, RunId, StructuredOutput, Target, TokenLogprob,
        ToolCallDelta,
    };

    /// An event of `kind` for run `r1` on `node-a`, `echo/m1`, seq 3.
    pub(crate) fn event(kind: RunEventKind) -> RunEvent {
        RunEvent {
            run_id: RunId::new("r1"),
            node: Some(NodeId::parse("node-a").unwrap()),
            adapter: AdapterName::parse("echo").unwrap(),
            target: Target::parse("m1").unwrap(),
            seq: 3,
            origin: EventOrigin::Node,
            kind,
            route: None,
        }
    }

    /// A `started` event of a second attempt placed least busy among 3 nodes.
    fn started_again() -> RunEvent {
        let mut started = event(RunEventKind::Started);
        started.route = Some(Box::new(RouteReason {
            rule: RouteRule::LeastBusy,
            attempt: 2,
            eligible: 3,
            queue_wait: None,
        }));
        started
    }

    /// A non-terminal output event whose text is `text`.
    pub(crate) fn output(text: &str) -> Arc<RunEvent> {
        Arc::new(event(RunEventKind::text(text)))
    }

    /// A terminal `completed` event.
    pub(crate) fn completed() -> Arc<RunEvent> {
        Arc::new(event(RunEventKind::Completed {
            finish_reason: "stop".into(),
            usage: Some(Usage::new(5, 7)),
        }))
    }

    fn text(event: &RunEvent) -> String {
        let mut out = Vec::new();
        write_text_line(event, &mut out);
        String::from_utf8(out).unwrap()
    }

    fn json(event: &RunEvent) -> serde_json::Value {
        let mut out = Vec::new();
        write_json_line(event, &mut out);
        assert_eq!(out.last(), Some(&b'\n'));
        assert_eq!(out.iter().filter(|&&b| b == b'\n').count(), 1);
        serde_json::from_slice(&out).unwrap()
    }

    #[test]
    fn failed_and_cancelled_lines_carry_what_the_run_produced() {
        let produced = Some(Usage {
            input_tokens: 5,
            output_tokens: 2,
            cached_input_tokens: 4,
            reasoning_tokens: 0,
        });
        let cancelled = event(RunEventKind::Cancelled {
            reason: "caller".into(),
            usage: produced,
        });
        assert_eq!(
            text(&cancelled),
            "r1 node-a echo/m1 cancelled input_tokens=5 output_tokens=2 cached_input_tokens=4 reason=caller\n"
        );
        assert_eq!(json(&cancelled)["output_tokens"], 2);
        let failed = event(RunEventKind::Failed {
            context_window: None,
            code: "engine_error".into(),
            message: "broke".into(),
            class: FailureClass::Node,
            status: None,
            usage: produced,
        });
        assert_eq!(json(&failed)["cached_input_tokens"], 4);
        assert!(
            json(&event(RunEventKind::cancelled("x")))
                .get("output_tokens")
                .is_none()
        );
    }

    #[test]
    fn text_line_for_each_kind() {
        assert_eq!(
            text(&event(RunEventKind::Started)),
            "r1 node-a echo/m1 started\n"
        );
        assert_eq!(
            text(&output("hello world")),
            "r1 node-a echo/m1 output hello world\n"
        );
        assert_eq!(
            text(&completed()),
            "r1 node-a echo/m1 completed finish_reason=stop input_tokens=5 output_tokens=7\n"
        );
        assert_eq!(
            text(&event(RunEventKind::Completed {
                finish_reason: "length".into(),
                usage: None
            })),
            "r1 node-a echo/m1 completed finish_reason=length\n"
        );
        assert_eq!(
            text(&event(RunEventKind::failed(
                "node_disconnected",
                "the node went away"
            ))),
            "r1 node-a echo/m1 failed code=node_disconnected message=the node went away\n"
        );
        assert_eq!(
            text(&event(RunEventKind::cancelled("caller"))),
            "r1 node-a echo/m1 cancelled reason=caller\n"
        );
    }

    #[test]
    fn started_lines_carry_the_route() {
        assert_eq!(
            text(&started_again()),
            "r1 node-a echo/m1 started attempt=2 route=least_busy; attempt=2; eligible=3\n"
        );
        let line = json(&started_again());
        assert_eq!(line["attempt"], 2);
        assert_eq!(line["reason"], "least_busy");
        assert_eq!(line["route"], "least_busy; attempt=2; eligible=3");
    }

    #[test]
    fn text_line_without_node_shows_a_dash() {
        let mut e = event(RunEventKind::Started);
        e.node = None;
        assert_eq!(text(&e), "r1 - echo/m1 started\n");
    }

    #[test]
    fn text_output_is_escaped_onto_one_line() {
        assert_eq!(
            text(&output("a\nb\r\\c\td\u{1b}[31m")),
            "r1 node-a echo/m1 output a\\nb\\r\\\\c\\td\\u{1b}[31m\n"
        );
        assert_eq!(
            text(&output("héllo ✓")),
            "r1 node-a echo/m1 output héllo ✓\n"
        );
    }

    #[test]
    fn text_binary_output_shows_its_length() {
        let binary = |text: &str| {
            event(RunEventKind::Output {
                text: text.into(),
                data: Bytes::from_static(&[0, 1, 2, 3]),
                structured: None,
            })
        };
        assert_eq!(text(&binary("")), "r1 node-a echo/m1 output <4 bytes>\n");
        assert_eq!(
            text(&binary("hi")),
            "r1 node-a echo/m1 output hi <4 bytes>\n"
        );
    }

    #[test]
    fn json_line_for_each_kind() {
        let started = json(&event(RunEventKind::Started));
        assert_eq!(
            started,
            serde_json::json!({
                "run_id": "r1", "node": "node-a", "adapter": "echo", "target": "m1",
                "seq": 3, "origin": "node", "kind": "started"
            })
        );
        let out = json(&output("a\n\"b\""));
        assert_eq!(out["kind"], "output");
        assert_eq!(out["text"], "a\n\"b\"");
        assert!(out.get("data").is_none());
        let done = json(&completed());
        assert_eq!(done["finish_reason"], "stop");
        assert_eq!(done["input_tokens"], 5);
        assert_eq!(done["output_tokens"], 7);
        let mut failed = event(RunEventKind::failed("deadline_exceeded", "too slow"));
        failed.origin = EventOrigin::Edge;
        failed.node = None;
        let failed = json(&failed);
        assert_eq!(failed["origin"], "edge");
        assert_eq!(failed["node"], serde_json::Value::Null);
        assert_eq!(failed["code"], "deadline_exceeded");
        assert_eq!(failed["message"], "too slow");
        let cancelled = json(&event(RunEventKind::cancelled("caller")));
        assert_eq!(cancelled["kind"], "cancelled");
        assert_eq!(cancelled["reason"], "caller");
    }

    #[test]
    #[allow(
        clippy::too_many_lines,
        reason = "one event of each kind through both lines, asserted field by field"
    )]
    fn structured_output_usage_detail_and_failure_class_reach_both_lines() {
        let structured = StructuredOutput {
            reasoning: "think\nfirst".into(),
            tool_calls: vec![ToolCallDelta {
                index: 0,
                id: "call_1".into(),
                name: "lookup".into(),
                arguments: "{\"q\":1}".into(),
            }],
            logprobs: vec![TokenLogprob {
                token: "hi".into(),
                logprob: -0.5,
                ..TokenLogprob::default()
            }],
            embeddings: vec![Embedding {
                index: 0,
                values: vec![0.5, -1.0],
            }],
            tokens: vec![1, 2, 3],
            usage: Some(Usage {
                input_tokens: 12,
                output_tokens: 1,
                cached_input_tokens: 3,
                reasoning_tokens: 0,
            }),
        };
        let output = event(RunEventKind::Output {
            text: String::new(),
            data: Bytes::new(),
            structured: Some(Box::new(structured)),
        });
        assert_eq!(
            text(&output),
            "r1 node-a echo/m1 output  reasoning=think\\nfirst tool_call=0:call_1:lookup:{\"q\":1} logprobs=1 embeddings=1x2 tokens=3 input_tokens=12 output_tokens=1 cached_input_tokens=3\n"
        );
        let line = json(&output);
        assert_eq!(line["reasoning"], "think\nfirst");
        assert_eq!(
            (
                &line["input_tokens"],
                &line["output_tokens"],
                &line["cached_input_tokens"]
            ),
            (
                &serde_json::json!(12),
                &serde_json::json!(1),
                &serde_json::json!(3)
            )
        );
        assert_eq!(
            line["tool_calls"],
            serde_json::json!([{"index": 0, "id": "call_1", "name": "lookup", "arguments": "{\"q\":1}"}])
        );
        assert_eq!(line["logprobs"][0]["logprob"], -0.5);
        assert_eq!(
            line["embeddings"][0]["values"],
            serde_json::json!([0.5, -1.0])
        );
        assert_eq!(line["tokens"], serde_json::json!([1, 2, 3]));

        let usage = Usage {
            cached_input_tokens: 4,
            reasoning_tokens: 2,
            ..Usage::new(5, 7)
        };
        let done = event(RunEventKind::Completed {
            finish_reason: "stop".into(),
            usage: Some(usage),
        });
        assert_eq!(
            text(&done),
            "r1 node-a echo/m1 completed finish_reason=stop input_tokens=5 output_tokens=7 cached_input_tokens=4 reasoning_tokens=2\n"
        );
        let line = json(&done);
        assert_eq!(
            (
                line["cached_input_tokens"].as_u64(),
                line["reasoning_tokens"].as_u64()
            ),
            (Some(4), Some(2))
        );

        let failed = event(RunEventKind::Failed {
            context_window: Some(2048),
            code: "context_length_exceeded".into(),
            message: "bad prompt".into(),
            class: FailureClass::Request,
            status: Some(400),
            usage: Some(Usage::new(4339, 0)),
        });
        assert_eq!(
            text(&failed),
            "r1 node-a echo/m1 failed code=context_length_exceeded class=request status=400 context_window=2048 input_tokens=4339 output_tokens=0 message=bad prompt\n"
        );
        let line = json(&failed);
        assert_eq!(
            (line["class"].as_str(), line["status"].as_u64()),
            (Some("request"), Some(400))
        );
        assert_eq!(
            (
                line["context_window"].as_u64(),
                line["input_tokens"].as_u64()
            ),
            (Some(2048), Some(4339))
        );
    }

    #[test]
    fn json_binary_output_is_base64() {
        let line = json(&event(RunEventKind::Output {
            text: String::new(),
            data: Bytes::from_static(b"foobar\xff"),
            structured: None,
        }));
        assert_eq!(line["text"], "");
        assert_eq!(line["data"], "Zm9vYmFy/w==");
    }

    #[test]
    fn base64_matches_the_rfc_4648_vectors() {
        let cases: [(&[u8], &str); 7] = [
            (b"", ""),
            (b"f", "Zg=="),
            (b"fo", "Zm8="),
            (b"foo", "Zm9v"),
            (b"foob", "Zm9vYg=="),
            (b"fooba", "Zm9vYmE="),
            (b"foobar", "Zm9vYmFy"),
        ];
        for (input, expected) in cases {
            let mut out = b"x".to_vec();
            push_base64(input, &mut out);
            assert_eq!(out, [b"x", expected.as_bytes()].concat());
        }
    }

    // ----------------------------------------------------------------------------------
    // The serde_json shape `write_json_line` replaced, kept as its reference.

    /// The JSON shape of one event; fields that do not apply to the event's kind are omitted.
    #[derive(serde::Serialize)]
    struct JsonLine<'a> {
        run_id: &'a str,
        node: Option<&'a str>,
        adapter: &'a str,
        target: &'a str,
        seq: u64,
        origin: &'static str,
        kind: &'static str,
        #[serde(skip_serializing_if = "Option::is_none")]
        attempt: Option<u32>,
        #[serde(rename = "reason", skip_serializing_if = "Option::is_none")]
        reason_label: Option<&'static str>,
        #[serde(skip_serializing_if = "Option::is_none")]
        route: Option<String>,
        #[serde(skip_serializing_if = "Option::is_none")]
        text: Option<&'a str>,
        #[serde(skip_serializing_if = "Option::is_none")]
        data: Option<String>,
        #[serde(skip_serializing_if = "Option::is_none")]
        finish_reason: Option<&'a str>,
        #[serde(skip_serializing_if = "Option::is_none")]
        input_tokens: Option<u32>,
        #[serde(skip_serializing_if = "Option::is_none")]
        output_tokens: Option<u32>,
        #[serde(skip_serializing_if = "Option::is_none")]
        code: Option<&'a str>,
        #[serde(skip_serializing_if = "Option::is_none")]
        message: Option<&'a str>,
        #[serde(skip_serializing_if = "Option::is_none")]
        reason: Option<&'a str>,
    }

    impl<'a> JsonLine<'a> {
        pub(super) fn new(event: &'a RunEvent) -> Self {
            let mut line = Self {
                run_id: event.run_id.as_str(),
                node: event.node.as_ref().map(|node| node.as_str()),
                adapter: event.adapter.as_str(),
                target: event.target.as_str(),
                seq: event.seq,
                origin: match event.origin {
                    EventOrigin::Node => "node",
                    EventOrigin::Edge => "edge",
                },
                kind: event.kind.name(),
                attempt: None,
                reason_label: None,
                route: None,
                text: None,
                data: None,
                finish_reason: None,
                input_tokens: None,
                output_tokens: None,
                code: None,
                message: None,
                reason: None,
            };
            match &event.kind {
                RunEventKind::Started => {
                    if let Some(route) = &event.route {
                        line.attempt = Some(route.attempt);
                        line.reason_label = Some(route.label());
                        line.route = Some(route.to_string());
                    }
                }
                RunEventKind::Output { text, data, .. } => {
                    line.text = Some(text);
                    line.data = (!data.is_empty()).then(|| STANDARD.encode(data));
                }
                RunEventKind::Completed {
                    finish_reason,
                    usage,
                } => {
                    line.finish_reason = Some(finish_reason);
                    line.input_tokens = usage.map(|usage| usage.input_tokens);
                    line.output_tokens = usage.map(|usage| usage.output_tokens);
                }
                RunEventKind::Failed { code, message, .. } => {
                    line.code = Some(code);
                    line.message = Some(message);
                }
                RunEventKind::Cancelled { reason, .. } => line.reason = Some(reason),
            }
            line
        }
    }

    fn reference_json_line(event: &RunEvent) -> Vec<u8> {
        let mut out = serde_json::to_vec(&JsonLine::new(event)).unwrap();
        out.push(b'\n');
        out
    }

    fn hand_written(event: &RunEvent) -> Vec<u8> {
        let mut out = Vec::new();
        write_json_line(event, &mut out);
        out
    }

    #[test]
    fn json_line_matches_serde_json_byte_for_byte() {
        let mut events = vec![
            event(RunEventKind::Started),
            started_again(),
            (*output("a\n\"b\"\\ \u{1} \u{7f} \u{8}\u{c}\t\r é ✓ \u{1f600}")).clone(),
            (*completed()).clone(),
            event(RunEventKind::Completed {
                finish_reason: "length".into(),
                usage: None,
            }),
            event(RunEventKind::failed("deadline_exceeded", "too \"slow\"")),
            event(RunEventKind::cancelled("caller")),
            event(RunEventKind::Output {
                text: String::new(),
                data: Bytes::from_static(b"foobar\xff"),
                structured: None,
            }),
        ];
        let mut edge_made = event(RunEventKind::Started);
        edge_made.origin = EventOrigin::Edge;
        edge_made.node = None;
        edge_made.seq = u64::MAX;
        events.push(edge_made);
        for event in &events {
            assert_eq!(
                String::from_utf8(hand_written(event)).unwrap(),
                String::from_utf8(reference_json_line(event)).unwrap()
            );
        }
    }

    proptest::proptest! {
        /// Any text and any counts come out exactly as serde_json writes them.
        #[test]
        fn any_output_matches_serde_json(text in ".*", seq in proptest::prelude::any::<u64>(), data in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..8)) {
            let mut e = event(RunEventKind::Output { text, data: Bytes::from(data), structured: None });
            e.seq = seq;
            proptest::prop_assert_eq!(hand_written(&e), reference_json_line(&e));
        }
    }
}
