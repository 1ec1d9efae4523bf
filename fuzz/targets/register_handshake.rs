//! Fuzz target `register_handshake`: arbitrary bytes as a node connection to the real TCP
//! transport (`TransportControl::serve_stream` over an in-memory duplex pipe).
//!
//! Input: `[mode, bytes...]`. `mode` picks an optional valid-looking `RegisterRequest` the
//! harness writes first (so the fuzzer reaches the relay after registration):
//! - bits 0-1: none, `token-a`, `token-b`, or an unknown token;
//! - bits 2-3: the claimed `node_id`: none, `node-a`, `node-b`, or an unknown id;
//! - bits 4-5: `protocol_version` 1, 0, 2 or `u32::MAX`;
//! - bit 6: start a run on the node as soon as it registers;
//! - bit 7: after `bytes`, fall silent instead of closing (the edge must end the connection
//!   itself: register timeout, heartbeat timeout).
//!
//! Then `bytes` follow as they are, and the node closes its sending side (or falls silent)
//! and reads until the edge closes. Run events with an empty `run_id` are addressed to the run the harness
//! started (a real node echoes the id it was sent; the fuzzer cannot read it).
//!
//! Invariants: nothing panics; `serve_stream` returns; afterwards the registry is empty, no
//! run is open, the started run has exactly one terminal event in the sink and nothing after
//! it, and what the edge wrote is well-formed (a register response first, nothing after a
//! rejection).
//!
//! The transport is bound once per process. This file is shared by the libFuzzer binary and
//! the root crate's corpus replay test, so it must build on stable and stay clippy-clean.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use async_trait::async_trait;
use bytes::{Bytes, BytesMut};
use edge::components::FileNodeStore;
use edge::components::LockRegistry;
use edge::components::Routing;
use edge::components::RunService;
use edge::components::{ServerDeps, TcpServer, TcpTransport, TransportControl};
use edge::domain::routing::{BreakerPolicy, Catalog, RoutingPolicy};
use edge::domain::{
    AdapterDefinition, AdapterName, NodeDefinition, NodeId, NodeSelector, RegisterAttempt,
    ResumeAnswer, ResumeClaim, RunEvent, RunId, RunSpec, Target, Token,
};
use edge::ports::{
    CloseReason, ConnectionId, EventSink, NodeEventHandler, NodeStore, Registry, ReportedEvent,
};
use edge::settings::RunsConfig;
use edge::settings::ServerConfig;
use edge::wire::{NodeCodec, NodeFrame, ReceivedEdgeFrame, RegisterOutcome};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::runtime::Runtime;
use tokio_util::codec::{Decoder, Encoder};

use crate::recording::{RecordingSink, lock};

/// Bytes the in-memory pipe holds in each direction; small, so frames arrive in pieces.
pub(crate) const PIPE_BYTES: usize = 64;

/// Far beyond any timeout the transport has: reaching it means `serve_stream` hangs. The
/// clock is paused, so this costs no real time.
pub(crate) const HANG: Duration = Duration::from_secs(24 * 3600);

/// Runs one input.
pub fn run(data: &[u8]) {
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    let harness = harness();
    let input = with_prelude(mode, rest);
    harness.handler.reset(mode & 0x40 != 0);
    lock(&harness.sink.events).clear();

    let written = harness.runtime.block_on(async {
        let (edge_side, node_side) = tokio::io::duplex(PIPE_BYTES);
        let peer = SocketAddr::from(([127, 0, 0, 1], 40_000));
        let serve = harness.control.serve_stream(edge_side, peer);
        let node = node(node_side, input, mode & 0x80 != 0);
        let ((), written) = tokio::time::timeout(HANG, async { tokio::join!(serve, node) })
            .await
            .expect("serve_stream did not return");
        written
    });

    assert!(
        harness.registry.is_empty(),
        "the node is still registered after its connection closed"
    );
    assert_eq!(harness.service.open_runs(), 0, "a run outlived its node");
    let started = harness.handler.started();
    check_events(&lock(&harness.sink.events), started.as_ref());
    check_reply(&written);
}

/// The node's side: writes `input`, closes its sending half (unless it `lingers`), and reads
/// until the edge closes.
pub(crate) async fn node(stream: tokio::io::DuplexStream, input: Vec<u8>, linger: bool) -> Vec<u8> {
    let (mut reader, mut writer) = tokio::io::split(stream);
    let write = async move {
        // The edge may close first (it refuses or stops reading); that is not a failure.
        if writer.write_all(&input).await.is_ok() && !linger {
            let _ = writer.shutdown().await;
        }
        // Kept open until the edge has closed, when lingering.
        writer
    };
    let read = async move {
        let mut written = Vec::new();
        let _ = reader.read_to_end(&mut written).await;
        written
    };
    tokio::join!(write, read).1
}

/// `rest`, preceded by the register request `mode` asks for.
fn with_prelude(mode: u8, rest: &[u8]) -> Vec<u8> {
    let token = match mode & 0x03 {
        0 => return rest.to_vec(),
        1 => "token-a",
        2 => "token-b",
        _ => "token-x",
    };
    let node_id = ["", "node-a", "node-b", "node-x"][usize::from((mode >> 2) & 0x03)];
    let protocol_version = [1, 0, 2, u32::MAX][usize::from((mode >> 4) & 0x03)];
    let register = NodeFrame::Register(RegisterAttempt {
        token: Token::new(token),
        node_id: node_id.to_owned(),
        node_version: "fuzz".to_owned(),
        protocol_version,
        adapters: vec!["echo".to_owned()],
        instance_id: String::new(),
        resume: Vec::new(),
        can_continue: false,
        operations: edge::domain::DeclaredOperations::default(),
        can_manage_models: false,
        inventory: None,
    });
    let mut bytes = encoded(register);
    bytes.extend_from_slice(rest);
    bytes
}

/// `frame` as a node writes it.
pub(crate) fn encoded(frame: NodeFrame) -> Vec<u8> {
    let mut buf = BytesMut::new();
    NodeCodec::new(usize::MAX)
        .encode(frame, &mut buf)
        .expect("encoding into memory");
    buf.to_vec()
}

/// The started run, if any, has exactly one terminal event, the last; no other run has any.
fn check_events(events: &[Arc<RunEvent>], started: Option<&RunId>) {
    let Some(run_id) = started else {
        assert!(events.is_empty(), "events without a run: {events:?}");
        return;
    };
    assert!(
        events.iter().all(|e| &e.run_id == run_id),
        "events for a run nobody started: {events:?}"
    );
    let terminals = events.iter().filter(|e| e.kind.is_terminal()).count();
    assert_eq!(terminals, 1, "run {run_id} has {terminals} terminal events");
    assert!(
        events.last().is_some_and(|e| e.kind.is_terminal()),
        "run {run_id} has events after its terminal event: {events:?}"
    );
}

/// What the edge wrote is a register response, then (only if it accepted) commands and
/// heartbeat acks; returns the response, if the edge answered.
pub(crate) fn check_reply(written: &[u8]) -> Option<RegisterOutcome> {
    let mut codec = NodeCodec::new(usize::MAX);
    let mut buf = BytesMut::from(written);
    let mut frames = Vec::new();
    while let Some(frame) = codec
        .decode(&mut buf)
        .expect("the edge wrote a frame that does not decode")
    {
        frames.push(frame);
    }
    assert!(buf.is_empty(), "the edge wrote part of a frame");
    let (first, rest) = frames.split_first()?;
    let ReceivedEdgeFrame::Registered(outcome) = first else {
        panic!("the edge's first frame is not a register response: {first:?}");
    };
    if outcome.accepted {
        assert!(
            rest.iter().all(|f| matches!(
                f,
                ReceivedEdgeFrame::Command(_) | ReceivedEdgeFrame::HeartbeatAck { .. }
            )),
            "the edge sent more than commands and acks after accepting: {rest:?}"
        );
    } else {
        assert!(
            rest.is_empty(),
            "the edge wrote after a rejection: {rest:?}"
        );
    }
    Some(outcome.clone())
}

/// The transport, its collaborators and the runtime they live on, made once per process.
pub struct Harness {
    pub runtime: Runtime,
    pub control: TransportControl,
    pub registry: LockRegistry,
    pub service: RunService,
    pub handler: Arc<Handler>,
    pub sink: Arc<RecordingSink>,
}

impl Harness {
    /// A paused-clock runtime; a run service over `store`'s nodes with `runs` and routing
    /// `policy`, recording its events; the real TCP transport (bound on loopback, served
    /// through `serve_stream`) with small limits.
    pub fn new(store: FileNodeStore, runs: RunsConfig, policy: RoutingPolicy) -> Self {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .start_paused(true)
            .build()
            .expect("a tokio runtime");
        let registry = LockRegistry::new();
        let shared_registry: Arc<dyn Registry> = Arc::new(registry.clone());
        let sink = Arc::new(RecordingSink::default());
        let service = RunService::new(
            Arc::clone(&shared_registry),
            Arc::new(TcpTransport::new(Arc::clone(&shared_registry))),
            Arc::clone(&sink) as Arc<dyn EventSink>,
            runs,
            Routing {
                catalog: Catalog::new(store.records()),
                policy,
                key_limits: std::collections::HashMap::new(),
            },
            &opentelemetry::global::meter("fuzz"),
        );
        let handler = Arc::new(Handler::new(service.clone()));
        let config = ServerConfig {
            listen: SocketAddr::from(([127, 0, 0, 1], 0)),
            register_timeout_ms: 50,
            max_frame_bytes: 4_096,
            max_register_frame_bytes: 512,
            outbound_queue: 4,
            write_timeout_ms: 1_000,
            ..ServerConfig::default()
        };
        let deps = ServerDeps {
            store: Arc::new(store),
            registry: shared_registry,
            handler: Arc::clone(&handler) as Arc<dyn NodeEventHandler>,
            site: edge::ports::SiteRole::default(),
        };
        let server = runtime
            .block_on(TcpServer::bind(config, deps))
            .expect("bind 127.0.0.1:0");
        Harness {
            runtime,
            control: server.control(),
            registry,
            service,
            handler,
            sink,
        }
    }
}

fn harness() -> &'static Harness {
    static HARNESS: OnceLock<Harness> = OnceLock::new();
    HARNESS.get_or_init(|| {
        let store = FileNodeStore::from_definitions(&[
            definition("node-a", "gpu-a", "token-a", 2, 1_000),
            definition("node-b", "gpu-b", "token-b", 1, 1),
        ])
        .expect("valid definitions");
        // The harness serves every input: a breaker tripped by earlier inputs' disconnects
        // would make a later input's pinned run wait.
        let policy = RoutingPolicy {
            breaker: BreakerPolicy::new(
                u32::MAX,
                Duration::from_millis(1),
                Duration::from_millis(1),
            )
            .expect("a valid breaker policy"),
            ..RoutingPolicy::default()
        };
        Harness::new(store, RunsConfig::default(), policy)
    })
}

pub(crate) fn definition(
    id: &str,
    alias: &str,
    token: &str,
    max_concurrent_runs: u32,
    heartbeat_interval_ms: u32,
) -> NodeDefinition {
    NodeDefinition {
        id: id.to_owned(),
        alias: alias.to_owned(),
        token: Some(Token::new(token)),
        adapters: vec![AdapterDefinition {
            name: "echo".to_owned(),
            targets: vec!["default".to_owned()],
            settings: BTreeMap::new(),
        }],
        max_concurrent_runs,
        heartbeat_interval_ms,
        ..NodeDefinition::default()
    }
}

/// The run service, plus a run started on the next node that registers (when asked) and
/// the addressing of empty-id run events to that run.
pub(crate) struct Handler {
    service: RunService,
    start_runs: AtomicBool,
    started: Mutex<Option<RunId>>,
}

impl Handler {
    pub(crate) fn new(service: RunService) -> Self {
        Self {
            service,
            start_runs: AtomicBool::new(false),
            started: Mutex::new(None),
        }
    }

    /// Forgets the started run; `start_run` starts one on the next registration.
    pub(crate) fn reset(&self, start_run: bool) {
        self.start_runs.store(start_run, Ordering::Relaxed);
        *lock(&self.started) = None;
    }

    /// The run started on a registration, if any.
    pub(crate) fn started(&self) -> Option<RunId> {
        lock(&self.started).clone()
    }
}

#[async_trait]
impl NodeEventHandler for Handler {
    fn node_changed(&self, node: &NodeId) {
        self.service.node_changed(node);
    }

    fn node_connected(&self, node: &NodeId) {
        self.service.node_connected(node);
        if !self.start_runs.swap(false, Ordering::Relaxed) {
            return;
        }
        let spec = RunSpec {
            selector: NodeSelector {
                adapter: AdapterName::parse("echo").expect("valid adapter"),
                target: Target::parse("default").expect("valid target"),
                pin: Some(node.as_str().to_owned()),
            },
            input: Bytes::from_static(b"fuzz"),
            content_type: "text/plain; charset=utf-8".to_owned(),
            params: BTreeMap::new(),
            deadline: None,
            operation: edge::domain::Operation::Unspecified,
            routing: Default::default(),
        };
        // The caller's stream is dropped: the events still reach the sink.
        let handle = self
            .service
            .start(spec)
            .expect("a run for an idle, just-registered node is refused");
        *lock(&self.started) = Some(handle.run_id);
    }

    async fn run_events(
        &self,
        node: &NodeId,
        connection: ConnectionId,
        events: &mut Vec<ReportedEvent>,
    ) {
        if let Some(run_id) = lock(&self.started).as_ref() {
            for event in events.iter_mut().filter(|e| e.run_id.is_empty()) {
                event.run_id = run_id.as_str().to_owned();
            }
        }
        self.service.run_events(node, connection, events).await;
    }

    async fn resume_runs(
        &self,
        node: &NodeId,
        connection: ConnectionId,
        claims: &[ResumeClaim],
    ) -> Vec<ResumeAnswer> {
        self.service.resume_runs(node, connection, claims).await
    }

    async fn node_disconnected(
        &self,
        node: &NodeId,
        connection: ConnectionId,
        reason: CloseReason,
        resumable: bool,
    ) {
        self.service
            .node_disconnected(node, connection, reason, resumable)
            .await;
    }
}
