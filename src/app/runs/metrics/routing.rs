//! The routing counters: placements by rule, failovers by why the attempt ended, breaker
//! transitions by the state entered, and refusals by limit. Plain atomics, exported by
//! observable counters with every label value declared, so each series exists (at 0) from
//! the start and rates need no first event.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use opentelemetry::KeyValue;
use opentelemetry::metrics::Meter;

use crate::app::runs::observer::Refusal;
use crate::domain::routing::{AttemptEnd, RouteReason, Transition};
use crate::domain::{ContinuationRefusal, FailureClass};

/// The `rule` label values, as `RouteReason::label` names them.
const RULES: [&str; 6] = [
    "pinned",
    "affinity_hit",
    "affinity_miss",
    "affinity_overloaded",
    "least_busy",
    "continuation",
];

/// The `outcome` label values of `edge_run_continuations_total`: placed, or the refusal.
const CONTINUATION_OUTCOMES: [&str; 6] = [
    "placed",
    ContinuationRefusal::ALL[0].as_str(),
    ContinuationRefusal::ALL[1].as_str(),
    ContinuationRefusal::ALL[2].as_str(),
    ContinuationRefusal::ALL[3].as_str(),
    ContinuationRefusal::ALL[4].as_str(),
];

/// The `reason` label values of `edge_run_failovers_total`.
const FAILOVER_REASONS: [&str; 3] = ["node_failure", "refused", "node_disconnected"];

/// The `to` label values of `edge_breaker_transitions_total`.
const BREAKER_STATES: [&str; 3] = ["open", "half_open", "closed"];

/// The `limit` label values of `edge_run_refusals_total`, in [`Refusal::ALL`]'s order.
const REFUSALS: [&str; 4] = [
    Refusal::Concurrency.as_str(),
    Refusal::Rate.as_str(),
    Refusal::QueueFull.as_str(),
    Refusal::Budget.as_str(),
];

/// One labelled counter: name, description, label, its values, and its counts.
type LabelledCounts = (
    &'static str,
    &'static str,
    &'static str,
    &'static [&'static str],
    fn(&RoutingCounts) -> &[AtomicU64],
);

/// The counts behind the routing counters.
#[derive(Debug, Default)]
pub(super) struct RoutingCounts {
    /// By rule, then first attempt (0) or failover (1).
    placements: [[AtomicU64; 2]; RULES.len()],
    failovers: [AtomicU64; FAILOVER_REASONS.len()],
    transitions: [AtomicU64; BREAKER_STATES.len()],
    refusals: [AtomicU64; Refusal::ALL.len()],
    continuations: [AtomicU64; CONTINUATION_OUTCOMES.len()],
}

impl RoutingCounts {
    /// Fresh counts, exported through `meter`.
    pub(super) fn register(meter: &Meter) -> Arc<Self> {
        let counts = Arc::new(Self::default());
        let placed = Arc::clone(&counts);
        meter
            .u64_observable_counter("edge_run_placements")
            .with_description(
                "Attempts placed on a node, by the rule that chose it and whether it is a failover",
            )
            .with_callback(move |o| {
                for (rule, by_kind) in RULES.iter().zip(&placed.placements) {
                    for (failover, count) in [false, true].into_iter().zip(by_kind) {
                        let labels = [
                            KeyValue::new("rule", *rule),
                            KeyValue::new("failover", failover),
                        ];
                        o.observe(count.load(Ordering::Relaxed), &labels);
                    }
                }
            })
            .build();
        for (name, description, label, values, field) in labelled_counts() {
            let counts = Arc::clone(&counts);
            meter
                .u64_observable_counter(name)
                .with_description(description)
                .with_callback(move |o| {
                    for (value, count) in values.iter().zip(field(&counts)) {
                        o.observe(
                            count.load(Ordering::Relaxed),
                            &[KeyValue::new(label, *value)],
                        );
                    }
                })
                .build();
        }
        counts
    }

    /// An attempt was placed for `reason`.
    pub(super) fn placed(&self, reason: &RouteReason) {
        let rule = RULES
            .iter()
            .position(|r| *r == reason.label())
            .unwrap_or(RULES.len() - 1);
        let kind = usize::from(reason.is_failover());
        if let Some(count) = self.placements.get(rule).and_then(|k| k.get(kind)) {
            count.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// An attempt that ended with `end` was placed again.
    pub(super) fn failed_over(&self, end: AttemptEnd) {
        let index = match end {
            AttemptEnd::Failed(FailureClass::Refused) => 1,
            AttemptEnd::Disconnected => 2,
            _ => 0,
        };
        self.failovers[index].fetch_add(1, Ordering::Relaxed);
    }

    /// A breaker changed state.
    pub(super) fn breaker(&self, transition: Transition) {
        let index = match transition {
            Transition::Opened { .. } => 0,
            Transition::HalfOpened => 1,
            Transition::Closed => 2,
        };
        self.transitions[index].fetch_add(1, Ordering::Relaxed);
    }

    /// A run whose node was lost after output was continued (`Ok`) or not.
    pub(super) fn continued(&self, outcome: Result<(), ContinuationRefusal>) {
        let index = match outcome {
            Ok(()) => 0,
            Err(refusal) => {
                1 + ContinuationRefusal::ALL
                    .iter()
                    .position(|r| *r == refusal)
                    .unwrap_or(0)
            }
        };
        if let Some(count) = self.continuations.get(index) {
            count.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// A run was refused by `limit`.
    pub(super) fn refused(&self, limit: Refusal) {
        let index = Refusal::ALL.iter().position(|l| *l == limit).unwrap_or(0);
        self.refusals[index].fetch_add(1, Ordering::Relaxed);
    }
}

/// The labelled counters besides placements: failovers, breaker transitions, refusals and
/// continuations.
fn labelled_counts() -> [LabelledCounts; 4] {
    [
        (
            "edge_run_failovers",
            "Attempts that ended before any output and were placed again, by why they ended",
            "reason",
            &FAILOVER_REASONS,
            |c| &c.failovers,
        ),
        (
            "edge_breaker_transitions",
            "Circuit breaker state changes, by the state entered",
            "to",
            &BREAKER_STATES,
            |c| &c.transitions,
        ),
        (
            "edge_run_refusals",
            "Runs refused before acceptance, by the limit that refused them",
            "limit",
            &REFUSALS,
            |c| &c.refusals,
        ),
        (
            "edge_run_continuations",
            "Runs whose node was lost after output, by whether another node carried them on or why not",
            "outcome",
            &CONTINUATION_OUTCOMES,
            |c| &c.continuations,
        ),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::routing::RouteRule;

    #[test]
    fn every_rule_has_a_label_value() {
        for rule in [RouteRule::Pinned, RouteRule::LeastBusy] {
            let reason = RouteReason {
                rule,
                attempt: 1,
                eligible: 1,
                queue_wait: None,
            };
            assert!(RULES.contains(&reason.label()));
        }
        for (refusal, name) in
            Refusal::ALL
                .iter()
                .zip(["concurrency", "rate", "queue_full", "budget"])
        {
            assert_eq!(refusal.as_str(), name);
        }
    }
}
