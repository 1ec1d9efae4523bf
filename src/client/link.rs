//! The node's judgement of its link to the edge: the v1.1 link check ([`LinkMonitor`]),
//! reconnect delays ([`Backoff`]) and how the process's links ended ([`LinkStats`]). All
//! pure or plain counters: the caller passes `now` and random draws, and does the I/O.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// Judges the link to the edge by the v1.1 link check (`docs/protocol.md`, "Link check"):
/// the node pings with every heartbeat, and the link is dead when nothing at all has arrived
/// from the edge for `dead_after` heartbeat intervals while a ping is unanswered.
///
/// The rule is enforced only once the edge has answered a ping on this connection: an edge
/// that never acks is a v1 edge, and TCP keepalive is then the only check. Pure: the caller
/// passes `now`, so the rule is tested without a clock. One monitor per connection.
#[derive(Debug, Clone)]
pub struct LinkMonitor {
    silence_limit: Duration,
    last_heard: Instant,
    last_ping: u64,
    last_answered: u64,
    answers_pings: bool,
}

impl LinkMonitor {
    /// A monitor for a connection that was registered at `now`, heartbeating every
    /// `interval` and dead after `dead_after` silent intervals (at least 1).
    pub fn new(interval: Duration, dead_after: u32, now: Instant) -> Self {
        Self {
            silence_limit: interval.saturating_mul(dead_after.max(1)),
            last_heard: now,
            last_ping: 0,
            last_answered: 0,
            answers_pings: false,
        }
    }

    /// The `ping` for the next heartbeat (1, 2, 3, ...), counted as unanswered until acked.
    pub fn next_ping(&mut self) -> u64 {
        self.last_ping += 1;
        self.last_ping
    }

    /// Something (any frame) arrived from the edge at `now`.
    pub fn heard(&mut self, now: Instant) {
        self.last_heard = self.last_heard.max(now);
    }

    /// A `HeartbeatAck` carrying `ping` arrived at `now`. Returns whether it answers a ping
    /// this monitor handed out (an ack for anything else is ignored, but still counts as
    /// something heard).
    pub fn acked(&mut self, ping: u64, now: Instant) -> bool {
        self.heard(now);
        if ping == 0 || ping > self.last_ping {
            return false;
        }
        self.answers_pings = true;
        self.last_answered = self.last_answered.max(ping);
        true
    }

    /// Whether the edge has answered a ping on this connection (a v1.1 edge).
    pub fn answers_pings(&self) -> bool {
        self.answers_pings
    }

    /// Whether a ping is still waiting for its ack.
    pub fn ping_outstanding(&self) -> bool {
        self.last_ping > self.last_answered
    }

    /// How long nothing has arrived from the edge, at `now`.
    pub fn silent_for(&self, now: Instant) -> Duration {
        now.saturating_duration_since(self.last_heard)
    }

    /// Whether the link counts as dead at `now`: the edge answers pings, one is unanswered,
    /// and nothing has arrived for `dead_after` intervals.
    pub fn is_dead(&self, now: Instant) -> bool {
        self.answers_pings && self.ping_outstanding() && self.silent_for(now) >= self.silence_limit
    }
}

/// Reconnect delays: exponential growth from `base`, capped at `cap`, with **full jitter**
/// (each delay is drawn uniformly from zero to the current ceiling), so that thousands of
/// nodes cut off by one edge restart spread their reconnects out instead of arriving in
/// waves.
///
/// Pure: the caller passes the random draw, so the bounds are tested without a generator.
#[derive(Debug, Clone)]
pub struct Backoff {
    base: Duration,
    cap: Duration,
    attempt: u32,
}

impl Backoff {
    /// Delays start below `base` and their ceiling doubles per attempt up to `cap`.
    pub fn new(base: Duration, cap: Duration) -> Self {
        Self {
            base,
            cap: cap.max(base),
            attempt: 0,
        }
    }

    /// The ceiling the next delay is drawn under: `min(cap, base * 2^attempt)`.
    pub fn ceiling(&self) -> Duration {
        let factor = 1u32.checked_shl(self.attempt.min(31)).unwrap_or(u32::MAX);
        self.base.saturating_mul(factor).min(self.cap)
    }

    /// The next delay for a random `unit` in `[0, 1)` (say `rand::random::<f64>()`): a
    /// uniform draw under [`Backoff::ceiling`]. Each call raises the ceiling for the next.
    pub fn next_delay(&mut self, unit: f64) -> Duration {
        let ceiling = self.ceiling();
        self.attempt = self.attempt.saturating_add(1);
        ceiling.mul_f64(unit.clamp(0.0, 1.0))
    }

    /// Back to the first attempt, after a connection succeeded.
    pub fn reset(&mut self) {
        self.attempt = 0;
    }
}

/// How one of the node's connections to the edge ended, by the side that ended it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum LinkEnd {
    /// The node declared the link dead: its pings went unanswered and nothing arrived for
    /// the configured number of heartbeat intervals ([`LinkMonitor::is_dead`]).
    DeclaredDead,
    /// The edge closed the connection (an orderly close, `Shutdown`, or the edge's own
    /// dead-link rule: a node that was silent too long, or superseded by its own newer
    /// connection).
    ClosedByEdge,
    /// A read or write failed: a reset, or the kernel gave up (TCP keepalive, retransmission
    /// timeout).
    Broken,
}

impl LinkEnd {
    /// Every way a link ends, in the order [`LinkStats`] keeps them.
    pub const ALL: [LinkEnd; 3] = [Self::DeclaredDead, Self::ClosedByEdge, Self::Broken];

    /// A stable snake_case name for logs and metrics.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::DeclaredDead => "declared_dead",
            Self::ClosedByEdge => "closed_by_edge",
            Self::Broken => "broken",
        }
    }
}

/// How a node process's connections to the edge ended, counted since it started: the node's
/// side of "links declared dead, by which side" (the edge counts its side in
/// `edge_node_links_declared_dead_total`). Safe to share between tasks.
#[derive(Debug, Default)]
pub struct LinkStats {
    ended: [AtomicU64; LinkEnd::ALL.len()],
}

impl LinkStats {
    /// Counts a connection that ended `end`; returns how many have ended that way so far.
    pub fn record(&self, end: LinkEnd) -> u64 {
        self.ended[end as usize].fetch_add(1, Ordering::Relaxed) + 1
    }

    /// Connections that ended `end`.
    pub fn count(&self, end: LinkEnd) -> u64 {
        self.ended[end as usize].load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    const SECOND: Duration = Duration::from_secs(1);

    #[test]
    fn a_v1_edge_that_never_acks_is_never_judged_dead() {
        let start = Instant::now();
        let mut monitor = LinkMonitor::new(SECOND, 3, start);
        monitor.next_ping();
        monitor.next_ping();
        assert!(monitor.ping_outstanding());
        assert!(!monitor.is_dead(start + 100 * SECOND));
    }

    #[test]
    fn the_link_is_dead_after_n_silent_intervals_with_a_ping_outstanding() {
        let start = Instant::now();
        let mut monitor = LinkMonitor::new(SECOND, 3, start);
        let ping = monitor.next_ping();
        assert!(monitor.acked(ping, start + SECOND));
        assert!(monitor.answers_pings());
        // Answered: silence alone is not death.
        assert!(!monitor.is_dead(start + 10 * SECOND));
        monitor.next_ping();
        assert!(!monitor.is_dead(start + 3 * SECOND));
        assert!(monitor.is_dead(start + 4 * SECOND));
        // Any frame pushes the limit out again.
        monitor.heard(start + 4 * SECOND);
        assert!(!monitor.is_dead(start + 6 * SECOND));
        assert!(monitor.is_dead(start + 7 * SECOND));
    }

    #[test]
    fn acks_for_pings_never_sent_are_ignored() {
        let start = Instant::now();
        let mut monitor = LinkMonitor::new(SECOND, 3, start);
        assert!(!monitor.acked(0, start));
        assert!(!monitor.acked(7, start));
        assert!(!monitor.answers_pings());
        monitor.next_ping();
        let second = monitor.next_ping();
        assert!(monitor.acked(second, start));
        assert!(!monitor.ping_outstanding());
    }

    #[test]
    fn link_stats_count_each_way_a_link_ends() {
        let stats = LinkStats::default();
        assert_eq!(stats.record(LinkEnd::DeclaredDead), 1);
        assert_eq!(stats.record(LinkEnd::DeclaredDead), 2);
        assert_eq!(stats.record(LinkEnd::Broken), 1);
        assert_eq!(stats.count(LinkEnd::DeclaredDead), 2);
        assert_eq!(stats.count(LinkEnd::ClosedByEdge), 0);
        for (i, end) in LinkEnd::ALL.into_iter().enumerate() {
            assert_eq!(end as usize, i);
        }
    }

    #[test]
    fn backoff_ceiling_doubles_to_the_cap_and_resets() {
        let mut backoff = Backoff::new(Duration::from_millis(100), Duration::from_millis(1000));
        let ceilings: Vec<u64> = (0..6)
            .map(|_| {
                let ceiling = backoff.ceiling();
                backoff.next_delay(1.0);
                u64::try_from(ceiling.as_millis()).unwrap_or(u64::MAX)
            })
            .collect();
        assert_eq!(ceilings, [100, 200, 400, 800, 1000, 1000]);
        backoff.reset();
        assert_eq!(backoff.ceiling(), Duration::from_millis(100));
        // Far past any shift width, the ceiling stays the cap.
        for _ in 0..100 {
            backoff.next_delay(0.5);
        }
        assert_eq!(backoff.ceiling(), Duration::from_millis(1000));
    }

    proptest! {
        /// Full jitter: every delay lies in `[0, ceiling]`, and a draw of 0 waits not at all.
        #[test]
        fn backoff_delays_stay_within_zero_and_the_ceiling(
            base_ms in 1u64..10_000, cap_ms in 1u64..120_000, attempts in 0usize..80,
            unit in 0.0f64..1.0,
        ) {
            let mut backoff = Backoff::new(Duration::from_millis(base_ms), Duration::from_millis(cap_ms));
            for _ in 0..attempts {
                backoff.next_delay(unit);
            }
            let ceiling = backoff.ceiling();
            prop_assert!(ceiling <= Duration::from_millis(cap_ms.max(base_ms)));
            let mut again = backoff.clone();
            prop_assert!(backoff.next_delay(unit) <= ceiling);
            prop_assert_eq!(again.next_delay(0.0), Duration::ZERO);
        }
    }
}
