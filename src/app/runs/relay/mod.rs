//! The relay: the part of the run service that owns what is delivered for each run
//! (`delivery.rs`) and hands every event to the sink, the journal (`journal_tap.rs`), the
//! run's followers and its caller, in order, with exactly one terminal event —
//! [`Relay::relay_event`] for what a node reports, [`Relay::end_run`] for the terminal
//! events the edge makes, and the timers that make them (`endings.rs`).
//!
//! An attempt's terminal event first goes to the placer's failover: when the run is placed
//! again, the event is neither offered to the run's state nor relayed, and the next
//! attempt's events continue the run's numbering. So the caller and the sinks see one
//! stream: a `started` per attempt (each with its route), the output of the one attempt
//! that produced any, and one terminal event. What placement leaves to do once its lock is
//! let go ([`Fallout`]) is carried out here ([`Relay::settle`]).
//!
//! This is the relay's hot path (benchmarked): one async lock per run, no allocation
//! beyond the event itself, the sink only enqueues, and the caller's buffer costs no timer
//! while it has room.

mod endings;
mod journal_tap;
#[cfg(test)]
mod tests;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::sync::{MutexGuard, mpsc};
use tracing::{debug, warn};

use super::delivery::Delivery;
use super::observer::RunObserver;
use super::placer::{Effect, Fallout, Miss, Placer};
use super::run::Run;
use super::timers::Timers;
use crate::domain::{EdgeFailure, EventOrigin, EventVerdict, NodeId, RunEvent, RunEventKind};
use crate::ports::{ConnectionId, EventSink, ReportedEvent, RunJournal};

/// Events buffered for a caller who reads slower than the node writes. When it is full the
/// node's connection waits (it stops reading frames), which slows the node down.
pub(super) const CALLER_BUFFER: usize = 256;

/// How long a full caller buffer may stay full before the edge stops feeding that caller
/// (the run goes on, and its events still reach the sinks). Bounds how long a caller who
/// stopped reading can hold up its node's connection, a deadline or a shutdown.
const CALLER_STALL_TIMEOUT: Duration = Duration::from_secs(5);

/// Counters of the relay, read by the metrics exporter and tests.
#[derive(Debug, Default)]
pub struct RunStats {
    dropped_unknown_run: AtomicU64,
    dropped_after_terminal: AtomicU64,
    dropped_duplicate: AtomicU64,
}

impl RunStats {
    /// Events for runs the edge does not know (never existed, ended long ago, or held by
    /// another node or connection).
    pub fn dropped_unknown_run(&self) -> u64 {
        self.dropped_unknown_run.load(Ordering::Relaxed)
    }

    /// Events for a run after its terminal event, from the connection that held it.
    pub fn dropped_after_terminal(&self) -> u64 {
        self.dropped_after_terminal.load(Ordering::Relaxed)
    }

    /// Events of a resumed run that the edge had already relayed (a node that sent again
    /// what it was told the edge has).
    pub fn dropped_duplicate(&self) -> u64 {
        self.dropped_duplicate.load(Ordering::Relaxed)
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
struct Offered<'s> {
    source: Source<'s>,
    seq: Option<u64>,
    origin: EventOrigin,
    kind: RunEventKind,
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

/// Relays runs' events. Built once per run service.
pub(super) struct Relay {
    placer: Arc<Placer>,
    timers: Arc<Timers>,
    sink: Arc<dyn EventSink>,
    /// Where run events are kept (nothing, when disabled).
    journal: Arc<dyn RunJournal>,
    observer: Arc<dyn RunObserver>,
    stats: RunStats,
    /// How long a node has to end a run it was asked to cancel.
    cancel_grace: Duration,
}

impl Relay {
    /// A relay ending runs through `placer`, its timers on `timers`, handing events to
    /// `sink` and `journal`, giving a node `cancel_grace` to end a cancelled run.
    pub(super) fn new(
        placer: Arc<Placer>,
        timers: Arc<Timers>,
        sink: Arc<dyn EventSink>,
        journal: Arc<dyn RunJournal>,
        observer: Arc<dyn RunObserver>,
        cancel_grace: Duration,
    ) -> Self {
        Self {
            placer,
            timers,
            sink,
            journal,
            observer,
            stats: RunStats::default(),
            cancel_grace,
        }
    }

    /// The relay's counters.
    pub(super) fn stats(&self) -> &RunStats {
        &self.stats
    }

    /// The sink every event goes to.
    pub(super) fn sink(&self) -> &dyn EventSink {
        self.sink.as_ref()
    }

    /// Carries out what placement left to do, in order: sends placed runs (a node gone
    /// meanwhile ends that attempt as a disconnect), arms the waits of queued ones, ends
    /// runs displaced or left with no node, and pumps again after a breaker's cooldown.
    /// Never waits: what would is spawned.
    pub(super) fn settle(self: &Arc<Self>, fallout: Fallout) {
        for effect in fallout.into_effects() {
            match effect {
                Effect::Send(run, node) => self.send_or_end(&run, &node),
                Effect::ArmWait(run) => self.arm_wait(&run),
                Effect::End(run, kind) => self.end_soon(run, kind),
                Effect::PumpAfter(cooldown) => self.pump_after(cooldown),
            }
        }
    }

    /// Sends `run` to `node`, where it was placed; a node gone meanwhile ends that attempt
    /// as a disconnect (which may fail it over).
    pub(super) fn send_or_end(self: &Arc<Self>, run: &Arc<Run>, node: &NodeId) {
        if let Err((node, connection)) = self.placer.send(run, node) {
            let lost = EdgeFailure::NodeDisconnected.into_event_kind();
            self.end_attempt_soon(Arc::clone(run), node, connection, lost);
        }
    }

    /// Ends `run` with a terminal event the edge makes (a timeout, a cancel, a lost node),
    /// unless it has ended already.
    pub(super) async fn end_run(self: &Arc<Self>, run: &Arc<Run>, kind: RunEventKind) {
        self.relay_event(run, Source::Run, None, EventOrigin::Edge, kind)
            .await;
    }

    /// Relays one event of `run` to the sink and the caller, in order; retires the run
    /// after its terminal event and drops anything after it. `seq` is the node's; the
    /// edge's own events (`None`) take the next one. An attempt's terminal event may
    /// instead place the run again (failover). Returns whether the event was taken
    /// (relayed, or ended the attempt) rather than dropped.
    pub(super) async fn relay_event(
        self: &Arc<Self>,
        run: &Arc<Run>,
        source: Source<'_>,
        seq: Option<u64>,
        origin: EventOrigin,
        kind: RunEventKind,
    ) -> bool {
        let delivery = run.delivery().await;
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
                self.hand_to_journal(run, &mut delivery);
                true
            }
            Relayed::Dropped(mut delivery) => {
                self.hand_to_journal(run, &mut delivery);
                false
            }
            Relayed::Ended => true,
        }
    }

    /// Relays what `node` reported on `connection`: `events`, consecutive in its stream and
    /// all of one run. Events for a run the connection does not hold are dropped and
    /// counted.
    pub(super) async fn node_events(
        self: &Arc<Self>,
        node: &NodeId,
        connection: ConnectionId,
        events: &mut Vec<ReportedEvent>,
    ) {
        let Some(first) = events.first() else {
            return;
        };
        let count = events.len() as u64;
        match self.placer.held_by(&first.run_id, node, connection) {
            Ok(run) => {
                let source = Source::Attempt(node, connection);
                self.relay_node_events(&run, source, events.drain(..)).await;
            }
            Err(Miss::Ended) => {
                let dropped = &self.stats.dropped_after_terminal;
                dropped.fetch_add(count, Ordering::Relaxed);
                debug!(run_id = first.run_id, %node, count, "dropped events for a run that has ended");
            }
            Err(Miss::Unknown) => {
                let dropped = &self.stats.dropped_unknown_run;
                dropped.fetch_add(count, Ordering::Relaxed);
                debug!(run_id = first.run_id, %node, count, "dropped events for a run this node does not hold");
            }
        }
        events.clear();
    }

    /// Relays `events`, consecutive in one node's stream and all of `run`, from `source`:
    /// [`Self::relay_event`] for each, under one hold of the run's delivery lock (which is
    /// what lets a run's attempt change, so one staleness check covers them all). Events
    /// after one that ended the attempt are dropped, as they would be one by one.
    async fn relay_node_events(
        self: &Arc<Self>,
        run: &Arc<Run>,
        source: Source<'_>,
        mut events: impl ExactSizeIterator<Item = ReportedEvent>,
    ) {
        let mut delivery = run.delivery().await;
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
                    let dropped = &self.stats.dropped_after_terminal;
                    dropped.fetch_add(events.len() as u64, Ordering::Relaxed);
                    return;
                }
            }
        }
        self.hand_to_journal(run, &mut delivery);
    }

    /// [`Self::relay_event`] with the run's delivery lock held and its source checked;
    /// gives the lock back unless the event ended the attempt (a terminal event, or a
    /// failover), which releases it.
    async fn relay_held<'a>(
        self: &Arc<Self>,
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
        if self.attempt_ended(run, &mut delivery, &mut kind, blame) {
            return Relayed::Ended;
        }
        let seq = delivery.number(seq);
        let terminal = match delivery.offer(seq, &kind) {
            EventVerdict::DropAfterTerminal => {
                let dropped = &self.stats.dropped_after_terminal;
                dropped.fetch_add(1, Ordering::Relaxed);
                return Relayed::Dropped(delivery);
            }
            EventVerdict::DropDuplicate => {
                let dropped = &self.stats.dropped_duplicate;
                dropped.fetch_add(1, Ordering::Relaxed);
                return Relayed::Dropped(delivery);
            }
            EventVerdict::Relay => false,
            EventVerdict::RelayTerminal => true,
        };
        delivery.note(&mut kind, self.placer.keeps_progress());
        let event = Arc::new(event_of(run, source, seq, origin, kind));
        let first_output = delivery.first_output(&event.kind);
        self.fan_out(run, &mut delivery, &event, first_output).await;
        if terminal {
            log_end(run, &event);
            delivery.finish();
            // `tap` handed the run's last batch, its end included, to the journal.
            drop(delivery);
            self.retire(run, budget_tokens(&event.kind));
            return Relayed::Ended;
        }
        Relayed::Open(delivery)
    }

    /// Hands `event` to everyone who reads `run`'s events: its followers and the journal
    /// (`tap`), the observer, the event sink, and its caller (who is let go once it stops
    /// reading).
    async fn fan_out(
        &self,
        run: &Arc<Run>,
        delivery: &mut Delivery,
        event: &Arc<RunEvent>,
        first_output: bool,
    ) {
        self.tap(run, delivery, event, first_output);
        self.observer.relayed(run, event, first_output);
        self.sink.publish(Arc::clone(event));
        let Some(caller) = delivery.caller() else {
            return;
        };
        if send_to_caller(caller, Arc::clone(event)).await.is_err() {
            if !caller.is_closed() {
                warn!(run_id = %run.id(), "the caller stopped reading this run's events; no longer sending them");
            }
            delivery.drop_caller();
        }
    }

    /// Takes an ended run out: its timers stop, its deadline is forgotten, its slot and
    /// its key's count are freed (its budget settled with `tokens`), and queued runs get
    /// the slot.
    fn retire(self: &Arc<Self>, run: &Arc<Run>, tokens: u64) {
        run.ended().cancel();
        self.timers.deadlines().remove(run);
        let fallout = self.placer.retire(run, tokens);
        self.settle(fallout);
    }

    /// Offers a terminal `kind` of the current attempt to failover (or continuation):
    /// `true` when the run goes on with another attempt — whose events then number on from
    /// the last relayed and which carries what was relayed — and the delivery lock was let
    /// go; `false` for any other event.
    fn attempt_ended(
        self: &Arc<Self>,
        run: &Arc<Run>,
        delivery: &mut MutexGuard<'_, Delivery>,
        kind: &mut RunEventKind,
        blame: bool,
    ) -> bool {
        if !kind.is_terminal() || delivery.is_finished() {
            return false;
        }
        let progress = delivery.progress_after_output();
        let (moved, fallout) = self.placer.fail_over(run, progress, kind, blame);
        if moved {
            delivery.next_attempt();
            self.hand_to_journal(run, delivery);
        }
        // Settling never waits on a run's delivery: it sends, spawns and arms.
        self.settle(fallout);
        moved
    }

    /// Ends `run`'s attempt on `node`'s `connection` with `kind` (never relayed) only if
    /// failover or a continuation moves the run on, its next attempt sent or queued; else
    /// leaves the attempt as it is and returns `false` (`kind`'s message then ends with why
    /// the run was not continued, when it was refused one).
    pub(super) async fn move_off_attempt(
        self: &Arc<Self>,
        run: &Arc<Run>,
        node: &NodeId,
        connection: ConnectionId,
        kind: &mut RunEventKind,
    ) -> bool {
        let mut delivery = run.delivery().await;
        if !run.route().is_on(node, connection) {
            return false;
        }
        self.attempt_ended(run, &mut delivery, kind, false)
    }

    /// Whether `events` from `source` belong to an attempt that has ended (failed over)
    /// or moved to another connection (resumed) while they waited for the run's lock;
    /// such events are dropped and counted.
    fn is_stale(&self, run: &Run, source: Source<'_>, events: usize) -> bool {
        let (Source::Attempt(node, connection) | Source::Departed(node, connection)) = source
        else {
            return false;
        };
        let stale = !run.route().is_attempt(node, connection);
        if stale {
            let dropped = &self.stats.dropped_after_terminal;
            dropped.fetch_add(events as u64, Ordering::Relaxed);
        }
        stale
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
            let current = run.route();
            let node = current.placement().attempt().map(|(node, _)| node.clone());
            (node, current.reason().filter(|_| started).map(Box::new))
        }
    };
    let spec = run.spec();
    RunEvent {
        run_id: run.id().clone(),
        node,
        adapter: spec.selector.adapter.clone(),
        target: spec.model_target().clone(),
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
            tracing::info!(parent: run.span(), run_id = %run.id(), node, code, message, origin = ?event.origin, "run failed");
        }
        kind => debug!(parent: run.span(), run_id = %run.id(), outcome = kind.name(), "run ended"),
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
