//! Usage: the token counts a node reports for one run, and the rollups of what runs
//! consumed, summed by API key × model × node × affinity source × time bucket, with the
//! questions operators ask of them (which groups, which range, which bucket size).
//!
//! Pure data and rules: times are milliseconds since the Unix epoch, passed in by callers;
//! buckets are UTC minutes, hours and days. [`Rollup`] sums the endings of one journal
//! transaction in memory so the journal writes a few upserts per batch, never a scan.

use std::borrow::Cow;
use std::collections::HashMap;

/// Token counts a node reports with a completed run (and, since protocol v1.2, what a
/// failed or cancelled run produced).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Usage {
    /// Tokens in the prompt.
    pub input_tokens: u32,
    /// Tokens generated.
    pub output_tokens: u32,
    /// Prompt tokens the engine served from its cache (part of `input_tokens`).
    pub cached_input_tokens: u32,
    /// Generated tokens spent on reasoning (part of `output_tokens`).
    pub reasoning_tokens: u32,
}

impl Usage {
    /// Prompt and generated token counts, with no cache or reasoning detail.
    pub fn new(input_tokens: u32, output_tokens: u32) -> Self {
        Self {
            input_tokens,
            output_tokens,
            ..Self::default()
        }
    }
}

/// Milliseconds in a minute, an hour, a day.
const MINUTE_MS: u64 = 60_000;
const HOUR_MS: u64 = 60 * MINUTE_MS;
/// Milliseconds in a UTC day (UTC has no leap seconds in Unix time).
pub const DAY_MS: u64 = 24 * HOUR_MS;

/// The size of a usage bucket.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Bucket {
    /// One UTC minute.
    Minute,
    /// One UTC hour.
    Hour,
    /// One UTC day.
    Day,
}

impl Bucket {
    /// Every size, smallest first.
    pub const ALL: [Bucket; 3] = [Self::Minute, Self::Hour, Self::Day];

    /// The stable name used in the API and the journal.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Minute => "minute",
            Self::Hour => "hour",
            Self::Day => "day",
        }
    }

    /// The size named `name`, if any.
    pub fn parse(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|b| b.as_str() == name)
    }

    /// Its length in milliseconds.
    pub fn millis(self) -> u64 {
        match self {
            Self::Minute => MINUTE_MS,
            Self::Hour => HOUR_MS,
            Self::Day => DAY_MS,
        }
    }

    /// The start of the bucket holding `at_ms`.
    pub fn start_of(self, at_ms: u64) -> u64 {
        at_ms - at_ms % self.millis()
    }
}

/// Sums of what runs consumed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct UsageCounts {
    /// Runs that ended.
    pub runs: u64,
    /// Of those, runs that ended `failed`.
    pub errors: u64,
    /// Prompt tokens.
    pub input_tokens: u64,
    /// Prompt tokens the engines served from their caches (part of `input_tokens`).
    pub cached_input_tokens: u64,
    /// Generated tokens.
    pub output_tokens: u64,
    /// Generated tokens spent on reasoning (part of `output_tokens`).
    pub reasoning_tokens: u64,
}

impl UsageCounts {
    /// One run's counts: `usage` as its node reported it (none for most failed and
    /// cancelled runs), `failed` when it ended `failed`.
    pub fn of_run(usage: Option<&Usage>, failed: bool) -> Self {
        let usage = usage.copied().unwrap_or_default();
        Self {
            runs: 1,
            errors: u64::from(failed),
            input_tokens: usage.input_tokens.into(),
            cached_input_tokens: usage.cached_input_tokens.into(),
            output_tokens: usage.output_tokens.into(),
            reasoning_tokens: usage.reasoning_tokens.into(),
        }
    }

    /// Adds `other` in.
    pub fn add(&mut self, other: &Self) {
        self.runs += other.runs;
        self.errors += other.errors;
        self.input_tokens += other.input_tokens;
        self.cached_input_tokens += other.cached_input_tokens;
        self.output_tokens += other.output_tokens;
        self.reasoning_tokens += other.reasoning_tokens;
    }

    /// What a budget counts: input plus output tokens.
    pub fn budget_tokens(&self) -> u64 {
        self.input_tokens + self.output_tokens
    }

    /// Cached input over input; `None` when there was no input.
    pub fn cache_hit_rate(&self) -> Option<f64> {
        (self.input_tokens > 0).then(|| self.cached_input_tokens as f64 / self.input_tokens as f64)
    }
}

/// Who and what a rollup row is about. `None` is "no key" (an open API, the console), "no
/// node" (the run ended before it was placed) or "affinity not known" (rolled up by an
/// edge that did not record it).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct UsageGroup {
    /// The API key's name.
    pub key: Option<String>,
    /// The run's model as `ADAPTER/TARGET`.
    pub model: Option<String>,
    /// The node that held the run at its end.
    pub node: Option<String>,
    /// Where the run's affinity key came from, as metrics name it
    /// ([`super::routing::KeySource::label`]: `none` without a key). Borrowed when it is
    /// rolled up, so summing a run allocates nothing for it.
    pub affinity: Option<Cow<'static, str>>,
}

/// The endings of one transaction summed per bucket and group.
#[derive(Debug, Default)]
pub struct Rollup {
    rows: HashMap<(Bucket, u64, UsageGroup), UsageCounts>,
}

impl Rollup {
    /// Counts a run of `group` that ended at `finished_ms` in each bucket size.
    pub fn add(&mut self, finished_ms: u64, group: &UsageGroup, counts: &UsageCounts) {
        for bucket in Bucket::ALL {
            let key = (bucket, bucket.start_of(finished_ms), group.clone());
            self.rows.entry(key).or_default().add(counts);
        }
    }

    /// Whether nothing was counted.
    pub fn is_empty(&self) -> bool {
        self.rows.is_empty()
    }

    /// The rows: bucket size, bucket start, group, sums.
    pub fn rows(&self) -> impl Iterator<Item = (Bucket, u64, &UsageGroup, &UsageCounts)> {
        self.rows
            .iter()
            .map(|((bucket, start, group), counts)| (*bucket, *start, group, counts))
    }
}

/// Which dimensions a usage answer is split by.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct GroupBy {
    /// By API key.
    pub key: bool,
    /// By model.
    pub model: bool,
    /// By node.
    pub node: bool,
    /// By the source of the runs' affinity keys.
    pub affinity: bool,
}

impl GroupBy {
    /// Reads `key,model,node,affinity` (any of them, comma-separated; empty for none).
    ///
    /// # Errors
    /// [`GroupByError::Unknown`] with the first name that is not one of them.
    pub fn parse(text: &str) -> Result<Self, GroupByError> {
        let mut group = Self::default();
        for name in text.split(',').map(str::trim).filter(|n| !n.is_empty()) {
            match name {
                "key" => group.key = true,
                "model" => group.model = true,
                "node" => group.node = true,
                "affinity" => group.affinity = true,
                other => {
                    return Err(GroupByError::Unknown {
                        name: other.to_owned(),
                    });
                }
            }
        }
        Ok(group)
    }
}

/// A `group_by` list [`GroupBy::parse`] refuses.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum GroupByError {
    /// A name that is none of the dimensions.
    #[error("`group_by` takes key, model, node and affinity; {name:?} is none of them")]
    Unknown {
        /// The offending name.
        name: String,
    },
}

/// A question about usage.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UsageQuery {
    /// The dimensions to split by; rows of equal values are summed.
    pub group_by: GroupBy,
    /// Runs that ended at or after this time (rounded down to the bucket's start).
    pub since_ms: u64,
    /// Runs that ended before this time (buckets that start before it).
    pub until_ms: u64,
    /// The bucket size read; with `per_bucket`, one row per bucket.
    pub bucket: Bucket,
    /// Whether rows are split by bucket start.
    pub per_bucket: bool,
}

/// One row of a usage answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UsageRow {
    /// The bucket's start, when split by bucket.
    pub start_ms: Option<u64>,
    /// The group (only the dimensions asked for are set).
    pub group: UsageGroup,
    /// The sums.
    pub counts: UsageCounts,
}

/// The days since 1970-01-01 of the first day of the civil month holding day `days`
/// (proleptic Gregorian), and of the first day of the next month.
fn month_bounds(days: i64) -> (i64, i64) {
    let (year, month, day) = civil_from_days(days);
    let first = days - (day - 1);
    let (next_year, next_month) = if month == 12 {
        (year + 1, 1)
    } else {
        (year, month + 1)
    };
    (first, days_from_civil(next_year, next_month, 1))
}

/// Howard Hinnant's `civil_from_days`: (year, month 1-12, day 1-31).
fn civil_from_days(days: i64) -> (i64, i64, i64) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

/// Howard Hinnant's `days_from_civil`: the days since 1970-01-01 of a proleptic Gregorian
/// date (month 1-12, day 1-31).
#[must_use]
pub fn days_from_civil(year: i64, month: i64, day: i64) -> i64 {
    let year = if month <= 2 { year - 1 } else { year };
    let era = year.div_euclid(400);
    let yoe = year.rem_euclid(400);
    let mp = if month > 2 { month - 3 } else { month + 9 };
    let doy = (153 * mp + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// The UTC month holding `at_ms`: its start and the next month's start, in ms.
pub fn utc_month(at_ms: u64) -> (u64, u64) {
    let days = i64::try_from(at_ms / DAY_MS).unwrap_or(i64::MAX / 2);
    let (first, next) = month_bounds(days);
    let ms = |d: i64| u64::try_from(d).unwrap_or(0) * DAY_MS;
    (ms(first), ms(next))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_start_on_utc_boundaries() {
        let at = 1_764_751_234_567; // 2025-12-03T08:40:34.567Z
        assert_eq!(Bucket::Minute.start_of(at), 1_764_751_200_000);
        assert_eq!(Bucket::Hour.start_of(at), 1_764_748_800_000);
        assert_eq!(Bucket::Day.start_of(at), 1_764_720_000_000);
        for bucket in Bucket::ALL {
            assert_eq!(Bucket::parse(bucket.as_str()), Some(bucket));
        }
    }

    #[test]
    fn months_are_civil_utc_months() {
        // 2025-12-03 → December 2025, up to 2026-01-01.
        assert_eq!(
            utc_month(1_764_751_234_567),
            (1_764_547_200_000, 1_767_225_600_000)
        );
        // 2024-02-29 (leap year) → February, up to March 1st.
        assert_eq!(
            utc_month(1_709_208_000_000),
            (1_706_745_600_000, 1_709_251_200_000)
        );
        for days in [0, 59, 365, 10_000, 20_000, 30_000] {
            let (y, m, d) = civil_from_days(days);
            assert_eq!(days_from_civil(y, m, d), days);
        }
    }

    #[test]
    fn a_rollup_sums_runs_per_bucket_and_group() {
        let group = UsageGroup {
            key: Some("team-a".into()),
            model: Some("llama/qwen".into()),
            node: Some("n1".into()),
            affinity: Some(Cow::Borrowed("prefix")),
        };
        let usage = Usage {
            input_tokens: 100,
            output_tokens: 10,
            cached_input_tokens: 80,
            reasoning_tokens: 2,
        };
        let mut rollup = Rollup::default();
        rollup.add(1_000, &group, &UsageCounts::of_run(Some(&usage), false));
        rollup.add(2_000, &group, &UsageCounts::of_run(None, true));
        let rows: Vec<_> = rollup.rows().collect();
        assert_eq!(rows.len(), 3, "one row per bucket size");
        for (_, start, _, counts) in rows {
            assert_eq!(start, 0);
            assert_eq!(counts.runs, 2);
            assert_eq!(counts.errors, 1);
            assert_eq!(counts.input_tokens, 100);
            assert_eq!(counts.budget_tokens(), 110);
            assert_eq!(counts.cache_hit_rate(), Some(0.8));
        }
    }

    #[test]
    fn group_by_reads_any_of_the_dimensions() {
        assert_eq!(
            GroupBy::parse("key, node").unwrap(),
            GroupBy {
                key: true,
                node: true,
                ..GroupBy::default()
            }
        );
        assert_eq!(
            GroupBy::parse("affinity,model").unwrap(),
            GroupBy {
                model: true,
                affinity: true,
                ..GroupBy::default()
            }
        );
        assert_eq!(GroupBy::parse("").unwrap(), GroupBy::default());
        assert_eq!(
            GroupBy::parse("key,tenant").unwrap_err(),
            GroupByError::Unknown {
                name: "tenant".into()
            }
        );
    }

    #[test]
    fn a_rollup_keeps_runs_of_different_affinity_sources_apart() {
        use super::super::routing::KeySource;
        let of = |source| UsageGroup {
            key: Some("team-a".into()),
            model: Some("llama/qwen".into()),
            node: Some("n1".into()),
            affinity: Some(Cow::Borrowed(KeySource::label(source))),
        };
        let run = |input, cached| Usage {
            input_tokens: input,
            output_tokens: 1,
            cached_input_tokens: cached,
            reasoning_tokens: 0,
        };
        let mut rollup = Rollup::default();
        let cached = of(Some(KeySource::PromptCacheKey));
        rollup.add(
            1_000,
            &cached,
            &UsageCounts::of_run(Some(&run(100, 90)), false),
        );
        rollup.add(
            1_500,
            &cached,
            &UsageCounts::of_run(Some(&run(100, 70)), false),
        );
        rollup.add(
            2_000,
            &of(None),
            &UsageCounts::of_run(Some(&run(50, 0)), false),
        );
        let minutes: HashMap<_, _> = rollup
            .rows()
            .filter(|(bucket, ..)| *bucket == Bucket::Minute)
            .map(|(_, _, group, counts)| (group.affinity.as_deref(), *counts))
            .collect();
        assert_eq!(minutes.len(), 2, "{minutes:?}");
        let keyed = minutes[&Some("prompt_cache_key")];
        assert_eq!((keyed.runs, keyed.input_tokens), (2, 200));
        assert_eq!(keyed.cache_hit_rate(), Some(0.8));
        let none = minutes[&Some("none")];
        assert_eq!((none.runs, none.cache_hit_rate()), (1, Some(0.0)));
    }
}
