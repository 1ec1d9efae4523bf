//! Retention: finished runs older than `retention_max_age` are removed, and when the data
//! nears its share of `retention_max_bytes` the oldest finished runs go first, down to a
//! lower mark (`budget.rs` sets both). Open runs are never removed. Work is done in chunks, each its
//! own transaction, between write batches, so retention never holds up the relay's entries
//! for long.

use std::time::Duration;

use rusqlite::{Connection, params_from_iter};

use super::config::JournalConfig;
use super::schema::{used_bytes, vacuum_free_pages};
use super::writer::to_sql;

/// Runs removed per transaction.
const CHUNK: usize = 500;

/// What retention keeps.
#[derive(Debug, Clone, Copy)]
pub(super) struct Retention {
    /// Finished runs older than this are removed; zero for no age limit.
    pub(super) max_age: Duration,
    /// Hourly and daily usage rows older than this are removed; zero for no age limit.
    pub(super) usage_max_age: Duration,
    /// Per-minute usage rows older than this are removed; zero for no age limit.
    pub(super) usage_minute_max_age: Duration,
}

impl Retention {
    /// What `config` keeps.
    pub(super) fn of(config: &JournalConfig) -> Self {
        Self {
            max_age: config.retention_max_age.0,
            usage_max_age: config.usage_retention_max_age.0,
            usage_minute_max_age: config.usage_minute_max_age.0,
        }
    }
}

/// Removes the usage rollups older than their retention (a range of the primary key per
/// bucket size, so cheap) and returns how many rows.
///
/// # Errors
/// What SQLite reported.
pub(super) fn expire_usage(
    conn: &Connection,
    retention: &Retention,
    now_ms: u64,
) -> rusqlite::Result<usize> {
    let mut removed = 0;
    for (buckets, age) in [
        (&["minute"][..], retention.usage_minute_max_age),
        (&["hour", "day"][..], retention.usage_max_age),
    ] {
        if age.is_zero() {
            continue;
        }
        let age_ms = u64::try_from(age.as_millis()).unwrap_or(u64::MAX);
        let cutoff = to_sql(now_ms.saturating_sub(age_ms));
        for bucket in buckets {
            removed += conn
                .prepare_cached("DELETE FROM usage WHERE bucket = ?1 AND start_ms < ?2")?
                .execute(rusqlite::params![bucket, cutoff])?;
        }
    }
    Ok(removed)
}

/// Removes one chunk of runs that retention no longer keeps — too old, or the oldest while
/// the pages in use are over `size_target` — and returns how many.
///
/// # Errors
/// What SQLite reported; nothing of the chunk is removed then.
pub(super) fn retention_chunk(
    conn: &mut Connection,
    retention: &Retention,
    now_ms: u64,
    size_target: Option<u64>,
) -> rusqlite::Result<usize> {
    let mut seqs = Vec::new();
    if !retention.max_age.is_zero() {
        let max_age_ms = u64::try_from(retention.max_age.as_millis()).unwrap_or(u64::MAX);
        let cutoff = to_sql(now_ms.saturating_sub(max_age_ms));
        seqs = select(
            conn,
            "SELECT seq FROM runs WHERE outcome != 'open' AND coalesce(finished_ms, queued_ms) < ?2
             ORDER BY seq LIMIT ?1",
            &[CHUNK as i64, cutoff],
        )?;
    }
    if let Some(target) = size_target.filter(|_| seqs.is_empty()) {
        let used = used_bytes(conn)?;
        if used > target {
            let count = over_size(conn, used, target)?;
            seqs = select(
                conn,
                "SELECT seq FROM runs WHERE outcome != 'open' ORDER BY seq LIMIT ?1",
                &[count],
            )?;
        }
    }
    if seqs.is_empty() {
        return Ok(0);
    }
    let marks = vec!["?"; seqs.len()].join(",");
    let tx = conn.transaction()?;
    for table in ["events", "attempts"] {
        tx.execute(
            &format!("DELETE FROM {table} WHERE run_seq IN ({marks})"),
            params_from_iter(&seqs),
        )?;
    }
    tx.execute(
        &format!("DELETE FROM runs WHERE seq IN ({marks})"),
        params_from_iter(&seqs),
    )?;
    tx.commit()?;
    if size_target.is_none() {
        // Hand the freed pages back to the file system. Not while making room under the
        // disk limit: the pages are reused at once, and moving them to shrink the file would
        // cost as much again.
        vacuum_free_pages(conn)?;
    }
    Ok(seqs.len())
}

/// How many of the oldest finished runs to remove next for the data to shrink from `used`
/// to `max` bytes, assuming runs of average size: at least 1, at most a chunk.
fn over_size(conn: &Connection, used: u64, max: u64) -> rusqlite::Result<i64> {
    let finished: i64 = conn
        .prepare_cached("SELECT count(*) FROM runs WHERE outcome != 'open'")?
        .query_row([], |row| row.get(0))?;
    let excess = (used - max) as f64 / used as f64;
    let count = (finished as f64 * excess).ceil() as i64;
    Ok(count.clamp(1, CHUNK as i64))
}

fn select(conn: &Connection, sql: &str, values: &[i64]) -> rusqlite::Result<Vec<i64>> {
    let mut statement = conn.prepare_cached(sql)?;
    let rows = statement.query_map(params_from_iter(values), |row| row.get(0))?;
    rows.collect()
}
