//! The registration policy: whether a node that presented a token may join.
//!
//! [`decide_registration`] is a pure function of the request, the store's answer, the
//! registry's state and the edge's state. It never tells a caller whether a token belongs to
//! some other node: an unknown token and an empty token get the same answer.

use super::node::NodeRecord;
use super::resume::ResumeClaim;
use super::token::Token;

/// The protocol version this edge speaks. A request's `0` is read as `1`.
pub const PROTOCOL_VERSION: u32 = 1;

/// What a node asked for in its RegisterRequest.
#[derive(Debug, Clone)]
pub struct RegisterAttempt {
    /// The presented token.
    pub token: Token,
    /// The id the node believes it has; empty when it did not say.
    pub node_id: String,
    /// The node software's version, for logs.
    pub node_version: String,
    /// The protocol version the node speaks (`0` means `1`).
    pub protocol_version: u32,
    /// The adapters the node reports it can run, for logs.
    pub adapters: Vec<String>,
    /// Random per node process start; empty from a node that does not send one.
    pub instance_id: String,
    /// The runs the node still holds after a reconnect.
    pub resume: Vec<ResumeClaim>,
}

/// Why a registration is refused; each maps to one protocol `RegisterError`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, thiserror::Error)]
pub enum RegisterRejection {
    /// The token is empty or belongs to no node.
    #[error("invalid token")]
    InvalidToken,
    /// The request named a node id that is not the token's node.
    #[error("node_id does not match the token's node")]
    NodeIdMismatch,
    /// The token's node already has a live connection.
    #[error("node is already connected")]
    AlreadyConnected,
    /// The node speaks a protocol version this edge does not.
    #[error("unsupported protocol version (this edge speaks 1)")]
    UnsupportedProtocol,
    /// The edge is draining and takes no new nodes.
    #[error("edge is shutting down")]
    ShuttingDown,
    /// The node broke the protocol (its first message was not a registration, or it
    /// registered twice).
    #[error("protocol violation: the first message must be a register request")]
    ProtocolViolation,
}

impl RegisterRejection {
    /// Every rejection, for metrics that pre-declare their label values.
    pub const ALL: [RegisterRejection; 6] = [
        Self::InvalidToken,
        Self::NodeIdMismatch,
        Self::AlreadyConnected,
        Self::UnsupportedProtocol,
        Self::ShuttingDown,
        Self::ProtocolViolation,
    ];

    /// A stable snake_case name for logs and metric labels.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::InvalidToken => "invalid_token",
            Self::NodeIdMismatch => "node_id_mismatch",
            Self::AlreadyConnected => "already_connected",
            Self::UnsupportedProtocol => "unsupported_protocol",
            Self::ShuttingDown => "shutting_down",
            Self::ProtocolViolation => "protocol_violation",
        }
    }
}

/// The outcome of a registration attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RegistrationDecision<'a> {
    /// Admit the node described by this record.
    Accept(&'a NodeRecord),
    /// Refuse it with this reason, then close the connection.
    Reject(RegisterRejection),
}

/// Decides a registration.
///
/// `found` is the store's answer for the presented token (already compared in constant
/// time), `already_connected` whether the registry holds a live connection for that record's
/// node, and `draining` whether the edge is shutting down. Checks run in this order:
/// protocol version, draining, token, node id, live connection.
pub fn decide_registration<'a>(
    attempt: &RegisterAttempt,
    found: Option<&'a NodeRecord>,
    already_connected: bool,
    draining: bool,
) -> RegistrationDecision<'a> {
    use RegistrationDecision::{Accept, Reject};
    if !matches!(attempt.protocol_version, 0 | PROTOCOL_VERSION) {
        return Reject(RegisterRejection::UnsupportedProtocol);
    }
    if draining {
        return Reject(RegisterRejection::ShuttingDown);
    }
    let record = match found {
        Some(record) if !attempt.token.is_empty() => record,
        _ => return Reject(RegisterRejection::InvalidToken),
    };
    if !attempt.node_id.is_empty() && attempt.node_id != record.id().as_str() {
        return Reject(RegisterRejection::NodeIdMismatch);
    }
    if already_connected {
        return Reject(RegisterRejection::AlreadyConnected);
    }
    Accept(record)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::definitions::{AdapterDefinition, NodeDefinition, validate_definitions};

    fn record() -> NodeRecord {
        let definition = NodeDefinition {
            id: "node-a".into(),
            alias: "gpu-a".into(),
            token: Some(Token::new("secret")),
            adapters: vec![AdapterDefinition {
                name: "echo".into(),
                targets: vec!["default".into()],
                ..Default::default()
            }],
            max_concurrent_runs: 1,
            heartbeat_interval_ms: 1000,
            ..Default::default()
        };
        validate_definitions(&[definition]).unwrap().remove(0)
    }

    fn attempt(token: &str, node_id: &str, protocol_version: u32) -> RegisterAttempt {
        RegisterAttempt {
            token: Token::new(token),
            node_id: node_id.into(),
            node_version: "test".into(),
            protocol_version,
            adapters: vec![],
            instance_id: String::new(),
            resume: vec![],
        }
    }

    #[test]
    fn accepts_a_known_token_with_or_without_node_id() {
        let record = record();
        for node_id in ["", "node-a"] {
            for version in [0, 1] {
                assert_eq!(
                    decide_registration(
                        &attempt("secret", node_id, version),
                        Some(&record),
                        false,
                        false
                    ),
                    RegistrationDecision::Accept(&record)
                );
            }
        }
    }

    #[test]
    fn rejects_every_failing_case_with_its_reason() {
        let record = record();
        let reject = RegistrationDecision::Reject;
        assert_eq!(
            decide_registration(&attempt("nope", "", 1), None, false, false),
            reject(RegisterRejection::InvalidToken)
        );
        assert_eq!(
            decide_registration(&attempt("", "", 1), Some(&record), false, false),
            reject(RegisterRejection::InvalidToken)
        );
        assert_eq!(
            decide_registration(&attempt("secret", "node-b", 1), Some(&record), false, false),
            reject(RegisterRejection::NodeIdMismatch)
        );
        assert_eq!(
            decide_registration(&attempt("secret", "", 1), Some(&record), true, false),
            reject(RegisterRejection::AlreadyConnected)
        );
        assert_eq!(
            decide_registration(&attempt("secret", "", 2), Some(&record), false, false),
            reject(RegisterRejection::UnsupportedProtocol)
        );
        assert_eq!(
            decide_registration(&attempt("secret", "", 1), Some(&record), false, true),
            reject(RegisterRejection::ShuttingDown)
        );
    }

    #[test]
    fn an_unknown_token_and_another_nodes_id_look_alike() {
        // A caller who guesses a node id with a wrong token learns nothing about that node.
        assert_eq!(
            decide_registration(&attempt("wrong", "node-a", 1), None, true, false),
            decide_registration(&attempt("wrong", "", 1), None, false, false),
        );
    }
}
