//! One registered connection to the edge: a reader that takes commands (runs, cancels,
//! model commands, shutdown, heartbeat acks) and a writer that sends run events, heartbeats,
//! availability reports and model outcomes, running side by side until either ends the
//! session.
//!
//! The writer heartbeats every `heartbeat_interval_ms` with the number of running runs and a
//! fresh `ping` (and the node's devices when they changed enough to tell, v1.7); the reader hands the acks to a [`LinkMonitor`], and the writer ends the
//! session when the monitor judges the link dead. Acks also tell the run table which events
//! the edge surely has, so it can stop keeping them. Neither loop owns a run: runs live in
//! the table and outlive sessions. Model commands run as tasks of their own
//! ([`model_commands`]) and hand their outcomes to this session's writer, which
//! sends any availability change first, so the edge hears a target served before it hears
//! the load that served it is done.

use std::collections::VecDeque;
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use edge::client::{
    ClientError, LinkMonitor, NodeReceiver, NodeSender, ReceivedConfig, ReceivedEdgeFrame,
};
use edge::client::{ModelOutcome, NodeCommand, NodeFrame};
use edge::domain::{Availability, Inventory};
use edge::hops;
use futures::{SinkExt, StreamExt};
use tokio::sync::{mpsc, watch};

use crate::dispatch::start_run;
use crate::model_commands;
use crate::runs::Stop;
use crate::shared::Core;

/// The most run events written per batch before the writer looks at its other duties.
const BATCH: usize = 256;

/// How long the first availability report waits for the first probes.
const FIRST_PROBE_WAIT: Duration = Duration::from_secs(5);

/// Model outcomes waiting for the writer. A command task whose outcome finds it full waits
/// (the read loop never does: it only starts commands).
const OUTCOMES: usize = 64;

/// Why a session ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SessionEnd {
    /// The edge closed the connection.
    Closed,
    /// Reading or writing failed.
    Failed(String),
    /// Nothing arrived from a pinging edge for the configured number of intervals.
    LinkDead,
    /// The edge sent `Shutdown`.
    EdgeShutdown(String),
    /// The node is exiting.
    Exit,
}

/// Pings handed out and the write batch each followed, to map an ack to what it confirms.
struct LinkBook {
    monitor: LinkMonitor,
    marks: VecDeque<(u64, u64)>,
}

impl LinkBook {
    fn ping(&mut self, batch: u64) -> u64 {
        let ping = self.monitor.next_ping();
        self.marks.push_back((ping, batch));
        if self.marks.len() > 64 {
            self.marks.pop_front();
        }
        ping
    }

    /// The write batch an ack of `ping` confirms, when it answers one of ours.
    fn ack(&mut self, ping: u64, now: Instant) -> Option<u64> {
        if !self.monitor.acked(ping, now) {
            return None;
        }
        let batch = self.marks.iter().find(|(p, _)| *p == ping).map(|(_, b)| *b);
        self.marks.retain(|(p, _)| *p > ping);
        batch
    }
}

fn now() -> Instant {
    tokio::time::Instant::now().into_std()
}

fn book(link: &Mutex<LinkBook>) -> MutexGuard<'_, LinkBook> {
    link.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Serves a registered connection with `config` until it ends.
pub async fn serve(
    sender: NodeSender,
    receiver: NodeReceiver,
    core: &Core,
    config: &ReceivedConfig,
) -> SessionEnd {
    let interval = Duration::from_millis(u64::from(config.heartbeat_interval_ms.max(1)));
    let max_running = usize::try_from(config.max_concurrent_runs.max(1)).unwrap_or(usize::MAX);
    let link = Mutex::new(LinkBook {
        monitor: LinkMonitor::new(interval, core.options.dead_after_intervals, now()),
        marks: VecDeque::new(),
    });
    let (outcomes, answered) = mpsc::channel(OUTCOMES);
    tokio::select! {
        end = read_loop(receiver, core, &link, max_running, &outcomes) => end,
        end = write_loop(sender, core, &link, interval, answered) => end,
    }
}

/// Reads the edge's frames until the connection ends; model commands' outcomes go to
/// `outcomes`, for this session's writer.
async fn read_loop(
    mut receiver: NodeReceiver,
    core: &Core,
    link: &Mutex<LinkBook>,
    max_running: usize,
    outcomes: &mpsc::Sender<ModelOutcome>,
) -> SessionEnd {
    loop {
        let frame = match receiver.next().await {
            None => return SessionEnd::Closed,
            Some(Err(error)) => return SessionEnd::Failed(error.to_string()),
            Some(Ok(frame)) => frame,
        };
        let heard = now();
        if let ReceivedEdgeFrame::HeartbeatAck { ping } = frame {
            let confirmed = book(link).ack(ping, heard);
            if let Some(batch) = confirmed {
                core.table.acknowledged(batch);
            }
            continue;
        }
        book(link).monitor.heard(heard);
        match frame {
            ReceivedEdgeFrame::Command(NodeCommand::Run(run)) => {
                tracing::trace!(target: hops::TARGET, hop = hops::RUN_RECEIVED, run_id = %run.run_id);
                start_run(run, &core.adapters, &core.table, &core.tasks, max_running);
            }
            ReceivedEdgeFrame::Command(NodeCommand::Cancel { run_id, reason }) => {
                tracing::info!(%run_id, %reason, "the edge cancelled the run");
                if !core.table.stop(run_id.as_str(), Stop::Cancel(reason)) {
                    tracing::debug!(%run_id, "cancel for a run the node does not hold");
                }
            }
            ReceivedEdgeFrame::Command(NodeCommand::Shutdown { reason }) => {
                return SessionEnd::EdgeShutdown(reason);
            }
            ReceivedEdgeFrame::Command(NodeCommand::Model(command)) => {
                model_commands::start(command, core, outcomes);
            }
            ReceivedEdgeFrame::Registered(_)
            | ReceivedEdgeFrame::Unknown
            | ReceivedEdgeFrame::HeartbeatAck { .. } => {}
        }
    }
}

async fn write_loop(
    mut sender: NodeSender,
    core: &Core,
    link: &Mutex<LinkBook>,
    interval: Duration,
    mut answered: mpsc::Receiver<ModelOutcome>,
) -> SessionEnd {
    let mut writer = Writer {
        sender: &mut sender,
        core,
        link,
        batch: 0,
    };
    let board = core.adapters.board();
    let mut availability = board.subscribe();
    // The registration told the devices as they were: only later changes are sent.
    let mut inventory = core.inventory.subscribe();
    inventory.mark_unchanged();
    // Bounded by the heartbeat interval too: the edge counts silence from registration on.
    board.wait_probed(FIRST_PROBE_WAIT.min(interval)).await;
    let first = availability.borrow_and_update().clone();
    if let Err(error) = writer.heartbeat(Some(first)).await {
        return SessionEnd::Failed(error.to_string());
    }
    let mut ticker = tokio::time::interval_at(tokio::time::Instant::now() + interval, interval);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        let result = tokio::select! {
            () = core.table.unsent_ready() => writer.write_unsent().await,
            _ = ticker.tick() => {
                let at = now();
                let (dead, silent) = {
                    let monitor = &book(link).monitor;
                    (monitor.is_dead(at), monitor.silent_for(at))
                };
                if dead {
                    // How long the edge was silent tells a stalled edge (or a stalled node)
                    // from one that is gone.
                    let silent_ms = silent.as_millis();
                    tracing::warn!(silent_ms, "the edge answers no ping: declaring the link dead");
                    return SessionEnd::LinkDead;
                }
                writer.heartbeat(None).await
            }
            Ok(()) = availability.changed() => {
                let current = availability.borrow_and_update().clone();
                writer.heartbeat(Some(current)).await
            }
            Some(outcome) = answered.recv() => writer.model_outcome(outcome, &mut availability).await,
            Ok(()) = inventory.changed() => {
                let current = inventory.borrow_and_update().clone();
                writer.beat(None, Some(current)).await
            }
            () = core.exit.cancelled() => {
                let _ = writer.write_unsent().await;
                return SessionEnd::Exit;
            }
        };
        if let Err(error) = result {
            return SessionEnd::Failed(error.to_string());
        }
    }
}

struct Writer<'a> {
    sender: &'a mut NodeSender,
    core: &'a Core,
    link: &'a Mutex<LinkBook>,
    batch: u64,
}

impl Writer<'_> {
    /// A heartbeat with the running runs and a fresh ping (and the availability, if given).
    async fn heartbeat(&mut self, availability: Option<Availability>) -> Result<(), ClientError> {
        self.beat(availability, None).await
    }

    /// A heartbeat with the running runs, a fresh ping, and the availability and the
    /// devices when given.
    async fn beat(
        &mut self,
        availability: Option<Availability>,
        inventory: Option<Inventory>,
    ) -> Result<(), ClientError> {
        let ping = book(self.link).ping(self.batch);
        let active = u32::try_from(self.core.table.running()).unwrap_or(u32::MAX);
        if let Some(availability) = &availability {
            let pairs: Vec<String> = availability
                .pairs()
                .iter()
                .map(|(a, t)| format!("{a}/{t}"))
                .collect();
            let loads: Vec<String> = availability
                .managed_adapters()
                .flat_map(|(adapter, managed)| {
                    managed.targets.iter().map(move |(target, load)| {
                        format!("{adapter}/{target}={}", load.state.as_str())
                    })
                })
                .collect();
            if loads.is_empty() {
                tracing::info!(available = ?pairs, "reporting availability");
            } else {
                tracing::info!(available = ?pairs, ?loads, "reporting availability");
            }
        }
        let frame = NodeFrame::Heartbeat {
            active_runs: active,
            ping,
            availability,
            inventory,
        };
        self.sender.send(frame).await?;
        Ok(())
    }

    /// Sends a model command's outcome, after the availability when it has changed since
    /// it was last sent (the command published its result there first).
    async fn model_outcome(
        &mut self,
        outcome: ModelOutcome,
        availability: &mut watch::Receiver<Availability>,
    ) -> Result<(), ClientError> {
        if availability.has_changed().unwrap_or(false) {
            let current = availability.borrow_and_update().clone();
            self.heartbeat(Some(current)).await?;
        }
        self.sender.send(NodeFrame::ModelOutcome(outcome)).await?;
        Ok(())
    }

    /// Writes every unsent event, in batches, then flushes. While the node drains, a batch
    /// that ended a run is followed by a ping so the edge's ack lets the node retire it.
    async fn write_unsent(&mut self) -> Result<(), ClientError> {
        let mut ended_a_run = false;
        let mut traced = Vec::new();
        loop {
            self.batch += 1;
            let unsent = self.core.table.take_unsent(self.batch, BATCH);
            if unsent.frames.is_empty() {
                break;
            }
            ended_a_run |= unsent.terminal;
            if hops::enabled() {
                traced.extend(unsent.frames.iter().filter_map(|frame| match frame {
                    NodeFrame::RunEvent(event) => Some((event.run_id.clone(), event.seq)),
                    _ => None,
                }));
            }
            for frame in unsent.frames {
                self.sender.feed(frame).await?;
            }
        }
        for (run_id, seq) in traced {
            tracing::trace!(target: hops::TARGET, hop = hops::EVENT_SENT, run_id, seq);
        }
        self.sender.flush().await?;
        if ended_a_run
            && self.core.draining.is_cancelled()
            && book(self.link).monitor.answers_pings()
        {
            self.heartbeat(None).await?;
        }
        Ok(())
    }
}
