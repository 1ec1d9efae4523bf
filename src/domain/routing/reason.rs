//! Why a run went where it went: the value phase 2 renders into the `x-edge-route` header,
//! the `started` event and metric labels.

use std::fmt;
use std::time::Duration;

use super::hash::KeySource;

/// How affinity placed a run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AffinityOutcome {
    /// The key's home node (first in its rendezvous order among eligible nodes) took it:
    /// its cache is likely warm.
    Hit,
    /// The key's home node among the serving nodes is left out now (tried by this run,
    /// drained, unavailable, breaker open), so the next node in the key's order took it.
    Miss,
    /// The home node is over its load bound; the `rank`-th node in the key's order (2 or
    /// more) was the first within its bound.
    Overloaded {
        /// The chosen node's position in the key's order among eligible nodes, from 1.
        rank: u32,
    },
}

/// The rule that chose the node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RouteRule {
    /// The request named the node.
    Pinned,
    /// Bounded-load rendezvous on the run's affinity key.
    Affinity {
        /// Where the key came from.
        source: KeySource,
        /// How it went.
        outcome: AffinityOutcome,
    },
    /// No key: the least busy eligible node (fewest active runs per slot), ties rotating.
    LeastBusy,
    /// A continuation: the run's node was lost after output, and this node (one that can
    /// continue runs, chosen as any other attempt's) carries it on.
    Continuation,
}

/// Why a run was placed where it was.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RouteReason {
    /// The rule that chose the node.
    pub rule: RouteRule,
    /// Which attempt this is: 1 for the first, 2 or more after failover.
    pub attempt: u32,
    /// How many nodes were eligible (serving, not tried, drained, unavailable or open).
    pub eligible: u32,
    /// How long the run waited in the queue before this placement; set by the caller.
    pub queue_wait: Option<Duration>,
}

impl RouteReason {
    /// The same reason, with the queue wait the caller measured.
    #[must_use]
    pub fn with_queue_wait(self, wait: Duration) -> Self {
        Self {
            queue_wait: Some(wait),
            ..self
        }
    }

    /// A stable label for metrics: `pinned`, `affinity_hit`, `affinity_miss`,
    /// `affinity_overloaded`, `least_busy` or `continuation`.
    pub fn label(&self) -> &'static str {
        match self.rule {
            RouteRule::Pinned => "pinned",
            RouteRule::Affinity { outcome, .. } => match outcome {
                AffinityOutcome::Hit => "affinity_hit",
                AffinityOutcome::Miss => "affinity_miss",
                AffinityOutcome::Overloaded { .. } => "affinity_overloaded",
            },
            RouteRule::LeastBusy => "least_busy",
            RouteRule::Continuation => "continuation",
        }
    }

    /// Whether this placement is a failover (attempt 2 or more).
    pub fn is_failover(&self) -> bool {
        self.attempt > 1
    }
}

/// The header form: `affinity_overloaded; key=prefix; rank=2; attempt=1; eligible=8;
/// queued_ms=40` (`key` and `rank` only for affinity, `queued_ms` only when it waited).
impl fmt::Display for RouteReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.label())?;
        if let RouteRule::Affinity { source, outcome } = self.rule {
            write!(f, "; key={}", source.as_str())?;
            if let AffinityOutcome::Overloaded { rank } = outcome {
                write!(f, "; rank={rank}")?;
            }
        }
        write!(f, "; attempt={}; eligible={}", self.attempt, self.eligible)?;
        if let Some(wait) = self.queue_wait {
            write!(f, "; queued_ms={}", wait.as_millis())?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_for_the_header() {
        let reason = RouteReason {
            rule: RouteRule::Affinity {
                source: KeySource::Prefix,
                outcome: AffinityOutcome::Overloaded { rank: 2 },
            },
            attempt: 1,
            eligible: 8,
            queue_wait: None,
        };
        assert_eq!(
            reason.to_string(),
            "affinity_overloaded; key=prefix; rank=2; attempt=1; eligible=8"
        );
        let failover = RouteReason {
            rule: RouteRule::LeastBusy,
            attempt: 2,
            eligible: 3,
            queue_wait: None,
        }
        .with_queue_wait(Duration::from_millis(40));
        assert!(failover.is_failover());
        assert_eq!(
            failover.to_string(),
            "least_busy; attempt=2; eligible=3; queued_ms=40"
        );
        let pinned = RouteReason {
            rule: RouteRule::Pinned,
            ..failover
        };
        assert_eq!(pinned.label(), "pinned");
    }
}
