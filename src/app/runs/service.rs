//! [`RunService`]: the public face of the run service — accepting, cancelling and draining
//! runs — and the [`NodeEventHandler`] the node transport calls. The work is done in the
//! modules beside it: placement and the queue (`placement.rs`), the relay of events
//! (`delivery.rs`) and the timers (`timers.rs`).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use opentelemetry::metrics::Meter;
use tokio::sync::{Notify, mpsc};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::{debug, info_span, warn};

use super::delivery::{CALLER_BUFFER, Delivery};
use super::metrics::RunMetrics;
use super::table::{Miss, Placement, Run, Table, lock};
use super::trace::NodeSpans;
use crate::app::settings::RunsConfig;
use crate::domain::{
    EdgeFailure, EventOrigin, NodeId, RunEvent, RunEventKind, RunId, RunSpec, SelectError,
};
use crate::ports::{
    CloseReason, ConnectionId, EventSink, NodeEventHandler, NodeTransport, Registry, ReportedEvent,
};

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

/// What every part of the run service shares.
pub(super) struct Inner {
    pub(super) registry: Arc<dyn Registry>,
    pub(super) transport: Arc<dyn NodeTransport>,
    pub(super) sink: Arc<dyn EventSink>,
    pub(super) config: RunsConfig,
    /// The open runs and the queue; see [`Table`] for what must happen under it.
    pub(super) table: Mutex<Table>,
    next_id: AtomicU64,
    id_prefix: u32,
    draining: AtomicBool,
    /// Signalled whenever a run ends, for the drain wait.
    pub(super) run_ended: Notify,
    pub(super) timers: TaskTracker,
    pub(super) stats: RunStats,
    pub(super) metrics: RunMetrics,
    /// Nodes' connection spans, while span export is on.
    pub(super) node_spans: NodeSpans,
}

impl RunService {
    /// A run service placing runs on the nodes in `registry`, sending through `transport`
    /// and relaying to `sink`, with its instruments created from `meter`.
    pub fn new(
        registry: Arc<dyn Registry>,
        transport: Arc<dyn NodeTransport>,
        sink: Arc<dyn EventSink>,
        config: RunsConfig,
        meter: &Meter,
    ) -> Self {
        Self {
            inner: Arc::new(Inner {
                registry,
                transport,
                sink,
                config,
                table: Mutex::new(Table::default()),
                next_id: AtomicU64::new(1),
                id_prefix: rand::random(),
                draining: AtomicBool::new(false),
                run_ended: Notify::new(),
                timers: TaskTracker::new(),
                stats: RunStats::default(),
                metrics: RunMetrics::new(meter),
                node_spans: NodeSpans::default(),
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
        let run = Arc::new(self.new_run(spec, caller));
        let placed = self.admit(&mut lock(&inner.table), &run)?;
        if let Some(node) = placed {
            self.send_run(&run, &node);
        }
        self.watch(&run);
        Ok(RunHandle {
            run_id: run.id.clone(),
            events,
        })
    }

    /// A fresh run with the next id, not yet in the table.
    fn new_run(&self, spec: RunSpec, caller: mpsc::Sender<Arc<RunEvent>>) -> Run {
        let n = self.inner.next_id.fetch_add(1, Ordering::Relaxed);
        let id = RunId::new(format!("run-{:08x}-{n:06}", self.inner.id_prefix));
        let span = info_span!(
            "run",
            run_id = %id,
            adapter = %spec.selector.adapter,
            target = %spec.selector.target,
            node = tracing::field::Empty,
        );
        Run {
            id,
            span,
            spec,
            placement: Mutex::new(Placement::Queued),
            accepted_at: Instant::now(),
            delivery: tokio::sync::Mutex::new(Delivery::new(caller)),
            ended: CancellationToken::new(),
        }
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
            self.end_run(&run, cancelled).await;
            return true;
        }
        self.send_cancel(&run, reason);
        self.arm_cancel_grace(run, cancelled);
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
            self.end_run(run, EdgeFailure::EdgeShutdown.into_event_kind())
                .await;
        });
        futures::future::join_all(endings).await;
        inner.timers.close();
        inner.timers.wait().await;
        inner.sink.flush().await;
    }
}

#[async_trait]
impl NodeEventHandler for RunService {
    fn node_connected(&self, node: &NodeId) {
        let connection = || self.inner.registry.get(node.as_str()).map(|n| n.connection);
        self.inner.node_spans.connected(node, connection);
        let placed = self.pump(&mut lock(&self.inner.table));
        for (run, node) in placed {
            self.send_run(&run, &node);
        }
    }

    async fn run_event(&self, node: &NodeId, connection: ConnectionId, event: ReportedEvent) {
        let ReportedEvent { run_id, seq, kind } = event;
        let held = lock(&self.inner.table).held_by(&run_id, node, connection);
        let stats = &self.inner.stats;
        match held {
            Ok(run) => {
                self.relay_event(&run, Some(seq), EventOrigin::Node, kind)
                    .await;
            }
            Err(Miss::Ended) => {
                stats.dropped_after_terminal.fetch_add(1, Ordering::Relaxed);
                debug!(run_id, %node, "dropped an event for a run that has ended");
            }
            Err(Miss::Unknown) => {
                stats.dropped_unknown_run.fetch_add(1, Ordering::Relaxed);
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
        self.inner.node_spans.disconnected(node, connection);
        let held = lock(&self.inner.table).runs_on(node, connection);
        if !held.is_empty() {
            debug!(%node, %reason, runs = held.len(), "ending the runs of a disconnected node");
        }
        for run in held {
            self.end_run(&run, EdgeFailure::NodeDisconnected.into_event_kind())
                .await;
        }
    }
}
