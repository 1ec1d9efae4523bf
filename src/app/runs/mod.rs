//! The run service: accepts runs, routes them to nodes, fails them over, and relays what
//! nodes report.
//!
//! Decisions come from the domain (`routing::decide`, `after_attempt`, the breakers, the
//! fair queue, the key limits, `RunState`, `decide_resume`, `adopt`, `may_continue`); this
//! module holds the bookkeeping around them, in parts that each own their state and reach
//! the others only through their methods:
//!
//! - `placer/` — the table of open runs and every run's route: admission, routing, seats,
//!   the fair queue and its waits, failover and continuation, sending runs and cancels.
//!   It never ends a run itself: what is left to do once its lock is let go comes back as
//!   a `Fallout`;
//! - `relay/` — what is delivered for each run: every event to the sink, the journal, the
//!   followers and the caller, in order, with exactly one terminal event; it carries out
//!   the placer's fallout and arms the timers that end runs (deadlines, queue waits, cancel
//!   graces);
//! - `recovery/` — runs carried across what breaks around them: a node's reconnect
//!   (resume), an edge's restart (adoption from the journal), a client re-reading its
//!   stream, a drained node's deadline;
//! - `timers/` — the background tasks and the open runs' deadlines;
//! - `run.rs` — one open run as the parts share it (each reaching only its own state):
//!   its `route.rs` (changed by the placer only), its `delivery.rs` (by the relay only),
//!   `progress.rs` — what a run relayed, for a continuation and its usage;
//! - `observer.rs` — the one trait the parts report through; `metrics/` — the
//!   OpenTelemetry instruments behind it; `trace.rs` — the `dispatch` span;
//! - `service.rs` — [`RunService`], the façade that builds the parts and answers the public
//!   API; `handlers.rs` — the ports it implements; `cold_starts.rs` — the handle the model
//!   lifecycle holds; `config.rs` — the `[routing]`, `[limits]` and `[runs]` sections.
//!
//! The parts' files import each other without a circle (checked by `tests/it/layout.rs`).
//! Every run it accepts ends with exactly one terminal event, delivered to the event sink
//! and to the caller's stream, whichever path ends it.

mod cold_starts;
mod config;
mod delivery;
mod handlers;
mod metrics;
mod observer;
#[cfg(test)]
mod parts_rig;
mod placer;
mod progress;
mod recovery;
mod relay;
mod route;
mod run;
mod service;
#[cfg(test)]
mod tests;
mod timers;
mod trace;

pub use config::{BreakerConfig, LimitsConfig, Routing, RoutingConfig, RunsConfig, policy};
pub use service::RunService;
