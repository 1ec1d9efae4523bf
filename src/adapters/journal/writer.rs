//! The journal's writer thread: takes batches from the queue and writes each in one
//! transaction, as batch rows of the log (see `log.rs`), and removes old rows when
//! retention asks.
//!
//! A thread of its own, not a task: SQLite calls block, and the relay's runtime threads
//! must never wait on a disk. The relay only enqueues (see `queue.rs`). After each batch it
//! keeps the files within the disk limit (see `budget.rs`): retention when the data nears
//! its share (carrying open runs forward when only their rows are left), a checkpoint when
//! the WAL outgrows its own, and a batch that found the file full is written again after
//! making room.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use crate::ports::clock::now_ms;

use rusqlite::Connection;
use tracing::warn;

use super::batch::Queued;
use super::budget::{Budget, Files};
use super::held_events::Held;
use super::log::{BatchRow, OpenRuns, ROW_MAX_BYTES, fold_open, open_from};
use super::queue::{EntryQueue, Taken};
use super::replica;
use super::retention::{Retention, expire_usage, retention_chunk};
use super::snapshot::{self, Control};
use super::sql::{file_bytes, used_bytes, vacuum_free_pages};

/// Where the writer sends the batches it wrote, while this member publishes them.
pub(super) struct Replication {
    /// Set while this member is the site's active one (`SqliteJournal::set_publishing`).
    pub(super) publishing: Arc<AtomicBool>,
    /// To the publisher task (`super::ReplicaFeed`).
    pub(super) out: tokio::sync::mpsc::Sender<ReplicaBatch>,
}

/// One written batch in its replicated form, and how many queued entries it holds.
#[derive(Debug)]
pub struct ReplicaBatch {
    /// The batch as `replica.rs` encodes it.
    pub bytes: Vec<u8>,
    pub(super) entries: usize,
}

/// Counters shared by the writer and the journal's handle.
#[derive(Debug, Default)]
pub(super) struct Shared {
    pub(super) written: AtomicU64,
    pub(super) write_errors: AtomicU64,
    pub(super) runs_expired: AtomicU64,
    pub(super) dropped_over_budget: AtomicU64,
    /// Batches handed to the publisher so far (a copy says how many it holds).
    pub(super) handed: AtomicU64,
}

/// How often retention looks for runs to remove.
const RETENTION_INTERVAL: Duration = Duration::from_secs(60);

/// How often the writer counts the pages in use against the limit's high mark, at most.
const USED_CHECK_INTERVAL: Duration = Duration::from_millis(50);

/// How often a failing journal logs, at most.
const ERROR_LOG_INTERVAL: Duration = Duration::from_secs(10);

/// The writer thread's state.
pub(super) struct Writer {
    pub(super) conn: Connection,
    pub(super) queue: Arc<EntryQueue>,
    pub(super) shared: Arc<Shared>,
    pub(super) retention: Retention,
    pub(super) budget: Budget,
    pub(super) files: Files,
    /// Set while retention brings the data down to the budget's low mark.
    pub(super) making_room: bool,
    /// When `keep_budget` next counts the pages in use.
    pub(super) next_used_check: Instant,
    pub(super) batch_max: usize,
    pub(super) linger: Duration,
    /// Open runs' records so far (the file has a snapshot of those a batch left open).
    pub(super) open: OpenRuns,
    /// The number of the next batch row.
    pub(super) next_seq: i64,
    pub(super) last_error_log: Option<Instant>,
    /// Open runs' events kept back to be written together (see `held_events.rs`).
    pub(super) held: Held,
    /// Entries taken from the queue so far (a flush waits for those admitted before it).
    pub(super) taken: u64,
    /// The batch taken from the queue and the entries due to be written: buffers kept
    /// from one batch to the next, so a batch costs no fresh memory (and no page faults).
    pub(super) batch: Vec<Queued>,
    pub(super) due: Vec<Queued>,
    /// With `[cluster]`: where written batches go to be replicated (see `replica.rs`).
    pub(super) replication: Option<Replication>,
    /// The file's lock, held until the writer has stopped (dropped last): an edge that
    /// opens the file after this one closed it never writes beside this writer's last
    /// transaction or checkpoint.
    pub(super) _lock: std::fs::File,
}

impl Writer {
    /// Writes batches until the queue is closed and empty, interleaving retention work.
    pub(super) fn run(mut self) {
        // A file over a limit lowered since it was written is brought within it now, not
        // at the first write.
        self.keep_budget();
        self.expire_usage();
        let mut next_retention = Instant::now();
        let mut retention_pending = true;
        // While runs keep coming, how long the next wait asks no pusher to wake the writer
        // (`EntryQueue::take`).
        let mut unwoken = Duration::ZERO;
        loop {
            if retention_pending {
                retention_pending = self.retention_step();
            } else if Instant::now() >= next_retention {
                retention_pending = true;
                self.expire_usage();
                next_retention = Instant::now() + RETENTION_INTERVAL;
                continue;
            }
            let idle = if retention_pending {
                Duration::ZERO
            } else {
                next_retention.saturating_duration_since(Instant::now())
            };
            let idle = self
                .held
                .next_due(Instant::now())
                .map_or(idle, |due| due.min(idle));
            let closed = matches!(
                self.queue
                    .take(self.batch_max, idle, unwoken, &mut self.batch),
                Taken::Closed
            );
            let drained = self.batch.len() < self.batch_max;
            unwoken = if self.batch.is_empty() {
                Duration::ZERO
            } else {
                self.linger
            };
            self.write_taken(closed);
            self.run_controls();
            if closed {
                break;
            }
            if drained && !self.linger.is_zero() {
                self.queue.linger(self.linger);
            }
        }
        // Leave a small WAL behind for the next start and for backups.
        let _ = self.conn.execute_batch("PRAGMA wal_checkpoint(TRUNCATE);");
        self.queue.writer_gone();
    }

    /// Writes what the batch taken and the hold have due: everything held when the queue
    /// closed or a flush waits for entries taken up to now, else the holds that are over.
    fn write_taken(&mut self, closed: bool) {
        let now = Instant::now();
        self.taken += self.batch.len() as u64;
        let mut due = std::mem::take(&mut self.due);
        self.held.absorb(&mut self.batch, now, &mut due);
        if closed || self.queue.flush_waiting() {
            self.held.release_all(&mut due);
            self.queue.flush_served(self.taken);
        } else {
            self.held.release_due(now, &mut due);
        }
        let count = due.len();
        if count > 0 {
            let replicas = self
                .replication
                .as_ref()
                .filter(|r| r.publishing.load(Ordering::Acquire))
                .map(|_| replica_pieces(&due));
            self.write_pieces(&mut due);
            match replicas {
                Some(pieces) => {
                    for (bytes, entries) in pieces {
                        self.hand_over(bytes, entries);
                    }
                }
                None => self.queue.mark_done(count),
            }
        }
        due.clear();
        self.due = due;
    }

    /// Hands a written batch of `entries` to the publisher, which marks them done once the
    /// stream acknowledged it (so a flush waits for that). When the publisher's channel is
    /// full the writer waits: the queue then fills and leaves out events as it does when the
    /// disk is slow. A publisher gone (shutting down) marks nothing: the entries are done.
    fn hand_over(&mut self, bytes: Vec<u8>, entries: usize) {
        let sent = self
            .replication
            .as_ref()
            .is_some_and(|r| r.out.blocking_send(ReplicaBatch { bytes, entries }).is_ok());
        if sent {
            self.shared.handed.fetch_add(1, Ordering::Release);
        } else {
            self.queue.mark_done(entries);
        }
    }

    /// Does the work asked between two batches (see `snapshot.rs`).
    fn run_controls(&mut self) {
        for control in self.queue.take_controls() {
            match control {
                Control::Snapshot { reader, reply } => {
                    let handed = self.shared.handed.load(Ordering::Acquire);
                    let begun = snapshot::begin_read(&reader).map(|()| (reader, handed));
                    let _ = reply.send(begun);
                }
                Control::Restore { from, reply } => {
                    let _ = reply.send(self.restore(&from));
                }
            }
        }
    }

    /// Replaces the file's content with `from`'s: what it held back is given up (the
    /// content it belonged to is gone), the open runs are read back from the new content,
    /// and the WAL is checkpointed. Returns how many runs it holds open.
    fn restore(&mut self, from: &Connection) -> rusqlite::Result<usize> {
        let mut given_up = Vec::new();
        self.held.release_all(&mut given_up);
        self.queue.mark_done(given_up.len());
        let copied = snapshot::copy(from, &mut self.conn);
        self.reload_open();
        copied?;
        self.checkpoint();
        Ok(self.open.len())
    }

    /// Writes `due` in transactions of about a quarter of the WAL's share at most, so one
    /// cannot grow the WAL past its share of the disk limit; leaves `due` empty.
    fn write_pieces(&mut self, due: &mut Vec<Queued>) {
        let max_bytes = usize::try_from(self.budget.wal / 4).unwrap_or(usize::MAX);
        while !due.is_empty() {
            let fits = fitting(due, max_bytes);
            if fits == due.len() {
                self.write(due);
                due.clear();
            } else {
                let mut piece: Vec<Queued> = due.drain(..fits).collect();
                self.write(&mut piece);
            }
            self.keep_budget();
        }
    }

    /// One chunk of retention; returns whether more may be due.
    fn retention_step(&mut self) -> bool {
        let target = self.making_room.then(|| self.budget.low_mark());
        let open_from = open_from(&self.open, self.next_seq);
        let result = retention_chunk(&self.conn, &self.retention, now_ms(), target, open_from);
        match result {
            Ok(removed) => {
                self.shared
                    .runs_expired
                    .fetch_add(removed.runs as u64, Ordering::Relaxed);
                if removed.batches == 0 {
                    self.making_room = false;
                }
                removed.batches > 0
            }
            Err(error) => {
                self.failed("retention", &error);
                false
            }
        }
    }

    /// Removes the usage rollups past their retention.
    fn expire_usage(&mut self) {
        if let Err(error) = expire_usage(&self.conn, &self.retention, now_ms()) {
            self.failed("usage retention", &error);
        }
    }

    /// After a batch: checkpoints a WAL that outgrew its own share and, at most every
    /// [`USED_CHECK_INTERVAL`], removes the oldest finished runs when the data nears its
    /// share of the limit. (Counting the pages in use takes two statements and a read
    /// lock: per transaction it was a tenth of a small one's cost. Between two counts the
    /// file's page cap still holds the limit: a write that finds it full makes room then.)
    fn keep_budget(&mut self) {
        let now = Instant::now();
        if self.budget.limit > 0 && now >= self.next_used_check {
            self.next_used_check = now + USED_CHECK_INTERVAL;
            if used_bytes(&self.conn).is_ok_and(|used| self.budget.over_high_mark(used)) {
                self.make_room();
            }
        }
        if self.files.wal_bytes() > self.budget.wal {
            self.checkpoint();
        }
    }

    /// Removes the oldest batch rows until the data is at the budget's low mark, then
    /// checkpoints, so the freed pages can be reused. When only batches that open runs'
    /// events start in are left, those runs are carried forward first (their events so far
    /// are given up, their records kept).
    fn make_room(&mut self) {
        self.remove_to_low_mark();
        let low = self.budget.low_mark();
        let over = used_bytes(&self.conn).is_ok_and(|used| used > low);
        if over && self.carry_open_runs(self.next_seq) {
            self.remove_to_low_mark();
        }
        // New data reuses the freed pages; only a file larger than its share (the limit was
        // lowered) hands them back, and then takes the share as its page cap again.
        if file_bytes(&self.conn).is_ok_and(|bytes| bytes > self.budget.database) {
            let shrunk = vacuum_free_pages(&self.conn).and_then(|()| self.budget.apply(&self.conn));
            if let Err(error) = shrunk {
                self.failed("vacuum", &error);
            }
        }
        self.checkpoint();
    }

    /// Removes the oldest batch rows retention may remove until the data is at the budget's
    /// low mark.
    fn remove_to_low_mark(&mut self) {
        self.making_room = true;
        while self.making_room && self.retention_step() {}
        self.making_room = false;
    }

    fn checkpoint(&mut self) {
        if let Err(error) = self.conn.execute_batch("PRAGMA wal_checkpoint(TRUNCATE);") {
            self.failed("checkpoint", &error);
        }
    }

    /// Writes `batch` in one transaction. A batch the file has no room for is written
    /// again after retention made room, and then without the events that may be left out;
    /// what still fails is lost and counted.
    fn write(&mut self, batch: &mut Vec<Queued>) {
        let mut result = self.transaction(batch);
        if is_full(&result) {
            self.make_room();
            result = self.transaction(batch);
        }
        if is_full(&result) {
            let before = batch.len();
            batch.retain(|entry| !entry.droppable());
            let left_out = batch.len().abs_diff(before) as u64;
            self.shared
                .dropped_over_budget
                .fetch_add(left_out, Ordering::Relaxed);
            result = self.transaction(batch);
        }
        match result {
            Ok(()) => {
                self.shared
                    .written
                    .fetch_add(batch.len() as u64, Ordering::Relaxed);
            }
            Err(error) => {
                self.shared.write_errors.fetch_add(1, Ordering::Relaxed);
                self.failed("write", &error);
            }
        }
    }

    /// Writes `batch` as batch rows (one per [`ROW_MAX_BYTES`] of entries) in one
    /// transaction; on failure the writer's view of open runs is read back from the file.
    fn transaction(&mut self, batch: &[Queued]) -> rusqlite::Result<()> {
        let mut rows = Vec::new();
        let mut rest = batch;
        while !rest.is_empty() {
            let (piece, after) = rest.split_at(fitting(rest, ROW_MAX_BYTES));
            rest = after;
            let seq = self.next_seq + rows.len() as i64;
            let row = BatchRow::of(seq, piece, &mut self.open);
            if !row.is_empty() {
                rows.push(row);
            }
        }
        let result = self.insert(&rows);
        match result {
            Ok(()) => self.next_seq += rows.len() as i64,
            Err(_) => self.reload_open(),
        }
        result
    }

    /// Takes the open runs as the file holds them, after a transaction that changed them in
    /// memory failed. (Cheaper than keeping an undo log: a write fails rarely, and every
    /// entry of every run would pay for the log.)
    fn reload_open(&mut self) {
        match fold_open(&self.conn) {
            Ok((open, next_seq)) => {
                self.open = open;
                self.next_seq = next_seq;
            }
            Err(error) => self.failed("reading the open runs back", &error),
        }
    }

    /// Writes `rows` in one transaction.
    fn insert(&mut self, rows: &[BatchRow<'_>]) -> rusqlite::Result<()> {
        if rows.is_empty() {
            return Ok(());
        }
        // Every row of the transaction is committed with the last: the state after it is
        // the one a later reader of `open_from` sees.
        let open_from = open_from(&self.open, self.next_seq + rows.len() as i64);
        let tx = self.conn.transaction()?;
        let now = now_ms();
        for row in rows {
            row.insert(&tx, now, open_from)?;
        }
        tx.commit()
    }

    /// Writes the open runs whose events start before batch `before` again, as snapshots
    /// in a batch of their own, so retention can remove the batches they started in (their
    /// events there go with them). Returns whether any was carried.
    fn carry_open_runs(&mut self, before: i64) -> bool {
        if self
            .open
            .values()
            .all(|run| run.stored.events_from >= before)
        {
            return false;
        }
        let seq = self.next_seq;
        let runs = self
            .open
            .values_mut()
            .filter(|run| run.stored.events_from < before);
        let row = BatchRow::carrying(seq, runs);
        match self.insert(std::slice::from_ref(&row)) {
            Ok(()) => {
                self.next_seq += 1;
                true
            }
            Err(error) => {
                self.failed("carrying open runs forward", &error);
                self.reload_open();
                false
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

/// The largest replicated batch, about: NATS refuses a message over its `max_payload`
/// (1 MiB by default); a bigger written batch goes as several.
const REPLICA_MAX_BYTES: usize = 512 << 10;

/// `due` in the replicated form, in pieces of about [`REPLICA_MAX_BYTES`] at most, each
/// with how many entries it holds.
fn replica_pieces(due: &[Queued]) -> Vec<(Vec<u8>, usize)> {
    let mut pieces = Vec::new();
    let mut rest = due;
    while !rest.is_empty() {
        let (piece, after) = rest.split_at(fitting(rest, REPLICA_MAX_BYTES));
        pieces.push((replica::encode(piece), piece.len()));
        rest = after;
    }
    pieces
}

/// How many of `entries`, from the first, fit in `max_bytes` as `Queued::estimated_bytes`
/// counts them: at least one.
fn fitting(entries: &[Queued], max_bytes: usize) -> usize {
    let mut bytes = 0;
    entries
        .iter()
        .take_while(|entry| {
            bytes += entry.estimated_bytes();
            bytes <= max_bytes
        })
        .count()
        .max(1)
}

/// Whether a write failed because the database file reached its page limit.
fn is_full(result: &rusqlite::Result<()>) -> bool {
    matches!(
        result,
        Err(rusqlite::Error::SqliteFailure(error, _))
            if error.code == rusqlite::ErrorCode::DiskFull
    )
}
