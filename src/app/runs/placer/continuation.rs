//! Continuation: a run whose attempt is lost for good after output reached the caller is
//! carried on by another node that registered `can_continue`, from the output already
//! relayed ([`Progress`]), under the same deadline — or fails as before, with the reason
//! the domain's `may_continue` gives.
//!
//! A continuation is placed at once or not at all: it never waits in the queue (the pump
//! places queued runs on any node serving them, and a node that cannot continue must never
//! be sent one). Its events go on the run's numbering like a failed-over attempt's
//! (`relay/`); its usage, completed, failed or cancelled, adds the output counted before
//! it.

use std::sync::Arc;

use tokio::time::Instant;
use tracing::info;

use super::Placer;
use super::Table;
use crate::app::runs::progress::Progress;
use crate::app::runs::route::Route;
use crate::app::runs::run::Run;
use crate::domain::routing::{AttemptEnd, Decision, RouteReason, RouteRule};
use crate::domain::{
    Continuation, ContinuationFacts, ContinuationRefusal, FailureClass, NodeId, Operation,
    RunEventKind, may_continue,
};

/// Whether an attempt that ended with `end` after output is one a continuation may follow:
/// its node failed it for the node's reason or was lost.
fn lost_for_good(end: AttemptEnd) -> bool {
    matches!(
        end,
        AttemptEnd::Failed(FailureClass::Node) | AttemptEnd::Disconnected
    )
}

/// How many choices the run's input asks for (`n`), and whether it constrains its output
/// (a JSON schema or object, a grammar, a regex, a choice list).
fn input_shape(run: &Run) -> (u32, bool) {
    if !matches!(
        run.spec().operation,
        Operation::Chat | Operation::Completion
    ) {
        return (1, false);
    }
    let Ok(body) = serde_json::from_slice::<serde_json::Value>(&run.spec().input) else {
        return (1, false);
    };
    let choices = body
        .get("n")
        .and_then(serde_json::Value::as_u64)
        .map_or(1, |n| u32::try_from(n).unwrap_or(u32::MAX));
    let response_format = body
        .get("response_format")
        .and_then(|f| f.get("type"))
        .and_then(serde_json::Value::as_str);
    let constrained = matches!(response_format, Some("json_object" | "json_schema"))
        || [
            "grammar",
            "json_schema",
            "guided_json",
            "guided_regex",
            "guided_grammar",
            "guided_choice",
        ]
        .iter()
        .any(|key| body.get(key).is_some_and(|v| !v.is_null()));
    (choices, constrained)
}

impl Placer {
    /// Whether runs keep what they relayed, for a continuation (`runs.max_continuations`
    /// above 0).
    pub(in crate::app::runs) fn keeps_progress(&self) -> bool {
        self.routing.policy.max_continuations.get() > 0
    }

    /// After `run`'s attempt ended with `kind` once output reached the caller: the node of a
    /// continuation placed now, or `None` to end the run with `kind`, which then names why
    /// it was not continued (when continuations are on and the node was lost for good).
    pub(super) fn continue_after(
        &self,
        table: &mut Table,
        run: &Arc<Run>,
        route: &mut Route,
        progress: &Progress,
        kind: &mut RunEventKind,
        now: Instant,
    ) -> Option<NodeId> {
        let end = AttemptEnd::of(kind)?;
        let spent = run.time_left(now).is_some_and(|left| left.is_zero());
        let applies = self.keeps_progress() && lost_for_good(end);
        if !applies || route.is_cancelling() || self.is_draining() || spent {
            return None;
        }
        let placed = self.seat_continuation(table, run, route, progress, now);
        let metrics = &self.observer;
        match placed {
            Ok(node) => {
                metrics.continued(Ok(()));
                info!(parent: run.span(), run_id = %run.id(), %node, relayed_chars = progress.text().len(), "run continued on another node");
                Some(node)
            }
            Err(refusal) => {
                metrics.continued(Err(refusal));
                info!(parent: run.span(), run_id = %run.id(), reason = refusal.as_str(), "run not continued");
                if let RunEventKind::Failed { message, .. } = kind {
                    message.push_str(&format!(" (not continued: {refusal})"));
                }
                None
            }
        }
    }

    /// Places a continuation of `run`, whose attempt was lost after output, on another node
    /// that can continue runs and can take it now: the node, or why not.
    fn seat_continuation(
        &self,
        table: &mut Table,
        run: &Arc<Run>,
        route: &mut Route,
        progress: &Progress,
        now: Instant,
    ) -> Result<NodeId, ContinuationRefusal> {
        let mut nodes = self.candidates(run);
        nodes.retain(|n| n.can_continue && !route.tried().contains(n.hash, n.record.id()));
        let (choices, constrained) = input_shape(run);
        let facts = ContinuationFacts {
            tool_call_started: progress.tool_call_started(),
            reasoning_started: progress.reasoning_started(),
            choices,
            constrained,
            target_resumes_constrained: false,
            capable_nodes: nodes.len(),
            continuations_made: route.continuations(),
        };
        let number = may_continue(&facts, self.routing.policy.max_continuations)?;
        let Decision::Place { index, reason } = self.decide(table, &nodes, run, route, now) else {
            return Err(ContinuationRefusal::NoCapableNode);
        };
        let reason = RouteReason {
            rule: RouteRule::Continuation,
            ..reason
        };
        let seat = nodes
            .get_mut(index)
            .ok_or(ContinuationRefusal::NoCapableNode)?;
        let node = self
            .take_seat(table, seat, reason, run, route, now)
            .ok_or(ContinuationRefusal::NoCapableNode)?;
        route.continue_as(
            number,
            Continuation {
                text: progress.text().to_owned(),
                output_tokens: progress.outputs(),
                number,
            },
        );
        Ok(node)
    }
}
