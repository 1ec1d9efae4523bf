//! Failover before the first output: whether a run that ended on one node is placed again
//! on another, and the set of nodes it has tried (never placed on again).
//!
//! The decision here only says "again" or "final"; placing the next attempt is the same
//! `decide` as the first, with [`Tried`] excluding every node already tried.

use std::time::Duration;

use super::breaker::Outcome;
use super::hash::NodeHash;
use crate::domain::event::{EdgeFailure, FailureClass, RunEventKind};
use crate::domain::names::NodeId;

/// How many attempts a run gets in all, the first included (`runs.max_attempts`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct MaxAttempts(u32);

impl MaxAttempts {
    /// The most `runs.max_attempts` may be.
    pub const MAX: u32 = 10;

    /// `n` attempts, 1 (no failover) to [`MaxAttempts::MAX`].
    ///
    /// # Errors
    /// The offending value when it is out of range.
    pub fn new(n: u32) -> Result<Self, u32> {
        if (1..=Self::MAX).contains(&n) {
            Ok(Self(n))
        } else {
            Err(n)
        }
    }

    /// The number.
    pub fn get(self) -> u32 {
        self.0
    }
}

impl Default for MaxAttempts {
    /// 3: the first attempt and two more.
    fn default() -> Self {
        Self(3)
    }
}

/// The nodes a run has been placed on, in order. Its length is the number of attempts made.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Tried {
    nodes: Vec<(NodeHash, NodeId)>,
}

impl Tried {
    /// Records an attempt on `node`.
    pub fn push(&mut self, node: NodeId) {
        self.nodes.push((NodeHash::of(&node), node));
    }

    /// Whether the run was placed on this node before.
    pub fn contains(&self, hash: NodeHash, id: &NodeId) -> bool {
        self.nodes.iter().any(|(h, i)| *h == hash && i == id)
    }

    /// Attempts made.
    pub fn attempts(&self) -> u32 {
        u32::try_from(self.nodes.len()).unwrap_or(u32::MAX)
    }

    /// The nodes tried, oldest first.
    pub fn nodes(&self) -> impl Iterator<Item = &NodeId> {
        self.nodes.iter().map(|(_, id)| id)
    }
}

/// How one attempt ended, as failover and the breaker need to know it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AttemptEnd {
    /// The run completed.
    Completed,
    /// The node failed it with this class.
    Failed(FailureClass),
    /// The node's connection ended while it held the run.
    Disconnected,
    /// The run's deadline passed (the edge ended it).
    DeadlineExceeded,
    /// The caller cancelled it, or the edge ended it for a reason of its own (shutdown).
    Cancelled,
}

impl AttemptEnd {
    /// How a terminal event ends the attempt; `None` for an event that is not terminal.
    pub fn of(kind: &RunEventKind) -> Option<Self> {
        Some(match kind {
            RunEventKind::Completed { .. } => Self::Completed,
            RunEventKind::Cancelled { .. } => Self::Cancelled,
            RunEventKind::Failed { code, class, .. } => {
                if code == EdgeFailure::NodeDisconnected.code() {
                    Self::Disconnected
                } else if code == EdgeFailure::DeadlineExceeded.code() {
                    Self::DeadlineExceeded
                } else if code == EdgeFailure::EdgeShutdown.code() {
                    Self::Cancelled
                } else {
                    Self::Failed(*class)
                }
            }
            RunEventKind::Started | RunEventKind::Output { .. } => return None,
        })
    }

    /// What it tells the node's circuit breaker: only node-class failures and disconnects
    /// count against it; request errors, refusals, cancels, deadlines and unclassified (v1)
    /// failures say nothing about the node.
    pub fn breaker_outcome(self) -> Outcome {
        match self {
            Self::Completed => Outcome::Success,
            Self::Failed(FailureClass::Node) | Self::Disconnected => Outcome::NodeFailure,
            Self::Failed(_) | Self::DeadlineExceeded | Self::Cancelled => Outcome::Neutral,
        }
    }
}

/// What to do with a run whose attempt ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Failover {
    /// Place it again (on a node not yet tried); `attempt` is the next attempt's number.
    Retry {
        /// The attempt about to be made, 2 or more.
        attempt: u32,
    },
    /// Relay the attempt's ending as the run's.
    Final(Because),
}

/// Why an attempt's ending is the run's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Because {
    /// It did not fail (completed), or the caller or the edge ended it.
    NotAFailure,
    /// Output already reached the caller: a second attempt would repeat it.
    OutputSent,
    /// The request itself is bad (class `REQUEST`), or an unclassified (v1) failure.
    NotRetryable,
    /// `runs.max_attempts` attempts were made.
    AttemptsSpent,
    /// Nothing is left of the run's deadline.
    DeadlineSpent,
}

/// Whether a run whose latest attempt ended with `end` gets another attempt.
///
/// `saw_output` says whether any output reached the caller; `tried` holds every attempt
/// made, the one that just ended included; `time_left` is what is left of the deadline
/// (`None`: no deadline).
pub fn after_attempt(
    end: AttemptEnd,
    saw_output: bool,
    tried: &Tried,
    max: MaxAttempts,
    time_left: Option<Duration>,
) -> Failover {
    let retryable = match end {
        AttemptEnd::Failed(FailureClass::Node | FailureClass::Refused)
        | AttemptEnd::Disconnected => true,
        AttemptEnd::Failed(FailureClass::Request | FailureClass::Unspecified) => {
            return Failover::Final(Because::NotRetryable);
        }
        AttemptEnd::Completed | AttemptEnd::Cancelled | AttemptEnd::DeadlineExceeded => false,
    };
    if !retryable {
        Failover::Final(Because::NotAFailure)
    } else if saw_output {
        Failover::Final(Because::OutputSent)
    } else if tried.attempts() >= max.get() {
        Failover::Final(Because::AttemptsSpent)
    } else if time_left.is_some_and(|left| left.is_zero()) {
        Failover::Final(Because::DeadlineSpent)
    } else {
        Failover::Retry {
            attempt: tried.attempts() + 1,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tried(n: usize) -> Tried {
        let mut tried = Tried::default();
        for i in 0..n {
            tried.push(NodeId::parse(&format!("n{i}")).unwrap());
        }
        tried
    }

    #[test]
    fn retries_node_refused_and_disconnects_before_output() {
        let max = MaxAttempts::default();
        for end in [
            AttemptEnd::Failed(FailureClass::Node),
            AttemptEnd::Failed(FailureClass::Refused),
            AttemptEnd::Disconnected,
        ] {
            assert_eq!(
                after_attempt(end, false, &tried(1), max, None),
                Failover::Retry { attempt: 2 }
            );
            assert_eq!(
                after_attempt(end, true, &tried(1), max, None),
                Failover::Final(Because::OutputSent)
            );
            assert_eq!(
                after_attempt(end, false, &tried(3), max, None),
                Failover::Final(Because::AttemptsSpent)
            );
            assert_eq!(
                after_attempt(end, false, &tried(1), max, Some(Duration::ZERO)),
                Failover::Final(Because::DeadlineSpent)
            );
        }
    }

    #[test]
    fn request_and_unclassified_failures_are_final() {
        for class in [FailureClass::Request, FailureClass::Unspecified] {
            assert_eq!(
                after_attempt(
                    AttemptEnd::Failed(class),
                    false,
                    &tried(1),
                    MaxAttempts::default(),
                    None
                ),
                Failover::Final(Because::NotRetryable)
            );
        }
        for end in [
            AttemptEnd::Completed,
            AttemptEnd::Cancelled,
            AttemptEnd::DeadlineExceeded,
        ] {
            assert_eq!(
                after_attempt(end, false, &tried(1), MaxAttempts::default(), None),
                Failover::Final(Because::NotAFailure)
            );
        }
        let once = MaxAttempts::new(1).unwrap();
        assert_eq!(
            after_attempt(AttemptEnd::Disconnected, false, &tried(1), once, None),
            Failover::Final(Because::AttemptsSpent)
        );
        assert!(MaxAttempts::new(0).is_err() && MaxAttempts::new(11).is_err());
    }

    #[test]
    fn reads_terminal_events() {
        let v1_disconnect = EdgeFailure::NodeDisconnected.into_event_kind();
        assert_eq!(
            AttemptEnd::of(&v1_disconnect),
            Some(AttemptEnd::Disconnected)
        );
        assert_eq!(
            AttemptEnd::of(&EdgeFailure::DeadlineExceeded.into_event_kind()),
            Some(AttemptEnd::DeadlineExceeded)
        );
        assert_eq!(
            AttemptEnd::of(&RunEventKind::failed("oops", "v1")),
            Some(AttemptEnd::Failed(FailureClass::Unspecified))
        );
        assert_eq!(AttemptEnd::of(&RunEventKind::Started), None);
        assert_eq!(
            AttemptEnd::Disconnected.breaker_outcome(),
            Outcome::NodeFailure
        );
        assert_eq!(
            AttemptEnd::Failed(FailureClass::Refused).breaker_outcome(),
            Outcome::Neutral
        );
        assert_eq!(
            AttemptEnd::Failed(FailureClass::Request).breaker_outcome(),
            Outcome::Neutral
        );
    }

    #[test]
    fn tried_tells_nodes_apart() {
        let t = tried(2);
        let n1 = NodeId::parse("n1").unwrap();
        let n2 = NodeId::parse("n2").unwrap();
        assert!(t.contains(NodeHash::of(&n1), &n1));
        assert!(!t.contains(NodeHash::of(&n2), &n2));
        assert_eq!(t.attempts(), 2);
        assert_eq!(t.nodes().count(), 2);
    }
}
