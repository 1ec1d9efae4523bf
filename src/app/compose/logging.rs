//! Process-wide logging through `tracing`: its section `[log]` ([`LogConfig`]), level from
//! `RUST_LOG` or the config/flag, format `pretty` or `json`; and, when `[tracing]` names a
//! collector, the span export layer beside it (see `telemetry`).

use std::io::IsTerminal;

use serde::Deserialize;
use tracing_subscriber::EnvFilter;
use tracing_subscriber::Layer as _;
use tracing_subscriber::layer::SubscriberExt as _;
use tracing_subscriber::util::SubscriberInitExt as _;

use super::telemetry::{self, Exporter, TracingConfig};
use crate::domain::EdgeId;

/// `[log]`: the edge's own logs.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct LogConfig {
    /// A `tracing` filter directive, such as `info` or `info,edge::adapters::tcp=debug`.
    pub level: String,
    /// How log lines look.
    pub format: LogFormat,
}

impl Default for LogConfig {
    fn default() -> Self {
        Self {
            level: "info".to_owned(),
            format: LogFormat::default(),
        }
    }
}

/// How log lines look.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    /// Human-readable lines.
    #[default]
    Pretty,
    /// One JSON object per line.
    Json,
}

/// Installs the global subscriber without span export. `RUST_LOG`, when set, wins over
/// `level`. Logs go to standard error, so standard output carries only the console's events
/// and answers.
///
/// # Errors
/// An invalid filter directive, or a subscriber already installed.
pub fn init(level: &str, format: LogFormat) -> anyhow::Result<()> {
    let filter = log_filter(level)?;
    // Colour codes only for a terminal: in a file or a pipe they are noise, and cost time
    // on every record.
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::stderr().is_terminal())
        .with_writer(std::io::stderr);
    let installed = match format {
        LogFormat::Pretty => builder.try_init(),
        LogFormat::Json => builder.json().flatten_event(true).try_init(),
    };
    installed.map_err(|e| anyhow::anyhow!(e))
}

/// [`init`], plus the span export layer when `tracing` names a collector; returns its
/// exporter, to be shut down last. With export off this is exactly [`init`]: no layer and no
/// per-layer filtering are installed.
///
/// # Errors
/// An invalid filter directive, an exporter that cannot be built, or a subscriber already
/// installed.
pub fn init_with_tracing(
    level: &str,
    format: LogFormat,
    tracing: &TracingConfig,
    edge: &EdgeId,
) -> anyhow::Result<Option<Exporter>> {
    let Some((export, exporter)) = telemetry::export_layer(tracing, edge)? else {
        init(level, format)?;
        return Ok(None);
    };
    let filter = log_filter(level)?;
    let logs = tracing_subscriber::fmt::layer()
        .with_ansi(std::io::stderr().is_terminal())
        .with_writer(std::io::stderr);
    let logs = match format {
        LogFormat::Pretty => logs.with_filter(filter).boxed(),
        LogFormat::Json => logs.json().flatten_event(true).with_filter(filter).boxed(),
    };
    tracing_subscriber::registry()
        .with(logs)
        .with(export)
        .try_init()
        .map_err(|e| anyhow::anyhow!(e))?;
    Ok(Some(exporter))
}

/// The log filter: `RUST_LOG` when set, else `level`; export-only spans never logged.
fn log_filter(level: &str) -> anyhow::Result<EnvFilter> {
    let filter = match std::env::var("RUST_LOG") {
        Ok(directives) if !directives.is_empty() => EnvFilter::try_new(directives)?,
        _ => EnvFilter::try_new(level)?,
    };
    Ok(filter.add_directive(telemetry::NOT_IN_LOGS.parse()?))
}
