//! What happens in a run, as every layer names it: the run's id, the kinds of its events
//! (output, and the terminal ones with their token counts), whose fault a failure is, and
//! the failures the edge makes on a node's behalf.
//!
//! Vocabulary only: the run's state machine and the event with its routing context are
//! `run`'s, above routing, which decides on these kinds.

use std::fmt;
use std::sync::Arc;

use bytes::Bytes;

use super::output::StructuredOutput;
use super::usage::Usage;

/// The edge-assigned, unique id of a run.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RunId(Arc<str>);

impl RunId {
    /// Wraps an id the edge generated (or one read back from a node or a caller).
    pub fn new(id: impl Into<Arc<str>>) -> Self {
        Self(id.into())
    }

    /// The id as a string slice.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// Lets maps keyed by run id be searched with the `&str` a node sent, without building a
/// `RunId` (an allocation) per event. Consistent with `Hash` and `Eq`: both are those of
/// the id's text.
impl std::borrow::Borrow<str> for RunId {
    fn borrow(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for RunId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.pad(&self.0)
    }
}

impl fmt::Debug for RunId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}", &*self.0)
    }
}

/// The code and message given to runs found open when the journal is reopened: the edge
/// that held them stopped without ending them.
pub const EDGE_CRASHED: &str = "edge_crashed";

/// Whose fault a failed run is, which decides retries, circuit breakers and the status the
/// API answers with.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum FailureClass {
    /// Not said (a v1 node): final, judged by its code.
    #[default]
    Unspecified,
    /// The request itself is bad: never retried, never held against the node.
    Request,
    /// The node or its engine failed: retried elsewhere before any output, counted by the
    /// node's circuit breaker.
    Node,
    /// The node declined the run without trying it: retried elsewhere, not held against it.
    Refused,
}

impl FailureClass {
    /// A stable snake_case name for logs, sinks and metric labels.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Unspecified => "unspecified",
            Self::Request => "request",
            Self::Node => "node",
            Self::Refused => "refused",
        }
    }

    /// The class named `name` ([`Self::as_str`]); `Unspecified` for any other name.
    pub fn parse(name: &str) -> Self {
        [Self::Request, Self::Node, Self::Refused]
            .into_iter()
            .find(|class| class.as_str() == name)
            .unwrap_or(Self::Unspecified)
    }
}

/// What happened in a run.
#[derive(Debug, Clone, PartialEq)]
pub enum RunEventKind {
    /// The node began the run.
    Started,
    /// A piece of output.
    Output {
        /// Text output.
        text: String,
        /// Binary output.
        data: Bytes,
        /// Reasoning, tool calls, log probabilities or embeddings, when the piece has any
        /// (boxed: rare, and text events stay small).
        structured: Option<Box<StructuredOutput>>,
    },
    /// Terminal: the run finished.
    Completed {
        /// Why generation stopped (`stop`, `length`, ...).
        finish_reason: String,
        /// Token counts, when the node reports them.
        usage: Option<Usage>,
    },
    /// Terminal: the run failed.
    Failed {
        /// A stable snake_case code (`node_disconnected`, `deadline_exceeded`, ...).
        code: String,
        /// A human-readable explanation.
        message: String,
        /// Whose fault it is.
        class: FailureClass,
        /// The HTTP status the node's upstream answered, when it did.
        status: Option<u16>,
        /// What the run produced before it failed, when anything is known (for a prompt
        /// over the context window, `input_tokens` is the prompt's size).
        usage: Option<Usage>,
        /// For a prompt longer than the model's context window (`context_length_exceeded`):
        /// the window, in tokens, when the engine said.
        context_window: Option<u32>,
    },
    /// Terminal: the run was cancelled.
    Cancelled {
        /// Why.
        reason: String,
        /// What the run produced before it was cancelled, when anything is known.
        usage: Option<Usage>,
    },
}

impl RunEventKind {
    /// An output event with `text` only.
    pub fn text(text: impl Into<String>) -> Self {
        Self::Output {
            text: text.into(),
            data: Bytes::new(),
            structured: None,
        }
    }

    /// A failure with no class or status (as a v1 node reports one).
    pub fn failed(code: impl Into<String>, message: impl Into<String>) -> Self {
        Self::Failed {
            context_window: None,
            code: code.into(),
            message: message.into(),
            class: FailureClass::Unspecified,
            status: None,
            usage: None,
        }
    }

    /// A cancellation with no usage known.
    pub fn cancelled(reason: impl Into<String>) -> Self {
        Self::Cancelled {
            reason: reason.into(),
            usage: None,
        }
    }

    /// A terminal event's token counts: a completion's usage, or what a failed or
    /// cancelled run produced; `None` for other events and when nothing is known.
    pub fn usage(&self) -> Option<Usage> {
        match self {
            Self::Completed { usage, .. }
            | Self::Failed { usage, .. }
            | Self::Cancelled { usage, .. } => *usage,
            Self::Started | Self::Output { .. } => None,
        }
    }

    /// A terminal event's token counts, to be set or changed; `None` for other events.
    pub fn usage_mut(&mut self) -> Option<&mut Option<Usage>> {
        match self {
            Self::Completed { usage, .. }
            | Self::Failed { usage, .. }
            | Self::Cancelled { usage, .. } => Some(usage),
            Self::Started | Self::Output { .. } => None,
        }
    }

    /// Whether this event ends the run.
    pub fn is_terminal(&self) -> bool {
        matches!(
            self,
            Self::Completed { .. } | Self::Failed { .. } | Self::Cancelled { .. }
        )
    }

    /// A stable snake_case name (`started`, `output`, `completed`, `failed`, `cancelled`).
    pub fn name(&self) -> &'static str {
        match self {
            Self::Started => "started",
            Self::Output { .. } => "output",
            Self::Completed { .. } => "completed",
            Self::Failed { .. } => "failed",
            Self::Cancelled { .. } => "cancelled",
        }
    }
}

/// The terminal failures the edge makes on a node's behalf.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum EdgeFailure {
    /// The node's connection ended while it held the run.
    NodeDisconnected,
    /// The run's deadline passed.
    DeadlineExceeded,
    /// The edge shut down before the run ended.
    EdgeShutdown,
    /// The run waited in the queue longer than allowed.
    QueueTimeout,
    /// No node serving the run's route was connected and eligible before its wait expired.
    NoNodeAvailable,
    /// The run waited in a full queue and gave its place to a run with a better claim.
    QueueFull,
    /// The edge that held the run stopped without ending it, and no node took it back
    /// after the restart: how it ended is not known (its record's outcome is `unknown`).
    EdgeCrashed,
}

impl EdgeFailure {
    /// The `RunFailed.code` the edge sends.
    pub fn code(self) -> &'static str {
        match self {
            Self::NodeDisconnected => "node_disconnected",
            Self::DeadlineExceeded => "deadline_exceeded",
            Self::EdgeShutdown => "edge_shutdown",
            Self::QueueTimeout => "queue_timeout",
            Self::NoNodeAvailable => "no_node_available",
            Self::QueueFull => "queue_full",
            Self::EdgeCrashed => EDGE_CRASHED,
        }
    }

    /// The terminal event for this failure.
    pub fn into_event_kind(self) -> RunEventKind {
        let (message, class) = match self {
            Self::NodeDisconnected => (
                "the node disconnected before the run ended",
                FailureClass::Node,
            ),
            Self::DeadlineExceeded => (
                "the run did not finish before its deadline",
                FailureClass::Unspecified,
            ),
            Self::EdgeShutdown => (
                "the edge shut down before the run ended",
                FailureClass::Unspecified,
            ),
            Self::QueueTimeout => (
                "no node had capacity before the queue wait expired",
                FailureClass::Unspecified,
            ),
            Self::NoNodeAvailable => (
                "no node serving the model was connected and available before the wait expired",
                FailureClass::Unspecified,
            ),
            Self::QueueFull => (
                "the run queue is full and the run gave its place to another",
                FailureClass::Unspecified,
            ),
            Self::EdgeCrashed => (
                "the edge stopped before this run ended; how it ended is not known",
                FailureClass::Unspecified,
            ),
        };
        RunEventKind::Failed {
            context_window: None,
            code: self.code().into(),
            message: message.into(),
            class,
            status: None,
            usage: None,
        }
    }
}
