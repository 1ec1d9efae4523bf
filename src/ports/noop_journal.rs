//! The journal for `[journal] enabled = false`: keeps nothing, so only open runs are known,
//! as before the journal existed. It sits beside the port as its null object, so the run
//! and management services can be built without any journal adapter.

use async_trait::async_trait;

use crate::domain::{RunId, RunQuery, RunRecord, UsageQuery, UsageRow};
use crate::ports::{JournalEntry, JournalError, JournalStats, RunJournal, StoredEvent};

/// Keeps nothing.
#[derive(Debug, Clone, Copy, Default)]
pub struct NoopJournal;

#[async_trait]
impl RunJournal for NoopJournal {
    fn enabled(&self) -> bool {
        false
    }

    fn record(&self, _entry: JournalEntry) {}

    async fn flush(&self) {}

    async fn run(&self, _id: &RunId) -> Result<Option<RunRecord>, JournalError> {
        Ok(None)
    }

    async fn finished_runs(&self, _query: &RunQuery) -> Result<Vec<RunRecord>, JournalError> {
        Ok(Vec::new())
    }

    async fn events(
        &self,
        _id: &RunId,
        _from: u64,
        _limit: usize,
    ) -> Result<Vec<StoredEvent>, JournalError> {
        Ok(Vec::new())
    }

    async fn usage(&self, _query: &UsageQuery) -> Result<Vec<UsageRow>, JournalError> {
        Ok(Vec::new())
    }

    fn stats(&self) -> JournalStats {
        JournalStats::default()
    }

    async fn close(&self) {}
}
