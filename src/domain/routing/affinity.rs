//! Choosing among eligible nodes: bounded-load rendezvous for runs with an affinity key,
//! least busy for the rest.
//!
//! Bounded load (Mirrokni, Thorup, Zadimoghaddam, "Consistent hashing with bounded loads"):
//! a node may take a keyed run while `load + 1 ≤ ⌈c · (total + 1) · slots / all_slots⌉`,
//! where `total` and `all_slots` are summed over the eligible nodes. With equal slots this
//! is the paper's `⌈c · (total + 1) / n⌉`; with unequal slots each node's bound is its share
//! of the slots, so load is measured relative to `max_concurrent_runs`. The run goes to the
//! first node in the key's rendezvous order within its bound (and below its slots).

use super::candidates::{Pool, Seat};
use super::hash::{AffinityKey, score, weighted_score};
use super::reason::AffinityOutcome;

/// `c`, how far above the mean load a node may go before its keys spill to the next node
/// (`routing.affinity_load_factor`). Kept in thousandths so the bound is exact integer
/// arithmetic.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct LoadFactor(u32);

impl LoadFactor {
    /// `c` from 1.0 (strict balance, affinity yields at once) to 10.0.
    ///
    /// # Errors
    /// The offending value when it is not a number in that range.
    pub fn new(c: f64) -> Result<Self, f64> {
        if (1.0..=10.0).contains(&c) {
            // In range, so the product fits a u32 exactly enough (to 1/1000).
            Ok(Self((c * 1000.0).round() as u32))
        } else {
            Err(c)
        }
    }

    /// `c` as a number.
    pub fn get(self) -> f64 {
        f64::from(self.0) / 1000.0
    }

    /// The most runs a node with `slots` may hold after taking one more keyed run, when the
    /// eligible nodes hold `total` runs in `all_slots` slots.
    pub fn bound(self, total: u64, slots: u32, all_slots: u64) -> u64 {
        let numerator = u128::from(self.0) * u128::from(total + 1) * u128::from(slots);
        let denominator = 1000 * u128::from(all_slots.max(1));
        u64::try_from(numerator.div_ceil(denominator)).unwrap_or(u64::MAX)
    }
}

impl Default for LoadFactor {
    /// 1.25.
    fn default() -> Self {
        Self(1_250)
    }
}

/// A node chosen by affinity.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct AffinityChoice {
    pub(super) index: usize,
    pub(super) outcome: AffinityOutcome,
}

/// The key's order value for a seat: raw scores when every serving node has equal slots
/// (the same order weighting would give), weighted by slots otherwise.
fn rank(key: AffinityKey, seat: &Seat, uniform: bool) -> u64 {
    let raw = score(key, seat.hash);
    if uniform {
        raw
    } else {
        weighted_score(raw, seat.slots)
    }
}

/// The first eligible node in `key`'s rendezvous order that is within its load bound;
/// `None` when none is (only possible when every one is full).
pub(super) fn choose(pool: &Pool, key: AffinityKey, c: LoadFactor) -> Option<AffinityChoice> {
    // The bound depends only on a node's slots: computed once per distinct slot count
    // in a row (once in all for equal nodes), not once per node.
    let mut memo: Option<(u32, u64)> = None;
    let mut bound = |slots: u32| match memo {
        Some((s, b)) if s == slots => b,
        _ => {
            let b = c.bound(pool.load, slots, pool.slots);
            memo = Some((slots, b));
            b
        }
    };
    let mut home: Option<(u64, usize)> = None;
    let mut fit: Option<(u64, usize)> = None;
    for seat in &pool.eligible {
        let r = rank(key, seat, pool.uniform);
        if home.is_none_or(|(best, _)| r > best) {
            home = Some((r, seat.index));
        }
        if fit.is_none_or(|(best, _)| r > best)
            && seat.has_room()
            && u64::from(seat.active) < bound(seat.slots)
        {
            fit = Some((r, seat.index));
        }
    }
    let ((home_rank, home_index), (fit_rank, index)) = (home?, fit?);
    let left_out_home = pool
        .left_out
        .iter()
        .map(|s| rank(key, s, pool.uniform))
        .max();
    let outcome = if left_out_home.is_some_and(|r| r > home_rank) {
        AffinityOutcome::Miss
    } else if index == home_index {
        AffinityOutcome::Hit
    } else {
        let ahead = pool
            .eligible
            .iter()
            .filter(|s| rank(key, s, pool.uniform) > fit_rank)
            .count();
        AffinityOutcome::Overloaded {
            rank: u32::try_from(ahead + 1).unwrap_or(u32::MAX),
        }
    };
    Some(AffinityChoice { index, outcome })
}

/// The eligible node with room and the fewest active runs per slot; ties rotate with
/// `turn` in node order (as `select_node` does, so equal fleets route as before).
pub(super) fn least_busy(pool: &Pool, turn: u64) -> Option<usize> {
    let mut least: Option<(u64, u64)> = None;
    let mut ties: Vec<usize> = Vec::new();
    for seat in pool.eligible.iter().filter(|s| s.has_room()) {
        let load = (u64::from(seat.active), u64::from(seat.slots));
        // a/b against c/d without division: a·d against c·b.
        let order = least.map(|(a, b)| (load.0 * b).cmp(&(a * load.1)));
        match order {
            Some(std::cmp::Ordering::Greater) => {}
            Some(std::cmp::Ordering::Equal) => ties.push(seat.index),
            _ => {
                least = Some(load);
                ties.clear();
                ties.push(seat.index);
            }
        }
    }
    let pick = usize::try_from(turn % ties.len().max(1) as u64).unwrap_or(0);
    ties.get(pick).copied()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_bound_is_the_papers_for_equal_slots() {
        let c = LoadFactor::default();
        // ⌈1.25 · (0 + 1) / 4⌉ = 1, ⌈1.25 · 8 / 4⌉ = 3, ⌈1.25 · 9 / 4⌉ = 3.
        assert_eq!(c.bound(0, 4, 16), 1);
        assert_eq!(c.bound(7, 4, 16), 3);
        assert_eq!(c.bound(8, 4, 16), 3);
        // Unequal slots: a node with half the slots gets half the bound (rounded up).
        assert_eq!(c.bound(7, 8, 16), 5);
        assert_eq!(c.bound(7, 2, 16), 2);
        assert_eq!(c.bound(u64::MAX - 1, u32::MAX, 1), u64::MAX);
    }

    #[test]
    fn load_factor_validates() {
        assert_eq!(LoadFactor::new(1.25), Ok(LoadFactor::default()));
        assert_eq!(LoadFactor::new(1.0).map(LoadFactor::get), Ok(1.0));
        assert!(LoadFactor::new(0.9).is_err());
        assert!(LoadFactor::new(f64::NAN).is_err());
        assert!(LoadFactor::new(11.0).is_err());
    }
}
