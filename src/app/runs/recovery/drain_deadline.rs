//! A node drain's deadline: each run still on the node is moved to another node like a lost
//! attempt — placed again when nothing of it reached the caller yet (failover), continued from
//! what was relayed otherwise (continuation) — and only then cancelled
//! on the drained node, whose late events for it are dropped. A run that cannot move is
//! cancelled on its node as before, the reason saying why it did not move.
//!
//! It decides nothing itself: the failover and continuation rules are the ones every lost
//! attempt goes through.

use std::sync::Arc;

use super::Recovery;
use crate::app::runs::route::Placement;
use crate::domain::{FailureClass, NodeId, RunEventKind, RunId};

/// The code of the attempt a drain deadline ends, as the run's record shows it when the run
/// moved on (it is never relayed).
const DRAIN_DEADLINE: &str = "drain_deadline";

/// The attempt's end a drain deadline makes: a node-class failure, so the run may be placed
/// again or continued; not held against the node's breaker.
const DRAIN_DEADLINE_MESSAGE: &str = "the node's drain deadline passed";

/// The end a drain deadline gives the attempt on the drained node (see above).
fn drain_deadline_end() -> RunEventKind {
    RunEventKind::Failed {
        context_window: None,
        code: DRAIN_DEADLINE.to_owned(),
        message: DRAIN_DEADLINE_MESSAGE.to_owned(),
        class: FailureClass::Node,
        status: None,
        usage: None,
    }
}

impl Recovery {
    /// Moves open run `id` off `node`, whose drain deadline passed: to another node (placed
    /// again, queued, or continued), then cancelled on `node` with `reason`. A run that
    /// cannot move is cancelled on `node` as a caller's cancel is, `reason` then ending with
    /// why it did not move. Returns whether the run was open on `node`.
    pub(in crate::app::runs) async fn move_off_drained(
        self: &Arc<Self>,
        node: &NodeId,
        id: &RunId,
        reason: &str,
    ) -> bool {
        let Some(run) = self.placer.find(id) else {
            return false;
        };
        let placement = run.route().placement().clone();
        if placement.attempt().is_none_or(|(held, _)| held != node) {
            // Queued, or moved to another node since the drain listed it: not this node's.
            return false;
        }
        let Placement::Dispatched { connection, .. } = placement else {
            // Detached from `node` (it may still claim it back): nothing to move it from.
            return self.relay.cancel(id, reason).await;
        };
        let mut end = drain_deadline_end();
        if !self
            .relay
            .move_off_attempt(&run, node, connection, &mut end)
            .await
        {
            // A continuation's refusal, if any, was added to the end's message.
            let why = match &end {
                RunEventKind::Failed { message, .. } => message
                    .strip_prefix(DRAIN_DEADLINE_MESSAGE)
                    .unwrap_or_default(),
                _ => "",
            };
            return self.relay.cancel(id, &format!("{reason}{why}")).await;
        }
        // A node that cannot be reached has lost the attempt anyway.
        self.placer.send_cancel_to(node, id, reason);
        true
    }
}
