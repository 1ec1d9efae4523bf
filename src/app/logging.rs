//! Process-wide logging through `tracing`: level from `RUST_LOG` or the config/flag, format
//! `pretty` or `json`.

use std::io::IsTerminal;

use tracing_subscriber::EnvFilter;

use super::settings::LogFormat;

/// Installs the global subscriber. `RUST_LOG`, when set, wins over `level`. Logs go to
/// standard error, so standard output carries only the console's events and answers.
///
/// # Errors
/// An invalid filter directive, or a subscriber already installed.
pub fn init(level: &str, format: LogFormat) -> anyhow::Result<()> {
    let filter = match std::env::var("RUST_LOG") {
        Ok(directives) if !directives.is_empty() => EnvFilter::try_new(directives)?,
        _ => EnvFilter::try_new(level)?,
    };
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
