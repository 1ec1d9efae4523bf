//! Conversions between protobuf messages and the frames the edge and nodes work with.
//!
//! Every message is destructured exhaustively, so a field added to the `.proto` file is a
//! compile error here rather than a silently dropped value.

use std::collections::BTreeMap;
use std::sync::Arc;

use crate::domain::{
    AdapterName, NodeRecord, RegisterAttempt, RegisterRejection, RunEventKind, RunId, Target,
    Token, Usage,
};
use crate::ports::{NodeCommand, ReportedEvent, RunAssignment};

use super::config_payload::build_config_payload;
use super::proto::{self, edge_message, node_message, run_event};

/// A message a node sends.
#[derive(Debug, Clone)]
pub enum NodeFrame {
    /// `RegisterRequest`.
    Register(RegisterAttempt),
    /// `Heartbeat`.
    Heartbeat {
        /// Runs the node is working on.
        active_runs: u32,
    },
    /// `RunEvent`.
    RunEvent(ReportedEvent),
    /// A message with no body, or a run event of a kind this edge does not know (a newer
    /// node's addition). It counts as liveness and is otherwise ignored.
    Unknown,
}

/// A message the edge sends.
#[derive(Debug, Clone)]
pub enum EdgeFrame {
    /// `RegisterResponse` accepting the node, carrying its config.
    Accepted(Arc<NodeRecord>),
    /// `RegisterResponse` refusing the node.
    Rejected(RegisterRejection),
    /// `RunRequest`, `CancelRun` or `Shutdown`.
    Command(NodeCommand),
}

/// A message from the edge as a node reads it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReceivedEdgeFrame {
    /// `RegisterResponse`.
    Registered(RegisterOutcome),
    /// `RunRequest`, `CancelRun` or `Shutdown`.
    Command(NodeCommand),
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
                } = request;
                NodeFrame::Register(RegisterAttempt {
                    token: Token::new(token),
                    node_id,
                    node_version,
                    protocol_version,
                    adapters,
                })
            }
            Some(node_message::Body::Heartbeat(proto::Heartbeat { active_runs })) => {
                NodeFrame::Heartbeat { active_runs }
            }
            Some(node_message::Body::RunEvent(proto::RunEvent { run_id, seq, kind })) => {
                match kind.map(event_kind_from_wire) {
                    Some(kind) => NodeFrame::RunEvent(ReportedEvent { run_id, seq, kind }),
                    None => NodeFrame::Unknown,
                }
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
            }) => Some(node_message::Body::Register(proto::RegisterRequest {
                token: token.expose_secret().to_owned(),
                node_id,
                node_version,
                protocol_version,
                adapters,
            })),
            NodeFrame::Heartbeat { active_runs } => {
                Some(node_message::Body::Heartbeat(proto::Heartbeat {
                    active_runs,
                }))
            }
            NodeFrame::RunEvent(ReportedEvent { run_id, seq, kind }) => {
                Some(node_message::Body::RunEvent(proto::RunEvent {
                    run_id,
                    seq,
                    kind: Some(event_kind_to_wire(kind)),
                }))
            }
            NodeFrame::Unknown => None,
        };
        proto::NodeMessage { body }
    }
}

fn event_kind_from_wire(kind: run_event::Kind) -> RunEventKind {
    match kind {
        run_event::Kind::Started(proto::RunStarted {}) => RunEventKind::Started,
        run_event::Kind::Output(proto::RunOutput { text, data }) => {
            RunEventKind::Output { text, data }
        }
        run_event::Kind::Completed(proto::RunCompleted {
            finish_reason,
            usage,
        }) => RunEventKind::Completed {
            finish_reason,
            usage: usage.map(
                |proto::Usage {
                     input_tokens,
                     output_tokens,
                 }| Usage {
                    input_tokens,
                    output_tokens,
                },
            ),
        },
        run_event::Kind::Failed(proto::RunFailed { code, message }) => {
            RunEventKind::Failed { code, message }
        }
        run_event::Kind::Cancelled(proto::RunCancelled { reason }) => {
            RunEventKind::Cancelled { reason }
        }
    }
}

fn event_kind_to_wire(kind: RunEventKind) -> run_event::Kind {
    match kind {
        RunEventKind::Started => run_event::Kind::Started(proto::RunStarted {}),
        RunEventKind::Output { text, data } => {
            run_event::Kind::Output(proto::RunOutput { text, data })
        }
        RunEventKind::Completed {
            finish_reason,
            usage,
        } => run_event::Kind::Completed(proto::RunCompleted {
            finish_reason,
            usage: usage.map(
                |Usage {
                     input_tokens,
                     output_tokens,
                 }| proto::Usage {
                    input_tokens,
                    output_tokens,
                },
            ),
        }),
        RunEventKind::Failed { code, message } => {
            run_event::Kind::Failed(proto::RunFailed { code, message })
        }
        RunEventKind::Cancelled { reason } => {
            run_event::Kind::Cancelled(proto::RunCancelled { reason })
        }
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
            EdgeFrame::Accepted(record) => edge_message::Body::Register(proto::RegisterResponse {
                accepted: true,
                error: proto::RegisterError::Unspecified.into(),
                message: "registered".into(),
                node_id: record.id().to_string(),
                alias: record.alias().to_string(),
                config: Some(build_config_payload(&record)),
            }),
            EdgeFrame::Rejected(rejection) => {
                edge_message::Body::Register(proto::RegisterResponse {
                    accepted: false,
                    error: rejection_to_wire(rejection).into(),
                    message: rejection.to_string(),
                    node_id: String::new(),
                    alias: String::new(),
                    config: None,
                })
            }
            EdgeFrame::Command(command) => command_to_wire(command),
        };
        proto::EdgeMessage { body: Some(body) }
    }
}

fn command_to_wire(command: NodeCommand) -> edge_message::Body {
    match command {
        NodeCommand::Run(RunAssignment {
            run_id,
            adapter,
            target,
            input,
            content_type,
            params,
            deadline_ms,
        }) => edge_message::Body::Run(proto::RunRequest {
            run_id: run_id.to_string(),
            adapter: adapter.to_string(),
            target: target.to_string(),
            input,
            content_type,
            params: params.into_iter().collect(),
            deadline_ms,
        }),
        NodeCommand::Cancel { run_id, reason } => edge_message::Body::Cancel(proto::CancelRun {
            run_id: run_id.to_string(),
            reason,
        }),
        NodeCommand::Shutdown { reason } => {
            edge_message::Body::Shutdown(proto::Shutdown { reason })
        }
    }
}

impl From<proto::EdgeMessage> for ReceivedEdgeFrame {
    fn from(message: proto::EdgeMessage) -> Self {
        let proto::EdgeMessage { body } = message;
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
            None => ReceivedEdgeFrame::Unknown,
        }
    }
}

fn run_from_wire(request: proto::RunRequest) -> Option<RunAssignment> {
    let proto::RunRequest {
        run_id,
        adapter,
        target,
        input,
        content_type,
        params,
        deadline_ms,
    } = request;
    Some(RunAssignment {
        run_id: RunId::new(run_id),
        adapter: AdapterName::parse(&adapter).ok()?,
        target: Target::parse(&target).ok()?,
        input,
        content_type,
        params: params.into_iter().collect(),
        deadline_ms,
    })
}

fn outcome_from_wire(response: proto::RegisterResponse) -> RegisterOutcome {
    let proto::RegisterResponse {
        accepted,
        error,
        message,
        node_id,
        alias,
        config,
    } = response;
    RegisterOutcome {
        accepted,
        rejection: rejection_from_wire(error),
        message,
        node_id,
        alias,
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
