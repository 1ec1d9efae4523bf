//! The management service as the inbound management port ([`Manage`]) the admin API calls:
//! each method is the service's own.

use std::time::Duration;

use async_trait::async_trait;
use futures::StreamExt as _;

use super::Management;
use crate::domain::{RunId, RunPage, RunQuery, RunRecord, StatsWindow, UsageQuery, UsageRow};
use crate::ports::clock::now_ms;
use crate::ports::{FeedStream, Manage, ManageError, NodeStatus};

#[async_trait]
impl Manage for Management {
    fn nodes(&self) -> Vec<NodeStatus> {
        Management::nodes(self)
    }

    fn node(&self, name: &str) -> Option<NodeStatus> {
        Management::node(self, name)
    }

    fn drain(&self, name: &str, deadline: Option<Duration>) -> Result<NodeStatus, ManageError> {
        Management::drain(self, name, deadline)
    }

    fn undrain(&self, name: &str) -> Result<NodeStatus, ManageError> {
        Management::undrain(self, name)
    }

    async fn runs(&self, query: &RunQuery) -> Result<RunPage, ManageError> {
        Management::runs(self, query).await
    }

    async fn run(&self, id: &RunId) -> Result<Option<RunRecord>, ManageError> {
        Management::run(self, id).await
    }

    async fn cancel(&self, id: &RunId) -> Result<(), ManageError> {
        Management::cancel(self, id).await
    }

    async fn events(&self, id: &RunId, from: u64, follow: bool) -> Result<FeedStream, ManageError> {
        let feed = Management::events(self, id, from, follow).await?;
        Ok(feed.into_stream().boxed())
    }

    async fn usage(&self, query: &UsageQuery) -> Result<Vec<UsageRow>, ManageError> {
        let journal = &self.inner.journal;
        if !journal.enabled() {
            return Err(ManageError::JournalDisabled);
        }
        // Runs that ended before the call are on their way to the journal: wait for them.
        journal.flush().await;
        Ok(journal.usage(query).await?)
    }

    fn stats(&self) -> StatsWindow {
        self.inner.live.stats()
    }

    fn now_ms(&self) -> u64 {
        now_ms()
    }
}
