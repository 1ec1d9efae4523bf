//! The bookkeeping behind the run table, without locks or waiting: per run, the events it
//! produced, how far they were written on the current connection, and which the edge may
//! still lack; across runs, the bounds that make a run be given up while disconnected.
//!
//! Pure apart from each run's stop channel (a `watch` sender, used without awaiting). The
//! words of the run table — its limits ([`BufferLimits`]), why a run is not admitted
//! ([`Refusal`]) or must stop ([`Stop`]), what is unsent ([`Unsent`]) and what resumed
//! ([`Resumed`]) — are defined here, below the table ([`crate::runs`]), which uses them in
//! its own API and re-exports them.
//!
//! The writer's path costs what it writes, not what is held: runs with events to write
//! wait in a queue of their own, each run's unsent events are the tail of its held ones, and
//! the running runs and held bytes are counted as they change. An edge that acknowledges
//! pings lets a node hold every run that ended since the last acknowledgement (a heartbeat
//! interval, 5 s as shipped): thousands under load, which a walk over all of them for every
//! write made cost in proportion to the square of the rate.

use std::collections::{HashMap, VecDeque};

use edge::client::{NodeFrame, run_event};
use edge::domain::{ResumeAnswer, ResumeClaim, RunEventKind};
use tokio::sync::watch;

/// What [`Buffers::take_unsent`] (and the run table's `take_unsent`) found.
#[derive(Debug, Default)]
pub struct Unsent {
    /// The frames to write, each run's in order.
    pub frames: Vec<NodeFrame>,
    /// Whether any of them ends a run.
    pub terminal: bool,
}

/// How the edge's resume answers went.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Resumed {
    /// Runs re-attached.
    pub accepted: usize,
    /// Runs refused (or left unanswered) and forgotten.
    pub refused: usize,
}

/// How much a run may buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BufferLimits {
    /// Unsent events a run may get ahead of the writer while connected before it waits.
    pub window: usize,
    /// Sent events each run keeps while connected to an edge that does not acknowledge, to
    /// send again after a cut (with one that does, everything not yet acknowledged is kept,
    /// up to `run_events`).
    pub keep_sent: usize,
    /// Events one run may hold while disconnected before it is given up.
    pub run_events: usize,
    /// Bytes all runs together may hold (roughly) while disconnected.
    pub total_bytes: usize,
}

impl Default for BufferLimits {
    fn default() -> Self {
        Self {
            window: 64,
            keep_sent: 32,
            run_events: 4_096,
            total_bytes: 64 * 1024 * 1024,
        }
    }
}

/// Why a run must stop.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Stop {
    /// The edge cancelled it: answer `cancelled` with this reason.
    Cancel(String),
    /// The node is shutting down: answer `cancelled`.
    Shutdown,
    /// Drop it without a word: the edge refused its resume, or its buffer overflowed.
    Forget,
}

/// Why a run was not admitted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// `max_concurrent_runs` runs are already running.
    Busy,
    /// The node is shutting down.
    Draining,
    /// A run with this id is already here.
    Duplicate,
}

/// What became of an event offered with [`Buffers::push`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Push {
    /// Taken.
    Done,
    /// Not taken: the run is a window ahead of the writer; offer it again later.
    Wait,
    /// Not taken: the node no longer holds the run (or it was given up just now).
    Gone,
}

#[derive(Debug)]
struct Held {
    seq: u64,
    kind: RunEventKind,
    size: usize,
    /// The write batch that sent it on the current connection.
    written: Option<u64>,
}

#[derive(Debug)]
struct Entry {
    next_seq: u64,
    held: VecDeque<Held>,
    sent_upto: u64,
    attached: bool,
    terminal: Option<u64>,
    /// In the queue of runs with events to write.
    queued: bool,
    stop: watch::Sender<Option<Stop>>,
}

impl Entry {
    fn new(attached: bool) -> Self {
        Self {
            next_seq: 1,
            held: VecDeque::new(),
            sent_upto: 0,
            attached,
            terminal: None,
            queued: false,
            stop: watch::Sender::new(None),
        }
    }

    fn bytes(&self) -> usize {
        self.held.iter().map(|h| h.size).sum()
    }

    fn first_buffered(&self) -> u64 {
        self.held.front().map_or(self.next_seq, |h| h.seq)
    }

    fn delivered(&self) -> bool {
        self.terminal.is_some_and(|t| self.sent_upto >= t)
    }

    /// Where its unsent events begin among the held ones (held seqs are consecutive).
    fn first_unsent(&self) -> usize {
        self.held.partition_point(|h| h.seq <= self.sent_upto)
    }

    /// Whether it has events to write on the current connection.
    fn has_unsent(&self) -> bool {
        self.attached && self.held.back().is_some_and(|h| h.seq > self.sent_upto)
    }

    /// Drops the sent events past the last `keep` of them; the bytes freed.
    fn trim_sent(&mut self, keep: usize) -> usize {
        let sent = self.first_unsent();
        self.held
            .drain(..sent.saturating_sub(keep))
            .map(|h| h.size)
            .sum()
    }

    fn push(&mut self, kind: RunEventKind) -> usize {
        let seq = self.next_seq;
        self.next_seq += 1;
        if kind.is_terminal() {
            self.terminal = Some(seq);
        }
        let size = size_of_event(&kind);
        self.held.push_back(Held {
            seq,
            kind,
            size,
            written: None,
        });
        size
    }

    fn ask_to_stop(&self, stop: &Stop) {
        self.stop.send_if_modified(|current| {
            let first = current.is_none();
            if first {
                *current = Some(stop.clone());
            }
            first
        });
    }
}

/// Every run's events and the bounds on them.
#[derive(Debug)]
pub struct Buffers {
    runs: HashMap<String, Entry>,
    /// Runs that may have events to write, oldest first (an id may be stale: its run gone).
    ready: VecDeque<String>,
    /// Runs without their terminal event yet.
    open: usize,
    limits: BufferLimits,
    total_bytes: usize,
    draining: bool,
    link_up: bool,
    edge_acks: bool,
}

impl Buffers {
    /// Nothing held yet.
    pub fn new(limits: BufferLimits) -> Self {
        Self {
            runs: HashMap::new(),
            ready: VecDeque::new(),
            open: 0,
            limits,
            total_bytes: 0,
            draining: false,
            link_up: false,
            edge_acks: false,
        }
    }

    /// Admits `run_id` if fewer than `max_running` runs are running; returns its stop channel.
    ///
    /// # Errors
    /// The [`Refusal`] when draining, busy, or the run is already here.
    pub fn admit(
        &mut self,
        run_id: &str,
        max_running: usize,
    ) -> Result<watch::Receiver<Option<Stop>>, Refusal> {
        if self.draining {
            return Err(Refusal::Draining);
        }
        if self.runs.contains_key(run_id) {
            return Err(Refusal::Duplicate);
        }
        if self.running() >= max_running {
            return Err(Refusal::Busy);
        }
        let entry = Entry::new(self.link_up);
        let stop = entry.stop.subscribe();
        self.runs.insert(run_id.to_owned(), entry);
        self.open += 1;
        Ok(stop)
    }

    /// Holds `kind` as the one and terminal event of a run that was not admitted.
    pub fn refuse(&mut self, run_id: &str, kind: RunEventKind) {
        if self.runs.contains_key(run_id) {
            return;
        }
        let mut entry = Entry::new(self.link_up);
        self.total_bytes += entry.push(kind);
        self.runs.insert(run_id.to_owned(), entry);
        self.queue(run_id);
    }

    /// Puts `run_id` in the queue of runs to write, unless it is there or has nothing.
    fn queue(&mut self, run_id: &str) {
        if let Some(entry) = self.runs.get_mut(run_id)
            && !entry.queued
            && entry.has_unsent()
        {
            entry.queued = true;
            self.ready.push_back(run_id.to_owned());
        }
    }

    /// Asks `run_id` to stop; false when it is not held.
    pub fn stop(&self, run_id: &str, stop: &Stop) -> bool {
        self.runs
            .get(run_id)
            .inspect(|entry| entry.ask_to_stop(stop))
            .is_some()
    }

    /// Asks every run to stop.
    pub fn stop_all(&self, stop: &Stop) {
        self.runs.values().for_each(|entry| entry.ask_to_stop(stop));
    }

    /// Refuse runs from now on.
    pub fn set_draining(&mut self) {
        self.draining = true;
    }

    /// Runs without their terminal event yet.
    pub fn running(&self) -> usize {
        self.open
    }

    /// Whether nothing is held.
    pub fn is_empty(&self) -> bool {
        self.runs.is_empty()
    }

    /// Offers run `run_id` its next event; takes it out of `kind` when it is taken.
    pub fn push(&mut self, run_id: &str, kind: &mut Option<RunEventKind>) -> Push {
        let limits = self.limits;
        let Some(entry) = self.runs.get_mut(run_id).filter(|e| e.terminal.is_none()) else {
            return Push::Gone;
        };
        let unsent = usize::try_from(entry.next_seq - 1 - entry.sent_upto).unwrap_or(usize::MAX);
        if entry.attached && unsent >= limits.window {
            return Push::Wait;
        }
        let Some(kind) = kind.take() else {
            return Push::Done;
        };
        if kind.is_terminal() {
            self.open = self.open.saturating_sub(1);
        }
        self.total_bytes += entry.push(kind);
        let over = entry.held.len() > limits.run_events || self.total_bytes > limits.total_bytes;
        if entry.attached {
            self.queue(run_id);
        } else if over {
            tracing::warn!(
                run_id,
                held = entry.held.len(),
                "resume buffer full while disconnected: giving the run up"
            );
            self.forget(run_id);
            return Push::Gone;
        }
        Push::Done
    }

    /// The unsent events of attached runs (at most `max` frames), marked as written in
    /// batch `batch`; trims sent events past what is kept and retires delivered runs.
    pub fn take_unsent(&mut self, batch: u64, max: usize) -> Unsent {
        let mut unsent = Unsent::default();
        while unsent.frames.len() < max {
            let Some(run_id) = self.ready.pop_front() else {
                break;
            };
            let Some(entry) = self.runs.get_mut(&run_id) else {
                continue;
            };
            entry.queued = false;
            if !entry.attached {
                continue;
            }
            let first = entry.first_unsent();
            for held in entry.held.iter_mut().skip(first) {
                if unsent.frames.len() >= max {
                    break;
                }
                unsent
                    .frames
                    .push(run_event(&run_id, held.seq, held.kind.clone()));
                unsent.terminal |= held.kind.is_terminal();
                held.written = Some(batch);
                entry.sent_upto = held.seq;
            }
            self.retire_or_trim(&run_id);
            self.queue(&run_id);
        }
        unsent
    }

    /// After some of `run_id`'s events were written: forgets it when delivered and nothing
    /// of it needs keeping (see [`Self::settle`]), else drops the sent events past what is
    /// kept. An acking edge confirms what it read, so unconfirmed events are kept (up to
    /// the per-run bound); with one that never acks, only the last few.
    fn retire_or_trim(&mut self, run_id: &str) {
        let (edge_acks, limits) = (self.edge_acks, self.limits);
        let Some(entry) = self.runs.get_mut(run_id) else {
            return;
        };
        let keep_sent = if edge_acks {
            limits.run_events
        } else {
            limits.keep_sent
        };
        self.total_bytes = self.total_bytes.saturating_sub(entry.trim_sent(keep_sent));
        if entry.delivered() && (!edge_acks || entry.held.is_empty()) {
            let bytes = entry.bytes();
            self.total_bytes = self.total_bytes.saturating_sub(bytes);
            self.runs.remove(run_id);
        }
    }

    /// The edge has everything written up to batch `batch` (a later ping was answered).
    pub fn acknowledged(&mut self, batch: u64) {
        self.edge_acks = true;
        for entry in self.runs.values_mut() {
            entry.held.retain(|h| h.written.is_none_or(|w| w > batch));
        }
        self.settle();
    }

    /// A connection is registered. An edge that said so at registration
    /// (`edge_acknowledges`), or that acknowledged on an earlier connection, is taken to
    /// acknowledge before its first ack here: a run that ends in that moment is kept until
    /// acknowledged, so a cut right after it cannot lose its last events. (An edge
    /// downgraded meanwhile costs only the memory of such runs until the next reconnect,
    /// where it leaves their claims unanswered and they are dropped.)
    pub fn link_up(&mut self, edge_acknowledges: bool) {
        self.link_up = true;
        self.edge_acks |= edge_acknowledges;
    }

    /// The connection is gone: every run is detached and buffers until the next one.
    pub fn link_down(&mut self) {
        self.link_up = false;
        for entry in self.runs.values_mut() {
            entry.attached = false;
            entry.held.iter_mut().for_each(|h| h.written = None);
        }
        self.runs
            .retain(|_, e| !(e.delivered() && e.held.is_empty()));
        self.recount();
    }

    /// A resume claim for every run held.
    pub fn claims(&self) -> Vec<ResumeClaim> {
        let claim = |(run_id, entry): (&String, &Entry)| ResumeClaim {
            run_id: run_id.clone(),
            next_seq: entry.next_seq,
            first_buffered_seq: entry.first_buffered(),
        };
        self.runs.iter().map(claim).collect()
    }

    /// Applies the edge's `answers` to `claims`: accepted runs are attached from the seq the
    /// edge wants; refused ones, claims left unanswered (an edge without resume) and runs
    /// not claimed are stopped and forgotten.
    pub fn apply_answers(&mut self, claims: &[ResumeClaim], answers: &[ResumeAnswer]) -> Resumed {
        let mut resumed = Resumed::default();
        let unclaimed: Vec<String> = self
            .runs
            .keys()
            .filter(|id| !claims.iter().any(|c| &c.run_id == *id))
            .cloned()
            .collect();
        unclaimed.iter().for_each(|run_id| self.forget(run_id));
        for claim in claims {
            let answer = answers
                .iter()
                .find(|a| a.run_id == claim.run_id)
                .map(|a| a.outcome);
            let attached = match answer {
                Some(Ok(from)) => self.attach(&claim.run_id, from),
                Some(Err(refusal)) => {
                    tracing::info!(run_id = %claim.run_id, reason = refusal.as_str(), "the edge refused to resume the run");
                    false
                }
                None => {
                    tracing::info!(run_id = %claim.run_id, "the edge left the resume claim unanswered: the run is dropped");
                    false
                }
            };
            if attached {
                resumed.accepted += 1;
            } else {
                self.forget(&claim.run_id);
                resumed.refused += 1;
            }
        }
        self.settle();
        resumed
    }

    fn recount(&mut self) {
        self.total_bytes = self.runs.values().map(Entry::bytes).sum();
    }

    /// Recounts, and drops runs whose terminal event is written and acknowledged (or just
    /// written, while this edge has acknowledged nothing: a v1 edge never will).
    fn settle(&mut self) {
        let edge_acks = self.edge_acks;
        self.runs
            .retain(|_, e| !(e.delivered() && (!edge_acks || e.held.is_empty())));
        self.recount();
    }

    fn forget(&mut self, run_id: &str) {
        if let Some(entry) = self.runs.remove(run_id) {
            if entry.terminal.is_none() {
                self.open = self.open.saturating_sub(1);
            }
            self.total_bytes = self.total_bytes.saturating_sub(entry.bytes());
            entry.stop.send_replace(Some(Stop::Forget));
        }
    }

    /// Re-attaches a run from seq `from`, if it still holds everything from there on.
    fn attach(&mut self, run_id: &str, from: u64) -> bool {
        let Some(entry) = self.runs.get_mut(run_id) else {
            return false;
        };
        if from == 0 || from > entry.next_seq || entry.first_buffered() > from {
            tracing::warn!(
                run_id,
                from,
                next_seq = entry.next_seq,
                "the edge resumed from a seq the node cannot serve"
            );
            return false;
        }
        entry.held.retain(|h| h.seq >= from);
        entry.sent_upto = from - 1;
        entry.attached = true;
        self.queue(run_id);
        true
    }
}

/// Roughly how many bytes an event holds, for the total bound.
fn size_of_event(kind: &RunEventKind) -> usize {
    const BASE: usize = 48;
    let structured = |s: &edge::domain::StructuredOutput| {
        s.reasoning.len()
            + s.tool_calls
                .iter()
                .map(|c| c.id.len() + c.name.len() + c.arguments.len() + 16)
                .sum::<usize>()
            + s.logprobs
                .iter()
                .map(|l| l.token.len() + l.bytes.len() + 16 + l.top.len() * 32)
                .sum::<usize>()
            + s.embeddings
                .iter()
                .map(|e| e.values.len() * 4 + 8)
                .sum::<usize>()
    };
    BASE + match kind {
        RunEventKind::Output {
            text,
            data,
            structured: parts,
        } => text.len() + data.len() + parts.as_deref().map_or(0, structured),
        RunEventKind::Failed { code, message, .. } => code.len() + message.len(),
        RunEventKind::Cancelled { reason, .. } => reason.len(),
        RunEventKind::Completed { finish_reason, .. } => finish_reason.len(),
        RunEventKind::Started => 0,
    }
}

#[cfg(test)]
mod tests {
    use edge::client::NodeFrame;
    use proptest::prelude::*;

    use super::*;

    /// What the property test does to the buffers.
    #[derive(Debug, Clone)]
    enum Op {
        Admit(u8),
        Text(u8),
        End(u8),
        Write(usize),
        Ack,
        Cut,
        Reconnect(bool),
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            2 => (0..8u8).prop_map(Op::Admit),
            4 => (0..8u8).prop_map(Op::Text),
            1 => (0..8u8).prop_map(Op::End),
            3 => (1..6usize).prop_map(Op::Write),
            1 => Just(Op::Ack),
            1 => Just(Op::Cut),
            1 => any::<bool>().prop_map(Op::Reconnect),
        ]
    }

    /// The counts the buffers keep as they go, recomputed from scratch.
    fn check_counts(buffers: &Buffers) {
        let open = buffers
            .runs
            .values()
            .filter(|e| e.terminal.is_none())
            .count();
        assert_eq!(buffers.running(), open);
        let bytes: usize = buffers.runs.values().map(Entry::bytes).sum();
        assert_eq!(buffers.total_bytes, bytes);
        for (run_id, entry) in &buffers.runs {
            if entry.has_unsent() {
                assert!(
                    entry.queued,
                    "{run_id} has events to write but is not queued"
                );
                assert!(buffers.ready.contains(run_id));
            }
        }
    }

    proptest! {
        /// Whatever happens, the running runs, the held bytes and the queue of runs to
        /// write agree with what is held, and each run's events are written in order
        /// without a gap on each connection.
        #[test]
        fn the_counts_and_the_write_queue_follow_what_is_held(ops in proptest::collection::vec(op(), 1..120)) {
            let limits = BufferLimits { window: 3, keep_sent: 1, run_events: 8, total_bytes: 1 << 20 };
            let mut buffers = Buffers::new(limits);
            buffers.link_up(false);
            let (mut batch, mut written) = (0, HashMap::<String, u64>::new());
            for op in ops {
                match op {
                    Op::Admit(n) => {
                        // A new run under a retired run's id starts its seqs again.
                        if buffers.admit(&format!("r{n}"), 6).is_ok() {
                            written.remove(&format!("r{n}"));
                        }
                    }
                    Op::Text(n) => { buffers.push(&format!("r{n}"), &mut Some(RunEventKind::text("x"))); }
                    Op::End(n) => { buffers.push(&format!("r{n}"), &mut Some(RunEventKind::cancelled("end"))); }
                    Op::Write(max) => {
                        batch += 1;
                        for frame in buffers.take_unsent(batch, max).frames {
                            let NodeFrame::RunEvent(event) = frame else { panic!("not a run event") };
                            let last = written.insert(event.run_id.clone(), event.seq);
                            if let Some(last) = last {
                                prop_assert_eq!(event.seq, last + 1, "run {} out of order", event.run_id);
                            }
                        }
                    }
                    Op::Ack => buffers.acknowledged(batch),
                    Op::Cut => buffers.link_down(),
                    Op::Reconnect(acks) => {
                        buffers.link_down();
                        buffers.link_up(acks);
                        let claims = buffers.claims();
                        let answers: Vec<_> = claims
                            .iter()
                            .map(|c| ResumeAnswer { run_id: c.run_id.clone(), outcome: Ok(c.first_buffered_seq) })
                            .collect();
                        buffers.apply_answers(&claims, &answers);
                        written = claims.iter().map(|c| (c.run_id.clone(), c.first_buffered_seq - 1)).collect();
                    }
                }
                check_counts(&buffers);
            }
            // Nothing is left behind: writing until nothing comes leaves no attached run
            // with events to write.
            loop {
                batch += 1;
                if buffers.take_unsent(batch, 3).frames.is_empty() {
                    break;
                }
            }
            let stuck: Vec<_> = buffers.runs.iter().filter(|(_, e)| e.has_unsent()).map(|(id, _)| id.clone()).collect();
            prop_assert!(stuck.is_empty(), "{:?}", stuck);
        }
    }
}
