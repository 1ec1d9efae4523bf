//! The placement decision: filter the connected nodes, then choose, and say why.
//!
//! [`decide`] tells apart exactly: a route no definition serves (refuse: 404), a route
//! configured but with no eligible node connected now (wait for one, then 503), and one
//! whose eligible nodes are all busy (wait, as before). Retries happen outside: a failover
//! attempt is another `decide` with the nodes tried so far excluded.

use std::time::{Duration, Instant};

use super::affinity::{self, LoadFactor};
use super::breaker::BreakerBook;
use super::candidates::{Catalog, Filter, Filtered, ModelSeats, NodeStatus, Pool};
use super::failover::Tried;
use super::hash::AffinityKey;
use super::reason::{RouteReason, RouteRule};
use crate::domain::lora::LoraChoice;
use crate::domain::names::{AdapterName, Target};
use crate::domain::operation::Operation;
use crate::domain::selection::NodeSelector;

/// What a run asks of routing.
#[derive(Debug, Clone, Copy)]
pub struct RouteRequest<'a> {
    /// Adapter, target and optional pin.
    pub selector: &'a NodeSelector,
    /// The key to keep runs together by, if any.
    pub affinity: Option<AffinityKey>,
    /// The nodes this run was already placed on (empty for a first attempt).
    pub tried: &'a Tried,
    /// What the run asks for: one that needs a declaration goes only to nodes that made it.
    pub operation: Operation,
    /// The LoRA applied on top of the target: only nodes that reported it take the run, and
    /// those where it is loaded first.
    pub lora: Option<&'a LoraChoice>,
}

/// The edge's state and settings a decision reads.
#[derive(Debug, Clone, Copy)]
pub struct RouteContext<'a> {
    /// Every configured node, connected or not.
    pub catalog: &'a Catalog,
    /// The nodes' circuit breakers.
    pub breakers: &'a BreakerBook,
    /// Affinity's `c`.
    pub load_factor: LoadFactor,
    /// Now, for breaker cooldowns.
    pub now: Instant,
    /// A counter advanced on every decision; rotates least-busy ties.
    pub turn: u64,
    /// Per node of the list, by position, its runs of the run's model against its engine's
    /// cap (a managed adapter's `parallel`); empty, or `None` for a node: no cap.
    pub model_seats: &'a [Option<ModelSeats>],
}

/// Why a run waits in the queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WaitCause {
    /// Every eligible node is at its `max_concurrent_runs`.
    AllBusy,
    /// The route is configured, but no node serving it is connected and eligible now
    /// (not connected, unavailable, drained or breaker open).
    NoNodeAvailable,
}

impl WaitCause {
    /// The `RunFailed.code` for a run whose wait expires with this cause.
    pub fn expiry_code(self) -> &'static str {
        match self {
            Self::AllBusy => "queue_timeout",
            Self::NoNodeAvailable => "no_node_available",
        }
    }
}

/// How long a run may wait, by cause (`runs.queue_timeout_ms`, `runs.no_node_timeout_ms`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WaitLimits {
    /// For a run waiting for a busy node.
    pub busy: Duration,
    /// For a run waiting for a node to connect or become available.
    pub no_node: Duration,
}

impl Default for WaitLimits {
    /// 30 s for a busy node (as today), 10 s for an absent one.
    fn default() -> Self {
        Self {
            busy: Duration::from_secs(30),
            no_node: Duration::from_secs(10),
        }
    }
}

impl WaitLimits {
    /// When a run queued at `queued_at` stops waiting, given its latest cause (re-decided
    /// at every pump, so a run whose node connects but is busy gets the longer limit).
    pub fn expires(&self, queued_at: Instant, cause: WaitCause) -> Instant {
        queued_at
            + match cause {
                WaitCause::AllBusy => self.busy,
                WaitCause::NoNodeAvailable => self.no_node,
            }
    }
}

/// Why a run cannot be placed at all.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Unroutable {
    /// No node definition serves the route (404).
    #[error("no node is configured to serve adapter {adapter} target {target}")]
    UnknownRoute {
        /// The requested adapter.
        adapter: AdapterName,
        /// The requested target.
        target: Target,
    },
    /// No node definition has the pinned id or alias (404).
    #[error("no node is configured with id or alias {pin:?}")]
    UnknownNode {
        /// The requested id or alias.
        pin: String,
    },
    /// The pinned node's definition does not serve the route (404).
    #[error("node {pin:?} is not configured to serve adapter {adapter} target {target}")]
    PinDoesNotServe {
        /// The requested id or alias.
        pin: String,
        /// The requested adapter.
        adapter: AdapterName,
        /// The requested target.
        target: Target,
    },
    /// A failover found no eligible node, none that could become eligible, and no
    /// configured node it has not tried that could still connect: the run ends with its
    /// last attempt's failure.
    #[error("every connected node serving the route was tried ({tried} attempt(s))")]
    Exhausted {
        /// Attempts made.
        tried: u32,
    },
}

/// Where a run goes, or why not now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// Place it on `nodes[index]`.
    Place {
        /// The chosen node's position in the node list.
        index: usize,
        /// Why.
        reason: RouteReason,
    },
    /// Queue it (or keep it queued).
    Wait {
        /// Why it waits.
        cause: WaitCause,
        /// Why each serving node was left out.
        filtered: Filtered,
    },
    /// Refuse it.
    Refuse(Unroutable),
}

/// Places a run: filters `nodes` (the connected nodes, in a stable order), then chooses by
/// pin, by bounded-load rendezvous on the affinity key, or least busy.
pub fn decide(
    nodes: &[NodeStatus],
    request: &RouteRequest<'_>,
    ctx: &RouteContext<'_>,
) -> Decision {
    let selector = request.selector;
    let pinned = match pin_position(nodes, selector, ctx.catalog) {
        Ok(pinned) => pinned,
        Err(refusal) => return Decision::Refuse(refusal),
    };
    if selector.pin.is_some() && pinned.is_none() {
        // Only the pinned node may take it: once tried, it is never tried again.
        let tried = request.tried.attempts();
        return if tried > 0 {
            Decision::Refuse(Unroutable::Exhausted { tried })
        } else {
            wait(WaitCause::NoNodeAvailable, Filtered::default())
        };
    }
    let filter = Filter {
        selector,
        operation: request.operation,
        tried: request.tried,
        breakers: ctx.breakers,
        now: ctx.now,
        model_seats: ctx.model_seats,
        lora: request.lora,
    };
    let pool = filter.pool(nodes, pinned);
    let filtered = pool.filtered;
    if pool.eligible.is_empty() {
        let configured = match selector.pin {
            Some(_) => 1,
            None => ctx.catalog.serving(&selector.adapter, &selector.target),
        };
        return if exhausted(request.tried.attempts(), configured, &filtered) {
            Decision::Refuse(Unroutable::Exhausted {
                tried: request.tried.attempts(),
            })
        } else {
            wait(WaitCause::NoNodeAvailable, filtered)
        };
    }
    if filtered.full == filtered.eligible() {
        return wait(WaitCause::AllBusy, filtered);
    }
    let pool = match request.lora {
        Some(_) => pool.loaded_first(),
        None => pool,
    };
    let chosen = choose(&pool, pinned, request.affinity, ctx);
    match chosen {
        Some((index, rule)) => Decision::Place {
            index,
            reason: RouteReason {
                rule,
                attempt: request.tried.attempts() + 1,
                eligible: filtered.eligible(),
                queue_wait: None,
            },
        },
        None => wait(WaitCause::AllBusy, filtered),
    }
}

/// Chooses among the eligible nodes of `pool`, at least one of which has room.
fn choose(
    pool: &Pool,
    pinned: Option<usize>,
    key: Option<AffinityKey>,
    ctx: &RouteContext<'_>,
) -> Option<(usize, RouteRule)> {
    let chosen = match (pinned, key) {
        (Some(index), _) => Some((index, RouteRule::Pinned)),
        (None, Some(key)) => affinity::choose(pool, key, ctx.load_factor).map(|c| {
            let rule = RouteRule::Affinity {
                source: key.source(),
                outcome: c.outcome,
            };
            (c.index, rule)
        }),
        (None, None) => None,
    };
    // Bounded load always leaves a node within its bound while any has room; least busy
    // covers keyless runs (and would cover a keyed run if that ever failed).
    chosen
        .or_else(|| affinity::least_busy(pool, ctx.turn).map(|index| (index, RouteRule::LeastBusy)))
}

/// Whether a run that made `attempts` attempts, with no eligible node now, could never be
/// placed: no node left out now could come back (drained, unavailable, open, full), and
/// no configured node it has not tried is away (one could connect). `configured` counts the
/// definitions serving the route (the pinned one alone with a pin); every node tried serves
/// it, and so does every connected node counted in `filtered`.
fn exhausted(attempts: u32, configured: u32, filtered: &Filtered) -> bool {
    let untried_connected = filtered.serving - filtered.tried;
    let untried_away = configured
        .saturating_sub(attempts)
        .saturating_sub(untried_connected);
    attempts > 0 && !filtered.could_change() && untried_away == 0
}

fn wait(cause: WaitCause, filtered: Filtered) -> Decision {
    Decision::Wait { cause, filtered }
}

/// For a pinned run, the pinned node's position if connected; refuses a pin no definition
/// has, or whose definition does not serve the route, and a route nobody serves.
fn pin_position(
    nodes: &[NodeStatus],
    selector: &NodeSelector,
    catalog: &Catalog,
) -> Result<Option<usize>, Unroutable> {
    let (adapter, target) = (&selector.adapter, &selector.target);
    let Some(pin) = &selector.pin else {
        return if catalog.knows(adapter, target) {
            Ok(None)
        } else {
            Err(Unroutable::UnknownRoute {
                adapter: adapter.clone(),
                target: target.clone(),
            })
        };
    };
    let record = catalog
        .node(pin)
        .ok_or_else(|| Unroutable::UnknownNode { pin: pin.clone() })?;
    if !record.serves(adapter, target) {
        return Err(Unroutable::PinDoesNotServe {
            pin: pin.clone(),
            adapter: adapter.clone(),
            target: target.clone(),
        });
    }
    Ok(nodes.iter().position(|n| n.record.id() == record.id()))
}
