//! Event sinks: the adapters behind the [`EventSink`](crate::ports::EventSink) port that
//! write relayed run events somewhere — `stdout` (the console router: text or JSON lines),
//! `file` (JSON lines appended to a file), `log` (`tracing` records on `edge::events`),
//! `nats` (published to NATS, optionally into a JetStream stream: `nats/`) and `null`
//! (discards, for benchmarks). `[events] sinks` picks any number of them;
//! [`build_sinks`] starts them and [`SinkSet`] fans every event out to all of them.
//!
//! Every sink sits behind the same queue (`queue.rs`), so a slow or failing sink never
//! blocks the relay of any run, nor the other sinks: `publish` only enqueues, and each
//! sink's drain writes the queue in batches into the sink's writer, a plain synchronous
//! `SinkWriter` (`writer.rs`). The drain of a writer that blocks on I/O (`stdout`,
//! `file`, `nats`) runs on a std thread of its own (`edge-sink-stdout`, ...); the
//! drain of one that never blocks (`log`, `null`) is a task of the edge's runtime. The
//! adapter modules (`stdout.rs`, `file.rs`, `log.rs`, `null.rs`, with `lines.rs` and
//! `adapters/event_format.rs` behind the first two) are writers only.
//!
//! # Overflow policy
//!
//! Each sink admits at most `[events] queue_capacity` events waiting to be written. When
//! that many wait, a new **non-terminal** event (`started`, `output`) is dropped and counted
//! in [`SinkStats::dropped_queue_full`]. A **terminal** event (`completed`, `failed`,
//! `cancelled`) is always admitted, so every run still ends with exactly one terminal event
//! in every sink; memory stays bounded by the capacity plus one event per open run.
//!
//! # Write errors
//!
//! A failed write (disk full, stdout closed, file removed) loses the events it carried, is
//! counted in [`SinkStats::write_errors`] and logged at most once per 10 s with the number
//! of failures not logged. It stops neither the edge nor other sinks: the file sink drops
//! its handle and reopens the file (create + append) for the next write, so it recovers by
//! itself once the file is writable again.
//!
//! # Flushing and shutdown
//!
//! A sink's writer is flushed whenever its queue runs empty and at least every flush
//! interval (`[events.file] flush_interval_ms` for the file sink). `EventSink::flush`
//! returns once every event accepted before the call is written and flushed;
//! `EventSink::close`, called as the edge stops, does the same and then ends the drain
//! and joins its task or thread. A drain also ends, after writing what is left, when its
//! sink is dropped.

mod builder;
pub mod config;
mod drain;
mod error;
mod file;
mod kind;
mod lines;
mod log;
pub mod nats;
mod null;
mod queue;
mod set;
mod stats;
mod stdout;
mod writer;

pub use builder::{BuiltSink, build_sinks};
pub use error::SinkError;
pub use set::SinkSet;
pub use stats::SinkStats;
