//! The sink adapters there are: [`SinkKind`], each one's name in `[events] sinks`, logs
//! and metric labels. It names the kinds only; building them is `builder.rs`'s.

use serde::Deserialize;

/// Which sink adapters receive relayed run events.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SinkKind {
    /// The console router: one line per event on standard output.
    Stdout,
    /// JSON lines appended to a file.
    File,
    /// One `tracing` record per event.
    Log,
    /// Discards events (for benchmarks and for running without sinks).
    Null,
    /// Publishes each event to NATS (core or JetStream).
    Nats,
}

impl SinkKind {
    /// The sink's name in config, logs and metric labels.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Stdout => "stdout",
            Self::File => "file",
            Self::Log => "log",
            Self::Null => "null",
            Self::Nats => "nats",
        }
    }
}
