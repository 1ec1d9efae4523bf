//! The run service: accepts runs, places them on nodes, and relays what nodes report.
//!
//! Decisions come from the domain (`select_node`, `RunState`); this module holds the
//! bookkeeping around them: the table of open runs, the bounded queue of runs waiting for a
//! busy node, and the timers (queue wait, deadline, cancel grace) that let the edge end a run
//! the node cannot. Every run it accepts ends with exactly one terminal event, delivered to
//! the event sink and to the caller's stream, whichever path ends it.

mod live;
mod metrics;
mod service;
mod table;
#[cfg(test)]
mod tests;

pub use service::{RunHandle, RunService, RunStats, StartError};
