//! What the parts' own tests build them from: the real in-memory registry with nodes
//! connected to it, a transport and a sink that record what they are given, and each part
//! made on its own — a [`Placer`] alone, a [`Relay`] over it, [`Recovery`] over both — with
//! no `RunService` around them.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::config::Routing;
use super::delivery::Delivery;
use super::observer::Unobserved;
use super::placer::{Effect, Fallout, Placer, PlacerParts};
use super::recovery::{Recovery, RecoveryParts};
use super::relay::Relay;
use super::run::{Run, accepted};
use super::timers::Timers;
use super::{LimitsConfig, RoutingConfig, RunsConfig, policy};
use crate::adapters::lock_registry::LockRegistry;
use crate::domain::routing::Catalog;
use crate::domain::{
    AdapterConfig, AdapterName, Alias, NodeId, NodeRecord, NodeSelector, Operation, RunEvent,
    RunId, RunRouting, RunSpec, RuntimeConfig, Target, Token,
};
use crate::ports::{
    ConnectionId, EventSink, LastFrame, LinkError, NewConnection, NodeCommand, NodeLink,
    NodeTransport, NoopJournal, Registry, RunJournal, TransportError,
};

/// The nodes a rig may connect, each serving `echo`/`t`.
const NODES: [&str; 3] = ["a", "b", "c"];

pub(super) fn node(id: &str) -> NodeId {
    NodeId::parse(id).unwrap()
}

fn record(id: &str, slots: u32) -> Arc<NodeRecord> {
    let adapter = AdapterConfig::new(
        AdapterName::parse("echo").unwrap(),
        vec![Target::parse("t").unwrap()],
        BTreeMap::new(),
    )
    .unwrap();
    Arc::new(NodeRecord::new(
        node(id),
        Alias::parse(&format!("{id}-alias")).unwrap(),
        Token::new(format!("tok-{id}")).digest(),
        vec![adapter],
        RuntimeConfig::new(slots, 1_000, BTreeMap::new()).unwrap(),
    ))
}

/// A run of `echo`/`t` with no deadline.
pub(super) fn spec() -> RunSpec {
    RunSpec {
        selector: NodeSelector {
            adapter: AdapterName::parse("echo").unwrap(),
            target: Target::parse("t").unwrap(),
            pin: None,
        },
        input: Bytes::from_static(b"hello"),
        content_type: "text/plain".into(),
        params: BTreeMap::new(),
        deadline: None,
        operation: Operation::Unspecified,
        routing: RunRouting::default(),
    }
}

/// The commands a transport was given, by node.
#[derive(Default)]
pub(super) struct Sent(Mutex<Vec<(NodeId, NodeCommand)>>);

impl Sent {
    /// The runs sent, as `(node, run id)`.
    pub(super) fn runs(&self) -> Vec<(String, String)> {
        let sent = self.0.lock().unwrap();
        sent.iter()
            .filter_map(|(node, command)| match command {
                NodeCommand::Run(run) => Some((node.to_string(), run.run_id.to_string())),
                _ => None,
            })
            .collect()
    }

    /// The cancels sent, as `(node, run id)`.
    pub(super) fn cancels(&self) -> Vec<(String, String)> {
        let sent = self.0.lock().unwrap();
        sent.iter()
            .filter_map(|(node, command)| match command {
                NodeCommand::Cancel { run_id, .. } => Some((node.to_string(), run_id.to_string())),
                _ => None,
            })
            .collect()
    }
}

impl NodeTransport for Sent {
    fn send(&self, node: &NodeId, command: NodeCommand) -> Result<(), TransportError> {
        self.0.lock().unwrap().push((node.clone(), command));
        Ok(())
    }
}

/// The events a sink was given.
#[derive(Default)]
pub(super) struct Published(Mutex<Vec<Arc<RunEvent>>>);

impl Published {
    /// The kinds and seqs of `run`'s events, in order.
    pub(super) fn of(&self, run: &RunId) -> Vec<(u64, &'static str)> {
        let published = self.0.lock().unwrap();
        published
            .iter()
            .filter(|e| &e.run_id == run)
            .map(|e| (e.seq, e.kind.name()))
            .collect()
    }
}

#[async_trait]
impl EventSink for Published {
    fn name(&self) -> &str {
        "published"
    }

    fn publish(&self, event: Arc<RunEvent>) {
        self.0.lock().unwrap().push(event);
    }

    async fn flush(&self) {}
}

struct NullLink;

impl NodeLink for NullLink {
    fn send(&self, _command: NodeCommand) -> Result<(), LinkError> {
        Ok(())
    }

    fn supersede(&self) {}
}

/// The doubles and settings the parts are built from.
pub(super) struct Rig {
    pub registry: Arc<LockRegistry>,
    pub sent: Arc<Sent>,
    pub published: Arc<Published>,
    pub config: RunsConfig,
    pub stopping: CancellationToken,
    next_run: u64,
}

impl Rig {
    /// A rig with the test settings: 2 attempts, a queue of 2, resume on.
    pub(super) fn new() -> Self {
        let config = RunsConfig {
            queue_capacity: 2,
            queue_timeout_ms: 1_000,
            no_node_timeout_ms: 800,
            max_attempts: 2,
            cancel_grace_ms: 500,
            default_deadline_ms: 0,
            resume_grace_ms: 2_000,
            max_continuations: 0,
            client_resume_grace_ms: 1_000,
        };
        Self {
            registry: Arc::new(LockRegistry::new()),
            sent: Arc::default(),
            published: Arc::default(),
            config,
            stopping: CancellationToken::new(),
            next_run: 0,
        }
    }

    /// Connects node `id` with `slots` slots on `connection`.
    pub(super) fn connect(&self, id: &str, slots: u32, connection: ConnectionId) {
        let registered = NewConnection {
            record: record(id, slots),
            connection,
            peer: SocketAddr::from(([127, 0, 0, 1], 9_000)),
            node_version: "test".into(),
            link: Arc::new(NullLink),
            instance_id: "i-1".into(),
            last_frame: Arc::new(LastFrame::new(std::time::Instant::now())),
            reserved_runs: 0,
            can_continue: false,
            operations: crate::domain::DeclaredOperations::default(),
            can_manage_models: false,
            inventory: None,
        };
        self.registry.insert(registered).unwrap();
    }

    /// Takes node `id`'s `connection` out of the registry.
    pub(super) fn disconnect(&self, id: &str, connection: ConnectionId) {
        self.registry.remove(&node(id), connection);
    }

    /// A placer over the rig's registry and transport.
    pub(super) fn placer(&self) -> Arc<Placer> {
        let routing = Routing {
            catalog: Catalog::new(NODES.map(|id| record(id, 1))),
            policy: policy(
                &self.config,
                &RoutingConfig::default(),
                &LimitsConfig::default(),
            )
            .unwrap(),
            key_limits: std::collections::HashMap::new(),
        };
        Arc::new(Placer::new(PlacerParts {
            registry: Arc::clone(&self.registry) as Arc<dyn Registry>,
            transport: Arc::clone(&self.sent) as Arc<dyn NodeTransport>,
            journal: journal(),
            routing,
            observer: Arc::new(Unobserved),
            queue_capacity: self.config.queue_capacity,
            stopping: self.stopping.clone(),
        }))
    }

    /// A relay over `placer`, publishing to the rig's sink.
    pub(super) fn relay(&self, placer: &Arc<Placer>, timers: &Arc<Timers>) -> Arc<Relay> {
        Arc::new(Relay::new(
            Arc::clone(placer),
            Arc::clone(timers),
            Arc::clone(&self.published) as Arc<dyn EventSink>,
            journal(),
            Arc::new(Unobserved),
            self.config.cancel_grace(),
        ))
    }

    /// Recovery over `placer` and `relay`.
    pub(super) fn recovery(
        &self,
        placer: &Arc<Placer>,
        relay: &Arc<Relay>,
        timers: &Arc<Timers>,
    ) -> Arc<Recovery> {
        Arc::new(Recovery::new(RecoveryParts {
            placer: Arc::clone(placer),
            relay: Arc::clone(relay),
            timers: Arc::clone(timers),
            journal: journal(),
            observer: Arc::new(Unobserved),
            resume_grace: self.config.resume_grace(),
            client_resume_grace: self.config.client_resume_grace(),
        }))
    }

    /// The timers of a part under test.
    pub(super) fn timers(&self) -> Arc<Timers> {
        Arc::new(Timers::new(self.stopping.clone()))
    }

    /// A placer, its timers and a relay over them.
    pub(super) fn relay_parts(&self) -> (Arc<Placer>, Arc<Timers>, Arc<Relay>) {
        let (placer, timers) = (self.placer(), self.timers());
        let relay = self.relay(&placer, &timers);
        (placer, timers, relay)
    }

    /// A new run of `spec` admitted by `placer`, what placement left to do carried out by
    /// `relay`; its caller's stream.
    pub(super) fn start(
        &mut self,
        placer: &Placer,
        relay: &Arc<Relay>,
        spec: RunSpec,
    ) -> (Arc<Run>, mpsc::Receiver<Arc<RunEvent>>) {
        let (run, caller) = self.run(spec);
        relay.settle(placer.admit(&run).unwrap().1);
        (run, caller)
    }

    /// A new run of `spec`, not yet admitted, and its caller's stream.
    pub(super) fn run(&mut self, spec: RunSpec) -> (Arc<Run>, mpsc::Receiver<Arc<RunEvent>>) {
        self.next_run += 1;
        let id = RunId::new(format!("run-{}", self.next_run));
        let (caller, events) = mpsc::channel(64);
        let accepted = accepted(&id, &spec);
        let span = tracing::Span::none();
        let run = Run::new(
            id,
            spec,
            accepted,
            Delivery::new(caller),
            span,
            Instant::now(),
        );
        (Arc::new(run), events)
    }
}

fn journal() -> Arc<dyn RunJournal> {
    Arc::new(NoopJournal)
}

/// What `fallout` asks for, in order, as words: `send run-1 to a`, `wait run-2`,
/// `end run-3`, `pump after 30s`.
pub(super) fn effects(fallout: Fallout) -> Vec<String> {
    fallout
        .into_effects()
        .map(|effect| match effect {
            Effect::Send(run, node) => format!("send {} to {node}", run.id()),
            Effect::ArmWait(run) => format!("wait {}", run.id()),
            Effect::End(run, kind) => format!("end {} {}", run.id(), kind.name()),
            Effect::PumpAfter(after) => format!("pump after {}s", secs(after)),
        })
        .collect()
}

fn secs(duration: Duration) -> u64 {
    duration.as_secs()
}
