//! The takeover (decisions 49, 50 and 53): what a member of a site does between acquiring
//! its lease and acting, and when it stops acting. Taking over, it rebuilds its journal
//! from the site's newest snapshot when the file may hold what the stream lacks (it acted
//! before in this life), claims the site's journal stream under its new epoch once caught
//! up on it, reads the runs the file holds as open, loads the keys' budgets from the
//! rollups, re-adopts the open runs and admits runs again. Standing down, it stops
//! publishing before it lets the open runs go, ending none.
//!
//! A service: it builds on the ports only ([`SiteStream`], [`JournalCache`], [`SiteRuns`])
//! and answers the lease through [`TakeOver`]; it knows neither NATS nor SQLite, and
//! decides neither when to take over nor for how long (the lease's).

use std::sync::Arc;

use async_trait::async_trait;
use tracing::{info, warn};

use crate::ports::{JournalCache, SiteRuns, SiteStream, TakeOver, TakeOverError};

/// A member's takeover of its site, over its stream, its journal and its runs.
pub struct SiteTakeOver {
    stream: Arc<dyn SiteStream>,
    journal: Arc<dyn JournalCache>,
    runs: Arc<dyn SiteRuns>,
}

impl SiteTakeOver {
    /// The takeover of the member whose end of the site's journal stream is `stream`, whose
    /// journal file (the stream's cache) is `journal` and whose runs are `runs`.
    pub fn new(
        stream: Arc<dyn SiteStream>,
        journal: Arc<dyn JournalCache>,
        runs: Arc<dyn SiteRuns>,
    ) -> Self {
        Self {
            stream,
            journal,
            runs,
        }
    }
}

#[async_trait]
impl TakeOver for SiteTakeOver {
    async fn prepare(&self, epoch: u64) -> Result<(), TakeOverError> {
        if self.stream.holds_unpublished() {
            info!("this member acted before: its journal is rebuilt from the site's stream");
            self.stream.rebuild().await?;
        }
        let claimed = self.stream.claim(epoch).await?;
        let open = self
            .journal
            .reload_left_open()
            .await
            .map_err(TakeOverError::OpenRuns)?;
        self.runs
            .load_budgets()
            .await
            .map_err(TakeOverError::Budgets)?;
        let held = self.runs.adopt_left_open().await;
        self.runs.act();
        info!(
            epoch,
            stream_seq = claimed,
            open,
            held,
            "caught up on the site's journal: taking the open runs over"
        );
        Ok(())
    }

    async fn stand_down(&self) {
        self.stream.stop_writing();
        let let_go = self.runs.let_go_open_runs().await;
        warn!(
            runs = let_go,
            "no longer the site's active member: open runs let go, none ended"
        );
    }

    async fn fenced(&self, epoch: u64) {
        self.stream.fenced(epoch).await;
    }
}

#[cfg(test)]
mod tests;
