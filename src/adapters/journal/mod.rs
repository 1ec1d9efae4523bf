//! The run journal: every run's record and its events in an embedded SQLite database
//! (decision 16 says why SQLite), or nothing at all when `[journal] enabled = false`.
//!
//! The relay only enqueues (`queue.rs`); a writer thread writes each batch of entries as
//! one row of the log (`writer.rs`, `log.rs`, laid out as `frames.rs` says), holding open
//! runs' events back to write them together when asked (`held_events.rs`), and applies retention
//! (`retention.rs`); the management API reads on read-only connections (`reader.rs`). The
//! SQL helpers they share (integers, damaged rows, the file's size) are in `sql.rs`, below
//! all of them.
//! With `[cluster]` the writer also hands each batch it wrote, in the form `replica.rs`
//! gives it, to a publisher (`ReplicaFeed`), and a member folds the batches others wrote
//! through the same queue. Nothing here is on the relay's path but a push.

mod batch;
mod bloom;
mod budget;
pub mod config;
mod frames;
mod held_events;
mod log;
mod migrate;
mod packed;
mod queue;
mod reader;
mod replica;
mod retention;
mod schema;
mod snapshot;
mod sql;
mod sqlite;
#[cfg(test)]
mod tests;
mod usage;
mod writer;

use std::path::Path;
use std::sync::Arc;

pub use config::{HumanDuration, JournalConfig};
pub use replica::empty_batch;
pub use schema::OpenError;
pub use sqlite::{ReplicaFeed, SqliteJournal};
pub use writer::ReplicaBatch;

use crate::ports::{NoopJournal, RunJournal};

/// The journal `config` asks for: SQLite in `file` when enabled, else one that keeps
/// nothing. With `adopting`, the runs a previous edge left open stay open for the edge to
/// take back ([`SqliteJournal::open_adopting`]); else they are marked `unknown`.
///
/// # Errors
/// [`OpenError`] when the enabled journal's file cannot be used.
pub fn open_journal(
    config: &JournalConfig,
    file: &Path,
    adopting: bool,
) -> Result<Arc<dyn RunJournal>, OpenError> {
    if config.enabled && adopting {
        Ok(Arc::new(SqliteJournal::open_adopting(config, file)?))
    } else if config.enabled {
        Ok(Arc::new(SqliteJournal::open(config, file)?))
    } else {
        Ok(Arc::new(NoopJournal))
    }
}
