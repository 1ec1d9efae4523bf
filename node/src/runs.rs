//! The node's runs and their events, as the run tasks and the connection see them: a
//! cheap-to-clone handle over the [`Buffers`] behind one lock, plus the wake-ups between
//! the run tasks (which emit) and the connection's writer (which sends).
//!
//! Every event a run produces goes into its entry, numbered from 1; the writer takes what is
//! unsent, so events reach the edge in order whatever happens to the connection. While
//! connected, a run may run ahead of the writer by a small window, then [`Emitter::emit`]
//! waits, and the run stops reading its engine: flow control all the way up. While
//! disconnected, runs keep running and their events pile up, bounded per run and in total;
//! past a bound the run is given up and never claimed. On reconnect every entry becomes a
//! resume claim, and the edge's answers decide which runs go on. Each run's emitter also
//! tallies what the run produced, the usage its `failed` or `cancelled` event reports.

use std::sync::{Arc, Mutex, MutexGuard};

use edge::domain::{ResumeAnswer, ResumeClaim, RunEventKind, Usage};
use tokio::sync::{Notify, watch};

pub use crate::buffer::{BufferLimits, Refusal, Resumed, Stop, Unsent};
use crate::buffer::{Buffers, Push};

/// The run is no longer the node's (forgotten, given up, or ended): stop producing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Gone;

#[derive(Debug)]
struct Shared {
    buffers: Mutex<Buffers>,
    wake_writer: Notify,
    progress: Notify,
}

/// The node's runs (see the module docs).
#[derive(Debug, Clone)]
pub struct RunTable {
    shared: Arc<Shared>,
}

impl RunTable {
    /// An empty table.
    pub fn new(limits: BufferLimits) -> Self {
        Self {
            shared: Arc::new(Shared {
                buffers: Mutex::new(Buffers::new(limits)),
                wake_writer: Notify::new(),
                progress: Notify::new(),
            }),
        }
    }

    fn buffers(&self) -> MutexGuard<'_, Buffers> {
        // Every update leaves the buffers consistent before it can panic, so a poisoned
        // lock is used as it is.
        self.shared
            .buffers
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Wakes waiting run tasks and drains (and, with `write`, the writer).
    fn changed(&self, write: bool) {
        self.shared.progress.notify_waiters();
        if write {
            self.shared.wake_writer.notify_one();
        }
    }

    /// Admits run `run_id` if fewer than `max_running` runs are running.
    ///
    /// # Errors
    /// The [`Refusal`] when the node is draining, busy, or already has the run.
    pub fn admit(
        &self,
        run_id: &str,
        max_running: usize,
    ) -> Result<(Emitter, StopSignal), Refusal> {
        let stop = self.buffers().admit(run_id, max_running)?;
        let emitter = Emitter {
            table: self.clone(),
            run_id: run_id.to_owned(),
            produced: Arc::default(),
        };
        Ok((emitter, StopSignal(stop)))
    }

    /// Answers a run that was not admitted with its one terminal event.
    pub fn refuse(&self, run_id: &str, kind: RunEventKind) {
        self.buffers().refuse(run_id, kind);
        self.changed(true);
    }

    /// Asks run `run_id` to stop; false when the node does not hold it.
    pub fn stop(&self, run_id: &str, stop: Stop) -> bool {
        self.buffers().stop(run_id, &stop)
    }

    /// Asks every run to stop.
    pub fn stop_all(&self, stop: &Stop) {
        self.buffers().stop_all(stop);
    }

    /// From now on, runs are refused with [`Refusal::Draining`].
    pub fn set_draining(&self) {
        self.buffers().set_draining();
    }

    /// Runs that have not produced their terminal event yet.
    pub fn running(&self) -> usize {
        self.buffers().running()
    }

    /// Whether the table holds nothing: every run ended and its events are delivered.
    pub fn is_empty(&self) -> bool {
        self.buffers().is_empty()
    }

    /// Resolves the next time runs end, events are written or acknowledged, or the link
    /// changes. Create (and enable) it before checking the condition it waits for.
    pub fn progress(&self) -> tokio::sync::futures::Notified<'_> {
        self.shared.progress.notified()
    }

    /// Resolves when there may be events to write.
    pub fn unsent_ready(&self) -> tokio::sync::futures::Notified<'_> {
        self.shared.wake_writer.notified()
    }

    /// The unsent events of attached runs, at most `max`, as written in batch `batch`.
    pub fn take_unsent(&self, batch: u64, max: usize) -> Unsent {
        let unsent = self.buffers().take_unsent(batch, max);
        self.changed(false);
        unsent
    }

    /// The edge acknowledged everything written up to batch `batch`.
    pub fn acknowledged(&self, batch: u64) {
        self.buffers().acknowledged(batch);
        self.changed(false);
    }

    /// A connection is registered, to an edge that said it acknowledges every ping or not:
    /// runs admitted from now on are attached to it (see [`Buffers::link_up`]).
    pub fn link_up(&self, edge_acknowledges: bool) {
        self.buffers().link_up(edge_acknowledges);
    }

    /// The connection is gone: every run is detached and buffers until the next one.
    pub fn link_down(&self) {
        self.buffers().link_down();
        self.changed(false);
    }

    /// The resume claims for every run the node holds.
    pub fn claims(&self) -> Vec<ResumeClaim> {
        self.buffers().claims()
    }

    /// Applies the edge's resume `answers` to `claims` (see [`Buffers::apply_answers`]).
    pub fn apply_answers(&self, claims: &[ResumeClaim], answers: &[ResumeAnswer]) -> Resumed {
        let resumed = self.buffers().apply_answers(claims, answers);
        self.changed(true);
        resumed
    }
}

/// Where one run's events go.
#[derive(Debug, Clone)]
pub struct Emitter {
    table: RunTable,
    run_id: String,
    produced: Arc<Mutex<Produced>>,
}

/// What a run produced so far, for the usage of a run that fails or is cancelled.
#[derive(Debug, Default)]
struct Produced {
    /// Output events emitted with generated text, reasoning or a piece of a tool call:
    /// the output tokens as far as the node can count them (llama-server streams one token
    /// per chunk).
    pieces: u32,
    /// The engine's own counts so far, when it sends them mid-stream (llama-server's
    /// `timings` with `timings_per_token`).
    engine: Option<Usage>,
}

/// Whether `kind` is an output the engine generated (text, reasoning, a tool call's piece).
fn is_generated(kind: &RunEventKind) -> bool {
    match kind {
        RunEventKind::Output {
            text, structured, ..
        } => {
            !text.is_empty()
                || structured
                    .as_ref()
                    .is_some_and(|s| !s.reasoning.is_empty() || !s.tool_calls.is_empty())
        }
        _ => false,
    }
}

impl Emitter {
    /// The run's id.
    pub fn run_id(&self) -> &str {
        &self.run_id
    }

    /// Adds the run's next event; waits while the run is a window ahead of a connected
    /// writer.
    ///
    /// # Errors
    /// [`Gone`] when the node no longer holds the run (forgotten, given up, or ended).
    pub async fn emit(&self, kind: RunEventKind) -> Result<(), Gone> {
        if is_generated(&kind) {
            let mut produced = lock(&self.produced);
            produced.pieces = produced.pieces.saturating_add(1);
        }
        let mut kind = Some(kind);
        loop {
            let progress = self.table.progress();
            tokio::pin!(progress);
            progress.as_mut().enable();
            let pushed = self.table.buffers().push(&self.run_id, &mut kind);
            match pushed {
                Push::Done => {
                    self.table.changed(true);
                    return Ok(());
                }
                Push::Gone => {
                    self.table.changed(false);
                    return Err(Gone);
                }
                Push::Wait => progress.await,
            }
        }
    }
}

impl Emitter {
    /// The engine's own counts so far (prompt, cached prompt and generated tokens), as it
    /// sent them mid-stream.
    pub fn engine_counted(&self, usage: Usage) {
        lock(&self.produced).engine = Some(usage);
    }

    /// What the run produced so far, for a `failed` or `cancelled` event: the engine's
    /// counts when it sent any (the output at least the generated pieces emitted), else one
    /// output token per generated piece emitted with the input unknown (0); `None` when
    /// nothing was produced.
    pub fn produced(&self) -> Option<Usage> {
        let produced = lock(&self.produced);
        match produced.engine {
            Some(engine) => Some(Usage {
                output_tokens: engine.output_tokens.max(produced.pieces),
                ..engine
            }),
            None => (produced.pieces > 0).then(|| Usage::new(0, produced.pieces)),
        }
    }

    /// `kind`, a terminal event, with what the run produced when it says nothing of its
    /// own: a failure or a cancel without usage gets [`Self::produced`].
    pub fn with_produced(&self, mut kind: RunEventKind) -> RunEventKind {
        if let RunEventKind::Failed { usage, .. } | RunEventKind::Cancelled { usage, .. } =
            &mut kind
            && usage.is_none()
        {
            *usage = self.produced();
        }
        kind
    }
}

fn lock(produced: &Mutex<Produced>) -> MutexGuard<'_, Produced> {
    // Two counters, consistent whenever the lock is let go.
    produced
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Tells a run task why it must stop.
#[derive(Debug)]
pub struct StopSignal(watch::Receiver<Option<Stop>>);

impl StopSignal {
    /// Resolves with the reason once the run must stop ([`Stop::Forget`] if the table let
    /// go of the run without one).
    pub async fn stopped(&mut self) -> Stop {
        match self.0.wait_for(Option::is_some).await {
            Ok(stop) => stop.clone().unwrap_or(Stop::Forget),
            Err(_) => Stop::Forget,
        }
    }
}

#[cfg(test)]
#[path = "runs_tests.rs"]
mod tests;
