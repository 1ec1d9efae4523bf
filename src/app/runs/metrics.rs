//! The run service's OpenTelemetry instruments: runs and their events, routing
//! (placements by rule, failovers, breaker transitions, refusals by limit) and resume.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use opentelemetry::KeyValue;
use opentelemetry::metrics::{Counter, Histogram, Meter};
use tokio::time::Instant;

use super::resume_metrics::ResumeMetrics;
use super::routing_metrics::{Refusal, RoutingCounts};
use crate::domain::routing::{AttemptEnd, RouteReason, Transition};
use crate::domain::{EventOrigin, RunEvent, RunEventKind, RunSpec};

/// Bucket bounds in seconds for run latencies: from milliseconds (an instant answer) to
/// ten minutes (a long generation).
pub(super) const LATENCY_BUCKETS: [f64; 18] = [
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
    120.0, 300.0, 600.0,
];

/// The event kinds, in the order of [`kind_index`].
const KINDS: [&str; 5] = ["started", "output", "completed", "failed", "cancelled"];

fn kind_index(kind: &RunEventKind) -> usize {
    match kind {
        RunEventKind::Started => 0,
        RunEventKind::Output { .. } => 1,
        RunEventKind::Completed { .. } => 2,
        RunEventKind::Failed { .. } => 3,
        RunEventKind::Cancelled { .. } => 4,
    }
}

/// Counters and histograms of runs, labelled by adapter and target (both come from the
/// config: only runs a configured node serves are started) and outcome.
///
/// Relayed events are counted per event, on the relay's hot path: plain atomics, read by an
/// observable counter when metrics are collected (an OpenTelemetry counter with an
/// attribute costs a hash lookup of the attribute set per call).
pub(super) struct RunMetrics {
    started: Counter<u64>,
    finished: Counter<u64>,
    relayed: Arc<[AtomicU64; KINDS.len()]>,
    queue_wait: Histogram<f64>,
    first_output: Histogram<f64>,
    duration: Histogram<f64>,
    routing: Arc<RoutingCounts>,
    /// Runs detached, re-attached and lost around their node's reconnects.
    pub(super) resume: ResumeMetrics,
}

fn route(spec: &RunSpec) -> [KeyValue; 2] {
    [
        KeyValue::new("adapter", spec.selector.adapter.to_shared()),
        KeyValue::new("target", spec.selector.target.to_shared()),
    ]
}

impl RunMetrics {
    pub(super) fn new(meter: &Meter) -> Self {
        let latency = |name: &'static str, description: &'static str| {
            meter
                .f64_histogram(name)
                .with_description(description)
                .with_unit("s")
                .with_boundaries(LATENCY_BUCKETS.to_vec())
                .build()
        };
        let relayed: Arc<[AtomicU64; KINDS.len()]> = Arc::default();
        let counts = Arc::clone(&relayed);
        meter
            .u64_observable_counter("edge_run_events_relayed")
            .with_description("Run events relayed to sinks and callers, by kind")
            .with_callback(move |o| {
                for (count, kind) in counts.iter().zip(KINDS) {
                    o.observe(
                        count.load(Ordering::Relaxed),
                        &[KeyValue::new("kind", kind)],
                    );
                }
            })
            .build();
        Self {
            started: meter
                .u64_counter("edge_runs_started")
                .with_description("Runs sent to a node, by adapter and target")
                .build(),
            finished: meter
                .u64_counter("edge_runs_finished")
                .with_description("Runs ended, by adapter, target, outcome and failure code")
                .build(),
            relayed,
            queue_wait: latency("edge_run_queue_wait", "Time from acceptance to dispatch"),
            first_output: latency(
                "edge_run_time_to_first_output",
                "Time from acceptance to the first output event",
            ),
            duration: latency(
                "edge_run_duration",
                "Time from acceptance to the terminal event",
            ),
            routing: RoutingCounts::register(meter),
            resume: ResumeMetrics::new(meter),
        }
    }

    /// An attempt of a run was placed on a node for `reason`; the first attempt's
    /// placement after waiting `waited` since acceptance also counts the run as started.
    pub(super) fn dispatched(&self, spec: &RunSpec, reason: &RouteReason, waited: Duration) {
        let failover = reason.is_failover();
        self.routing.placed(reason);
        if failover {
            return;
        }
        let [adapter, target] = route(spec);
        self.started.add(1, &[adapter.clone(), target.clone()]);
        let priority = KeyValue::new("priority", spec.routing.priority.as_str());
        self.queue_wait
            .record(waited.as_secs_f64(), &[adapter, target, priority]);
    }

    /// An event of a run accepted at `accepted_at` was relayed; `first_output` says whether
    /// it is the run's first output.
    pub(super) fn relayed(
        &self,
        spec: &RunSpec,
        event: &RunEvent,
        accepted_at: Instant,
        first_output: bool,
    ) {
        self.relayed[kind_index(&event.kind)].fetch_add(1, Ordering::Relaxed);
        if !first_output && !event.kind.is_terminal() {
            // Most events: nothing else to record, and no clock to read.
            return;
        }
        let since_accepted = accepted_at.elapsed();
        if first_output {
            self.first_output
                .record(since_accepted.as_secs_f64(), &route(spec));
        }
        if event.kind.is_terminal() {
            let [adapter, target] = route(spec);
            let code = match (&event.kind, event.origin) {
                (RunEventKind::Failed { code, .. }, EventOrigin::Edge) => code.clone(),
                // A node's own codes are free text: keep the label set bounded.
                (RunEventKind::Failed { .. }, EventOrigin::Node) => "node_reported".to_owned(),
                _ => String::new(),
            };
            let labels = [
                adapter,
                target,
                KeyValue::new("outcome", event.kind.name()),
                KeyValue::new("code", code),
            ];
            self.finished.add(1, &labels);
            self.duration
                .record(since_accepted.as_secs_f64(), &labels[..2]);
        }
    }

    /// An attempt that ended with `end` is placed again.
    pub(super) fn failed_over(&self, end: AttemptEnd) {
        self.routing.failed_over(end);
    }

    /// A circuit breaker changed state.
    pub(super) fn breaker(&self, transition: Transition) {
        self.routing.breaker(transition);
    }

    /// A run was refused by `limit`.
    pub(super) fn refused(&self, limit: Refusal) {
        self.routing.refused(limit);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kind_labels_are_the_kinds_names() {
        let kinds = [
            RunEventKind::Started,
            RunEventKind::text(""),
            RunEventKind::Completed {
                finish_reason: String::new(),
                usage: None,
            },
            RunEventKind::failed(String::new(), String::new()),
            RunEventKind::Cancelled {
                reason: String::new(),
            },
        ];
        for kind in &kinds {
            assert_eq!(KINDS[kind_index(kind)], kind.name());
        }
    }
}
