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

use crate::adapters::event_format::write_json_line;
use crate::domain::{AdapterName, EventOrigin, NodeId, RunEvent, RunEventKind, RunId, Target};

const TEXT: u8 = 1;
const TEXT_AT: u8 = 2;
const NODE: u8 = 3;
const NO_NODE: u8 = 4;
const LINE: u8 = 5;

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
        match plain_text(event) {
            Some(text) => self.push_text(event, text),
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
        if self.next_seq == Some(event.seq) {
            self.bytes.push(TEXT);
        } else {
            self.bytes.push(TEXT_AT);
            push_varint(event.seq, &mut self.bytes);
        }
        push_bytes(text.as_bytes(), &mut self.bytes);
    }

    /// The bytes so far.
    pub(super) fn bytes(&self) -> &[u8] {
        &self.bytes
    }
}

/// The text of a node's output event that carries nothing but text.
fn plain_text(event: &RunEvent) -> Option<&str> {
    match &event.kind {
        RunEventKind::Output {
            text,
            data,
            structured: None,
        } if data.is_empty() && event.origin == EventOrigin::Node && event.route.is_none() => {
            Some(text)
        }
        _ => None,
    }
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
    let mut reader = Reader { bytes, at: 0 };
    let mut lines = Vec::new();
    let mut node: Option<NodeId> = None;
    let mut next_seq = 0u64;
    while let Some(tag) = reader.byte() {
        match tag {
            TEXT | TEXT_AT => {
                let seq = if tag == TEXT_AT {
                    reader.varint()?
                } else {
                    next_seq
                };
                let text = reader.text()?;
                let event = RunEvent {
                    run_id: run.run_id.clone(),
                    node: node.clone(),
                    adapter: run.adapter.clone(),
                    target: run.target.clone(),
                    seq,
                    origin: EventOrigin::Node,
                    kind: RunEventKind::text(text),
                    route: None,
                };
                let mut line = Vec::with_capacity(96 + event_text_len(&event));
                write_json_line(&event, &mut line);
                while line.last() == Some(&b'\n') {
                    line.pop();
                }
                lines.push(String::from_utf8(line).map_err(|_| reader.damaged())?);
                next_seq = seq.wrapping_add(1);
            }
            NODE => {
                let id = reader.text()?;
                node = Some(NodeId::parse(id).map_err(|_| reader.damaged())?);
            }
            NO_NODE => node = None,
            LINE => {
                let seq = reader.varint()?;
                lines.push(reader.text()?.to_owned());
                next_seq = seq.wrapping_add(1);
            }
            _ => return Err(reader.damaged()),
        }
    }
    Ok(lines)
}

fn event_text_len(event: &RunEvent) -> usize {
    match &event.kind {
        RunEventKind::Output { text, .. } => text.len(),
        _ => 0,
    }
}

fn push_varint(mut value: u64, out: &mut Vec<u8>) {
    while value >= 0x80 {
        out.push((value as u8 & 0x7f) | 0x80);
        value >>= 7;
    }
    out.push(value as u8);
}

fn push_bytes(bytes: &[u8], out: &mut Vec<u8>) {
    push_varint(bytes.len() as u64, out);
    out.extend_from_slice(bytes);
}

struct Reader<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    fn damaged(&self) -> Damaged {
        Damaged { offset: self.at }
    }

    fn byte(&mut self) -> Option<u8> {
        let byte = *self.bytes.get(self.at)?;
        self.at += 1;
        Some(byte)
    }

    fn varint(&mut self) -> Result<u64, Damaged> {
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

    fn text(&mut self) -> Result<&'a str, Damaged> {
        let len = usize::try_from(self.varint()?).map_err(|_| self.damaged())?;
        let end = self
            .at
            .checked_add(len)
            .filter(|end| *end <= self.bytes.len())
            .ok_or_else(|| self.damaged())?;
        let text = std::str::from_utf8(&self.bytes[self.at..end]).map_err(|_| self.damaged())?;
        self.at = end;
        Ok(text)
    }
}

#[cfg(test)]
mod tests {
    use bytes::Bytes;
    use proptest::prelude::*;

    use super::*;
    use crate::domain::routing::{RouteReason, RouteRule};
    use crate::domain::{FailureClass, StructuredOutput, Usage};

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
            1 => Just(RunEventKind::Failed {
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
                if routed && matches!(event.kind, RunEventKind::Started) {
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
