//! [`RunObserver`]: the one trait through which the run service's parts report what they
//! did — placements, relayed events, the queue's depth, failovers, continuations, breaker
//! transitions, refusals, and runs held across a node's reconnect — so the parts name no
//! instrument and each can be built with an observer of its own in its tests. The
//! OpenTelemetry instruments (`metrics/`) are the one observer the edge runs with.

use std::time::Duration;

use crate::domain::routing::{AttemptEnd, RouteReason, Transition};
use crate::domain::{ContinuationRefusal, NodeId, ResumeRefusal, RunEvent};

use super::run::Run;

/// Why a run was refused before acceptance (`edge_run_refusals_total{limit}`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Refusal {
    /// Its API key has its most runs open.
    Concurrency,
    /// Its API key started its most runs for now.
    Rate,
    /// It would wait and the queue is full.
    QueueFull,
    /// Its API key's token budget is used up.
    Budget,
}

impl Refusal {
    pub(super) const ALL: [Refusal; 4] =
        [Self::Concurrency, Self::Rate, Self::QueueFull, Self::Budget];

    pub(super) const fn as_str(self) -> &'static str {
        match self {
            Self::Concurrency => "concurrency",
            Self::Rate => "rate",
            Self::QueueFull => "queue_full",
            Self::Budget => "budget",
        }
    }
}

/// Why a run held for resume ended without being resumed (`edge_runs_resume_lost{reason}`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Loss {
    /// Its node did not come back within `runs.resume_grace_ms`.
    GraceExpired,
    /// Its node registered again without claiming it.
    NotClaimed,
    /// Its node claimed it, and the claim was refused for this reason.
    Refused(ResumeRefusal),
}

impl Loss {
    /// Every loss a run can have, for metrics that pre-declare their label values.
    pub(super) const ALL: [Loss; 4] = [
        Self::GraceExpired,
        Self::NotClaimed,
        Self::Refused(ResumeRefusal::SequenceBehind),
        Self::Refused(ResumeRefusal::EventsLost),
    ];

    /// A stable snake_case name for logs and metric labels.
    pub(super) fn as_str(self) -> &'static str {
        match self {
            Self::GraceExpired => "grace_expired",
            Self::NotClaimed => "not_claimed",
            Self::Refused(refusal) => refusal.as_str(),
        }
    }
}

/// What the run service's parts report. Every method is called on the path it reports
/// from (`relayed` for every event), so an observer only counts and never waits.
pub(super) trait RunObserver: Send + Sync {
    /// An attempt of `run` was placed on `node` for `reason`, `waited` after acceptance.
    fn dispatched(&self, run: &Run, node: &NodeId, reason: &RouteReason, waited: Duration);
    /// An event of `run` was relayed; `first_output` says whether it is its first output.
    fn relayed(&self, run: &Run, event: &RunEvent, first_output: bool);
    /// `depth` runs wait in the queue now.
    fn queued(&self, depth: usize);
    /// An attempt that ended with `end` is placed again.
    fn failed_over(&self, end: AttemptEnd);
    /// A run whose node was lost after output was continued (`Ok`) or not.
    fn continued(&self, outcome: Result<(), ContinuationRefusal>);
    /// A circuit breaker changed state.
    fn breaker(&self, transition: Transition);
    /// A run was refused by `limit`.
    fn refused(&self, limit: Refusal);
    /// A run was detached from its node's dropped connection.
    fn detached(&self);
    /// A run was re-attached after `detached_for` (`None`: it was taken over from a
    /// connection that had not dropped yet).
    fn reattached(&self, detached_for: Option<Duration>);
    /// A run held for resume was ended for `loss`.
    fn resume_lost(&self, loss: Loss);
    /// A run ended while detached, `detached_for` after it was detached.
    fn ended_detached(&self, detached_for: Duration);
}

/// An observer that notes nothing, for the parts' own tests.
#[cfg(test)]
pub(super) struct Unobserved;

#[cfg(test)]
impl RunObserver for Unobserved {
    fn dispatched(&self, _: &Run, _: &NodeId, _: &RouteReason, _: Duration) {}
    fn relayed(&self, _: &Run, _: &RunEvent, _: bool) {}
    fn queued(&self, _: usize) {}
    fn failed_over(&self, _: AttemptEnd) {}
    fn continued(&self, _: Result<(), ContinuationRefusal>) {}
    fn breaker(&self, _: Transition) {}
    fn refused(&self, _: Refusal) {}
    fn detached(&self) {}
    fn reattached(&self, _: Option<Duration>) {}
    fn resume_lost(&self, _: Loss) {}
    fn ended_detached(&self, _: Duration) {}
}
