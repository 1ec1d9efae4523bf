//! Retention: batch rows (`log.rs`) older than `retention_max_age` are removed, and when
//! the data nears its share of `retention_max_bytes` the oldest go first, down to a lower
//! mark (`budget.rs` sets both) — with them the runs they ended and the events they hold.
//! A batch an open run's events start in, or any after it, is never removed (the writer
//! carries such runs forward when they are all that is left, see `writer.rs`). Work is done
//! in chunks, each its own transaction, between write batches, so retention never holds up
//! the relay's entries for long.

use std::time::Duration;

use rusqlite::{Connection, params};

use super::config::JournalConfig;
use super::sql::{to_sql, used_bytes, vacuum_free_pages};

/// Batch rows removed per transaction, at most.
const CHUNK: i64 = 64;

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

/// What one chunk of retention removed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(super) struct Removed {
    /// Batch rows.
    pub(super) batches: usize,
    /// Runs they ended.
    pub(super) runs: usize,
}

/// Removes one chunk of the oldest batch rows that retention no longer keeps — too old, or
/// the oldest while the pages in use are over `size_target` — but none from `open_from` on.
///
/// # Errors
/// What SQLite reported; nothing of the chunk is removed then.
pub(super) fn retention_chunk(
    conn: &Connection,
    retention: &Retention,
    now_ms: u64,
    size_target: Option<u64>,
    open_from: i64,
) -> rusqlite::Result<Removed> {
    let oldest = |count: i64| -> rusqlite::Result<Vec<(i64, i64, i64)>> {
        let mut statement = conn.prepare_cached(
            "SELECT seq, ended_count, newest_ms FROM batches WHERE seq < ?1 ORDER BY seq LIMIT ?2",
        )?;
        let rows = statement.query_map(params![open_from, count], |row| {
            Ok((row.get(0)?, row.get(1)?, row.get(2)?))
        })?;
        rows.collect()
    };
    let mut chosen = Vec::new();
    if !retention.max_age.is_zero() {
        let max_age_ms = u64::try_from(retention.max_age.as_millis()).unwrap_or(u64::MAX);
        let cutoff = to_sql(now_ms.saturating_sub(max_age_ms));
        chosen = oldest(CHUNK)?;
        let expired = chosen
            .iter()
            .take_while(|(_, _, newest)| *newest < cutoff)
            .count();
        chosen.truncate(expired);
    }
    if let Some(target) = size_target.filter(|_| chosen.is_empty()) {
        let used = used_bytes(conn)?;
        if used > target {
            chosen = oldest(over_size(conn, used, target)?)?;
        }
    }
    let Some(&(last, _, _)) = chosen.last() else {
        return Ok(Removed::default());
    };
    conn.prepare_cached("DELETE FROM batches WHERE seq <= ?1")?
        .execute([last])?;
    if size_target.is_none() {
        // Hand the freed pages back to the file system. Not while making room under the
        // disk limit: the pages are reused at once, and moving them to shrink the file would
        // cost as much again.
        vacuum_free_pages(conn)?;
    }
    Ok(Removed {
        batches: chosen.len(),
        runs: chosen
            .iter()
            .map(|(_, runs, _)| usize::try_from(*runs).unwrap_or(0))
            .sum(),
    })
}

/// How many of the oldest batch rows to remove next for the data to shrink from `used` to
/// `max` bytes, assuming rows of average size: at least 1, at most a chunk.
fn over_size(conn: &Connection, used: u64, max: u64) -> rusqlite::Result<i64> {
    let batches: i64 = conn
        .prepare_cached("SELECT count(*) FROM batches")?
        .query_row([], |row| row.get(0))?;
    let excess = (used - max) as f64 / used as f64;
    let count = (batches as f64 * excess).ceil() as i64;
    Ok(count.clamp(1, CHUNK))
}
