//! The journal's SQL helpers, shared by the modules that read and write the file: how a
//! `u64` is stored in a signed SQLite integer and read back, how a row that does not decode
//! becomes an error, and how big the database is and how it hands free pages back. It holds
//! no tables and no statements of the log itself (`log.rs`, `schema.rs`).

use rusqlite::Connection;

/// SQLite integers are signed: times and counts past `i64::MAX` are clamped.
pub(super) fn to_sql(value: u64) -> i64 {
    i64::try_from(value).unwrap_or(i64::MAX)
}

/// A stored time or count back: a negative one (never written) reads as 0.
pub(super) fn from_sql(value: i64) -> u64 {
    u64::try_from(value).unwrap_or(0)
}

/// A row that does not decode, as the error a damaged column gives.
pub(super) fn damaged(error: impl std::fmt::Display) -> rusqlite::Error {
    rusqlite::Error::InvalidColumnType(0, error.to_string(), rusqlite::types::Type::Blob)
}

/// Hands every free page back to the file system. SQLite frees one page per step of
/// `PRAGMA incremental_vacuum`, so it is stepped to the end (a single execute frees one).
pub(super) fn vacuum_free_pages(conn: &Connection) -> rusqlite::Result<()> {
    let mut statement = conn.prepare_cached("PRAGMA incremental_vacuum")?;
    let mut rows = statement.query([])?;
    while rows.next()?.is_some() {}
    Ok(())
}

/// The bytes the data takes: pages in use, free pages not counted.
pub(super) fn used_bytes(conn: &Connection) -> rusqlite::Result<u64> {
    page_bytes(conn, true)
}

/// The bytes the database's pages take, free ones included (what the file will hold once
/// the WAL is checkpointed).
pub(super) fn file_bytes(conn: &Connection) -> rusqlite::Result<u64> {
    page_bytes(conn, false)
}

fn page_bytes(conn: &Connection, in_use_only: bool) -> rusqlite::Result<u64> {
    let value = |name: &str| -> rusqlite::Result<i64> {
        conn.pragma_query_value(None, name, |row| row.get(0))
    };
    let free = if in_use_only {
        value("freelist_count")?
    } else {
        0
    };
    let pages = value("page_count")? - free;
    Ok(u64::try_from(pages * value("page_size")?).unwrap_or(0))
}
