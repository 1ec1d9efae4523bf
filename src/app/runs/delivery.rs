//! [`Delivery`]: what is delivered for one run — its state machine (the domain's
//! `RunState`), its caller's stream, its followers, the events not yet handed to the
//! journal, and what it relayed so far ([`Progress`]) — guarded by one async lock per run,
//! and every step the relay takes with it. Recovery reads it through the methods here.

use std::sync::Arc;

use tokio::sync::mpsc;

use crate::app::runs::progress::Progress;
use crate::domain::{EventVerdict, RunEvent, RunEventKind, RunState};
use crate::ports::RelayedEvent;

/// What is delivered for a run, guarded by one async lock so its events keep their order
/// and exactly one of them is terminal.
pub(in crate::app::runs) struct Delivery {
    state: RunState,
    /// The caller's stream; `None` once the run ended or the caller stopped listening.
    caller: Option<mpsc::Sender<Arc<RunEvent>>>,
    /// Whether an `output` event has been relayed (for time-to-first-output, and because
    /// no attempt is made after output reached the caller).
    saw_output: bool,
    /// Added to a node's sequence numbers: the last number relayed before the current
    /// attempt, so the attempts of a failed-over run number one stream.
    seq_base: u64,
    /// Management API followers of the run's events, with each event's position; one that
    /// falls behind is dropped, never waited for.
    followers: Vec<mpsc::Sender<(u64, Arc<RunEvent>)>>,
    /// Events relayed under this hold of the lock, handed to the journal as one batch
    /// before the lock is let go (`Relay::hand_to_journal`).
    journal: Vec<RelayedEvent>,
    /// What was relayed, for a continuation (kept only when continuations are on).
    progress: Progress,
}

/// Who reads a run's events as they are relayed: its caller and its followers.
pub(in crate::app::runs) struct Readers {
    pub(in crate::app::runs) caller: Option<mpsc::Sender<Arc<RunEvent>>>,
    pub(in crate::app::runs) followers: Vec<mpsc::Sender<(u64, Arc<RunEvent>)>>,
}

impl Delivery {
    /// A run's delivery before its first event, feeding `caller`.
    pub(in crate::app::runs) fn new(caller: mpsc::Sender<Arc<RunEvent>>) -> Self {
        Self {
            state: RunState::default(),
            caller: Some(caller),
            saw_output: false,
            seq_base: 0,
            followers: Vec::new(),
            journal: Vec::new(),
            progress: Progress::default(),
        }
    }

    /// The delivery of a run taken back after an edge restart, which relayed up to
    /// `last_seq` (`seq_base` before its current attempt's `started`): no caller yet
    /// (callers resume from the journal), and repeats of what it relayed are dropped.
    pub(in crate::app::runs) fn adopted(last_seq: u64, seq_base: u64, saw_output: bool) -> Self {
        Self {
            state: RunState::adopted(last_seq),
            caller: None,
            saw_output,
            seq_base,
            followers: Vec::new(),
            journal: Vec::new(),
            progress: Progress::default(),
        }
    }

    /// Whether an `output` event has been relayed.
    pub(in crate::app::runs) fn saw_output(&self) -> bool {
        self.saw_output
    }

    /// Whether the run has had its terminal event.
    pub(in crate::app::runs) fn is_finished(&self) -> bool {
        self.state.is_finished()
    }

    /// The last seq relayed from the current attempt, in its node's numbering; 0 when it
    /// has relayed nothing.
    pub(in crate::app::runs) fn last_node_seq(&self) -> u64 {
        self.state.last_seq().saturating_sub(self.seq_base)
    }

    /// The current attempt resumes on a new connection: what its node sends again is
    /// dropped.
    pub(in crate::app::runs) fn resume(&mut self) {
        self.state.resume();
    }

    /// Adds a follower of the run's next events; `false` when the run has ended.
    pub(in crate::app::runs) fn follow(
        &mut self,
        follower: mpsc::Sender<(u64, Arc<RunEvent>)>,
    ) -> bool {
        if self.state.is_finished() {
            return false;
        }
        self.followers.push(follower);
        true
    }
}

/// The steps the relay takes with a run's delivery, under its lock.
impl Delivery {
    /// The run's number for an event the node numbered `seq` (its attempts number one
    /// stream), or for the edge's own event (`None`): the next one.
    pub(in crate::app::runs) fn number(&mut self, seq: Option<u64>) -> u64 {
        match seq {
            Some(seq) => seq.saturating_add(self.seq_base),
            None => self.state.next_edge_seq(),
        }
    }

    /// Offers the event numbered `seq` to the run's state: relay it, or drop it.
    pub(in crate::app::runs) fn offer(&mut self, seq: u64, kind: &RunEventKind) -> EventVerdict {
        self.state.offer(seq, kind)
    }

    /// Notes an event about to be relayed in what the run relayed (its text kept when
    /// `keep_text`); a terminal one gets its usage settled.
    pub(in crate::app::runs) fn note(&mut self, kind: &mut RunEventKind, keep_text: bool) {
        self.progress.note(kind, keep_text);
    }

    /// Whether `kind`, about to be relayed, is the run's first output (noting it).
    pub(in crate::app::runs) fn first_output(&mut self, kind: &RunEventKind) -> bool {
        let first = !self.saw_output && matches!(kind, RunEventKind::Output { .. });
        self.saw_output |= first;
        first
    }

    /// What the run relayed, once output reached its caller (what a continuation carries
    /// on from).
    pub(in crate::app::runs) fn progress_after_output(&self) -> Option<&Progress> {
        self.saw_output.then_some(&self.progress)
    }

    /// The run goes on with another attempt: what was relayed is carried, and the next
    /// attempt's events number on from the last relayed.
    pub(in crate::app::runs) fn next_attempt(&mut self) {
        if self.saw_output {
            self.progress.carry();
        }
        self.seq_base = self.state.next_edge_seq() - 1;
    }

    /// Keeps a relayed event for the journal's next batch.
    pub(in crate::app::runs) fn keep(&mut self, event: RelayedEvent) {
        self.journal.push(event);
    }

    /// The events kept for the journal, taken as one batch.
    pub(in crate::app::runs) fn take_kept(&mut self) -> Vec<RelayedEvent> {
        std::mem::take(&mut self.journal)
    }

    /// Hands a relayed event at `index` to the followers; one that is full or gone is
    /// dropped (it resumes from the journal).
    pub(in crate::app::runs) fn feed_followers(&mut self, index: u64, event: &Arc<RunEvent>) {
        if !self.followers.is_empty() {
            self.followers
                .retain(|f| f.try_send((index, Arc::clone(event))).is_ok());
        }
    }

    /// The caller's stream, while someone reads it.
    pub(in crate::app::runs) fn caller(&self) -> Option<&mpsc::Sender<Arc<RunEvent>>> {
        self.caller.as_ref()
    }

    /// The caller's stream and the followers, taken to be given the run's end later
    /// (`Relay::show_end_once_kept`): nothing more reaches them from here.
    pub(in crate::app::runs) fn take_readers(&mut self) -> Readers {
        Readers {
            caller: self.caller.take(),
            followers: std::mem::take(&mut self.followers),
        }
    }

    /// The caller stopped reading: no more events go to it.
    pub(in crate::app::runs) fn drop_caller(&mut self) {
        self.caller = None;
    }

    /// The run is let go without an ending (this member stopped acting for its site):
    /// its caller and followers are let go, and what waits for the journal is dropped.
    pub(in crate::app::runs) fn let_go(&mut self) {
        self.finish();
        self.journal.clear();
    }

    /// The run had its terminal event: its caller and followers are let go.
    pub(in crate::app::runs) fn finish(&mut self) {
        self.caller = None;
        self.followers.clear();
    }
}
