//! Settings of the run journal (`[journal]` in the config file).

use std::fmt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;

use super::budget::MIN_LIMIT;
use serde::de::{self, Deserializer, Visitor};

/// The shortest retention of hourly and daily usage: a month and a day.
const MIN_USAGE_RETENTION: Duration = Duration::from_secs(32 * 86_400);

/// `[journal]`: whether runs are recorded on disk, where, for how long and how writes are
/// batched.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct JournalConfig {
    /// `false` keeps nothing: only open runs are known, as before the journal existed.
    pub enabled: bool,
    /// The SQLite database file; its directory is created if missing. `-wal`, `-shm` and
    /// `.lock` files sit beside it. When not set, `journal.sqlite3` in the edge's data
    /// directory (`[edge] data_dir`, `--data-dir`).
    pub path: Option<PathBuf>,
    /// Events kept per run; the terminal event is always kept, even past the cap.
    pub max_events_per_run: u64,
    /// Finished runs older than this are removed; `0` keeps them regardless of age.
    pub retention_max_age: HumanDuration,
    /// When the data grows past this many bytes, the oldest finished runs are removed
    /// until it fits; `0` for no limit.
    pub retention_max_bytes: u64,
    /// Entries (records and events) waiting to be written; when full, new non-terminal
    /// events are left out (records and terminal events are always admitted).
    pub queue_capacity: usize,
    /// Hourly and daily usage rollups older than this are removed; `0` keeps them. At
    /// least 32 days, so a monthly budget is loaded whole at start.
    pub usage_retention_max_age: HumanDuration,
    /// Per-minute usage rollups older than this are removed; `0` keeps them.
    pub usage_minute_max_age: HumanDuration,
    /// The most entries written in one transaction.
    pub batch_max: usize,
    /// After a batch that did not fill, the writer waits this long for more before the
    /// next transaction, so a trickle of events does not cost one commit each.
    pub batch_linger_ms: u64,
    /// The longest an open run's events are held back so they are written together (one
    /// row per run, or per this interval for long runs) rather than one row per
    /// transaction; `0` writes them with the next transaction.
    pub open_events_hold_ms: u64,
}

impl Default for JournalConfig {
    fn default() -> Self {
        Self {
            enabled: true,
            path: None,
            max_events_per_run: 10_000,
            retention_max_age: HumanDuration(Duration::from_secs(7 * 86_400)),
            retention_max_bytes: 1 << 30,
            queue_capacity: 65_536,
            usage_retention_max_age: HumanDuration(Duration::from_secs(400 * 86_400)),
            usage_minute_max_age: HumanDuration(Duration::from_secs(2 * 86_400)),
            batch_max: 4_096,
            batch_linger_ms: 10,
            open_events_hold_ms: 0,
        }
    }
}

impl JournalConfig {
    /// Values that deserialize but cannot work, each naming its key.
    pub fn problems(&self) -> Vec<String> {
        let mut problems = Vec::new();
        for (key, value) in [
            ("journal.queue_capacity", self.queue_capacity),
            ("journal.batch_max", self.batch_max),
        ] {
            if value == 0 {
                problems.push(format!("`{key}` must be at least 1"));
            }
        }
        if self.path.as_ref().is_some_and(|p| p.as_os_str().is_empty()) {
            problems.push(
                "`journal.path` must not be empty (leave it out for the data directory)".to_owned(),
            );
        }
        let usage_age = self.usage_retention_max_age.0;
        if !usage_age.is_zero() && usage_age < MIN_USAGE_RETENTION {
            problems.push(
                "`journal.usage_retention_max_age` must be 0 (keep) or at least 32d, so a monthly budget is loaded whole at start".to_owned(),
            );
        }
        let limit = self.retention_max_bytes;
        if limit != 0 && limit < MIN_LIMIT {
            problems.push(format!(
                "`journal.retention_max_bytes` = {limit} leaves no room to work in: it must be 0 (no limit) or at least {MIN_LIMIT} (4 MiB)"
            ));
        }
        problems
    }

    /// The database file: `path`, or `journal.sqlite3` in `data_dir`.
    pub fn file(&self, data_dir: &Path) -> PathBuf {
        self.path
            .clone()
            .unwrap_or_else(|| data_dir.join("journal.sqlite3"))
    }

    /// `open_events_hold_ms` as a duration.
    pub fn open_events_hold(&self) -> Duration {
        Duration::from_millis(self.open_events_hold_ms)
    }

    /// `batch_linger_ms` as a duration.
    pub fn batch_linger(&self) -> Duration {
        Duration::from_millis(self.batch_linger_ms)
    }
}

/// A duration written with a unit (`90s`, `15m`, `12h`, `7d`), or a number of seconds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct HumanDuration(pub Duration);

impl HumanDuration {
    /// Reads `30s`, `15m`, `12h`, `7d` or `3600` (seconds); `None` for anything else.
    pub fn parse(text: &str) -> Option<Self> {
        let text = text.trim();
        let split = text
            .find(|c: char| !c.is_ascii_digit())
            .unwrap_or(text.len());
        let (number, unit) = text.split_at(split);
        let number: u64 = number.parse().ok()?;
        let seconds_per = match unit.trim() {
            "" | "s" => 1,
            "m" => 60,
            "h" => 3_600,
            "d" => 86_400,
            _ => return None,
        };
        number
            .checked_mul(seconds_per)
            .map(|s| Self(Duration::from_secs(s)))
    }

    /// Whether it is zero (no limit, where a limit is meant).
    pub fn is_zero(self) -> bool {
        self.0.is_zero()
    }
}

impl<'de> Deserialize<'de> for HumanDuration {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_any(HumanDurationVisitor)
    }
}

struct HumanDurationVisitor;

impl Visitor<'_> for HumanDurationVisitor {
    type Value = HumanDuration;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a duration such as \"90s\", \"15m\", \"12h\" or \"7d\", or seconds")
    }

    fn visit_u64<E: de::Error>(self, seconds: u64) -> Result<HumanDuration, E> {
        Ok(HumanDuration(Duration::from_secs(seconds)))
    }

    fn visit_i64<E: de::Error>(self, seconds: i64) -> Result<HumanDuration, E> {
        u64::try_from(seconds)
            .map(|s| HumanDuration(Duration::from_secs(s)))
            .map_err(|_| E::invalid_value(de::Unexpected::Signed(seconds), &self))
    }

    fn visit_str<E: de::Error>(self, text: &str) -> Result<HumanDuration, E> {
        HumanDuration::parse(text).ok_or_else(|| E::invalid_value(de::Unexpected::Str(text), &self))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_take_units_or_seconds() {
        let secs = |text: &str| HumanDuration::parse(text).map(|d| d.0.as_secs());
        assert_eq!(secs("90s"), Some(90));
        assert_eq!(secs("15m"), Some(900));
        assert_eq!(secs("12h"), Some(43_200));
        assert_eq!(secs("7d"), Some(604_800));
        assert_eq!(secs("3600"), Some(3_600));
        assert_eq!(secs("0"), Some(0));
        for bad in ["", "d", "7w", "-1d", "1.5h", "99999999999999999999d"] {
            assert_eq!(secs(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn zero_queues_are_problems_naming_the_key() {
        let config = JournalConfig {
            queue_capacity: 0,
            batch_max: 0,
            ..JournalConfig::default()
        };
        let problems = config.problems().join("; ");
        assert!(problems.contains("`journal.queue_capacity`"), "{problems}");
        assert!(problems.contains("`journal.batch_max`"), "{problems}");
        assert!(JournalConfig::default().problems().is_empty());
    }
}
