//! Hop timestamps: the names of the trace events that say when a run passed each hop of
//! the real path (caller → edge API → node link → node → engine, and back), which the load
//! generator's `latency` scenario collects to give every millisecond an owner.
//!
//! They are `TRACE` events on [`TARGET`] with the fields `hop` (one of the names here),
//! `run_id` and, for run events, `seq`. The shipped `info` filter disables them where they
//! are written (one comparison with the global maximum level), so they cost nothing unless
//! a subscriber asks for them (decision 34). Nothing here reads a clock: the subscriber
//! stamps each event when it sees it.

/// The target of every hop event.
pub const TARGET: &str = "edge_hop";

/// The edge's API accepted the request and started its run (body read, routed).
pub const API_ACCEPTED: &str = "api_accepted";
/// The edge is writing the `RunRequest` to the node's socket (stamped before the flush:
/// a stamp after it can come after the node's, on another thread).
pub const RUN_SENT: &str = "run_sent";
/// The node read the `RunRequest`.
pub const RUN_RECEIVED: &str = "run_received";
/// The node is about to send the engine its HTTP request.
pub const ENGINE_REQUEST: &str = "engine_request";
/// The engine's response headers arrived at the node.
pub const ENGINE_HEADERS: &str = "engine_headers";
/// The node decoded the run's first output from the engine's stream.
pub const ENGINE_FIRST_OUTPUT: &str = "engine_first_output";
/// The node is writing run event `seq` to the edge's socket (stamped before the flush).
pub const EVENT_SENT: &str = "event_sent";
/// The edge read run event `seq` from the node's socket.
pub const EVENT_RECEIVED: &str = "event_received";
/// The edge handed a frame of the streamed answer to its HTTP server.
pub const API_FRAME: &str = "api_frame";

/// Whether a subscriber collects hop events (for the one place that would otherwise
/// gather what to report: the frames of a write).
#[must_use]
pub fn enabled() -> bool {
    tracing::enabled!(target: TARGET, tracing::Level::TRACE)
}
