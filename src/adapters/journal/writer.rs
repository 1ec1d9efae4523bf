//! The journal's writer thread: takes batches from the queue and writes each in one
//! transaction, and removes old runs when retention asks.
//!
//! A thread of its own, not a task: SQLite calls block, and the relay's runtime threads
//! must never wait on a disk. The relay only enqueues (see `queue.rs`); each batch is
//! grouped by run before it is written (see `plan.rs`).

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use rusqlite::Connection;
use tracing::warn;

use super::batch::Queued;
use super::plan::{OpenRun, Plan};
use super::queue::{EntryQueue, Taken};
use super::retention::{Retention, retention_chunk};
use super::schema::used_bytes;
use crate::domain::RunId;

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
    /// Open runs' row numbers and stored events, so events need no lookup.
    pub(super) open: HashMap<RunId, OpenRun>,
    /// The row number of the next run accepted.
    pub(super) next_seq: i64,
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
    fn write(&mut self, batch: Vec<Queued>) {
        let count = batch.len() as u64;
        // What the file holds if the transaction fails: runs accepted in it are not there
        // (their later entries are skipped), runs it ended are still open.
        let before = self.open.clone();
        let (open, next_seq) = (&mut self.open, &mut self.next_seq);
        let result = self.conn.transaction().and_then(|tx| {
            Plan::of(&tx, batch, open, next_seq)?.apply(&tx, open)?;
            tx.commit()
        });
        match result {
            Ok(()) => {
                self.shared.written.fetch_add(count, Ordering::Relaxed);
            }
            Err(error) => {
                self.open = before;
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

/// SQLite integers are signed: times and counts past `i64::MAX` are clamped.
pub(super) fn to_sql(value: u64) -> i64 {
    i64::try_from(value).unwrap_or(i64::MAX)
}
