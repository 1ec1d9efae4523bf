//! [`Route`]: how one run is routed — where it is ([`Placement`]), the nodes it tried, its
//! breaker admission, why it waits, a cancel asked for, its continuations — and every
//! change a route can go through, each keeping it whole (a seat records the node, the
//! connection, the admission and the reason together). Only the placer changes a route,
//! always under its table's lock; the other parts read it through the methods here.

use std::time::Duration;

use tokio::time::Instant;

use crate::domain::routing::{Admission, NodeHash, RouteReason, Tried, WaitCause};
use crate::domain::{Continuation, NodeId, RunEventKind};
use crate::ports::ConnectionId;

/// Where a run is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(in crate::app::runs) enum Placement {
    /// Waiting in the queue for a node (or ended before reaching one).
    Queued,
    /// Sent to this node's connection.
    Dispatched {
        /// The node.
        node: NodeId,
        /// Its connection at dispatch time (or at the resume that re-attached it).
        connection: ConnectionId,
    },
    /// Its node's connection dropped after the run produced output: held for the node to
    /// reconnect and claim it (`recovery/resume.rs`). The attempt goes on; its slot was
    /// freed with the connection.
    Detached {
        /// The node.
        node: NodeId,
        /// The connection that dropped.
        connection: ConnectionId,
        /// When it dropped.
        since: Instant,
        /// Whether the run's loss, should the node not resume it, counts against the node's
        /// breaker (one departure counts once, with its first run).
        blame: bool,
    },
}

/// Why and since when a run waits in the queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(in crate::app::runs) struct Waiting {
    /// When it entered the queue (this time: a failover queues it again).
    since: Instant,
    /// The latest reason it could not be placed; re-decided at every pump.
    cause: WaitCause,
    /// Which of the run's stays in the queue this is, so a timer armed for an earlier one
    /// leaves this one alone.
    stay: u32,
    /// Set while its model is being loaded for it: how long it may wait for that, instead
    /// of the wait for `cause`.
    cold_start: Option<Duration>,
}

/// How a run is routed: changed only while the placer's table is locked (the table's lock
/// is always taken first), read on its own by the other parts.
#[derive(Debug)]
pub(in crate::app::runs) struct Route {
    placement: Placement,
    /// Every node the run was placed on, in order; its length is the attempts made.
    tried: Tried,
    /// The current attempt's leave from its node's breaker, until the attempt's outcome is
    /// recorded (exactly once).
    admission: Option<(NodeHash, Admission)>,
    /// Why the current attempt went where it did.
    reason: Option<RouteReason>,
    /// Set while the run waits in the queue.
    waiting: Option<Waiting>,
    /// Stays in the queue so far.
    stays: u32,
    /// The failure of the latest attempt that was failed over, for the run's end when no
    /// further attempt comes.
    last_failure: Option<RunEventKind>,
    /// A cancel was asked for (by the caller, the deadline or the edge), with its reason:
    /// no more attempts, and a run resumed meanwhile is sent the cancel again.
    cancelling: Option<String>,
    /// Continuations the run had.
    continuations: u32,
    /// What the current attempt carries on from, when it is a continuation.
    continuation: Option<Continuation>,
}

impl Placement {
    /// The node and connection of the current attempt, attached or detached; `None` while
    /// queued.
    pub(in crate::app::runs) fn attempt(&self) -> Option<(&NodeId, ConnectionId)> {
        match self {
            Self::Queued => None,
            Self::Dispatched { node, connection }
            | Self::Detached {
                node, connection, ..
            } => Some((node, *connection)),
        }
    }
}

impl Default for Route {
    fn default() -> Self {
        Self {
            placement: Placement::Queued,
            tried: Tried::default(),
            admission: None,
            reason: None,
            waiting: None,
            stays: 0,
            last_failure: None,
            cancelling: None,
            continuations: 0,
            continuation: None,
        }
    }
}

impl Route {
    /// Where the run is.
    pub(in crate::app::runs) fn placement(&self) -> &Placement {
        &self.placement
    }

    /// Whether the current attempt is on `node`'s connection `connection`.
    pub(in crate::app::runs) fn is_on(&self, node: &NodeId, connection: ConnectionId) -> bool {
        matches!(&self.placement, Placement::Dispatched { node: n, connection: c } if n == node && *c == connection)
    }

    /// Whether the current attempt is the one `node` held on `connection`, attached or
    /// detached from it since.
    pub(in crate::app::runs) fn is_attempt(&self, node: &NodeId, connection: ConnectionId) -> bool {
        self.placement.attempt() == Some((node, connection))
    }

    /// Whether the run is held detached from `node`'s `connection`.
    pub(in crate::app::runs) fn is_detached_from(
        &self,
        node: &NodeId,
        connection: ConnectionId,
    ) -> bool {
        matches!(&self.placement, Placement::Detached { node: n, connection: c, .. } if n == node && *c == connection)
    }

    /// When the run was detached and whether its loss counts against its node's breaker,
    /// while it is detached.
    pub(in crate::app::runs) fn detached(&self) -> Option<(Instant, bool)> {
        match &self.placement {
            Placement::Detached { since, blame, .. } => Some((*since, *blame)),
            _ => None,
        }
    }

    /// Why the current attempt went where it did.
    pub(in crate::app::runs) fn reason(&self) -> Option<RouteReason> {
        self.reason
    }

    /// Which stay in the queue the run is in, while it waits.
    pub(in crate::app::runs) fn stay(&self) -> Option<u32> {
        self.waiting.map(|w| w.stay)
    }
}

/// What the placer reads of a route to decide and to wait.
impl Route {
    /// The nodes the run was placed on, in order.
    pub(in crate::app::runs) fn tried(&self) -> &Tried {
        &self.tried
    }

    /// Attempts made so far.
    pub(in crate::app::runs) fn attempts(&self) -> u32 {
        self.tried.attempts()
    }

    /// The run's stay in the queue, if it is `stay`.
    pub(in crate::app::runs) fn waiting_in(&self, stay: u32) -> Option<Waiting> {
        self.waiting.filter(|w| w.stay == stay)
    }

    /// How long the run may wait for its model's load, while one is under way for it.
    pub(in crate::app::runs) fn cold_start(&self) -> Option<Duration> {
        self.waiting.and_then(|w| w.cold_start)
    }

    /// The wait's latest cause, while the run waits.
    pub(in crate::app::runs) fn wait_cause(&self) -> Option<WaitCause> {
        self.waiting.map(|w| w.cause)
    }

    /// Whether the run waits in the queue for its model to be loaded.
    pub(in crate::app::runs) fn waits_cold(&self) -> bool {
        matches!(self.placement, Placement::Queued) && self.cold_start().is_some()
    }

    /// Whether a cancel was asked for.
    pub(in crate::app::runs) fn is_cancelling(&self) -> bool {
        self.cancelling.is_some()
    }

    /// The reason of the cancel asked for, if one was.
    pub(in crate::app::runs) fn cancelling(&self) -> Option<&str> {
        self.cancelling.as_deref()
    }

    /// Continuations the run had.
    pub(in crate::app::runs) fn continuations(&self) -> u32 {
        self.continuations
    }

    /// What the current attempt carries on from, when it is a continuation.
    pub(in crate::app::runs) fn continuation(&self) -> Option<&Continuation> {
        self.continuation.as_ref()
    }

    /// The failure of the latest attempt that was failed over.
    pub(in crate::app::runs) fn last_failure(&self) -> Option<&RunEventKind> {
        self.last_failure.as_ref()
    }
}

/// The changes a route goes through, each made by the placer under its table's lock.
impl Route {
    /// The run is seated on `node`'s `connection` with the breaker's `admission`, for
    /// `reason` (which, after a wait in the queue, says how long it waited). Returns the
    /// reason recorded.
    pub(in crate::app::runs) fn seat(
        &mut self,
        node: &NodeId,
        connection: ConnectionId,
        admission: (NodeHash, Admission),
        reason: RouteReason,
        now: Instant,
    ) -> RouteReason {
        self.tried.push(node.clone());
        self.admission = Some(admission);
        self.placement = Placement::Dispatched {
            node: node.clone(),
            connection,
        };
        let reason = match self.waiting.take() {
            Some(waiting) => reason.with_queue_wait(now.saturating_duration_since(waiting.since)),
            None => reason,
        };
        self.reason = Some(reason);
        reason
    }

    /// The run enters the queue for `cause`, may wait `cold_start` for its model's load;
    /// this is a new stay.
    pub(in crate::app::runs) fn queue(
        &mut self,
        now: Instant,
        cause: WaitCause,
        cold_start: Option<Duration>,
    ) {
        self.placement = Placement::Queued;
        self.stays += 1;
        self.waiting = Some(Waiting {
            since: now,
            cause,
            stay: self.stays,
            cold_start,
        });
    }

    /// The queued run still waits, now for `cause` (and `cold_start`). Returns whether that
    /// changed, so its wait timer must look again.
    pub(in crate::app::runs) fn wait_for(
        &mut self,
        cause: WaitCause,
        cold_start: Option<Duration>,
    ) -> bool {
        match self.waiting.as_mut() {
            Some(waiting) if (waiting.cause, waiting.cold_start) != (cause, cold_start) => {
                waiting.cause = cause;
                waiting.cold_start = cold_start;
                true
            }
            _ => false,
        }
    }

    /// The current attempt's admission, taken to record its outcome (exactly once).
    pub(in crate::app::runs) fn take_admission(&mut self) -> Option<(NodeHash, Admission)> {
        self.admission.take()
    }

    /// The current attempt failed with `kind` and the run moved on.
    pub(in crate::app::runs) fn failed(&mut self, kind: RunEventKind) {
        self.last_failure = Some(kind);
    }

    /// The failure of the latest attempt, taken to end the run with.
    pub(in crate::app::runs) fn take_last_failure(&mut self) -> Option<RunEventKind> {
        self.last_failure.take()
    }

    /// A cancel was asked for with `reason`.
    pub(in crate::app::runs) fn cancel(&mut self, reason: &str) {
        self.cancelling = Some(reason.to_owned());
    }

    /// The next attempt is continuation number `number`, carrying on from `continuation`.
    pub(in crate::app::runs) fn continue_as(&mut self, number: u32, continuation: Continuation) {
        self.continuations = number;
        self.continuation = Some(continuation);
    }

    /// The run ended: it waits no more. Returns where it was.
    pub(in crate::app::runs) fn leave(&mut self) -> Placement {
        self.waiting = None;
        self.placement.clone()
    }

    /// Detaches the run from `node`'s `connection`, which dropped, if it is on it; `blame`
    /// says whether its loss would count against the node's breaker. Returns whether it
    /// did.
    pub(in crate::app::runs) fn detach(
        &mut self,
        node: &NodeId,
        connection: ConnectionId,
        blame: bool,
    ) -> bool {
        if !self.is_on(node, connection) {
            return false;
        }
        self.hold(node, connection, blame);
        true
    }

    /// Holds the run detached from `node`'s `connection` from now on.
    pub(in crate::app::runs) fn hold(
        &mut self,
        node: &NodeId,
        connection: ConnectionId,
        blame: bool,
    ) {
        self.placement = Placement::Detached {
            node: node.clone(),
            connection,
            since: Instant::now(),
            blame,
        };
    }

    /// Where `node` holds the run other than on `connection` — attached to an older
    /// connection, or detached — and since when it is detached.
    pub(in crate::app::runs) fn held_elsewhere(
        &self,
        node: &NodeId,
        connection: ConnectionId,
    ) -> Option<(ConnectionId, Option<Instant>)> {
        match &self.placement {
            Placement::Dispatched {
                node: n,
                connection: c,
            } if n == node && *c != connection => Some((*c, None)),
            Placement::Detached {
                node: n,
                connection: c,
                since,
                ..
            } if n == node => Some((*c, Some(*since))),
            _ => None,
        }
    }

    /// Attaches the run's attempt to `node`'s `connection`.
    pub(in crate::app::runs) fn attach(&mut self, node: &NodeId, connection: ConnectionId) {
        self.placement = Placement::Dispatched {
            node: node.clone(),
            connection,
        };
    }

    /// A run taken back from the journal: its attempt was on `node`, and it is never
    /// continued (it has no input to send again).
    pub(in crate::app::runs) fn taken_back(&mut self, node: Option<&NodeId>) {
        if let Some(node) = node {
            self.tried.push(node.clone());
        }
        self.continuations = u32::MAX;
    }
}

impl Waiting {
    /// When it entered the queue.
    pub(in crate::app::runs) fn since(&self) -> Instant {
        self.since
    }

    /// The latest reason it could not be placed.
    pub(in crate::app::runs) fn cause(&self) -> WaitCause {
        self.cause
    }

    /// How long it may wait for its model's load, while one is under way.
    pub(in crate::app::runs) fn cold_start(&self) -> Option<Duration> {
        self.cold_start
    }
}
