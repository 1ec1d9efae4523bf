//! Token budgets per API key: input plus output tokens per UTC day and per UTC month,
//! exact under concurrency.
//!
//! Admission reserves, the ending settles: a run is admitted only while, in each window
//! its key has a budget for, the tokens used so far plus the reservations of its runs
//! still open are under the budget; it then reserves its claim (its `max_tokens`, or the
//! key's default). When it ends, the reservation is released and the tokens its node
//! reported are counted in the window it ended in. Every step happens under the run
//! table's lock, so N runs at once cannot all pass a budget with room for fewer. `now_ms`
//! comes from the caller; windows roll over at UTC midnight and on the 1st of the month.

use std::collections::HashMap;
use std::time::Duration;

use super::fair_queue::TenantKey;
use super::refusal::{BudgetWindow, LimitRefusal};

/// A key's budget (`budget_tokens_per_day`, `budget_tokens_per_month`,
/// `budget_reserve_tokens` in its `[[api.keys]]` table).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TokenBudget {
    /// Input plus output tokens per UTC day; `None` for no daily budget.
    pub per_day: Option<u64>,
    /// Input plus output tokens per UTC month; `None` for no monthly budget.
    pub per_month: Option<u64>,
    /// What a run reserves when its request sets no `max_tokens`.
    pub default_reserve: u64,
}

/// What a run claims of its key's budget at admission.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BudgetClaim {
    /// The key's budget.
    pub budget: TokenBudget,
    /// The tokens reserved until the run ends.
    pub reserve: u64,
}

/// Tokens counted in one window.
#[derive(Debug, Clone, Copy, Default)]
struct Window {
    start_ms: u64,
    used: u64,
}

impl Window {
    /// The tokens used in the window holding `now_ms` (zero once it has rolled over).
    fn used_at(&mut self, window: BudgetWindow, now_ms: u64) -> u64 {
        let (start, _) = window.bounds(now_ms);
        if self.start_ms != start {
            *self = Window {
                start_ms: start,
                used: 0,
            };
        }
        self.used
    }
}

#[derive(Debug, Clone, Copy, Default)]
struct KeyBudget {
    day: Window,
    month: Window,
    /// Reservations of the key's open runs.
    reserved: u64,
}

/// Every key's budget state.
#[derive(Debug, Clone, Default)]
pub struct Budgets {
    keys: HashMap<TenantKey, KeyBudget>,
}

impl Budgets {
    /// Sets what `tenant` used so far today and this month (at start, from the usage
    /// rollups).
    pub fn load(&mut self, tenant: &TenantKey, day_used: u64, month_used: u64, now_ms: u64) {
        let key = self.keys.entry(tenant.clone()).or_default();
        key.day = Window {
            start_ms: BudgetWindow::Day.bounds(now_ms).0,
            used: day_used,
        };
        key.month = Window {
            start_ms: BudgetWindow::Month.bounds(now_ms).0,
            used: month_used,
        };
    }

    /// Reserves `claim` for a run of `tenant` admitted at `now_ms`, or refuses it. A
    /// reserved claim must be [`settle`](Self::settle)d (or released with zero tokens) once.
    ///
    /// # Errors
    /// [`LimitRefusal::Budget`] when the key's used tokens and open reservations reach a
    /// budget; it retries once the window (the later one, when both are full) has ended.
    pub fn try_reserve(
        &mut self,
        tenant: &TenantKey,
        claim: BudgetClaim,
        now_ms: u64,
    ) -> Result<(), LimitRefusal> {
        let key = self.keys.entry(tenant.clone()).or_default();
        let mut refusal: Option<LimitRefusal> = None;
        for (window, state, limit) in [
            (BudgetWindow::Day, &mut key.day, claim.budget.per_day),
            (BudgetWindow::Month, &mut key.month, claim.budget.per_month),
        ] {
            let used = state.used_at(window, now_ms);
            let Some(limit) = limit else { continue };
            if used.saturating_add(key.reserved) >= limit {
                let end = window.bounds(now_ms).1;
                refusal = Some(LimitRefusal::Budget {
                    window,
                    limit,
                    retry_after: Duration::from_millis(end.saturating_sub(now_ms)),
                });
            }
        }
        match refusal {
            Some(refusal) => Err(refusal),
            None => {
                key.reserved = key.reserved.saturating_add(claim.reserve);
                Ok(())
            }
        }
    }

    /// Reserves `reserve` again for a run of `tenant` taken back (admitted before an edge
    /// restart or a site's takeover, with that reservation, and still open), whatever the
    /// budget: it is not admitted again. It must be [`settle`](Self::settle)d once.
    pub fn reserve_taken_back(&mut self, tenant: &TenantKey, reserve: u64) {
        let key = self.keys.entry(tenant.clone()).or_default();
        key.reserved = key.reserved.saturating_add(reserve);
    }

    /// A run of `tenant` that reserved `reserve` ended at `now_ms` having used `tokens`
    /// (input plus output): the reservation goes, the tokens count in the windows holding
    /// `now_ms`.
    pub fn settle(&mut self, tenant: &TenantKey, reserve: u64, tokens: u64, now_ms: u64) {
        let key = self.keys.entry(tenant.clone()).or_default();
        key.reserved = key.reserved.saturating_sub(reserve);
        for (window, state) in [
            (BudgetWindow::Day, &mut key.day),
            (BudgetWindow::Month, &mut key.month),
        ] {
            state.used_at(window, now_ms);
            state.used = state.used.saturating_add(tokens);
        }
    }

    /// What `tenant` used in the day and the month holding `now_ms`, and its open
    /// reservations.
    pub fn state(&mut self, tenant: &TenantKey, now_ms: u64) -> (u64, u64, u64) {
        let key = self.keys.entry(tenant.clone()).or_default();
        let day = key.day.used_at(BudgetWindow::Day, now_ms);
        let month = key.month.used_at(BudgetWindow::Month, now_ms);
        (day, month, key.reserved)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOON: u64 = 1_764_763_200_000; // 2025-12-03T12:00:00Z

    fn claim(per_day: Option<u64>, per_month: Option<u64>, reserve: u64) -> BudgetClaim {
        BudgetClaim {
            budget: TokenBudget {
                per_day,
                per_month,
                default_reserve: 0,
            },
            reserve,
        }
    }

    #[test]
    fn a_taken_back_runs_reservation_counts_until_it_is_settled() {
        let key = TenantKey::parse("team").unwrap();
        let mut budgets = Budgets::default();
        budgets.reserve_taken_back(&key, 100);
        assert!(
            budgets
                .try_reserve(&key, claim(Some(100), None, 1), NOON)
                .is_err()
        );
        budgets.settle(&key, 100, 30, NOON);
        assert_eq!(budgets.state(&key, NOON), (30, 30, 0));
        assert!(
            budgets
                .try_reserve(&key, claim(Some(100), None, 1), NOON)
                .is_ok()
        );
    }

    #[test]
    fn reservations_of_open_runs_count_against_the_budget() {
        let key = TenantKey::parse("team").unwrap();
        let mut budgets = Budgets::default();
        let claim = claim(Some(100), None, 30);
        // 0, 30, 60, 90 are under 100: four runs at once, the fifth refused.
        for _ in 0..4 {
            budgets.try_reserve(&key, claim, NOON).unwrap();
        }
        let refused = budgets.try_reserve(&key, claim, NOON).unwrap_err();
        assert_eq!(refused.retry_after_secs(), 12 * 3_600, "until UTC midnight");
        // One ends having used 5: used 5 + reserved 90 = 95 < 100.
        budgets.settle(&key, 30, 5, NOON);
        budgets.try_reserve(&key, claim, NOON).unwrap();
        assert_eq!(budgets.state(&key, NOON), (5, 5, 120));
    }

    #[test]
    fn windows_roll_over_at_utc_midnight_and_month_start() {
        let key = TenantKey::parse("team").unwrap();
        let mut budgets = Budgets::default();
        budgets.load(&key, 100, 1_000, NOON);
        let daily = claim(Some(100), None, 1);
        assert!(budgets.try_reserve(&key, daily, NOON).is_err());
        let tomorrow = NOON + 12 * 3_600_000;
        budgets.try_reserve(&key, daily, tomorrow).unwrap();
        let monthly = claim(None, Some(1_000), 1);
        let refused = budgets.try_reserve(&key, monthly, NOON).unwrap_err();
        // December 3rd noon to January 1st: 28.5 days.
        assert_eq!(refused.retry_after_secs(), 28 * 86_400 + 12 * 3_600);
        assert!(matches!(
            refused,
            LimitRefusal::Budget {
                window: BudgetWindow::Month,
                limit: 1_000,
                ..
            }
        ));
    }
}
