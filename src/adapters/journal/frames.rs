//! The bytes of one batch row (schema 7, `log.rs`): the records of the runs it ended, and
//! its frames — a snapshot of each run it left open, later placements, and event chunks.
//!
//! Layout, with `packed.rs`'s varints and length-prefixed strings; `?` marks an optional
//! field, a byte `0` (absent) or `1` and the value:
//!
//! - a record: run id, adapter, target, operation, pin?, API key name?, queued ms,
//!   deadline ms?, client stream?, affinity source? (its presence byte `2` or `3` instead of
//!   `0` or `1` says a budget reserve? follows: schema 8; a record of schema 7 has none),
//!   the attempts (a count, then each one's
//!   number, node, route reason and start ms), first output ms?, finished ms?, outcome,
//!   code?, message?, finish reason?, usage (as `packed.rs`), events, events stored, and the
//!   batch its events start in;
//! - `ended`: records, back to back;
//! - `frames`: a tag and its fields — `1` a record (a run the batch left open), `2` run id
//!   and an attempt (a placement of an open run), `3` run id, first position, count, first
//!   output ms? and the packed events (a chunk of a run's events).

use super::packed::{Damaged, Reader, push_bytes, push_usage, push_varint};
use crate::domain::routing::KeySource;
use crate::domain::{
    AcceptedRun, AdapterName, Attempt, NodeId, Operation, RunId, RunOutcome, RunRecord, Target,
};

/// Added to the affinity source's presence byte when the budget reserve follows it.
const WITH_RESERVE: u8 = 2;

const RECORD: u8 = 1;
const PLACED: u8 = 2;
const EVENTS: u8 = 3;

/// A run's record and the batch its stored events start in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Stored {
    pub(super) record: RunRecord,
    pub(super) events_from: i64,
}

/// One decoded frame.
#[derive(Debug)]
pub(super) enum Frame<'a> {
    /// A run the batch left open, as it stood.
    Open(Box<Stored>),
    /// A later placement of an open run.
    Placed { run_id: &'a str, attempt: Attempt },
    /// A chunk of a run's events.
    Events(EventChunk<'a>),
}

/// Consecutive events of one run, packed (`packed.rs`).
#[derive(Debug, Clone, Copy)]
pub(super) struct EventChunk<'a> {
    pub(super) run_id: &'a str,
    pub(super) first_idx: u64,
    pub(super) count: u64,
    pub(super) first_output_ms: Option<u64>,
    pub(super) packed: &'a [u8],
}

/// Appends an open run's snapshot frame.
pub(super) fn push_open(stored: &Stored, out: &mut Vec<u8>) {
    out.push(RECORD);
    push_record(stored, out);
}

/// Appends a placement frame.
pub(super) fn push_placed(run_id: &RunId, attempt: &Attempt, out: &mut Vec<u8>) {
    out.push(PLACED);
    push_str(run_id.as_str(), out);
    push_attempt(attempt, out);
}

/// Appends an event chunk frame.
pub(super) fn push_events(chunk: &EventChunk<'_>, out: &mut Vec<u8>) {
    out.push(EVENTS);
    push_str(chunk.run_id, out);
    push_varint(chunk.first_idx, out);
    push_varint(chunk.count, out);
    push_opt_u64(chunk.first_output_ms, out);
    push_bytes(chunk.packed, out);
}

/// Appends an ended run's record (to a batch's `ended`).
pub(super) fn push_record(stored: &Stored, out: &mut Vec<u8>) {
    let record = &stored.record;
    push_accepted(&record.accepted, out);
    push_varint(record.attempts.len() as u64, out);
    for attempt in &record.attempts {
        push_attempt(attempt, out);
    }
    push_opt_u64(record.first_output_ms, out);
    push_opt_u64(record.finished_ms, out);
    push_str(record.outcome.as_str(), out);
    push_opt_str(record.code.as_deref(), out);
    push_opt_str(record.message.as_deref(), out);
    push_opt_str(record.finish_reason.as_deref(), out);
    push_usage(record.usage.as_ref(), out);
    push_varint(record.events, out);
    push_varint(record.events_stored, out);
    push_varint(u64::try_from(stored.events_from).unwrap_or(0), out);
}

/// What was known of a run when it was accepted: the record's first fields.
pub(super) fn push_accepted(run: &AcceptedRun, out: &mut Vec<u8>) {
    push_str(run.run_id.as_str(), out);
    push_str(run.adapter.as_str(), out);
    push_str(run.target.as_str(), out);
    push_str(run.operation.as_str(), out);
    push_opt_str(run.pin.as_deref(), out);
    push_opt_str(run.api_key_name.as_deref(), out);
    push_varint(run.queued_ms, out);
    push_opt_u64(run.deadline_ms, out);
    push_opt_str(run.client_stream.as_deref(), out);
    match run.affinity {
        Some(source) => {
            out.push(WITH_RESERVE + 1);
            push_str(source.as_str(), out);
        }
        None => out.push(WITH_RESERVE),
    }
    push_opt_u64(run.budget_reserve, out);
}

/// The records of a batch's `ended`.
///
/// # Errors
/// [`Damaged`] when the bytes are not records.
pub(super) fn read_records(bytes: &[u8]) -> Result<Vec<Stored>, Damaged> {
    let mut reader = Reader::new(bytes);
    let mut records = Vec::new();
    while !reader.at_end() {
        records.push(read_record(&mut reader)?);
    }
    Ok(records)
}

/// The frames of a batch's `frames`.
///
/// # Errors
/// [`Damaged`] when the bytes are not frames.
pub(super) fn read_frames(bytes: &[u8]) -> Result<Vec<Frame<'_>>, Damaged> {
    let mut reader = Reader::new(bytes);
    let mut frames = Vec::new();
    while let Some(tag) = reader.byte() {
        frames.push(match tag {
            RECORD => Frame::Open(Box::new(read_record(&mut reader)?)),
            PLACED => Frame::Placed {
                run_id: reader.text()?,
                attempt: read_attempt(&mut reader)?,
            },
            EVENTS => Frame::Events(EventChunk {
                run_id: reader.text()?,
                first_idx: reader.varint()?,
                count: reader.varint()?,
                first_output_ms: read_opt_u64(&mut reader)?,
                packed: reader.bytes()?,
            }),
            _ => return Err(reader.damaged()),
        });
    }
    Ok(frames)
}

fn read_record(reader: &mut Reader<'_>) -> Result<Stored, Damaged> {
    let accepted = read_accepted(reader)?;
    let attempts = (0..reader.varint()?)
        .map(|_| read_attempt(reader))
        .collect::<Result<Vec<_>, _>>()?;
    let first_output_ms = read_opt_u64(reader)?;
    let finished_ms = read_opt_u64(reader)?;
    let outcome = RunOutcome::parse(reader.text()?).ok_or_else(|| reader.damaged())?;
    let record = RunRecord {
        accepted,
        attempts,
        first_output_ms,
        finished_ms,
        outcome,
        code: read_opt_string(reader)?,
        message: read_opt_string(reader)?,
        finish_reason: read_opt_string(reader)?,
        usage: reader.usage()?,
        events: reader.varint()?,
        events_stored: reader.varint()?,
    };
    let events_from = i64::try_from(reader.varint()?).map_err(|_| reader.damaged())?;
    Ok(Stored {
        record,
        events_from,
    })
}

pub(super) fn read_accepted(reader: &mut Reader<'_>) -> Result<AcceptedRun, Damaged> {
    let run_id = RunId::new(reader.text()?);
    let adapter = AdapterName::parse(reader.text()?).map_err(|_| reader.damaged())?;
    let target = Target::parse(reader.text()?).map_err(|_| reader.damaged())?;
    let operation = operation(reader.text()?);
    let pin = read_opt_string(reader)?;
    let api_key_name = read_opt_string(reader)?;
    let queued_ms = reader.varint()?;
    let deadline_ms = read_opt_u64(reader)?;
    let client_stream = read_opt_string(reader)?;
    // The affinity source's presence byte: 0 or 1 as any optional field (schema 7), or that
    // plus `WITH_RESERVE` when the budget reserve follows (schema 8).
    let presence = reader.byte().ok_or_else(|| reader.damaged())?;
    if presence > WITH_RESERVE + 1 {
        return Err(reader.damaged());
    }
    let affinity = match presence % WITH_RESERVE {
        1 => KeySource::parse(reader.text()?),
        _ => None,
    };
    let budget_reserve = if presence >= WITH_RESERVE {
        read_opt_u64(reader)?
    } else {
        None
    };
    Ok(AcceptedRun {
        run_id,
        adapter,
        target,
        operation,
        pin,
        api_key_name,
        queued_ms,
        deadline_ms,
        client_stream,
        affinity,
        budget_reserve,
    })
}

pub(super) fn push_attempt(attempt: &Attempt, out: &mut Vec<u8>) {
    push_varint(attempt.number.into(), out);
    push_str(attempt.node.as_str(), out);
    push_str(&attempt.route_reason, out);
    push_varint(attempt.started_ms, out);
}

pub(super) fn read_attempt(reader: &mut Reader<'_>) -> Result<Attempt, Damaged> {
    let number = u32::try_from(reader.varint()?).map_err(|_| reader.damaged())?;
    let node = NodeId::parse(reader.text()?).map_err(|_| reader.damaged())?;
    Ok(Attempt {
        number,
        node,
        route_reason: reader.text()?.to_owned(),
        started_ms: reader.varint()?,
    })
}

/// An operation by the name `Operation::as_str` gives it.
pub(super) fn operation(name: &str) -> Operation {
    match name {
        "chat" => Operation::Chat,
        "completion" => Operation::Completion,
        "embeddings" => Operation::Embeddings,
        "tokenize" => Operation::Tokenize,
        "detokenize" => Operation::Detokenize,
        _ => Operation::Unspecified,
    }
}

pub(super) fn push_str(text: &str, out: &mut Vec<u8>) {
    push_bytes(text.as_bytes(), out);
}

pub(super) fn push_opt_str(text: Option<&str>, out: &mut Vec<u8>) {
    match text {
        Some(text) => {
            out.push(1);
            push_str(text, out);
        }
        None => out.push(0),
    }
}

pub(super) fn push_opt_u64(value: Option<u64>, out: &mut Vec<u8>) {
    match value {
        Some(value) => {
            out.push(1);
            push_varint(value, out);
        }
        None => out.push(0),
    }
}

pub(super) fn read_opt_string(reader: &mut Reader<'_>) -> Result<Option<String>, Damaged> {
    match reader.byte() {
        Some(0) => Ok(None),
        Some(1) => Ok(Some(reader.text()?.to_owned())),
        _ => Err(reader.damaged()),
    }
}

pub(super) fn read_opt_u64(reader: &mut Reader<'_>) -> Result<Option<u64>, Damaged> {
    match reader.byte() {
        Some(0) => Ok(None),
        Some(1) => Ok(Some(reader.varint()?)),
        _ => Err(reader.damaged()),
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;
    use crate::domain::Usage;

    fn any_opt_text() -> impl Strategy<Value = Option<String>> {
        proptest::option::of("[a-z0-9 é\"\\\\]{0,12}")
    }

    fn any_attempt() -> impl Strategy<Value = Attempt> {
        (1u32..5, "[a-z][a-z0-9-]{0,8}", "[a-z_]{0,10}", any::<u64>()).prop_map(
            |(number, node, route_reason, started_ms)| Attempt {
                number,
                node: NodeId::parse(&node).expect("a valid node id"),
                route_reason,
                started_ms,
            },
        )
    }

    fn any_accepted() -> impl Strategy<Value = AcceptedRun> {
        (
            "run-[a-z0-9]{1,12}",
            any_opt_text(),
            any_opt_text(),
            any::<u64>(),
            proptest::option::of(any::<u64>()),
            any_opt_text(),
            proptest::option::of(proptest::sample::select(KeySource::ALL.to_vec())),
            proptest::option::of(any::<u64>()),
        )
            .prop_map(
                |(
                    id,
                    pin,
                    key,
                    queued_ms,
                    deadline_ms,
                    client_stream,
                    affinity,
                    budget_reserve,
                )| AcceptedRun {
                    run_id: RunId::new(id),
                    adapter: AdapterName::parse("llama").expect("a valid adapter"),
                    target: Target::parse("tiny-1b").expect("a valid target"),
                    operation: Operation::Chat,
                    pin,
                    api_key_name: key,
                    queued_ms,
                    deadline_ms,
                    client_stream,
                    affinity,
                    budget_reserve,
                },
            )
    }

    fn any_stored() -> impl Strategy<Value = Stored> {
        let ending = (
            proptest::sample::select(vec![
                RunOutcome::Open,
                RunOutcome::Completed,
                RunOutcome::Failed,
                RunOutcome::Cancelled,
                RunOutcome::Unknown,
            ]),
            proptest::option::of(any::<u64>()),
            any_opt_text(),
            any_opt_text(),
            proptest::option::of(any::<[u32; 4]>()),
            any::<u64>(),
        );
        (
            any_accepted(),
            proptest::collection::vec(any_attempt(), 0..3),
            ending,
            0i64..i64::MAX,
        )
            .prop_map(
                |(
                    accepted,
                    attempts,
                    (outcome, finished_ms, code, reason, usage, events),
                    from,
                )| {
                    Stored {
                        record: RunRecord {
                            accepted,
                            attempts,
                            first_output_ms: finished_ms.map(|f| f / 2),
                            finished_ms,
                            outcome,
                            code: code.clone(),
                            message: code,
                            finish_reason: reason,
                            usage: usage.map(|[i, o, c, r]| Usage {
                                input_tokens: i,
                                output_tokens: o,
                                cached_input_tokens: c,
                                reasoning_tokens: r,
                            }),
                            events,
                            events_stored: events / 2,
                        },
                        events_from: from,
                    }
                },
            )
    }

    proptest! {
        #[test]
        fn an_accepted_run_of_schema_7_reads_as_reserving_nothing(
            accepted in any_accepted(),
        ) {
            // Schema 7's layout: the affinity source a plain optional field, nothing after.
            let mut old = Vec::new();
            push_str(accepted.run_id.as_str(), &mut old);
            push_str(accepted.adapter.as_str(), &mut old);
            push_str(accepted.target.as_str(), &mut old);
            push_str(accepted.operation.as_str(), &mut old);
            push_opt_str(accepted.pin.as_deref(), &mut old);
            push_opt_str(accepted.api_key_name.as_deref(), &mut old);
            push_varint(accepted.queued_ms, &mut old);
            push_opt_u64(accepted.deadline_ms, &mut old);
            push_opt_str(accepted.client_stream.as_deref(), &mut old);
            push_opt_str(accepted.affinity.map(KeySource::as_str), &mut old);
            let mut reader = Reader::new(&old);
            let read = read_accepted(&mut reader).expect("reads");
            prop_assert!(reader.at_end());
            prop_assert_eq!(read, AcceptedRun { budget_reserve: None, ..accepted });
        }

        #[test]
        fn records_read_back_as_written(stored in proptest::collection::vec(any_stored(), 0..4)) {
            let mut bytes = Vec::new();
            for one in &stored {
                push_record(one, &mut bytes);
            }
            prop_assert_eq!(read_records(&bytes).expect("records"), stored);
        }

        #[test]
        fn frames_read_back_as_written(
            open in any_stored(),
            attempt in any_attempt(),
            packed in proptest::collection::vec(any::<u8>(), 0..40),
            first_output_ms in proptest::option::of(any::<u64>()),
        ) {
            let run_id = open.record.accepted.run_id.clone();
            let chunk = EventChunk {
                run_id: run_id.as_str(),
                first_idx: 3,
                count: 2,
                first_output_ms,
                packed: &packed,
            };
            let mut bytes = Vec::new();
            push_open(&open, &mut bytes);
            push_placed(&run_id, &attempt, &mut bytes);
            push_events(&chunk, &mut bytes);
            let frames = read_frames(&bytes).expect("frames");
            prop_assert_eq!(frames.len(), 3);
            let open_read = matches!(&frames[0], Frame::Open(read) if **read == open);
            prop_assert!(open_read);
            let placed_read = matches!(&frames[1], Frame::Placed { run_id: id, attempt: a }
                if *id == run_id.as_str() && *a == attempt);
            prop_assert!(placed_read);
            let events_read = matches!(&frames[2], Frame::Events(c) if c.run_id == run_id.as_str()
                && c.first_idx == 3 && c.count == 2 && c.first_output_ms == first_output_ms
                && c.packed == packed.as_slice());
            prop_assert!(events_read);
        }

        #[test]
        fn damaged_bytes_are_errors_not_panics(bytes in proptest::collection::vec(any::<u8>(), 0..96)) {
            let _ = read_records(&bytes);
            let _ = read_frames(&bytes);
        }
    }
}
