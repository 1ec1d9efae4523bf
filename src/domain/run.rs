//! Runs: what a caller asks for (with what routing needs to know of it), each event with
//! the context every sink and caller needs, and the state machine that guarantees every
//! accepted run exactly one terminal event.
//!
//! It sits above routing, whose keys and reasons it carries; the vocabulary both speak (the
//! run's id, its operation, the kinds of its events) is `event`'s and `operation`'s.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;

use super::event::{RunEventKind, RunId};
use super::lora::LoraChoice;
use super::names::{AdapterName, NodeId, Target};
use super::operation::Operation;
use super::routing::{AffinityKey, BudgetClaim, LimitPolicy, Priority, RouteReason, TenantKey};
use super::selection::NodeSelector;

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

impl RunSpec {
    /// The target of the model the caller asked for: the LoRA's name for a run of a LoRA
    /// (`llama/sql`), else the selector's target. Records, usage and metrics name the
    /// model so.
    pub fn model_target(&self) -> &Target {
        self.routing
            .lora
            .as_ref()
            .map_or(&self.selector.target, |lora| lora.name.as_target())
    }
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
    /// The LoRA applied on top of the selector's target, for a model that is a LoRA
    /// (`llama/sql`): only a node that reported it, with the same weights, takes the run,
    /// and one where it is loaded first. `None`: the target itself, no LoRA applied.
    pub lora: Option<LoraChoice>,
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
            lora: None,
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
    use crate::domain::EdgeFailure;

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
