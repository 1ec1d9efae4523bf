//! How a run event looks as one line of text or one JSON line: the single place both the
//! stdout and the file sink format events.
//!
//! Formatting appends to a caller-owned `Vec<u8>` so the hot path reuses one buffer and does
//! not allocate per event: numbers through `itoa`, bytes through `base64`, JSON strings
//! through `serde_json`'s own escaping. Nothing here does I/O; every line ends with `\n` and
//! holds no other newline.

use std::io::Write as _;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;

use crate::domain::{EventOrigin, RunEvent, RunEventKind};

use super::config::LineFormat;

/// Appends `event` as one line in `format` (ending with `\n`) to `out`.
pub fn write_line(format: LineFormat, event: &RunEvent, out: &mut Vec<u8>) {
    match format {
        LineFormat::Text => write_text_line(event, out),
        LineFormat::Json => write_json_line(event, out),
    }
}

/// Appends `event` as `<run_id> <node or -> <adapter>/<target> <kind> <payload>\n`.
///
/// The payload is the output text (with `\`, newlines and other control characters
/// escaped, so one event is one line) or `<N bytes>` for binary output;
/// `finish_reason=.. input_tokens=.. output_tokens=..` for completed runs;
/// `code=.. message=..` for failed ones; `reason=..` for cancelled ones; nothing for
/// `started` (the line then ends after the kind).
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
    match &event.kind {
        RunEventKind::Started => {}
        RunEventKind::Output { text, data, .. } => {
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
        }
        RunEventKind::Completed {
            finish_reason,
            usage,
        } => {
            out.extend_from_slice(b" finish_reason=");
            push_escaped(finish_reason, out);
            if let Some(usage) = usage {
                out.extend_from_slice(b" input_tokens=");
                push_u64(u64::from(usage.input_tokens), out);
                out.extend_from_slice(b" output_tokens=");
                push_u64(u64::from(usage.output_tokens), out);
            }
        }
        RunEventKind::Failed { code, message, .. } => {
            out.extend_from_slice(b" code=");
            push_escaped(code, out);
            out.extend_from_slice(b" message=");
            push_escaped(message, out);
        }
        RunEventKind::Cancelled { reason } => {
            out.extend_from_slice(b" reason=");
            push_escaped(reason, out);
        }
    }
    out.push(b'\n');
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
/// "kind":..,<payload fields>}`. Payload fields: `text` and `data` (standard base64, omitted
/// when empty) for output; `finish_reason`, `input_tokens`, `output_tokens` (the token
/// counts omitted when the node reported none) for completed; `code`, `message` for failed;
/// `reason` for cancelled.
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
    match &event.kind {
        RunEventKind::Started => {}
        RunEventKind::Output { text, data, .. } => {
            out.extend_from_slice(b",\"text\":");
            push_json_str(text, out);
            if !data.is_empty() {
                out.extend_from_slice(b",\"data\":\"");
                push_base64(data, out);
                out.push(b'"');
            }
        }
        RunEventKind::Completed {
            finish_reason,
            usage,
        } => {
            out.extend_from_slice(b",\"finish_reason\":");
            push_json_str(finish_reason, out);
            if let Some(usage) = usage {
                out.extend_from_slice(b",\"input_tokens\":");
                push_u64(u64::from(usage.input_tokens), out);
                out.extend_from_slice(b",\"output_tokens\":");
                push_u64(u64::from(usage.output_tokens), out);
            }
        }
        RunEventKind::Failed { code, message, .. } => {
            out.extend_from_slice(b",\"code\":");
            push_json_str(code, out);
            out.extend_from_slice(b",\"message\":");
            push_json_str(message, out);
        }
        RunEventKind::Cancelled { reason } => {
            out.extend_from_slice(b",\"reason\":");
            push_json_str(reason, out);
        }
    }
    out.extend_from_slice(b"}\n");
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
    use crate::domain::{AdapterName, NodeId, RunId, Target, Usage};

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
        }
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
            text(&event(RunEventKind::Cancelled {
                reason: "caller".into()
            })),
            "r1 node-a echo/m1 cancelled reason=caller\n"
        );
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
        let cancelled = json(&event(RunEventKind::Cancelled {
            reason: "caller".into(),
        }));
        assert_eq!(cancelled["kind"], "cancelled");
        assert_eq!(cancelled["reason"], "caller");
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
                RunEventKind::Started => {}
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
                RunEventKind::Cancelled { reason } => line.reason = Some(reason),
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
            (*output("a\n\"b\"\\ \u{1} \u{7f} \u{8}\u{c}\t\r é ✓ \u{1f600}")).clone(),
            (*completed()).clone(),
            event(RunEventKind::Completed {
                finish_reason: "length".into(),
                usage: None,
            }),
            event(RunEventKind::failed("deadline_exceeded", "too \"slow\"")),
            event(RunEventKind::Cancelled {
                reason: "caller".into(),
            }),
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
