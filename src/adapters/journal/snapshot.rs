//! Copies of the journal file at a batch boundary, and the file replaced by one while the
//! edge runs (stream retention, decision 53).
//!
//! A copy is paired with what the writer had handed to the site's stream when it was taken:
//! the writer thread, between two batches, opens a read transaction on a connection of the
//! caller's and tells how many batches it has handed over so far; the copy is then made
//! from that transaction on the blocking pool (SQLite's online backup, which reads the
//! transaction's view while the writer goes on). A replacement goes the other way: the
//! writer thread copies a prepared file into its own connection in one transaction
//! (readers see the old file or the new one) and reads the open runs back from it.

use std::path::{Path, PathBuf};

use rusqlite::Connection;
use rusqlite::backup::{Backup, StepResult};
use tokio::sync::oneshot;

use super::schema::OpenError;

/// Why a copy of the journal could not be made
/// ([`SqliteJournal::snapshot_to`](super::SqliteJournal::snapshot_to)) or its content not
/// replaced ([`SqliteJournal::restore_from`](super::SqliteJournal::restore_from),
/// [`SqliteJournal::clear`](super::SqliteJournal::clear)). The journal is then as it was.
#[derive(Debug, thiserror::Error)]
pub enum SnapshotError {
    /// The journal's writer thread has stopped (the journal was closed).
    #[error("the journal's writer has stopped")]
    WriterStopped,
    /// The blocking task doing the work was abandoned (the runtime is shutting down).
    #[error("abandoned: {0}")]
    Abandoned(#[source] tokio::task::JoinError),
    /// No read-only connection to the journal for the copy.
    #[error(transparent)]
    OpenReader(rusqlite::Error),
    /// The copy's read transaction could not begin.
    #[error("cannot begin the copy: {0}")]
    Begin(#[source] rusqlite::Error),
    /// A file already at the copy's path could not be removed.
    #[error("cannot copy the journal to {}: cannot remove {}: {source}", .to.display(), .file.display())]
    RemoveTarget {
        /// Where the copy was to go.
        to: PathBuf,
        /// The file that could not be removed (the copy's path, or its WAL or shm file).
        file: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// SQLite could not copy the journal.
    #[error("cannot copy the journal to {}: {source}", .to.display())]
    Copy {
        /// Where the copy was to go.
        to: PathBuf,
        /// Why.
        #[source]
        source: rusqlite::Error,
    },
    /// There is no journal file where the new content was to come from.
    #[error("no journal file at {}", .from.display())]
    NoSource {
        /// The path given.
        from: PathBuf,
    },
    /// The new content's file could not be opened (or brought to this edge's schema).
    #[error(transparent)]
    OpenSource(OpenError),
    /// The empty file a clear starts from could not be made: an old one stays in the way.
    #[error("cannot remove {}: {source}", .file.display())]
    RemoveOld {
        /// The file that could not be removed.
        file: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The writer could not copy the new content into the journal.
    #[error("cannot replace the journal's content: {0}")]
    Replace(#[source] rusqlite::Error),
}

/// Work the writer thread does between two batches, asked through the queue.
pub(super) enum Control {
    /// Start a read transaction on `reader`, and hand it back with the number of batches
    /// handed to the stream so far (all of them written and inside that transaction's view).
    Snapshot {
        reader: Connection,
        reply: oneshot::Sender<rusqlite::Result<(Connection, u64)>>,
    },
    /// Replace the file's content with `from`'s and read the open runs back; answers with
    /// how many runs the new content holds open.
    Restore {
        from: Connection,
        reply: oneshot::Sender<rusqlite::Result<usize>>,
    },
}

/// Starts a read transaction on `reader`: from here it sees the file as it is now, whatever
/// the writer commits later.
pub(super) fn begin_read(reader: &Connection) -> rusqlite::Result<()> {
    reader.execute_batch("BEGIN")?;
    // A deferred transaction takes its view at its first read.
    reader.query_row("SELECT count(*) FROM sqlite_master", [], |_| Ok(()))
}

/// Copies what `reader`'s transaction sees into a new file at `to` (replaced if present),
/// then ends the transaction.
///
/// # Errors
/// [`SnapshotError::RemoveTarget`] when a file at `to` cannot be removed,
/// [`SnapshotError::Copy`] when SQLite cannot copy.
pub(super) fn copy_to(reader: &Connection, to: &Path) -> Result<(), SnapshotError> {
    remove_with_sidecars(to).map_err(|(file, source)| SnapshotError::RemoveTarget {
        to: to.to_owned(),
        file,
        source,
    })?;
    let copied = Connection::open(to).and_then(|mut target| copy(reader, &mut target));
    let ended = reader.execute_batch("COMMIT");
    copied.and(ended).map_err(|source| SnapshotError::Copy {
        to: to.to_owned(),
        source,
    })
}

/// Copies every page of `from` into `to` in one step (one transaction on `to`).
pub(super) fn copy(from: &Connection, to: &mut Connection) -> rusqlite::Result<()> {
    let backup = Backup::new(from, to)?;
    match backup.step(-1)? {
        StepResult::Done => Ok(()),
        // One step copies every page unless the source is locked or busy: try again later.
        _ => Err(busy()),
    }
}

fn busy() -> rusqlite::Error {
    rusqlite::Error::SqliteFailure(
        rusqlite::ffi::Error::new(rusqlite::ffi::SQLITE_BUSY),
        Some("the journal copy did not complete in one step".to_owned()),
    )
}

/// Removes `path` and the WAL and shared-memory files beside it, those present.
///
/// # Errors
/// The file that could not be removed, and why.
pub(super) fn remove_with_sidecars(path: &Path) -> Result<(), (PathBuf, std::io::Error)> {
    for suffix in ["", "-wal", "-shm"] {
        let mut file = path.as_os_str().to_owned();
        file.push(suffix);
        match std::fs::remove_file(&file) {
            Err(error) if error.kind() != std::io::ErrorKind::NotFound => {
                return Err((PathBuf::from(file), error));
            }
            _ => {}
        }
    }
    Ok(())
}
