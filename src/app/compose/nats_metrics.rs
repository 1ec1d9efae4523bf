//! The NATS sink's own metrics (`edge_sink_nats_*`), read from its
//! [`NatsStats`] on every scrape: what the server confirmed, what was published again,
//! what was dropped while the server was unreachable (or slower than the edge), and the
//! connection. Registered only when the NATS sink is configured.

use opentelemetry::KeyValue;
use opentelemetry::metrics::Meter;

use crate::adapters::sinks::nats::NatsStats;

/// A counter read from some stats: name, description, how to read it.
pub(super) type StatsCounter<S> = (&'static str, &'static str, fn(&S) -> u64);

/// A counter read from the stats: name, description, how to read it.
type NatsCounter = StatsCounter<NatsStats>;

/// Registers one unlabelled observable counter per entry of `counters`, each read from
/// `stats` on every scrape.
pub(super) fn observe_counters<S: Clone + Send + Sync + 'static>(
    meter: &Meter,
    stats: &S,
    counters: impl IntoIterator<Item = StatsCounter<S>>,
) {
    for (name, description, read) in counters {
        let stats = stats.clone();
        meter
            .u64_observable_counter(name)
            .with_description(description)
            .with_callback(move |o| o.observe(read(&stats), &[]))
            .build();
    }
}

/// Registers the NATS sink's instruments for `stats`.
pub(super) fn observe_nats(meter: &Meter, stats: NatsStats) {
    let counters: [NatsCounter; 4] = [
        (
            "edge_sink_nats_published",
            "Events the NATS server confirmed (JetStream ack, or a flush it answered)",
            NatsStats::published,
        ),
        (
            "edge_sink_nats_republished",
            "Events published again because their publish was not confirmed in time",
            NatsStats::republished,
        ),
        (
            "edge_sink_nats_connects",
            "Connections to a NATS server established, the first included",
            NatsStats::connects,
        ),
        (
            "edge_sink_nats_disconnects",
            "Connections to a NATS server lost",
            NatsStats::disconnects,
        ),
    ];
    observe_counters(meter, &stats, counters);
    let dropped = stats.clone();
    meter
        .u64_observable_counter("edge_sink_nats_dropped")
        .with_description(
            "Events dropped because the NATS backlog was full (the server unreachable or \
             slower than the edge), by whether they were terminal",
        )
        .with_callback(move |o| {
            o.observe(dropped.dropped(), &[KeyValue::new("terminal", "false")]);
            o.observe(
                dropped.dropped_terminal(),
                &[KeyValue::new("terminal", "true")],
            );
        })
        .build();
    let pending = stats.clone();
    meter
        .u64_observable_gauge("edge_sink_nats_pending")
        .with_description("Events held or in flight, not yet confirmed by the NATS server")
        .with_callback(move |o| o.observe(pending.pending() as u64, &[]))
        .build();
    meter
        .u64_observable_gauge("edge_sink_nats_connected")
        .with_description("1 while connected to a NATS server, else 0")
        .with_callback(move |o| o.observe(u64::from(stats.connected()), &[]))
        .build();
}
