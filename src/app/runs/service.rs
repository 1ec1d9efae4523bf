//! [`RunService`]: the run lifecycle from acceptance to its one terminal event.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use opentelemetry::metrics::Meter;
use tokio::sync::{Notify, mpsc};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::{Instrument, debug, info_span, warn};

use super::metrics::RunMetrics;
use super::table::{Delivery, Placement, Run, Table, lock};
use crate::adapters::journal::NoopJournal;
use crate::app::drains::Drains;
use crate::app::settings::RunsConfig;
use crate::domain::{
    EdgeFailure, EventOrigin, EventVerdict, NodeId, RunEvent, RunEventKind, RunId, RunSpec,
    RunState, SelectError, select_node,
};
use crate::ports::{
    CloseReason, ConnectionId, EventSink, JournalEntry, NodeCommand, NodeEventHandler,
    NodeTransport, Registry, ReportedEvent, RunAssignment, RunJournal,
};

/// Events buffered for a caller who reads slower than the node writes. When it is full the
/// node's connection waits (it stops reading frames), which slows the node down.
const CALLER_BUFFER: usize = 256;

/// How long a full caller buffer may stay full before the edge stops feeding that caller
/// (the run goes on, and its events still reach the sinks). Bounds how long a caller who
/// stopped reading can hold up its node's connection, a deadline or a shutdown.
const CALLER_STALL_TIMEOUT: Duration = Duration::from_secs(5);

/// Why a run was not accepted. Accepted runs never fail this way: they end with a terminal
/// event instead.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StartError {
    /// No connected node can ever take it now (nobody serves it, or the pin is wrong).
    #[error(transparent)]
    NoNode(SelectError),
    /// Every serving node is busy and the queue is full.
    #[error("{cause}; the run queue is full ({capacity} runs waiting)")]
    QueueFull {
        /// Why it would have waited.
        cause: SelectError,
        /// The queue's capacity.
        capacity: usize,
    },
    /// The edge is shutting down.
    #[error("the edge is shutting down")]
    ShuttingDown,
}

/// An accepted run: its id and the stream of its events, which ends after the terminal one.
#[derive(Debug)]
pub struct RunHandle {
    /// The run's id.
    pub run_id: RunId,
    /// Every event of the run, in order; the last is terminal. Dropping it does not cancel
    /// the run (call [`RunService::cancel`]); the events still reach the sinks.
    pub events: mpsc::Receiver<Arc<RunEvent>>,
}

/// Counters of the run service, read by the metrics exporter and tests.
#[derive(Debug, Default)]
pub struct RunStats {
    /// Events for runs the edge does not know (never existed, ended long ago, or held by
    /// another node or connection).
    pub dropped_unknown_run: AtomicU64,
    /// Events for a run after its terminal event, from the connection that held it.
    pub dropped_after_terminal: AtomicU64,
}

/// Accepts runs and relays their events. Cheap to clone.
#[derive(Clone)]
pub struct RunService {
    pub(super) inner: Arc<Inner>,
}

pub(super) struct Inner {
    pub(super) registry: Arc<dyn Registry>,
    transport: Arc<dyn NodeTransport>,
    sink: Arc<dyn EventSink>,
    /// Where run records and events are kept (nothing, when disabled).
    pub(super) journal: Arc<dyn RunJournal>,
    /// Nodes an operator drained: placement passes them over.
    pub(super) drains: Drains,
    config: RunsConfig,
    pub(super) table: Mutex<Table>,
    turn: AtomicU64,
    next_id: AtomicU64,
    id_prefix: u32,
    draining: AtomicBool,
    /// Signalled whenever a run ends, for the drain wait.
    run_ended: Notify,
    timers: TaskTracker,
    stats: RunStats,
    metrics: RunMetrics,
}

impl RunService {
    /// A run service placing runs on the nodes in `registry`, sending through `transport`
    /// and relaying to `sink`, with its instruments created from `meter`; it keeps no
    /// journal and knows no drain.
    pub fn new(
        registry: Arc<dyn Registry>,
        transport: Arc<dyn NodeTransport>,
        sink: Arc<dyn EventSink>,
        config: RunsConfig,
        meter: &Meter,
    ) -> Self {
        let extras = (Arc::new(NoopJournal) as Arc<dyn RunJournal>, Drains::new());
        Self::with_journal(registry, transport, sink, extras, config, meter)
    }

    /// [`RunService::new`] that also records every run in `journal` and passes over the
    /// nodes in `drains` when placing runs.
    pub fn with_journal(
        registry: Arc<dyn Registry>,
        transport: Arc<dyn NodeTransport>,
        sink: Arc<dyn EventSink>,
        (journal, drains): (Arc<dyn RunJournal>, Drains),
        config: RunsConfig,
        meter: &Meter,
    ) -> Self {
        Self {
            inner: Arc::new(Inner {
                registry,
                transport,
                sink,
                journal,
                drains,
                config,
                table: Mutex::new(Table::default()),
                turn: AtomicU64::new(0),
                next_id: AtomicU64::new(1),
                id_prefix: rand::random(),
                draining: AtomicBool::new(false),
                run_ended: Notify::new(),
                timers: TaskTracker::new(),
                stats: RunStats::default(),
                metrics: RunMetrics::new(meter),
            }),
        }
    }

    /// The service's counters.
    pub fn stats(&self) -> &RunStats {
        &self.inner.stats
    }

    /// How many runs are open (dispatched or queued).
    pub fn open_runs(&self) -> usize {
        lock(&self.inner.table).runs.len()
    }

    /// How many runs wait in the queue.
    pub fn queued_runs(&self) -> usize {
        lock(&self.inner.table).queue.len()
    }

    /// Accepts a run: sends it to a node now, or queues it when every serving node is busy.
    ///
    /// `spec.deadline` falls back to `runs.default_deadline_ms`.
    ///
    /// # Errors
    /// [`StartError`] when the run is not accepted; an accepted run reports every outcome,
    /// including waiting too long in the queue, as its terminal event.
    pub fn start(&self, mut spec: RunSpec) -> Result<RunHandle, StartError> {
        let inner = &self.inner;
        if inner.draining.load(Ordering::Acquire) {
            return Err(StartError::ShuttingDown);
        }
        if spec.deadline.is_none() && inner.config.default_deadline_ms > 0 {
            spec.deadline = Some(Duration::from_millis(inner.config.default_deadline_ms));
        }
        let (caller, events) = mpsc::channel(CALLER_BUFFER);
        let id = self.next_run_id();
        let span = info_span!(
            "run",
            run_id = %id,
            adapter = %spec.selector.adapter,
            target = %spec.selector.target,
            node = tracing::field::Empty,
        );
        let accepted = super::live::accepted(&id, &spec);
        let run = Arc::new(Run {
            id,
            span,
            spec,
            placement: Mutex::new(Placement::Queued),
            accepted_at: Instant::now(),
            delivery: tokio::sync::Mutex::new(Delivery {
                state: RunState::default(),
                caller: Some(caller),
                saw_output: false,
                followers: Vec::new(),
            }),
            ended: CancellationToken::new(),
            accepted,
            attempts: Mutex::new(Vec::new()),
            relayed: AtomicU64::new(0),
            first_output_ms: AtomicU64::new(0),
        });
        if inner.journal.enabled() {
            let entry = JournalEntry::Accepted(Box::new(run.accepted.clone()));
            inner.journal.record(entry);
        }
        let placed = {
            let mut table = lock(&inner.table);
            let placed = match self.place(&run) {
                Ok(Some(node)) => Some(node),
                // The chosen node left between two registry reads: the run waits like one
                // for a busy node (a rare race, so it may exceed the capacity by a few).
                Ok(None) => {
                    table.queue.push_back(Arc::clone(&run));
                    None
                }
                Err(cause) if cause.is_busy() => {
                    if table.queue.len() >= inner.config.queue_capacity {
                        return Err(StartError::QueueFull {
                            cause,
                            capacity: inner.config.queue_capacity,
                        });
                    }
                    debug!(run_id = %run.id, waiting = table.queued_like(&run.spec), "all serving nodes busy; queued");
                    table.queue.push_back(Arc::clone(&run));
                    None
                }
                Err(cause) => return Err(StartError::NoNode(cause)),
            };
            table.runs.insert(run.id.clone(), Arc::clone(&run));
            placed
        };
        if let Some(node) = placed {
            self.send_run(&run, &node);
        }
        self.watch(&run);
        Ok(RunHandle {
            run_id: run.id.clone(),
            events,
        })
    }

    /// Cancels a run. A queued run ends at once with `cancelled`; a dispatched run is sent
    /// `CancelRun` and ends with the node's own terminal event, or the edge's `cancelled`
    /// after `runs.cancel_grace_ms`. Returns whether the run was open.
    pub async fn cancel(&self, run_id: &RunId, reason: &str) -> bool {
        let Some(run) = lock(&self.inner.table).runs.get(run_id).cloned() else {
            return false;
        };
        let cancelled = RunEventKind::Cancelled {
            reason: reason.to_owned(),
        };
        if lock(&self.inner.table).unqueue(run_id) {
            self.deliver_edge(&run, cancelled).await;
            return true;
        }
        self.send_cancel(&run, reason);
        let service = self.clone();
        let grace = Duration::from_millis(self.inner.config.cancel_grace_ms);
        self.inner.timers.spawn(async move {
            tokio::select! {
                () = run.ended.cancelled() => {}
                () = tokio::time::sleep(grace) => service.deliver_edge(&run, cancelled).await,
            }
        });
        true
    }

    /// Stops accepting runs, waits up to `grace` for open runs to end, then ends the rest
    /// with `failed`/`edge_shutdown` and flushes the sink.
    pub async fn drain(&self, grace: Duration) {
        let inner = &self.inner;
        inner.draining.store(true, Ordering::Release);
        let deadline = Instant::now() + grace;
        loop {
            let ended = inner.run_ended.notified();
            if self.open_runs() == 0 {
                break;
            }
            if tokio::time::timeout_at(deadline, ended).await.is_err() {
                break;
            }
        }
        let remaining: Vec<Arc<Run>> = {
            let mut table = lock(&inner.table);
            table.queue.clear();
            table.runs.values().cloned().collect()
        };
        if !remaining.is_empty() {
            warn!(
                runs = remaining.len(),
                "ending runs still open after the drain grace period"
            );
        }
        let endings = remaining.iter().map(|run| async move {
            self.send_cancel(run, "edge shutting down");
            self.deliver_edge(run, EdgeFailure::EdgeShutdown.into_event_kind())
                .await;
        });
        futures::future::join_all(endings).await;
        inner.timers.close();
        inner.timers.wait().await;
        inner.sink.flush().await;
    }

    fn next_run_id(&self) -> RunId {
        let n = self.inner.next_id.fetch_add(1, Ordering::Relaxed);
        RunId::new(format!("run-{:08x}-{n:06}", self.inner.id_prefix))
    }

    /// Picks a node for `run` and reserves a slot on it. Call with the table locked.
    fn place(&self, run: &Run) -> Result<Option<NodeId>, SelectError> {
        let inner = &self.inner;
        let mut loads = inner.registry.loads();
        inner.drains.exclude_from(&mut loads);
        let turn = inner.turn.fetch_add(1, Ordering::Relaxed);
        let chosen = select_node(&loads, &run.spec.selector, turn)?
            .record
            .id
            .clone();
        let Some(connection) = inner.registry.get(chosen.as_str()).map(|n| n.connection) else {
            // The node left between the two reads; nobody else can take the slot.
            return Ok(None);
        };
        inner.registry.adjust_active_runs(&chosen, connection, 1);
        run.set_placement(Placement::Dispatched {
            node: chosen.clone(),
            connection,
        });
        self.record_attempt(run, &chosen);
        run.span.record("node", tracing::field::display(&chosen));
        debug!(parent: &run.span, "run dispatched");
        inner
            .metrics
            .dispatched(&run.spec, run.accepted_at.elapsed());
        Ok(Some(chosen))
    }

    /// Sends a placed run to its node; if the node is gone, ends the run.
    fn send_run(&self, run: &Arc<Run>, node: &NodeId) {
        let RunSpec {
            selector,
            input,
            content_type,
            params,
            deadline,
            operation,
        } = &run.spec;
        let assignment = RunAssignment {
            run_id: run.id.clone(),
            adapter: selector.adapter.clone(),
            target: selector.target.clone(),
            input: input.clone(),
            content_type: content_type.clone(),
            params: params.clone(),
            // The deadline runs from acceptance: the node gets what is left of it.
            deadline_ms: deadline.map_or(0, |d| {
                let left = d
                    .saturating_sub(run.accepted_at.elapsed())
                    .max(Duration::from_millis(1));
                u32::try_from(left.as_millis()).unwrap_or(u32::MAX)
            }),
            operation: *operation,
        };
        if let Err(error) = self
            .inner
            .transport
            .send(node, NodeCommand::Run(assignment))
        {
            debug!(run_id = %run.id, %error, "could not send the run; the node is leaving");
            let service = self.clone();
            let run = Arc::clone(run);
            self.inner.timers.spawn(async move {
                service
                    .deliver_edge(&run, EdgeFailure::NodeDisconnected.into_event_kind())
                    .await;
            });
        }
    }

    fn send_cancel(&self, run: &Run, reason: &str) {
        if let Placement::Dispatched { node, .. } = run.placement() {
            let command = NodeCommand::Cancel {
                run_id: run.id.clone(),
                reason: reason.to_owned(),
            };
            // A node that cannot be reached ends its runs through its disconnect.
            let _ = self.inner.transport.send(&node, command);
        }
    }

    /// Starts the timers that end a run the node does not: the queue wait and the deadline.
    fn watch(&self, run: &Arc<Run>) {
        let queued = run.placement() == Placement::Queued;
        let deadline = run.spec.deadline;
        if !queued && deadline.is_none() {
            return;
        }
        let service = self.clone();
        let run = Arc::clone(run);
        let queue_wait = Duration::from_millis(self.inner.config.queue_timeout_ms);
        let span = run.span.clone();
        self.inner.timers.spawn(
            async move {
                let far = Duration::from_secs(86_400 * 365);
                let started = run.accepted_at;
                let expires = started + deadline.unwrap_or(far);
                let mut queue_expires = queued.then(|| started + queue_wait);
                loop {
                    tokio::select! {
                        () = run.ended.cancelled() => return,
                        () = tokio::time::sleep_until(queue_expires.unwrap_or(started + far)), if queue_expires.is_some() => {
                            queue_expires = None;
                            if lock(&service.inner.table).unqueue(&run.id) {
                                service.deliver_edge(&run, EdgeFailure::QueueTimeout.into_event_kind()).await;
                                return;
                            }
                        }
                        () = tokio::time::sleep_until(expires), if deadline.is_some() => {
                            lock(&service.inner.table).unqueue(&run.id);
                            service.send_cancel(&run, "deadline exceeded");
                            service.deliver_edge(&run, EdgeFailure::DeadlineExceeded.into_event_kind()).await;
                            return;
                        }
                    }
                }
            }
            .instrument(span),
        );
    }

    async fn deliver_edge(&self, run: &Arc<Run>, kind: RunEventKind) {
        self.deliver(run, None, EventOrigin::Edge, kind).await;
    }

    /// Relays one event of `run` to the sink and the caller, in order; retires the run
    /// after its terminal event and drops anything after it.
    async fn deliver(
        &self,
        run: &Arc<Run>,
        seq: Option<u64>,
        origin: EventOrigin,
        kind: RunEventKind,
    ) {
        let mut delivery = run.delivery.lock().await;
        let seq = seq.unwrap_or_else(|| delivery.state.next_edge_seq());
        let terminal = match delivery.state.offer(seq, &kind) {
            EventVerdict::DropAfterTerminal => {
                self.inner
                    .stats
                    .dropped_after_terminal
                    .fetch_add(1, Ordering::Relaxed);
                return;
            }
            EventVerdict::Relay => false,
            EventVerdict::RelayTerminal => true,
        };
        let node = match run.placement() {
            Placement::Dispatched { node, .. } => Some(node),
            Placement::Queued => None,
        };
        let event = Arc::new(RunEvent {
            run_id: run.id.clone(),
            node,
            adapter: run.spec.selector.adapter.clone(),
            target: run.spec.selector.target.clone(),
            seq,
            origin,
            kind,
        });
        let first_output =
            !delivery.saw_output && matches!(event.kind, RunEventKind::Output { .. });
        delivery.saw_output |= first_output;
        self.tap(run, &mut delivery.followers, &event, first_output);
        self.inner
            .metrics
            .relayed(&run.spec, &event, run.accepted_at, first_output);
        self.inner.sink.publish(Arc::clone(&event));
        if let Some(caller) = &delivery.caller
            && send_to_caller(caller, Arc::clone(&event)).await.is_err()
        {
            if !caller.is_closed() {
                warn!(run_id = %run.id, "the caller stopped reading this run's events; no longer sending them");
            }
            delivery.caller = None;
        }
        if terminal {
            match &event.kind {
                RunEventKind::Failed { code, message, .. } => {
                    tracing::info!(parent: &run.span, code, message, origin = ?event.origin, "run failed");
                }
                kind => debug!(parent: &run.span, outcome = kind.name(), "run ended"),
            }
            delivery.caller = None;
            delivery.followers.clear();
            drop(delivery);
            self.retire(run);
        }
    }

    /// Removes an ended run, frees its node's slot and hands the slot to a queued run.
    fn retire(&self, run: &Run) {
        run.ended.cancel();
        let placed = {
            let mut table = lock(&self.inner.table);
            table.runs.remove(&run.id);
            if let Placement::Dispatched { node, connection } = run.placement() {
                self.inner
                    .registry
                    .adjust_active_runs(&node, connection, -1);
                table.remember_ended(run.id.clone(), node, connection);
            }
            self.pump(&mut table)
        };
        for (queued, node) in placed {
            self.send_run(&queued, &node);
        }
        self.inner.run_ended.notify_waiters();
    }

    /// Places every queued run that now fits, in queue order. Call with the table locked;
    /// send the returned runs after unlocking.
    fn pump(&self, table: &mut Table) -> Vec<(Arc<Run>, NodeId)> {
        let mut placed = Vec::new();
        let mut waiting = std::collections::VecDeque::with_capacity(table.queue.len());
        while let Some(run) = table.queue.pop_front() {
            match self.place(&run) {
                Ok(Some(node)) => placed.push((run, node)),
                Ok(None) | Err(_) => waiting.push_back(run),
            }
        }
        table.queue = waiting;
        placed
    }

    fn run_held_by(
        &self,
        run_id: &str,
        node: &NodeId,
        connection: ConnectionId,
    ) -> Option<Arc<Run>> {
        let run = lock(&self.inner.table).runs.get(run_id).cloned()?;
        match run.placement() {
            Placement::Dispatched {
                node: n,
                connection: c,
            } if &n == node && c == connection => Some(run),
            _ => None,
        }
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

#[async_trait]
impl NodeEventHandler for RunService {
    fn node_connected(&self, _node: &NodeId) {
        let placed = self.pump(&mut lock(&self.inner.table));
        for (run, node) in placed {
            self.send_run(&run, &node);
        }
    }

    async fn run_event(&self, node: &NodeId, connection: ConnectionId, event: ReportedEvent) {
        let ReportedEvent { run_id, seq, kind } = event;
        match self.run_held_by(&run_id, node, connection) {
            Some(run) => self.deliver(&run, Some(seq), EventOrigin::Node, kind).await,
            None if lock(&self.inner.table).ended_on(&run_id, node, connection) => {
                self.inner
                    .stats
                    .dropped_after_terminal
                    .fetch_add(1, Ordering::Relaxed);
                debug!(run_id, %node, "dropped an event for a run that has ended");
            }
            None => {
                self.inner
                    .stats
                    .dropped_unknown_run
                    .fetch_add(1, Ordering::Relaxed);
                debug!(run_id, %node, "dropped an event for a run this node does not hold");
            }
        }
    }

    async fn node_disconnected(
        &self,
        node: &NodeId,
        connection: ConnectionId,
        reason: CloseReason,
    ) {
        let held: Vec<Arc<Run>> = lock(&self.inner.table)
            .runs
            .values()
            .filter(|run| {
                matches!(run.placement(), Placement::Dispatched { node: n, connection: c } if &n == node && c == connection)
            })
            .cloned()
            .collect();
        if !held.is_empty() {
            debug!(%node, %reason, runs = held.len(), "ending the runs of a disconnected node");
        }
        for run in held {
            self.deliver_edge(&run, EdgeFailure::NodeDisconnected.into_event_kind())
                .await;
        }
    }
}
