//! The journal's writer thread: takes batches from the queue and writes each in one
//! transaction, and removes old runs when retention asks.
//!
//! A thread of its own, not a task: SQLite calls block, and the relay's runtime threads
//! must never wait on a disk. The relay only enqueues (see `queue.rs`).

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use rusqlite::{Connection, OptionalExtension, Transaction, params};
use tracing::warn;

use super::queue::{EntryQueue, Taken};
use super::retention::{Retention, retention_chunk};
use super::schema::used_bytes;
use crate::adapters::sinks::format::write_json_line;
use crate::domain::{AcceptedRun, Attempt, RunEvent, RunEventKind, RunId, RunOutcome};
use crate::ports::JournalEntry;

/// Counters shared by the writer and the journal's handle.
#[derive(Debug, Default)]
pub(super) struct Shared {
    pub(super) written: AtomicU64,
    pub(super) write_errors: AtomicU64,
    pub(super) runs_expired: AtomicU64,
    pub(super) bytes: AtomicU64,
}

/// How often retention looks for runs to remove.
const RETENTION_INTERVAL: Duration = Duration::from_secs(60);

/// How often a failing journal logs, at most.
const ERROR_LOG_INTERVAL: Duration = Duration::from_secs(10);

/// The writer thread's state.
pub(super) struct Writer {
    pub(super) conn: Connection,
    pub(super) queue: Arc<EntryQueue>,
    pub(super) shared: Arc<Shared>,
    pub(super) retention: Retention,
    pub(super) batch_max: usize,
    pub(super) linger: Duration,
    /// Open runs' row numbers, so events need no lookup.
    pub(super) open: HashMap<RunId, i64>,
    pub(super) last_error_log: Option<Instant>,
}

impl Writer {
    /// Writes batches until the queue is closed and empty, interleaving retention work.
    pub(super) fn run(mut self) {
        let mut next_retention = Instant::now();
        let mut retention_pending = true;
        loop {
            if retention_pending {
                retention_pending = self.retention_step();
            } else if Instant::now() >= next_retention {
                retention_pending = true;
                next_retention = Instant::now() + RETENTION_INTERVAL;
                continue;
            }
            let idle = if retention_pending {
                Duration::ZERO
            } else {
                next_retention.saturating_duration_since(Instant::now())
            };
            match self.queue.take(self.batch_max, idle) {
                Taken::Batch(batch) => {
                    let count = batch.len();
                    self.write(batch);
                    self.queue.mark_done(count);
                    if count < self.batch_max && !self.linger.is_zero() {
                        std::thread::sleep(self.linger);
                    }
                }
                Taken::Idle => {}
                Taken::Closed => break,
            }
        }
        // Leave a small WAL behind for the next start and for backups.
        let _ = self.conn.execute_batch("PRAGMA wal_checkpoint(TRUNCATE);");
        self.queue.writer_gone();
    }

    /// One chunk of retention; returns whether more may be due.
    fn retention_step(&mut self) -> bool {
        let result = retention_chunk(&mut self.conn, &self.retention, now_ms());
        if let Ok(bytes) = used_bytes(&self.conn) {
            self.shared.bytes.store(bytes, Ordering::Relaxed);
        }
        match result {
            Ok(removed) => {
                self.shared
                    .runs_expired
                    .fetch_add(removed as u64, Ordering::Relaxed);
                removed > 0
            }
            Err(error) => {
                self.failed("retention", &error);
                false
            }
        }
    }

    /// Writes `batch` in one transaction; on failure its entries are lost and counted.
    fn write(&mut self, batch: Vec<JournalEntry>) {
        let count = batch.len() as u64;
        let accepted: Vec<RunId> = batch
            .iter()
            .filter_map(|e| match e {
                JournalEntry::Accepted(run) => Some(run.run_id.clone()),
                _ => None,
            })
            .collect();
        let result = self.conn.transaction().and_then(|tx| {
            let mut open = std::mem::take(&mut self.open);
            let applied = batch.iter().try_for_each(|e| apply(&tx, &mut open, e));
            self.open = open;
            applied?;
            tx.commit()
        });
        match result {
            Ok(()) => {
                self.shared.written.fetch_add(count, Ordering::Relaxed);
            }
            Err(error) => {
                // Those runs are not in the file: later events for them are skipped.
                for run in &accepted {
                    self.open.remove(run);
                }
                self.shared.write_errors.fetch_add(1, Ordering::Relaxed);
                self.failed("write", &error);
            }
        }
    }

    fn failed(&mut self, what: &str, error: &rusqlite::Error) {
        let due = self
            .last_error_log
            .is_none_or(|at| at.elapsed() >= ERROR_LOG_INTERVAL);
        if due {
            self.last_error_log = Some(Instant::now());
            warn!(%error, what, "the run journal failed; the entries of this transaction are lost");
        }
    }
}

/// Milliseconds since the Unix epoch, now.
pub(super) fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

fn apply(
    tx: &Transaction<'_>,
    open: &mut HashMap<RunId, i64>,
    entry: &JournalEntry,
) -> rusqlite::Result<()> {
    match entry {
        JournalEntry::Accepted(run) => {
            let seq = insert_run(tx, run)?;
            open.insert(run.run_id.clone(), seq);
        }
        JournalEntry::Placed { run_id, attempt } => {
            if let Some(seq) = run_seq(tx, open, run_id)? {
                insert_attempt(tx, seq, attempt)?;
            }
        }
        JournalEntry::Event {
            index,
            at_ms,
            event,
            first_output,
        } => {
            let Some(seq) = run_seq(tx, open, &event.run_id)? else {
                return Ok(());
            };
            insert_event(tx, seq, *index, *at_ms, event)?;
            if *first_output {
                tx.prepare_cached(
                    "UPDATE runs SET first_output_ms = ?1 WHERE seq = ?2 AND first_output_ms IS NULL",
                )?
                .execute(params![to_sql(*at_ms), seq])?;
            }
            if event.kind.is_terminal() {
                finish_run(tx, seq, *index + 1, *at_ms, &event.kind)?;
                open.remove(&event.run_id);
            }
        }
    }
    Ok(())
}

fn run_seq(
    tx: &Transaction<'_>,
    open: &HashMap<RunId, i64>,
    run_id: &RunId,
) -> rusqlite::Result<Option<i64>> {
    if let Some(seq) = open.get(run_id) {
        return Ok(Some(*seq));
    }
    tx.prepare_cached("SELECT seq FROM runs WHERE run_id = ?1")?
        .query_row([run_id.as_str()], |row| row.get(0))
        .optional()
}

fn insert_run(tx: &Transaction<'_>, run: &AcceptedRun) -> rusqlite::Result<i64> {
    let inserted = tx
        .prepare_cached(
            "INSERT INTO runs (run_id, adapter, target, operation, pin, api_key_name, queued_ms, outcome)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, 'open') ON CONFLICT (run_id) DO NOTHING",
        )?
        .execute(params![
            run.run_id.as_str(),
            run.adapter.as_str(),
            run.target.as_str(),
            run.operation.as_str(),
            run.pin,
            run.api_key_name,
            to_sql(run.queued_ms),
        ])?;
    if inserted == 1 {
        return Ok(tx.last_insert_rowid());
    }
    tx.prepare_cached("SELECT seq FROM runs WHERE run_id = ?1")?
        .query_row([run.run_id.as_str()], |row| row.get(0))
}

fn insert_attempt(tx: &Transaction<'_>, seq: i64, attempt: &Attempt) -> rusqlite::Result<()> {
    tx.prepare_cached(
        "INSERT OR REPLACE INTO attempts (run_seq, number, node, route_reason, started_ms)
         VALUES (?1, ?2, ?3, ?4, ?5)",
    )?
    .execute(params![
        seq,
        attempt.number,
        attempt.node.as_str(),
        attempt.route_reason,
        to_sql(attempt.started_ms),
    ])?;
    Ok(())
}

fn insert_event(
    tx: &Transaction<'_>,
    seq: i64,
    index: u64,
    at_ms: u64,
    event: &RunEvent,
) -> rusqlite::Result<()> {
    let mut line = Vec::with_capacity(128);
    write_json_line(event, &mut line);
    while line.last() == Some(&b'\n') {
        line.pop();
    }
    let json = String::from_utf8_lossy(&line);
    tx.prepare_cached(
        "INSERT OR IGNORE INTO events (run_seq, idx, at_ms, json) VALUES (?1, ?2, ?3, ?4)",
    )?
    .execute(params![seq, to_sql(index), to_sql(at_ms), json])?;
    Ok(())
}

fn finish_run(
    tx: &Transaction<'_>,
    seq: i64,
    events: u64,
    at_ms: u64,
    kind: &RunEventKind,
) -> rusqlite::Result<()> {
    let outcome = RunOutcome::of_event(kind).unwrap_or(RunOutcome::Unknown);
    let (code, message, finish_reason, usage) = match kind {
        RunEventKind::Completed {
            finish_reason,
            usage,
        } => (None, None, Some(finish_reason.as_str()), *usage),
        RunEventKind::Failed { code, message, .. } => {
            (Some(code.as_str()), Some(message.as_str()), None, None)
        }
        RunEventKind::Cancelled { reason } => (None, Some(reason.as_str()), None, None),
        RunEventKind::Started | RunEventKind::Output { .. } => (None, None, None, None),
    };
    tx.prepare_cached(
        "UPDATE runs SET outcome = ?2, finished_ms = ?3, code = ?4, message = ?5,
            finish_reason = ?6, input_tokens = ?7, output_tokens = ?8,
            cached_input_tokens = ?9, reasoning_tokens = ?10, events = ?11,
            events_stored = (SELECT count(*) FROM events WHERE run_seq = ?1)
         WHERE seq = ?1",
    )?
    .execute(params![
        seq,
        outcome.as_str(),
        to_sql(at_ms),
        code,
        message,
        finish_reason,
        usage.map(|u| u.input_tokens),
        usage.map(|u| u.output_tokens),
        usage.map(|u| u.cached_input_tokens),
        usage.map(|u| u.reasoning_tokens),
        to_sql(events),
    ])?;
    Ok(())
}

/// SQLite integers are signed: times and counts past `i64::MAX` are clamped.
pub(super) fn to_sql(value: u64) -> i64 {
    i64::try_from(value).unwrap_or(i64::MAX)
}
