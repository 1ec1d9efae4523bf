//! The run service: accepts runs, routes them to nodes, fails them over, and relays what
//! nodes report.
//!
//! Decisions come from the domain (`routing::decide`, `after_attempt`, the breakers, the
//! fair queue, the key limits, `RunState`); this module holds the bookkeeping around them,
//! one concern per file:
//!
//! - `service.rs` — [`RunService`], the public API (start, cancel, drain) and the
//!   `NodeEventHandler` the node transport calls;
//! - `placement.rs` — routing a run and reserving its slot, the bounded fair queue of runs
//!   waiting for a node, and sending runs and cancels; every step that must be atomic
//!   takes the locked table as `&mut Table`;
//! - `failover.rs` — what happens when an attempt ends: the breaker's record, another
//!   attempt on another node, the disconnect hook;
//! - `continuation.rs` — a run whose node is lost after output, carried on by another
//!   node from the output already relayed;
//! - `drain_deadline.rs` — a node drain's deadline: its runs moved to other nodes like lost
//!   attempts, cancelled where they cannot move;
//! - `resume.rs` — runs held across a blip in their node's connection: detached when it
//!   drops, re-attached when the node comes back and claims them;
//! - `adopt.rs` — the runs a previous edge left open in the journal, taken back at start
//!   and held like detached runs for their nodes to claim;
//! - `stream_readers.rs` — the readers of a run's client stream: a streamed run whose caller went
//!   away is cancelled only when no caller has resumed its stream within a grace;
//! - `budgets.rs` — the API keys' token budgets loaded from the usage rollups at start
//!   (reserved and settled in `placement.rs`);
//! - `config.rs` — the `[routing]` and `[limits]` sections and the policy they build;
//! - `delivery.rs` — the per-run state machine and the event relay
//!   (`RunService::relay_event`): every event to the sink and the caller, in order;
//! - `timers.rs` — the queue wait, the deadline, the cancel grace and the resume grace,
//!   which let the edge end a run the node cannot; `deadlines.rs` — the open runs'
//!   deadlines, kept by one task;
//! - `table.rs` — the table of open runs, the queue, breakers and limits, behind one mutex;
//! - `metrics.rs`, `routing_metrics.rs`, `resume_metrics.rs` — the service's OpenTelemetry
//!   instruments;
//! - `trace.rs` — the `dispatch` span that links a run to its node's connection in an
//!   exported trace (only while span export is on).
//!
//! Every run it accepts ends with exactly one terminal event, delivered to the event sink
//! and to the caller's stream, whichever path ends it.

mod adopt;
mod budgets;
mod cold_starts;
mod config;
mod continuation;
mod deadlines;
mod delivery;
mod drain_deadline;
mod failover;
mod management_view;
mod metrics;
mod placement;
mod resume;
mod resume_metrics;
mod routing_metrics;
mod service;
mod stream_readers;
mod table;
#[cfg(test)]
mod tests;
mod timers;
mod trace;

pub use config::{BreakerConfig, LimitsConfig, RoutingConfig, RunsConfig, policy};
pub use service::{Routing, RunService};
