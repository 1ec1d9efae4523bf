//! Runs: what a caller asks for, the events a run produces, and the state machine that
//! guarantees every accepted run exactly one terminal event.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;

use super::names::{AdapterName, NodeId, Target};
use super::output::StructuredOutput;
use super::routing::{AffinityKey, BudgetClaim, LimitPolicy, Priority, RouteReason, TenantKey};
use super::selection::NodeSelector;

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

/// A run as a caller asks for it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunSpec {
    /// The adapter and target to run, and an optional node pin.
    pub selector: NodeSelector,
    /// The input, opaque to the edge.
    pub input: Bytes,
    /// What `input` is (`text/plain; charset=utf-8`, `application/json`).
    pub content_type: String,
    /// Free-form parameters passed to the node.
    pub params: BTreeMap<String, String>,
    /// How long the run may take from acceptance, queue wait included; `None` for no
    /// limit. The node is sent what is left of it at dispatch.
    pub deadline: Option<Duration>,
    /// What kind of work `input` asks for.
    pub operation: Operation,
    /// What routing needs to know about the caller: affinity, tenant, priority, limits.
    pub routing: RunRouting,
}

/// What routing needs to know about a run's caller, set by the API (or the console).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunRouting {
    /// Runs with equal keys go to the same node while it stays within its load bound.
    pub affinity: Option<AffinityKey>,
    /// Whom the run counts against for fair queueing and limits (an API key's name).
    pub tenant: TenantKey,
    /// Its class in the wait queue.
    pub priority: Priority,
    /// The caller's own limits; `None` applies the edge's `[limits]`.
    pub limits: Option<LimitPolicy>,
    /// What the run reserves of its key's token budget; `None` when the key has none.
    pub budget: Option<BudgetClaim>,
    /// What the caller's API needs to render the run's client stream again for a caller
    /// that resumes it (opaque to the edge: the API adapter writes and reads it); kept in
    /// the run's record. `None` for runs whose stream cannot be resumed.
    pub client_stream: Option<Arc<str>>,
}

impl Default for RunRouting {
    /// No affinity, the anonymous tenant, interactive, the edge's limits.
    fn default() -> Self {
        Self {
            affinity: None,
            tenant: TenantKey::anonymous(),
            priority: Priority::default(),
            limits: None,
            budget: None,
            client_stream: None,
        }
    }
}

/// What kind of work a run's input asks for, so a node keeps one input form per kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Operation {
    /// Not said: `text/plain` input is a prompt, `application/json` input a chat request.
    #[default]
    Unspecified,
    /// An OpenAI chat-completions body without `model` and `stream`.
    Chat,
    /// An OpenAI completions body without `model` and `stream`.
    Completion,
    /// An OpenAI embeddings body without `model`.
    Embeddings,
    /// Text (`{"content", "add_special"}`) or a chat body to turn into the engine's token
    /// ids. Only for a node that declared it.
    Tokenize,
    /// Token ids (`{"tokens"}`) to turn back into text. Only for a node that declared it.
    Detokenize,
}

impl Operation {
    /// A stable snake_case name for logs and metric labels.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Unspecified => "unspecified",
            Self::Chat => "chat",
            Self::Completion => "completion",
            Self::Embeddings => "embeddings",
            Self::Tokenize => "tokenize",
            Self::Detokenize => "detokenize",
        }
    }

    /// Whether only a node that declared this operation at registration may get it (a node
    /// written before it existed would not know what to do with it).
    pub fn needs_declaration(self) -> bool {
        matches!(self, Self::Tokenize | Self::Detokenize)
    }
}

/// The operations a node declared it serves among those that need a declaration
/// ([`Operation::needs_declaration`]). Copy-cheap, for routing's per-placement node copies.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct DeclaredOperations {
    tokenize: bool,
    detokenize: bool,
}

impl DeclaredOperations {
    /// The set of `operations` (those that need no declaration are left out).
    pub fn new(operations: impl IntoIterator<Item = Operation>) -> Self {
        let mut declared = Self::default();
        for operation in operations {
            match operation {
                Operation::Tokenize => declared.tokenize = true,
                Operation::Detokenize => declared.detokenize = true,
                Operation::Unspecified
                | Operation::Chat
                | Operation::Completion
                | Operation::Embeddings => {}
            }
        }
        declared
    }

    /// Whether a node with this set may get runs of `operation`.
    pub fn serves(self, operation: Operation) -> bool {
        match operation {
            Operation::Tokenize => self.tokenize,
            Operation::Detokenize => self.detokenize,
            Operation::Unspecified
            | Operation::Chat
            | Operation::Completion
            | Operation::Embeddings => true,
        }
    }

    /// The declared operations, in a stable order.
    pub fn operations(self) -> Vec<Operation> {
        [
            (self.tokenize, Operation::Tokenize),
            (self.detokenize, Operation::Detokenize),
        ]
        .into_iter()
        .filter_map(|(on, operation)| on.then_some(operation))
        .collect()
    }
}

/// Token counts a node reports with a completed run (and, since protocol v1.2, what a
/// failed or cancelled run produced).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Usage {
    /// Tokens in the prompt.
    pub input_tokens: u32,
    /// Tokens generated.
    pub output_tokens: u32,
    /// Prompt tokens the engine served from its cache (part of `input_tokens`).
    pub cached_input_tokens: u32,
    /// Generated tokens spent on reasoning (part of `output_tokens`).
    pub reasoning_tokens: u32,
}

impl Usage {
    /// Prompt and generated token counts, with no cache or reasoning detail.
    pub fn new(input_tokens: u32, output_tokens: u32) -> Self {
        Self {
            input_tokens,
            output_tokens,
            ..Self::default()
        }
    }
}

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

/// Who produced an event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventOrigin {
    /// The node that ran it.
    Node,
    /// The edge, ending a run the node could not end (disconnect, deadline, ...).
    Edge,
}

/// One event of one run, with the context every sink and caller needs.
#[derive(Debug, Clone, PartialEq)]
pub struct RunEvent {
    /// The run.
    pub run_id: RunId,
    /// The node that held the run; `None` when it ended before dispatch.
    pub node: Option<NodeId>,
    /// The run's adapter.
    pub adapter: AdapterName,
    /// The run's target.
    pub target: Target,
    /// The node's sequence number (the edge continues it for events it makes).
    pub seq: u64,
    /// Who produced it.
    pub origin: EventOrigin,
    /// What happened.
    pub kind: RunEventKind,
    /// On a `started` event: why the run went to this node, and which attempt it is (boxed:
    /// one event per attempt carries it, and every other event stays small).
    pub route: Option<Box<RouteReason>>,
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
            Self::EdgeCrashed => super::run_record::EDGE_CRASHED,
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

/// What to do with an event offered to a run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventVerdict {
    /// Relay it; the run goes on.
    Relay,
    /// Relay it; it ends the run.
    RelayTerminal,
    /// Drop it: the run has already ended.
    DropAfterTerminal,
    /// Drop it: the run was resumed and an event with this seq was already relayed.
    DropDuplicate,
}

/// The state machine behind the exactly-one-terminal-event guarantee.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RunState {
    last_seq: u64,
    finished: bool,
    /// Set once the run was resumed: its node may send again what the edge already has.
    resumed: bool,
}

impl RunState {
    /// Offers an event (from the node or made by the edge) and says what to do with it.
    pub fn offer(&mut self, seq: u64, kind: &RunEventKind) -> EventVerdict {
        if self.finished {
            return EventVerdict::DropAfterTerminal;
        }
        if self.resumed && seq <= self.last_seq {
            return EventVerdict::DropDuplicate;
        }
        self.last_seq = self.last_seq.max(seq);
        if kind.is_terminal() {
            self.finished = true;
            EventVerdict::RelayTerminal
        } else {
            EventVerdict::Relay
        }
    }

    /// The sequence number for an event the edge makes now.
    pub fn next_edge_seq(&self) -> u64 {
        self.last_seq.saturating_add(1)
    }

    /// The state of a run taken back after an edge restart, whose last relayed event was
    /// numbered `last_seq`: open, and from now on dropping repeats as a resumed run does.
    pub fn adopted(last_seq: u64) -> Self {
        Self {
            last_seq,
            finished: false,
            resumed: true,
        }
    }

    /// The highest sequence number relayed so far; 0 before any event.
    pub fn last_seq(&self) -> u64 {
        self.last_seq
    }

    /// The run was resumed on a new connection of its node: from now on an event numbered
    /// at or below the last one relayed is a repeat, and is dropped.
    pub fn resume(&mut self) {
        self.resumed = true;
    }

    /// Whether the run has had its terminal event.
    pub fn is_finished(&self) -> bool {
        self.finished
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn kind_strategy() -> impl Strategy<Value = RunEventKind> {
        prop_oneof![
            Just(RunEventKind::Started),
            ".{0,8}".prop_map(RunEventKind::text),
            Just(RunEventKind::Completed {
                finish_reason: "stop".into(),
                usage: None
            }),
            Just(EdgeFailure::NodeDisconnected.into_event_kind()),
            Just(EdgeFailure::DeadlineExceeded.into_event_kind()),
            Just(RunEventKind::cancelled("caller")),
        ]
    }

    proptest! {
        /// Whatever a node and the edge offer, exactly one terminal event is relayed, and
        /// nothing is relayed after it.
        #[test]
        fn exactly_one_terminal_event(
            events in proptest::collection::vec((any::<u64>(), kind_strategy()), 0..40),
            resumed_at in proptest::option::of(0usize..40),
        ) {
            let mut state = RunState::default();
            let mut relayed = Vec::new();
            let relays = |verdict| matches!(verdict, EventVerdict::Relay | EventVerdict::RelayTerminal);
            for (index, (seq, kind)) in events.iter().enumerate() {
                if resumed_at == Some(index) {
                    state.resume();
                }
                if relays(state.offer(*seq, kind)) {
                    relayed.push(kind.clone());
                }
            }
            // The edge always ends a run it still holds.
            let closing = EdgeFailure::EdgeShutdown.into_event_kind();
            if relays(state.offer(state.next_edge_seq(), &closing)) {
                relayed.push(closing);
            }
            prop_assert_eq!(relayed.iter().filter(|k| k.is_terminal()).count(), 1);
            prop_assert!(relayed.last().is_some_and(RunEventKind::is_terminal));
        }
    }

    #[test]
    fn a_resumed_run_drops_what_it_already_relayed() {
        let mut state = RunState::default();
        // Before a resume, numbering is the node's business: nothing is judged a repeat.
        assert_eq!(
            state.offer(2, &RunEventKind::text("a")),
            EventVerdict::Relay
        );
        assert_eq!(
            state.offer(2, &RunEventKind::text("a")),
            EventVerdict::Relay
        );
        state.resume();
        assert_eq!(state.last_seq(), 2);
        assert_eq!(
            state.offer(1, &RunEventKind::text("a")),
            EventVerdict::DropDuplicate
        );
        assert_eq!(
            state.offer(2, &RunEventKind::text("a")),
            EventVerdict::DropDuplicate
        );
        assert_eq!(
            state.offer(3, &RunEventKind::text("b")),
            EventVerdict::Relay
        );
        assert_eq!(
            state.offer(3, &completed_kind()),
            EventVerdict::DropDuplicate
        );
        assert_eq!(
            state.offer(4, &completed_kind()),
            EventVerdict::RelayTerminal
        );
    }

    fn completed_kind() -> RunEventKind {
        RunEventKind::Completed {
            finish_reason: "stop".into(),
            usage: None,
        }
    }

    #[test]
    fn edge_events_continue_the_node_sequence() {
        let mut state = RunState::default();
        assert_eq!(state.offer(1, &RunEventKind::Started), EventVerdict::Relay);
        assert_eq!(
            state.offer(2, &RunEventKind::text("a")),
            EventVerdict::Relay
        );
        assert_eq!(state.next_edge_seq(), 3);
        let failed = EdgeFailure::NodeDisconnected.into_event_kind();
        assert_eq!(state.offer(3, &failed), EventVerdict::RelayTerminal);
        assert!(state.is_finished());
        assert_eq!(
            state.offer(4, &RunEventKind::Started),
            EventVerdict::DropAfterTerminal
        );
    }
}
