//! The brute-force brake on registration: a growing delay before answering failed
//! registrations from the same peer address.
//!
//! Pure: the caller passes `now` and sleeps for the returned delay. Only failed attempts
//! are delayed, so a valid node never waits, even from an address that failed before.

use std::collections::HashMap;
use std::net::IpAddr;
use std::time::{Duration, Instant};

/// How long an address's failures are remembered after its last one.
const FORGET_AFTER: Duration = Duration::from_secs(60);

/// Addresses remembered at most; past this the stalest are forgotten first.
const MAX_ADDRESSES: usize = 65_536;

#[derive(Debug, Clone, Copy)]
struct Strikes {
    count: u32,
    last: Instant,
}

/// Failed registrations per peer address, and the delay each earns.
#[derive(Debug)]
pub struct RegistrationThrottle {
    base: Duration,
    max: Duration,
    strikes: HashMap<IpAddr, Strikes>,
}

impl RegistrationThrottle {
    /// A throttle whose first failure waits `base`, doubling with each further failure up
    /// to `max`.
    pub fn new(base: Duration, max: Duration) -> Self {
        Self {
            base,
            max,
            strikes: HashMap::new(),
        }
    }

    /// Records a failed registration from `peer` at `now`; returns how long to wait before
    /// answering it.
    pub fn record_failure(&mut self, peer: IpAddr, now: Instant) -> Duration {
        if self.strikes.len() >= MAX_ADDRESSES && !self.strikes.contains_key(&peer) {
            self.forget_stale(now);
        }
        let strikes = self.strikes.entry(peer).or_insert(Strikes {
            count: 0,
            last: now,
        });
        if now.saturating_duration_since(strikes.last) > FORGET_AFTER {
            strikes.count = 0;
        }
        strikes.count = strikes.count.saturating_add(1);
        strikes.last = now;
        let doublings = strikes.count.saturating_sub(1).min(30);
        self.base.saturating_mul(1 << doublings).min(self.max)
    }

    /// How many addresses have failures on record.
    pub fn tracked(&self) -> usize {
        self.strikes.len()
    }

    fn forget_stale(&mut self, now: Instant) {
        self.strikes
            .retain(|_, s| now.saturating_duration_since(s.last) <= FORGET_AFTER);
        if self.strikes.len() >= MAX_ADDRESSES {
            // Every address is recent: drop the one idle longest.
            let stalest = self
                .strikes
                .iter()
                .min_by_key(|(_, s)| s.last)
                .map(|(ip, _)| *ip);
            if let Some(ip) = stalest {
                self.strikes.remove(&ip);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::net::Ipv4Addr;

    use super::*;

    fn ip(last: u8) -> IpAddr {
        IpAddr::V4(Ipv4Addr::new(10, 0, 0, last))
    }

    #[test]
    fn delay_doubles_per_failure_up_to_the_cap() {
        let mut throttle =
            RegistrationThrottle::new(Duration::from_millis(100), Duration::from_secs(1));
        let now = Instant::now();
        let delays: Vec<u128> = (0..6)
            .map(|_| throttle.record_failure(ip(1), now).as_millis())
            .collect();
        assert_eq!(delays, [100, 200, 400, 800, 1000, 1000]);
    }

    #[test]
    fn addresses_are_throttled_independently() {
        let mut throttle =
            RegistrationThrottle::new(Duration::from_millis(100), Duration::from_secs(5));
        let now = Instant::now();
        for _ in 0..5 {
            throttle.record_failure(ip(1), now);
        }
        assert_eq!(
            throttle.record_failure(ip(2), now),
            Duration::from_millis(100)
        );
    }

    #[test]
    fn failures_are_forgotten_after_a_quiet_minute() {
        let mut throttle =
            RegistrationThrottle::new(Duration::from_millis(100), Duration::from_secs(5));
        let start = Instant::now();
        for _ in 0..4 {
            throttle.record_failure(ip(1), start);
        }
        let later = start + FORGET_AFTER + Duration::from_secs(1);
        assert_eq!(
            throttle.record_failure(ip(1), later),
            Duration::from_millis(100)
        );
    }

    #[test]
    fn memory_stays_bounded() {
        let mut throttle =
            RegistrationThrottle::new(Duration::from_millis(1), Duration::from_millis(2));
        let now = Instant::now();
        for i in 0..(MAX_ADDRESSES as u32 + 10) {
            throttle.record_failure(IpAddr::V4(Ipv4Addr::from(i)), now);
        }
        assert!(throttle.tracked() <= MAX_ADDRESSES);
    }
}
