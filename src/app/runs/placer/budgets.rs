//! Budget state at start: what each API key used so far this UTC day and month, read
//! from the journal's usage rollups, so a restart neither forgets spending nor blocks a
//! key on stale counts (the rollups are written with the runs' endings).

use std::collections::HashMap;

use super::Placer;
use crate::app::runs::run::lock;
use crate::domain::routing::{BudgetWindow, TenantKey};
use crate::domain::{Bucket, GroupBy, UsageQuery};
use crate::ports::JournalError;
use crate::ports::clock::now_ms;

impl Placer {
    /// Loads every key's tokens used this UTC day and month from the journal (nothing when
    /// it is disabled: budgets then start from zero). Call once, before runs are accepted.
    ///
    /// # Errors
    /// [`JournalError`] when the rollups cannot be read.
    pub(in crate::app::runs) async fn load_budgets(&self) -> Result<(), JournalError> {
        let now = now_ms();
        let (month_start, _) = BudgetWindow::Month.bounds(now);
        let today = Bucket::Day.start_of(now);
        let query = UsageQuery {
            group_by: GroupBy {
                key: true,
                ..GroupBy::default()
            },
            since_ms: month_start,
            until_ms: now + 1,
            bucket: Bucket::Day,
            per_bucket: true,
        };
        let rows = self.journal.usage(&query).await?;
        let mut used: HashMap<String, (u64, u64)> = HashMap::new();
        for row in rows {
            let Some(key) = row.group.key else { continue };
            let tokens = row.counts.budget_tokens();
            let (day, month) = used.entry(key).or_default();
            *month += tokens;
            if row.start_ms == Some(today) {
                *day += tokens;
            }
        }
        let mut table = lock(&self.table);
        for (key, (day, month)) in used {
            if let Ok(tenant) = TenantKey::parse(&key) {
                table.budgets.load(&tenant, day, month, now);
            }
        }
        Ok(())
    }

    /// What `key` used this day and month, and its open reservations (for the tests).
    #[cfg(test)]
    pub(in crate::app::runs) fn budget_state(&self, key: &TenantKey) -> (u64, u64, u64) {
        lock(&self.table).budgets.state(key, now_ms())
    }
}
