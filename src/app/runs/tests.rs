//! Tests of [`RunService`] through its public API and the [`NodeEventHandler`] calls the TCP
//! transport makes, with the real in-memory [`LockRegistry`] and mockall doubles for the
//! transport and the event sink.
//!
//! They check the guarantee the service exists for: every accepted run ends with exactly one
//! terminal event, in the sink and on the caller's stream, whichever path ends it. Timers run
//! on paused tokio time; nothing here sleeps for real or asserts how long anything took.

mod continuation;
mod resume;
mod routing;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use proptest::prelude::*;
use tokio::sync::mpsc::error::TryRecvError;
use tokio::time::sleep;

use super::{BreakerConfig, LimitsConfig, Routing, RoutingConfig, RunService, policy};
use crate::adapters::lock_registry::LockRegistry;
use crate::app::compose::settings::RunsConfig;
use crate::domain::routing::{Catalog, NodeStatus, Unroutable, WaitCause};
use crate::domain::{
    AdapterConfig, AdapterName, Alias, EventOrigin, FailureClass, NodeId, NodeRecord, NodeSelector,
    ResumeAnswer, ResumeClaim, RunEvent, RunEventKind, RunId, RunRouting, RunSpec, RuntimeConfig,
    Target, Token, Usage,
};
use crate::ports::event_sink::MockEventSink;
use crate::ports::registry::MockRegistry;
use crate::ports::transport::MockNodeTransport;
use crate::ports::{
    CloseReason, ConnectionId, LastFrame, LinkError, NewConnection, NodeCommand, NodeEventHandler,
    NodeLink, Registry, ReportedEvent, RunAssignment, TransportError,
};
use crate::ports::{RunHandle, Runs, StartError};

const ADAPTER: &str = "echo";
const TARGET: &str = "t";

fn node_id(id: &str) -> NodeId {
    NodeId::parse(id).unwrap()
}

/// A node serving `echo`/`t` that takes `max_concurrent_runs` runs at once.
fn record(id: &str, max_concurrent_runs: u32) -> Arc<NodeRecord> {
    Arc::new(NodeRecord::new(
        node_id(id),
        Alias::parse(&format!("{id}-alias")).unwrap(),
        Token::new(format!("tok-{id}")).digest(),
        vec![
            AdapterConfig::new(
                AdapterName::parse(ADAPTER).unwrap(),
                vec![Target::parse(TARGET).unwrap()],
                BTreeMap::new(),
            )
            .unwrap(),
        ],
        RuntimeConfig::new(max_concurrent_runs, 1_000, BTreeMap::new()).unwrap(),
    ))
}

fn spec() -> RunSpec {
    RunSpec {
        selector: NodeSelector {
            adapter: AdapterName::parse(ADAPTER).unwrap(),
            target: Target::parse(TARGET).unwrap(),
            pin: None,
        },
        input: Bytes::from_static(b"hello"),
        content_type: "text/plain; charset=utf-8".into(),
        params: BTreeMap::from([("temperature".to_owned(), "0".to_owned())]),
        deadline: None,
        operation: crate::domain::Operation::Unspecified,
        routing: RunRouting::default(),
    }
}

/// A run only node `node` may take.
fn pinned(node: &str) -> RunSpec {
    let mut spec = spec();
    spec.selector.pin = Some(node.to_owned());
    spec
}

fn with_deadline(deadline: Duration) -> RunSpec {
    RunSpec {
        deadline: Some(deadline),
        ..spec()
    }
}

fn config() -> RunsConfig {
    RunsConfig {
        queue_capacity: 8,
        queue_timeout_ms: 1_000,
        no_node_timeout_ms: 800,
        max_attempts: 3,
        cancel_grace_ms: 500,
        default_deadline_ms: 0,
        resume_grace_ms: 2_000,
        // Off here, so the failover tests see a lost attempt after output end the run;
        // `tests/continuation.rs` turns it on.
        max_continuations: 0,
        client_resume_grace_ms: 1_000,
    }
}

/// The nodes every test may connect: `a` to `e`, each serving `echo`/`t`.
const CONFIGURED: [&str; 5] = ["a", "b", "c", "d", "e"];

/// Routing over [`CONFIGURED`] with `config`'s waits and attempts and `routing`'s breakers.
fn routing(config: &RunsConfig, routing: &RoutingConfig) -> Routing {
    Routing {
        catalog: Catalog::new(CONFIGURED.map(|id| record(id, 1))),
        policy: policy(config, routing, &LimitsConfig::default()).unwrap(),
        key_limits: std::collections::HashMap::new(),
    }
}

fn output(text: &str) -> RunEventKind {
    RunEventKind::text(text)
}

fn completed() -> RunEventKind {
    RunEventKind::Completed {
        finish_reason: "stop".into(),
        usage: None,
    }
}

/// A node's `failed` of `class`.
fn classed(class: FailureClass) -> RunEventKind {
    RunEventKind::Failed {
        context_window: None,
        code: format!("{}_failure", class.as_str()),
        message: "the engine said no".into(),
        class,
        status: None,
        usage: None,
    }
}

fn cancelled(reason: &str) -> RunEventKind {
    RunEventKind::cancelled(reason)
}

/// `kind`, a terminal event, as the edge relays it after `output_tokens` text outputs: with
/// the output it counted as its usage (the node said nothing of its own).
fn counted(mut kind: RunEventKind, output_tokens: u32) -> RunEventKind {
    if let Some(usage) = kind.usage_mut() {
        *usage = Some(Usage::new(0, output_tokens));
    }
    kind
}

fn failure_code(event: &RunEvent) -> Option<&str> {
    match &event.kind {
        RunEventKind::Failed { code, .. } => Some(code),
        _ => None,
    }
}

/// The registry's way to reach a node. The tests watch the transport instead, which is what
/// the service sends through.
struct NullLink;

impl NodeLink for NullLink {
    fn send(&self, _command: NodeCommand) -> Result<(), LinkError> {
        Ok(())
    }

    fn supersede(&self) {}
}

type Log<T> = Arc<Mutex<Vec<T>>>;

fn record_events(log: &Log<Arc<RunEvent>>) -> impl FnMut(Arc<RunEvent>) + Send + 'static {
    let log = Arc::clone(log);
    move |event| log.lock().unwrap().push(event)
}

/// Where the mock transport records what it is sent: the commands, and (read from the
/// sink's log) the runs whose `Cancel` went out after their terminal event.
#[derive(Clone, Default)]
struct Recorder {
    commands: Log<(NodeId, NodeCommand)>,
    published: Log<Arc<RunEvent>>,
    cancelled_after_end: Log<RunId>,
}

fn record_commands(
    recorder: &Recorder,
) -> impl FnMut(&NodeId, NodeCommand) -> Result<(), TransportError> + Send + 'static {
    let recorder = recorder.clone();
    move |node: &NodeId, command: NodeCommand| {
        if let NodeCommand::Cancel { run_id, .. } = &command {
            let published = recorder.published.lock().unwrap();
            if published
                .iter()
                .any(|e| &e.run_id == run_id && e.kind.is_terminal())
            {
                recorder
                    .cancelled_after_end
                    .lock()
                    .unwrap()
                    .push(run_id.clone());
            }
        }
        recorder
            .commands
            .lock()
            .unwrap()
            .push((node.clone(), command));
        Ok(())
    }
}

fn is_run(_node: &NodeId, command: &NodeCommand) -> bool {
    matches!(command, NodeCommand::Run(_))
}

fn is_cancel(_node: &NodeId, command: &NodeCommand) -> bool {
    matches!(command, NodeCommand::Cancel { .. })
}

/// Everything on a caller's stream so far, and whether the stream has ended.
fn received(handle: &mut RunHandle) -> (Vec<Arc<RunEvent>>, bool) {
    let mut events = Vec::new();
    loop {
        match handle.events.try_recv() {
            Ok(event) => events.push(event),
            Err(TryRecvError::Empty) => return (events, false),
            Err(TryRecvError::Disconnected) => return (events, true),
        }
    }
}

/// What a test expects of the doubles beyond what it asserts itself. Mockall checks the
/// counts when the harness is dropped; calls beyond them fall through to the recorder and
/// show up in the test's own assertions.
#[derive(Default)]
struct Expect {
    /// Terminal events the sink receives in all.
    terminals: Option<usize>,
    /// `Run` commands the transport receives in all.
    runs_sent: Option<usize>,
    /// `Cancel` commands the transport receives in all.
    cancels_sent: Option<usize>,
    /// Every `Run` is refused, as by a node whose connection is closing.
    refuse_runs: bool,
}

impl Expect {
    /// Expects the sink to receive `terminals` terminal events in all.
    fn terminals(terminals: usize) -> Self {
        Self {
            terminals: Some(terminals),
            ..Self::default()
        }
    }

    /// Also expects the transport to receive `runs` `Run` commands in all.
    fn runs_sent(self, runs: usize) -> Self {
        Self {
            runs_sent: Some(runs),
            ..self
        }
    }

    /// Also expects the transport to receive `cancels` `Cancel` commands in all.
    fn cancels_sent(self, cancels: usize) -> Self {
        Self {
            cancels_sent: Some(cancels),
            ..self
        }
    }

    /// Also has the transport refuse every `Run`.
    fn refusing_runs(self) -> Self {
        Self {
            refuse_runs: true,
            ..self
        }
    }
}

/// Has `transport` take exactly `times` commands that `matches`, if given, logging them.
fn expect_sends(
    transport: &mut MockNodeTransport,
    matches: fn(&NodeId, &NodeCommand) -> bool,
    times: Option<usize>,
    log: &Recorder,
) {
    if let Some(times) = times {
        transport
            .expect_send()
            .withf(matches)
            .times(times)
            .returning(record_commands(log));
    }
}

/// A run service over the given doubles routing as `routing` says, with a test meter.
fn service_over(
    registry: Arc<dyn Registry>,
    transport: MockNodeTransport,
    sink: MockEventSink,
    config: RunsConfig,
    routing: &RoutingConfig,
) -> RunService {
    let routing = self::routing(&config, routing);
    RunService::new(
        registry,
        Arc::new(transport),
        Arc::new(sink),
        config,
        routing,
        &opentelemetry::global::meter("edge-test"),
    )
}

/// Checks that the sink's `events` for `run` hold exactly one terminal event, as the last.
fn assert_one_terminal_last(run: &RunId, events: &[Arc<RunEvent>]) {
    let terminals = events.iter().filter(|e| e.kind.is_terminal()).count();
    assert_eq!(terminals, 1, "terminal events of {run}: {events:#?}");
    assert!(
        events.last().unwrap().kind.is_terminal(),
        "events after the terminal of {run}: {events:#?}"
    );
}

/// A run service over a real registry, a recording mock transport and a recording mock
/// sink, driven the way the TCP transport drives it.
struct Harness {
    service: RunService,
    registry: LockRegistry,
    published: Log<Arc<RunEvent>>,
    commands: Log<(NodeId, NodeCommand)>,
    /// The runs whose `Cancel` went out after their terminal event.
    cancelled_after_end: Log<RunId>,
    /// Each connected node's live connection.
    connections: HashMap<String, ConnectionId>,
    /// The nodes whose live connection registered with an instance id (may resume).
    resumable: HashSet<String>,
    last_connection: ConnectionId,
}

impl Harness {
    /// A harness with the usual [`config()`].
    fn expecting(expect: Expect) -> Self {
        Self::new(config(), expect)
    }

    fn new(config: RunsConfig, expect: Expect) -> Self {
        Self::routed(config, &RoutingConfig::default(), expect)
    }

    /// A harness whose service routes as `routing` says (breakers, affinity).
    fn routed(config: RunsConfig, routing: &RoutingConfig, expect: Expect) -> Self {
        let recorder = Recorder::default();
        let published = Arc::clone(&recorder.published);

        let mut sink = MockEventSink::new();
        if let Some(terminals) = expect.terminals {
            sink.expect_publish()
                .withf(|event| event.kind.is_terminal())
                .times(terminals)
                .returning(record_events(&published));
        }
        sink.expect_publish().returning(record_events(&published));
        sink.expect_flush().return_const(());

        let mut transport = MockNodeTransport::new();
        if expect.refuse_runs {
            transport.expect_send().withf(is_run).returning(|node, _| {
                Err(TransportError::Link {
                    node: node.clone(),
                    error: LinkError::Closed,
                })
            });
        }
        expect_sends(&mut transport, is_run, expect.runs_sent, &recorder);
        expect_sends(&mut transport, is_cancel, expect.cancels_sent, &recorder);
        transport
            .expect_send()
            .returning(record_commands(&recorder));

        let registry = LockRegistry::new();
        let service = service_over(Arc::new(registry.clone()), transport, sink, config, routing);
        Self {
            service,
            registry,
            published,
            commands: recorder.commands,
            cancelled_after_end: recorder.cancelled_after_end,
            connections: HashMap::new(),
            resumable: HashSet::new(),
            last_connection: 0,
        }
    }

    /// Registers a v1 node (no instance id, no claims) on a new connection and tells the
    /// service, as the transport does once the node is accepted.
    async fn connect(&mut self, id: &str, max_concurrent_runs: u32) -> ConnectionId {
        let (connection, answers) = self.register(id, max_concurrent_runs, None).await;
        assert!(answers.is_empty());
        connection
    }

    /// Registers node `id` with an instance id and resume `claims` on a new connection,
    /// taking over its live connection if it has one (which is left to close later, with
    /// [`Harness::close`]); returns the connection and the service's answers.
    async fn resume(
        &mut self,
        id: &str,
        max_concurrent_runs: u32,
        claims: &[ResumeClaim],
    ) -> (ConnectionId, Vec<ResumeAnswer>) {
        self.register(id, max_concurrent_runs, Some(claims)).await
    }

    /// What the transport does for an accepted registration: into the registry (replacing
    /// a live connection), the claims answered, then `node_connected`.
    async fn register(
        &mut self,
        id: &str,
        max_concurrent_runs: u32,
        claims: Option<&[ResumeClaim]>,
    ) -> (ConnectionId, Vec<ResumeAnswer>) {
        self.last_connection += 1;
        let connection = self.last_connection;
        let registered = NewConnection {
            record: record(id, max_concurrent_runs),
            connection,
            peer: SocketAddr::from(([127, 0, 0, 1], 9_000)),
            node_version: "test".into(),
            link: Arc::new(NullLink),
            instance_id: if claims.is_some() { "i-1" } else { "" }.into(),
            last_frame: Arc::new(LastFrame::new(std::time::Instant::now())),
            reserved_runs: 0,
            can_continue: true,
            operations: crate::domain::DeclaredOperations::default(),
            can_manage_models: false,
            inventory: None,
        };
        match self.connections.get(id) {
            Some(old) => drop(self.registry.replace(registered, *old).unwrap()),
            None => self.registry.insert(registered).unwrap(),
        }
        self.connections.insert(id.to_owned(), connection);
        if claims.is_some() {
            self.resumable.insert(id.to_owned());
        } else {
            self.resumable.remove(id);
        }
        let node = node_id(id);
        let answers = self
            .service
            .resume_runs(&node, connection, claims.unwrap_or_default())
            .await;
        self.service.node_connected(&node);
        (connection, answers)
    }

    /// Ends a node's live connection as the transport does: out of the registry, then the
    /// service hears of it.
    async fn disconnect(&mut self, id: &str) {
        let connection = self.connections.remove(id).unwrap();
        assert!(self.registry.remove(&node_id(id), connection));
        let resumable = self.resumable.remove(id);
        self.close(id, connection, resumable).await;
    }

    /// The service hears that node `id`'s `connection` closed (already out of the
    /// registry, or replaced in it by a takeover).
    async fn close(&self, id: &str, connection: ConnectionId, resumable: bool) {
        self.service
            .node_disconnected(&node_id(id), connection, CloseReason::Eof, resumable)
            .await;
    }

    /// Starts a run of `spec`, which the service must accept.
    fn start(&self, spec: RunSpec) -> RunHandle {
        self.service.start(spec).unwrap()
    }

    /// Starts `N` runs of [`spec()`] in order, which the service must all accept.
    fn start_runs<const N: usize>(&self) -> [RunHandle; N] {
        std::array::from_fn(|_| self.start(spec()))
    }

    /// Drains the service with `grace` in a task of its own, as the shutdown path does.
    fn spawn_drain(&self, grace: Duration) -> tokio::task::JoinHandle<()> {
        let service = self.service.clone();
        tokio::spawn(async move { service.drain(grace).await })
    }

    /// A run event as node `node` reports it on `connection`.
    async fn report(
        &self,
        node: &str,
        connection: ConnectionId,
        run: &RunId,
        seq: u64,
        kind: RunEventKind,
    ) {
        let event = ReportedEvent {
            run_id: run.as_str().to_owned(),
            seq,
            kind,
        };
        self.service
            .run_events(&node_id(node), connection, &mut vec![event])
            .await;
    }

    /// Node `node` reports `kinds` for `run` on `connection`, numbered from `first`, in one
    /// batch (as the connection hands over events of one run read together).
    async fn report_batch(
        &self,
        node: &str,
        connection: ConnectionId,
        run: &RunId,
        first: u64,
        kinds: impl IntoIterator<Item = RunEventKind>,
    ) {
        let mut events: Vec<ReportedEvent> = (first..)
            .zip(kinds)
            .map(|(seq, kind)| ReportedEvent {
                run_id: run.as_str().to_owned(),
                seq,
                kind,
            })
            .collect();
        self.service
            .run_events(&node_id(node), connection, &mut events)
            .await;
        assert!(events.is_empty(), "the service takes every event");
    }

    /// Node `node` reports `kinds` for `run` on `connection`, numbered from 1.
    async fn report_each(
        &self,
        node: &str,
        connection: ConnectionId,
        run: &RunId,
        kinds: impl IntoIterator<Item = RunEventKind>,
    ) {
        for (seq, kind) in (1..).zip(kinds) {
            self.report(node, connection, run, seq, kind).await;
        }
    }

    /// Node `node` completes the run with its first event; asserts it ended once; returns it.
    async fn complete(
        &self,
        node: &str,
        connection: ConnectionId,
        handle: &mut RunHandle,
    ) -> Arc<RunEvent> {
        self.report(node, connection, &handle.run_id, 1, completed())
            .await;
        self.assert_ended_once(handle)
    }

    fn active_runs(&self, node: &str) -> u32 {
        self.registry.get(node).unwrap().active_runs
    }

    /// The events the sink received for `run`, in order.
    fn published(&self, run: &RunId) -> Vec<Arc<RunEvent>> {
        let published = self.published.lock().unwrap();
        published
            .iter()
            .filter(|event| &event.run_id == run)
            .cloned()
            .collect()
    }

    /// The commands sent that `pick` takes, with their nodes, in order.
    fn commands_picked<T>(&self, pick: impl Fn(&NodeCommand) -> Option<T>) -> Vec<(NodeId, T)> {
        let commands = self.commands.lock().unwrap();
        commands
            .iter()
            .filter_map(|(node, command)| Some((node.clone(), pick(command)?)))
            .collect()
    }

    /// The `Run` commands sent for `run`, with their nodes.
    fn assignments(&self, run: &RunId) -> Vec<(NodeId, RunAssignment)> {
        self.commands_picked(|command| match command {
            NodeCommand::Run(assignment) if &assignment.run_id == run => Some(assignment.clone()),
            _ => None,
        })
    }

    /// The nodes `run` was sent to.
    fn sent_to(&self, run: &RunId) -> Vec<NodeId> {
        self.assignments(run)
            .into_iter()
            .map(|(node, _)| node)
            .collect()
    }

    /// The `Cancel` commands sent for `run`: the node and the reason.
    fn cancels(&self, run: &RunId) -> Vec<(NodeId, String)> {
        self.commands_picked(|command| match command {
            NodeCommand::Cancel { run_id, reason } if run_id == run => Some(reason.clone()),
            _ => None,
        })
    }

    /// Whether `run`'s `Cancel` went out only once its terminal event had been relayed.
    fn cancelled_after_end(&self, run: &RunId) -> bool {
        self.cancelled_after_end.lock().unwrap().contains(run)
    }

    fn dropped_after_terminal(&self) -> u64 {
        self.service.stats().dropped_after_terminal()
    }

    fn dropped_unknown_run(&self) -> u64 {
        self.service.stats().dropped_unknown_run()
    }

    /// Checks the guarantee for one run: the sink received exactly one terminal event for
    /// it, as its last event; the caller's stream carried the same events in the same order
    /// and then ended. Returns the terminal event.
    fn assert_ended_once(&self, handle: &mut RunHandle) -> Arc<RunEvent> {
        let run = handle.run_id.clone();
        let published = self.published(&run);
        assert_one_terminal_last(&run, &published);
        let last = Arc::clone(published.last().unwrap());
        let (streamed, ended) = received(handle);
        assert_eq!(streamed, published, "the caller's stream of {run}");
        assert!(ended, "the caller's stream of {run} did not end");
        last
    }

    /// Checks that the run ended once, with a `Failed` event of `code`, and returns it.
    fn assert_failed(&self, handle: &mut RunHandle, code: &str) -> Arc<RunEvent> {
        let terminal = self.assert_ended_once(handle);
        assert_eq!(failure_code(&terminal), Some(code));
        terminal
    }

    /// Like [`Self::assert_failed`], and checks that the edge itself made the event.
    fn assert_edge_failed(&self, handle: &mut RunHandle, code: &str) -> Arc<RunEvent> {
        let terminal = self.assert_failed(handle, code);
        assert_eq!(terminal.origin, EventOrigin::Edge);
        terminal
    }

    /// Ends the test: no run may be left open, and the service drains cleanly. Dropping the
    /// harness then drops the mocks, which checks their expected call counts.
    async fn finish(self) {
        assert_eq!(self.service.open_runs(), 0, "runs left open");
        assert_eq!(self.service.queued_runs(), 0, "runs left queued");
        self.service.drain(Duration::ZERO).await;
        let published = self.published.lock().unwrap().clone();
        let mut by_run: HashMap<RunId, Vec<Arc<RunEvent>>> = HashMap::new();
        for event in published {
            by_run.entry(event.run_id.clone()).or_default().push(event);
        }
        for (run, events) in by_run {
            assert_one_terminal_last(&run, &events);
        }
    }
}

#[tokio::test(start_paused = true)]
async fn a_run_the_node_completes_ends_with_its_completed_event() {
    let mut h = Harness::expecting(Expect::terminals(1).runs_sent(1).cancels_sent(0));
    let a = h.connect("a", 2).await;
    let mut handle = h.start(spec());
    let run = handle.run_id.clone();

    let [(node, assignment)] = h.assignments(&run).try_into().unwrap();
    assert_eq!(node, node_id("a"));
    let RunSpec {
        selector,
        input,
        content_type,
        params,
        ..
    } = spec();
    assert_eq!(
        assignment,
        RunAssignment {
            run_id: run.clone(),
            adapter: selector.adapter,
            target: selector.target,
            input,
            content_type,
            params,
            deadline_ms: 0,
            operation: crate::domain::Operation::Unspecified,
            continuation: None,
            lora: None,
        }
    );
    assert_eq!(h.active_runs("a"), 1);
    assert_eq!(h.service.open_runs(), 1);

    h.report_each("a", a, &run, [RunEventKind::Started, output("hi")])
        .await;
    assert!(!handle.events.is_closed());
    h.report("a", a, &run, 3, completed()).await;

    let terminal = h.assert_ended_once(&mut handle);
    assert_eq!(terminal.kind, completed());
    let published = h.published(&run);
    let kinds: Vec<_> = published.iter().map(|e| e.kind.clone()).collect();
    assert_eq!(kinds, [RunEventKind::Started, output("hi"), completed()]);
    for (event, seq) in published.iter().zip(1..) {
        assert_eq!(event.seq, seq);
        assert_eq!(event.origin, EventOrigin::Node);
        assert_eq!(event.node, Some(node_id("a")));
        assert_eq!(event.adapter.as_str(), ADAPTER);
        assert_eq!(event.target.as_str(), TARGET);
    }
    assert_eq!(h.active_runs("a"), 0);
    assert_eq!(h.service.open_runs(), 0);
    h.finish().await;
}

#[tokio::test(start_paused = true)]
async fn a_run_the_node_fails_ends_with_its_failed_event() {
    let mut h = Harness::expecting(Expect::terminals(1));
    let a = h.connect("a", 1).await;
    let mut handle = h.start(spec());
    let failed = RunEventKind::failed("adapter_error", "out of memory");
    h.report_each(
        "a",
        a,
        &handle.run_id,
        [RunEventKind::Started, failed.clone()],
    )
    .await;

    let terminal = h.assert_ended_once(&mut handle);
    assert_eq!(terminal.kind, failed);
    assert_eq!(terminal.origin, EventOrigin::Node);
    assert_eq!(h.active_runs("a"), 0);
    h.finish().await;
}

#[tokio::test(start_paused = true)]
async fn a_node_disconnecting_fails_runs_with_output_and_fails_over_the_rest() {
    let mut h = Harness::expecting(Expect::terminals(3));
    h.connect("a", 2).await;
    let a = h.connections["a"];
    let [mut first, mut second] = h.start_runs();
    h.report_each(
        "a",
        a,
        &first.run_id,
        [RunEventKind::Started, output("partial")],
    )
    .await;
    h.report("a", a, &second.run_id, 1, RunEventKind::Started)
        .await;

    h.disconnect("a").await;

    // Output reached the caller: no second attempt.
    let terminal = h.assert_edge_failed(&mut first, "node_disconnected");
    assert_eq!(terminal.node, Some(node_id("a")));
    // The edge's event continues the node's numbering.
    assert_eq!(terminal.seq, 3);
    // Nothing but `started` reached the caller: the run waits for another node.
    assert_eq!(h.service.open_runs(), 1);
    assert_eq!(h.service.queued_runs(), 1);
    let b = h.connect("b", 1).await;
    assert_eq!(h.sent_to(&second.run_id), [node_id("a"), node_id("b")]);
    h.report_each(
        "b",
        b,
        &second.run_id,
        [RunEventKind::Started, output("whole"), completed()],
    )
    .await;
    let terminal = h.assert_ended_once(&mut second);
    assert_eq!(terminal.kind, completed());
    let published = h.published(&second.run_id);
    let attempts: Vec<_> = published
        .iter()
        .map(|e| (e.seq, e.node.clone(), e.route.as_ref().map(|r| r.attempt)))
        .collect();
    assert_eq!(
        attempts,
        [
            (1, Some(node_id("a")), Some(1)),
            (2, Some(node_id("b")), Some(2)),
            (3, Some(node_id("b")), None),
            (4, Some(node_id("b")), None),
        ]
    );

    // The node comes back on a new connection with a fresh count and takes new runs.
    h.disconnect("b").await;
    let a = h.connect("a", 2).await;
    assert_eq!(h.active_runs("a"), 0);
    let mut third = h.start(spec());
    assert_eq!(h.sent_to(&third.run_id), [node_id("a")]);
    h.complete("a", a, &mut third).await;
    assert_eq!(h.active_runs("a"), 0);
    h.finish().await;
}

#[tokio::test(start_paused = true)]
async fn the_deadline_fails_the_run_and_cancels_it_on_the_node() {
    let mut h = Harness::expecting(Expect::terminals(1).runs_sent(1).cancels_sent(1));
    let a = h.connect("a", 1).await;
    let mut handle = h.start(with_deadline(Duration::from_secs(2)));
    let run = handle.run_id.clone();
    assert_eq!(h.assignments(&run)[0].1.deadline_ms, 2_000);
    h.report("a", a, &run, 1, RunEventKind::Started).await;

    sleep(Duration::from_millis(1_990)).await;
    assert_eq!(h.service.open_runs(), 1);
    assert!(h.cancels(&run).is_empty());
    assert!(!handle.events.is_closed());

    sleep(Duration::from_millis(20)).await;
    assert_eq!(
        h.cancels(&run),
        [(node_id("a"), "deadline exceeded".to_owned())]
    );
    let terminal = h.assert_edge_failed(&mut handle, "deadline_exceeded");
    assert_eq!(terminal.seq, 2);
    assert_eq!(h.active_runs("a"), 0);
    // The run ended before the cancel went out, so however quickly the node answers it,
    // its answer arrives after the edge ended the run.
    assert!(h.cancelled_after_end(&run));
    h.report("a", a, &run, 2, cancelled("deadline exceeded"))
        .await;
    assert_eq!(h.published(&run).len(), 2);
    assert_eq!(h.dropped_after_terminal(), 1);
    assert_eq!(h.dropped_unknown_run(), 0);
    h.finish().await;
}

#[tokio::test(start_paused = true)]
async fn one_task_keeps_every_deadline_and_a_sooner_one_still_ends_its_run_on_time() {
    let mut h = Harness::expecting(Expect::terminals(3).runs_sent(3).cancels_sent(1));
    let a = h.connect("a", 3).await;
    let mut long = h.start(with_deadline(Duration::from_secs(60)));
    let tasks = h.service.timers().len();
    let mut finished = h.start(with_deadline(Duration::from_secs(30)));
    // Sooner than the one the task sleeps until: it is woken for it.
    let mut short = h.start(with_deadline(Duration::from_secs(1)));
    assert_eq!(h.service.timers().len(), tasks, "a task per run");
    assert_eq!(h.service.timers().deadlines().len(), 3);

    h.complete("a", a, &mut finished).await;
    assert_eq!(h.service.timers().deadlines().len(), 2);
    sleep(Duration::from_millis(990)).await;
    assert!(h.cancels(&short.run_id).is_empty());
    sleep(Duration::from_millis(20)).await;
    h.assert_edge_failed(&mut short, "deadline_exceeded");
    assert_eq!(h.service.timers().deadlines().len(), 1);

    h.complete("a", a, &mut long).await;
    assert_eq!(h.service.timers().deadlines().len(), 0);
    h.finish().await;
}

#[tokio::test(start_paused = true)]
async fn a_deadline_too_far_away_to_name_never_passes() {
    let mut h = Harness::expecting(Expect::terminals(1).runs_sent(1));
    let a = h.connect("a", 1).await;
    let mut handle = h.start(with_deadline(Duration::MAX));
    assert_eq!(h.service.timers().deadlines().len(), 0);
    sleep(Duration::from_secs(3_600)).await;
    assert_eq!(h.service.open_runs(), 1);
    h.complete("a", a, &mut handle).await;
    h.finish().await;
}

#[tokio::test(start_paused = true)]
async fn runs_without_a_deadline_get_the_configured_default() {
    let mut h = Harness::new(
        RunsConfig {
            default_deadline_ms: 1_500,
            ..config()
        },
        Expect::terminals(1),
    );
    h.connect("a", 1).await;
    let mut handle = h.start(spec());
    assert_eq!(h.assignments(&handle.run_id)[0].1.deadline_ms, 1_500);
    sleep(Duration::from_millis(1_510)).await;
    h.assert_failed(&mut handle, "deadline_exceeded");
    h.finish().await;
}

#[tokio::test(start_paused = true)]
async fn cancelling_a_queued_run_ends_it_at_once_and_never_sends_it() {
    let mut h = Harness::expecting(Expect::terminals(2).runs_sent(1));
    let a = h.connect("a", 1).await;
    let [mut busy, mut queued] = h.start_runs();
    assert_eq!(h.service.queued_runs(), 1);
    assert!(h.sent_to(&queued.run_id).is_empty());

    assert!(h.service.cancel(&queued.run_id, "caller gave up").await);

    let terminal = h.assert_ended_once(&mut queued);
    assert_eq!(terminal.kind, cancelled("caller gave up"));
    assert_eq!(terminal.origin, EventOrigin::Edge);
    assert_eq!(terminal.node, None);
    assert_eq!(h.service.queued_runs(), 0);
    assert!(h.cancels(&queued.run_id).is_empty());
    // Cancelling it again finds nothing.
    assert!(!h.service.cancel(&queued.run_id, "again").await);

    // The slot that frees later goes to nobody: the cancelled run is never sent.
    h.complete("a", a, &mut busy).await;
    assert!(h.sent_to(&queued.run_id).is_empty());
    assert_eq!(h.active_runs("a"), 0);
    h.finish().await;
}

/// A harness expecting one terminal event and one cancel, with a run on node `a` that has
/// streamed some output.
async fn cancelled_once_after_output() -> (Harness, ConnectionId, RunHandle) {
    let mut h = Harness::expecting(Expect::terminals(1).cancels_sent(1));
    let a = h.connect("a", 1).await;
    let handle = h.start(spec());
    let run = handle.run_id.clone();
    h.report_each("a", a, &run, [RunEventKind::Started, output("so far")])
        .await;
    (h, a, handle)
}

#[tokio::test(start_paused = true)]
async fn a_run_whose_reader_went_is_cancelled_only_when_none_came_back_within_the_grace() {
    let (h, a, mut handle) = cancelled_once_after_output().await;
    let run = handle.run_id.clone();

    // The caller goes (grace 1 s); a resumed reader comes within it.
    Runs::reader_gone(&h.service, &run, "client disconnected").await;
    sleep(Duration::from_millis(900)).await;
    assert!(Runs::reader_back(&h.service, &run));
    sleep(Duration::from_millis(500)).await;
    assert!(h.cancels(&run).is_empty(), "a reader came back in time");

    // That reader goes too: the grace starts again from then.
    Runs::reader_gone(&h.service, &run, "client disconnected").await;
    sleep(Duration::from_millis(990)).await;
    assert!(h.cancels(&run).is_empty());
    sleep(Duration::from_millis(20)).await;
    let reason = "client disconnected".to_owned();
    assert_eq!(h.cancels(&run), [(node_id("a"), reason)]);
    h.report("a", a, &run, 3, cancelled("client disconnected"))
        .await;
    h.assert_ended_once(&mut handle);
    assert!(
        !Runs::reader_back(&h.service, &run),
        "an ended run has no reader to take"
    );
    h.finish().await;
}

#[tokio::test(start_paused = true)]
async fn a_cancelled_run_ends_with_the_nodes_own_cancelled_event() {
    let (h, a, mut handle) = cancelled_once_after_output().await;
    let run = handle.run_id.clone();

    assert!(h.service.cancel(&run, "caller").await);
    assert_eq!(h.cancels(&run), [(node_id("a"), "caller".to_owned())]);
    assert_eq!(h.service.open_runs(), 1);

    h.report("a", a, &run, 3, cancelled("caller")).await;
    let terminal = h.assert_ended_once(&mut handle);
    assert_eq!(terminal.origin, EventOrigin::Node);
    assert_eq!(terminal.kind, counted(cancelled("caller"), 1));
    assert_eq!(h.active_runs("a"), 0);

    // The grace period passes without a second terminal event.
    sleep(Duration::from_secs(1)).await;
    assert_eq!(h.published(&run).len(), 3);
    assert_eq!(h.dropped_after_terminal(), 0);
    h.finish().await;
}

#[tokio::test(start_paused = true)]
async fn a_cancelled_run_the_node_ignores_ends_after_the_grace_period() {
    let mut h = Harness::expecting(Expect::terminals(1).cancels_sent(1));
    let a = h.connect("a", 1).await;
    let mut handle = h.start(spec());
    let run = handle.run_id.clone();
    h.report("a", a, &run, 1, RunEventKind::Started).await;

    assert!(h.service.cancel(&run, "caller").await);
    sleep(Duration::from_millis(490)).await;
    h.report("a", a, &run, 2, output("still going")).await;
    assert_eq!(h.service.open_runs(), 1);
    assert!(!handle.events.is_closed());

    sleep(Duration::from_millis(20)).await;
    let terminal = h.assert_ended_once(&mut handle);
    assert_eq!(terminal.kind, counted(cancelled("caller"), 1));
    assert_eq!(terminal.origin, EventOrigin::Edge);
    assert_eq!(terminal.seq, 3);
    assert_eq!(h.active_runs("a"), 0);

    h.report("a", a, &run, 3, output("too late")).await;
    assert_eq!(h.published(&run).len(), 3);
    assert_eq!(h.dropped_after_terminal(), 1);
    h.finish().await;
}

#[tokio::test(start_paused = true)]
async fn drain_ends_open_runs_after_the_grace_and_refuses_new_ones() {
    let mut h = Harness::new(
        // The queued run outlives the grace period.
        RunsConfig {
            queue_timeout_ms: 60_000,
            ..config()
        },
        Expect::terminals(2).runs_sent(1).cancels_sent(1),
    );
    let a = h.connect("a", 1).await;
    let [mut dispatched, mut queued] = h.start_runs();
    h.report("a", a, &dispatched.run_id, 1, RunEventKind::Started)
        .await;

    let drain = h.spawn_drain(Duration::from_secs(3));
    sleep(Duration::from_millis(10)).await;
    assert_eq!(
        h.service.start(spec()).unwrap_err(),
        StartError::ShuttingDown
    );

    sleep(Duration::from_millis(2_900)).await;
    assert!(!drain.is_finished());
    assert_eq!(h.service.open_runs(), 2);
    assert!(!dispatched.events.is_closed());

    sleep(Duration::from_millis(200)).await;
    assert!(drain.is_finished());
    drain.await.unwrap();
    for handle in [&mut dispatched, &mut queued] {
        h.assert_edge_failed(handle, "edge_shutdown");
    }
    assert_eq!(
        h.cancels(&dispatched.run_id),
        [(node_id("a"), "edge shutting down".to_owned())]
    );
    // The run ended before the cancel went out: a node that answers the cancel at once
    // cannot make its `cancelled` the run's end (the shutdown's 503 would become a 502).
    assert!(h.cancelled_after_end(&dispatched.run_id));
    assert!(h.sent_to(&queued.run_id).is_empty());
    assert_eq!(h.active_runs("a"), 0);
    assert_eq!(
        h.service.start(spec()).unwrap_err(),
        StartError::ShuttingDown
    );
    h.finish().await;
}

#[tokio::test(start_paused = true)]
async fn drain_returns_as_soon_as_the_open_runs_end() {
    let mut h = Harness::expecting(Expect::terminals(1).cancels_sent(0));
    let a = h.connect("a", 1).await;
    let mut handle = h.start(spec());
    let drain = h.spawn_drain(Duration::from_secs(60));
    sleep(Duration::from_secs(1)).await;
    assert!(!drain.is_finished());

    h.report("a", a, &handle.run_id, 1, completed()).await;
    tokio::time::timeout(Duration::from_secs(1), drain)
        .await
        .expect("drain waited although no run was open")
        .unwrap();
    assert_eq!(h.assert_ended_once(&mut handle).kind, completed());
    h.finish().await;
}

#[tokio::test(start_paused = true)]
async fn a_run_that_waits_too_long_in_the_queue_fails() {
    let mut h = Harness::expecting(Expect::terminals(2).runs_sent(1));
    let a = h.connect("a", 1).await;
    let [mut busy, mut queued] = h.start_runs();

    sleep(Duration::from_millis(990)).await;
    assert_eq!(h.service.queued_runs(), 1);
    assert!(!queued.events.is_closed());

    sleep(Duration::from_millis(20)).await;
    let terminal = h.assert_edge_failed(&mut queued, "queue_timeout");
    assert_eq!(terminal.node, None);
    assert_eq!(h.service.queued_runs(), 0);
    assert_eq!(h.service.open_runs(), 1);

    h.complete("a", a, &mut busy).await;
    assert!(h.sent_to(&queued.run_id).is_empty());
    assert_eq!(h.active_runs("a"), 0);
    h.finish().await;
}

#[tokio::test(start_paused = true)]
async fn events_after_the_terminal_are_dropped_and_counted() {
    let mut h = Harness::expecting(Expect::terminals(1));
    let a = h.connect("a", 1).await;
    let mut handle = h.start(spec());
    let run = handle.run_id.clone();
    // The node ends the run with its second event, then sends two more.
    let kinds = [
        RunEventKind::Started,
        completed(),
        output("late"),
        completed(),
    ];
    h.report_each("a", a, &run, kinds).await;

    h.assert_ended_once(&mut handle);
    assert_eq!(h.published(&run).len(), 2);
    assert_eq!(h.dropped_after_terminal(), 2);
    assert_eq!(h.dropped_unknown_run(), 0);
    assert_eq!(h.active_runs("a"), 0);
    h.finish().await;
}

#[tokio::test(start_paused = true)]
async fn a_deadline_racing_the_nodes_terminal_adds_no_second_terminal_event() {
    let mut h = Harness::expecting(Expect::terminals(1));
    let a = h.connect("a", 1).await;
    let mut handle = h.start(with_deadline(Duration::from_secs(1)));
    let run = handle.run_id.clone();
    // The caller reads nothing until its buffer is full...
    let buffered = u64::try_from(handle.events.max_capacity()).unwrap();
    for seq in 1..=buffered {
        h.report("a", a, &run, seq, output("x")).await;
    }
    // ...so the node's terminal event waits for room while the deadline passes.
    let service = h.service.clone();
    let event = ReportedEvent {
        run_id: run.as_str().to_owned(),
        seq: buffered + 1,
        kind: completed(),
    };
    let completing = tokio::spawn(async move {
        let mut events = vec![event];
        service.run_events(&node_id("a"), a, &mut events).await;
    });
    sleep(Duration::from_millis(1_100)).await;
    assert!(!completing.is_finished());

    let mut streamed = Vec::new();
    while let Some(event) = handle.events.recv().await {
        streamed.push(event);
    }
    completing.await.unwrap();
    sleep(Duration::from_millis(1)).await;

    // The stream ended (recv gave `None`) after the one terminal event, as in the sink.
    let published = h.published(&run);
    assert!(
        streamed == published,
        "the caller's stream differs from the sink"
    );
    assert_one_terminal_last(&run, &published);
    assert_eq!(published.last().unwrap().kind, completed());
    assert_eq!(h.dropped_after_terminal(), 1);
    assert_eq!(h.service.open_runs(), 0);
    assert_eq!(h.active_runs("a"), 0);
    h.finish().await;
}

#[tokio::test(start_paused = true)]
async fn events_for_runs_a_connection_does_not_hold_are_dropped_and_counted() {
    let mut h = Harness::expecting(Expect::terminals(1));
    let a = h.connect("a", 1).await;
    let mut handle = h.start(spec());
    let run = handle.run_id.clone();
    let b = h.connect("b", 1).await;

    h.report("a", a, &RunId::new("no-such-run"), 1, completed())
        .await;
    // The run is real, but node b does not hold it.
    h.report("b", b, &run, 1, completed()).await;
    // Node a holds it, but on this connection, not another.
    h.report("a", a + 100, &run, 1, completed()).await;

    assert_eq!(h.dropped_unknown_run(), 3);
    assert_eq!(h.dropped_after_terminal(), 0);
    assert!(h.published(&run).is_empty());
    assert_eq!(h.service.open_runs(), 1);
    assert_eq!(h.active_runs("a"), 1);
    assert_eq!(h.active_runs("b"), 0);

    let terminal = h.complete("a", a, &mut handle).await;
    assert_eq!(terminal.origin, EventOrigin::Node);
    assert_eq!(h.active_runs("a"), 0);
    h.finish().await;
}

#[tokio::test(start_paused = true)]
async fn a_batch_of_a_runs_events_is_relayed_in_order_and_nothing_after_its_terminal() {
    let mut h = Harness::expecting(Expect::terminals(1));
    let a = h.connect("a", 1).await;
    let b = h.connect("b", 1).await;
    let mut handle = h.start(pinned("a"));
    let run = handle.run_id.clone();
    let kinds = [RunEventKind::Started, output("x"), completed()];
    // A batch for a run the connection does not hold is dropped whole, and counted.
    h.report_batch("b", b, &run, 1, kinds.clone()).await;
    assert_eq!(h.dropped_unknown_run(), 3);
    assert!(h.published(&run).is_empty());

    let [started, x, _] = kinds;
    let batch = [started, x, output("y"), completed(), output("late")];
    h.report_batch("a", a, &run, 1, batch).await;
    let terminal = h.assert_ended_once(&mut handle);
    assert_eq!(terminal.kind, completed());
    let relayed: Vec<(&str, u64)> = h
        .published(&run)
        .iter()
        .map(|e| (e.kind.name(), e.seq))
        .collect();
    assert_eq!(
        relayed,
        [
            ("started", 1),
            ("output", 2),
            ("output", 3),
            ("completed", 4)
        ]
    );
    assert_eq!(h.dropped_after_terminal(), 1);
    assert_eq!(h.active_runs("a"), 0);
    h.finish().await;
}

#[tokio::test(start_paused = true)]
async fn an_old_connections_events_do_not_reach_the_nodes_new_runs() {
    let mut h = Harness::expecting(Expect::terminals(2));
    let old = h.connect("a", 1).await;
    let mut first = h.start(spec());
    h.report("a", old, &first.run_id, 1, output("some")).await;
    h.disconnect("a").await;
    h.assert_failed(&mut first, "node_disconnected");

    let new = h.connect("a", 1).await;
    let mut second = h.start(spec());
    h.report("a", old, &second.run_id, 1, completed()).await;
    assert_eq!(h.dropped_unknown_run(), 1);
    assert!(h.published(&second.run_id).is_empty());

    h.complete("a", new, &mut second).await;
    h.finish().await;
}

#[tokio::test(start_paused = true)]
async fn a_queued_run_is_dispatched_when_a_slot_frees() {
    let mut h = Harness::expecting(Expect::terminals(2).runs_sent(2));
    let a = h.connect("a", 1).await;
    let [mut first, mut second] = h.start_runs();
    assert_eq!(h.service.queued_runs(), 1);
    assert!(h.sent_to(&second.run_id).is_empty());

    h.complete("a", a, &mut first).await;
    assert_eq!(h.sent_to(&second.run_id), [node_id("a")]);
    assert_eq!(h.service.queued_runs(), 0);
    assert_eq!(h.active_runs("a"), 1);

    h.report_each("a", a, &second.run_id, [RunEventKind::Started, completed()])
        .await;
    let terminal = h.assert_ended_once(&mut second);
    assert_eq!(terminal.node, Some(node_id("a")));
    assert_eq!(h.active_runs("a"), 0);
    h.finish().await;
}

#[tokio::test(start_paused = true)]
async fn a_queued_run_is_dispatched_when_a_node_connects() {
    let mut h = Harness::expecting(Expect::terminals(2).runs_sent(2));
    let a = h.connect("a", 1).await;
    let [mut first, mut second] = h.start_runs();
    assert_eq!(h.service.queued_runs(), 1);

    let b = h.connect("b", 1).await;
    assert_eq!(h.sent_to(&second.run_id), [node_id("b")]);
    assert_eq!(h.service.queued_runs(), 0);
    assert_eq!(h.active_runs("b"), 1);

    assert_eq!(
        h.complete("b", b, &mut second).await.node,
        Some(node_id("b"))
    );
    h.complete("a", a, &mut first).await;
    assert_eq!(h.active_runs("a"), 0);
    assert_eq!(h.active_runs("b"), 0);
    h.finish().await;
}

#[tokio::test(start_paused = true)]
async fn a_run_no_node_is_configured_for_is_refused_at_once() {
    let mut h = Harness::expecting(Expect::default().runs_sent(0));
    h.connect("a", 1).await;
    let other_target = RunSpec {
        selector: NodeSelector {
            target: Target::parse("other").unwrap(),
            ..spec().selector
        },
        ..spec()
    };
    let unknown = h.service.start(other_target).unwrap_err();
    assert!(
        matches!(unknown, StartError::NoNode(Unroutable::UnknownRoute { .. })),
        "{unknown:?}"
    );
    let pinned = RunSpec {
        selector: NodeSelector {
            pin: Some("zzz".into()),
            ..spec().selector
        },
        ..spec()
    };
    let absent = h.service.start(pinned).unwrap_err();
    assert_eq!(
        absent,
        StartError::NoNode(Unroutable::UnknownNode { pin: "zzz".into() })
    );

    assert_eq!(h.service.open_runs(), 0);
    assert!(h.published.lock().unwrap().is_empty());
    assert!(h.commands.lock().unwrap().is_empty());
    h.finish().await;
}

#[tokio::test(start_paused = true)]
async fn a_configured_route_with_no_node_connected_waits_for_one() {
    let mut h = Harness::expecting(Expect::terminals(2).runs_sent(1));
    // Nothing is connected, but `echo`/`t` is configured: the run waits, not 404.
    let mut waits = h.start(spec());
    assert_eq!(h.service.queued_runs(), 1);
    assert_eq!(h.service.waiting_by_cause(), [0, 1]);
    sleep(Duration::from_millis(500)).await;
    let a = h.connect("a", 1).await;
    assert_eq!(h.sent_to(&waits.run_id), [node_id("a")]);
    h.complete("a", a, &mut waits).await;

    // A run whose node never comes back fails `no_node_available` after its wait.
    h.disconnect("a").await;
    let mut expires = h.start(spec());
    sleep(Duration::from_millis(790)).await;
    assert_eq!(h.service.queued_runs(), 1);
    sleep(Duration::from_millis(20)).await;
    h.assert_edge_failed(&mut expires, "no_node_available");
    h.finish().await;
}

#[tokio::test(start_paused = true)]
async fn a_run_is_refused_when_the_queue_is_full() {
    let mut h = Harness::new(
        RunsConfig {
            queue_capacity: 1,
            ..config()
        },
        Expect::terminals(2),
    );
    let a = h.connect("a", 1).await;
    let [mut first, mut second] = h.start_runs();
    let full = h.service.start(spec()).unwrap_err();
    assert!(
        matches!(
            &full,
            StartError::QueueFull {
                capacity: 1,
                cause: WaitCause::AllBusy,
            }
        ),
        "{full:?}"
    );
    assert_eq!(h.service.open_runs(), 2);

    h.complete("a", a, &mut first).await;
    h.complete("a", a, &mut second).await;
    h.finish().await;
}

/// Only a run admitted — placed or queued — is journaled as accepted: one refused at
/// admission leaves no record open in the journal, which every restart and takeover would
/// take back and fail (found by the nemesis, issue 66).
#[tokio::test(start_paused = true)]
async fn only_an_admitted_run_is_journaled_as_accepted() {
    let accepted = Arc::new(Mutex::new(Vec::new()));
    let mut journal = crate::ports::journal::MockRunJournal::new();
    journal.expect_enabled().return_const(true);
    let kept = Arc::clone(&accepted);
    journal.expect_record().returning(move |entry| {
        if let crate::ports::JournalEntry::Accepted(run) = entry {
            kept.lock().unwrap().push(run.run_id);
        }
    });
    let config = RunsConfig {
        queue_capacity: 1,
        ..config()
    };
    let service = RunService::with_journal(
        Arc::new(LockRegistry::new()),
        Arc::new(MockNodeTransport::new()),
        Arc::new(MockEventSink::new()),
        Arc::new(journal),
        config.clone(),
        routing(&config, &RoutingConfig::default()),
        &opentelemetry::global::meter("edge-test"),
    );
    // Nothing is connected and `echo`/`t` is configured: the run waits, admitted.
    let queued = service.start(spec()).unwrap();
    let full = service.start(spec()).unwrap_err();
    assert!(matches!(full, StartError::QueueFull { .. }), "{full:?}");
    let unknown = RunSpec {
        selector: NodeSelector {
            target: Target::parse("other").unwrap(),
            ..spec().selector
        },
        ..spec()
    };
    let unknown = service.start(unknown).unwrap_err();
    assert!(matches!(unknown, StartError::NoNode(_)), "{unknown:?}");
    assert_eq!(*accepted.lock().unwrap(), [queued.run_id]);
}

#[tokio::test(start_paused = true)]
async fn a_run_the_node_cannot_be_sent_fails_over_and_then_waits() {
    let mut h = Harness::expecting(Expect::terminals(1).refusing_runs());
    h.connect("a", 1).await;
    h.connect("b", 1).await;
    let mut handle = h.start(spec());
    sleep(Duration::from_millis(1)).await;
    // Both connected nodes were tried; c, d and e are configured but away.
    assert_eq!(h.service.queued_runs(), 1);
    sleep(Duration::from_millis(800)).await;
    let terminal = h.assert_edge_failed(&mut handle, "no_node_available");
    let RunEventKind::Failed { message, .. } = &terminal.kind else {
        unreachable!()
    };
    assert!(message.contains("after 2 failed attempt(s)"), "{message}");
    assert!(message.contains("node_disconnected"), "{message}");
    assert_eq!(h.active_runs("a"), 0);
    assert_eq!(h.active_runs("b"), 0);
    h.finish().await;
}

#[tokio::test(start_paused = true)]
async fn a_run_whose_node_leaves_during_placement_waits_in_the_queue() {
    // The node is in the selection snapshot, but gone by the time the service looks up its
    // connection: the race between a dispatch and a disconnect.
    let mut registry = MockRegistry::new();
    let a = record("a", 1);
    registry
        .expect_statuses_serving()
        .returning(move |_, _| vec![NodeStatus::new(Arc::clone(&a), 0)]);
    registry.expect_connection().returning(|_| None);
    registry.expect_adjust_active_runs().never();
    let published = Log::default();
    let mut sink = MockEventSink::new();
    sink.expect_publish()
        .times(1)
        .returning(record_events(&published));
    sink.expect_flush().return_const(());
    let mut transport = MockNodeTransport::new();
    transport.expect_send().never();
    let service = service_over(
        Arc::new(registry),
        transport,
        sink,
        config(),
        &RoutingConfig::default(),
    );

    let mut handle = service.start(spec()).unwrap();
    assert_eq!(service.queued_runs(), 1);
    sleep(Duration::from_millis(810)).await;

    let (events, ended) = received(&mut handle);
    assert!(ended);
    let [terminal] = events.try_into().unwrap();
    assert_eq!(failure_code(&terminal), Some("no_node_available"));
    assert_eq!(*published.lock().unwrap(), [terminal]);
    assert_eq!(service.open_runs(), 0);
    service.drain(Duration::ZERO).await;
}

/// One step of the property test below.
#[derive(Debug, Clone)]
enum Op {
    /// A caller starts a run with this deadline.
    Start { deadline_ms: u64 },
    /// The node that holds run `run` reports one to three events in one batch (each 0
    /// started, 1 output, 2 completed, 3 failed without a class, 4 cancelled, 5 failed
    /// class NODE, 6 REFUSED, 7 REQUEST).
    Report { run: usize, kinds: Vec<u8> },
    /// Another node reports an event for run `run`.
    Stray { run: usize },
    /// The caller cancels run `run`.
    Cancel { run: usize },
    /// Node `node` disconnects.
    Disconnect { node: usize },
    /// Node `node` connects, if it is not connected; a `resumable` one registers with an
    /// instance id (its runs with output are detached when it disconnects).
    Connect { node: usize, resumable: bool },
    /// Node `node` registers again (taking its live connection over, if any, which then
    /// closes) and claims the runs in `claims` (a bit per run index), each as the node
    /// that made `skew` more events than it sent (0 to 2) and keeps them from `kept`
    /// (0 the first, 1 the one after the last sent, 2 one further: lost events).
    Resume {
        node: usize,
        claims: u8,
        skew: u8,
        kept: u8,
    },
    /// Time passes.
    Wait { ms: u64 },
}

const NODES: [(&str, u32); 2] = [("a", 2), ("b", 1)];

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        3 => (50u64..1_500).prop_map(|deadline_ms| Op::Start { deadline_ms }),
        6 => (any::<usize>(), prop::collection::vec(0u8..8, 1..4))
            .prop_map(|(run, kinds)| Op::Report { run, kinds }),
        1 => any::<usize>().prop_map(|run| Op::Stray { run }),
        2 => any::<usize>().prop_map(|run| Op::Cancel { run }),
        1 => (0..NODES.len()).prop_map(|node| Op::Disconnect { node }),
        2 => (0..NODES.len(), any::<bool>()).prop_map(|(node, resumable)| Op::Connect { node, resumable }),
        2 => (0..NODES.len(), any::<u8>(), 0u8..3, 0u8..3)
            .prop_map(|(node, claims, skew, kept)| Op::Resume { node, claims, skew, kept }),
        2 => (1u64..400).prop_map(|ms| Op::Wait { ms }),
    ]
}

fn node_kind(kind: u8) -> RunEventKind {
    match kind {
        0 => RunEventKind::Started,
        1 => output("x"),
        2 => completed(),
        3 => RunEventKind::failed("adapter_error", "boom"),
        4 => cancelled("node"),
        5 => classed(FailureClass::Node),
        6 => classed(FailureClass::Refused),
        _ => classed(FailureClass::Request),
    }
}

/// Plays `ops` against a service with two nodes, then lets every timer run out. Node
/// failures and disconnects fail runs over (up to 3 attempts) and each one opens the node's
/// breaker, which cools down for 50 ms (then doubling), so probes, re-trips and closes
/// happen within the ops too (in about half the cases some breaker opens).
#[allow(
    clippy::too_many_lines,
    reason = "the property's driver: one op per arm, and the invariants checked after them"
)]
async fn interleave(ops: Vec<Op>) {
    let breakers = RoutingConfig {
        breaker: BreakerConfig {
            failure_threshold: 1,
            cooldown_ms: 50,
            max_cooldown_ms: 200,
        },
        ..RoutingConfig::default()
    };
    let mut h = Harness::routed(
        RunsConfig {
            queue_capacity: 4,
            queue_timeout_ms: 300,
            no_node_timeout_ms: 200,
            max_attempts: 3,
            cancel_grace_ms: 100,
            default_deadline_ms: 0,
            resume_grace_ms: 250,
            max_continuations: 1,
            client_resume_grace_ms: 0,
        },
        &breakers,
        Expect::default(),
    );
    for (id, max) in NODES {
        h.connect(id, max).await;
    }
    let mut handles: Vec<RunHandle> = Vec::new();
    let mut seqs: Vec<u64> = Vec::new();
    for op in ops {
        match op {
            Op::Start { deadline_ms } => {
                let started = h
                    .service
                    .start(with_deadline(Duration::from_millis(deadline_ms)));
                if let Ok(handle) = started {
                    handles.push(handle);
                    seqs.push(0);
                }
            }
            Op::Report { run, kinds } if !handles.is_empty() => {
                let run = run % handles.len();
                let run_id = handles[run].run_id.clone();
                let holder = h
                    .sent_to(&run_id)
                    .last()
                    .map_or("a".to_owned(), |n| n.to_string());
                let connection = h.connections.get(&holder).copied().unwrap_or(0);
                let first = seqs[run] + 1;
                seqs[run] += kinds.len() as u64;
                let kinds = kinds.into_iter().map(node_kind);
                h.report_batch(&holder, connection, &run_id, first, kinds)
                    .await;
            }
            Op::Stray { run } if !handles.is_empty() => {
                let run_id = handles[run % handles.len()].run_id.clone();
                let holder = h.sent_to(&run_id).last().map(ToString::to_string);
                let other = if holder.as_deref() == Some("a") {
                    "b"
                } else {
                    "a"
                };
                let connection = h.connections.get(other).copied().unwrap_or(0);
                h.report(other, connection, &run_id, 1, completed()).await;
            }
            Op::Cancel { run } if !handles.is_empty() => {
                let run_id = handles[run % handles.len()].run_id.clone();
                h.service.cancel(&run_id, "caller").await;
            }
            Op::Disconnect { node } => {
                if h.connections.contains_key(NODES[node].0) {
                    h.disconnect(NODES[node].0).await;
                }
            }
            Op::Connect { node, resumable } => {
                let (id, max) = NODES[node];
                if !h.connections.contains_key(id) {
                    if resumable {
                        h.resume(id, max, &[]).await;
                    } else {
                        h.connect(id, max).await;
                    }
                }
            }
            Op::Resume {
                node,
                claims,
                skew,
                kept,
            } => {
                let (id, max) = NODES[node];
                let claimed: Vec<usize> = (0..handles.len().min(8))
                    .filter(|run| claims & (1 << run) != 0)
                    .collect();
                let claims: Vec<ResumeClaim> = claimed
                    .iter()
                    .map(|&run| {
                        let next_seq = seqs[run] + 1 + u64::from(skew);
                        ResumeClaim {
                            run_id: handles[run].run_id.as_str().to_owned(),
                            next_seq,
                            first_buffered_seq: [1, seqs[run] + 1, seqs[run] + 2]
                                [usize::from(kept)],
                        }
                    })
                    .collect();
                let old = h.connections.get(id).copied();
                let was_resumable = h.resumable.contains(id);
                let (_, answers) = h.resume(id, max, &claims).await;
                if let Some(old) = old {
                    h.close(id, old, was_resumable).await;
                }
                for (run, answer) in claimed.iter().zip(&answers) {
                    assert_eq!(answer.run_id, handles[*run].run_id.as_str());
                    if let Ok(from) = answer.outcome {
                        // The node sends again from where the edge wants.
                        seqs[*run] = from - 1;
                    }
                }
            }
            Op::Wait { ms } => sleep(Duration::from_millis(ms)).await,
            Op::Report { .. } | Op::Stray { .. } | Op::Cancel { .. } => {}
        }
    }
    // Every run has a deadline, and a queued one a queue wait: time ends them all.
    sleep(Duration::from_secs(10)).await;

    assert_eq!(h.service.open_runs(), 0);
    assert_eq!(h.service.queued_runs(), 0);
    for handle in &mut handles {
        h.assert_ended_once(handle);
        // Nothing relayed twice: a resumed run's repeats are dropped.
        let seqs: Vec<u64> = h.published(&handle.run_id).iter().map(|e| e.seq).collect();
        assert!(seqs.windows(2).all(|w| w[0] < w[1]), "seqs {seqs:?}");
    }
    for (id, _) in NODES {
        if h.connections.contains_key(id) {
            assert_eq!(h.active_runs(id), 0, "active runs of {id}");
        }
    }
    h.finish().await;
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    /// Whatever nodes, callers and timers do in whatever order — runs detached when their
    /// node drops, re-attached or refused when it comes back and claims them, connections
    /// taken over — every accepted run ends with exactly one terminal event, nothing
    /// follows it, nothing is relayed twice, and no run is left open.
    #[test]
    fn every_run_ends_with_exactly_one_terminal_event(
        ops in proptest::collection::vec(op(), 1..40),
    ) {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .start_paused(true)
            .build()
            .unwrap();
        runtime.block_on(interleave(ops));
    }
}
