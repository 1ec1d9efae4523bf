//! The edge's recent activity as a small time series: runs started and ended, errors,
//! output tokens, time to first output (p50/p99) and the wait queue's peak, in fixed
//! buckets over the last hour, for the whole edge and per node.
//!
//! Pure: the caller passes the time (ms since the Unix epoch) of every measurement and of
//! every read. Memory is bounded: a series keeps at most [`BUCKETS`] buckets, only those in
//! which something happened, and a bucket holds counters and a fixed latency histogram.

use std::collections::{BTreeMap, VecDeque};

use super::NodeId;

/// A bucket's width.
pub const BUCKET_MS: u64 = 10_000;
/// Buckets kept: one hour of [`BUCKET_MS`].
pub const BUCKETS: usize = 360;

/// Upper bounds (ms) of the time-to-first-output histogram's bins; the last bin takes the
/// rest. A quantile is reported as its bin's upper bound.
const TTFT_BOUNDS_MS: [u64; 16] = [
    5, 10, 25, 50, 100, 250, 500, 1_000, 2_500, 5_000, 10_000, 30_000, 60_000, 120_000, 300_000,
    600_000,
];

/// How a run ended, as the series counts it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ending {
    /// It completed.
    Completed,
    /// It failed (at the node or at the edge).
    Failed,
    /// It was cancelled.
    Cancelled,
}

/// What one ended run contributes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RunEnd {
    /// How it ended.
    pub ending: Ending,
    /// From acceptance to its first output, when it had any.
    pub ttft_ms: Option<u64>,
    /// Tokens it generated, as the node reported them.
    pub output_tokens: u64,
}

/// One bucket's counts.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct Bucket {
    started: u64,
    completed: u64,
    failed: u64,
    cancelled: u64,
    output_tokens: u64,
    queue_peak: u64,
    ttft: [u32; TTFT_BOUNDS_MS.len() + 1],
}

impl Bucket {
    /// The upper bound of the bin holding quantile `q` (0..=1) of the time to first output.
    fn ttft_quantile(&self, q: f64) -> Option<u64> {
        let total: u64 = self.ttft.iter().map(|&n| u64::from(n)).sum();
        if total == 0 {
            return None;
        }
        // The rank of the quantile, 1-based: ceil(q * total), at least 1.
        #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
        let rank = ((q * total as f64).ceil() as u64).clamp(1, total);
        let mut seen = 0;
        for (bin, &count) in self.ttft.iter().enumerate() {
            seen += u64::from(count);
            if seen >= rank {
                return Some(TTFT_BOUNDS_MS.get(bin).copied().unwrap_or(u64::MAX));
            }
        }
        None
    }
}

/// One bucket as read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StatsPoint {
    /// The bucket's start, ms since the Unix epoch (a multiple of [`BUCKET_MS`]).
    pub start_ms: u64,
    /// Runs sent to a node for the first time.
    pub started: u64,
    /// Runs that completed.
    pub completed: u64,
    /// Runs that failed.
    pub failed: u64,
    /// Runs that were cancelled.
    pub cancelled: u64,
    /// Output tokens of the runs that ended.
    pub output_tokens: u64,
    /// Median time to first output of the runs that ended, as its histogram bin's upper
    /// bound.
    pub ttft_p50_ms: Option<u64>,
    /// The 99th percentile of the same.
    pub ttft_p99_ms: Option<u64>,
    /// The most runs seen waiting in the queue at once (whole edge only).
    pub queue_peak: u64,
}

/// One series: the buckets in which something happened, oldest first.
#[derive(Debug, Clone, Default)]
struct Series {
    buckets: VecDeque<(u64, Bucket)>,
}

impl Series {
    /// The bucket `now_ms` falls in, made when missing; buckets older than the window go.
    fn at(&mut self, now_ms: u64) -> &mut Bucket {
        let number = now_ms / BUCKET_MS;
        let oldest = number.saturating_sub(BUCKETS as u64 - 1);
        while self.buckets.front().is_some_and(|(n, _)| *n < oldest) {
            self.buckets.pop_front();
        }
        // A clock that stepped back lands in the newest bucket.
        let newest = self.buckets.back().map(|(n, _)| *n);
        if newest.is_none_or(|n| n < number) {
            self.buckets.push_back((number, Bucket::default()));
        }
        let last = self.buckets.len() - 1;
        &mut self.buckets[last].1
    }

    fn points(&self, now_ms: u64) -> Vec<StatsPoint> {
        let oldest = (now_ms / BUCKET_MS).saturating_sub(BUCKETS as u64 - 1);
        self.buckets
            .iter()
            .filter(|(n, _)| *n >= oldest)
            .map(|(n, b)| StatsPoint {
                start_ms: n * BUCKET_MS,
                started: b.started,
                completed: b.completed,
                failed: b.failed,
                cancelled: b.cancelled,
                output_tokens: b.output_tokens,
                ttft_p50_ms: b.ttft_quantile(0.5),
                ttft_p99_ms: b.ttft_quantile(0.99),
                queue_peak: b.queue_peak,
            })
            .collect()
    }
}

/// The last hour of the edge and of each node that ran something.
#[derive(Debug, Clone, Default)]
pub struct FleetStats {
    edge: Series,
    nodes: BTreeMap<NodeId, Series>,
}

/// [`FleetStats`] as read at one time.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StatsWindow {
    /// The whole edge's buckets with activity, oldest first.
    pub edge: Vec<StatsPoint>,
    /// Each node's buckets with activity, by node id.
    pub nodes: Vec<(NodeId, Vec<StatsPoint>)>,
}

impl FleetStats {
    /// A run was sent to `node` for the first time at `now_ms`.
    pub fn started(&mut self, now_ms: u64, node: &NodeId) {
        self.edge.at(now_ms).started += 1;
        self.node(node).at(now_ms).started += 1;
    }

    /// A run ended at `now_ms`, last placed on `node` (none: it never reached one).
    pub fn ended(&mut self, now_ms: u64, node: Option<&NodeId>, end: RunEnd) {
        add_end(self.edge.at(now_ms), end);
        if let Some(node) = node {
            add_end(self.node(node).at(now_ms), end);
        }
    }

    /// `depth` runs were waiting in the queue at `now_ms`.
    pub fn queued(&mut self, now_ms: u64, depth: usize) {
        let bucket = self.edge.at(now_ms);
        bucket.queue_peak = bucket.queue_peak.max(depth as u64);
    }

    /// The last hour as of `now_ms`.
    pub fn window(&self, now_ms: u64) -> StatsWindow {
        StatsWindow {
            edge: self.edge.points(now_ms),
            nodes: self
                .nodes
                .iter()
                .map(|(id, series)| (id.clone(), series.points(now_ms)))
                .filter(|(_, points)| !points.is_empty())
                .collect(),
        }
    }

    fn node(&mut self, node: &NodeId) -> &mut Series {
        self.nodes.entry(node.clone()).or_default()
    }
}

fn add_end(bucket: &mut Bucket, end: RunEnd) {
    match end.ending {
        Ending::Completed => bucket.completed += 1,
        Ending::Failed => bucket.failed += 1,
        Ending::Cancelled => bucket.cancelled += 1,
    }
    bucket.output_tokens += end.output_tokens;
    if let Some(ttft) = end.ttft_ms {
        let bin = TTFT_BOUNDS_MS
            .iter()
            .position(|&bound| ttft <= bound)
            .unwrap_or(TTFT_BOUNDS_MS.len());
        bucket.ttft[bin] = bucket.ttft[bin].saturating_add(1);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(id: &str) -> NodeId {
        NodeId::parse(id).unwrap()
    }

    fn completed(ttft_ms: u64, tokens: u64) -> RunEnd {
        RunEnd {
            ending: Ending::Completed,
            ttft_ms: Some(ttft_ms),
            output_tokens: tokens,
        }
    }

    #[test]
    fn runs_are_counted_in_their_bucket_for_the_edge_and_their_node() {
        let mut stats = FleetStats::default();
        let t = 1_000 * BUCKET_MS;
        stats.started(t, &node("a"));
        stats.ended(t + 5, Some(&node("a")), completed(40, 7));
        stats.ended(
            t + BUCKET_MS,
            None,
            RunEnd {
                ending: Ending::Failed,
                ttft_ms: None,
                output_tokens: 0,
            },
        );
        stats.queued(t + BUCKET_MS, 3);
        stats.queued(t + BUCKET_MS + 1, 1);
        let window = stats.window(t + BUCKET_MS);
        assert_eq!(window.edge.len(), 2);
        let first = &window.edge[0];
        assert_eq!((first.start_ms, first.started, first.completed), (t, 1, 1));
        assert_eq!(first.output_tokens, 7);
        assert_eq!((first.ttft_p50_ms, first.ttft_p99_ms), (Some(50), Some(50)));
        let second = &window.edge[1];
        assert_eq!((second.failed, second.queue_peak), (1, 3));
        assert_eq!(second.ttft_p50_ms, None);
        assert_eq!(window.nodes.len(), 1);
        assert_eq!(window.nodes[0].0, node("a"));
        assert_eq!(
            window.nodes[0].1.len(),
            1,
            "the failure never reached a node"
        );
    }

    #[test]
    fn quantiles_come_from_the_histogram() {
        let mut stats = FleetStats::default();
        for ttft in [1, 2, 3, 4, 5, 6, 7, 8, 9, 2_000] {
            stats.ended(0, None, completed(ttft, 1));
        }
        let point = &stats.window(0).edge[0];
        assert_eq!(point.ttft_p50_ms, Some(5));
        assert_eq!(point.ttft_p99_ms, Some(2_500));
        stats.ended(0, None, completed(u64::MAX, 1));
        assert_eq!(stats.window(0).edge[0].ttft_p99_ms, Some(u64::MAX));
    }

    #[test]
    fn only_the_last_hour_is_kept() {
        let mut stats = FleetStats::default();
        for minute in 0..120u64 {
            stats.started(minute * 60_000, &node("a"));
        }
        let now = 119 * 60_000;
        let window = stats.window(now);
        assert_eq!(window.edge.len(), 60);
        assert!(window.edge.iter().all(|p| p.start_ms + 3_600_000 > now));
        assert!(stats.edge.buckets.len() <= BUCKETS);
        assert!(stats.window(now + 7_200_000).nodes.is_empty());
    }
}
