//! The readers of a run's client stream: a streamed run whose caller's connection dropped
//! is not cancelled at once but after `runs.client_resume_grace_ms` with no reader, so a
//! caller can resume its stream in the meantime (the API's resume route). A run taken back
//! after an edge restart starts with no reader and no timer: only a resumed reader that
//! goes away arms one.

use std::sync::Arc;

use super::service::RunService;
use super::table::{Run, lock};
use crate::domain::RunId;

impl RunService {
    /// A reader of `run_id`'s stream went away: arms the grace timer when it was the last
    /// (cancels at once with a grace of 0).
    pub(super) async fn reader_gone(&self, run_id: &RunId, reason: &str) {
        let Some(run) = lock(&self.inner.table).runs.get(run_id).cloned() else {
            return;
        };
        let epoch = {
            let mut readers = lock(&run.readers);
            readers.count = readers.count.saturating_sub(1);
            readers.epoch += 1;
            if readers.count > 0 {
                return;
            }
            readers.epoch
        };
        let grace = self.inner.config.client_resume_grace();
        if grace.is_zero() {
            self.cancel(run_id, reason).await;
            return;
        }
        self.arm_reader_grace(run, epoch, reason.to_owned());
    }

    /// A caller resumed `run_id`'s stream; `false` when the run is not open.
    pub(super) fn reader_back(&self, run_id: &RunId) -> bool {
        let Some(run) = lock(&self.inner.table).runs.get(run_id).cloned() else {
            return false;
        };
        let mut readers = lock(&run.readers);
        readers.count += 1;
        readers.epoch += 1;
        true
    }

    /// Cancels `run` for `reason` after the grace, unless it ended or a reader came (or
    /// came and went: that reader's leaving armed a timer of its own) since `epoch`.
    fn arm_reader_grace(&self, run: Arc<Run>, epoch: u64, reason: String) {
        let service = self.clone();
        let grace = self.inner.config.client_resume_grace();
        self.inner.timers.spawn(async move {
            tokio::select! {
                () = run.ended.cancelled() => {}
                () = tokio::time::sleep(grace) => {
                    let unread = {
                        let readers = lock(&run.readers);
                        readers.count == 0 && readers.epoch == epoch
                    };
                    if unread {
                        service.cancel(&run.id, &reason).await;
                    }
                }
            }
        });
    }
}
