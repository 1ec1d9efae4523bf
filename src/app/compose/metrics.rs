//! The metrics pipeline: OpenTelemetry instruments exported in Prometheus text format.
//!
//! [`Metrics`] owns the meter provider and the Prometheus registry it exports into; the
//! HTTP adapter renders that registry at `GET /metrics` (rendering is the adapter's, not
//! this module's). Counters kept as atomics by the
//! adapters (transport, sinks) and the run service are exported through observable
//! instruments registered in [`Metrics::observe`], so those components stay free of the
//! exporter. Label values are bounded: reasons and outcomes from fixed lists, adapters and
//! targets from the config, sink names — never a run id or a token.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use opentelemetry::KeyValue;
use opentelemetry::metrics::{Meter, MeterProvider as _};
use opentelemetry_sdk::metrics::SdkMeterProvider;

use crate::adapters::sinks::{BuiltSink, SinkStats};
use crate::adapters::tcp::TransportStats;
use crate::domain::{RegisterRejection, TakeoverReason, TakeoverRefusal};
use crate::ports::{CloseReason, NodeStore, Registry};

use crate::app::runs::RunService;

/// What [`Metrics::observe`] reads on every scrape.
pub struct MetricSources {
    /// For `edge_nodes_configured`.
    pub store: Arc<dyn NodeStore>,
    /// For `edge_nodes_connected`.
    pub registry: Arc<dyn Registry>,
    /// The node transport's counters.
    pub transport: Arc<TransportStats>,
    /// For active and queued runs and dropped events.
    pub runs: RunService,
    /// Each sink's counters.
    pub sinks: Vec<BuiltSink>,
}

/// An exported counter read from a field of an adapter's stats: name, description, unit,
/// and how to read it.
type StatCounter<S, V> = (
    &'static str,
    &'static str,
    Option<&'static str>,
    fn(&S) -> V,
);

/// The meter provider and the registry `/metrics` renders.
pub struct Metrics {
    provider: SdkMeterProvider,
    registry: prometheus::Registry,
    meter: Meter,
}

impl Metrics {
    /// A fresh pipeline (one per edge, so tests in one process do not share counters).
    ///
    /// # Errors
    /// The exporter could not register with the Prometheus registry.
    pub fn new() -> anyhow::Result<Self> {
        let registry = prometheus::Registry::new();
        let exporter = opentelemetry_prometheus::exporter()
            .with_registry(registry.clone())
            .scope_info_enabled(false)
            .without_target_info()
            .build()?;
        let provider = SdkMeterProvider::builder().with_reader(exporter).build();
        let meter = provider.meter("edge");
        Ok(Self {
            provider,
            registry,
            meter,
        })
    }

    /// The meter instruments are created from.
    pub fn meter(&self) -> &Meter {
        &self.meter
    }

    /// The registry the exporter writes into, for `GET /metrics`.
    pub fn registry(&self) -> prometheus::Registry {
        self.registry.clone()
    }

    /// Registers the observable instruments that read the sources on every scrape.
    pub fn observe(&self, sources: MetricSources) {
        let MetricSources {
            store,
            registry,
            transport,
            runs,
            sinks,
        } = sources;
        let meter = &self.meter;
        let configured = u64::try_from(store.records().len()).unwrap_or(u64::MAX);
        meter
            .u64_observable_gauge("edge_nodes_configured")
            .with_description("Node definitions loaded from the config")
            .with_callback(move |o| o.observe(configured, &[]))
            .build();
        meter
            .u64_observable_gauge("edge_nodes_connected")
            .with_description("Nodes registered and connected now")
            .with_callback(move |o| o.observe(count(registry.len()), &[]))
            .build();
        self.observe_transport(&transport);
        self.observe_runs(runs);
        self.observe_sinks(sinks);
    }

    fn observe_transport(&self, stats: &Arc<TransportStats>) {
        let meter = &self.meter;
        let counters: [StatCounter<TransportStats, u64>; 5] = [
            (
                "edge_connections_refused",
                "Connections closed at once because the connection limit was reached",
                None,
                |s| s.connections_refused.load(Ordering::Relaxed),
            ),
            (
                "edge_frames_received",
                "Frames read from nodes",
                None,
                |s| s.frames_in.load(Ordering::Relaxed),
            ),
            ("edge_frames_sent", "Frames written to nodes", None, |s| {
                s.frames_out.load(Ordering::Relaxed)
            }),
            (
                "edge_transport_received",
                "Bytes read from nodes, length prefixes included",
                Some("By"),
                |s| s.bytes_in.load(Ordering::Relaxed),
            ),
            (
                "edge_transport_sent",
                "Bytes written to nodes, length prefixes included",
                Some("By"),
                |s| s.bytes_out.load(Ordering::Relaxed),
            ),
        ];
        for (name, description, unit, field) in counters {
            let stats = Arc::clone(stats);
            let builder = meter
                .u64_observable_counter(name)
                .with_description(description)
                .with_callback(move |o| o.observe(field(&stats), &[]));
            match unit {
                Some(unit) => builder.with_unit(unit).build(),
                None => builder.build(),
            };
        }
        self.observe_connections(stats);
    }

    /// Connections open and closed, registrations, departures and evictions.
    fn observe_connections(&self, stats: &Arc<TransportStats>) {
        let meter = &self.meter;
        let open = Arc::clone(stats);
        meter
            .u64_observable_gauge("edge_connections_open")
            .with_description("Node connections open now, registered or not")
            .with_callback(move |o| o.observe(open.connections_open.load(Ordering::Relaxed), &[]))
            .build();
        let closed = Arc::clone(stats);
        meter
            .u64_observable_counter("edge_connections_closed")
            .with_description("Node connections closed, by reason")
            .with_callback(move |o| {
                for reason in CloseReason::ALL {
                    o.observe(
                        closed.closed(reason),
                        &[KeyValue::new("reason", reason.as_str())],
                    );
                }
            })
            .build();
        let registrations = Arc::clone(stats);
        meter
            .u64_observable_counter("edge_node_registrations")
            .with_description("Registration attempts, by result (accepted or the reject reason)")
            .with_callback(move |o| {
                let accepted = registrations.registrations_accepted.load(Ordering::Relaxed);
                o.observe(accepted, &[KeyValue::new("result", "accepted")]);
                for rejection in RegisterRejection::ALL {
                    let value = registrations.rejected(rejection);
                    o.observe(value, &[KeyValue::new("result", rejection.as_str())]);
                }
            })
            .build();
        let disconnects = Arc::clone(stats);
        meter
            .u64_observable_counter("edge_node_disconnects")
            .with_description("Registered nodes that left, by reason")
            .with_callback(move |o| {
                for reason in CloseReason::ALL {
                    if reason != CloseReason::Rejected {
                        let value = disconnects.disconnects(reason);
                        o.observe(value, &[KeyValue::new("reason", reason.as_str())]);
                    }
                }
            })
            .build();
        self.observe_availability(stats);
        self.observe_takeovers(stats);
    }

    /// Each node's availability changes.
    fn observe_availability(&self, stats: &Arc<TransportStats>) {
        let availability = Arc::clone(stats);
        self.meter
            .u64_observable_counter("edge_node_availability_changes")
            .with_description(
                "Availability reports that changed the targets a node serves, by node (an \
                 engine down or up again, a model loaded or unloaded): a node whose count keeps \
                 rising flaps",
            )
            .with_callback(move |o| {
                for (node, changes) in availability.availability_changes() {
                    o.observe(changes, &[KeyValue::new("node", node.to_string())]);
                }
            })
            .build();
    }

    /// Dead links by the side that declared them, takeovers and refused takeovers.
    fn observe_takeovers(&self, stats: &Arc<TransportStats>) {
        let meter = &self.meter;
        let dead = Arc::clone(stats);
        meter
            .u64_observable_counter("edge_node_links_declared_dead")
            .with_description(
                "Links to registered nodes found dead, by the side that declared it (edge: \
                 heartbeat silence; node: the same node instance came back on a new connection)",
            )
            .with_callback(move |o| {
                o.observe(
                    dead.links_declared_dead(false),
                    &[KeyValue::new("by", "edge")],
                );
                o.observe(
                    dead.links_declared_dead(true),
                    &[KeyValue::new("by", "node")],
                );
            })
            .build();
        let takeovers = Arc::clone(stats);
        meter
            .u64_observable_counter("edge_node_takeovers")
            .with_description("Registrations that took over the node's live connection, by reason")
            .with_callback(move |o| {
                for reason in TakeoverReason::ALL {
                    let value = takeovers.takeovers(reason);
                    o.observe(value, &[KeyValue::new("reason", reason.as_str())]);
                }
            })
            .build();
        let refusals = Arc::clone(stats);
        meter
            .u64_observable_counter("edge_node_takeover_refusals")
            .with_description(
                "Registrations refused ALREADY_CONNECTED because the live connection stays, by reason",
            )
            .with_callback(move |o| {
                for refusal in TakeoverRefusal::ALL {
                    let value = refusals.takeover_refusals(refusal);
                    o.observe(value, &[KeyValue::new("reason", refusal.as_str())]);
                }
            })
            .build();
    }

    fn observe_runs(&self, runs: RunService) {
        let meter = &self.meter;
        let active = runs.clone();
        meter
            .u64_observable_gauge("edge_runs_active")
            .with_description("Runs dispatched to a node and not yet ended")
            .with_callback(move |o| {
                o.observe(
                    count(active.open_runs().saturating_sub(active.queued_runs())),
                    &[],
                );
            })
            .build();
        let waiting = runs.clone();
        meter
            .u64_observable_gauge("edge_runs_waiting")
            .with_description("Queued runs by why they wait: every serving node busy, or none connected and available")
            .with_callback(move |o| {
                let [busy, absent] = waiting.waiting_by_cause();
                o.observe(count(busy), &[KeyValue::new("reason", "all_busy")]);
                o.observe(count(absent), &[KeyValue::new("reason", "no_node_available")]);
            })
            .build();
        let breakers = runs.clone();
        meter
            .u64_observable_gauge("edge_breakers_open")
            .with_description("Nodes whose circuit breaker is open or half-open")
            .with_callback(move |o| o.observe(count(breakers.open_breakers()), &[]))
            .build();
        let queued = runs.clone();
        meter
            .u64_observable_gauge("edge_runs_queued")
            .with_description("Runs waiting for a node with a free slot")
            .with_callback(move |o| o.observe(count(queued.queued_runs()), &[]))
            .build();
        meter
            .u64_observable_counter("edge_run_events_dropped")
            .with_description("Run events dropped, by reason")
            .with_callback(move |o| {
                let stats = runs.stats();
                let unknown = stats.dropped_unknown_run();
                let after = stats.dropped_after_terminal();
                o.observe(unknown, &[KeyValue::new("reason", "unknown_run")]);
                o.observe(after, &[KeyValue::new("reason", "after_terminal")]);
                let duplicate = stats.dropped_duplicate();
                o.observe(duplicate, &[KeyValue::new("reason", "duplicate")]);
            })
            .build();
    }

    fn observe_sinks(&self, sinks: Vec<BuiltSink>) {
        let meter = &self.meter;
        for nats in sinks.iter().filter_map(|s| s.nats.clone()) {
            super::nats_metrics::observe_nats(meter, nats);
        }
        let sinks: Arc<Vec<(KeyValue, SinkStats)>> = Arc::new(
            sinks
                .into_iter()
                .map(|s| (KeyValue::new("sink", s.kind.as_str()), s.stats))
                .collect(),
        );
        let counters: [StatCounter<SinkStats, u64>; 3] = [
            (
                "edge_sink_events_written",
                "Events handed to the sink's writer, by sink",
                None,
                |s| s.written(),
            ),
            (
                "edge_sink_write_errors",
                "Failed writes or flushes, by sink",
                None,
                |s| s.write_errors(),
            ),
            (
                "edge_sink_events_dropped",
                "Non-terminal events dropped because the sink's queue was full, by sink",
                None,
                |s| s.dropped_queue_full(),
            ),
        ];
        for (name, description, _unit, read) in counters {
            let sinks = Arc::clone(&sinks);
            meter
                .u64_observable_counter(name)
                .with_description(description)
                .with_callback(move |o| {
                    for (label, stats) in sinks.iter() {
                        o.observe(read(stats), std::slice::from_ref(label));
                    }
                })
                .build();
        }
        meter
            .u64_observable_gauge("edge_sink_queue_depth")
            .with_description("Events waiting in the sink's queue, by sink")
            .with_callback(move |o| {
                for (label, stats) in sinks.iter() {
                    o.observe(count(stats.queue_depth()), std::slice::from_ref(label));
                }
            })
            .build();
    }

    /// Stops the meter provider (after the last scrape).
    pub fn shutdown(&self) {
        let _ = self.provider.shutdown();
    }
}

fn count(n: usize) -> u64 {
    u64::try_from(n).unwrap_or(u64::MAX)
}
