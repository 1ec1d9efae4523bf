//! Delivery: the per-run state machine and the relay of each event to the sinks and the
//! caller, in order, with exactly one terminal event — [`RunService::relay_event`] for
//! what a node reports, [`RunService::end_run`] for the terminal events the edge makes.
//!
//! An attempt's terminal event first goes to failover (`failover.rs`): when the run is
//! placed again, the event is neither offered to the run's state nor relayed, and the next
//! attempt's events continue the run's numbering. So the caller and the sinks see one
//! stream: a `started` per attempt (each with its route), the output of the one attempt
//! that produced any, and one terminal event.
//!
//! This is the relay's hot path (benchmarked): one async lock per run, no allocation
//! beyond the event itself, the sink only enqueues, and the caller's buffer costs no timer
//! while it has room.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use tokio::sync::{MutexGuard, mpsc};
use tracing::{debug, warn};

use super::continuation::Progress;
use super::failover::Next;
use super::service::RunService;
use super::table::{Run, lock};
use crate::domain::{EventOrigin, EventVerdict, NodeId, RunEvent, RunEventKind, RunState};
use crate::ports::{ConnectionId, RelayedEvent, ReportedEvent};

/// Events buffered for a caller who reads slower than the node writes. When it is full the
/// node's connection waits (it stops reading frames), which slows the node down.
pub(super) const CALLER_BUFFER: usize = 256;

/// How long a full caller buffer may stay full before the edge stops feeding that caller
/// (the run goes on, and its events still reach the sinks). Bounds how long a caller who
/// stopped reading can hold up its node's connection, a deadline or a shutdown.
const CALLER_STALL_TIMEOUT: Duration = Duration::from_secs(5);

/// What is delivered for a run, guarded by one async lock so its events keep their order
/// and exactly one of them is terminal.
pub(super) struct Delivery {
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
    /// before the lock is let go (`RunService::hand_to_journal`).
    journal: Vec<RelayedEvent>,
    /// What was relayed, for a continuation (kept only when continuations are on).
    progress: Progress,
}

impl Delivery {
    /// A run's delivery before its first event, feeding `caller`.
    pub(super) fn new(caller: mpsc::Sender<Arc<RunEvent>>) -> Self {
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
    pub(super) fn adopted(last_seq: u64, seq_base: u64, saw_output: bool) -> Self {
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
    pub(super) fn saw_output(&self) -> bool {
        self.saw_output
    }

    /// Whether the run has had its terminal event.
    pub(super) fn is_finished(&self) -> bool {
        self.state.is_finished()
    }

    /// The last seq relayed from the current attempt, in its node's numbering; 0 when it
    /// has relayed nothing.
    pub(super) fn last_node_seq(&self) -> u64 {
        self.state.last_seq().saturating_sub(self.seq_base)
    }

    /// The current attempt resumes on a new connection: what its node sends again is
    /// dropped.
    pub(super) fn resume(&mut self) {
        self.state.resume();
    }

    /// Adds a follower of the run's next events; `false` when the run has ended.
    pub(super) fn follow(&mut self, follower: mpsc::Sender<(u64, Arc<RunEvent>)>) -> bool {
        if self.state.is_finished() {
            return false;
        }
        self.followers.push(follower);
        true
    }
}

/// Which attempt an event belongs to: the one on a node's connection, or whichever is
/// current (the edge's own endings: deadline, cancel, queue wait, shutdown).
#[derive(Debug, Clone, Copy)]
pub(super) enum Source<'a> {
    /// The attempt `node` holds on `connection`; dropped if the run has moved on.
    Attempt(&'a NodeId, ConnectionId),
    /// Like `Attempt`, for one of several runs a departing connection held: its loss is
    /// not held against the node's breaker (the first run's loss counted, once for the
    /// whole departure).
    Departed(&'a NodeId, ConnectionId),
    /// The run, whatever its attempt.
    Run,
}

/// One event offered to a run: where it came from, the node's sequence number (`None`: the
/// edge's own event, numbered next), whose it is, and what it says.
pub(super) struct Offered<'s> {
    pub source: Source<'s>,
    pub seq: Option<u64>,
    pub origin: EventOrigin,
    pub kind: RunEventKind,
}

/// What offering one event to a run did, and whether the run's delivery lock is given back.
enum Relayed<'a> {
    /// It was relayed and the attempt goes on: the lock, for the next event.
    Open(MutexGuard<'a, Delivery>),
    /// It was dropped (after the run's end, or a duplicate): the lock, for the next event.
    Dropped(MutexGuard<'a, Delivery>),
    /// It ended the attempt (the run's end, a failover or a continuation): the lock is
    /// released.
    Ended,
}

impl RunService {
    /// Ends `run` with a terminal event the edge makes (a timeout, a cancel, a lost node),
    /// unless it has ended already.
    pub(super) async fn end_run(&self, run: &Arc<Run>, kind: RunEventKind) {
        self.relay_event(run, Source::Run, None, EventOrigin::Edge, kind)
            .await;
    }

    /// Relays one event of `run` to the sink and the caller, in order; retires the run
    /// after its terminal event and drops anything after it. `seq` is the node's; the
    /// edge's own events (`None`) take the next one. An attempt's terminal event may
    /// instead place the run again (failover). Returns whether the event was taken
    /// (relayed, or ended the attempt) rather than dropped.
    pub(super) async fn relay_event(
        &self,
        run: &Arc<Run>,
        source: Source<'_>,
        seq: Option<u64>,
        origin: EventOrigin,
        kind: RunEventKind,
    ) -> bool {
        let delivery = run.delivery.lock().await;
        if self.is_stale(run, source, 1) {
            return false;
        }
        let offered = Offered {
            source,
            seq,
            origin,
            kind,
        };
        match self.relay_held(run, delivery, offered).await {
            Relayed::Open(mut delivery) => {
                self.hand_to_journal(run, &mut delivery.journal);
                true
            }
            Relayed::Dropped(mut delivery) => {
                self.hand_to_journal(run, &mut delivery.journal);
                false
            }
            Relayed::Ended => true,
        }
    }

    /// Relays `events`, consecutive in one node's stream and all of `run`, from `source`:
    /// [`Self::relay_event`] for each, under one hold of the run's delivery lock (which is
    /// what lets a run's attempt change, so one staleness check covers them all). Events
    /// after one that ended the attempt are dropped, as they would be one by one.
    pub(super) async fn relay_node_events(
        &self,
        run: &Arc<Run>,
        source: Source<'_>,
        mut events: impl ExactSizeIterator<Item = ReportedEvent>,
    ) {
        let mut delivery = run.delivery.lock().await;
        if self.is_stale(run, source, events.len()) {
            return;
        }
        while let Some(ReportedEvent { seq, kind, .. }) = events.next() {
            let offered = Offered {
                source,
                seq: Some(seq),
                origin: EventOrigin::Node,
                kind,
            };
            match self.relay_held(run, delivery, offered).await {
                Relayed::Open(held) | Relayed::Dropped(held) => delivery = held,
                Relayed::Ended => {
                    let dropped = &self.inner.stats.dropped_after_terminal;
                    dropped.fetch_add(events.len() as u64, Ordering::Relaxed);
                    return;
                }
            }
        }
        self.hand_to_journal(run, &mut delivery.journal);
    }

    /// [`Self::relay_event`] with the run's delivery lock held and its source checked;
    /// gives the lock back unless the event ended the attempt (a terminal event, or a
    /// failover), which releases it.
    async fn relay_held<'a>(
        &self,
        run: &'a Arc<Run>,
        mut delivery: MutexGuard<'a, Delivery>,
        offered: Offered<'_>,
    ) -> Relayed<'a> {
        let Offered {
            source,
            seq,
            origin,
            mut kind,
        } = offered;
        let blame = !matches!(source, Source::Departed(..));
        if let Some(next) = self.attempt_ended(run, &mut delivery, &mut kind, blame) {
            self.hand_to_journal(run, &mut delivery.journal);
            drop(delivery);
            self.continue_run(run, next);
            return Relayed::Ended;
        }
        let seq = match seq {
            Some(seq) => seq.saturating_add(delivery.seq_base),
            None => delivery.state.next_edge_seq(),
        };
        let terminal = match delivery.state.offer(seq, &kind) {
            EventVerdict::DropAfterTerminal => {
                let dropped = &self.inner.stats.dropped_after_terminal;
                dropped.fetch_add(1, Ordering::Relaxed);
                return Relayed::Dropped(delivery);
            }
            EventVerdict::DropDuplicate => {
                let dropped = &self.inner.stats.dropped_duplicate;
                dropped.fetch_add(1, Ordering::Relaxed);
                return Relayed::Dropped(delivery);
            }
            EventVerdict::Relay => false,
            EventVerdict::RelayTerminal => true,
        };
        delivery.progress.note(&mut kind, self.keeps_progress());
        let event = Arc::new(event_of(run, source, seq, origin, kind));
        let first_output =
            !delivery.saw_output && matches!(event.kind, RunEventKind::Output { .. });
        delivery.saw_output |= first_output;
        self.fan_out(run, &mut delivery, &event, first_output).await;
        if terminal {
            log_end(run, &event);
            delivery.caller = None;
            delivery.followers.clear();
            // `tap` handed the run's last batch, its end included, to the journal.
            drop(delivery);
            self.retire(run, budget_tokens(&event.kind));
            return Relayed::Ended;
        }
        Relayed::Open(delivery)
    }

    /// Hands `event` to everyone who reads `run`'s events: its followers and the journal
    /// (`tap`), the metrics, the event sink, and its caller (who is let go once it stops
    /// reading).
    async fn fan_out(
        &self,
        run: &Arc<Run>,
        delivery: &mut Delivery,
        event: &Arc<RunEvent>,
        first_output: bool,
    ) {
        let Delivery {
            followers, journal, ..
        } = delivery;
        self.tap(run, followers, journal, event, first_output);
        self.inner.metrics.relayed(run, event, first_output);
        self.inner.sink.publish(Arc::clone(event));
        if let Some(caller) = &delivery.caller
            && send_to_caller(caller, Arc::clone(event)).await.is_err()
        {
            if !caller.is_closed() {
                warn!(run_id = %run.id, "the caller stopped reading this run's events; no longer sending them");
            }
            delivery.caller = None;
        }
    }
}

/// What a run that ended with `kind` counts against its key's token budget: the input and
/// output tokens of its usage, a completed run's or what a failed or cancelled one produced
/// (none known, none counted).
fn budget_tokens(kind: &RunEventKind) -> u64 {
    kind.usage().map_or(0, |usage| {
        u64::from(usage.input_tokens) + u64::from(usage.output_tokens)
    })
}

impl RunService {
    /// Offers a terminal `kind` of the current attempt to failover (or continuation):
    /// `Some` when the run goes on with another attempt, whose events then number on from
    /// the last relayed and which carries what was relayed. `None` for any other event.
    fn attempt_ended(
        &self,
        run: &Arc<Run>,
        delivery: &mut Delivery,
        kind: &mut RunEventKind,
        blame: bool,
    ) -> Option<Next> {
        if !kind.is_terminal() || delivery.state.is_finished() {
            return None;
        }
        let progress = delivery.saw_output.then_some(&delivery.progress);
        let next = self.fail_over(run, progress, kind, blame)?;
        if delivery.saw_output {
            delivery.progress.carry();
        }
        delivery.seq_base = delivery.state.next_edge_seq() - 1;
        Some(next)
    }

    /// Ends `run`'s attempt on `node`'s `connection` with `kind` (never relayed) only if
    /// failover or a continuation moves the run on, its next attempt sent or queued; else
    /// leaves the attempt as it is and returns `false` (`kind`'s message then ends with why
    /// the run was not continued, when it was refused one).
    pub(super) async fn move_off_attempt(
        &self,
        run: &Arc<Run>,
        node: &NodeId,
        connection: ConnectionId,
        kind: &mut RunEventKind,
    ) -> bool {
        let mut delivery = run.delivery.lock().await;
        if !run.is_on(node, connection) {
            return false;
        }
        let Some(next) = self.attempt_ended(run, &mut delivery, kind, false) else {
            return false;
        };
        self.hand_to_journal(run, &mut delivery.journal);
        drop(delivery);
        self.continue_run(run, next);
        true
    }

    /// Whether `events` from `source` belong to an attempt that has ended (failed over)
    /// or moved to another connection (resumed) while they waited for the run's lock;
    /// such events are dropped and counted.
    fn is_stale(&self, run: &Run, source: Source<'_>, events: usize) -> bool {
        let (Source::Attempt(node, connection) | Source::Departed(node, connection)) = source
        else {
            return false;
        };
        let stale = !run.is_attempt(node, connection);
        if stale {
            let dropped = &self.inner.stats.dropped_after_terminal;
            dropped.fetch_add(events as u64, Ordering::Relaxed);
        }
        stale
    }
}

/// The event of `run` numbered `seq`, with its node and, on `started`, the current
/// attempt's route. An event from an attempt that is not stale names that attempt's node
/// (the current one), so the run's route is read only for `started` and the edge's own
/// events.
fn event_of(
    run: &Run,
    source: Source<'_>,
    seq: u64,
    origin: EventOrigin,
    kind: RunEventKind,
) -> RunEvent {
    let started = matches!(kind, RunEventKind::Started);
    let (node, route) = match source {
        Source::Attempt(node, _) | Source::Departed(node, _) if !started => {
            (Some(node.clone()), None)
        }
        _ => {
            let current = lock(&run.route);
            let node = current.placement.attempt().map(|(node, _)| node.clone());
            (node, current.reason.filter(|_| started).map(Box::new))
        }
    };
    RunEvent {
        run_id: run.id.clone(),
        node,
        adapter: run.spec.selector.adapter.clone(),
        target: run.spec.selector.target.clone(),
        seq,
        origin,
        kind,
        route,
    }
}

/// Logs how a run ended: a failure at INFO, anything else at DEBUG.
fn log_end(run: &Run, event: &RunEvent) {
    match &event.kind {
        RunEventKind::Failed { code, message, .. } => {
            let node = event.node.as_ref().map(tracing::field::display);
            tracing::info!(parent: &run.span, run_id = %run.id, node, code, message, origin = ?event.origin, "run failed");
        }
        kind => debug!(parent: &run.span, run_id = %run.id, outcome = kind.name(), "run ended"),
    }
}

/// Hands `event` to the caller, waiting up to [`CALLER_STALL_TIMEOUT`] while its buffer is
/// full. Room in the buffer is the common case, and it costs no timer.
async fn send_to_caller(
    caller: &mpsc::Sender<Arc<RunEvent>>,
    event: Arc<RunEvent>,
) -> Result<(), ()> {
    match caller.try_send(event) {
        Ok(()) => Ok(()),
        Err(mpsc::error::TrySendError::Full(event)) => caller
            .send_timeout(event, CALLER_STALL_TIMEOUT)
            .await
            .map_err(|_| ()),
        Err(mpsc::error::TrySendError::Closed(_)) => Err(()),
    }
}
