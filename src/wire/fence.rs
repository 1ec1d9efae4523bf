//! [`EpochFence`]: the highest epoch a node has seen from the edges of its site, shared by
//! all of the node's connections, applying the domain's rule that refuses what an edge
//! under an older epoch sends ([`crate::domain::site::fence`]; docs/protocol.md,
//! "Fencing"). Plain bookkeeping: no I/O, no clock.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::domain::site::{Fence, fence};

/// The highest epoch seen so far, cheap to clone: every clone is the same fence, so one
/// node process hands one fence to every connection it opens, across reconnects.
///
/// A message under an epoch below the highest seen is stale: it comes from a member of the
/// site that has lost its lease since (a paused ex-leader), and must not be obeyed. Epoch 0
/// (a single edge, or an edge older than v1.5) is obeyed only while nothing higher was seen.
#[derive(Debug, Clone, Default)]
pub struct EpochFence {
    highest: Arc<AtomicU64>,
}

impl EpochFence {
    /// A fence that has seen nothing yet (epoch 0).
    pub fn new() -> Self {
        Self::default()
    }

    /// The highest epoch seen.
    pub fn highest(&self) -> u64 {
        self.highest.load(Ordering::Acquire)
    }

    /// Notes a message under `epoch`, raising the highest seen to it.
    ///
    /// # Errors
    /// The highest epoch seen when `epoch` is below it: the message is stale.
    pub fn observe(&self, epoch: u64) -> Result<(), u64> {
        let before = self.highest.fetch_max(epoch, Ordering::AcqRel);
        match fence(before, epoch) {
            Fence::Obey { .. } => Ok(()),
            Fence::Stale { highest } => Err(highest),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lower_epoch_is_refused_and_the_highest_stays() {
        let fence = EpochFence::new();
        assert_eq!(fence.observe(0), Ok(()));
        assert_eq!(fence.observe(2), Ok(()));
        let other_connection = fence.clone();
        assert_eq!(other_connection.observe(1), Err(2));
        assert_eq!(other_connection.observe(0), Err(2));
        assert_eq!(fence.observe(2), Ok(()));
        assert_eq!(fence.observe(3), Ok(()));
        assert_eq!(fence.highest(), 3);
    }
}
