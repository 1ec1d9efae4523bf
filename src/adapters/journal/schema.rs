//! The journal's SQLite file: opening it, its pragmas, its tables, and the runs an edge
//! left open when it died.
//!
//! WAL mode with `synchronous = NORMAL`: a commit is one append to the WAL and no `fsync`,
//! and every committed transaction survives the process being killed (the OS holds the
//! pages); a power cut may lose the last few commits but never leaves the file corrupt.
//! `auto_vacuum = INCREMENTAL` lets retention hand freed pages back to the file system.
//!
//! Runs and their events are kept in `batches`, one row per write transaction (`log.rs`).
//! Files of schema 1 to 6 kept a row per run (`runs`, `attempts`, `events`); they are
//! rewritten into batches when opened (`migrate.rs`).

use std::path::Path;
use std::time::Duration;

use rusqlite::{Connection, OpenFlags};

use super::budget::Budget;
use super::frames::Stored;
use super::log::{BatchRow, OpenRuns, fold_open};
use super::migrate::migrate_rows;
use crate::domain::{EDGE_CRASHED, RunOutcome};
use crate::ports::clock::now_ms;

/// The schema this code writes; a file with a newer one is refused. Schema 3 adds the
/// `usage` rollups, a table of its own that `TABLES` creates in an older file; schema 4 a
/// run's `deadline_ms`, so a run taken back after a restart keeps its deadline; schema 5 a
/// run's `client_stream`, what its API needs to render its stream again for a caller that
/// resumes it; schema 6 a run's `affinity` source and the usage rollups' `affinity`
/// dimension (rows rolled up before it have an empty one: not known); schema 7 the log of
/// batches in place of a row per run; schema 8 a run's budget reserve in its record
/// (`frames.rs`; schema 7's records read as reserving nothing, so nothing is rewritten).
const SCHEMA_VERSION: i64 = 8;

/// How long a connection waits for another's lock (a checkpoint, a backup) before failing.
const BUSY_TIMEOUT: Duration = Duration::from_secs(5);

const TABLES: &str = "
CREATE TABLE IF NOT EXISTS batches (
    seq INTEGER PRIMARY KEY,
    newest_ms INTEGER NOT NULL,
    ended_from_ms INTEGER,
    ended_to_ms INTEGER,
    ended_count INTEGER NOT NULL,
    open_from INTEGER NOT NULL,
    ids BLOB NOT NULL,
    facets BLOB NOT NULL,
    ended BLOB NOT NULL,
    frames BLOB NOT NULL
);
CREATE INDEX IF NOT EXISTS batches_by_ended ON batches (ended_to_ms) WHERE ended_to_ms IS NOT NULL;
CREATE TABLE IF NOT EXISTS usage (
    bucket TEXT NOT NULL,
    start_ms INTEGER NOT NULL,
    key TEXT NOT NULL,
    model TEXT NOT NULL,
    node TEXT NOT NULL,
    affinity TEXT NOT NULL,
    runs INTEGER NOT NULL,
    errors INTEGER NOT NULL,
    input_tokens INTEGER NOT NULL,
    cached_input_tokens INTEGER NOT NULL,
    output_tokens INTEGER NOT NULL,
    reasoning_tokens INTEGER NOT NULL,
    PRIMARY KEY (bucket, start_ms, key, model, node, affinity)
) WITHOUT ROWID;
";

/// What schema 2 adds to a file of schema 1: packed events, and a run's first attempt and
/// first events in its own row.
const SCHEMA_1_TO_2: &str = "
ALTER TABLE events ADD COLUMN packed BLOB;
ALTER TABLE runs ADD COLUMN node TEXT;
ALTER TABLE runs ADD COLUMN route_reason TEXT;
ALTER TABLE runs ADD COLUMN started_ms INTEGER;
ALTER TABLE runs ADD COLUMN events_inline BLOB;
ALTER TABLE runs ADD COLUMN events_inline_count INTEGER NOT NULL DEFAULT 0;
";

/// What schema 4 adds to a file of schema 1 to 3: a run's deadline.
const SCHEMA_3_TO_4: &str = "ALTER TABLE runs ADD COLUMN deadline_ms INTEGER;";

/// What schema 5 adds to a file of schema 1 to 4: a run's client stream.
const SCHEMA_4_TO_5: &str = "ALTER TABLE runs ADD COLUMN client_stream TEXT;";

/// What schema 6 adds to a file of schema 1 to 5: a run's affinity source.
const SCHEMA_5_TO_6: &str = "ALTER TABLE runs ADD COLUMN affinity TEXT;";

/// What schema 6 does to the `usage` table of a file of schema 3 to 5: SQLite cannot
/// change a primary key, so the old table is set aside, `TABLES` creates the new one with
/// `affinity` in its key, and [`USAGE_5_COPIED`] moves the rows over.
const USAGE_5_SET_ASIDE: &str = "ALTER TABLE usage RENAME TO usage_5;";

/// The rows of a schema-5 `usage` table, copied with an empty (not known) source; the old
/// table dropped.
const USAGE_5_COPIED: &str = "
INSERT INTO usage SELECT bucket, start_ms, key, model, node, '', runs, errors,
    input_tokens, cached_input_tokens, output_tokens, reasoning_tokens FROM usage_5;
DROP TABLE usage_5;
";

/// Why the journal's file cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    /// SQLite refused (not a database, corrupt, unwritable, ...).
    #[error("cannot open the run journal {path}: {source}")]
    Sqlite {
        /// The file.
        path: String,
        /// What SQLite said.
        source: rusqlite::Error,
    },
    /// The file was written by a newer edge.
    #[error(
        "the run journal {path} has schema version {found}; this edge reads up to {SCHEMA_VERSION}"
    )]
    NewerSchema {
        /// The file.
        path: String,
        /// Its version.
        found: i64,
    },
    /// The directory or the lock file.
    #[error("cannot prepare the run journal {path}: {reason}")]
    Io {
        /// The file.
        path: String,
        /// What the operating system said.
        reason: std::io::Error,
    },
    /// Another process holds the journal.
    #[error("the run journal {path} is in use by another edge (its lock file {path}.lock is held)")]
    InUse {
        /// The file.
        path: String,
    },
}

/// The journal's file as the writer takes it over.
pub(super) struct Opened {
    pub(super) conn: Connection,
    /// The runs a previous edge left open (empty unless kept open for the edge to take
    /// back).
    pub(super) open: OpenRuns,
    /// How many runs left open were ended as unknown.
    pub(super) marked: usize,
    /// The number of the next batch row.
    pub(super) next_seq: i64,
}

/// Opens (creating if missing) the journal for writing, sets it up, rewrites a file of an
/// older schema into batches, and — unless `keep_open` (the edge takes them back, see
/// `SqliteJournal::open_adopting`) — ends the runs a previous edge left open with an
/// unknown outcome.
///
/// # Errors
/// [`OpenError`] naming the file.
pub(super) fn open_writer(
    path: &Path,
    budget: &Budget,
    keep_open: bool,
) -> Result<Opened, OpenError> {
    let name = path.display().to_string();
    let sqlite = |source| OpenError::Sqlite {
        path: name.clone(),
        source,
    };
    let mut conn = Connection::open(path).map_err(sqlite)?;
    conn.busy_timeout(BUSY_TIMEOUT).map_err(sqlite)?;
    // auto_vacuum only takes effect before the first table exists.
    conn.execute_batch("PRAGMA auto_vacuum = INCREMENTAL;")
        .map_err(sqlite)?;
    conn.pragma_update_and_check(None, "journal_mode", "WAL", |row| row.get::<_, String>(0))
        .map_err(sqlite)?;
    conn.pragma_update(None, "synchronous", "NORMAL")
        .map_err(sqlite)?;
    budget.apply(&conn).map_err(sqlite)?;
    let found: i64 = conn
        .pragma_query_value(None, "user_version", |row| row.get(0))
        .map_err(sqlite)?;
    if found > SCHEMA_VERSION {
        return Err(OpenError::NewerSchema { path: name, found });
    }
    upgrade(&mut conn, found).map_err(sqlite)?;
    migrate_rows(&mut conn).map_err(sqlite)?;
    let (mut open, mut next_seq) = fold_open(&conn).map_err(sqlite)?;
    let marked = if keep_open {
        0
    } else {
        end_left_open(&mut conn, &mut open, &mut next_seq).map_err(sqlite)?
    };
    Ok(Opened {
        conn,
        open,
        marked,
        next_seq,
    })
}

/// Runs still open in the file belonged to an edge that stopped without ending them: they
/// are written ended, outcome `unknown` with code `edge_crashed` (never `completed`), in
/// one batch row. Returns how many.
fn end_left_open(
    conn: &mut Connection,
    open: &mut OpenRuns,
    next_seq: &mut i64,
) -> rusqlite::Result<usize> {
    if open.is_empty() {
        return Ok(0);
    }
    let mut records: Vec<Stored> = open.drain().map(|(_, run)| run.stored).collect();
    records.sort_by_key(|s| s.record.accepted.queued_ms);
    for stored in &mut records {
        let record = &mut stored.record;
        record.outcome = RunOutcome::Unknown;
        record.code = Some(EDGE_CRASHED.to_owned());
        record.message =
            Some("the edge stopped before this run ended; how it ended is not known".to_owned());
        record.events = record.events.max(record.events_stored);
    }
    let count = records.len();
    let row = BatchRow::of_records(*next_seq, records, Vec::new(), &[]);
    let tx = conn.transaction()?;
    row.insert(&tx, now_ms(), *next_seq)?;
    tx.commit()?;
    *next_seq += 1;
    Ok(count)
}

/// Brings a file of schema `found` (0: a new file) to [`SCHEMA_VERSION`]'s tables, in one
/// transaction: a failure leaves the file as it was. The rows of an older schema are
/// rewritten afterwards (`migrate_rows`).
fn upgrade(conn: &mut Connection, found: i64) -> rusqlite::Result<()> {
    let tx = conn.transaction()?;
    if found == 1 {
        tx.execute_batch(SCHEMA_1_TO_2)?;
    }
    if (1..4).contains(&found) {
        tx.execute_batch(SCHEMA_3_TO_4)?;
    }
    if (1..5).contains(&found) {
        tx.execute_batch(SCHEMA_4_TO_5)?;
    }
    if (1..6).contains(&found) {
        tx.execute_batch(SCHEMA_5_TO_6)?;
    }
    // Schema 3 created `usage`; older files get it from `TABLES`, as new files do.
    let rebuild_usage = (3..6).contains(&found);
    if rebuild_usage {
        tx.execute_batch(USAGE_5_SET_ASIDE)?;
    }
    tx.execute_batch(TABLES)?;
    if rebuild_usage {
        tx.execute_batch(USAGE_5_COPIED)?;
    }
    tx.pragma_update(None, "user_version", SCHEMA_VERSION)?;
    tx.commit()
}

/// Opens a read-only connection to the journal.
pub(super) fn open_reader(path: &Path) -> rusqlite::Result<Connection> {
    let flags = OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX;
    let conn = Connection::open_with_flags(path, flags)?;
    conn.busy_timeout(BUSY_TIMEOUT)?;
    Ok(conn)
}
