//! The journal's write queue: the relay enqueues without waiting, the writer thread takes
//! batches.
//!
//! Bounded for events: when `capacity` entries wait, a new non-terminal event is left out
//! and counted. Run records (accepted, placed), first outputs and terminal events are always
//! admitted, so memory stays bounded by the capacity plus a few entries per open run and
//! every run that ends gets its ending written while the disk works. Enqueueing takes a
//! mutex for a push and wakes the writer only when it sleeps on an empty queue, so a busy
//! relay makes no system call per event.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::Duration;

use tokio::sync::watch;

use super::batch::Queued;
use super::snapshot::Control;

/// The queue between the relay and the writer thread.
pub(super) struct EntryQueue {
    state: Mutex<State>,
    wake: Condvar,
    capacity: usize,
    /// The number of entries written (or failed) so far, for `flush`.
    done: watch::Sender<u64>,
    pub(super) dropped_full: AtomicU64,
}

struct State {
    entries: VecDeque<Queued>,
    /// Entries ever admitted; the n-th admitted entry is done once `done` ≥ n.
    admitted: u64,
    /// The writer waits on `wake` for an empty queue to fill.
    parked: bool,
    /// A flush is waiting: the writer writes what is queued without lingering.
    urgent: bool,
    /// The `admitted` count the latest flush waits for.
    flush_target: u64,
    /// Work for the writer between two batches (see `snapshot.rs`).
    controls: Vec<Control>,
    closed: bool,
}

/// What the writer got from [`EntryQueue::take`].
pub(super) enum Taken {
    /// Write these (appended to the caller's buffer).
    Batch,
    /// Nothing arrived in time; do periodic work and come back.
    Idle,
    /// The queue is closed and empty: stop.
    Closed,
}

impl EntryQueue {
    pub(super) fn new(capacity: usize) -> Self {
        Self {
            state: Mutex::new(State {
                entries: VecDeque::new(),
                admitted: 0,
                parked: false,
                urgent: false,
                flush_target: 0,
                controls: Vec::new(),
                closed: false,
            }),
            wake: Condvar::new(),
            capacity,
            done: watch::Sender::new(0),
            dropped_full: AtomicU64::new(0),
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // Every critical section is a push or a drain, complete at each step.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Admits `entry` unless the queue is full and it may be left out; never waits.
    pub(super) fn push(&self, entry: Queued) {
        let mut state = self.lock();
        if state.closed {
            return;
        }
        if state.entries.len() >= self.capacity && entry.droppable() {
            drop(state);
            self.dropped_full.fetch_add(1, Ordering::Relaxed);
            return;
        }
        state.entries.push_back(entry);
        state.admitted += 1;
        if state.parked {
            state.parked = false;
            self.wake.notify_one();
        }
    }

    /// Admits `entries` whole, however full the queue (a replicated batch, applied as it
    /// was written); never waits.
    pub(super) fn push_all(&self, entries: Vec<Queued>) {
        let mut state = self.lock();
        // Nothing to wake the writer for (a claim is an empty batch): waking it would clear
        // `parked` while it goes on waiting, and the next push would not wake it.
        if state.closed || entries.is_empty() {
            return;
        }
        state.admitted += entries.len() as u64;
        state.entries.extend(entries);
        if state.parked {
            state.parked = false;
            self.wake.notify_one();
        }
    }

    /// Up to `max` entries, appended to `into` (a buffer the writer keeps, so a batch
    /// costs no fresh memory), waiting up to `idle` for the first (or for a flush).
    ///
    /// While runs keep coming the writer passes `unwoken` (its linger): the first part of
    /// the wait, up to `unwoken`, asks no pusher to wake it, and it looks again when that
    /// ends. A steady stream of runs then never makes the relay wake the writer (a system
    /// call on the relay's path, and a sleeping thread woken on another core); only a
    /// queue still empty after `unwoken` parks it until a push.
    pub(super) fn take(
        &self,
        max: usize,
        idle: Duration,
        unwoken: Duration,
        into: &mut Vec<Queued>,
    ) -> Taken {
        let waiting =
            |s: &mut State| s.entries.is_empty() && s.controls.is_empty() && !s.closed && !s.urgent;
        let unwoken = unwoken.min(idle);
        let mut state = self.lock();
        if waiting(&mut state) && !unwoken.is_zero() {
            state = self
                .wake
                .wait_timeout_while(state, unwoken, |s| {
                    !s.closed && !s.urgent && s.controls.is_empty()
                })
                .map_or_else(|p| p.into_inner().0, |(s, _)| s);
        }
        if waiting(&mut state) {
            state.parked = true;
            state = self
                .wake
                .wait_timeout_while(state, idle.saturating_sub(unwoken), waiting)
                .map_or_else(|p| p.into_inner().0, |(s, _)| s);
            state.parked = false;
        }
        if state.entries.is_empty() {
            return if state.closed {
                Taken::Closed
            } else {
                Taken::Idle
            };
        }
        let count = state.entries.len().min(max);
        into.extend(state.entries.drain(..count));
        Taken::Batch
    }

    /// Waits up to `linger` for more entries to gather, unless a flush is waiting (or
    /// comes) or the queue closes.
    pub(super) fn linger(&self, linger: Duration) {
        // Not `parked`: entries arriving meanwhile are what lingering waits for, and need
        // not wake it.
        let state = self.lock();
        let _state = self
            .wake
            .wait_timeout_while(state, linger, |s| {
                !s.urgent && !s.closed && s.controls.is_empty()
            })
            .map_or_else(|p| p.into_inner().0, |(s, _)| s);
    }

    /// Whether a flush waits: the writer then writes everything it holds back, too, until
    /// it has taken every entry admitted before the flush ([`EntryQueue::flush_served`]).
    pub(super) fn flush_waiting(&self) -> bool {
        self.lock().urgent
    }

    /// The writer has taken (and released) every entry up to `taken`: a flush waiting
    /// for no more than that needs no more hurry.
    pub(super) fn flush_served(&self, taken: u64) {
        let mut state = self.lock();
        if state.flush_target <= taken {
            state.urgent = false;
        }
    }

    /// Asks the writer for `control` after the batch it writes now; handed back when the
    /// queue is closed.
    pub(super) fn push_control(&self, control: Control) -> Result<(), Control> {
        let mut state = self.lock();
        if state.closed {
            return Err(control);
        }
        state.controls.push(control);
        self.wake.notify_one();
        Ok(())
    }

    /// The work asked of the writer since it last looked.
    pub(super) fn take_controls(&self) -> Vec<Control> {
        std::mem::take(&mut self.lock().controls)
    }

    /// Entries waiting.
    pub(super) fn depth(&self) -> usize {
        self.lock().entries.len()
    }

    /// Marks `count` more entries as written (or failed).
    pub(super) fn mark_done(&self, count: usize) {
        self.done.send_modify(|done| *done += count as u64);
    }

    /// Waits until every entry admitted before the call is done, or the writer is gone.
    pub(super) async fn flush(&self) {
        let target = {
            let mut state = self.lock();
            state.urgent = true;
            state.flush_target = state.admitted;
            self.wake.notify_one();
            state.admitted
        };
        let mut done = self.done.subscribe();
        let _ = done.wait_for(|d| *d >= target).await;
    }

    /// Stops admitting entries and wakes the writer to finish what is queued.
    pub(super) fn close(&self) {
        let mut state = self.lock();
        state.closed = true;
        self.wake.notify_all();
    }

    /// Marks everything as done for good: the writer has stopped; waiting flushes return.
    pub(super) fn writer_gone(&self) {
        self.done.send_modify(|done| *done = u64::MAX);
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::domain::{AdapterName, EventOrigin, RunEvent, RunEventKind, RunId, Target};
    use crate::ports::{JournalEntry, RelayedEvent};

    fn event(kind: RunEventKind) -> Queued {
        let entry = JournalEntry::Events {
            run_id: RunId::new("r"),
            events: vec![RelayedEvent {
                index: 0,
                at_ms: 0,
                first_output: false,
                event: Arc::new(RunEvent {
                    run_id: RunId::new("r"),
                    node: None,
                    adapter: AdapterName::parse("echo").unwrap(),
                    target: Target::parse("default").unwrap(),
                    seq: 1,
                    origin: EventOrigin::Node,
                    kind,
                    route: None,
                }),
            }],
        };
        Queued::of(entry, u64::MAX).0.unwrap()
    }

    #[test]
    fn while_runs_keep_coming_the_writer_waits_without_asking_to_be_woken() {
        let queue = Arc::new(EntryQueue::new(16));
        let taker = std::thread::spawn({
            let queue = Arc::clone(&queue);
            move || {
                let mut batch = Vec::new();
                let wait = Duration::from_millis(100);
                let taken = queue.take(10, wait, wait, &mut batch);
                (matches!(taken, Taken::Idle), batch.len())
            }
        });
        // The whole wait is unwoken: a push would never find the writer parked.
        while !taker.is_finished() {
            assert!(!queue.lock().parked);
            std::thread::yield_now();
        }
        assert_eq!(taker.join().expect("taker"), (true, 0));

        // What comes during an unwoken wait is taken when it ends; a flush (`urgent`, and a
        // notification) ends it at once.
        let taker = std::thread::spawn({
            let queue = Arc::clone(&queue);
            move || {
                let mut batch = Vec::new();
                let wait = Duration::from_secs(3600);
                queue.take(10, wait, wait, &mut batch);
                batch.len()
            }
        });
        queue.push(event(RunEventKind::text("x")));
        queue.lock().urgent = true;
        queue.wake.notify_one();
        assert_eq!(taker.join().expect("taker"), 1);
    }

    #[test]
    fn a_full_queue_leaves_out_events_but_admits_endings() {
        let queue = EntryQueue::new(2);
        for _ in 0..5 {
            queue.push(event(RunEventKind::text("x")));
        }
        assert_eq!(queue.depth(), 2);
        assert_eq!(queue.dropped_full.load(Ordering::Relaxed), 3);
        queue.push(event(RunEventKind::cancelled("c")));
        assert_eq!(queue.depth(), 3);
        let mut batch = Vec::new();
        let taken = queue.take(10, Duration::ZERO, Duration::ZERO, &mut batch);
        assert!(matches!(taken, Taken::Batch));
        assert_eq!(batch.len(), 3);
        let taken = queue.take(10, Duration::ZERO, Duration::ZERO, &mut batch);
        assert!(matches!(taken, Taken::Idle));
        queue.close();
        let taken = queue.take(10, Duration::ZERO, Duration::ZERO, &mut batch);
        assert!(matches!(taken, Taken::Closed));
    }

    #[tokio::test]
    async fn flush_waits_for_entries_admitted_before_it() {
        let queue = Arc::new(EntryQueue::new(8));
        queue.push(event(RunEventKind::Started));
        let flushing = tokio::spawn({
            let queue = Arc::clone(&queue);
            async move { queue.flush().await }
        });
        tokio::task::yield_now().await;
        assert!(!flushing.is_finished());
        queue.mark_done(1);
        flushing.await.unwrap();
    }
}
