//! Why admission refuses a tenant's run, and when it may try again: too many runs open, too
//! many started this minute, or its token budget for the day or the month used up.
//!
//! The answer both per-tenant gates give (`limits` for concurrency and rate, `budget` for
//! tokens), so neither needs the other; the API turns it into a 429 with `Retry-After`.

use std::time::Duration;

use crate::domain::usage::{Bucket, utc_month};

/// Why a tenant's run is refused, and when to try again.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum LimitRefusal {
    /// The tenant already has its most runs open.
    #[error("{limit} runs already open for this key")]
    Concurrency {
        /// The limit.
        limit: u32,
        /// A hint.
        retry_after: Duration,
    },
    /// The tenant started its most runs for now.
    #[error("more than {per_minute} runs per minute for this key")]
    Rate {
        /// The limit.
        per_minute: u32,
        /// When the next run would be allowed.
        retry_after: Duration,
    },
    /// The tenant's tokens used and reserved reach its budget for the window.
    #[error("its token budget of {limit} per {} is used up", window.as_str())]
    Budget {
        /// The window: day or month.
        window: BudgetWindow,
        /// The budget.
        limit: u64,
        /// Until the window ends.
        retry_after: Duration,
    },
}

impl LimitRefusal {
    /// The `Retry-After` header's value: whole seconds, rounded up, at least 1.
    pub fn retry_after_secs(&self) -> u64 {
        let (Self::Concurrency { retry_after, .. }
        | Self::Rate { retry_after, .. }
        | Self::Budget { retry_after, .. }) = self;
        retry_after.as_nanos().div_ceil(1_000_000_000).max(1) as u64
    }
}

/// The window a budget applies to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BudgetWindow {
    /// The UTC day.
    Day,
    /// The UTC month.
    Month,
}

impl BudgetWindow {
    /// `day` or `month`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Day => "day",
            Self::Month => "month",
        }
    }

    /// The window holding `at_ms`: its start and its end, ms since the Unix epoch.
    pub fn bounds(self, at_ms: u64) -> (u64, u64) {
        match self {
            Self::Day => {
                let start = Bucket::Day.start_of(at_ms);
                (start, start + Bucket::Day.millis())
            }
            Self::Month => utc_month(at_ms),
        }
    }
}
