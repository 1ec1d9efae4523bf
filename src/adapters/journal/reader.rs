//! Reads for the management API: run records, listings and stored events, on read-only
//! connections (WAL lets them read while the writer writes) taken from a small pool.
//! Every call blocks: the journal runs them on the blocking pool.

use std::path::PathBuf;
use std::sync::Mutex;

use rusqlite::types::Value;
use rusqlite::{Connection, OptionalExtension, Row, params};

use super::packed::{RunIdentity, unpack};
use super::schema::open_reader;
use super::writer::to_sql;
use crate::domain::routing::KeySource;
use crate::domain::{
    AcceptedRun, AdapterName, Attempt, NodeId, Operation, RunId, RunOutcome, RunQuery, RunRecord,
    Target, Usage,
};
use crate::ports::{JournalError, StoredEvent};

/// Idle read connections kept for the next read.
const POOL_SIZE: usize = 4;

const RUN_COLUMNS: &str = "seq, run_id, adapter, target, operation, pin, api_key_name, queued_ms,
    first_output_ms, finished_ms, outcome, code, message, finish_reason, input_tokens,
    output_tokens, cached_input_tokens, reasoning_tokens, events, events_stored, node,
    route_reason, started_ms, deadline_ms, client_stream, affinity";

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

    /// The record of `id`.
    pub(super) fn run(&self, id: &RunId) -> Result<Option<RunRecord>, JournalError> {
        self.with(|conn| {
            let sql = format!("SELECT {RUN_COLUMNS} FROM runs WHERE run_id = ?1");
            let found = conn
                .prepare_cached(&sql)?
                .query_row([id.as_str()], read_run)
                .optional()?;
            found
                .map(|(seq, run)| with_attempts(conn, seq, run))
                .transpose()
        })
    }

    /// The runs the file holds as open, oldest first: an edge stopped without ending them.
    pub(super) fn left_open(&self) -> Result<Vec<RunRecord>, JournalError> {
        self.with(|conn| {
            let sql = format!("SELECT {RUN_COLUMNS} FROM runs WHERE outcome = 'open' ORDER BY seq");
            let mut statement = conn.prepare(&sql)?;
            let runs: Vec<(i64, RunRecord)> = statement
                .query_map([], read_run)?
                .collect::<rusqlite::Result<_>>()?;
            runs.into_iter()
                .map(|(seq, run)| with_attempts(conn, seq, run))
                .collect()
        })
    }

    /// Finished runs matching `query`, newest first.
    pub(super) fn finished_runs(&self, query: &RunQuery) -> Result<Vec<RunRecord>, JournalError> {
        let (sql, values) = listing_sql(query);
        self.with(|conn| {
            let mut statement = conn.prepare_cached(&sql)?;
            let rows = statement.query_map(rusqlite::params_from_iter(values), read_run)?;
            let runs: Vec<(i64, RunRecord)> = rows.collect::<rusqlite::Result<_>>()?;
            runs.into_iter()
                .map(|(seq, run)| with_attempts(conn, seq, run))
                .collect()
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
            let found = conn
                .prepare_cached(
                    "SELECT seq, adapter, target, events_inline FROM runs WHERE run_id = ?1",
                )?
                .query_row([id.as_str()], |row| {
                    let identity = identity(id, row.get(1)?, row.get(2)?)?;
                    let inline: Option<Vec<u8>> = row.get(3)?;
                    Ok((row.get::<_, i64>(0)?, identity, inline))
                })
                .optional()?;
            let Some((seq, run, inline)) = found else {
                return Ok(Vec::new());
            };
            let mut events = Vec::new();
            let keep = |lines: Vec<String>, first: u64, events: &mut Vec<StoredEvent>| {
                let room = limit.saturating_sub(events.len());
                events.extend(
                    lines
                        .into_iter()
                        .zip(first..)
                        .filter(|(_, index)| *index >= from)
                        .take(room)
                        .map(|(json, index)| StoredEvent { index, json }),
                );
            };
            if let Some(packed) = inline {
                keep(unpack_row(&packed, &run)?, 0, &mut events);
            }
            let mut statement = conn.prepare_cached(
                "SELECT first_idx, json, packed FROM events
                 WHERE run_seq = ?1 AND first_idx + count > ?2 ORDER BY first_idx",
            )?;
            let mut rows = statement.query(params![seq, to_sql(from)])?;
            while events.len() < limit
                && let Some(row) = rows.next()?
            {
                let first = from_sql(row.get(0)?);
                let lines = match row.get_ref(2)?.as_blob_or_null()? {
                    Some(packed) => unpack_row(packed, &run)?,
                    None => row
                        .get::<_, String>(1)?
                        .split('\n')
                        .map(str::to_owned)
                        .collect(),
                };
                keep(lines, first, &mut events);
            }
            Ok(events)
        })
    }
}

/// What every event of run `id` shares, from its row's adapter and target.
fn identity(id: &RunId, adapter: String, target: String) -> rusqlite::Result<RunIdentity> {
    Ok(RunIdentity {
        run_id: id.clone(),
        adapter: AdapterName::parse(&adapter).map_err(|_| bad_row("adapter", &adapter))?,
        target: Target::parse(&target).map_err(|_| bad_row("target", &target))?,
    })
}

/// The JSON lines of packed events (schema 2).
fn unpack_row(packed: &[u8], run: &RunIdentity) -> rusqlite::Result<Vec<String>> {
    unpack(packed, run).map_err(|damaged| bad_row("events", &damaged.to_string()))
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

/// The listing's SQL and its parameters, in order.
fn listing_sql(query: &RunQuery) -> (String, Vec<Value>) {
    let mut sql = format!("SELECT {RUN_COLUMNS} FROM runs WHERE outcome != 'open'");
    let mut values: Vec<Value> = Vec::new();
    let mut filter = |clause: &str, value: Value| {
        values.push(value);
        sql.push_str(&clause.replace('?', &format!("?{}", values.len())));
    };
    if let Some(adapter) = &query.adapter {
        filter(" AND adapter = ?", adapter.as_str().to_owned().into());
    }
    if let Some(target) = &query.target {
        filter(" AND target = ?", target.as_str().to_owned().into());
    }
    if let Some(outcome) = query.outcome {
        filter(" AND outcome = ?", outcome.as_str().to_owned().into());
    }
    if let Some(key) = &query.api_key_name {
        filter(" AND api_key_name = ?", key.clone().into());
    }
    if let Some(since) = query.since_ms {
        filter(" AND queued_ms >= ?", to_sql(since).into());
    }
    if let Some(node) = &query.node {
        // A run's first attempt is in its own row, later ones (and, in files of schema 1,
        // every one) in `attempts`.
        filter(" AND (node = ?", node.as_str().to_owned().into());
        filter(
            " OR seq IN (SELECT run_seq FROM attempts WHERE node = ?))",
            node.as_str().to_owned().into(),
        );
    }
    if let Some(after) = &query.after {
        // A row value: SQLite walks the (queued_ms, run_id) index from the cursor on.
        filter(
            " AND (queued_ms, run_id) < (?",
            to_sql(after.queued_ms).into(),
        );
        filter(", ?)", after.run_id.as_str().to_owned().into());
    }
    let limit = i64::try_from(query.limit).unwrap_or(i64::MAX);
    filter(
        " ORDER BY queued_ms DESC, run_id DESC LIMIT ?",
        limit.into(),
    );
    (sql, values)
}

fn from_sql(value: i64) -> u64 {
    u64::try_from(value).unwrap_or(0)
}

fn bad_row(what: &str, value: &str) -> rusqlite::Error {
    rusqlite::Error::InvalidColumnType(0, format!("{what} {value:?}"), rusqlite::types::Type::Text)
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

fn with_attempts(conn: &Connection, seq: i64, mut run: RunRecord) -> rusqlite::Result<RunRecord> {
    let mut statement = conn.prepare_cached(
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
        run.attempts.push(attempt?);
    }
    run.attempts.sort_by_key(|a| a.number);
    Ok(run)
}

fn operation(name: &str) -> Operation {
    match name {
        "chat" => Operation::Chat,
        "completion" => Operation::Completion,
        "embeddings" => Operation::Embeddings,
        "tokenize" => Operation::Tokenize,
        "detokenize" => Operation::Detokenize,
        _ => Operation::Unspecified,
    }
}
