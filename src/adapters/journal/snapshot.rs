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
/// What failed, as text.
pub(super) fn copy_to(reader: &Connection, to: &Path) -> Result<(), String> {
    remove_with_sidecars(to)
        .map_err(|(file, error)| format!("cannot remove {}: {error}", file.display()))?;
    let copied = Connection::open(to).and_then(|mut target| copy(reader, &mut target));
    let ended = reader.execute_batch("COMMIT");
    copied.and(ended).map_err(|error| error.to_string())
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
