//! What the relay hands the journal and a run's followers: each relayed event, numbered by
//! its position in the run, kept under the run's delivery lock and handed to the journal as
//! one batch before the lock is let go — so positions follow relay order, and a follower
//! registered next finds every earlier event on its way to the journal. Only enqueues.

use std::sync::Arc;

use super::Relay;
use crate::app::runs::delivery::Delivery;
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
        }
        delivery.feed_followers(index, event);
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
