//! The journal's compact form of a run's events: what one `events` row's `packed` column
//! holds. A run's plain text deltas — nearly every event of a streamed answer — are kept as
//! their text alone (and the node's sequence number only when it does not follow on), since
//! the run id, adapter, target and node are the run's and the same for each; any other
//! event is kept whole, as the `file` sink's JSON line. Reading turns every event back into
//! exactly the JSON line the file sink writes for it, so the management API cannot tell
//! the two forms apart.
//!
//! Packing costs a copy of the text per delta instead of formatting and escaping a JSON
//! object of ~200 bytes, and stores ~10 bytes per delta instead of that object: the
//! journal's CPU and disk then grow with what the runs say, not with how many pieces they
//! said it in.
//!
//! Layout: a sequence of records, each a tag byte and its fields; numbers are LEB128
//! varints, byte strings a varint length and the bytes.
//!
//! | tag | fields | meaning |
//! |---|---|---|
//! | `1` | text | a node's text delta, from the current node, `seq` one past the last |
//! | `2` | seq, text | the same with its own `seq` |
//! | `3` | node id | the node of the text deltas that follow |
//! | `4` | — | the text deltas that follow have no node |
//! | `5` | seq, JSON line | any other event, whole |
//! | `6` | seq | a node's `started` (no route), from the current node |
//! | `7` | seq, origin, finish reason, usage | `completed`, from the current node: origin `0` node, `1` edge; usage a byte `0` (none) or `1` and input, output, cached input, reasoning tokens |
//!
//! A run's `started` and `completed` — the two events besides its deltas nearly every run
//! has — are kept by their fields too: as JSON lines they were about 400 of a short run's
//! bytes, and their formatting a share of the relay's cost per run.

use crate::adapters::event_format::write_json_line;
use crate::domain::{
    AdapterName, EventOrigin, NodeId, RunEvent, RunEventKind, RunId, Target, Usage,
};

const TEXT: u8 = 1;
const TEXT_AT: u8 = 2;
const NODE: u8 = 3;
const NO_NODE: u8 = 4;
const LINE: u8 = 5;
const STARTED: u8 = 6;
const COMPLETED: u8 = 7;

/// Builds one row's packed events.
#[derive(Debug, Default)]
pub(super) struct Packer {
    bytes: Vec<u8>,
    /// The node the text deltas so far came from (`Some(None)`: none), `None` before any.
    node: Option<Option<NodeId>>,
    /// The `seq` a following text delta is expected to have.
    next_seq: Option<u64>,
}

impl Packer {
    /// Appends `event`.
    pub(super) fn push(&mut self, event: &RunEvent) {
        match compact(event) {
            Some(Compact::Text(text)) => self.push_text(event, text),
            Some(Compact::Started) => {
                self.push_node(event);
                self.bytes.push(STARTED);
                push_varint(event.seq, &mut self.bytes);
            }
            Some(Compact::Completed {
                finish_reason,
                usage,
            }) => {
                self.push_node(event);
                self.bytes.push(COMPLETED);
                push_varint(event.seq, &mut self.bytes);
                self.bytes.push(u8::from(event.origin == EventOrigin::Edge));
                push_bytes(finish_reason.as_bytes(), &mut self.bytes);
                push_usage(usage, &mut self.bytes);
            }
            None => {
                let mut line = Vec::with_capacity(160);
                write_json_line(event, &mut line);
                while line.last() == Some(&b'\n') {
                    line.pop();
                }
                self.bytes.push(LINE);
                push_varint(event.seq, &mut self.bytes);
                push_bytes(&line, &mut self.bytes);
            }
        }
        self.next_seq = Some(event.seq.wrapping_add(1));
    }

    fn push_text(&mut self, event: &RunEvent, text: &str) {
        self.push_node(event);
        if self.next_seq == Some(event.seq) {
            self.bytes.push(TEXT);
        } else {
            self.bytes.push(TEXT_AT);
            push_varint(event.seq, &mut self.bytes);
        }
        push_bytes(text.as_bytes(), &mut self.bytes);
    }

    /// Says `event`'s node unless the records before already did.
    fn push_node(&mut self, event: &RunEvent) {
        if self.node.as_ref() != Some(&event.node) {
            match &event.node {
                Some(node) => {
                    self.bytes.push(NODE);
                    push_bytes(node.as_str().as_bytes(), &mut self.bytes);
                }
                None => self.bytes.push(NO_NODE),
            }
            self.node = Some(event.node.clone());
        }
    }

    /// A packer holding `bytes` packed elsewhere (a replicated batch's), not to be pushed
    /// to: what it knows of the events before is gone.
    pub(super) fn packed(bytes: Vec<u8>) -> Self {
        Self {
            bytes,
            node: None,
            next_seq: None,
        }
    }

    /// The bytes so far.
    pub(super) fn bytes(&self) -> &[u8] {
        &self.bytes
    }
}

/// An event kept by its fields rather than as its JSON line.
enum Compact<'a> {
    /// A node's output that carries nothing but text.
    Text(&'a str),
    /// A node's `started` without a route.
    Started,
    /// `completed`, from the node or the edge, without a route.
    Completed {
        finish_reason: &'a str,
        usage: Option<&'a Usage>,
    },
}

/// How `event` is kept compact, if it can be.
fn compact(event: &RunEvent) -> Option<Compact<'_>> {
    if event.route.is_some() {
        return None;
    }
    let from_node = event.origin == EventOrigin::Node;
    match &event.kind {
        RunEventKind::Output {
            text,
            data,
            structured: None,
        } if data.is_empty() && from_node => Some(Compact::Text(text)),
        RunEventKind::Started if from_node => Some(Compact::Started),
        RunEventKind::Completed {
            finish_reason,
            usage,
        } => Some(Compact::Completed {
            finish_reason,
            usage: usage.as_ref(),
        }),
        _ => None,
    }
}

pub(super) fn push_usage(usage: Option<&Usage>, out: &mut Vec<u8>) {
    let Some(usage) = usage else {
        out.push(0);
        return;
    };
    out.push(1);
    for tokens in [
        usage.input_tokens,
        usage.output_tokens,
        usage.cached_input_tokens,
        usage.reasoning_tokens,
    ] {
        push_varint(tokens.into(), out);
    }
}

/// Events stored as whole JSON lines (a journal of schema 1), packed: each line kept as it
/// is, so reading gives it back unchanged.
pub(super) fn pack_lines<'a>(lines: impl Iterator<Item = &'a str>) -> Vec<u8> {
    let mut bytes = Vec::new();
    for line in lines {
        bytes.push(LINE);
        push_varint(0, &mut bytes);
        push_bytes(line.as_bytes(), &mut bytes);
    }
    bytes
}

/// What every event of a run shares, to rebuild its JSON line.
pub(super) struct RunIdentity {
    pub(super) run_id: RunId,
    pub(super) adapter: AdapterName,
    pub(super) target: Target,
}

/// A packed row that does not decode: the file was damaged or written by something else.
#[derive(Debug, thiserror::Error)]
#[error("a stored event chunk is damaged at byte {offset}")]
pub(super) struct Damaged {
    offset: usize,
}

/// The JSON lines of the events in `bytes`, in order.
///
/// # Errors
/// [`Damaged`] when `bytes` is not a packed chunk.
pub(super) fn unpack(bytes: &[u8], run: &RunIdentity) -> Result<Vec<String>, Damaged> {
    let mut reader = Reader::new(bytes);
    let mut lines = Vec::new();
    let mut node: Option<NodeId> = None;
    let mut next_seq = 0u64;
    while let Some(tag) = reader.byte() {
        let rebuilt = match tag {
            TEXT | TEXT_AT => {
                let seq = if tag == TEXT_AT {
                    reader.varint()?
                } else {
                    next_seq
                };
                let text = reader.text()?;
                Some((seq, EventOrigin::Node, RunEventKind::text(text)))
            }
            STARTED => Some((reader.varint()?, EventOrigin::Node, RunEventKind::Started)),
            COMPLETED => Some(reader.completed()?),
            NODE => {
                let id = reader.text()?;
                node = Some(NodeId::parse(id).map_err(|_| reader.damaged())?);
                None
            }
            NO_NODE => {
                node = None;
                None
            }
            LINE => {
                let seq = reader.varint()?;
                lines.push(reader.text()?.to_owned());
                next_seq = seq.wrapping_add(1);
                None
            }
            _ => return Err(reader.damaged()),
        };
        if let Some((seq, origin, kind)) = rebuilt {
            let event = RunEvent {
                run_id: run.run_id.clone(),
                node: node.clone(),
                adapter: run.adapter.clone(),
                target: run.target.clone(),
                seq,
                origin,
                kind,
                route: None,
            };
            lines.push(json_line(&event).ok_or_else(|| reader.damaged())?);
            next_seq = seq.wrapping_add(1);
        }
    }
    Ok(lines)
}

/// The file sink's line for `event`, without its newline.
fn json_line(event: &RunEvent) -> Option<String> {
    let mut line = Vec::with_capacity(96 + event_text_len(event));
    write_json_line(event, &mut line);
    while line.last() == Some(&b'\n') {
        line.pop();
    }
    String::from_utf8(line).ok()
}

fn event_text_len(event: &RunEvent) -> usize {
    match &event.kind {
        RunEventKind::Output { text, .. } => text.len(),
        _ => 0,
    }
}

pub(super) fn push_varint(mut value: u64, out: &mut Vec<u8>) {
    while value >= 0x80 {
        out.push((value as u8 & 0x7f) | 0x80);
        value >>= 7;
    }
    out.push(value as u8);
}

pub(super) fn push_bytes(bytes: &[u8], out: &mut Vec<u8>) {
    push_varint(bytes.len() as u64, out);
    out.extend_from_slice(bytes);
}

/// Reads what the `push_` functions wrote.
pub(super) struct Reader<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    pub(super) fn new(bytes: &'a [u8]) -> Self {
        Self { bytes, at: 0 }
    }

    pub(super) fn damaged(&self) -> Damaged {
        Damaged { offset: self.at }
    }

    /// Whether every byte has been read.
    pub(super) fn at_end(&self) -> bool {
        self.at >= self.bytes.len()
    }

    pub(super) fn byte(&mut self) -> Option<u8> {
        let byte = *self.bytes.get(self.at)?;
        self.at += 1;
        Some(byte)
    }

    pub(super) fn varint(&mut self) -> Result<u64, Damaged> {
        let mut value = 0u64;
        for shift in (0..64).step_by(7) {
            let byte = self.byte().ok_or_else(|| self.damaged())?;
            value |= u64::from(byte & 0x7f) << shift;
            if byte & 0x80 == 0 {
                return Ok(value);
            }
        }
        Err(self.damaged())
    }

    /// A `COMPLETED` record's fields, after its tag.
    fn completed(&mut self) -> Result<(u64, EventOrigin, RunEventKind), Damaged> {
        let seq = self.varint()?;
        let origin = match self.byte() {
            Some(0) => EventOrigin::Node,
            Some(1) => EventOrigin::Edge,
            _ => return Err(self.damaged()),
        };
        let finish_reason = self.text()?.to_owned();
        let usage = self.usage()?;
        let kind = RunEventKind::Completed {
            finish_reason,
            usage,
        };
        Ok((seq, origin, kind))
    }

    pub(super) fn usage(&mut self) -> Result<Option<Usage>, Damaged> {
        match self.byte() {
            Some(0) => Ok(None),
            Some(1) => {
                let mut tokens = || {
                    let value = self.varint()?;
                    u32::try_from(value).map_err(|_| self.damaged())
                };
                Ok(Some(Usage {
                    input_tokens: tokens()?,
                    output_tokens: tokens()?,
                    cached_input_tokens: tokens()?,
                    reasoning_tokens: tokens()?,
                }))
            }
            _ => Err(self.damaged()),
        }
    }

    pub(super) fn text(&mut self) -> Result<&'a str, Damaged> {
        let at = self.at;
        let bytes = self.bytes()?;
        std::str::from_utf8(bytes).map_err(|_| Damaged { offset: at })
    }

    /// A length and that many bytes.
    pub(super) fn bytes(&mut self) -> Result<&'a [u8], Damaged> {
        let len = usize::try_from(self.varint()?).map_err(|_| self.damaged())?;
        let end = self
            .at
            .checked_add(len)
            .filter(|end| *end <= self.bytes.len())
            .ok_or_else(|| self.damaged())?;
        let bytes = &self.bytes[self.at..end];
        self.at = end;
        Ok(bytes)
    }
}

#[cfg(test)]
mod tests {
    use bytes::Bytes;
    use proptest::prelude::*;

    use super::*;
    use crate::domain::routing::{RouteReason, RouteRule};
    use crate::domain::{FailureClass, StructuredOutput};

    fn identity() -> RunIdentity {
        RunIdentity {
            run_id: RunId::new("run-1"),
            adapter: AdapterName::parse("echo").unwrap(),
            target: Target::parse("default").unwrap(),
        }
    }

    fn event(seq: u64, node: Option<&str>, origin: EventOrigin, kind: RunEventKind) -> RunEvent {
        let run = identity();
        RunEvent {
            run_id: run.run_id,
            node: node.map(|n| NodeId::parse(n).unwrap()),
            adapter: run.adapter,
            target: run.target,
            seq,
            origin,
            kind,
            route: None,
        }
    }

    fn json_line(event: &RunEvent) -> String {
        let mut line = Vec::new();
        write_json_line(event, &mut line);
        String::from_utf8(line).unwrap().trim_end().to_owned()
    }

    fn any_kind() -> impl Strategy<Value = RunEventKind> {
        prop_oneof![
            6 => "\\PC{0,12}".prop_map(RunEventKind::text),
            1 => Just(RunEventKind::Started),
            1 => "[a-z\n\"\\\\]{0,8}".prop_map(|text| RunEventKind::Output {
                text,
                data: Bytes::from_static(b"\x00\x01"),
                structured: None,
            }),
            1 => "[a-z]{0,8}".prop_map(|reasoning| RunEventKind::Output {
                text: String::new(),
                data: Bytes::new(),
                structured: Some(Box::new(StructuredOutput {
                    reasoning,
                    ..StructuredOutput::default()
                })),
            }),
            1 => Just(RunEventKind::Completed {
                finish_reason: "stop".into(),
                usage: Some(Usage::new(3, 4)),
            }),
            1 => ("[a-z\"]{0,6}", any::<Option<(u32, u32, u32, u32)>>()).prop_map(
                |(finish_reason, usage)| RunEventKind::Completed {
                    finish_reason,
                    usage: usage.map(|(i, o, c, r)| Usage {
                        input_tokens: i,
                        output_tokens: o,
                        cached_input_tokens: c,
                        reasoning_tokens: r,
                    }),
                },
            ),
            1 => Just(RunEventKind::Failed {
                context_window: None,
                code: "node_failed".into(),
                message: "it \"broke\"".into(),
                class: FailureClass::Node,
                status: Some(502),
                usage: None,
            }),
        ]
    }

    fn any_event() -> impl Strategy<Value = RunEvent> {
        (
            0u64..40,
            prop_oneof![Just(None), Just(Some("node-a")), Just(Some("node-b"))],
            prop_oneof![4 => Just(EventOrigin::Node), 1 => Just(EventOrigin::Edge)],
            any_kind(),
            any::<bool>(),
        )
            .prop_map(|(seq, node, origin, kind, routed)| {
                let mut event = event(seq, node, origin, kind);
                let routable = matches!(
                    event.kind,
                    RunEventKind::Started | RunEventKind::Completed { .. }
                );
                if routed && routable {
                    event.route = Some(Box::new(RouteReason {
                        rule: RouteRule::LeastBusy,
                        attempt: 2,
                        eligible: 3,
                        queue_wait: None,
                    }));
                }
                event
            })
    }

    proptest! {
        /// Whatever events a run relays, reading them back gives the file sink's lines.
        #[test]
        fn unpacking_gives_back_each_events_json_line(
            events in proptest::collection::vec(any_event(), 0..24),
        ) {
            let mut packer = Packer::default();
            for event in &events {
                packer.push(event);
            }
            let lines = unpack(packer.bytes(), &identity()).unwrap();
            let expected: Vec<String> = events.iter().map(json_line).collect();
            prop_assert_eq!(lines, expected);
        }

        /// Damaged bytes are an error, never a panic.
        #[test]
        fn damaged_chunks_are_errors(bytes in proptest::collection::vec(any::<u8>(), 0..64)) {
            let _ = unpack(&bytes, &identity());
        }
    }

    #[test]
    fn a_runs_started_and_completed_cost_a_few_bytes_each() {
        let mut packer = Packer::default();
        let node = Some("node-a");
        packer.push(&event(1, node, EventOrigin::Node, RunEventKind::Started));
        let completed = RunEventKind::Completed {
            finish_reason: "stop".into(),
            usage: Some(Usage::new(12, 80)),
        };
        packer.push(&event(2, node, EventOrigin::Node, completed));
        // The node's id once (8); `started` 2; `completed` 3, its reason 5, its usage 5 —
        // instead of two JSON lines of ~200 bytes.
        assert!(packer.bytes().len() <= 23, "{} bytes", packer.bytes().len());
    }

    #[test]
    fn a_streamed_answer_costs_its_text_and_a_few_bytes_per_delta() {
        let mut packer = Packer::default();
        packer.push(&event(
            1,
            Some("node-a"),
            EventOrigin::Node,
            RunEventKind::Started,
        ));
        let before = packer.bytes().len();
        for seq in 2..102 {
            packer.push(&event(
                seq,
                Some("node-a"),
                EventOrigin::Node,
                RunEventKind::text("tok "),
            ));
        }
        let per_delta = (packer.bytes().len() - before) as f64 / 100.0;
        // Tag and length (2 bytes) and the text (4), once the node is said.
        assert!(per_delta < 6.2, "{per_delta} bytes per delta");
    }
}
