//! Rewrites a journal of schema 1 to 6 — a row per run in `runs`, later attempts in
//! `attempts`, events in `events` and in the run's row — into batch rows (`log.rs`), as it
//! is opened.
//!
//! The rows go over in chunks of [`CHUNK`] runs, oldest first, each chunk one transaction
//! that writes its batch and deletes the rows it took: the file never holds much more than
//! it did, a failure leaves it as the last chunk left it, and an edge stopped halfway goes
//! on where it stopped when it opens the file again. The emptied tables are dropped at the
//! end. A run still open in the old rows becomes a snapshot frame, so it is found open as
//! any other, and ended as unknown or taken back as the edge opened the journal.

use rusqlite::{Connection, OptionalExtension, Row, Transaction, params_from_iter};
use tracing::info;

use super::frames::{EventChunk, Stored, operation, push_events, push_open};
use super::log::{BatchRow, ROW_MAX_BYTES};
use super::packed::pack_lines;
use super::sql::{damaged, from_sql, vacuum_free_pages};
use crate::domain::routing::KeySource;
use crate::domain::{
    AcceptedRun, AdapterName, Attempt, NodeId, RunId, RunOutcome, RunRecord, Target, Usage,
};
use crate::ports::clock::now_ms;

/// The tables beside `runs` as schema 6 had them, for a file that never had them.
const LEGACY_TABLES: &str = "
CREATE TABLE IF NOT EXISTS attempts (
    run_seq INTEGER NOT NULL,
    number INTEGER NOT NULL,
    node TEXT NOT NULL,
    route_reason TEXT NOT NULL,
    started_ms INTEGER NOT NULL,
    PRIMARY KEY (run_seq, number)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS events (
    run_seq INTEGER NOT NULL,
    first_idx INTEGER NOT NULL,
    count INTEGER NOT NULL,
    json TEXT NOT NULL,
    packed BLOB,
    PRIMARY KEY (run_seq, first_idx)
) WITHOUT ROWID;
";

/// Old rows rewritten per transaction.
const CHUNK: i64 = 256;

const RUN_COLUMNS: &str = "seq, run_id, adapter, target, operation, pin, api_key_name, queued_ms,
    first_output_ms, finished_ms, outcome, code, message, finish_reason, input_tokens,
    output_tokens, cached_input_tokens, reasoning_tokens, events, events_stored, node,
    route_reason, started_ms, deadline_ms, client_stream, affinity, events_inline,
    events_inline_count";

/// Rewrites every old row into batches and drops the old tables; nothing to do in a file
/// without them.
///
/// # Errors
/// What SQLite reported, or a row that does not decode; the chunks written stay written.
pub(super) fn migrate_rows(conn: &mut Connection) -> rusqlite::Result<()> {
    let legacy: Option<i64> = conn
        .query_row(
            "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'runs'",
            [],
            |row| row.get(0),
        )
        .optional()?;
    if legacy.is_none() {
        return Ok(());
    }
    // Files of schema 1 may lack the tables an edge of schema 2 on created beside `runs`.
    conn.execute_batch(LEGACY_TABLES)?;
    info!(
        "the run journal has a row per run (schema 6 or older): rewriting it into batches (schema 7), about as long as reading it once"
    );
    // An open run's events start in the first batch that holds one: the rewrite keeps that
    // batch from retention until the run is ended or taken back. (A rewrite that stopped
    // halfway goes on from what its last batch said.)
    let mut open_from: Option<i64> = conn
        .query_row(
            "SELECT open_from FROM batches ORDER BY seq DESC LIMIT 1",
            [],
            |row| row.get(0),
        )
        .optional()?;
    let mut runs = 0;
    loop {
        let tx = conn.transaction()?;
        let seq: i64 =
            tx.query_row("SELECT coalesce(max(seq), 0) + 1 FROM batches", [], |row| {
                row.get(0)
            })?;
        let rewritten = rewrite_chunk(&tx, seq, &mut open_from)?;
        tx.commit()?;
        if rewritten == 0 {
            break;
        }
        runs += rewritten;
    }
    info!(runs, "the run journal is rewritten into batches");
    conn.execute_batch("DROP TABLE events; DROP TABLE attempts; DROP TABLE runs;")?;
    vacuum_free_pages(conn)
}

/// Rewrites the oldest old runs, at most [`CHUNK`] and about [`ROW_MAX_BYTES`] of events,
/// as batch `seq` and deletes their rows; returns how many.
fn rewrite_chunk(
    tx: &Transaction<'_>,
    seq: i64,
    open_from: &mut Option<i64>,
) -> rusqlite::Result<usize> {
    let sql = format!("SELECT {RUN_COLUMNS} FROM runs ORDER BY seq LIMIT ?1");
    let mut statement = tx.prepare(&sql)?;
    let runs: Vec<(i64, RunRecord, Option<Vec<u8>>, u64)> = statement
        .query_map([CHUNK], |row| {
            let (old_seq, record) = read_run(row)?;
            Ok((old_seq, record, row.get(26)?, from_sql(row.get(27)?)))
        })?
        .collect::<rusqlite::Result<_>>()?;
    if runs.is_empty() {
        return Ok(0);
    }
    let mut last = 0;
    let mut ended = Vec::new();
    let mut frames = Vec::new();
    let mut ids = Vec::new();
    for (old_seq, mut record, inline, inline_count) in runs {
        if frames.len() >= ROW_MAX_BYTES {
            break;
        }
        last = old_seq;
        with_attempts(tx, old_seq, &mut record)?;
        let id = record.run_id().clone();
        let inline = inline.as_deref().map(|packed| (inline_count, packed));
        let stored_events = rewrite_events(tx, old_seq, &id, inline, &mut frames)?;
        let mut stored = Stored {
            record,
            events_from: seq,
        };
        if stored.record.outcome == RunOutcome::Open {
            stored.record.events_stored = stored_events;
            push_open(&stored, &mut frames);
            open_from.get_or_insert(seq);
        } else {
            ended.push(stored);
        }
        ids.push(id);
    }
    let count = ids.len();
    let id_names: Vec<&str> = ids.iter().map(RunId::as_str).collect();
    let row = BatchRow::of_records(seq, ended, frames, &id_names);
    row.insert(tx, now_ms(), open_from.unwrap_or(seq))?;
    for table in ["events", "attempts"] {
        tx.execute(
            &format!("DELETE FROM {table} WHERE run_seq <= ?1"),
            params_from_iter([last]),
        )?;
    }
    tx.execute("DELETE FROM runs WHERE seq <= ?1", [last])?;
    Ok(count)
}

/// Appends old run `old_seq`'s events — those in its row (`inline`: their count and
/// bytes) and those in `events` — to `frames` as chunks of run `id`; returns how many.
fn rewrite_events(
    tx: &Transaction<'_>,
    old_seq: i64,
    id: &RunId,
    inline: Option<(u64, &[u8])>,
    frames: &mut Vec<u8>,
) -> rusqlite::Result<u64> {
    let mut stored = 0;
    let mut chunk = |first_idx: u64, count: u64, packed: &[u8]| {
        stored += count;
        let chunk = EventChunk {
            run_id: id.as_str(),
            first_idx,
            count,
            first_output_ms: None,
            packed,
        };
        push_events(&chunk, frames);
    };
    if let Some((count, packed)) = inline {
        chunk(0, count, packed);
    }
    let mut events = tx.prepare_cached(
        "SELECT first_idx, count, json, packed FROM events WHERE run_seq = ?1 ORDER BY first_idx",
    )?;
    let mut rows = events.query([old_seq])?;
    while let Some(row) = rows.next()? {
        let (first_idx, count) = (from_sql(row.get(0)?), from_sql(row.get(1)?));
        match row.get_ref(3)?.as_blob_or_null()? {
            Some(packed) => chunk(first_idx, count, packed),
            None => {
                // Schema 1: the events' JSON lines, joined by newlines.
                let json: String = row.get(2)?;
                chunk(first_idx, count, &pack_lines(json.split('\n')));
            }
        }
    }
    Ok(stored)
}

fn bad_row(what: &str, value: &str) -> rusqlite::Error {
    damaged(format!("{what} {value:?}"))
}

fn read_run(row: &Row<'_>) -> rusqlite::Result<(i64, RunRecord)> {
    let text = |i: usize| -> rusqlite::Result<String> { row.get(i) };
    let time = |i: usize| -> rusqlite::Result<Option<u64>> {
        Ok(row.get::<_, Option<i64>>(i)?.map(from_sql))
    };
    let adapter = text(2)?;
    let target = text(3)?;
    let outcome = text(10)?;
    let accepted = AcceptedRun {
        run_id: RunId::new(text(1)?),
        adapter: AdapterName::parse(&adapter).map_err(|_| bad_row("adapter", &adapter))?,
        target: Target::parse(&target).map_err(|_| bad_row("target", &target))?,
        operation: operation(&text(4)?),
        pin: row.get(5)?,
        api_key_name: row.get(6)?,
        queued_ms: from_sql(row.get(7)?),
        deadline_ms: time(23)?,
        client_stream: row.get(24)?,
        affinity: row
            .get::<_, Option<String>>(25)?
            .and_then(|name| KeySource::parse(&name)),
        // Not kept before schema 8.
        budget_reserve: None,
    };
    let tokens = |i: usize| -> rusqlite::Result<Option<u32>> { row.get(i) };
    let usage = match (tokens(14)?, tokens(15)?) {
        (Some(input), Some(output)) => Some(Usage {
            input_tokens: input,
            output_tokens: output,
            cached_input_tokens: tokens(16)?.unwrap_or(0),
            reasoning_tokens: tokens(17)?.unwrap_or(0),
        }),
        _ => None,
    };
    let node: Option<String> = row.get(20)?;
    let inline_attempt = match node {
        Some(node) => vec![Attempt {
            number: 1,
            node: NodeId::parse(&node).map_err(|_| bad_row("node", &node))?,
            route_reason: row.get::<_, Option<String>>(21)?.unwrap_or_default(),
            started_ms: time(22)?.unwrap_or(0),
        }],
        None => Vec::new(),
    };
    let record = RunRecord {
        accepted,
        attempts: inline_attempt,
        first_output_ms: time(8)?,
        finished_ms: time(9)?,
        outcome: RunOutcome::parse(&outcome).ok_or_else(|| bad_row("outcome", &outcome))?,
        code: row.get(11)?,
        message: row.get(12)?,
        finish_reason: row.get(13)?,
        usage,
        events: from_sql(row.get(18)?),
        events_stored: from_sql(row.get(19)?),
    };
    Ok((row.get(0)?, record))
}

/// Adds the attempts kept in `attempts` to `run`'s, in order.
fn with_attempts(tx: &Transaction<'_>, seq: i64, run: &mut RunRecord) -> rusqlite::Result<()> {
    let mut statement = tx.prepare_cached(
        "SELECT number, node, route_reason, started_ms FROM attempts WHERE run_seq = ?1
         ORDER BY number",
    )?;
    let rows = statement.query_map([seq], |row| {
        let node: String = row.get(1)?;
        Ok(Attempt {
            number: row.get(0)?,
            node: NodeId::parse(&node).map_err(|_| bad_row("node", &node))?,
            route_reason: row.get(2)?,
            started_ms: from_sql(row.get(3)?),
        })
    })?;
    for attempt in rows {
        let attempt = attempt?;
        if !run.attempts.iter().any(|a| a.number == attempt.number) {
            run.attempts.push(attempt);
        }
    }
    run.attempts.sort_by_key(|a| a.number);
    Ok(())
}
