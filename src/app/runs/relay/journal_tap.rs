//! What the relay hands the journal and a run's followers: each relayed event, numbered by
//! its position in the run, kept under the run's delivery lock and handed to the journal as
//! one batch before the lock is let go — so positions follow relay order, and a follower
//! registered next finds every earlier event on its way to the journal. Only enqueues — but
//! on a member of a site, where a run's end is shown only once the journal keeps it where
//! a takeover finds it, by a tracked task of its own.

use std::sync::Arc;

use super::{Relay, send_to_caller};
use crate::app::runs::delivery::{Delivery, Readers};
use crate::app::runs::run::Run;
use crate::domain::RunEvent;
use crate::ports::clock::now_ms;
use crate::ports::{JournalEntry, RelayedEvent};

impl Relay {
    /// Hands a relayed event to the run's followers and keeps it in `delivery` for the
    /// journal (a terminal one hands what is kept to the journal first), never waiting.
    /// Called under the run's delivery lock, so positions follow relay order.
    pub(super) fn tap(
        &self,
        run: &Run,
        delivery: &mut Delivery,
        event: &Arc<RunEvent>,
        first_output: bool,
    ) {
        let index = run.take_position();
        // Asked once per event: the port's answer is a dynamic call.
        let journaled = self.journal.enabled();
        if first_output || journaled {
            let at_ms = now_ms();
            if first_output {
                run.set_first_output_ms(at_ms);
            }
            if journaled {
                delivery.keep(RelayedEvent {
                    index,
                    at_ms,
                    event: Arc::clone(event),
                    first_output,
                });
            }
        }
        // A run's end reaches the journal before any follower or caller sees it: one that
        // saw the end and then reads the run (after a flush) finds the end there too.
        if event.kind.is_terminal() {
            self.hand_to_journal(run, delivery);
            if self.journal.shows_ends_once_kept() {
                self.show_end_once_kept(index, delivery.take_readers(), event);
                return;
            }
        }
        delivery.feed_followers(index, event);
    }

    /// Gives `readers` the run's end (its `index`th event) only once the journal keeps it
    /// where a takeover finds it ([`crate::ports::RunJournal::shows_ends_once_kept`]): on
    /// a member whose site's stream does not answer, a run shown completed would be one the member that
    /// takes over never hears of (found by the nemesis, seed 6601, issue 66). Not kept —
    /// the member stood down meanwhile, its batch left in its own file — or the service
    /// draining, the readers are let go without it: a resumable stream is broken off and
    /// resumed where the run acts now.
    fn show_end_once_kept(&self, index: u64, readers: Readers, event: &Arc<RunEvent>) {
        let journal = Arc::clone(&self.journal);
        let stopping = self.timers.stopping().clone();
        let event = Arc::clone(event);
        self.timers.spawn(async move {
            let kept = tokio::select! {
                () = journal.flush() => journal.kept_for_takeover(),
                () = stopping.cancelled() => false,
            };
            if !kept {
                return;
            }
            if let Some(caller) = readers.caller {
                // A caller that stopped reading misses nothing it would read.
                let _ = send_to_caller(&caller, Arc::clone(&event)).await;
            }
            for follower in readers.followers {
                // A follower that fell behind was to be dropped anyway.
                let _ = follower.try_send((index, Arc::clone(&event)));
            }
        });
    }

    /// Hands the events [`Self::tap`] kept to the journal as one entry. Called before the
    /// run's delivery lock is let go, so a follower registered next finds every earlier
    /// event on its way to the journal, and by `tap` as soon as a run's terminal event is
    /// kept (before anyone sees it, and so before the run leaves the table), so a reader
    /// finds the run's end in one or the other.
    pub(super) fn hand_to_journal(&self, run: &Run, delivery: &mut Delivery) {
        let events = delivery.take_kept();
        if events.is_empty() {
            return;
        }
        self.journal.record(JournalEntry::Events {
            run_id: run.id().clone(),
            events,
        });
    }
}
