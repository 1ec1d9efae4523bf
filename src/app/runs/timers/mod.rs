//! Timers: the part of the run service that owns its background tasks — the timers that
//! end a run the node does not (a deadline, a queue wait, a cancel's grace, a resume's
//! grace, a reader's grace), the deferred endings, the pumps after a breaker's cooldown —
//! and the open runs' deadlines (`deadlines.rs`), kept by one task. What a timer does when
//! it fires is its caller's; this part only starts, tracks and stops the tasks, so the
//! drain can wait for every one of them.

mod deadlines;

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

pub(super) use self::deadlines::{Added, Deadlines};

/// The run service's background tasks and its runs' deadlines.
pub(super) struct Timers {
    tracker: TaskTracker,
    deadlines: Arc<Deadlines>,
    /// Cancelled when the drain begins: stops the pumps that wait for breakers to cool.
    stopping: CancellationToken,
}

impl Timers {
    /// No task yet; `stopping` is cancelled when the drain begins.
    pub(super) fn new(stopping: CancellationToken) -> Self {
        Self {
            tracker: TaskTracker::new(),
            deadlines: Arc::default(),
            stopping,
        }
    }

    /// Runs `task` in the background, tracked until it ends.
    pub(super) fn spawn(&self, task: impl Future<Output = ()> + Send + 'static) {
        self.tracker.spawn(task);
    }

    /// Runs `then` after `delay`, unless `ended` is cancelled first.
    pub(super) fn after(
        &self,
        ended: &CancellationToken,
        delay: Duration,
        then: impl Future<Output = ()> + Send + 'static,
    ) {
        let ended = ended.clone();
        self.tracker.spawn(async move {
            tokio::select! {
                () = ended.cancelled() => {}
                () = tokio::time::sleep(delay) => then.await,
            }
        });
    }

    /// Runs `then` after `delay`, unless the drain begins first.
    pub(super) fn after_unless_stopping(
        &self,
        delay: Duration,
        then: impl Future<Output = ()> + Send + 'static,
    ) {
        self.after(&self.stopping, delay, then);
    }

    /// Cancelled when the drain begins.
    pub(super) fn stopping(&self) -> &CancellationToken {
        &self.stopping
    }

    /// The open runs' deadlines.
    pub(super) fn deadlines(&self) -> &Arc<Deadlines> {
        &self.deadlines
    }

    /// The drain's end: the deadlines' task stops, no task starts any more, and this waits
    /// for the running ones.
    pub(super) async fn stop(&self) {
        self.deadlines.stop();
        self.tracker.close();
        self.tracker.wait().await;
    }

    /// How many tasks run now.
    #[cfg(test)]
    pub(super) fn len(&self) -> usize {
        self.tracker.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_timer_fires_after_its_delay_unless_its_run_ended() {
        let timers = Timers::new(CancellationToken::new());
        let (fired, mut heard) = tokio::sync::mpsc::unbounded_channel();
        let ended = CancellationToken::new();
        for (name, delay) in [("kept", 10), ("ended", 20)] {
            let fired = fired.clone();
            let run = if name == "ended" {
                ended.clone()
            } else {
                CancellationToken::new()
            };
            timers.after(&run, Duration::from_millis(delay), async move {
                let _ = fired.send(name);
            });
        }
        ended.cancel();
        assert_eq!(heard.recv().await, Some("kept"));
        drop(fired);
        timers.stop().await;
        assert_eq!(
            heard.recv().await,
            None,
            "the ended run's timer never fired"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn the_drain_stops_the_cooldown_pumps_and_waits_for_the_rest() {
        let stopping = CancellationToken::new();
        let timers = Timers::new(stopping.clone());
        let (fired, mut heard) = tokio::sync::mpsc::unbounded_channel();
        let pump = fired.clone();
        timers.after_unless_stopping(Duration::from_secs(30), async move {
            let _ = pump.send("pump");
        });
        timers.spawn(async move {
            tokio::time::sleep(Duration::from_millis(5)).await;
            let _ = fired.send("task");
        });
        assert_eq!(timers.len(), 2);
        stopping.cancel();
        timers.stop().await;
        assert_eq!(heard.recv().await, Some("task"));
        assert_eq!(heard.recv().await, None, "the pump never ran");
        assert_eq!(timers.len(), 0);
    }
}
