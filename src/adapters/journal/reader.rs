//! Reads for the management API: run records, listings and stored events from the batch
//! rows (`log.rs`), on read-only connections (WAL lets them read while the writer writes)
//! taken from a small pool. Each read is one read transaction, so it sees one state of the
//! file. Every call blocks: the journal runs them on the blocking pool.

use std::path::PathBuf;
use std::sync::Mutex;

use rusqlite::{Connection, params};

use super::bloom::IdFilter;
use super::frames::{Frame, Stored, read_frames, read_records};
use super::log::query_facets;
use super::packed::{RunIdentity, unpack};
use super::schema::open_reader;
use super::sql::{damaged, from_sql, to_sql};
use crate::domain::{Attempt, RunId, RunQuery, RunRecord, RunStateFilter};
use crate::ports::{JournalError, StoredEvent};

/// Idle read connections kept for the next read.
const POOL_SIZE: usize = 4;

/// Read connections to one journal file.
pub(super) struct Reader {
    path: PathBuf,
    idle: Mutex<Vec<Connection>>,
}

impl Reader {
    pub(super) fn new(path: PathBuf) -> Self {
        Self {
            path,
            idle: Mutex::new(Vec::new()),
        }
    }

    /// Runs `read` on a pooled connection.
    pub(super) fn with<T>(
        &self,
        read: impl FnOnce(&Connection) -> rusqlite::Result<T>,
    ) -> Result<T, JournalError> {
        let taken = self.idle.lock().unwrap_or_else(|p| p.into_inner()).pop();
        let conn = match taken {
            Some(conn) => conn,
            None => open_reader(&self.path).map_err(storage)?,
        };
        let result = read(&conn).map_err(storage);
        let mut idle = self.idle.lock().unwrap_or_else(|p| p.into_inner());
        if idle.len() < POOL_SIZE {
            idle.push(conn);
        }
        result
    }

    /// The record of `id`, open or finished.
    pub(super) fn run(&self, id: &RunId) -> Result<Option<RunRecord>, JournalError> {
        self.with(|conn| {
            let tx = conn.unchecked_transaction()?;
            Ok(locate(&tx, id)?.map(|found| found.stored.record))
        })
    }

    /// Finished runs matching `query`, newest first: the batches are read by the newest
    /// acceptance time among the runs they ended, down to where no batch can hold a run
    /// newer than the page's last; a batch whose facet filter lacks a value the query
    /// asks for is not decoded.
    pub(super) fn finished_runs(&self, query: &RunQuery) -> Result<Vec<RunRecord>, JournalError> {
        let mut wanted = query.clone();
        wanted.state = RunStateFilter::Finished;
        let facets = query_facets(query);
        let since = to_sql(query.since_ms.unwrap_or(0));
        let before = to_sql(query.after.as_ref().map_or(u64::MAX, |a| a.queued_ms));
        self.with(|conn| {
            let tx = conn.unchecked_transaction()?;
            let mut statement = tx.prepare_cached(
                "SELECT seq, ended_to_ms, facets FROM batches WHERE ended_to_ms IS NOT NULL
                    AND ended_to_ms >= ?1 AND ended_from_ms <= ?2 ORDER BY ended_to_ms DESC",
            )?;
            let mut rows = statement.query(params![since, before])?;
            let mut runs: Vec<RunRecord> = Vec::new();
            while let Some(row) = rows.next()? {
                let newest = from_sql(row.get(1)?);
                let full = runs.len() >= query.limit;
                if full
                    && runs
                        .last()
                        .is_some_and(|last| newest < last.accepted.queued_ms)
                {
                    break;
                }
                let filter = IdFilter::from_bytes(row.get(2)?);
                if !facets
                    .iter()
                    .all(|(tag, value)| filter.may_hold_tagged(*tag, value))
                {
                    continue;
                }
                let ended: Vec<u8> = tx
                    .prepare_cached("SELECT ended FROM batches WHERE seq = ?1")?
                    .query_row([row.get::<_, i64>(0)?], |row| row.get(0))?;
                let records = read_records(&ended).map_err(damaged)?;
                runs.extend(
                    records
                        .into_iter()
                        .map(|stored| stored.record)
                        .filter(|record| wanted.matches(record)),
                );
                runs.sort_by_key(|r| std::cmp::Reverse(r.cursor()));
                runs.truncate(query.limit);
            }
            Ok(runs)
        })
    }

    /// Stored events of `id` from position `from`, at most `limit`.
    pub(super) fn events(
        &self,
        id: &RunId,
        from: u64,
        limit: usize,
    ) -> Result<Vec<StoredEvent>, JournalError> {
        self.with(|conn| {
            let tx = conn.unchecked_transaction()?;
            let Some(found) = locate(&tx, id)? else {
                return Ok(Vec::new());
            };
            let accepted = &found.stored.record.accepted;
            let run = RunIdentity {
                run_id: id.clone(),
                adapter: accepted.adapter.clone(),
                target: accepted.target.clone(),
            };
            let mut chunks: Vec<(u64, Vec<u8>)> = Vec::new();
            let mut statement = tx.prepare_cached(
                "SELECT seq, ids FROM batches WHERE seq >= ?1 AND seq <= ?2 ORDER BY seq",
            )?;
            let mut rows = statement.query(params![found.stored.events_from, found.last])?;
            while let Some(row) = rows.next()? {
                if !IdFilter::from_bytes(row.get(1)?).may_hold(id.as_str()) {
                    continue;
                }
                let frames: Vec<u8> = tx
                    .prepare_cached("SELECT frames FROM batches WHERE seq = ?1")?
                    .query_row([row.get::<_, i64>(0)?], |row| row.get(0))?;
                for frame in read_frames(&frames).map_err(damaged)? {
                    if let Frame::Events(chunk) = frame
                        && chunk.run_id == id.as_str()
                        && chunk.first_idx + chunk.count > from
                    {
                        chunks.push((chunk.first_idx, chunk.packed.to_vec()));
                    }
                }
            }
            chunks.sort_by_key(|(first, _)| *first);
            let mut events = Vec::new();
            for (first, packed) in chunks {
                if events.len() >= limit {
                    break;
                }
                let lines = unpack(&packed, &run).map_err(damaged)?;
                let room = limit - events.len();
                events.extend(
                    lines
                        .into_iter()
                        .zip(first..)
                        .filter(|(_, index)| *index >= from)
                        .take(room)
                        .map(|(json, index)| StoredEvent { index, json }),
                );
            }
            Ok(events)
        })
    }
}

/// Run `id` as the batches hold it: its record (open or ended), the batch its events start
/// in, and the last batch that can hold any of them.
struct Found {
    stored: Stored,
    last: i64,
}

/// Finds run `id` by reading the batches that may hold it, newest first: the record a
/// batch ended it with, or the snapshot a batch left it open with and what later batches
/// added (placements, events).
fn locate(conn: &Connection, id: &RunId) -> rusqlite::Result<Option<Found>> {
    let mut statement = conn.prepare_cached("SELECT seq, ids FROM batches ORDER BY seq DESC")?;
    let mut rows = statement.query([])?;
    let mut newest = None;
    let mut placed: Vec<Attempt> = Vec::new();
    let mut later_events = 0;
    let mut first_output_ms = None;
    while let Some(row) = rows.next()? {
        let seq: i64 = row.get(0)?;
        newest.get_or_insert(seq);
        if !IdFilter::from_bytes(row.get(1)?).may_hold(id.as_str()) {
            continue;
        }
        let column = |sql: &str| -> rusqlite::Result<Vec<u8>> {
            conn.prepare_cached(sql)?.query_row([seq], |row| row.get(0))
        };
        let ended = column("SELECT ended FROM batches WHERE seq = ?1")?;
        let records = read_records(&ended).map_err(damaged)?;
        if let Some(stored) = records.into_iter().find(|s| s.record.run_id() == id) {
            return Ok(Some(Found { stored, last: seq }));
        }
        let frames = column("SELECT frames FROM batches WHERE seq = ?1")?;
        // A snapshot says how the run stood at the end of its batch: what the same batch
        // added is in it already.
        let mut batch_placed = Vec::new();
        let (mut batch_events, mut batch_first_output) = (0, None);
        for frame in read_frames(&frames).map_err(damaged)? {
            match frame {
                Frame::Open(mut stored) if stored.record.run_id() == id => {
                    let record = &mut stored.record;
                    record.attempts.append(&mut placed);
                    record.attempts.sort_by_key(|a| a.number);
                    record.events_stored += later_events;
                    record.events = record.events.max(record.events_stored);
                    if record.first_output_ms.is_none() {
                        record.first_output_ms = first_output_ms;
                    }
                    return Ok(Some(Found {
                        stored: *stored,
                        last: newest.unwrap_or(seq),
                    }));
                }
                Frame::Placed { run_id, attempt } if run_id == id.as_str() => {
                    batch_placed.push(attempt);
                }
                Frame::Events(chunk) if chunk.run_id == id.as_str() => {
                    batch_events += chunk.count;
                    batch_first_output = batch_first_output.or(chunk.first_output_ms);
                }
                _ => {}
            }
        }
        placed.append(&mut batch_placed);
        later_events += batch_events;
        first_output_ms = batch_first_output.or(first_output_ms);
    }
    Ok(None)
}

/// A failed read as the port's error: damaged data apart from a storage that may answer
/// later.
fn storage(error: rusqlite::Error) -> JournalError {
    use rusqlite::ErrorCode::{DatabaseCorrupt, NotADatabase};
    let damaged = match &error {
        rusqlite::Error::SqliteFailure(failure, _) => {
            matches!(failure.code, DatabaseCorrupt | NotADatabase)
        }
        rusqlite::Error::InvalidColumnType(..)
        | rusqlite::Error::FromSqlConversionFailure(..)
        | rusqlite::Error::IntegralValueOutOfRange(..)
        | rusqlite::Error::Utf8Error(..) => true,
        _ => false,
    };
    if damaged {
        JournalError::Damaged(error.to_string())
    } else {
        JournalError::Unavailable(error.to_string())
    }
}
