//! The NATS sink's own counters, beside the queue's [`SinkStats`](super::super::SinkStats):
//! what the server confirmed, what was published again, what was dropped because the
//! backlog was full, and the connection's state. Written by the writer and the client's
//! event callback, read by the metrics export and tests.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};

/// The counters, shared by the writer, the connection's event callback and readers.
#[derive(Debug, Default)]
pub(super) struct NatsCounters {
    pub(super) published: AtomicU64,
    pub(super) republished: AtomicU64,
    pub(super) dropped: AtomicU64,
    pub(super) dropped_terminal: AtomicU64,
    pub(super) pending: AtomicUsize,
    pub(super) connected: AtomicBool,
    pub(super) connects: AtomicU64,
    pub(super) disconnects: AtomicU64,
}

/// A cheap-to-clone, read-only view of the NATS sink's counters.
#[derive(Debug, Clone, Default)]
pub struct NatsStats {
    pub(super) counters: Arc<NatsCounters>,
}

impl NatsStats {
    /// Events the server confirmed: acked by the stream (JetStream), or written before a
    /// flush the server answered (core NATS).
    pub fn published(&self) -> u64 {
        self.counters.published.load(Ordering::Relaxed)
    }

    /// Events published again because their first publish was not confirmed in time.
    pub fn republished(&self) -> u64 {
        self.counters.republished.load(Ordering::Relaxed)
    }

    /// Non-terminal events dropped because the backlog was full (the server unreachable,
    /// or slower than the edge, for longer than the backlog holds).
    pub fn dropped(&self) -> u64 {
        self.counters.dropped.load(Ordering::Relaxed)
    }

    /// Terminal events dropped for the same reason (only once no non-terminal event was
    /// left to drop).
    pub fn dropped_terminal(&self) -> u64 {
        self.counters.dropped_terminal.load(Ordering::Relaxed)
    }

    /// Events held or in flight, not yet confirmed.
    pub fn pending(&self) -> usize {
        self.counters.pending.load(Ordering::Relaxed)
    }

    /// Whether the client is connected now.
    pub fn connected(&self) -> bool {
        self.counters.connected.load(Ordering::Relaxed)
    }

    /// Connections established, the first one included.
    pub fn connects(&self) -> u64 {
        self.counters.connects.load(Ordering::Relaxed)
    }

    /// Connections lost.
    pub fn disconnects(&self) -> u64 {
        self.counters.disconnects.load(Ordering::Relaxed)
    }
}
