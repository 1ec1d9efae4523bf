//! The management side's metrics: drained nodes and the run journal's counters, read on
//! every scrape.

use std::sync::Arc;

use opentelemetry::KeyValue;
use opentelemetry::metrics::Meter;

use crate::app::drains::Drains;
use crate::ports::{JournalStats, RunJournal};

/// An instrument read from the journal's counters: name, description, reader.
type JournalInstrument = (&'static str, &'static str, fn(&JournalStats) -> u64);

/// Registers `edge_nodes_draining` and the `edge_journal_*` instruments.
pub fn observe(meter: &Meter, drains: Drains, journal: Arc<dyn RunJournal>) {
    meter
        .u64_observable_gauge("edge_nodes_draining")
        .with_description("Nodes an operator has drained (connected or not)")
        .with_callback(move |o| o.observe(drains.len() as u64, &[]))
        .build();
    if journal.enabled() {
        observe_counters(meter, &journal);
        observe_gauges(meter, &journal);
    }
}

fn observe_counters(meter: &Meter, journal: &Arc<dyn RunJournal>) {
    let counters: [JournalInstrument; 3] = [
        (
            "edge_journal_entries_written",
            "Run records and events written to the journal",
            |s| s.written,
        ),
        (
            "edge_journal_write_errors",
            "Journal transactions that failed (their entries are lost)",
            |s| s.write_errors,
        ),
        (
            "edge_journal_runs_expired",
            "Finished runs removed by retention",
            |s| s.runs_expired,
        ),
    ];
    for (name, description, read) in counters {
        let journal = Arc::clone(journal);
        meter
            .u64_observable_counter(name)
            .with_description(description)
            .with_callback(move |o| o.observe(read(&journal.stats()), &[]))
            .build();
    }
    let dropped = Arc::clone(journal);
    meter
        .u64_observable_counter("edge_journal_events_dropped")
        .with_description(
            "Events not journaled: the run's cap was reached, the queue was full, or the disk limit left no room",
        )
        .with_callback(move |o| {
            let stats = dropped.stats();
            o.observe(
                stats.events_over_cap,
                &[KeyValue::new("reason", "over_cap")],
            );
            o.observe(
                stats.dropped_queue_full,
                &[KeyValue::new("reason", "queue_full")],
            );
            o.observe(
                stats.dropped_over_budget,
                &[KeyValue::new("reason", "over_budget")],
            );
        })
        .build();
}

fn observe_gauges(meter: &Meter, journal: &Arc<dyn RunJournal>) {
    let gauges: [JournalInstrument; 2] = [
        (
            "edge_journal_queue_depth",
            "Entries waiting to be written",
            |s| s.queue_depth,
        ),
        (
            "edge_journal_bytes",
            "Bytes the journal's files take on disk: the database, its WAL and its index",
            |s| s.bytes,
        ),
    ];
    for (name, description, read) in gauges {
        let journal = Arc::clone(journal);
        meter
            .u64_observable_gauge(name)
            .with_description(description)
            .with_callback(move |o| o.observe(read(&journal.stats()), &[]))
            .build();
    }
}
