//! The replicated form of one written batch (decision 49): the entries the writer wrote
//! together, in the order it wrote them, as the journal's own packed bytes (`packed.rs`'s
//! varints and strings, `frames.rs`'s accepted runs and attempts, event chunks as they were
//! packed on the relay's thread). One place encodes and decodes it; a member that folds the
//! stream pushes the decoded entries through the same writing path as the relay's.
//!
//! Layout: a version byte ([`VERSION`]), then entries, each a tag and its fields — `1` an
//! accepted run; `2` run id and an attempt; `3` run id, first output ms?, the chunks (a
//! count, then each one's first position, count and packed bytes) and the finish? (outcome,
//! finished ms, code?, message?, finish reason?, usage, events, node?, adapter, target).
//! Decoding is all or nothing: a damaged batch yields no entry.

use super::batch::{Chunk, Finish, PackedEvents, Queued};
use super::frames::{
    push_accepted, push_attempt, push_opt_str, push_opt_u64, push_str, read_accepted, read_attempt,
    read_opt_string, read_opt_u64,
};
use super::packed::{Damaged, Packer, Reader, push_bytes, push_usage, push_varint};
use crate::domain::{AdapterName, NodeId, RunEnding, RunId, RunOutcome, Target};

/// The version of the layout this edge writes: 2 adds an accepted run's budget reserve
/// (`frames.rs`), which an edge reading version 1 only would take for damage.
pub const VERSION: u8 = 2;

/// The oldest version this edge reads (its accepted runs reserve nothing).
const OLDEST: u8 = 1;

const ACCEPTED: u8 = 1;
const PLACED: u8 = 2;
const EVENTS: u8 = 3;

/// Why a replicated batch was not applied.
#[derive(Debug, thiserror::Error)]
pub enum ReplicaError {
    /// Written by an edge whose layout this one does not know.
    #[error(
        "a replicated journal batch of version {0} (this edge reads versions {OLDEST} to {VERSION})"
    )]
    Version(u8),
    /// The bytes do not decode.
    #[error("a replicated journal batch is damaged: {0}")]
    Damaged(String),
}

/// `entries` in the replicated form.
pub(super) fn encode(entries: &[Queued]) -> Vec<u8> {
    let mut out =
        Vec::with_capacity(64 + entries.iter().map(Queued::estimated_bytes).sum::<usize>());
    out.push(VERSION);
    for entry in entries {
        match entry {
            Queued::Accepted(run) => {
                out.push(ACCEPTED);
                push_accepted(run, &mut out);
            }
            Queued::Placed { run_id, attempt } => {
                out.push(PLACED);
                push_str(run_id.as_str(), &mut out);
                push_attempt(attempt, &mut out);
            }
            Queued::Events(events) => {
                out.push(EVENTS);
                push_events(events, &mut out);
            }
        }
    }
    out
}

/// A batch of no entries: what a member appends to claim the stream (decision 50).
pub fn empty_batch() -> Vec<u8> {
    encode(&[])
}

fn push_events(events: &PackedEvents, out: &mut Vec<u8>) {
    push_str(events.run_id.as_str(), out);
    push_opt_u64(events.first_output_ms, out);
    push_varint(events.chunks.len() as u64, out);
    for chunk in &events.chunks {
        push_varint(chunk.first_idx, out);
        push_varint(chunk.count, out);
        push_bytes(chunk.packed.bytes(), out);
    }
    let Some(finish) = &events.finish else {
        out.push(0);
        return;
    };
    out.push(1);
    let ending = &finish.ending;
    push_str(ending.outcome.as_str(), out);
    push_varint(ending.finished_ms, out);
    push_opt_str(ending.code.as_deref(), out);
    push_opt_str(ending.message.as_deref(), out);
    push_opt_str(ending.finish_reason.as_deref(), out);
    push_usage(ending.usage.as_ref(), out);
    push_varint(finish.events, out);
    push_opt_str(finish.node.as_ref().map(NodeId::as_str), out);
    push_str(finish.adapter.as_str(), out);
    push_str(finish.target.as_str(), out);
}

/// The entries of a replicated batch, in order.
///
/// # Errors
/// [`ReplicaError`] when the version is unknown or the bytes do not decode.
pub(super) fn decode(bytes: &[u8]) -> Result<Vec<Queued>, ReplicaError> {
    let damaged = |error: Damaged| ReplicaError::Damaged(error.to_string());
    let Some((&version, rest)) = bytes.split_first() else {
        return Err(ReplicaError::Damaged("an empty message".to_owned()));
    };
    if !(OLDEST..=VERSION).contains(&version) {
        return Err(ReplicaError::Version(version));
    }
    let mut reader = Reader::new(rest);
    let mut entries = Vec::new();
    while let Some(tag) = reader.byte() {
        entries.push(read_entry(tag, &mut reader).map_err(damaged)?);
    }
    Ok(entries)
}

fn read_entry(tag: u8, reader: &mut Reader<'_>) -> Result<Queued, Damaged> {
    Ok(match tag {
        ACCEPTED => Queued::Accepted(Box::new(read_accepted(reader)?)),
        PLACED => Queued::Placed {
            run_id: RunId::new(reader.text()?),
            attempt: read_attempt(reader)?,
        },
        EVENTS => Queued::Events(read_events(reader)?),
        _ => return Err(reader.damaged()),
    })
}

fn read_events(reader: &mut Reader<'_>) -> Result<PackedEvents, Damaged> {
    let run_id = RunId::new(reader.text()?);
    let first_output_ms = read_opt_u64(reader)?;
    let count = reader.varint()?;
    let mut chunks = Vec::new();
    for _ in 0..count {
        chunks.push(Chunk {
            first_idx: reader.varint()?,
            count: reader.varint()?,
            packed: Packer::packed(reader.bytes()?.to_vec()),
        });
    }
    let finish = match reader.byte() {
        Some(0) => None,
        Some(1) => Some(read_finish(reader)?),
        _ => return Err(reader.damaged()),
    };
    Ok(PackedEvents {
        run_id,
        chunks,
        first_output_ms,
        finish,
    })
}

fn read_finish(reader: &mut Reader<'_>) -> Result<Finish, Damaged> {
    let outcome = RunOutcome::parse(reader.text()?).ok_or_else(|| reader.damaged())?;
    let ending = RunEnding {
        outcome,
        finished_ms: reader.varint()?,
        code: read_opt_string(reader)?,
        message: read_opt_string(reader)?,
        finish_reason: read_opt_string(reader)?,
        usage: reader.usage()?,
    };
    let events = reader.varint()?;
    let node = match read_opt_string(reader)? {
        Some(node) => Some(NodeId::parse(&node).map_err(|_| reader.damaged())?),
        None => None,
    };
    let adapter = AdapterName::parse(reader.text()?).map_err(|_| reader.damaged())?;
    let target = Target::parse(reader.text()?).map_err(|_| reader.damaged())?;
    Ok(Finish {
        ending,
        events,
        node,
        adapter,
        target,
    })
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::domain::{AcceptedRun, Attempt, EventOrigin, Operation, RunEvent, RunEventKind};
    use crate::ports::{JournalEntry, RelayedEvent};

    fn event(index: u64, kind: RunEventKind) -> RelayedEvent {
        RelayedEvent {
            index,
            at_ms: 1_000 + index,
            first_output: index == 1,
            event: Arc::new(RunEvent {
                run_id: RunId::new("r1"),
                node: NodeId::parse("gpu-a").ok(),
                adapter: AdapterName::parse("echo").expect("adapter"),
                target: Target::parse("default").expect("target"),
                seq: index + 1,
                origin: EventOrigin::Node,
                kind,
                route: None,
            }),
        }
    }

    fn batch() -> Vec<Queued> {
        let accepted = AcceptedRun {
            run_id: RunId::new("r1"),
            adapter: AdapterName::parse("echo").expect("adapter"),
            target: Target::parse("default").expect("target"),
            operation: Operation::Chat,
            pin: None,
            api_key_name: Some("team-a".into()),
            queued_ms: 999,
            deadline_ms: Some(5_000),
            client_stream: None,
            affinity: None,
            budget_reserve: Some(256),
        };
        let placed = JournalEntry::Placed {
            run_id: RunId::new("r1"),
            attempt: Attempt {
                number: 1,
                node: NodeId::parse("gpu-a").expect("node"),
                route_reason: "least_loaded".into(),
                started_ms: 1_000,
            },
        };
        let events = JournalEntry::Events {
            run_id: RunId::new("r1"),
            events: vec![
                event(0, RunEventKind::Started),
                event(1, RunEventKind::text("hel")),
                event(2, RunEventKind::text("lo")),
                event(3, RunEventKind::cancelled("bye")),
            ],
        };
        [JournalEntry::Accepted(Box::new(accepted)), placed, events]
            .into_iter()
            .filter_map(|entry| Queued::of(entry, u64::MAX).0)
            .collect()
    }

    #[test]
    fn a_batch_round_trips() {
        let bytes = encode(&batch());
        let decoded = decode(&bytes).expect("decodes");
        assert_eq!(encode(&decoded), bytes);
        assert_eq!(decoded.len(), 3);
        let Queued::Events(events) = &decoded[2] else {
            panic!("events last");
        };
        assert_eq!(events.chunks.len(), 1);
        assert_eq!(events.chunks[0].count, 4);
        assert_eq!(events.first_output_ms, Some(1_001));
        let finish = events.finish.as_ref().expect("ends the run");
        assert_eq!(finish.events, 4);
        assert_eq!(finish.ending.outcome, RunOutcome::Cancelled);
    }

    #[test]
    fn damage_and_unknown_versions_are_refused_whole() {
        let bytes = encode(&batch());
        for cut in 1..bytes.len() {
            // Cut anywhere inside an entry: nothing decodes (a cut between entries is a
            // shorter, whole batch — the stream never cuts a message).
            if let Ok(entries) = decode(&bytes[..cut]) {
                assert!(entries.len() < 3, "cut at {cut}");
            }
        }
        let mut other = bytes.clone();
        other[0] = VERSION + 1;
        assert!(matches!(decode(&other), Err(ReplicaError::Version(_))));
        assert!(decode(&[]).is_err());
        assert!(decode(&[VERSION, 9]).is_err());
    }
}
