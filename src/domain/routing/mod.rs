//! Routing decisions (issues 13 and 19): where a run goes, whether it waits, whether it is
//! tried again, and why — as pure functions and small state machines.
//!
//! The order is filter → decide → retry outside: [`candidates`] keeps the eligible nodes
//! (serving, available, not drained, breaker closed, not yet tried) and counts why the rest
//! were left out; [`decide()`] chooses by pin, bounded-load rendezvous or least busy and
//! returns a [`RouteReason`]; [`failover`] says whether an ended attempt gets another;
//! [`breaker`] keeps each node's circuit breaker; [`fair_queue`] orders waiting runs by
//! priority and fair share per tenant; [`limits`] refuses a tenant over its limits and
//! [`budget`] one over its token budget, both with a [`LimitRefusal`] ([`refusal`]).
//!
//! Nothing here reads a clock, draws a random number, logs or touches a metric: `now`, the
//! rotation counter and the state come in, decisions and transitions go out. The design and
//! how the run service uses these pieces is `docs/routing.md`.

pub mod affinity;
pub mod breaker;
pub mod budget;
pub mod candidates;
pub mod decide;
pub mod failover;
pub mod fair_queue;
pub mod hash;
pub mod limits;
pub mod reason;
pub mod refusal;

#[cfg(test)]
mod tests;

use super::continuation::MaxContinuations;
pub use affinity::LoadFactor;
pub use breaker::{
    Admission, Breaker, BreakerBook, BreakerPolicy, BreakerPolicyError, Outcome,
    State as BreakerState, Transition,
};
pub use budget::{BudgetClaim, Budgets, TokenBudget};
pub use candidates::{Catalog, Filtered, ModelSeats, NodeStatus};
pub use decide::{Decision, RouteContext, RouteRequest, Unroutable, WaitCause, WaitLimits, decide};
pub use failover::{AttemptEnd, Because, Failover, MaxAttempts, Tried, after_attempt};
pub use fair_queue::{FairQueue, Priority, PriorityError, QueueFull, TenantKey, Waiter};
pub use hash::{AffinityKey, KeySource, NodeHash};
pub use limits::{KeyLimits, LimitPolicy};
pub use reason::{AffinityOutcome, RouteReason, RouteRule};
pub use refusal::{BudgetWindow, LimitRefusal};

/// Every routing setting, with the defaults a user who sets nothing gets: failover on (3
/// attempts), breakers on, prefix affinity on for chat, fair queueing, no per-key limits.
#[derive(Debug, Clone, PartialEq)]
pub struct RoutingPolicy {
    /// `runs.max_attempts`.
    pub max_attempts: MaxAttempts,
    /// `runs.max_continuations`.
    pub max_continuations: MaxContinuations,
    /// `runs.queue_timeout_ms` and `runs.no_node_timeout_ms`.
    pub wait: WaitLimits,
    /// `routing.affinity_load_factor`.
    pub load_factor: LoadFactor,
    /// `routing.prefix_affinity`: key chat runs without a client key by their prompt prefix.
    pub prefix_affinity: bool,
    /// `routing.breaker.*`.
    pub breaker: BreakerPolicy,
    /// `limits.*` per API key.
    pub limits: LimitPolicy,
}

impl Default for RoutingPolicy {
    fn default() -> Self {
        Self {
            max_attempts: MaxAttempts::default(),
            max_continuations: MaxContinuations::default(),
            wait: WaitLimits::default(),
            load_factor: LoadFactor::default(),
            prefix_affinity: true,
            breaker: BreakerPolicy::default(),
            limits: LimitPolicy::default(),
        }
    }
}
