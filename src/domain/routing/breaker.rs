//! Circuit breakers: a node whose runs keep failing for node reasons gets no new runs for a
//! while, then exactly one probe run, whose outcome closes or re-opens it.
//!
//! Pure values: the caller passes `now`, applies the returned [`Admission`] and records each
//! run's [`Outcome`]; every change of state comes back as a [`Transition`] for the caller to
//! log and count. Nothing here logs or touches a metric.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use super::hash::{BuildPassThrough, NodeHash};
use crate::domain::names::NodeId;

/// How breakers trip and recover (`routing.breaker.*`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BreakerPolicy {
    threshold: u32,
    base_cooldown: Duration,
    max_cooldown: Duration,
}

/// Why a breaker policy is invalid.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BreakerPolicyError {
    /// `failure_threshold` is 0.
    #[error("`routing.breaker.failure_threshold` must be at least 1")]
    ZeroThreshold,
    /// `cooldown_ms` is 0 or above `max_cooldown_ms`.
    #[error("`routing.breaker.cooldown_ms` must be at least 1 and at most `max_cooldown_ms`")]
    BadCooldown,
}

impl BreakerPolicy {
    /// Trips after `threshold` consecutive node failures; stays open `base_cooldown` on the
    /// first trip, doubling on each further trip without a recovery, up to `max_cooldown`.
    ///
    /// # Errors
    /// [`BreakerPolicyError`] for a zero threshold or a cooldown of zero or above the cap.
    pub fn new(
        threshold: u32,
        base_cooldown: Duration,
        max_cooldown: Duration,
    ) -> Result<Self, BreakerPolicyError> {
        if threshold == 0 {
            return Err(BreakerPolicyError::ZeroThreshold);
        }
        if base_cooldown.is_zero() || base_cooldown > max_cooldown {
            return Err(BreakerPolicyError::BadCooldown);
        }
        Ok(Self {
            threshold,
            base_cooldown,
            max_cooldown,
        })
    }

    /// How long the `trips`-th trip in a row keeps the breaker open.
    pub fn cooldown(&self, trips: u32) -> Duration {
        let doublings = trips.saturating_sub(1).min(31);
        self.base_cooldown
            .saturating_mul(1 << doublings)
            .min(self.max_cooldown)
    }
}

impl Default for BreakerPolicy {
    /// 3 consecutive node failures; 5 s open, doubling up to 2 min.
    fn default() -> Self {
        Self {
            threshold: 3,
            base_cooldown: Duration::from_secs(5),
            max_cooldown: Duration::from_secs(120),
        }
    }
}

/// How one finished run bears on its node's health.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// The node did its job (the run completed).
    Success,
    /// The node or its engine failed (class `NODE`, or the node disconnected mid-run).
    NodeFailure,
    /// Says nothing about the node: a request error, a refusal, a cancel, a deadline, an
    /// unclassified (v1) failure.
    Neutral,
}

/// Leave to dispatch a run to a node, to hand back with the run's [`Outcome`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Admission {
    probe: bool,
    epoch: u32,
}

impl Admission {
    /// Whether this run is the half-open breaker's one probe.
    pub fn is_probe(self) -> bool {
        self.probe
    }
}

/// A change of a breaker's state, for logs and metrics.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transition {
    /// Tripped (from closed, or again after a failed probe): no runs for `cooldown`.
    Opened {
        /// How long it stays open.
        cooldown: Duration,
        /// Trips in a row without a recovery, this one included.
        trips: u32,
    },
    /// The cooldown passed and a probe run was let through.
    HalfOpened,
    /// The probe succeeded.
    Closed,
}

/// A breaker's state, for the admin view.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum State {
    /// Runs flow; `failures` consecutive node failures so far.
    Closed {
        /// Consecutive node failures.
        failures: u32,
    },
    /// No runs until `until`.
    Open {
        /// When a probe may go.
        until: Instant,
    },
    /// One probe may go (`probing` once it went).
    HalfOpen {
        /// Whether the probe is out.
        probing: bool,
    },
}

/// One node's breaker.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Breaker {
    state: State,
    trips: u32,
    /// Bumped on every transition: an outcome admitted under an older epoch is stale and
    /// changes nothing (a run from before a trip cannot close or re-trip the breaker).
    epoch: u32,
}

impl Default for Breaker {
    fn default() -> Self {
        Self {
            state: State::Closed { failures: 0 },
            trips: 0,
            epoch: 0,
        }
    }
}

impl Breaker {
    /// The state now.
    pub fn state(&self) -> State {
        self.state
    }

    /// Whether [`admit`](Self::admit) would let a run through at `now` (read-only, for
    /// filtering candidates).
    pub fn admits(&self, now: Instant) -> bool {
        match self.state {
            State::Closed { .. } => true,
            State::Open { until } => now >= until,
            State::HalfOpen { probing } => !probing,
        }
    }

    /// Lets a run through, or not. An open breaker whose cooldown passed turns half-open
    /// and lets exactly this one run through as its probe.
    pub fn admit(&mut self, now: Instant) -> Option<(Admission, Option<Transition>)> {
        let transition = match self.state {
            State::Closed { .. } => return Some((self.admission(false), None)),
            State::Open { until } if now >= until => Some(Transition::HalfOpened),
            State::HalfOpen { probing: false } => None,
            State::Open { .. } | State::HalfOpen { probing: true } => return None,
        };
        if transition.is_some() {
            self.epoch = self.epoch.wrapping_add(1);
        }
        self.state = State::HalfOpen { probing: true };
        Some((self.admission(true), transition))
    }

    /// Records how an admitted run ended.
    pub fn record(
        &mut self,
        admission: Admission,
        outcome: Outcome,
        now: Instant,
        policy: &BreakerPolicy,
    ) -> Option<Transition> {
        if admission.epoch != self.epoch {
            return None;
        }
        match (self.state, outcome) {
            (State::Closed { .. }, Outcome::Success) => {
                self.state = State::Closed { failures: 0 };
                None
            }
            (State::Closed { failures }, Outcome::NodeFailure) => {
                let failures = failures + 1;
                self.state = State::Closed { failures };
                (failures >= policy.threshold).then(|| self.trip(now, policy))
            }
            (State::HalfOpen { probing: true }, _) if admission.probe => match outcome {
                Outcome::Success => {
                    *self = Self {
                        epoch: self.epoch.wrapping_add(1),
                        ..Self::default()
                    };
                    Some(Transition::Closed)
                }
                Outcome::NodeFailure => Some(self.trip(now, policy)),
                // The probe proved nothing: the next run may probe instead.
                Outcome::Neutral => {
                    self.state = State::HalfOpen { probing: false };
                    None
                }
            },
            _ => None,
        }
    }

    fn trip(&mut self, now: Instant, policy: &BreakerPolicy) -> Transition {
        self.trips = self.trips.saturating_add(1);
        self.epoch = self.epoch.wrapping_add(1);
        let cooldown = policy.cooldown(self.trips);
        self.state = State::Open {
            until: now + cooldown,
        };
        Transition::Opened {
            cooldown,
            trips: self.trips,
        }
    }

    fn admission(&self, probe: bool) -> Admission {
        Admission {
            probe,
            epoch: self.epoch,
        }
    }

    fn is_closed(&self) -> bool {
        matches!(self.state, State::Closed { .. })
    }
}

/// Bits in [`BreakerBook`]'s filter of nodes whose breaker is not closed.
const FILTER_BITS: usize = 4096;

/// Every node's breaker, owned by the run service. Only nodes that ever failed have an
/// entry (bounded by the node definitions); a node without one is closed. Filtering asks
/// about every node on every placement, so [`admits`](Self::admits) answers without a
/// look-up while every breaker is closed, and otherwise looks up only nodes whose bit is
/// set in a small filter of the not-closed ones (a Bloom filter with one hash).
#[derive(Debug, Clone)]
pub struct BreakerBook {
    policy: BreakerPolicy,
    /// By node hash; a collision of two ids shares a bucket, told apart by id.
    entries: HashMap<NodeHash, Vec<(NodeId, Breaker)>, BuildPassThrough>,
    not_closed: usize,
    /// Bit `hash % FILTER_BITS` is set for every node whose breaker is not closed.
    filter: Box<[u64; FILTER_BITS / 64]>,
}

impl Default for BreakerBook {
    fn default() -> Self {
        Self::new(BreakerPolicy::default())
    }
}

fn filter_bit(hash: NodeHash) -> (usize, u64) {
    let bit = (hash.get() % FILTER_BITS as u64) as usize;
    (bit / 64, 1 << (bit % 64))
}

impl BreakerBook {
    /// An empty book applying `policy`.
    pub fn new(policy: BreakerPolicy) -> Self {
        Self {
            policy,
            entries: HashMap::default(),
            not_closed: 0,
            filter: Box::new([0; FILTER_BITS / 64]),
        }
    }

    /// Whether the node's breaker would let a run through at `now`.
    pub fn admits(&self, hash: NodeHash, id: &NodeId, now: Instant) -> bool {
        if self.not_closed == 0 {
            return true;
        }
        let (word, bit) = filter_bit(hash);
        self.filter[word] & bit == 0 || self.get(hash, id).is_none_or(|b| b.admits(now))
    }

    /// The node's breaker state.
    pub fn state(&self, hash: NodeHash, id: &NodeId) -> State {
        self.get(hash, id)
            .map_or(State::Closed { failures: 0 }, Breaker::state)
    }

    /// Lets a run through to the node, or not (see [`Breaker::admit`]).
    pub fn admit(
        &mut self,
        hash: NodeHash,
        id: &NodeId,
        now: Instant,
    ) -> Option<(Admission, Option<Transition>)> {
        if self.get(hash, id).is_none() {
            // Pristine: closed, and it gets an entry only when it first fails.
            return Some((Breaker::default().admission(false), None));
        }
        self.update(hash, id, |b| b.admit(now))
    }

    /// Records how a run admitted to the node ended.
    pub fn record(
        &mut self,
        hash: NodeHash,
        id: &NodeId,
        admission: Admission,
        outcome: Outcome,
        now: Instant,
    ) -> Option<Transition> {
        if outcome != Outcome::NodeFailure && self.get(hash, id).is_none() {
            // A pristine breaker stays pristine: no entry for every node that ran a run.
            return None;
        }
        let policy = self.policy;
        self.update(hash, id, |b| b.record(admission, outcome, now, &policy))
    }

    fn get(&self, hash: NodeHash, id: &NodeId) -> Option<&Breaker> {
        let bucket = self.entries.get(&hash)?;
        bucket.iter().find(|(i, _)| i == id).map(|(_, b)| b)
    }

    fn update<R>(&mut self, hash: NodeHash, id: &NodeId, f: impl FnOnce(&mut Breaker) -> R) -> R {
        let bucket = self.entries.entry(hash).or_default();
        let position = match bucket.iter().position(|(i, _)| i == id) {
            Some(position) => position,
            None => {
                bucket.push((id.clone(), Breaker::default()));
                bucket.len() - 1
            }
        };
        let breaker = &mut bucket[position].1;
        let was_closed = breaker.is_closed();
        let result = f(breaker);
        let is_closed = breaker.is_closed();
        if was_closed != is_closed {
            if is_closed {
                self.not_closed -= 1;
            } else {
                self.not_closed += 1;
            }
            self.refilter();
        }
        result
    }

    /// Rebuilds the filter from the entries (on a change between closed and not closed).
    fn refilter(&mut self) {
        self.filter.fill(0);
        for (hash, bucket) in &self.entries {
            if bucket.iter().any(|(_, b)| !b.is_closed()) {
                let (word, bit) = filter_bit(*hash);
                self.filter[word] |= bit;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn policy() -> BreakerPolicy {
        BreakerPolicy::new(3, Duration::from_secs(5), Duration::from_secs(20)).unwrap()
    }

    fn fail(b: &mut Breaker, now: Instant) -> Option<Transition> {
        let (admission, _) = b.admit(now).unwrap();
        b.record(admission, Outcome::NodeFailure, now, &policy())
    }

    #[test]
    fn trips_after_consecutive_node_failures_only() {
        let now = Instant::now();
        let mut b = Breaker::default();
        assert_eq!(fail(&mut b, now), None);
        assert_eq!(fail(&mut b, now), None);
        // A success in between starts the count again; neutral outcomes do not count.
        let (admission, _) = b.admit(now).unwrap();
        b.record(admission, Outcome::Success, now, &policy());
        for _ in 0..10 {
            let (admission, _) = b.admit(now).unwrap();
            assert_eq!(b.record(admission, Outcome::Neutral, now, &policy()), None);
        }
        assert_eq!(fail(&mut b, now), None);
        assert_eq!(fail(&mut b, now), None);
        assert_eq!(
            fail(&mut b, now),
            Some(Transition::Opened {
                cooldown: Duration::from_secs(5),
                trips: 1
            })
        );
        assert!(!b.admits(now + Duration::from_secs(4)));
        assert!(b.admit(now).is_none());
    }

    #[test]
    fn half_open_lets_one_probe_through_and_its_outcome_decides() {
        let start = Instant::now();
        let mut b = Breaker::default();
        for _ in 0..3 {
            fail(&mut b, start);
        }
        let later = start + Duration::from_secs(5);
        let (probe, transition) = b.admit(later).unwrap();
        assert!(probe.is_probe());
        assert_eq!(transition, Some(Transition::HalfOpened));
        assert!(b.admit(later).is_none(), "a second probe");
        // A failed probe re-opens for twice as long.
        assert_eq!(
            b.record(probe, Outcome::NodeFailure, later, &policy()),
            Some(Transition::Opened {
                cooldown: Duration::from_secs(10),
                trips: 2
            })
        );
        let later = later + Duration::from_secs(10);
        let (probe, _) = b.admit(later).unwrap();
        // A neutral probe frees the slot for another probe.
        assert_eq!(b.record(probe, Outcome::Neutral, later, &policy()), None);
        let (probe, transition) = b.admit(later).unwrap();
        assert!(probe.is_probe());
        assert_eq!(transition, None);
        assert_eq!(
            b.record(probe, Outcome::Success, later, &policy()),
            Some(Transition::Closed)
        );
        assert_eq!(b.state(), State::Closed { failures: 0 });
    }

    #[test]
    fn cooldown_is_capped() {
        let p = policy();
        let cooldowns: Vec<u64> = (1..6).map(|t| p.cooldown(t).as_secs()).collect();
        assert_eq!(cooldowns, [5, 10, 20, 20, 20]);
        assert_eq!(p.cooldown(u32::MAX), Duration::from_secs(20));
        assert!(BreakerPolicy::new(0, Duration::from_secs(1), Duration::from_secs(1)).is_err());
        assert!(BreakerPolicy::new(1, Duration::from_secs(2), Duration::from_secs(1)).is_err());
    }

    #[test]
    fn stale_outcomes_change_nothing() {
        let now = Instant::now();
        let mut b = Breaker::default();
        let (old, _) = b.admit(now).unwrap();
        for _ in 0..3 {
            fail(&mut b, now);
        }
        // A run admitted before the trip cannot close it, or trip it again.
        assert_eq!(b.record(old, Outcome::Success, now, &policy()), None);
        assert_eq!(b.record(old, Outcome::NodeFailure, now, &policy()), None);
        assert!(matches!(b.state(), State::Open { .. }));
    }

    #[test]
    fn the_book_keeps_nodes_apart_and_skips_look_ups_while_all_closed() {
        let now = Instant::now();
        let a = NodeId::parse("a").unwrap();
        let b = NodeId::parse("b").unwrap();
        let (ha, hb) = (NodeHash::of(&a), NodeHash::of(&b));
        let mut book = BreakerBook::new(policy());
        for _ in 0..3 {
            let (admission, _) = book.admit(ha, &a, now).unwrap();
            book.record(ha, &a, admission, Outcome::NodeFailure, now);
        }
        assert!(!book.admits(ha, &a, now));
        assert!(book.admits(hb, &b, now));
        assert_eq!(book.state(hb, &b), State::Closed { failures: 0 });
        let (admission, _) = book.admit(hb, &b, now).unwrap();
        assert_eq!(book.record(hb, &b, admission, Outcome::Success, now), None);
        assert_eq!(
            book.entries.len(),
            1,
            "no entry for a node that never failed"
        );
        let later = now + Duration::from_secs(5);
        let (probe, _) = book.admit(ha, &a, later).unwrap();
        assert_eq!(
            book.record(ha, &a, probe, Outcome::Success, later),
            Some(Transition::Closed)
        );
        assert_eq!(book.not_closed, 0);
    }

    #[test]
    fn the_filter_never_hides_an_open_breaker() {
        let now = Instant::now();
        let mut book = BreakerBook::new(policy());
        let ids: Vec<NodeId> = (0..6000)
            .map(|i| NodeId::parse(&format!("n{i}")).unwrap())
            .collect();
        // Trip every other node: far more than the filter has bits.
        for id in ids.iter().step_by(2) {
            for _ in 0..3 {
                let (admission, _) = book.admit(NodeHash::of(id), id, now).unwrap();
                book.record(NodeHash::of(id), id, admission, Outcome::NodeFailure, now);
            }
        }
        for (i, id) in ids.iter().enumerate() {
            assert_eq!(book.admits(NodeHash::of(id), id, now), i % 2 == 1, "{id}");
        }
    }

    #[derive(Debug, Clone)]
    enum Op {
        Admit,
        Finish(usize, u8),
        Wait(u16),
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            3 => Just(Op::Admit),
            3 => (any::<usize>(), 0u8..3).prop_map(|(i, o)| Op::Finish(i, o)),
            1 => (0u16..30_000).prop_map(Op::Wait),
        ]
    }

    proptest! {
        /// Whatever the order of admissions, outcomes and waits, at most one probe is ever
        /// out, nothing is admitted while open, and it only opens after `threshold`
        /// consecutive node failures.
        #[test]
        fn never_two_probes(ops in proptest::collection::vec(op(), 0..200)) {
            let policy = policy();
            let mut now = Instant::now();
            let mut b = Breaker::default();
            let mut out: Vec<Admission> = Vec::new();
            for op in ops {
                match op {
                    Op::Admit => {
                        let admits = b.admits(now);
                        let admitted = b.admit(now);
                        prop_assert_eq!(admits, admitted.is_some());
                        if let Some((admission, _)) = admitted {
                            out.push(admission);
                        }
                    }
                    Op::Finish(i, o) if !out.is_empty() => {
                        let admission = out.swap_remove(i % out.len());
                        let outcome = [Outcome::Success, Outcome::NodeFailure, Outcome::Neutral][o as usize];
                        let before = b.state();
                        let t = b.record(admission, outcome, now, &policy);
                        if let Some(Transition::Opened { .. }) = t {
                            let tripped_closed = matches!(before, State::Closed { failures } if failures + 1 == 3);
                            prop_assert!(tripped_closed || admission.is_probe());
                        }
                    }
                    Op::Finish(..) => {}
                    Op::Wait(ms) => now += Duration::from_millis(u64::from(ms)),
                }
                let probes = out.iter().filter(|a| a.is_probe() && a.epoch == b.epoch).count();
                prop_assert!(probes <= 1, "{} probes out", probes);
                if let State::Open { until } = b.state() {
                    prop_assert!(!b.admits(now) || now >= until);
                }
            }
        }
    }
}
