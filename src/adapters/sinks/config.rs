//! Settings of the event sinks (`[events]` in the config file).

use std::path::PathBuf;

use serde::Deserialize;

pub use super::kind::SinkKind;
pub use crate::adapters::event_format::LineFormat;

use super::nats::NatsSinkConfig;

/// `[events]`: the sinks in use and their settings.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct EventsConfig {
    /// The sinks every event goes to, in order.
    pub sinks: Vec<SinkKind>,
    /// Events each sink may hold waiting to be written; see the overflow policy in
    /// `docs/configuration.md`.
    pub queue_capacity: usize,
    /// `[events.stdout]`.
    pub stdout: StdoutSinkConfig,
    /// `[events.file]`.
    pub file: FileSinkConfig,
    /// `[events.nats]`.
    pub nats: NatsSinkConfig,
}

impl Default for EventsConfig {
    fn default() -> Self {
        Self {
            sinks: vec![SinkKind::Stdout],
            queue_capacity: 8_192,
            stdout: StdoutSinkConfig::default(),
            file: FileSinkConfig::default(),
            nats: NatsSinkConfig::default(),
        }
    }
}

/// `[events.stdout]`.
#[derive(Debug, Clone, PartialEq, Eq, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct StdoutSinkConfig {
    /// `text` (default) or `json`.
    pub format: LineFormat,
}

/// `[events.file]`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct FileSinkConfig {
    /// The file events are appended to, as JSON lines.
    pub path: PathBuf,
    /// Buffered lines are flushed at least this often, and whenever the queue runs empty.
    pub flush_interval_ms: u64,
}

impl Default for FileSinkConfig {
    fn default() -> Self {
        Self {
            path: PathBuf::from("edge-events.jsonl"),
            flush_interval_ms: 200,
        }
    }
}
