//! The readers of a run's client stream: a streamed run whose caller's connection dropped
//! is not cancelled at once but after `runs.client_resume_grace_ms` with no reader, so a
//! caller can read its stream again in the meantime (the API's resume route). A run taken
//! back after an edge restart starts with no reader and no timer: only a reader that came
//! back and went away arms one.

use std::sync::Arc;

use super::Recovery;
use crate::domain::RunId;

impl Recovery {
    /// A reader of `run_id`'s stream went away: arms the grace timer when it was the last
    /// (cancels at once with a grace of 0).
    pub(in crate::app::runs) async fn reader_gone(self: &Arc<Self>, run_id: &RunId, reason: &str) {
        let Some(run) = self.placer.find(run_id) else {
            return;
        };
        let Some(epoch) = run.reader_left() else {
            return;
        };
        let grace = self.client_resume_grace;
        if grace.is_zero() {
            self.relay.cancel(run_id, reason).await;
            return;
        }
        // Cancelled after the grace, unless it ended or a reader came (or came and went:
        // that reader's leaving armed a timer of its own) since `epoch`.
        let relay = Arc::clone(&self.relay);
        let reason = reason.to_owned();
        let ended = run.ended().clone();
        self.timers.after(&ended, grace, async move {
            if run.unread_since(epoch) {
                relay.cancel(run.id(), &reason).await;
            }
        });
    }

    /// A caller reads `run_id`'s stream again; `false` when the run is not open.
    pub(in crate::app::runs) fn reader_back(&self, run_id: &RunId) -> bool {
        let Some(run) = self.placer.find(run_id) else {
            return false;
        };
        run.reader_came();
        true
    }
}
