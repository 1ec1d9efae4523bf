//! Run listings, records and cancels: open runs from the run service, finished ones from
//! the journal.

use tracing::info;

use super::{ManageError, Management};
use crate::domain::{RunId, RunOutcome, RunPage, RunQuery, RunRecord, RunStateFilter, merge_page};

impl Management {
    /// One page of runs matching `query`, newest first: open runs from the run service,
    /// finished ones from the journal (none when it is disabled).
    ///
    /// A run is listed from the moment it is accepted until retention removes it: the open
    /// runs are read first, then the journal is flushed, and a run hands its ending to the
    /// journal before it leaves the open runs — so a run that ends in between is found in
    /// one or the other (in both, it is shown as finished).
    ///
    /// # Errors
    /// [`ManageError::Journal`] when the journal cannot be read.
    pub async fn runs(&self, query: &RunQuery) -> Result<RunPage, ManageError> {
        let open = if query.state == RunStateFilter::Finished {
            Vec::new()
        } else {
            self.inner.live.open_records()
        };
        let journal = &self.inner.journal;
        let finished = if query.state != RunStateFilter::Open && journal.enabled() {
            journal.flush().await;
            journal.finished_runs(query).await?
        } else {
            Vec::new()
        };
        Ok(merge_page(query, open, finished))
    }

    /// The record of run `id`: live while it is open, from the journal once it ended.
    ///
    /// # Errors
    /// [`ManageError::Journal`] when the journal cannot be read.
    pub async fn run(&self, id: &RunId) -> Result<Option<RunRecord>, ManageError> {
        if let Some(open) = self.inner.live.open_record(id) {
            return Ok(Some(open));
        }
        self.journal_run(id).await
    }

    /// Run `id`'s record in the journal, what was queued for it included: a run that ended
    /// a moment ago may have its ending — a short one its whole record — still on the way
    /// to the disk, so a miss or an open record waits for the writer and reads again.
    async fn journal_run(&self, id: &RunId) -> Result<Option<RunRecord>, ManageError> {
        let journal = &self.inner.journal;
        let found = journal.run(id).await?;
        if found.as_ref().is_none_or(|r| r.outcome == RunOutcome::Open) {
            journal.flush().await;
            return Ok(journal.run(id).await?);
        }
        Ok(found)
    }

    /// Cancels open run `id`, as a caller's cancel does: a queued run ends at once, a
    /// dispatched one is sent `CancelRun` and ends with the node's answer or after the
    /// cancel grace.
    ///
    /// # Errors
    /// [`ManageError::RunEnded`] when it has ended, [`ManageError::UnknownRun`] when no run
    /// has that id, [`ManageError::Journal`] when the journal cannot be read.
    pub async fn cancel(&self, id: &RunId) -> Result<(), ManageError> {
        if self.inner.live.cancel(id, "cancelled by an operator").await {
            info!(run_id = %id, "run cancelled through the management API");
            return Ok(());
        }
        match self.journal_run(id).await? {
            Some(_) => Err(ManageError::RunEnded(id.to_string())),
            None => Err(ManageError::UnknownRun(id.to_string())),
        }
    }
}
