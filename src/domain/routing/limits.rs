//! Per-tenant limits: concurrent runs and requests per minute, answered with "refuse, retry
//! after N seconds".
//!
//! The rate limit is GCRA (the generic cell rate algorithm, a token bucket kept as one
//! instant per tenant): requests are spaced `60 s / per_minute` apart on average, with up
//! to `burst` at once. `now` comes from the caller. Memory stays bounded: a tenant with no
//! run open and a rested bucket carries no information and is forgotten.

use std::collections::HashMap;
use std::num::NonZeroU32;
use std::time::{Duration, Instant};

use super::fair_queue::TenantKey;
use super::refusal::LimitRefusal;

/// Tenants remembered before rested ones are swept.
const SWEEP_ABOVE: usize = 65_536;

/// What a refused tenant is told to wait when the limit is on concurrency: runs end at
/// times nobody knows, so this is a hint.
const CONCURRENCY_RETRY: Duration = Duration::from_secs(1);

/// The limits every tenant gets (`limits.max_concurrent_runs_per_key`,
/// `limits.requests_per_minute_per_key`, `limits.burst_per_key`); `None` is unlimited.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct LimitPolicy {
    /// Runs a tenant may have open at once.
    pub max_concurrent: Option<NonZeroU32>,
    /// Runs a tenant may start per minute, on average.
    pub per_minute: Option<NonZeroU32>,
    /// Runs a rested tenant may start at once (the rate's bucket size); `None` is
    /// `per_minute`, so a rested tenant may use a whole minute's share at once.
    pub burst: Option<NonZeroU32>,
}

#[derive(Debug, Clone, Copy, Default)]
struct Usage {
    open: u32,
    /// GCRA's theoretical arrival time: when the bucket is rested again.
    rested_at: Option<Instant>,
}

/// Every tenant's open runs and rate state.
#[derive(Debug, Clone, Default)]
pub struct KeyLimits {
    policy: LimitPolicy,
    tenants: HashMap<TenantKey, Usage>,
}

impl KeyLimits {
    /// Limits applying `policy` to every tenant.
    pub fn new(policy: LimitPolicy) -> Self {
        Self {
            policy,
            tenants: HashMap::new(),
        }
    }

    /// Counts a run starting for `tenant` at `now`, or refuses it. A refused run counts for
    /// nothing; an accepted one must be [`finish`](Self::finish)ed when it ends.
    ///
    /// # Errors
    /// [`LimitRefusal`] when `tenant` is at its concurrency limit or over its rate.
    pub fn try_start(&mut self, tenant: &TenantKey, now: Instant) -> Result<(), LimitRefusal> {
        self.try_start_with(tenant, self.policy, now)
    }

    /// [`try_start`](Self::try_start) under `policy` instead of the one every tenant gets:
    /// an API key configured with limits of its own.
    ///
    /// # Errors
    /// [`LimitRefusal`] when `tenant` is at its concurrency limit or over its rate.
    pub fn try_start_with(
        &mut self,
        tenant: &TenantKey,
        policy: LimitPolicy,
        now: Instant,
    ) -> Result<(), LimitRefusal> {
        if policy.max_concurrent.is_none() && policy.per_minute.is_none() {
            return Ok(());
        }
        if self.tenants.len() >= SWEEP_ABOVE && !self.tenants.contains_key(tenant) {
            self.tenants
                .retain(|_, u| u.open > 0 || u.rested_at.is_some_and(|at| at > now));
        }
        let usage = self.tenants.entry(tenant.clone()).or_default();
        if let Some(limit) = policy.max_concurrent
            && usage.open >= limit.get()
        {
            return Err(LimitRefusal::Concurrency {
                limit: limit.get(),
                retry_after: CONCURRENCY_RETRY,
            });
        }
        if let Some(per_minute) = policy.per_minute {
            let interval = Duration::from_secs(60) / per_minute.get();
            let burst = policy.burst.unwrap_or(per_minute).get();
            let tolerance = interval * (burst - 1);
            let rested_at = usage.rested_at.map_or(now, |at| at.max(now));
            let allowed_from = rested_at.checked_sub(tolerance).unwrap_or(now);
            if allowed_from > now {
                return Err(LimitRefusal::Rate {
                    per_minute: per_minute.get(),
                    retry_after: allowed_from - now,
                });
            }
            usage.rested_at = Some(rested_at + interval);
        }
        usage.open += 1;
        Ok(())
    }

    /// Counts a run of `tenant`'s taken back (admitted before an edge restart or a site's
    /// takeover, and still running) among its open runs, whatever the limit: it is not
    /// admitted again, but the runs admitted after it wait for it as for any other. Its
    /// start at `started` (`None`: too long ago to tell) is counted in the rate `policy`
    /// sets, as the edge that admitted it counted it: a run started within the last window
    /// spaces the next ones out. It must be [`finish`](Self::finish)ed when it ends.
    pub fn count_taken_back(
        &mut self,
        tenant: &TenantKey,
        policy: LimitPolicy,
        started: Option<Instant>,
    ) {
        let usage = self.tenants.entry(tenant.clone()).or_default();
        usage.open += 1;
        if let (Some(per_minute), Some(started)) = (policy.per_minute, started) {
            let interval = Duration::from_secs(60) / per_minute.get();
            let rested_at = usage.rested_at.map_or(started, |at| at.max(started));
            usage.rested_at = Some(rested_at + interval);
        }
    }

    /// Counts a run of `tenant`'s as ended.
    pub fn finish(&mut self, tenant: &TenantKey) {
        if let Some(usage) = self.tenants.get_mut(tenant) {
            usage.open = usage.open.saturating_sub(1);
        }
    }

    /// Runs open for `tenant`.
    pub fn open(&self, tenant: &TenantKey) -> u32 {
        self.tenants.get(tenant).map_or(0, |u| u.open)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(name: &str) -> TenantKey {
        TenantKey::parse(name).unwrap()
    }

    fn limits(concurrent: u32, per_minute: u32, burst: u32) -> KeyLimits {
        KeyLimits::new(LimitPolicy {
            max_concurrent: NonZeroU32::new(concurrent),
            per_minute: NonZeroU32::new(per_minute),
            burst: NonZeroU32::new(burst),
        })
    }

    #[test]
    fn a_taken_back_run_holds_its_place_until_it_finishes() {
        let mut l = limits(1, 0, 0);
        let now = Instant::now();
        l.count_taken_back(&key("a"), l.policy, Some(now));
        assert!(l.try_start(&key("a"), now).is_err(), "one open already");
        l.finish(&key("a"));
        assert!(l.try_start(&key("a"), now).is_ok());
    }

    #[test]
    fn a_taken_back_runs_recent_start_counts_in_its_rate() {
        let now = Instant::now();
        let Some(earlier) = now.checked_sub(Duration::from_secs(10)) else {
            return;
        };
        // Two a minute, one at a time: the run started 10 s ago spaces the next by 30 s.
        let mut l = limits(0, 2, 1);
        l.count_taken_back(&key("a"), l.policy, Some(earlier));
        l.finish(&key("a"));
        match l.try_start(&key("a"), now) {
            Err(LimitRefusal::Rate { retry_after, .. }) => {
                assert_eq!(retry_after, Duration::from_secs(20));
            }
            other => panic!("{other:?}"),
        }
        assert!(
            l.try_start(&key("a"), now + Duration::from_secs(20))
                .is_ok()
        );
        // Started long ago, or when nobody can tell: it spaces nothing.
        let mut l = limits(0, 2, 1);
        if let Some(long_ago) = now.checked_sub(Duration::from_secs(300)) {
            l.count_taken_back(&key("b"), l.policy, Some(long_ago));
        }
        l.count_taken_back(&key("c"), l.policy, None);
        assert!(l.try_start(&key("b"), now).is_ok());
        assert!(l.try_start(&key("c"), now).is_ok());
    }

    #[test]
    fn unlimited_by_default() {
        let mut l = KeyLimits::default();
        let now = Instant::now();
        for _ in 0..1000 {
            l.try_start(&key("a"), now).unwrap();
        }
        assert!(l.tenants.is_empty(), "nothing is tracked without limits");
    }

    #[test]
    fn burst_defaults_to_a_minutes_share() {
        let mut l = limits(0, 3, 0);
        let now = Instant::now();
        for _ in 0..3 {
            l.try_start(&key("a"), now).unwrap();
        }
        assert_eq!(
            l.try_start(&key("a"), now).unwrap_err().retry_after_secs(),
            20
        );
    }

    #[test]
    fn concurrency_limit_counts_open_runs() {
        let mut l = limits(2, 0, 0);
        let now = Instant::now();
        l.try_start(&key("a"), now).unwrap();
        l.try_start(&key("a"), now).unwrap();
        let refusal = l.try_start(&key("a"), now).unwrap_err();
        assert_eq!(refusal.retry_after_secs(), 1);
        l.try_start(&key("b"), now).unwrap();
        l.finish(&key("a"));
        l.try_start(&key("a"), now).unwrap();
        assert_eq!(l.open(&key("a")), 2);
    }

    #[test]
    fn rate_limit_allows_a_burst_then_spaces_runs() {
        // 6 per minute: one every 10 s, 3 at once.
        let mut l = limits(0, 6, 3);
        let start = Instant::now();
        for _ in 0..3 {
            l.try_start(&key("a"), start).unwrap();
        }
        let refusal = l.try_start(&key("a"), start).unwrap_err();
        assert_eq!(
            refusal,
            LimitRefusal::Rate {
                per_minute: 6,
                retry_after: Duration::from_secs(10)
            }
        );
        assert_eq!(refusal.retry_after_secs(), 10);
        assert!(
            l.try_start(&key("a"), start + Duration::from_secs(9))
                .is_err()
        );
        l.try_start(&key("a"), start + Duration::from_secs(10))
            .unwrap();
        // Rested after a long pause: a full burst again.
        let later = start + Duration::from_secs(600);
        for _ in 0..3 {
            l.try_start(&key("a"), later).unwrap();
        }
        assert!(l.try_start(&key("a"), later).is_err());
    }

    #[test]
    fn a_concurrency_refusal_spends_no_rate() {
        let mut l = limits(1, 60, 2);
        let now = Instant::now();
        l.try_start(&key("a"), now).unwrap();
        assert!(matches!(
            l.try_start(&key("a"), now),
            Err(LimitRefusal::Concurrency { .. })
        ));
        l.finish(&key("a"));
        l.try_start(&key("a"), now).unwrap();
    }
}
