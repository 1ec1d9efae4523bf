//! The counters of one sink: [`Counters`], written by the sink's queue and its drain, and
//! [`SinkStats`], the read-only view metrics export. Nothing here counts by itself.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

/// The counters of one sink, shared by the sink and its drain.
#[derive(Debug, Default)]
pub(super) struct Counters {
    pub(super) written: AtomicU64,
    pub(super) dropped_queue_full: AtomicU64,
    pub(super) write_errors: AtomicU64,
    pub(super) queue_depth: AtomicUsize,
}

/// A cheap-to-clone, read-only view of one sink's counters, for metrics export.
#[derive(Debug, Clone, Default)]
pub struct SinkStats {
    pub(super) counters: Arc<Counters>,
}

impl SinkStats {
    /// Events handed to the writer without error.
    pub fn written(&self) -> u64 {
        self.counters.written.load(Ordering::Relaxed)
    }

    /// Non-terminal events dropped because the queue was full.
    pub fn dropped_queue_full(&self) -> u64 {
        self.counters.dropped_queue_full.load(Ordering::Relaxed)
    }

    /// Writes and flushes that failed (each loses the events it carried).
    pub fn write_errors(&self) -> u64 {
        self.counters.write_errors.load(Ordering::Relaxed)
    }

    /// Events accepted but not yet written, now.
    pub fn queue_depth(&self) -> usize {
        self.counters.queue_depth.load(Ordering::Relaxed)
    }
}
