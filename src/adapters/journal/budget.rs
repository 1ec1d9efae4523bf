//! The journal's disk budget: `retention_max_bytes` bounds the database file, its WAL and
//! its shared-memory index together, at all times, not only after a retention pass.
//!
//! The limit is split once: the WAL may hold an eighth of it (at least 512 KiB, at most
//! 64 MiB) and is checkpointed at half of that and truncated back to it, the index takes a
//! fixed allowance, and the database file gets the rest as SQLite's `max_page_count`, so a
//! transaction that would grow the file past it fails (`SQLITE_FULL`) instead. Retention
//! removes the oldest finished runs once the pages in use pass nine tenths of the file's
//! share, down to three quarters, so that failure is the exception; when it happens the
//! writer makes room and tries again (see `writer.rs`).

use std::path::{Path, PathBuf};

use rusqlite::Connection;

/// The smallest limit that leaves room to work in: the WAL's and the index's shares and a
/// database of a few hundred pages.
pub(crate) const MIN_LIMIT: u64 = 4 << 20;

/// Room for the WAL's shared-memory index (`-shm`): 32 KiB per 4,096 WAL pages; a WAL of
/// 64 MiB needs 2 pages of it.
const SHM_ALLOWANCE: u64 = 128 << 10;

/// How the limit is shared out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Budget {
    /// The whole limit, in bytes; 0 for none.
    pub(super) limit: u64,
    /// The WAL's share.
    pub(super) wal: u64,
    /// The database file's share.
    pub(super) database: u64,
}

impl Budget {
    /// The shares of `limit` (0: no limit, and a WAL of 64 MiB at most).
    pub(super) fn of(limit: u64) -> Self {
        let wal = if limit == 0 {
            64 << 20
        } else {
            (limit / 8).clamp(512 << 10, 64 << 20)
        };
        let database = limit.saturating_sub(wal + SHM_ALLOWANCE);
        Self {
            limit,
            wal,
            database,
        }
    }

    /// Sets the pragmas that keep the file and the WAL within their shares.
    ///
    /// # Errors
    /// What SQLite reported.
    pub(super) fn apply(&self, conn: &Connection) -> rusqlite::Result<()> {
        let page_size: i64 = conn.pragma_query_value(None, "page_size", |row| row.get(0))?;
        let page_size = u64::try_from(page_size).unwrap_or(4096);
        conn.pragma_update(None, "journal_size_limit", to_i64(self.wal))?;
        let checkpoint_pages = (self.wal / 2 / page_size.max(1)).max(16);
        conn.pragma_update(None, "wal_autocheckpoint", to_i64(checkpoint_pages))?;
        if self.limit > 0 {
            // SQLite keeps the file's current size if it is larger; retention then brings
            // the data down and a vacuum hands the pages back.
            let pages = (self.database / page_size.max(1)).max(1);
            conn.pragma_update(None, "max_page_count", to_i64(pages))?;
        }
        Ok(())
    }

    /// Whether the pages in use call for removing runs now.
    pub(super) fn over_high_mark(&self, used: u64) -> bool {
        self.limit > 0 && used > self.database / 10 * 9
    }

    /// What retention brings the pages in use down to once it starts.
    pub(super) fn low_mark(&self) -> u64 {
        self.database / 4 * 3
    }
}

/// The journal's three files and what they take on disk.
#[derive(Debug, Clone)]
pub(super) struct Files {
    database: PathBuf,
    wal: PathBuf,
    shm: PathBuf,
}

impl Files {
    pub(super) fn of(database: &Path) -> Self {
        let beside = |suffix: &str| {
            let mut path = database.as_os_str().to_owned();
            path.push(suffix);
            PathBuf::from(path)
        };
        Self {
            database: database.to_owned(),
            wal: beside("-wal"),
            shm: beside("-shm"),
        }
    }

    /// The WAL's size in bytes (0 when it does not exist).
    pub(super) fn wal_bytes(&self) -> u64 {
        size(&self.wal)
    }

    /// The three files' sizes added up.
    pub(super) fn total_bytes(&self) -> u64 {
        size(&self.database) + size(&self.wal) + size(&self.shm)
    }
}

fn size(path: &Path) -> u64 {
    std::fs::metadata(path).map_or(0, |m| m.len())
}

fn to_i64(value: u64) -> i64 {
    i64::try_from(value).unwrap_or(i64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_shares_add_up_to_the_limit() {
        for limit in [MIN_LIMIT, 64 << 20, 1 << 30, 1 << 40] {
            let budget = Budget::of(limit);
            assert!(
                budget.wal + budget.database + SHM_ALLOWANCE <= limit,
                "{budget:?}"
            );
            assert!(budget.database >= limit / 2, "{budget:?}");
            assert!(budget.low_mark() < budget.database / 10 * 9);
        }
        assert_eq!(Budget::of(1 << 30).wal, 64 << 20);
        assert_eq!(Budget::of(MIN_LIMIT).wal, 512 << 10);
        assert!(!Budget::of(0).over_high_mark(u64::MAX));
    }
}
