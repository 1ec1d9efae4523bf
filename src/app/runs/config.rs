//! The run service's sections: `[runs]` (how runs wait, fail over, are cancelled and are
//! bounded in time), `[routing]` and `[limits]` (how runs are routed — affinity, circuit
//! breakers — and how much one API key may start), and [`policy`], which checks them
//! together and builds the domain's [`RoutingPolicy`] through its validating constructors;
//! [`Routing`] is that policy with every node definition, as the placer routes by it.
//!
//! Deserialized by `crate::app::compose::settings` with the other sections; the reference is
//! `docs/configuration.md`.

use std::collections::HashMap;
use std::num::NonZeroU32;
use std::time::Duration;

use serde::Deserialize;

use crate::domain::MaxContinuations;
use crate::domain::routing::{
    BreakerPolicy, Catalog, LimitPolicy, LoadFactor, MaxAttempts, RoutingPolicy, TenantKey,
    WaitLimits,
};

/// How the run service routes: every configured node and the routing settings.
#[derive(Debug, Clone, Default)]
pub struct Routing {
    /// Every node definition, connected or not.
    pub catalog: Catalog,
    /// Failover, waits, affinity, breakers and limits.
    pub policy: RoutingPolicy,
    /// The API keys' own limits, by the key's name: a run taken back from the journal
    /// (which keeps only its key's name) counts under them as it did when admitted.
    pub key_limits: HashMap<TenantKey, LimitPolicy>,
}

/// `[runs]`: how runs wait, fail over, are cancelled and are bounded in time.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RunsConfig {
    /// Runs that may wait for a node at once; at least 1.
    pub queue_capacity: usize,
    /// The longest a run waits in the queue for a busy node before it fails.
    pub queue_timeout_ms: u64,
    /// The longest a run waits for a node serving it to connect or become available.
    pub no_node_timeout_ms: u64,
    /// Attempts per run, the first included: a run that fails for a node's reason before
    /// any output is placed again on another node (1 to 10; 1 turns failover off).
    pub max_attempts: u32,
    /// How long a cancelled run waits for the node's own `cancelled` event before the edge
    /// ends it.
    pub cancel_grace_ms: u64,
    /// The deadline given to runs that do not set one; 0 for none.
    pub default_deadline_ms: u64,
    /// How long a run that already produced output is held for its node to reconnect and
    /// resume it after the node's connection dropped; 0 turns resume off.
    pub resume_grace_ms: u64,
    /// How many times a run whose node was lost after output may be carried on by another
    /// node from the output already relayed (0 to 10; 0 turns continuation off).
    pub max_continuations: u32,
    /// How long a streamed run whose client's connection dropped goes on for a caller to
    /// resume its stream before it is cancelled; 0 cancels it at once.
    pub client_resume_grace_ms: u64,
}

impl Default for RunsConfig {
    fn default() -> Self {
        Self {
            queue_capacity: 1_024,
            queue_timeout_ms: 30_000,
            no_node_timeout_ms: 10_000,
            max_attempts: 3,
            cancel_grace_ms: 5_000,
            default_deadline_ms: 0,
            resume_grace_ms: 5_000,
            max_continuations: 1,
            client_resume_grace_ms: 10_000,
        }
    }
}

impl RunsConfig {
    /// `queue_timeout_ms` as a duration.
    pub fn queue_timeout(&self) -> Duration {
        Duration::from_millis(self.queue_timeout_ms)
    }

    /// `cancel_grace_ms` as a duration.
    pub fn cancel_grace(&self) -> Duration {
        Duration::from_millis(self.cancel_grace_ms)
    }

    /// `resume_grace_ms` as a duration, or `None` when it is 0 (resume off).
    pub fn resume_grace(&self) -> Option<Duration> {
        (self.resume_grace_ms > 0).then(|| Duration::from_millis(self.resume_grace_ms))
    }

    /// `client_resume_grace_ms` as a duration.
    pub fn client_resume_grace(&self) -> Duration {
        Duration::from_millis(self.client_resume_grace_ms)
    }

    /// `default_deadline_ms` as a duration, or `None` when it is 0 (no deadline).
    pub fn default_deadline(&self) -> Option<Duration> {
        (self.default_deadline_ms > 0).then(|| Duration::from_millis(self.default_deadline_ms))
    }
}

/// `[routing]`: affinity and circuit breakers.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RoutingConfig {
    /// `c` of bounded-load affinity: a node takes a keyed run while it holds at most `c`
    /// times its share of the load; 1.0 to 10.0.
    pub affinity_load_factor: f64,
    /// Key chat runs without a client key by their prompt's stable prefix.
    pub prefix_affinity: bool,
    /// `[routing.breaker]`.
    pub breaker: BreakerConfig,
}

impl Default for RoutingConfig {
    fn default() -> Self {
        Self {
            affinity_load_factor: LoadFactor::default().get(),
            prefix_affinity: true,
            breaker: BreakerConfig::default(),
        }
    }
}

/// `[routing.breaker]`: when a node's circuit breaker opens and for how long.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct BreakerConfig {
    /// Consecutive node failures that open it.
    pub failure_threshold: u32,
    /// How long it stays open the first time.
    pub cooldown_ms: u64,
    /// The cap of the open period, which doubles on each trip without a recovery.
    pub max_cooldown_ms: u64,
}

impl Default for BreakerConfig {
    fn default() -> Self {
        Self {
            failure_threshold: 3,
            cooldown_ms: 5_000,
            max_cooldown_ms: 120_000,
        }
    }
}

/// `[limits]`: what every API key may start (a key's own settings in `[[api.keys]]` win);
/// 0 is unlimited.
#[derive(Debug, Clone, PartialEq, Eq, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct LimitsConfig {
    /// Runs one key may have open at once.
    pub max_concurrent_runs_per_key: u32,
    /// Runs one key may start per minute, on average.
    pub requests_per_minute_per_key: u32,
    /// Runs a rested key may start at once; 0 is a whole minute's share.
    pub burst_per_key: u32,
}

impl LimitsConfig {
    /// The domain's policy: each 0 is "no limit".
    pub fn policy(&self) -> LimitPolicy {
        LimitPolicy {
            max_concurrent: NonZeroU32::new(self.max_concurrent_runs_per_key),
            per_minute: NonZeroU32::new(self.requests_per_minute_per_key),
            burst: NonZeroU32::new(self.burst_per_key),
        }
    }
}

/// Every routing setting of `[runs]`, `[routing]` and `[limits]` as the domain's policy.
///
/// # Errors
/// One message per invalid key, naming it: `runs.max_attempts` outside 1–10,
/// `runs.max_continuations` above 10, a load factor
/// outside 1.0–10.0, a zero breaker threshold or cooldown, a cooldown above its cap.
pub fn policy(
    runs: &RunsConfig,
    routing: &RoutingConfig,
    limits: &LimitsConfig,
) -> Result<RoutingPolicy, Vec<String>> {
    let mut problems = Vec::new();
    let max_attempts = MaxAttempts::new(runs.max_attempts).map_err(|n| {
        problems.push(format!(
            "`runs.max_attempts` must be from 1 to {} (it is {n})",
            MaxAttempts::MAX
        ));
    });
    let max_continuations = MaxContinuations::new(runs.max_continuations).map_err(|n| {
        problems.push(format!(
            "`runs.max_continuations` must be from 0 to {} (it is {n})",
            MaxContinuations::MAX
        ));
    });
    let load_factor = LoadFactor::new(routing.affinity_load_factor).map_err(|c| {
        problems.push(format!(
            "`routing.affinity_load_factor` must be from 1.0 to 10.0 (it is {c})"
        ));
    });
    let breaker = &routing.breaker;
    let breaker = BreakerPolicy::new(
        breaker.failure_threshold,
        Duration::from_millis(breaker.cooldown_ms),
        Duration::from_millis(breaker.max_cooldown_ms),
    )
    .map_err(|error| problems.push(error.to_string()));
    let (Ok(max_attempts), Ok(max_continuations), Ok(load_factor), Ok(breaker)) =
        (max_attempts, max_continuations, load_factor, breaker)
    else {
        return Err(problems);
    };
    Ok(RoutingPolicy {
        max_attempts,
        max_continuations,
        wait: WaitLimits {
            busy: runs.queue_timeout(),
            no_node: Duration::from_millis(runs.no_node_timeout_ms),
        },
        load_factor,
        prefix_affinity: routing.prefix_affinity,
        breaker,
        limits: limits.policy(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_defaults_are_the_domains() {
        let policy = policy(
            &RunsConfig::default(),
            &RoutingConfig::default(),
            &LimitsConfig::default(),
        )
        .unwrap();
        assert_eq!(policy, RoutingPolicy::default());
    }

    #[test]
    fn every_invalid_key_is_named() {
        let runs = RunsConfig {
            max_attempts: 0,
            max_continuations: 11,
            ..RunsConfig::default()
        };
        let routing = RoutingConfig {
            affinity_load_factor: 0.5,
            breaker: BreakerConfig {
                failure_threshold: 0,
                ..BreakerConfig::default()
            },
            ..RoutingConfig::default()
        };
        let problems = policy(&runs, &routing, &LimitsConfig::default())
            .unwrap_err()
            .join("; ");
        for key in [
            "runs.max_attempts",
            "runs.max_continuations",
            "routing.affinity_load_factor",
            "routing.breaker.failure_threshold",
        ] {
            assert!(problems.contains(key), "{key} in {problems}");
        }
    }

    #[test]
    fn zero_limits_are_no_limits() {
        assert_eq!(LimitsConfig::default().policy(), LimitPolicy::default());
        let limits = LimitsConfig {
            max_concurrent_runs_per_key: 2,
            requests_per_minute_per_key: 60,
            burst_per_key: 0,
        };
        let policy = limits.policy();
        assert_eq!(policy.max_concurrent.map(NonZeroU32::get), Some(2));
        assert_eq!(policy.per_minute.map(NonZeroU32::get), Some(60));
        assert_eq!(policy.burst, None);
    }
}
