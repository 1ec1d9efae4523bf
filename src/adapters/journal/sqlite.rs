//! [`SqliteJournal`]: the run journal in one SQLite file, written by a thread of its own.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use async_trait::async_trait;
use rusqlite::Connection;
use tokio::sync::{mpsc, oneshot};
use tracing::{info, warn};

use super::batch::Queued;
use super::budget::{Budget, Files};
use super::config::JournalConfig;
use super::held_events::Held;
use super::log::fold_open;
use super::queue::EntryQueue;
use super::reader::Reader;
use super::replica::{self, ReplicaError};
use super::retention::Retention;
use super::schema::{OpenError, open_reader, open_writer};
use super::snapshot::{Control, SnapshotError, copy_to, remove_with_sidecars};
use super::usage::read_usage;
use super::writer::{ReplicaBatch, Replication, Shared, Writer};
use crate::domain::{RunId, RunQuery, RunRecord, UsageQuery, UsageRow};
use crate::ports::{
    JournalCache, JournalEntry, JournalError, JournalStats, RunJournal, StoredEvent,
};

/// The run journal in a SQLite file. Cheap to share behind an `Arc`.
pub struct SqliteJournal {
    queue: Arc<EntryQueue>,
    shared: Arc<Shared>,
    reader: Arc<Reader>,
    /// The database, WAL and index files, for what they take on disk.
    files: Files,
    /// The runs a previous edge left open, until taken (only when opened adopting).
    left_open: Mutex<Vec<RunRecord>>,
    max_events_per_run: u64,
    over_cap: std::sync::atomic::AtomicU64,
    writer: Mutex<Option<JoinHandle<()>>>,
    /// With `[cluster]`: whether written batches go to the stream (see `replica.rs`).
    publishing: Option<Arc<AtomicBool>>,
    path: PathBuf,
}

/// The publisher's end of a replicated journal: the batches the writer wrote while
/// publishing, in order. Each is done (a flush waits for it) only once
/// [`ReplicaFeed::acknowledged`] says the stream holds it.
pub struct ReplicaFeed {
    batches: mpsc::Receiver<ReplicaBatch>,
    queue: Arc<EntryQueue>,
}

impl ReplicaFeed {
    /// The next written batch; `None` once the journal closed and every batch was taken.
    pub async fn next(&mut self) -> Option<ReplicaBatch> {
        self.batches.recv().await
    }

    /// The stream acknowledged `batch`: flushes waiting for its entries may return.
    pub fn acknowledged(&self, batch: &ReplicaBatch) {
        self.queue.mark_done(batch.entries);
    }
}

/// Written batches waiting for the publisher at most; past that the writer waits.
const REPLICA_BACKLOG: usize = 64;

impl SqliteJournal {
    /// Opens (or creates) the journal in `file`, marks the runs a previous edge left open
    /// as `unknown`/`edge_crashed`, and starts the writer thread.
    ///
    /// # Errors
    /// [`OpenError`] naming the file: its directory cannot be created, another edge holds
    /// it, or SQLite cannot use it.
    pub fn open(config: &JournalConfig, file: &Path) -> Result<Self, OpenError> {
        Self::open_with(config, file, false, None)
    }

    /// [`SqliteJournal::open`] that leaves the runs a previous edge left open as they are,
    /// for the edge to take back: [`RunJournal::take_left_open`] hands them over once, and
    /// whoever takes them ends each (a terminal event recorded as usual).
    ///
    /// # Errors
    /// As [`SqliteJournal::open`].
    pub fn open_adopting(config: &JournalConfig, file: &Path) -> Result<Self, OpenError> {
        Self::open_with(config, file, true, None)
    }

    /// The journal of a member of a site (`[cluster]`): `file` is a cache of the site's
    /// stream, so whatever it held is removed (under its lock) and the stream folded in
    /// again; the writer hands what it writes to the returned feed while
    /// [`SqliteJournal::set_publishing`] says so, and the runs left open stay open for a
    /// takeover ([`SqliteJournal::reload_left_open`]).
    ///
    /// # Errors
    /// As [`SqliteJournal::open`], and the old files that cannot be removed.
    pub fn open_replicated(
        config: &JournalConfig,
        file: &Path,
    ) -> Result<(Self, ReplicaFeed), OpenError> {
        let (out, batches) = mpsc::channel(REPLICA_BACKLOG);
        let replication = Replication {
            publishing: Arc::new(AtomicBool::new(false)),
            out,
        };
        let journal = Self::open_with(config, file, true, Some(replication))?;
        let feed = ReplicaFeed {
            batches,
            queue: Arc::clone(&journal.queue),
        };
        Ok((journal, feed))
    }

    fn open_with(
        config: &JournalConfig,
        file: &Path,
        adopting: bool,
        replication: Option<Replication>,
    ) -> Result<Self, OpenError> {
        let path = file.to_owned();
        let lock = lock_file(&path)?;
        if replication.is_some() {
            remove_cache(&path)?;
        }
        let publishing = replication.as_ref().map(|r| Arc::clone(&r.publishing));
        let budget = Budget::of(config.retention_max_bytes);
        let opened = open_writer(&path, &budget, adopting)?;
        let (marked, next_seq) = (opened.marked, opened.next_seq);
        let reader = Reader::new(path.clone());
        let left_open = oldest_first(opened.open.values().map(|run| run.stored.record.clone()));
        if marked > 0 {
            warn!(runs = marked, path = %path.display(), "runs left open by an edge that stopped without ending them are marked unknown/edge_crashed");
        }
        info!(path = %path.display(), "run journal open");
        let queue = Arc::new(EntryQueue::new(config.queue_capacity));
        let files = Files::of(&path);
        let shared = Arc::new(Shared::default());
        let writer = Writer {
            conn: opened.conn,
            queue: Arc::clone(&queue),
            shared: Arc::clone(&shared),
            retention: Retention::of(config),
            budget,
            files: files.clone(),
            making_room: false,
            next_used_check: std::time::Instant::now(),
            batch_max: config.batch_max.max(1),
            linger: config.batch_linger(),
            open: opened.open,
            next_seq,
            last_error_log: None,
            held: Held::new(config.open_events_hold()),
            taken: 0,
            batch: Vec::new(),
            due: Vec::new(),
            replication,
            _lock: lock,
        };
        let handle = std::thread::Builder::new()
            .name("edge-journal".to_owned())
            .spawn(move || writer.run())
            .map_err(|reason| OpenError::Io {
                path: path.display().to_string(),
                reason,
            })?;
        Ok(Self {
            queue,
            shared,
            reader: Arc::new(reader),
            files,
            left_open: Mutex::new(left_open),
            max_events_per_run: config.max_events_per_run,
            over_cap: std::sync::atomic::AtomicU64::new(0),
            writer: Mutex::new(Some(handle)),
            publishing,
            path,
        })
    }

    /// Whether the batches written from now on go to the stream (while this member is the
    /// site's active one). Nothing for a journal not opened replicated.
    pub fn set_publishing(&self, on: bool) {
        if let Some(publishing) = &self.publishing {
            publishing.store(on, Ordering::Release);
        }
    }

    /// Whether written batches go to the stream now.
    pub fn publishing(&self) -> bool {
        self.publishing
            .as_ref()
            .is_some_and(|p| p.load(Ordering::Acquire))
    }

    /// Applies a batch another member wrote, through the same writing path as the relay's
    /// entries, whole or not at all. Returns how many entries it held.
    ///
    /// # Errors
    /// [`ReplicaError`] when the batch does not decode; nothing of it is applied.
    pub fn apply_replica(&self, bytes: &[u8]) -> Result<usize, ReplicaError> {
        let entries = replica::decode(bytes)?;
        let count = entries.len();
        self.queue.push_all(entries);
        Ok(count)
    }

    /// Reads the runs the file now holds as open (after a flush, what the stream folded in
    /// says), for [`RunJournal::take_left_open`] to hand over: a member taking over adopts
    /// them as an edge restarting does.
    ///
    /// # Errors
    /// [`JournalError::Storage`] when the file cannot be read.
    pub async fn reload_left_open(&self) -> Result<usize, JournalError> {
        let open = self
            .read(|reader| reader.with(|conn| fold_open(conn).map(|(open, _)| open)))
            .await?;
        let left = oldest_first(open.into_values().map(|run| run.stored.record));
        let count = left.len();
        *self.left_open.lock().unwrap_or_else(|p| p.into_inner()) = left;
        Ok(count)
    }

    /// The journal's file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Batches the writer has handed to the stream so far, in this life.
    pub fn handed(&self) -> u64 {
        self.shared.handed.load(Ordering::Acquire)
    }

    /// Copies the file, as it is between two batches, to `to`; returns how many batches
    /// the writer had handed to the stream then (every one of them is in the copy, none
    /// after). The writer waits only for the copy's read transaction to begin.
    ///
    /// # Errors
    /// [`SnapshotError::OpenReader`] and [`SnapshotError::Begin`] when the file cannot be
    /// read, [`SnapshotError::RemoveTarget`] and [`SnapshotError::Copy`] when the copy
    /// cannot be written, [`SnapshotError::WriterStopped`] and [`SnapshotError::Abandoned`]
    /// when the journal or the runtime is closing.
    pub async fn snapshot_to(&self, to: &Path) -> Result<u64, SnapshotError> {
        let path = self.path.clone();
        let reader =
            blocking(move || open_reader(&path).map_err(SnapshotError::OpenReader)).await?;
        let (reply, answer) = oneshot::channel();
        self.control(Control::Snapshot { reader, reply })?;
        let (reader, handed) = answer
            .await
            .map_err(|_| SnapshotError::WriterStopped)?
            .map_err(SnapshotError::Begin)?;
        let to = to.to_owned();
        blocking(move || copy_to(&reader, &to)).await?;
        Ok(handed)
    }

    /// Replaces the file's content with the journal file at `from` (brought to this edge's
    /// schema first), under the writer: what it held back is given up, readers see the old
    /// content or the new, and the open runs are the new content's. Returns how many runs
    /// it holds open. Entries recorded before the call are written first (and replaced).
    ///
    /// # Errors
    /// [`SnapshotError::NoSource`] and [`SnapshotError::OpenSource`] when `from` cannot be
    /// opened, [`SnapshotError::Replace`] when it cannot be copied,
    /// [`SnapshotError::WriterStopped`] and [`SnapshotError::Abandoned`] when the journal or
    /// the runtime is closing; the file is then as it was.
    pub async fn restore_from(&self, from: &Path) -> Result<usize, SnapshotError> {
        let from = from.to_owned();
        self.replace_with(move || {
            if !from.is_file() {
                return Err(SnapshotError::NoSource { from });
            }
            open_source(&from)
        })
        .await
    }

    /// Empties the journal as [`SqliteJournal::restore_from`] replaces it: as if no run had
    /// been recorded.
    ///
    /// # Errors
    /// As [`SqliteJournal::restore_from`], and [`SnapshotError::RemoveOld`] when an old
    /// empty file is in the way.
    pub async fn clear(&self) -> Result<usize, SnapshotError> {
        let mut empty = self.path.as_os_str().to_owned();
        empty.push(".empty");
        let empty = PathBuf::from(empty);
        let source = empty.clone();
        let cleared = self
            .replace_with(move || {
                let fresh = remove_with_sidecars(&source)
                    .map_err(|(file, source)| SnapshotError::RemoveOld { file, source });
                fresh.and_then(|()| open_source(&source))
            })
            .await;
        let _ = remove_with_sidecars(&empty);
        cleared
    }

    /// Replaces the file's content with that of the connection `source` opens.
    async fn replace_with(
        &self,
        source: impl FnOnce() -> Result<Connection, SnapshotError> + Send + 'static,
    ) -> Result<usize, SnapshotError> {
        self.flush().await;
        let source = blocking(source).await?;
        let (reply, answer) = oneshot::channel();
        self.control(Control::Restore {
            from: source,
            reply,
        })?;
        answer
            .await
            .map_err(|_| SnapshotError::WriterStopped)?
            .map_err(SnapshotError::Replace)
    }

    fn control(&self, control: Control) -> Result<(), SnapshotError> {
        self.queue
            .push_control(control)
            .map_err(|_| SnapshotError::WriterStopped)
    }

    async fn read<T: Send + 'static>(
        &self,
        read: impl FnOnce(&Reader) -> Result<T, JournalError> + Send + 'static,
    ) -> Result<T, JournalError> {
        let reader = Arc::clone(&self.reader);
        tokio::task::spawn_blocking(move || read(&reader))
            .await
            .map_err(|error| {
                JournalError::Unavailable(format!("the read was abandoned: {error}"))
            })?
    }
}

/// The journal file at `path` (created empty when absent) as a copy's source, brought to
/// this edge's schema.
fn open_source(path: &Path) -> Result<Connection, SnapshotError> {
    open_writer(path, &Budget::of(0), true)
        .map(|opened| opened.conn)
        .map_err(SnapshotError::OpenSource)
}

/// Runs `work` on the blocking pool.
async fn blocking<T: Send + 'static>(
    work: impl FnOnce() -> Result<T, SnapshotError> + Send + 'static,
) -> Result<T, SnapshotError> {
    tokio::task::spawn_blocking(work)
        .await
        .map_err(SnapshotError::Abandoned)?
}

/// `records` in the order they were accepted.
fn oldest_first(records: impl Iterator<Item = RunRecord>) -> Vec<RunRecord> {
    let mut records: Vec<RunRecord> = records.collect();
    records.sort_by_key(|record| record.accepted.queued_ms);
    records
}

/// Removes a replicated journal's old files (a cache of the stream, folded in again).
fn remove_cache(path: &Path) -> Result<(), OpenError> {
    remove_with_sidecars(path).map_err(|(file, reason)| OpenError::Io {
        path: file.display().to_string(),
        reason,
    })
}

/// Creates the journal's directory and takes its lock file.
fn lock_file(path: &Path) -> Result<File, OpenError> {
    let io = |reason| OpenError::Io {
        path: path.display().to_string(),
        reason,
    };
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).map_err(io)?;
    }
    let mut lock_path = PathBuf::from(path.as_os_str());
    lock_path.as_mut_os_string().push(".lock");
    let file = File::create(&lock_path).map_err(io)?;
    match file.try_lock() {
        Ok(()) => Ok(file),
        Err(std::fs::TryLockError::WouldBlock) => Err(OpenError::InUse {
            path: path.display().to_string(),
        }),
        Err(std::fs::TryLockError::Error(reason)) => Err(io(reason)),
    }
}

#[async_trait]
impl RunJournal for SqliteJournal {
    fn enabled(&self) -> bool {
        true
    }

    fn shows_ends_once_kept(&self) -> bool {
        self.publishing.is_some()
    }

    fn kept_for_takeover(&self) -> bool {
        self.publishing
            .as_ref()
            .is_none_or(|publishing| publishing.load(Ordering::Acquire))
    }

    fn record(&self, entry: JournalEntry) {
        let (queued, over_cap) = Queued::of(entry, self.max_events_per_run);
        if over_cap > 0 {
            self.over_cap.fetch_add(over_cap, Ordering::Relaxed);
        }
        if let Some(queued) = queued {
            self.queue.push(queued);
        }
    }

    async fn flush(&self) {
        self.queue.flush().await;
    }

    fn take_left_open(&self) -> Vec<RunRecord> {
        std::mem::take(&mut *self.left_open.lock().unwrap_or_else(|p| p.into_inner()))
    }

    async fn run(&self, id: &RunId) -> Result<Option<RunRecord>, JournalError> {
        let id = id.clone();
        self.read(move |reader| reader.run(&id)).await
    }

    async fn finished_runs(&self, query: &RunQuery) -> Result<Vec<RunRecord>, JournalError> {
        let query = query.clone();
        self.read(move |reader| reader.finished_runs(&query)).await
    }

    async fn events(
        &self,
        id: &RunId,
        from: u64,
        limit: usize,
    ) -> Result<Vec<StoredEvent>, JournalError> {
        let id = id.clone();
        self.read(move |reader| reader.events(&id, from, limit))
            .await
    }

    async fn usage(&self, query: &UsageQuery) -> Result<Vec<UsageRow>, JournalError> {
        let query = *query;
        self.read(move |reader| reader.with(|conn| read_usage(conn, &query)))
            .await
    }

    fn stats(&self) -> JournalStats {
        JournalStats {
            written: self.shared.written.load(Ordering::Relaxed),
            events_over_cap: self.over_cap.load(Ordering::Relaxed),
            dropped_queue_full: self.queue.dropped_full.load(Ordering::Relaxed),
            dropped_over_budget: self.shared.dropped_over_budget.load(Ordering::Relaxed),
            queue_depth: self.queue.depth() as u64,
            write_errors: self.shared.write_errors.load(Ordering::Relaxed),
            runs_expired: self.shared.runs_expired.load(Ordering::Relaxed),
            bytes: self.files.total_bytes(),
        }
    }

    async fn close(&self) {
        self.queue.close();
        let handle = self.writer.lock().unwrap_or_else(|p| p.into_inner()).take();
        if let Some(handle) = handle {
            let joined = tokio::task::spawn_blocking(move || handle.join()).await;
            if !matches!(joined, Ok(Ok(()))) {
                warn!("the run journal's writer thread ended abnormally");
            }
        }
    }
}

/// The file as a member of a site's cache of the site's stream, for its takeover.
#[async_trait]
impl JournalCache for SqliteJournal {
    async fn reload_left_open(&self) -> Result<usize, JournalError> {
        SqliteJournal::reload_left_open(self).await
    }
}

impl Drop for SqliteJournal {
    fn drop(&mut self) {
        // A journal dropped without `close` (a test, a failed start) still ends its thread.
        self.queue.close();
    }
}
