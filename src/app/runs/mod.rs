//! The run service: accepts runs, places them on nodes, and relays what nodes report.
//!
//! Decisions come from the domain (`select_node`, `RunState`); this module holds the
//! bookkeeping around them, one concern per file:
//!
//! - `service.rs` — [`RunService`], the public API (start, cancel, drain) and the
//!   `NodeEventHandler` the node transport calls;
//! - `placement.rs` — selecting a node and reserving its slot, the bounded queue of runs
//!   waiting for a busy node, and sending runs and cancels; every step that must be atomic
//!   takes the locked table as `&mut Table`;
//! - `delivery.rs` — the per-run state machine and the event relay
//!   (`RunService::relay_event`): every event to the sink and the caller, in order;
//! - `timers.rs` — the queue wait, the deadline and the cancel grace, which let the edge
//!   end a run the node cannot;
//! - `table.rs` — the table of open runs and the queue, behind one mutex;
//! - `metrics.rs` — the service's OpenTelemetry instruments;
//! - `trace.rs` — the `dispatch` span that links a run to its node's connection in an
//!   exported trace (only while span export is on).
//!
//! Every run it accepts ends with exactly one terminal event, delivered to the event sink
//! and to the caller's stream, whichever path ends it.

mod delivery;
mod metrics;
mod placement;
mod service;
mod table;
#[cfg(test)]
mod tests;
mod timers;
mod trace;

pub use service::{RunHandle, RunService, RunStats, StartError};
