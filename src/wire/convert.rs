//! Conversions between protobuf messages and the frames the edge and nodes work with.
//!
//! Every message is destructured exhaustively, so a field added to the `.proto` file is a
//! compile error here rather than a silently dropped value.

use std::collections::BTreeMap;
use std::sync::Arc;

use crate::domain::{
    AdapterName, Availability, DeclaredOperations, Inventory, NodeRecord, RegisterAttempt,
    RegisterRejection, ResumeAnswer, ResumeClaim, ResumeRefusal, RunId, Target, Token,
};
use crate::ports::{ModelOutcome, NodeCommand, ReportedEvent};

use super::config_payload::build_config_payload;
use super::events::{
    event_kind_from_wire, event_kind_to_wire, operation_from_wire, operation_to_wire,
    run_from_wire, run_to_wire,
};
use super::fit::{inventory_from_wire, inventory_to_wire};
use super::models::{
    adapter_from_wire, model_command_from_wire, model_command_to_wire, outcome_of_model_from_wire,
    outcome_of_model_to_wire, states_to_wire,
};
use super::proto::{self, edge_message, node_message};

/// A message a node sends.
#[derive(Debug, Clone)]
pub enum NodeFrame {
    /// `RegisterRequest`.
    Register(RegisterAttempt),
    /// `Heartbeat`.
    Heartbeat {
        /// Runs the node is working on.
        active_runs: u32,
        /// Not 0: the node wants a `HeartbeatAck` carrying it.
        ping: u64,
        /// The targets the node can serve now, when it reports them.
        availability: Option<Availability>,
        /// The node's devices as measured now, when it reports them (v1.7).
        inventory: Option<Inventory>,
    },
    /// `RunEvent`.
    RunEvent(ReportedEvent),
    /// `ModelOutcome`.
    ModelOutcome(ModelOutcome),
    /// A message with no body, or a run event of a kind this edge does not know (a newer
    /// node's addition). It counts as liveness and is otherwise ignored.
    Unknown,
}

/// A message the edge sends.
#[derive(Debug, Clone)]
pub enum EdgeFrame {
    /// `RegisterResponse` accepting the node, carrying its config and the answers to its
    /// resume claims.
    Accepted {
        /// The node's definition, from which the one mapper builds its config.
        record: Arc<NodeRecord>,
        /// One answer per resume claim.
        resumed: Vec<ResumeAnswer>,
        /// Whether this edge answers every ping on the connection (`acknowledges_pings`).
        acknowledges_pings: bool,
    },
    /// `RegisterResponse` refusing the node.
    Rejected(RegisterRejection),
    /// `RegisterResponse` refusing the node because this edge is a standby member of its
    /// site (v1.5): `SHUTTING_DOWN`, which every node retries, with the node address of the
    /// member that acts when this one knows it.
    StandingBy {
        /// The active member's node address (`HOST:PORT`), when known.
        active_edge: Option<String>,
        /// Why, for humans.
        message: String,
    },
    /// `RunRequest`, `CancelRun` or `Shutdown`.
    Command(NodeCommand),
    /// `HeartbeatAck`, answering a heartbeat's `ping`.
    HeartbeatAck {
        /// The heartbeat's `ping`.
        ping: u64,
    },
}

/// A message from the edge as a node reads it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReceivedEdgeFrame {
    /// `RegisterResponse`.
    Registered(RegisterOutcome),
    /// `RunRequest`, `CancelRun` or `Shutdown`.
    Command(NodeCommand),
    /// `HeartbeatAck`.
    HeartbeatAck {
        /// The `ping` of the heartbeat it answers.
        ping: u64,
    },
    /// A message with no body, or one this node cannot read.
    Unknown,
}

/// A `RegisterResponse` as a node reads it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RegisterOutcome {
    /// Whether the edge admitted the node.
    pub accepted: bool,
    /// Why not, when it did not.
    pub rejection: Option<RegisterRejection>,
    /// A human-readable explanation.
    pub message: String,
    /// The node's id, when accepted.
    pub node_id: String,
    /// The node's alias, when accepted.
    pub alias: String,
    /// The node's central config, when accepted.
    pub config: Option<ReceivedConfig>,
    /// The edge's answers to the node's resume claims, when accepted.
    pub resumed: Vec<ResumeAnswer>,
    /// Whether the edge said it answers every ping (v1.2; false from older edges).
    pub acknowledges_pings: bool,
    /// When a standby member refused the node: the node address of the member that acts,
    /// when it named one (v1.5; `None` from older edges).
    pub active_edge: Option<String>,
}

/// A node's central config as the node reads it.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ReceivedConfig {
    /// The adapters to run.
    pub adapters: Vec<ReceivedAdapter>,
    /// `runtime.max_concurrent_runs`.
    pub max_concurrent_runs: u32,
    /// `runtime.heartbeat_interval_ms`.
    pub heartbeat_interval_ms: u32,
    /// `runtime.settings`.
    pub runtime_settings: BTreeMap<String, String>,
}

/// One adapter of a [`ReceivedConfig`].
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ReceivedAdapter {
    /// The adapter's name.
    pub name: String,
    /// The targets it serves.
    pub targets: Vec<String>,
    /// Its settings.
    pub settings: BTreeMap<String, String>,
}

impl From<proto::NodeMessage> for NodeFrame {
    fn from(message: proto::NodeMessage) -> Self {
        let proto::NodeMessage { body } = message;
        match body {
            Some(node_message::Body::Register(request)) => {
                let proto::RegisterRequest {
                    token,
                    node_id,
                    node_version,
                    protocol_version,
                    adapters,
                    instance_id,
                    resume,
                    can_continue,
                    operations,
                    can_manage_models,
                    inventory,
                } = request;
                NodeFrame::Register(RegisterAttempt {
                    token: Token::new(token),
                    node_id,
                    node_version,
                    protocol_version,
                    adapters,
                    instance_id,
                    resume: resume.into_iter().map(claim_from_wire).collect(),
                    can_continue,
                    // An operation this edge does not know is left out: it sends none.
                    operations: DeclaredOperations::new(
                        operations.into_iter().map(operation_from_wire),
                    ),
                    can_manage_models,
                    inventory: inventory.map(inventory_from_wire),
                })
            }
            Some(node_message::Body::Heartbeat(proto::Heartbeat {
                active_runs,
                ping,
                availability,
                inventory,
            })) => NodeFrame::Heartbeat {
                active_runs,
                ping,
                availability: availability.map(availability_from_wire),
                inventory: inventory.map(inventory_from_wire),
            },
            Some(node_message::Body::RunEvent(proto::RunEvent { run_id, seq, kind })) => {
                match kind.map(event_kind_from_wire) {
                    Some(kind) => NodeFrame::RunEvent(ReportedEvent { run_id, seq, kind }),
                    None => NodeFrame::Unknown,
                }
            }
            Some(node_message::Body::ModelOutcome(outcome)) => {
                NodeFrame::ModelOutcome(outcome_of_model_from_wire(outcome))
            }
            None => NodeFrame::Unknown,
        }
    }
}

impl From<NodeFrame> for proto::NodeMessage {
    fn from(frame: NodeFrame) -> Self {
        let body = match frame {
            NodeFrame::Register(RegisterAttempt {
                token,
                node_id,
                node_version,
                protocol_version,
                adapters,
                instance_id,
                resume,
                can_continue,
                operations,
                can_manage_models,
                inventory,
            }) => Some(node_message::Body::Register(proto::RegisterRequest {
                token: token.expose_secret().to_owned(),
                node_id,
                node_version,
                protocol_version,
                adapters,
                instance_id,
                resume: resume.into_iter().map(claim_to_wire).collect(),
                can_continue,
                operations: operations
                    .operations()
                    .into_iter()
                    .map(|operation| operation_to_wire(operation).into())
                    .collect(),
                can_manage_models,
                inventory: inventory.map(inventory_to_wire),
            })),
            NodeFrame::Heartbeat {
                active_runs,
                ping,
                availability,
                inventory,
            } => Some(node_message::Body::Heartbeat(proto::Heartbeat {
                active_runs,
                ping,
                availability: availability.map(availability_to_wire),
                inventory: inventory.map(inventory_to_wire),
            })),
            NodeFrame::RunEvent(ReportedEvent { run_id, seq, kind }) => {
                Some(node_message::Body::RunEvent(proto::RunEvent {
                    run_id,
                    seq,
                    kind: Some(event_kind_to_wire(kind)),
                }))
            }
            NodeFrame::ModelOutcome(outcome) => Some(node_message::Body::ModelOutcome(
                outcome_of_model_to_wire(outcome),
            )),
            NodeFrame::Unknown => None,
        };
        proto::NodeMessage { body }
    }
}

fn rejection_to_wire(rejection: RegisterRejection) -> proto::RegisterError {
    match rejection {
        RegisterRejection::InvalidToken => proto::RegisterError::InvalidToken,
        RegisterRejection::NodeIdMismatch => proto::RegisterError::NodeIdMismatch,
        RegisterRejection::AlreadyConnected => proto::RegisterError::AlreadyConnected,
        RegisterRejection::UnsupportedProtocol => proto::RegisterError::UnsupportedProtocol,
        RegisterRejection::ShuttingDown => proto::RegisterError::ShuttingDown,
        RegisterRejection::ProtocolViolation => proto::RegisterError::ProtocolViolation,
    }
}

fn rejection_from_wire(error: i32) -> Option<RegisterRejection> {
    match proto::RegisterError::try_from(error).ok()? {
        proto::RegisterError::Unspecified => None,
        proto::RegisterError::InvalidToken => Some(RegisterRejection::InvalidToken),
        proto::RegisterError::NodeIdMismatch => Some(RegisterRejection::NodeIdMismatch),
        proto::RegisterError::AlreadyConnected => Some(RegisterRejection::AlreadyConnected),
        proto::RegisterError::UnsupportedProtocol => Some(RegisterRejection::UnsupportedProtocol),
        proto::RegisterError::ShuttingDown => Some(RegisterRejection::ShuttingDown),
        proto::RegisterError::ProtocolViolation => Some(RegisterRejection::ProtocolViolation),
    }
}

impl From<EdgeFrame> for proto::EdgeMessage {
    fn from(frame: EdgeFrame) -> Self {
        let body = match frame {
            EdgeFrame::Accepted {
                record,
                resumed,
                acknowledges_pings,
            } => edge_message::Body::Register(proto::RegisterResponse {
                accepted: true,
                error: proto::RegisterError::Unspecified.into(),
                message: "registered".into(),
                node_id: record.id().to_string(),
                alias: record.alias().to_string(),
                config: Some(build_config_payload(&record)),
                resumed: resumed.into_iter().map(answer_to_wire).collect(),
                acknowledges_pings,
                active_edge: String::new(),
            }),
            EdgeFrame::Rejected(rejection) => {
                edge_message::Body::Register(proto::RegisterResponse {
                    accepted: false,
                    error: rejection_to_wire(rejection).into(),
                    message: rejection.to_string(),
                    node_id: String::new(),
                    alias: String::new(),
                    config: None,
                    resumed: Vec::new(),
                    acknowledges_pings: false,
                    active_edge: String::new(),
                })
            }
            EdgeFrame::StandingBy {
                active_edge,
                message,
            } => edge_message::Body::Register(proto::RegisterResponse {
                accepted: false,
                error: proto::RegisterError::ShuttingDown.into(),
                message,
                node_id: String::new(),
                alias: String::new(),
                config: None,
                resumed: Vec::new(),
                acknowledges_pings: false,
                active_edge: active_edge.unwrap_or_default(),
            }),
            EdgeFrame::Command(command) => command_to_wire(command),
            EdgeFrame::HeartbeatAck { ping } => {
                edge_message::Body::HeartbeatAck(proto::HeartbeatAck { ping })
            }
        };
        // The epoch is the codec's to stamp (`EdgeCodec::set_epoch`).
        proto::EdgeMessage {
            body: Some(body),
            epoch: 0,
        }
    }
}

fn command_to_wire(command: NodeCommand) -> edge_message::Body {
    match command {
        NodeCommand::Run(run) => edge_message::Body::Run(run_to_wire(run)),
        NodeCommand::Cancel { run_id, reason } => edge_message::Body::Cancel(proto::CancelRun {
            run_id: run_id.to_string(),
            reason,
        }),
        NodeCommand::Shutdown { reason } => {
            edge_message::Body::Shutdown(proto::Shutdown { reason })
        }
        NodeCommand::Model(command) => edge_message::Body::Model(model_command_to_wire(command)),
    }
}

impl From<proto::EdgeMessage> for ReceivedEdgeFrame {
    fn from(message: proto::EdgeMessage) -> Self {
        received_from_wire(message).1
    }
}

/// A message from the edge as a node reads it, with the epoch it was sent under.
pub(super) fn received_from_wire(message: proto::EdgeMessage) -> (u64, ReceivedEdgeFrame) {
    let proto::EdgeMessage { body, epoch } = message;
    (epoch, received_body(body))
}

fn received_body(body: Option<edge_message::Body>) -> ReceivedEdgeFrame {
    match body {
        Some(edge_message::Body::Register(response)) => {
            ReceivedEdgeFrame::Registered(outcome_from_wire(response))
        }
        Some(edge_message::Body::Run(request)) => run_from_wire(request)
            .map_or(ReceivedEdgeFrame::Unknown, |run| {
                ReceivedEdgeFrame::Command(NodeCommand::Run(run))
            }),
        Some(edge_message::Body::Cancel(proto::CancelRun { run_id, reason })) => {
            ReceivedEdgeFrame::Command(NodeCommand::Cancel {
                run_id: RunId::new(run_id),
                reason,
            })
        }
        Some(edge_message::Body::Shutdown(proto::Shutdown { reason })) => {
            ReceivedEdgeFrame::Command(NodeCommand::Shutdown { reason })
        }
        Some(edge_message::Body::HeartbeatAck(proto::HeartbeatAck { ping })) => {
            ReceivedEdgeFrame::HeartbeatAck { ping }
        }
        Some(edge_message::Body::Model(command)) => model_command_from_wire(command)
            .map_or(ReceivedEdgeFrame::Unknown, |command| {
                ReceivedEdgeFrame::Command(NodeCommand::Model(command))
            }),
        None => ReceivedEdgeFrame::Unknown,
    }
}

fn outcome_from_wire(response: proto::RegisterResponse) -> RegisterOutcome {
    let proto::RegisterResponse {
        accepted,
        error,
        message,
        node_id,
        alias,
        config,
        resumed,
        acknowledges_pings,
        active_edge,
    } = response;
    RegisterOutcome {
        accepted,
        acknowledges_pings,
        active_edge: (!active_edge.is_empty()).then_some(active_edge),
        rejection: rejection_from_wire(error),
        message,
        node_id,
        alias,
        resumed: resumed.into_iter().map(answer_from_wire).collect(),
        config: config.map(|proto::NodeConfigPayload { adapters, runtime }| {
            let proto::RuntimeConfig {
                max_concurrent_runs,
                heartbeat_interval_ms,
                settings,
            } = runtime.unwrap_or_default();
            ReceivedConfig {
                adapters: adapters
                    .into_iter()
                    .map(
                        |proto::AdapterConfig {
                             name,
                             targets,
                             settings,
                         }| ReceivedAdapter {
                            name,
                            targets,
                            settings: settings.into_iter().collect(),
                        },
                    )
                    .collect(),
                max_concurrent_runs,
                heartbeat_interval_ms,
                runtime_settings: settings.into_iter().collect(),
            }
        }),
    }
}

fn claim_from_wire(claim: proto::ResumeClaim) -> ResumeClaim {
    let proto::ResumeClaim {
        run_id,
        next_seq,
        first_buffered_seq,
    } = claim;
    ResumeClaim {
        run_id,
        next_seq,
        first_buffered_seq,
    }
}

fn claim_to_wire(claim: ResumeClaim) -> proto::ResumeClaim {
    let ResumeClaim {
        run_id,
        next_seq,
        first_buffered_seq,
    } = claim;
    proto::ResumeClaim {
        run_id,
        next_seq,
        first_buffered_seq,
    }
}

fn answer_to_wire(answer: ResumeAnswer) -> proto::ResumeAnswer {
    let ResumeAnswer { run_id, outcome } = answer;
    match outcome {
        Ok(resume_from_seq) => proto::ResumeAnswer {
            run_id,
            accepted: true,
            resume_from_seq,
            reason: String::new(),
        },
        Err(refusal) => proto::ResumeAnswer {
            run_id,
            accepted: false,
            resume_from_seq: 0,
            reason: refusal.as_str().to_owned(),
        },
    }
}

/// A node reads a refusal's reason as text only; the edge's [`ResumeRefusal`] codes are
/// matched back where they are known.
fn answer_from_wire(answer: proto::ResumeAnswer) -> ResumeAnswer {
    let proto::ResumeAnswer {
        run_id,
        accepted,
        resume_from_seq,
        reason,
    } = answer;
    let outcome = if accepted {
        Ok(resume_from_seq)
    } else {
        Err(ResumeRefusal::from_code(&reason))
    };
    ResumeAnswer { run_id, outcome }
}

/// Pairs whose adapter or target is not a valid name are left out: no run can ask for them;
/// so is the window of a target the adapter does not list. A managed adapter's states of
/// unlisted targets carry their load state.
fn availability_from_wire(availability: proto::TargetAvailability) -> Availability {
    let proto::TargetAvailability { adapters } = availability;
    let mut windows = Vec::new();
    let mut managed = Vec::new();
    let mut pairs: Vec<(AdapterName, Target)> = Vec::new();
    for entry in adapters {
        let Ok(adapter) = AdapterName::parse(&entry.adapter) else {
            continue;
        };
        let report = adapter_from_wire(entry);
        for (target, window) in report.windows {
            windows.push((adapter.clone(), target, window));
        }
        if let Some(lifecycle) = report.managed {
            managed.push((adapter.clone(), lifecycle));
        }
        pairs.extend(report.targets.into_iter().map(|t| (adapter.clone(), t)));
    }
    let availability = windows.into_iter().fold(
        Availability::new(pairs),
        |availability, (adapter, target, tokens)| {
            availability.with_context_window(&adapter, &target, tokens)
        },
    );
    managed
        .into_iter()
        .fold(availability, |availability, (adapter, lifecycle)| {
            availability.with_managed(adapter, lifecycle)
        })
}

fn availability_to_wire(availability: Availability) -> proto::TargetAvailability {
    let mut adapters: Vec<proto::AdapterTargets> = Vec::new();
    for (adapter, target) in availability.pairs() {
        match adapters.last_mut() {
            Some(last) if last.adapter == adapter.as_str() => {
                last.targets.push(target.to_string());
            }
            _ => adapters.push(proto::AdapterTargets {
                adapter: adapter.to_string(),
                targets: vec![target.to_string()],
                ..proto::AdapterTargets::default()
            }),
        }
    }
    for (adapter, _) in availability.managed_adapters() {
        if !adapters.iter().any(|a| a.adapter == adapter.as_str()) {
            adapters.push(proto::AdapterTargets {
                adapter: adapter.to_string(),
                ..proto::AdapterTargets::default()
            });
        }
    }
    for entry in &mut adapters {
        states_to_wire(entry, &availability);
    }
    proto::TargetAvailability { adapters }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resume_answers_round_trip() {
        let answers = [
            ResumeAnswer {
                run_id: "r1".into(),
                outcome: Ok(5),
            },
            ResumeAnswer {
                run_id: "r2".into(),
                outcome: Err(ResumeRefusal::EventsLost),
            },
            ResumeAnswer {
                run_id: "r3".into(),
                outcome: Err(ResumeRefusal::SequenceBehind),
            },
            ResumeAnswer {
                run_id: "r4".into(),
                outcome: Err(ResumeRefusal::UnknownRun),
            },
            ResumeAnswer {
                run_id: "r5".into(),
                outcome: Err(ResumeRefusal::Disabled),
            },
        ];
        for answer in answers {
            assert_eq!(answer_from_wire(answer_to_wire(answer.clone())), answer);
        }
    }

    #[test]
    fn unknown_availability_names_are_left_out() {
        let wire = proto::TargetAvailability {
            adapters: vec![
                proto::AdapterTargets {
                    adapter: "openai".into(),
                    targets: vec!["qwen".into(), "bad target!".into()],
                    states: vec![
                        proto::TargetState {
                            target: "qwen".into(),
                            context_window: 32_768,
                            ..proto::TargetState::default()
                        },
                        // Not listed: not available, so no window either.
                        proto::TargetState {
                            target: "llama".into(),
                            context_window: 8_192,
                            ..proto::TargetState::default()
                        },
                    ],
                    ..proto::AdapterTargets::default()
                },
                proto::AdapterTargets {
                    adapter: "".into(),
                    targets: vec!["x".into()],
                    ..proto::AdapterTargets::default()
                },
            ],
        };
        let availability = availability_from_wire(wire);
        assert_eq!(availability.pairs().len(), 1);
        let (openai, qwen) = &availability.pairs()[0];
        assert_eq!(availability.context_window(openai, qwen), Some(32_768));
        let llama = Target::parse("llama").unwrap();
        assert_eq!(availability.context_window(openai, &llama), None);
        let back = availability_to_wire(availability);
        assert_eq!(back.adapters.len(), 1);
        assert_eq!(back.adapters[0].targets, vec!["qwen".to_owned()]);
        assert_eq!(back.adapters[0].states.len(), 1);
        assert_eq!(back.adapters[0].states[0].context_window, 32_768);
    }
}
