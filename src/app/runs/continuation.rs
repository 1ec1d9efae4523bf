//! Continuation: a run whose attempt is lost for good after output reached the caller is
//! carried on by another node that registered `can_continue`, from the output already
//! relayed ([`Progress`]), under the same deadline — or fails as before, with the reason
//! the domain's `may_continue` gives.
//!
//! A continuation is placed at once or not at all: it never waits in the queue (the pump
//! places queued runs on any node serving them, and a node that cannot continue must never
//! be sent one). Its events go on the run's numbering like a failed-over attempt's
//! (`delivery.rs`); its usage, completed, failed or cancelled, adds the output counted before
//! it.

use std::sync::Arc;

use tokio::time::Instant;
use tracing::info;

use super::service::RunService;
use super::table::{Route, Run, Table};
use crate::domain::routing::{AttemptEnd, Decision, RouteReason, RouteRule};
use crate::domain::{
    Continuation, ContinuationFacts, ContinuationRefusal, FailureClass, NodeId, Operation,
    RunEventKind, Usage, may_continue,
};

/// What a run has relayed to its caller so far: as a continuation needs it (the text, kept
/// only when `runs.max_continuations` is above 0), and as its usage needs it when it fails
/// or is cancelled (the output pieces, always counted).
#[derive(Debug, Default)]
pub(super) struct Progress {
    /// Every relayed output's text, in order.
    text: String,
    /// Relayed output events that carried text: the output tokens as far as the edge can
    /// count them (engines stream one token per event).
    outputs: u32,
    /// Relayed output events of the current attempt that carried text, reasoning or a piece
    /// of a tool call: the output tokens it generated, as far as the edge can count them.
    generated: u32,
    /// Some of a tool call was relayed.
    tool_call: bool,
    /// Some reasoning was relayed.
    reasoning: bool,
    /// Output tokens of the attempts before the current one, added to its usage.
    carried: u32,
}

impl Progress {
    /// Notes an event about to be relayed, keeping its text when `keep_text` (continuations
    /// are on); a terminal one gets its usage settled ([`Self::settle`]).
    pub(super) fn note(&mut self, kind: &mut RunEventKind, keep_text: bool) {
        if kind.is_terminal() {
            self.settle(kind);
            return;
        }
        let RunEventKind::Output {
            text, structured, ..
        } = kind
        else {
            return;
        };
        let generated = !text.is_empty()
            || structured
                .as_ref()
                .is_some_and(|s| !s.reasoning.is_empty() || !s.tool_calls.is_empty());
        self.generated = self.generated.saturating_add(u32::from(generated));
        if !keep_text {
            return;
        }
        if !text.is_empty() {
            self.text.push_str(text);
            self.outputs = self.outputs.saturating_add(1);
        }
        if let Some(structured) = structured {
            self.tool_call |= !structured.tool_calls.is_empty();
            self.reasoning |= !structured.reasoning.is_empty();
        }
    }

    /// The next attempt is a continuation: what was relayed so far is carried.
    pub(super) fn carry(&mut self) {
        self.carried = self.outputs;
        self.generated = 0;
    }

    /// Settles a terminal event's usage. A completion's gets the carried output tokens
    /// added. A failure or a cancel counts what was produced: the output tokens its node
    /// reported, at least one per generated piece this attempt relayed (the edge's own
    /// endings, and nodes that report nothing), plus the carried ones; a run that produced
    /// nothing known keeps no usage.
    fn settle(&self, kind: &mut RunEventKind) {
        let completed = matches!(kind, RunEventKind::Completed { .. });
        let Some(usage) = kind.usage_mut() else {
            return;
        };
        if usage.is_none() && !completed && self.generated.saturating_add(self.carried) > 0 {
            *usage = Some(Usage::default());
        }
        if let Some(usage) = usage {
            if !completed {
                usage.output_tokens = usage.output_tokens.max(self.generated);
            }
            usage.output_tokens = usage.output_tokens.saturating_add(self.carried);
        }
    }
}

/// Whether an attempt that ended with `end` after output is one a continuation may follow:
/// its node failed it for the node's reason or was lost.
pub(super) fn lost_for_good(end: AttemptEnd) -> bool {
    matches!(
        end,
        AttemptEnd::Failed(FailureClass::Node) | AttemptEnd::Disconnected
    )
}

/// How many choices the run's input asks for (`n`), and whether it constrains its output
/// (a JSON schema or object, a grammar, a regex, a choice list).
fn input_shape(run: &Run) -> (u32, bool) {
    if !matches!(run.spec.operation, Operation::Chat | Operation::Completion) {
        return (1, false);
    }
    let Ok(body) = serde_json::from_slice::<serde_json::Value>(&run.spec.input) else {
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

impl RunService {
    /// Whether runs keep what they relayed, for a continuation (`runs.max_continuations`
    /// above 0).
    pub(super) fn keeps_progress(&self) -> bool {
        self.inner.routing.policy.max_continuations.get() > 0
    }

    /// After `run`'s attempt ended with `end` once output reached the caller: the node of a
    /// continuation placed now, or `None` to end the run with `kind`, which then names why
    /// it was not continued (when continuations are on and the node was lost for good).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn continue_after(
        &self,
        table: &mut Table,
        run: &Arc<Run>,
        route: &mut Route,
        end: AttemptEnd,
        progress: &Progress,
        kind: &mut RunEventKind,
        now: Instant,
    ) -> Option<NodeId> {
        let spent = run.time_left(now).is_some_and(|left| left.is_zero());
        let applies = self.keeps_progress() && lost_for_good(end);
        if !applies || route.cancelling.is_some() || self.is_draining() || spent {
            return None;
        }
        let placed = self.seat_continuation(table, run, route, progress, now);
        let metrics = &self.inner.metrics;
        match placed {
            Ok(node) => {
                metrics.continued(Ok(()));
                info!(parent: &run.span, run_id = %run.id, %node, relayed_chars = progress.text.len(), "run continued on another node");
                Some(node)
            }
            Err(refusal) => {
                metrics.continued(Err(refusal));
                info!(parent: &run.span, run_id = %run.id, reason = refusal.as_str(), "run not continued");
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
        nodes.retain(|n| n.can_continue && !route.tried.contains(n.hash, n.record.id()));
        let (choices, constrained) = input_shape(run);
        let facts = ContinuationFacts {
            tool_call_started: progress.tool_call,
            reasoning_started: progress.reasoning,
            choices,
            constrained,
            target_resumes_constrained: false,
            capable_nodes: nodes.len(),
            continuations_made: route.continuations,
        };
        let number = may_continue(&facts, self.inner.routing.policy.max_continuations)?;
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
        route.continuations = number;
        route.continuation = Some(Continuation {
            text: progress.text.clone(),
            output_tokens: progress.outputs,
            number,
        });
        Ok(node)
    }
}
