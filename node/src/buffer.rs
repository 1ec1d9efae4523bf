//! The bookkeeping behind the run table, without locks or waiting: per run, the events it
//! produced, how far they were written on the current connection, and which the edge may
//! still lack; across runs, the bounds that make a run be given up while disconnected.
//!
//! Pure apart from each run's stop channel (a `watch` sender, used without awaiting).

use std::collections::{HashMap, VecDeque};

use edge::client::run_event;
use edge::domain::{ResumeAnswer, ResumeClaim, RunEventKind};
use tokio::sync::watch;

use super::runs::{BufferLimits, Refusal, Resumed, Stop, Unsent};

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
        self.runs.values().filter(|e| e.terminal.is_none()).count()
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
        self.total_bytes += entry.push(kind);
        let over = entry.held.len() > limits.run_events || self.total_bytes > limits.total_bytes;
        if !entry.attached && over {
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
        // An acking edge confirms what it read, so unconfirmed events are kept (up to the
        // per-run bound); with one that never acks, only the last few.
        let keep_sent = if self.edge_acks {
            self.limits.run_events
        } else {
            self.limits.keep_sent
        };
        for (run_id, entry) in self.runs.iter_mut().filter(|(_, e)| e.attached) {
            let from = entry.sent_upto;
            for held in entry.held.iter_mut().filter(|h| h.seq > from) {
                if unsent.frames.len() >= max {
                    break;
                }
                unsent
                    .frames
                    .push(run_event(run_id, held.seq, held.kind.clone()));
                unsent.terminal |= held.kind.is_terminal();
                held.written = Some(batch);
                entry.sent_upto = held.seq;
            }
            let sent = entry
                .held
                .iter()
                .take_while(|h| h.seq <= entry.sent_upto)
                .count();
            entry.held.drain(..sent.saturating_sub(keep_sent));
        }
        self.settle();
        unsent
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
