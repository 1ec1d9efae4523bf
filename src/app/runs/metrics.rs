//! The run service's OpenTelemetry instruments.

use std::time::Duration;

use opentelemetry::KeyValue;
use opentelemetry::metrics::{Counter, Histogram, Meter};

use crate::domain::{EventOrigin, RunEvent, RunEventKind, RunSpec};

/// Bucket bounds in seconds for run latencies: from milliseconds (an instant answer) to
/// ten minutes (a long generation).
const LATENCY_BUCKETS: [f64; 18] = [
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
    120.0, 300.0, 600.0,
];

/// Counters and histograms of runs, labelled by adapter and target (both come from the
/// config: only runs a configured node serves are started) and outcome.
pub(super) struct RunMetrics {
    started: Counter<u64>,
    finished: Counter<u64>,
    relayed: Counter<u64>,
    queue_wait: Histogram<f64>,
    first_output: Histogram<f64>,
    duration: Histogram<f64>,
}

fn route(spec: &RunSpec) -> [KeyValue; 2] {
    [
        KeyValue::new("adapter", spec.selector.adapter.to_string()),
        KeyValue::new("target", spec.selector.target.to_string()),
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
        Self {
            started: meter
                .u64_counter("edge_runs_started")
                .with_description("Runs sent to a node, by adapter and target")
                .build(),
            finished: meter
                .u64_counter("edge_runs_finished")
                .with_description("Runs ended, by adapter, target, outcome and failure code")
                .build(),
            relayed: meter
                .u64_counter("edge_run_events_relayed")
                .with_description("Run events relayed to sinks and callers, by kind")
                .build(),
            queue_wait: latency("edge_run_queue_wait", "Time from acceptance to dispatch"),
            first_output: latency(
                "edge_run_time_to_first_output",
                "Time from acceptance to the first output event",
            ),
            duration: latency(
                "edge_run_duration",
                "Time from acceptance to the terminal event",
            ),
        }
    }

    /// A run was sent to a node after waiting `waited`.
    pub(super) fn dispatched(&self, spec: &RunSpec, waited: Duration) {
        let labels = route(spec);
        self.started.add(1, &labels);
        self.queue_wait.record(waited.as_secs_f64(), &labels);
    }

    /// An event was relayed, `since_accepted` after the run was accepted; `first_output`
    /// says whether it is the run's first output.
    pub(super) fn relayed(
        &self,
        spec: &RunSpec,
        event: &RunEvent,
        since_accepted: Duration,
        first_output: bool,
    ) {
        self.relayed
            .add(1, &[KeyValue::new("kind", event.kind.name())]);
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
}
