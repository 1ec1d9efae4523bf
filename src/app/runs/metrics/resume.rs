//! The resume instruments: runs detached when their node's connection dropped, re-attached
//! when it came back, lost without a resume (by why), and how long they were detached.
//! The counts are plain atomics exported by observable counters with every label value
//! declared, so each series exists (at 0) from the start.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use opentelemetry::KeyValue;
use opentelemetry::metrics::{Histogram, Meter};

use super::LATENCY_BUCKETS;
use crate::app::runs::observer::Loss;

/// An unlabelled counter: name, description, and its count.
type PlainCounter = (&'static str, &'static str, fn(&ResumeCounts) -> &AtomicU64);

/// The counts behind the resume counters.
#[derive(Debug, Default)]
struct ResumeCounts {
    detached: AtomicU64,
    reattached: AtomicU64,
    /// By [`Loss::ALL`]'s order.
    lost: [AtomicU64; Loss::ALL.len()],
}

/// The resume instruments.
pub(super) struct ResumeMetrics {
    counts: Arc<ResumeCounts>,
    detached_for: Histogram<f64>,
}

impl ResumeMetrics {
    /// Fresh instruments, exported through `meter`.
    pub(super) fn new(meter: &Meter) -> Self {
        let counts = Arc::new(ResumeCounts::default());
        let plain: [PlainCounter; 2] = [
            (
                "edge_runs_detached",
                "Runs held for resume when their node's connection dropped after they produced output",
                |c| &c.detached,
            ),
            (
                "edge_runs_reattached",
                "Runs resumed on a new connection of their node",
                |c| &c.reattached,
            ),
        ];
        for (name, description, field) in plain {
            let counts = Arc::clone(&counts);
            meter
                .u64_observable_counter(name)
                .with_description(description)
                .with_callback(move |o| o.observe(field(&counts).load(Ordering::Relaxed), &[]))
                .build();
        }
        let lost = Arc::clone(&counts);
        meter
            .u64_observable_counter("edge_runs_resume_lost")
            .with_description(
                "Runs held for resume that ended node_disconnected instead, by why they were not resumed",
            )
            .with_callback(move |o| {
                for (loss, count) in Loss::ALL.iter().zip(&lost.lost) {
                    let labels = [KeyValue::new("reason", loss.as_str())];
                    o.observe(count.load(Ordering::Relaxed), &labels);
                }
            })
            .build();
        let detached_for = meter
            .f64_histogram("edge_run_detached")
            .with_description("Time a run was detached, until it was resumed or ended (by outcome)")
            .with_unit("s")
            .with_boundaries(LATENCY_BUCKETS.to_vec())
            .build();
        Self {
            counts,
            detached_for,
        }
    }

    /// A run was detached.
    pub(super) fn detached(&self) {
        self.counts.detached.fetch_add(1, Ordering::Relaxed);
    }

    /// A run was re-attached after `detached_for` (`None`: it was taken over from a
    /// connection that had not dropped yet).
    pub(super) fn reattached(&self, detached_for: Option<Duration>) {
        self.counts.reattached.fetch_add(1, Ordering::Relaxed);
        if let Some(time) = detached_for {
            self.record(time, "resumed");
        }
    }

    /// A run held for resume was ended for `loss`.
    pub(super) fn lost(&self, loss: Loss) {
        let index = Loss::ALL.iter().position(|l| *l == loss).unwrap_or(0);
        self.counts.lost[index].fetch_add(1, Ordering::Relaxed);
    }

    /// A run ended while detached, `detached_for` after it was detached.
    pub(super) fn ended_detached(&self, detached_for: Duration) {
        self.record(detached_for, "ended");
    }

    fn record(&self, time: Duration, outcome: &'static str) {
        let labels = [KeyValue::new("outcome", outcome)];
        self.detached_for.record(time.as_secs_f64(), &labels);
    }
}
