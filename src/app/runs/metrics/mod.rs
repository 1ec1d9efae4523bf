//! The run service's OpenTelemetry instruments, its one [`RunObserver`]: runs and their
//! events (here), routing — placements by rule, failovers, breaker transitions, refusals by
//! limit (`routing.rs`) — and runs held across a node's reconnect (`resume.rs`).

mod resume;
mod routing;

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use opentelemetry::KeyValue;
use opentelemetry::metrics::{BoundCounter, BoundHistogram, Counter, Histogram, Meter};

use self::resume::ResumeMetrics;
use self::routing::RoutingCounts;
use super::observer::{Loss, Refusal, RunObserver};
use super::run::{Run, lock};
use crate::domain::routing::{
    AffinityKey, AttemptEnd, KeySource, Priority, RouteReason, TenantKey, Transition,
};
use crate::domain::stats::{Ending, RunEnd, StatsWindow};
use crate::domain::{
    AdapterName, EventOrigin, FleetStats, NodeId, RunEvent, RunEventKind, RunSpec, Target,
};
use crate::ports::clock::now_ms;

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
/// attribute costs a hash lookup of the attribute set per call). A run's own measurements
/// go through its route's bound instruments ([`RouteMetrics`]).
pub(super) struct RunMetrics {
    started: Counter<u64>,
    finished: Counter<u64>,
    relayed: Arc<[AtomicU64; KINDS.len()]>,
    queue_wait: Histogram<f64>,
    first_output: Histogram<f64>,
    duration: Histogram<f64>,
    /// Each route's bound instruments, made at the route's first dispatch.
    routes: Mutex<HashMap<(AdapterName, Target), Arc<RouteMetrics>>>,
    routing: Arc<RoutingCounts>,
    /// Tokens of ended runs: input, cached input, output.
    tokens: [Counter<u64>; 3],
    /// Runs detached, re-attached and lost around their node's reconnects.
    resume: ResumeMetrics,
    /// The last hour in buckets, for `/admin/v1/stats`: written once per run start and
    /// end and per queued run (a short lock; never on an output event).
    stats: Mutex<FleetStats>,
}

/// The instruments of one route (adapter and target), bound to its labels the first time
/// each is used: a measurement through a bound instrument skips the SDK's lookup of the
/// attribute set (decision 27). A run finds them once, at its first dispatch.
struct RouteMetrics {
    labels: [KeyValue; 2],
    started: OnceLock<BoundCounter<u64>>,
    /// By priority, in the order of [`priority_index`].
    queue_wait: [OnceLock<BoundHistogram<f64>>; 2],
    first_output: OnceLock<BoundHistogram<f64>>,
    duration: OnceLock<BoundHistogram<f64>>,
    /// `edge_runs_finished{outcome="completed",code=""}`, most runs' end.
    completed: OnceLock<BoundCounter<u64>>,
    /// The token counters (input, cached input, output) by API key, node and affinity
    /// source, bound at each group's first ended run: every label is bounded by the config
    /// or a fixed set.
    tokens: Mutex<HashMap<TokenGroup, Arc<[BoundCounter<u64>; 3]>>>,
}

/// An API key (tenant), a node (`None`: not placed) and an affinity key's source.
type TokenGroup = (TenantKey, Option<NodeId>, &'static str);

fn priority_index(priority: Priority) -> usize {
    match priority {
        Priority::Interactive => 0,
        Priority::Batch => 1,
    }
}

fn route(spec: &RunSpec) -> [KeyValue; 2] {
    [
        KeyValue::new("adapter", spec.selector.adapter.to_shared()),
        KeyValue::new("target", spec.model_target().to_shared()),
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
            routes: Mutex::default(),
            routing: RoutingCounts::register(meter),
            tokens: token_counters(meter),
            resume: ResumeMetrics::new(meter),
            stats: Mutex::default(),
        }
    }

    /// The instruments of `run`'s model, found (or made) on its first dispatch: a
    /// dispatched run's model is a configured target or a LoRA some node reported, so the
    /// models kept are bounded by the config and the nodes' reports.
    fn route_of<'a>(&self, run: &'a Run) -> Option<&'a RouteMetrics> {
        run.observed(|| {
            let spec = run.spec();
            let key = (spec.selector.adapter.clone(), spec.model_target().clone());
            let mut routes = lock(&self.routes);
            let bound = routes.entry(key).or_insert_with(|| {
                Arc::new(RouteMetrics {
                    labels: route(run.spec()),
                    started: OnceLock::new(),
                    queue_wait: [OnceLock::new(), OnceLock::new()],
                    first_output: OnceLock::new(),
                    duration: OnceLock::new(),
                    completed: OnceLock::new(),
                    tokens: Mutex::default(),
                })
            });
            Arc::clone(bound)
        })
    }

    /// [`Self::relayed`]'s measurements of a run that was never dispatched.
    fn measure_unbound(&self, spec: &RunSpec, event: &RunEvent, since_accepted: f64) {
        if event.kind.is_terminal() {
            let labels = finished_labels(route(spec), event);
            self.finished.add(1, &labels);
            self.duration.record(since_accepted, &labels[..2]);
        }
    }

    /// The tokens `event`, `run`'s terminal event, reports: by key, model, node and the
    /// source of the run's affinity key, through `bound`'s counters for the group.
    fn count_tokens(&self, run: &Run, bound: &RouteMetrics, event: &RunEvent) {
        let Some(usage) = event.kind.usage() else {
            return;
        };
        let routing = &run.spec().routing;
        let affinity = KeySource::label(routing.affinity.map(AffinityKey::source));
        let group = (routing.tenant.clone(), event.node.clone(), affinity);
        let counters = Arc::clone(lock(&bound.tokens).entry(group).or_insert_with_key(
            |(tenant, node, affinity)| {
                let spec = run.spec();
                let model = format!("{}/{}", spec.selector.adapter, spec.model_target());
                let labels = [
                    KeyValue::new("key", tenant.as_str().to_owned()),
                    KeyValue::new("model", model),
                    KeyValue::new("node", node.as_ref().map_or("", |n| n.as_str()).to_owned()),
                    KeyValue::new("affinity", *affinity),
                ];
                Arc::new(self.tokens.each_ref().map(|counter| counter.bind(&labels)))
            },
        ));
        let counts = [
            usage.input_tokens,
            usage.cached_input_tokens,
            usage.output_tokens,
        ];
        for (counter, count) in counters.iter().zip(counts) {
            counter.add(count.into());
        }
    }

    /// `run` ended with `event`: its bucket in the last hour's series.
    fn count_end(&self, run: &Run, event: &RunEvent) {
        let ending = match &event.kind {
            RunEventKind::Completed { .. } => Ending::Completed,
            RunEventKind::Failed { .. } => Ending::Failed,
            _ => Ending::Cancelled,
        };
        let output_tokens = event.kind.usage().map_or(0, |u| u64::from(u.output_tokens));
        let queued_ms = run.accepted().queued_ms;
        let end = RunEnd {
            ending,
            ttft_ms: run
                .first_output_ms()
                .map(|first| first.saturating_sub(queued_ms)),
            output_tokens,
        };
        let node = run.last_node();
        lock(&self.stats).ended(now_ms(), node.as_ref(), end);
    }

    /// The last hour's series, as of now.
    pub(super) fn window(&self) -> StatsWindow {
        lock(&self.stats).window(now_ms())
    }
}

impl RunObserver for RunMetrics {
    /// An attempt of `run` was placed on `node` for `reason`; the first attempt's
    /// placement after waiting `waited` since acceptance also counts the run as started.
    fn dispatched(&self, run: &Run, node: &NodeId, reason: &RouteReason, waited: Duration) {
        let failover = reason.is_failover();
        self.routing.placed(reason);
        if failover {
            return;
        }
        lock(&self.stats).started(now_ms(), node);
        let Some(bound) = self.route_of(run) else {
            return;
        };
        let labels = &bound.labels;
        let started = bound.started.get_or_init(|| self.started.bind(labels));
        started.add(1);
        let priority = run.spec().routing.priority;
        let queue_wait = bound.queue_wait[priority_index(priority)].get_or_init(|| {
            let priority = KeyValue::new("priority", priority.as_str());
            self.queue_wait
                .bind(&[labels[0].clone(), labels[1].clone(), priority])
        });
        queue_wait.record(waited.as_secs_f64());
    }
    /// An event of `run` was relayed; `first_output` says whether it is the run's first
    /// output.
    fn relayed(&self, run: &Run, event: &RunEvent, first_output: bool) {
        self.relayed[kind_index(&event.kind)].fetch_add(1, Ordering::Relaxed);
        if !first_output && !event.kind.is_terminal() {
            // Most events: nothing else to record, and no clock to read.
            return;
        }
        let since_accepted = run.accepted_at().elapsed().as_secs_f64();
        if event.kind.is_terminal() {
            self.count_end(run, event);
        }
        let Some(bound) = run.observed_yet::<RouteMetrics>() else {
            // Never dispatched (it ended waiting): measured through the attribute set.
            self.measure_unbound(run.spec(), event, since_accepted);
            return;
        };
        let labels = &bound.labels;
        if first_output {
            let histogram = bound
                .first_output
                .get_or_init(|| self.first_output.bind(labels));
            histogram.record(since_accepted);
        }
        if event.kind.is_terminal() {
            self.count_tokens(run, bound, event);
            let duration = bound.duration.get_or_init(|| self.duration.bind(labels));
            duration.record(since_accepted);
            if matches!(event.kind, RunEventKind::Completed { .. }) {
                let completed = bound
                    .completed
                    .get_or_init(|| self.finished.bind(&finished_labels(labels.clone(), event)));
                completed.add(1);
            } else {
                self.finished
                    .add(1, &finished_labels(labels.clone(), event));
            }
        }
    }
    /// `depth` runs wait in the queue now.
    fn queued(&self, depth: usize) {
        lock(&self.stats).queued(now_ms(), depth);
    }
    /// An attempt that ended with `end` is placed again.
    fn failed_over(&self, end: AttemptEnd) {
        self.routing.failed_over(end);
    }
    /// A run whose node was lost after output was continued (`Ok`) or not.
    fn continued(&self, outcome: Result<(), crate::domain::ContinuationRefusal>) {
        self.routing.continued(outcome);
    }
    /// A circuit breaker changed state.
    fn breaker(&self, transition: Transition) {
        self.routing.breaker(transition);
    }
    /// A run was refused by `limit`.
    fn refused(&self, limit: Refusal) {
        self.routing.refused(limit);
    }

    fn detached(&self) {
        self.resume.detached();
    }

    fn reattached(&self, detached_for: Option<Duration>) {
        self.resume.reattached(detached_for);
    }

    fn resume_lost(&self, loss: Loss) {
        self.resume.lost(loss);
    }

    fn ended_detached(&self, detached_for: Duration) {
        self.resume.ended_detached(detached_for);
    }
}

/// `edge_input_tokens_total`, `edge_cached_input_tokens_total`, `edge_output_tokens_total`.
fn token_counters(meter: &Meter) -> [Counter<u64>; 3] {
    [
        (
            "edge_input_tokens",
            "Prompt tokens of ended runs, as their nodes reported them",
        ),
        (
            "edge_cached_input_tokens",
            "Prompt tokens the engines served from their prompt caches (part of the input tokens)",
        ),
        ("edge_output_tokens", "Generated tokens of ended runs"),
    ]
    .map(|(name, description)| {
        meter
            .u64_counter(name)
            .with_description(format!(
                "{description}, by API key, model, node and affinity key source"
            ))
            .build()
    })
}

/// The labels of `edge_runs_finished` for a run of `route` ending with `event`.
fn finished_labels(route: [KeyValue; 2], event: &RunEvent) -> [KeyValue; 4] {
    let code = match (&event.kind, event.origin) {
        (RunEventKind::Failed { code, .. }, EventOrigin::Edge) => code.clone(),
        // A node's own codes are free text: keep the label set bounded.
        (RunEventKind::Failed { .. }, EventOrigin::Node) => "node_reported".to_owned(),
        _ => String::new(),
    };
    let [adapter, target] = route;
    [
        adapter,
        target,
        KeyValue::new("outcome", event.kind.name()),
        KeyValue::new("code", code),
    ]
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
            RunEventKind::cancelled(String::new()),
        ];
        for kind in &kinds {
            assert_eq!(KINDS[kind_index(kind)], kind.name());
        }
    }
}
