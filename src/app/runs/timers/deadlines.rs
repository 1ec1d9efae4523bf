//! The open runs' deadlines, kept by one task for the whole service: accepting a run adds
//! its deadline to an ordered set and spawns nothing, ending it takes the deadline out and
//! wakes nobody, and the task is woken only by a deadline sooner than the one it sleeps
//! until (decision 37).
//!
//! A task per run, as before, cost every run a spawn on the request's path (waking the
//! other worker to steal it) and a wake-up when the run ended.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use tokio::sync::Notify;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::app::runs::run::{Run, lock};

/// A run's place in the set: its deadline, then its address (unique while it is open, and
/// the set holds it open).
type Key = (Instant, usize);

/// The set of deadlines and what wakes its task.
#[derive(Default)]
pub(in crate::app::runs) struct Deadlines {
    state: Mutex<State>,
    /// Wakes the task for a deadline sooner than the one it sleeps until.
    sooner: Notify,
    /// Ends the task (the drain, once every run has ended).
    stopped: CancellationToken,
}

#[derive(Default)]
struct State {
    due: BTreeMap<Key, Arc<Run>>,
    /// What the task sleeps until; `None` while it waits for a first deadline.
    armed: Option<Instant>,
    /// Whether the task has been spawned (on the first deadline: the service may be built
    /// outside a runtime).
    started: bool,
}

/// What [`Deadlines::add`] asks of its caller.
#[derive(Debug, PartialEq, Eq)]
pub(in crate::app::runs) enum Added {
    /// Nothing: the task will see the deadline in time.
    Kept,
    /// Spawn the task: this is the first deadline.
    StartTask,
}

impl Deadlines {
    /// Adds `run`'s deadline, if it has one. Wakes the task only when it sleeps until later.
    pub(in crate::app::runs) fn add(&self, run: &Arc<Run>) -> Added {
        let Some(key) = key_of(run) else {
            return Added::Kept;
        };
        let mut state = lock(&self.state);
        state.due.insert(key, Arc::clone(run));
        if !state.started {
            state.started = true;
            state.armed = Some(key.0);
            return Added::StartTask;
        }
        if state.armed.is_none_or(|armed| key.0 < armed) {
            state.armed = Some(key.0);
            self.sooner.notify_one();
        }
        Added::Kept
    }

    /// Takes `run`'s deadline out (it ended). The task is not woken: if it sleeps until this
    /// deadline, it wakes then, finds nothing due and sleeps again.
    pub(in crate::app::runs) fn remove(&self, run: &Arc<Run>) {
        if let Some(key) = key_of(run) {
            lock(&self.state).due.remove(&key);
        }
    }

    /// Takes out the runs whose deadline has passed at `now` into `expired`, and says when
    /// the next one is due (what the task then sleeps until).
    pub(in crate::app::runs) fn take_expired(
        &self,
        now: Instant,
        expired: &mut Vec<Arc<Run>>,
    ) -> Option<Instant> {
        let mut state = lock(&self.state);
        while let Some(entry) = state.due.first_entry()
            && entry.key().0 <= now
        {
            expired.push(entry.remove());
        }
        state.armed = state.due.first_key_value().map(|(key, _)| key.0);
        state.armed
    }

    /// Waits until `next` (or, without one, indefinitely) or until a sooner deadline comes
    /// in; `false` once the task must end.
    pub(in crate::app::runs) async fn sleep(&self, next: Option<Instant>) -> bool {
        let until = async {
            match next {
                Some(when) => tokio::time::sleep_until(when).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            () = self.stopped.cancelled() => false,
            () = self.sooner.notified() => true,
            () = until => true,
        }
    }

    /// Ends the task.
    pub(in crate::app::runs) fn stop(&self) {
        self.stopped.cancel();
    }

    /// How many deadlines are kept.
    #[cfg(test)]
    pub(in crate::app::runs) fn len(&self) -> usize {
        lock(&self.state).due.len()
    }
}

/// `run`'s place in the set; `None` without a deadline, or with one too far away to
/// name as an instant (it never passes).
fn key_of(run: &Arc<Run>) -> Option<Key> {
    let when = run.accepted_at().checked_add(run.spec().deadline?)?;
    Some((when, Arc::as_ptr(run) as usize))
}
