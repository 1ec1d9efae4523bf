//! The registration policy: whether a node that presented a token may join, and whether it
//! takes over the node's live connection.
//!
//! [`decide_registration`] is a pure function of the request, the store's answer, the
//! registry's view of the node's live connection, the edge's state and `now`. It never tells
//! a caller whether a token belongs to some other node: an unknown token and an empty token
//! get the same answer.

use std::time::Instant;

use super::inventory::Inventory;
use super::node::NodeRecord;
use super::operation::DeclaredOperations;
use super::resume::ResumeClaim;
use super::token::Token;

/// The protocol version this edge speaks. A request's `0` is read as `1`.
pub const PROTOCOL_VERSION: u32 = 1;

/// Heartbeat intervals a live connection must have been silent before another instance of
/// its node may take it over as presumed dead. Two, not one: a healthy node's frames are up
/// to one interval apart (plus timer and network jitter), so "silent for one interval" is
/// true of a healthy idle node for a moment every interval; silence past two means it
/// missed a whole heartbeat. (The edge closes it after three, `MISSED_HEARTBEATS`.)
pub const PRESUMED_DEAD_AFTER_INTERVALS: u32 = 2;

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
    /// The node can carry on runs another node began (`can_continue`); false from a v1 node.
    pub can_continue: bool,
    /// The operations needing a declaration that the node serves.
    pub operations: DeclaredOperations,
    /// The node obeys model commands for the adapters it reports managed
    /// (`can_manage_models`); false from an older node.
    pub can_manage_models: bool,
    /// The node's devices and their memory (v1.7); `None` from an older node.
    pub inventory: Option<Inventory>,
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

/// The node's live connection, as the registry sees it when a new registration arrives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LiveConnection<'a> {
    /// The instance id it registered with; empty for a v1 node.
    pub instance_id: &'a str,
    /// When it last sent a frame.
    pub last_frame_at: Instant,
}

/// Why a registration takes over the node's live connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum TakeoverReason {
    /// The same node process (same non-empty instance id) reconnected: its old connection is
    /// half-open, or closed in a way the edge has not processed yet.
    SameInstance,
    /// Another instance, and the live connection has been silent for more than
    /// [`PRESUMED_DEAD_AFTER_INTERVALS`] heartbeat intervals: presumed dead.
    PresumedDead,
}

impl TakeoverReason {
    /// Every reason, for metrics that pre-declare their label values.
    pub const ALL: [TakeoverReason; 2] = [Self::SameInstance, Self::PresumedDead];

    /// A stable snake_case name for logs and metric labels.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::SameInstance => "same_instance",
            Self::PresumedDead => "presumed_dead",
        }
    }
}

/// Why a registration does not take over the node's live connection (answered
/// `ALREADY_CONNECTED`; the live connection stays).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum TakeoverRefusal {
    /// Another instance, and the live connection sent a frame within the last
    /// [`PRESUMED_DEAD_AFTER_INTERVALS`] heartbeat intervals: two processes with one token
    /// must not flap each other.
    OtherInstanceAlive,
    /// The registration carries no instance id (a v1 node), so it can take over nothing.
    NoInstanceId,
    /// Another connection of the node entered the registry between the decision and this
    /// one's entry (never decided by [`decide_registration`]; the registry reports it).
    Raced,
}

impl TakeoverRefusal {
    /// Every reason, for metrics that pre-declare their label values.
    pub const ALL: [TakeoverRefusal; 3] =
        [Self::OtherInstanceAlive, Self::NoInstanceId, Self::Raced];

    /// A stable snake_case name for logs and metric labels.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::OtherInstanceAlive => "other_instance_alive",
            Self::NoInstanceId => "no_instance_id",
            Self::Raced => "raced",
        }
    }
}

/// The outcome of a registration attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RegistrationDecision<'a> {
    /// Admit the node described by this record; it has no live connection.
    Accept(&'a NodeRecord),
    /// Admit the node, closing its live connection (logged as superseded).
    TakeOver(&'a NodeRecord, TakeoverReason),
    /// Refuse it with this reason, then close the connection.
    Reject(RegisterRejection),
    /// Refuse it with `ALREADY_CONNECTED`, keeping the live connection, for this reason.
    KeepLive(TakeoverRefusal),
}

impl RegistrationDecision<'_> {
    /// The refusal the node is answered with, if the decision refuses it.
    pub fn rejection(&self) -> Option<RegisterRejection> {
        match self {
            Self::Accept(_) | Self::TakeOver(..) => None,
            Self::Reject(rejection) => Some(*rejection),
            Self::KeepLive(_) => Some(RegisterRejection::AlreadyConnected),
        }
    }
}

/// Decides a registration.
///
/// `found` is the store's answer for the presented token (already compared in constant
/// time), `live` the registry's view of that record's node's live connection, if it has
/// one, `draining` whether the edge is shutting down, and `now` the time the registration is
/// decided (on the clock `live.last_frame_at` is on). Checks run in this order: protocol
/// version, draining, token, node id, live connection. A live connection is taken over when
/// the registration presents the same non-empty instance id, or another non-empty one while
/// the live connection has been silent for more than [`PRESUMED_DEAD_AFTER_INTERVALS`]
/// heartbeat intervals.
pub fn decide_registration<'a>(
    attempt: &RegisterAttempt,
    found: Option<&'a NodeRecord>,
    live: Option<LiveConnection<'_>>,
    draining: bool,
    now: Instant,
) -> RegistrationDecision<'a> {
    use RegistrationDecision::{Accept, KeepLive, Reject, TakeOver};
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
    let Some(live) = live else {
        return Accept(record);
    };
    if attempt.instance_id.is_empty() {
        return KeepLive(TakeoverRefusal::NoInstanceId);
    }
    if attempt.instance_id == live.instance_id {
        return TakeOver(record, TakeoverReason::SameInstance);
    }
    let silence = now.saturating_duration_since(live.last_frame_at);
    let presumed_dead_after = record.runtime().heartbeat_interval() * PRESUMED_DEAD_AFTER_INTERVALS;
    if silence > presumed_dead_after {
        TakeOver(record, TakeoverReason::PresumedDead)
    } else {
        KeepLive(TakeoverRefusal::OtherInstanceAlive)
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use proptest::prelude::*;

    use super::*;
    use crate::domain::definitions::{AdapterDefinition, NodeDefinition, validate_definitions};

    /// The node's heartbeat interval in the tests.
    const INTERVAL: Duration = Duration::from_millis(1000);

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
            can_continue: false,
            operations: DeclaredOperations::default(),
            can_manage_models: false,
            inventory: None,
        }
    }

    fn from_instance(instance_id: &str) -> RegisterAttempt {
        RegisterAttempt {
            instance_id: instance_id.into(),
            ..attempt("secret", "", 1)
        }
    }

    /// Decides with no live connection and the edge not draining.
    fn decide<'a>(
        attempt: &RegisterAttempt,
        found: Option<&'a NodeRecord>,
    ) -> RegistrationDecision<'a> {
        decide_registration(attempt, found, None, false, Instant::now())
    }

    /// Decides `attempt` for [`record`] while a connection of `instance` that last sent a
    /// frame `silent` ago is live.
    fn against_live<'a>(
        record: &'a NodeRecord,
        attempt: &RegisterAttempt,
        instance: &str,
        silent: Duration,
    ) -> RegistrationDecision<'a> {
        let last_frame_at = Instant::now();
        let live = LiveConnection {
            instance_id: instance,
            last_frame_at,
        };
        decide_registration(
            attempt,
            Some(record),
            Some(live),
            false,
            last_frame_at + silent,
        )
    }

    #[test]
    fn accepts_a_known_token_with_or_without_node_id() {
        let record = record();
        for node_id in ["", "node-a"] {
            for version in [0, 1] {
                assert_eq!(
                    decide(&attempt("secret", node_id, version), Some(&record)),
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
            decide(&attempt("nope", "", 1), None),
            reject(RegisterRejection::InvalidToken)
        );
        assert_eq!(
            decide(&attempt("", "", 1), Some(&record)),
            reject(RegisterRejection::InvalidToken)
        );
        assert_eq!(
            decide(&attempt("secret", "node-b", 1), Some(&record)),
            reject(RegisterRejection::NodeIdMismatch)
        );
        assert_eq!(
            decide(&attempt("secret", "", 2), Some(&record)),
            reject(RegisterRejection::UnsupportedProtocol)
        );
        let draining = decide_registration(
            &attempt("secret", "", 1),
            Some(&record),
            None,
            true,
            Instant::now(),
        );
        assert_eq!(draining, reject(RegisterRejection::ShuttingDown));
    }

    #[test]
    fn a_v1_node_never_takes_over_however_silent_the_live_connection() {
        let record = record();
        let v1 = attempt("secret", "", 1);
        for (instance, silent) in [
            ("", Duration::ZERO),
            ("", 10 * INTERVAL),
            ("i-1", 10 * INTERVAL),
        ] {
            let decision = against_live(&record, &v1, instance, silent);
            assert_eq!(
                decision,
                RegistrationDecision::KeepLive(TakeoverRefusal::NoInstanceId)
            );
            assert_eq!(
                decision.rejection(),
                Some(RegisterRejection::AlreadyConnected)
            );
        }
    }

    #[test]
    fn the_same_instance_takes_over_at_once() {
        let record = record();
        let decision = against_live(&record, &from_instance("i-1"), "i-1", Duration::ZERO);
        assert_eq!(
            decision,
            RegistrationDecision::TakeOver(&record, TakeoverReason::SameInstance)
        );
        assert_eq!(decision.rejection(), None);
    }

    #[test]
    fn another_instance_waits_until_the_live_one_has_missed_a_whole_heartbeat() {
        let record = record();
        let other = from_instance("i-2");
        let keep = RegistrationDecision::KeepLive(TakeoverRefusal::OtherInstanceAlive);
        assert_eq!(against_live(&record, &other, "i-1", Duration::ZERO), keep);
        // A healthy idle node's last frame is up to an interval old, a little more with
        // jitter: still alive.
        let late = INTERVAL + Duration::from_millis(50);
        assert_eq!(against_live(&record, &other, "i-1", late), keep);
        assert_eq!(against_live(&record, &other, "i-1", 2 * INTERVAL), keep);
        assert_eq!(
            against_live(
                &record,
                &other,
                "i-1",
                2 * INTERVAL + Duration::from_millis(1)
            ),
            RegistrationDecision::TakeOver(&record, TakeoverReason::PresumedDead)
        );
        // A v1 connection (no instance) is "another instance" to a v1.1 node.
        assert_eq!(
            against_live(&record, &other, "", 3 * INTERVAL),
            RegistrationDecision::TakeOver(&record, TakeoverReason::PresumedDead)
        );
        assert_eq!(against_live(&record, &other, "", Duration::ZERO), keep);
    }

    #[test]
    fn earlier_checks_win_over_the_live_connection() {
        let record = record();
        let live = LiveConnection {
            instance_id: "i-1",
            last_frame_at: Instant::now(),
        };
        let now = live.last_frame_at;
        let mismatch = RegisterAttempt {
            node_id: "node-b".into(),
            ..from_instance("i-1")
        };
        assert_eq!(
            decide_registration(&mismatch, Some(&record), Some(live), false, now),
            RegistrationDecision::Reject(RegisterRejection::NodeIdMismatch)
        );
        assert_eq!(
            decide_registration(&from_instance("i-1"), Some(&record), Some(live), true, now),
            RegistrationDecision::Reject(RegisterRejection::ShuttingDown)
        );
    }

    #[test]
    fn an_unknown_token_and_another_nodes_id_look_alike() {
        // A caller who guesses a node id with a wrong token learns nothing about that node.
        let live = LiveConnection {
            instance_id: "i-1",
            last_frame_at: Instant::now(),
        };
        let now = live.last_frame_at;
        assert_eq!(
            decide_registration(&attempt("wrong", "node-a", 1), None, Some(live), false, now),
            decide(&attempt("wrong", "", 1), None),
        );
    }

    proptest! {
        /// Whatever the instances and the silence, a takeover happens exactly when the table
        /// in docs/protocol.md says, and a refusal keeps the live connection.
        #[test]
        fn takeover_follows_the_table(
            new in prop_oneof![Just(""), Just("i-1"), Just("i-2")],
            live in prop_oneof![Just(""), Just("i-1"), Just("i-2")],
            silent_ms in 0u64..4_000,
        ) {
            let record = record();
            let decision = against_live(
                &record, &from_instance(new), live, Duration::from_millis(silent_ms),
            );
            let expected = if new.is_empty() {
                RegistrationDecision::KeepLive(TakeoverRefusal::NoInstanceId)
            } else if new == live {
                RegistrationDecision::TakeOver(&record, TakeoverReason::SameInstance)
            } else if silent_ms > 2_000 {
                RegistrationDecision::TakeOver(&record, TakeoverReason::PresumedDead)
            } else {
                RegistrationDecision::KeepLive(TakeoverRefusal::OtherInstanceAlive)
            };
            prop_assert_eq!(decision, expected);
        }
    }
}
