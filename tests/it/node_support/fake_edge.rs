//! A fake edge for asserting what the node sends: it accepts connections and speaks the real
//! framing (`edge::wire::EdgeCodec`), but every answer is the test's to give, so tests can
//! see registrations (instance id, resume claims), heartbeats (pings, availability) and run
//! events exactly as they arrive, and cut, refuse or go silent at will.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;

use edge::domain::{
    AdapterConfig, AdapterName, Alias, Availability, NodeId, NodeRecord, RegisterAttempt,
    RegisterRejection, ResumeAnswer, RuntimeConfig, Target, Token,
};
use edge::ports::{ModelCommand, ModelOutcome, NodeCommand, ReportedEvent, RunAssignment};
use edge::wire::{EdgeCodec, EdgeFrame, NodeFrame};
use futures::{SinkExt, StreamExt};
use tokio::net::{TcpListener, TcpStream};
use tokio_util::codec::Framed;

use super::PATIENCE;

/// A node's definition as the fake edge hands it out: one adapter with `settings`.
pub fn record(
    adapter: &str,
    targets: &[&str],
    settings: &[(&str, String)],
    max_runs: u32,
    heartbeat_ms: u32,
) -> Arc<NodeRecord> {
    record_of(
        vec![adapter_config(adapter, targets, settings)],
        max_runs,
        heartbeat_ms,
    )
}

/// One adapter of a node's definition: `name` serving `targets`, with `settings`.
pub fn adapter_config(name: &str, targets: &[&str], settings: &[(&str, String)]) -> AdapterConfig {
    AdapterConfig::new(
        AdapterName::parse(name).expect("adapter"),
        targets
            .iter()
            .map(|t| Target::parse(t).expect("target"))
            .collect(),
        settings
            .iter()
            .map(|(k, v)| ((*k).to_owned(), v.clone()))
            .collect::<BTreeMap<_, _>>(),
    )
    .expect("adapter config")
}

/// A node's definition as the fake edge hands it out: `adapters` (see [`adapter_config`]).
pub fn record_of(
    adapters: Vec<AdapterConfig>,
    max_runs: u32,
    heartbeat_ms: u32,
) -> Arc<NodeRecord> {
    let runtime =
        RuntimeConfig::new(max_runs, heartbeat_ms, BTreeMap::new()).expect("runtime config");
    Arc::new(NodeRecord::new(
        NodeId::parse("node-1").expect("id"),
        Alias::parse("box-1").expect("alias"),
        Token::new("token-1").digest(),
        adapters,
        runtime,
    ))
}

/// Listens for nodes.
pub struct FakeEdge {
    listener: TcpListener,
    /// Where nodes dial.
    pub addr: SocketAddr,
}

impl FakeEdge {
    /// Binds a free port.
    pub async fn bind() -> Self {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind the fake edge");
        let addr = listener.local_addr().expect("addr");
        Self { listener, addr }
    }

    /// The next node connection.
    pub async fn accept(&self) -> EdgeConn {
        let (stream, _) = tokio::time::timeout(PATIENCE, self.listener.accept())
            .await
            .expect("the node connects in time")
            .expect("accept");
        EdgeConn {
            framed: Framed::new(stream, EdgeCodec::new(16 * 1024 * 1024)),
            ack_pings: true,
        }
    }
}

/// A heartbeat as the node sent it.
#[derive(Debug, Clone)]
pub struct Beat {
    /// `active_runs`.
    pub active_runs: u32,
    /// `ping`.
    pub ping: u64,
    /// `availability`, as `adapter/target` strings.
    pub availability: Option<Vec<String>>,
    /// `availability` as the edge reads it: context windows and managed adapters too.
    pub report: Option<Availability>,
}

fn pairs(availability: &Availability) -> Vec<String> {
    availability
        .pairs()
        .iter()
        .map(|(a, t)| format!("{a}/{t}"))
        .collect()
}

/// One node connection, driven by the test.
pub struct EdgeConn {
    framed: Framed<TcpStream, EdgeCodec>,
    /// Whether heartbeats with a ping are answered (on by default).
    pub ack_pings: bool,
}

/// What [`EdgeConn::next`] read.
#[derive(Debug)]
pub enum Heard {
    /// A heartbeat (already acked if `ack_pings`).
    Beat(Beat),
    /// A run event.
    Event(ReportedEvent),
    /// A registration.
    Register(RegisterAttempt),
    /// The answer to a model command.
    ModelOutcome(ModelOutcome),
    /// The node closed the connection.
    Closed,
}

impl EdgeConn {
    /// The next frame; heartbeats are acked when `ack_pings`.
    pub async fn next(&mut self) -> Heard {
        let frame = tokio::time::timeout(PATIENCE, self.framed.next())
            .await
            .expect("the node says something in time");
        match frame {
            None | Some(Err(_)) => Heard::Closed,
            Some(Ok(NodeFrame::Register(attempt))) => Heard::Register(attempt),
            Some(Ok(NodeFrame::RunEvent(event))) => Heard::Event(event),
            Some(Ok(NodeFrame::Heartbeat {
                active_runs,
                ping,
                availability,
                ..
            })) => {
                if self.ack_pings && ping != 0 {
                    self.send(EdgeFrame::HeartbeatAck { ping }).await;
                }
                Heard::Beat(Beat {
                    active_runs,
                    ping,
                    availability: availability.as_ref().map(pairs),
                    report: availability,
                })
            }
            Some(Ok(NodeFrame::ModelOutcome(outcome))) => Heard::ModelOutcome(outcome),
            Some(Ok(NodeFrame::Unknown)) => Box::pin(self.next()).await,
        }
    }

    /// The registration the node opens with.
    pub async fn registration(&mut self) -> RegisterAttempt {
        match self.next().await {
            Heard::Register(attempt) => attempt,
            other => panic!("expected a registration, got {other:?}"),
        }
    }

    /// Accepts the registration with `record`, answering claims with `resumed`.
    pub async fn accept(&mut self, record: &Arc<NodeRecord>, resumed: Vec<ResumeAnswer>) {
        self.send(EdgeFrame::Accepted {
            record: Arc::clone(record),
            resumed,
            acknowledges_pings: self.ack_pings,
        })
        .await;
    }

    /// Stamps every message sent from now on with `epoch` (v1.5), as an edge acting under
    /// it does.
    pub fn set_epoch(&mut self, epoch: u64) {
        self.framed.codec_mut().set_epoch(epoch);
    }

    /// Refuses the registration.
    pub async fn reject(&mut self, rejection: RegisterRejection) {
        self.send(EdgeFrame::Rejected(rejection)).await;
    }

    /// Sends a run.
    pub async fn run(&mut self, run: RunAssignment) {
        self.send(EdgeFrame::Command(NodeCommand::Run(run))).await;
    }

    /// Sends `frame`.
    pub async fn send(&mut self, frame: EdgeFrame) {
        self.framed.send(frame).await.expect("send to the node");
    }

    /// The next heartbeat that reports availability (skipping events and plain heartbeats).
    pub async fn availability(&mut self) -> Vec<String> {
        loop {
            match self.next().await {
                Heard::Beat(Beat {
                    availability: Some(available),
                    ..
                }) => return available,
                Heard::Closed => panic!("the node closed the connection"),
                _ => {}
            }
        }
    }

    /// The next whole availability report (skipping events and plain heartbeats).
    pub async fn report(&mut self) -> Availability {
        loop {
            match self.next().await {
                Heard::Beat(Beat {
                    report: Some(report),
                    ..
                }) => return report,
                Heard::Closed => panic!("the node closed the connection"),
                _ => {}
            }
        }
    }

    /// Sends a model command.
    pub async fn model_command(&mut self, command: ModelCommand) {
        self.send(EdgeFrame::Command(NodeCommand::Model(command)))
            .await;
    }

    /// The next run event (skipping heartbeats).
    pub async fn event(&mut self) -> ReportedEvent {
        loop {
            match self.next().await {
                Heard::Event(event) => return event,
                Heard::Beat(_) => {}
                other => panic!("expected a run event, got {other:?}"),
            }
        }
    }

    /// Run events until (and with) the first terminal one.
    pub async fn events_until_terminal(&mut self) -> Vec<ReportedEvent> {
        let mut events = Vec::new();
        loop {
            let event = self.event().await;
            let terminal = event.kind.is_terminal();
            events.push(event);
            if terminal {
                return events;
            }
        }
    }
}
