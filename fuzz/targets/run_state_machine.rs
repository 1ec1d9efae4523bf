//! Fuzz target `run_state_machine`: the run service driven by an arbitrary interleaving of
//! node arrivals and departures (some of nodes that resume: their runs are held when they
//! leave and claimed when they come back), runs started and cancelled, node events, slow or
//! closed links, and the passing of time.
//!
//! The input is read as a config byte and then a sequence of operations (see [`Op`]). Each
//! fake connection is a task that hands its node's events to the service one at a time and
//! then reports its departure, as the real transport does, so connections, timers and the
//! driver interleave; the clock is paused, so timers fire in a deterministic order whenever
//! everything waits. After the operations, the service is drained and every connection
//! closed.
//!
//! Invariants: nothing panics or hangs; every accepted run has exactly one terminal event in
//! the sink with nothing after it; its caller saw exactly the sink's events and then the end
//! of its stream; no event names a run that was never accepted; no run stays open or queued;
//! after the drain no node still counts an active run.
//!
//! This file is shared by the libFuzzer binary and the root crate's corpus replay test, so it
//! must build on stable and stay clippy-clean.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use edge::components::FileNodeStore;
use edge::components::LockRegistry;
use edge::components::RunService;
use edge::components::TcpTransport;
use edge::components::{Routing, policy};
use edge::domain::routing::{AffinityKey, Catalog, KeySource, Priority, TenantKey};
use edge::domain::{
    AdapterDefinition, AdapterName, FailureClass, NodeDefinition, NodeId, NodeRecord, NodeSelector,
    ResumeClaim, RunEvent, RunEventKind, RunId, RunRouting, RunSpec, Target, Token, Usage,
};
use edge::ports::{
    CloseReason, ConnectionId, EventSink, LastFrame, LinkError, NewConnection, NodeCommand,
    NodeEventHandler, NodeLink, NodeStore, Registry, ReportedEvent,
};
use edge::settings::RunsConfig;
use edge::settings::{BreakerConfig, LimitsConfig, RoutingConfig};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

use crate::recording::{RecordingSink, lock};

/// Far beyond every timer the service sets: reaching it means something hangs. The clock is
/// paused, so this costs no real time.
const HANG: Duration = Duration::from_secs(7 * 24 * 3600);

/// Runs one input.
pub fn run(data: &[u8]) {
    let mut input = Input(data);
    let config = input.next().unwrap_or(0);
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .expect("a tokio runtime");
    runtime.block_on(async {
        let mut world = World::new(config);
        while let Some(op) = input.next() {
            world.apply(Op::read(op, &mut input)).await;
        }
        let grace = [0, 10, 1_000, 60_000][usize::from(input.pick() % 4)];
        world.finish(Duration::from_millis(grace)).await;
    });
}

/// The fuzz input, read a byte at a time; reads past the end give zeros.
struct Input<'a>(&'a [u8]);

impl Input<'_> {
    fn next(&mut self) -> Option<u8> {
        let (first, rest) = self.0.split_first()?;
        self.0 = rest;
        Some(*first)
    }

    fn pick(&mut self) -> u8 {
        self.next().unwrap_or(0)
    }
}

/// One step of the scenario.
#[derive(Debug)]
enum Op {
    /// Node `node` opens a connection and registers (refused while it still has one); a
    /// `resumable` one registers with an instance id, claiming every run it was last sent
    /// (its runs are held for it when it leaves).
    Connect { node: usize, resumable: bool },
    /// Node `node`'s live connection ends for `reason`.
    Close { node: usize, reason: CloseReason },
    /// A caller starts a run.
    Start { selector: u8, deadline: u8 },
    /// A caller cancels run `run` (an index into the accepted runs; past them, an unknown id).
    Cancel { run: usize },
    /// The node holding run `run` reports an event for it.
    HolderEvent { run: usize, seq: u8, kind: u8 },
    /// Node `node` reports an event for run `run`, which it may not hold.
    OtherEvent {
        node: usize,
        run: usize,
        seq: u8,
        kind: u8,
    },
    /// Time passes.
    Sleep { millis: u64 },
    /// Other tasks get to run without time passing.
    Yield { times: u8 },
    /// Node `node`'s outbound queue fills up: its next command closes it as a slow consumer.
    Stall { node: usize },
}

impl Op {
    fn read(op: u8, input: &mut Input<'_>) -> Op {
        match op % 9 {
            0 => {
                let byte = input.pick();
                Op::Connect {
                    node: usize::from(byte & 0x7f),
                    resumable: byte & 0x80 != 0,
                }
            }
            1 => Op::Close {
                node: usize::from(input.pick()),
                reason: CloseReason::ALL[usize::from(input.pick()) % CloseReason::ALL.len()],
            },
            2 => Op::Start {
                selector: input.pick(),
                deadline: input.pick(),
            },
            3 => Op::Cancel {
                run: usize::from(input.pick()),
            },
            4 => Op::HolderEvent {
                run: usize::from(input.pick()),
                seq: input.pick(),
                kind: input.pick(),
            },
            5 => Op::OtherEvent {
                node: usize::from(input.pick()),
                run: usize::from(input.pick()),
                seq: input.pick(),
                kind: input.pick(),
            },
            6 => Op::Sleep {
                millis: [1, 10, 100, 1_000, 5_000, 30_000, 120_000, 0]
                    [usize::from(input.pick() % 8)],
            },
            7 => Op::Yield {
                times: input.pick() % 8 + 1,
            },
            _ => Op::Stall {
                node: usize::from(input.pick()),
            },
        }
    }
}

/// What a fake connection task is told to do next.
enum Action {
    Event(ReportedEvent),
    Close(CloseReason),
}

/// A command the transport sent, and to which connection.
struct Sent {
    connection: ConnectionId,
    node: NodeId,
    command: NodeCommand,
}

/// One node's outbound side: records what it is sent, or refuses like the real link.
struct FakeLink {
    node: NodeId,
    connection: ConnectionId,
    actions: mpsc::UnboundedSender<Action>,
    closing: AtomicBool,
    full: AtomicBool,
    sent: Arc<Mutex<Vec<Sent>>>,
}

impl FakeLink {
    fn close(&self, reason: CloseReason) {
        if !self.closing.swap(true, Ordering::Relaxed) {
            // The task only stops reading after a Close, which this is the first of.
            let _ = self.actions.send(Action::Close(reason));
        }
    }
}

impl NodeLink for FakeLink {
    fn supersede(&self) {
        self.close(CloseReason::Superseded);
    }

    fn send(&self, command: NodeCommand) -> Result<(), LinkError> {
        if self.closing.load(Ordering::Relaxed) {
            return Err(LinkError::Closed);
        }
        if self.full.load(Ordering::Relaxed) {
            self.close(CloseReason::SlowConsumer);
            return Err(LinkError::Full);
        }
        lock(&self.sent).push(Sent {
            connection: self.connection,
            node: self.node.clone(),
            command,
        });
        Ok(())
    }
}

/// A node of the scenario and its live connection, if any.
struct Node {
    record: Arc<NodeRecord>,
    live: Option<Arc<FakeLink>>,
}

/// An accepted run and what its caller has read so far.
struct Accepted {
    id: RunId,
    seen: Arc<Mutex<Vec<Arc<RunEvent>>>>,
    reader: JoinHandle<()>,
}

struct World {
    service: RunService,
    registry: LockRegistry,
    sink: Arc<RecordingSink>,
    sent: Arc<Mutex<Vec<Sent>>>,
    nodes: Vec<Node>,
    connections: Vec<JoinHandle<()>>,
    next_connection: ConnectionId,
    runs: Vec<Accepted>,
}

impl World {
    fn new(config: u8) -> Self {
        let store = FileNodeStore::from_definitions(&[
            definition("node-0", "a0", &[("echo", &["t0", "t1"])], 1),
            definition("node-1", "a1", &[("echo", &["t0"]), ("llm", &["t1"])], 2),
            definition("node-2", "a2", &[("llm", &["t0", "t1"])], 1),
        ])
        .expect("valid definitions");
        let registry = LockRegistry::new();
        let sink = Arc::new(RecordingSink::default());
        let runs = RunsConfig {
            queue_capacity: [1, 2, 8, 1_024][usize::from(config % 4)],
            queue_timeout_ms: [50, 1_000, 30_000, 0][usize::from(config / 4 % 4)],
            no_node_timeout_ms: [20, 700, 10_000, 0][usize::from(config / 16 % 4)],
            max_attempts: 1 + u32::from(config / 2 % 4),
            cancel_grace_ms: [0, 20, 500, 5_000][usize::from(config / 16 % 4)],
            default_deadline_ms: [0, 0, 300, 2_000][usize::from(config / 64 % 4)],
            resume_grace_ms: [0, 50, 1_000, 5_000][usize::from(config / 4 % 4)],
            max_continuations: u32::from(config / 32 % 3),
            client_resume_grace_ms: [0, 50, 1_000, 5_000][usize::from(config / 8 % 4)],
        };
        let routing_config = RoutingConfig {
            breaker: BreakerConfig {
                failure_threshold: 1 + u32::from(config / 8 % 3),
                cooldown_ms: 100,
                max_cooldown_ms: 400,
            },
            ..RoutingConfig::default()
        };
        let limits = LimitsConfig {
            max_concurrent_runs_per_key: u32::from(config / 32 % 4),
            ..LimitsConfig::default()
        };
        let routing = Routing {
            catalog: Catalog::new(store.records()),
            policy: policy(&runs, &routing_config, &limits).expect("a valid policy"),
            key_limits: std::collections::HashMap::new(),
        };
        let service = RunService::new(
            Arc::new(registry.clone()),
            Arc::new(TcpTransport::new(Arc::new(registry.clone()))),
            Arc::clone(&sink) as Arc<dyn EventSink>,
            runs,
            routing,
            &opentelemetry::global::meter("fuzz"),
        );
        Self {
            service,
            registry,
            sink,
            sent: Arc::default(),
            nodes: store
                .records()
                .into_iter()
                .map(|record| Node { record, live: None })
                .collect(),
            connections: Vec::new(),
            next_connection: 1,
            runs: Vec::new(),
        }
    }

    async fn apply(&mut self, op: Op) {
        match op {
            Op::Connect { node, resumable } => {
                self.connect(node % self.nodes.len(), resumable).await;
            }
            Op::Close { node, reason } => {
                let count = self.nodes.len();
                if let Some(link) = self.nodes[node % count].live.take() {
                    link.close(reason);
                }
            }
            Op::Start { selector, deadline } => self.start(selector, deadline),
            Op::Cancel { run } => {
                let id = self.run_id(run);
                self.service.cancel(&id, "fuzz").await;
            }
            Op::HolderEvent { run, seq, kind } => {
                let Some(accepted) = self.runs.get(run % self.runs.len().max(1)) else {
                    return;
                };
                let holder = lock(&self.sent)
                    .iter()
                    .rev()
                    .find(|s| matches!(&s.command, NodeCommand::Run(a) if a.run_id == accepted.id))
                    .map(|s| (s.node.clone(), s.connection));
                let Some((node, connection)) = holder else {
                    return;
                };
                let live = self
                    .nodes
                    .iter()
                    .filter_map(|n| n.live.as_ref())
                    .find(|link| link.node == node && link.connection == connection);
                if let Some(link) = live {
                    let event = event(accepted.id.as_str(), seq, kind);
                    let _ = link.actions.send(Action::Event(event));
                }
            }
            Op::OtherEvent {
                node,
                run,
                seq,
                kind,
            } => {
                let id = self.run_id(run);
                if let Some(link) = &self.nodes[node % self.nodes.len()].live {
                    let _ = link
                        .actions
                        .send(Action::Event(event(id.as_str(), seq, kind)));
                }
            }
            Op::Sleep { millis } => tokio::time::sleep(Duration::from_millis(millis)).await,
            Op::Yield { times } => {
                for _ in 0..times {
                    tokio::task::yield_now().await;
                }
            }
            Op::Stall { node } => {
                if let Some(link) = &self.nodes[node % self.nodes.len()].live {
                    link.full.store(true, Ordering::Relaxed);
                }
            }
        }
    }

    /// A claim for every accepted run whose last `run` went to `node`, as a node that
    /// produced at most 255 events and keeps them all would make it.
    fn claims(&self, node: &NodeId) -> Vec<ResumeClaim> {
        let sent = lock(&self.sent);
        self.runs
            .iter()
            .filter(|accepted| {
                sent.iter()
                    .rev()
                    .find(|s| matches!(&s.command, NodeCommand::Run(a) if a.run_id == accepted.id))
                    .is_some_and(|s| &s.node == node)
            })
            .map(|accepted| ResumeClaim {
                run_id: accepted.id.as_str().to_owned(),
                next_seq: 256,
                first_buffered_seq: 1,
            })
            .collect()
    }

    /// An accepted run's id, or an id the service never gave out.
    fn run_id(&self, index: usize) -> RunId {
        match self.runs.get(index % (self.runs.len() + 1)) {
            Some(accepted) => accepted.id.clone(),
            None => RunId::new("run-never-started"),
        }
    }

    /// Registers a new connection of node `index`, the way the transport does: into the
    /// registry, its claims answered, then `node_connected`.
    async fn connect(&mut self, index: usize, resumable: bool) {
        let connection = self.next_connection;
        self.next_connection += 1;
        let (actions, mut queue) = mpsc::unbounded_channel();
        let record = Arc::clone(&self.nodes[index].record);
        let link = Arc::new(FakeLink {
            node: record.id().clone(),
            connection,
            actions,
            closing: AtomicBool::new(false),
            full: AtomicBool::new(false),
            sent: Arc::clone(&self.sent),
        });
        let registered = NewConnection {
            record: Arc::clone(&record),
            connection,
            peer: SocketAddr::from(([127, 0, 0, 1], 40_000)),
            node_version: "fuzz".to_owned(),
            link: Arc::clone(&link) as Arc<dyn NodeLink>,
            instance_id: String::new(),
            last_frame: Arc::new(LastFrame::new(std::time::Instant::now())),
            reserved_runs: 0,
            can_continue: true,
            operations: edge::domain::DeclaredOperations::default(),
            can_manage_models: false,
            inventory: None,
        };
        if self.registry.insert(registered).is_err() {
            // Its previous connection has not finished closing yet.
            return;
        }
        self.nodes[index].live = Some(link);
        let claims = if resumable {
            self.claims(record.id())
        } else {
            Vec::new()
        };
        self.service
            .resume_runs(record.id(), connection, &claims)
            .await;
        self.service.node_connected(record.id());
        let service = self.service.clone();
        let registry = self.registry.clone();
        self.connections.push(tokio::spawn(async move {
            let reason = loop {
                match queue.recv().await {
                    Some(Action::Event(event)) => {
                        let mut events = vec![event];
                        service
                            .run_events(record.id(), connection, &mut events)
                            .await;
                    }
                    Some(Action::Close(reason)) => break reason,
                    None => break CloseReason::Eof,
                }
            };
            assert!(
                registry.remove(record.id(), connection),
                "the registry lost a live connection"
            );
            service
                .node_disconnected(record.id(), connection, reason, resumable)
                .await;
        }));
    }

    fn start(&mut self, selector: u8, deadline: u8) {
        let deadline_byte = deadline;
        let adapter = ["echo", "llm", "none"][usize::from(selector % 3)];
        let target = ["t0", "t1", "tx"][usize::from(selector / 3 % 3)];
        let pin = [
            None,
            Some("node-0"),
            Some("a1"),
            Some("node-2"),
            Some("ghost"),
        ][usize::from(selector / 9 % 5)];
        let deadline = [None, None, Some(0), Some(5), Some(1_000), Some(60_000)]
            [usize::from(deadline % 6)]
        .map(Duration::from_millis);
        let spec = RunSpec {
            selector: NodeSelector {
                adapter: AdapterName::parse(adapter).expect("valid adapter"),
                target: Target::parse(target).expect("valid target"),
                pin: pin.map(str::to_owned),
            },
            input: Bytes::from_static(b"fuzz"),
            content_type: "text/plain; charset=utf-8".to_owned(),
            params: BTreeMap::new(),
            deadline,
            operation: edge::domain::Operation::Unspecified,
            routing: RunRouting {
                affinity: AffinityKey::from_client(
                    KeySource::Session,
                    ["", "s1", "s2"][usize::from(deadline_byte % 3)],
                ),
                tenant: TenantKey::parse(["k1", "k2"][usize::from(selector / 45 % 2)])
                    .expect("a valid tenant"),
                priority: [Priority::Interactive, Priority::Batch]
                    [usize::from(deadline_byte / 6 % 2)],
                limits: None,
                budget: None,
                client_stream: None,
            },
        };
        let Ok(handle) = self.service.start(spec) else {
            return;
        };
        let seen = Arc::new(Mutex::new(Vec::new()));
        let mut events = handle.events;
        let reader = {
            let seen = Arc::clone(&seen);
            tokio::spawn(async move {
                while let Some(event) = events.recv().await {
                    lock(&seen).push(event);
                }
            })
        };
        self.runs.push(Accepted {
            id: handle.run_id,
            seen,
            reader,
        });
    }

    /// Drains the service, closes every connection, and checks the invariants.
    async fn finish(mut self, grace: Duration) {
        self.service.drain(grace).await;
        assert_eq!(self.service.open_runs(), 0, "runs open after the drain");
        assert_eq!(self.service.queued_runs(), 0, "runs queued after the drain");
        for node in self.registry.snapshot() {
            assert_eq!(
                node.active_runs,
                0,
                "node {} counts active runs after every run ended",
                node.record.id()
            );
        }
        for node in &mut self.nodes {
            if let Some(link) = node.live.take() {
                link.close(CloseReason::Shutdown);
            }
        }
        for connection in self.connections.drain(..) {
            tokio::time::timeout(HANG, connection)
                .await
                .expect("a connection never finished")
                .expect("a connection task panicked");
        }
        assert!(self.registry.is_empty(), "nodes left in the registry");

        let published = lock(&self.sink.events).clone();
        for event in &published {
            assert!(
                self.runs.iter().any(|r| r.id == event.run_id),
                "an event for a run that was never accepted: {event:?}"
            );
        }
        for run in self.runs {
            tokio::time::timeout(HANG, run.reader)
                .await
                .unwrap_or_else(|_| panic!("the caller's stream of {} never ended", run.id))
                .expect("a reader task panicked");
            let events: Vec<&Arc<RunEvent>> =
                published.iter().filter(|e| e.run_id == run.id).collect();
            let terminals = events.iter().filter(|e| e.kind.is_terminal()).count();
            assert_eq!(
                terminals, 1,
                "run {} has {terminals} terminal events",
                run.id
            );
            assert!(
                events.last().is_some_and(|e| e.kind.is_terminal()),
                "run {} has events after its terminal event: {events:?}",
                run.id
            );
            let seen = lock(&run.seen);
            assert!(
                seen.iter().eq(events.iter().copied()),
                "the caller of {} saw {seen:?}, the sink {events:?}",
                run.id
            );
        }
    }
}

fn definition(
    id: &str,
    alias: &str,
    adapters: &[(&str, &[&str])],
    max_concurrent_runs: u32,
) -> NodeDefinition {
    NodeDefinition {
        id: id.to_owned(),
        alias: alias.to_owned(),
        token: Some(Token::new(format!("token-{id}"))),
        adapters: adapters
            .iter()
            .map(|(name, targets)| AdapterDefinition {
                name: (*name).to_owned(),
                targets: targets.iter().map(|t| (*t).to_owned()).collect(),
                settings: BTreeMap::new(),
            })
            .collect(),
        max_concurrent_runs,
        heartbeat_interval_ms: 1_000,
        ..NodeDefinition::default()
    }
}

fn event(run_id: &str, seq: u8, kind: u8) -> ReportedEvent {
    let classed = |class| RunEventKind::Failed {
        context_window: None,
        code: "classed".to_owned(),
        message: "the node failed".to_owned(),
        class,
        status: None,
        usage: None,
    };
    let kind = match kind % 9 {
        0 => RunEventKind::Started,
        1 | 2 => RunEventKind::text("out".to_owned()),
        3 => RunEventKind::Completed {
            finish_reason: "stop".to_owned(),
            usage: Some(Usage::new(1, 2)),
        },
        4 => RunEventKind::failed("boom".to_owned(), "the node failed".to_owned()),
        5 => classed(FailureClass::Node),
        6 => classed(FailureClass::Refused),
        7 => classed(FailureClass::Request),
        _ => RunEventKind::cancelled("node"),
    };
    ReportedEvent {
        run_id: run_id.to_owned(),
        seq: u64::from(seq),
        kind,
    }
}
