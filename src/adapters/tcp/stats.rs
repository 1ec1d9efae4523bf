//! Counters of the node transport, kept as atomics so the transport knows nothing of the
//! metrics exporter; the application exports them.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::domain::{NodeId, RegisterRejection, TakeoverReason, TakeoverRefusal};
use crate::ports::CloseReason;

/// What the node transport has done since it started. Every field only grows, except
/// `connections_open`.
#[derive(Debug, Default)]
pub struct TransportStats {
    /// Connections open now.
    pub connections_open: AtomicU64,
    /// Connections refused because `server.max_connections` were open.
    pub connections_refused: AtomicU64,
    closed: [AtomicU64; CloseReason::ALL.len()],
    /// Frames read from nodes.
    pub frames_in: AtomicU64,
    /// Frames written to nodes.
    pub frames_out: AtomicU64,
    /// Bytes read from nodes (length prefixes included).
    pub bytes_in: AtomicU64,
    /// Bytes written to nodes (length prefixes included).
    pub bytes_out: AtomicU64,
    /// Registrations accepted.
    pub registrations_accepted: AtomicU64,
    rejected: [AtomicU64; RegisterRejection::ALL.len()],
    disconnects: [AtomicU64; CloseReason::ALL.len()],
    takeovers: [AtomicU64; TakeoverReason::ALL.len()],
    takeover_refusals: [AtomicU64; TakeoverRefusal::ALL.len()],
    /// By node: reports whose served targets differ from the node's report before on the
    /// same connection (an engine going down or up, a model loaded or unloaded). Bounded by
    /// the configured nodes.
    availability_changes: Mutex<BTreeMap<NodeId, u64>>,
}

fn index<T: PartialEq>(all: &[T], item: &T) -> usize {
    all.iter().position(|x| x == item).unwrap_or(0)
}

impl TransportStats {
    /// Counts a closed connection.
    pub fn record_close(&self, reason: CloseReason) {
        self.closed[index(&CloseReason::ALL, &reason)].fetch_add(1, Ordering::Relaxed);
    }

    /// Connections closed for `reason`.
    pub fn closed(&self, reason: CloseReason) -> u64 {
        self.closed[index(&CloseReason::ALL, &reason)].load(Ordering::Relaxed)
    }

    /// Counts a refused registration.
    pub fn record_rejection(&self, rejection: RegisterRejection) {
        self.rejected[index(&RegisterRejection::ALL, &rejection)].fetch_add(1, Ordering::Relaxed);
    }

    /// Registrations refused for `rejection`.
    pub fn rejected(&self, rejection: RegisterRejection) -> u64 {
        self.rejected[index(&RegisterRejection::ALL, &rejection)].load(Ordering::Relaxed)
    }

    /// Counts a registered node leaving.
    pub fn record_disconnect(&self, reason: CloseReason) {
        self.disconnects[index(&CloseReason::ALL, &reason)].fetch_add(1, Ordering::Relaxed);
    }

    /// Registered nodes that left for `reason` (`heartbeat_timeout` counts evictions).
    pub fn disconnects(&self, reason: CloseReason) -> u64 {
        self.disconnects[index(&CloseReason::ALL, &reason)].load(Ordering::Relaxed)
    }

    /// Counts a registration that took over the node's live connection.
    pub fn record_takeover(&self, reason: TakeoverReason) {
        self.takeovers[index(&TakeoverReason::ALL, &reason)].fetch_add(1, Ordering::Relaxed);
    }

    /// Registrations that took over the node's live connection for `reason`.
    pub fn takeovers(&self, reason: TakeoverReason) -> u64 {
        self.takeovers[index(&TakeoverReason::ALL, &reason)].load(Ordering::Relaxed)
    }

    /// Counts a registration refused `ALREADY_CONNECTED` because the live connection stays.
    pub fn record_takeover_refusal(&self, refusal: TakeoverRefusal) {
        self.takeover_refusals[index(&TakeoverRefusal::ALL, &refusal)]
            .fetch_add(1, Ordering::Relaxed);
    }

    /// Registrations refused `ALREADY_CONNECTED` for `refusal`.
    pub fn takeover_refusals(&self, refusal: TakeoverRefusal) -> u64 {
        self.takeover_refusals[index(&TakeoverRefusal::ALL, &refusal)].load(Ordering::Relaxed)
    }

    /// Counts an accepted registration of `node`, whose availability changes are counted
    /// from 0 from now on.
    pub fn record_registration(&self, node: &NodeId) {
        self.registrations_accepted.fetch_add(1, Ordering::Relaxed);
        self.count_availability_changes(node, 0);
    }

    /// Counts a report of `node`'s that changed what it serves.
    pub fn record_availability_change(&self, node: &NodeId) {
        self.count_availability_changes(node, 1);
    }

    fn count_availability_changes(&self, node: &NodeId, more: u64) {
        let mut changes = self
            .availability_changes
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        *changes.entry(node.clone()).or_default() += more;
    }

    /// Each node's reports that changed what it serves, for the nodes that have had one.
    pub fn availability_changes(&self) -> Vec<(NodeId, u64)> {
        let changes = self
            .availability_changes
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        changes.iter().map(|(node, n)| (node.clone(), *n)).collect()
    }

    /// Links to registered nodes found dead, by the side that declared it: `edge` — closed
    /// after three heartbeat intervals of silence, or presumed dead when another instance
    /// registered after two; `node` — the node (same instance) came back on a new
    /// connection while the edge still held the old one.
    pub fn links_declared_dead(&self, by_node: bool) -> u64 {
        if by_node {
            self.takeovers(TakeoverReason::SameInstance)
        } else {
            self.disconnects(CloseReason::HeartbeatTimeout)
                + self.takeovers(TakeoverReason::PresumedDead)
        }
    }
}
