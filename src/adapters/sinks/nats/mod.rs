//! The NATS event sink (`sinks = ["nats"]`): every run event published, as the file sink's
//! JSON line, on `<prefix>.<edge id>.runs.<adapter>.<target>.<run id>` (`subject.rs`), to
//! core NATS or into a JetStream stream with publish acks (`stream.rs`), over a connection
//! with credentials and TLS that reconnects with backoff (`connect.rs`).
//!
//! It keeps the sink contract (`docs/sinks.md`): it sits behind the same bounded queue as
//! every sink, so publishing never blocks the relay; its writer (`writer.rs`) runs on a
//! drain thread of its own and holds each event until the server confirms it, publishing
//! again what was not confirmed, so no event — terminal ones included — is lost while the
//! server is reachable. While it is not, events wait in a bounded backlog; beyond it the
//! oldest are dropped (non-terminal first) and counted in [`NatsStats`].

pub mod config;
mod connect;
mod stats;
mod stream;
pub mod subject;
mod writer;

pub use config::NatsSinkConfig;
pub use stats::NatsStats;

use super::error::SinkError;
use super::kind::SinkKind;
use super::queue::{QueueSettings, QueuedSink};
use crate::domain::EdgeId;

/// Starts the NATS sink of edge `edge`: its client (connecting in the background) and its
/// queue, drained on the thread `edge-sink-nats`.
///
/// # Errors
/// [`SinkError::Nats`] for settings that cannot work or files that cannot be read;
/// [`SinkError::Thread`] when the drain thread cannot start.
pub(crate) fn nats_sink(
    config: &NatsSinkConfig,
    edge: &EdgeId,
    settings: QueueSettings,
) -> Result<(QueuedSink, NatsStats), SinkError> {
    let problems = config.problems();
    if !problems.is_empty() {
        return Err(SinkError::Nats {
            detail: problems.join("; "),
        });
    }
    let stats = NatsStats::default();
    let (runtime, client) = connect::start_client(config, edge, &stats)?;
    let writer = writer::NatsWriter::new(config, edge, runtime, client, stats.clone());
    let sink =
        QueuedSink::on_thread(SinkKind::Nats.as_str(), writer, settings).map_err(|source| {
            SinkError::Thread {
                kind: SinkKind::Nats,
                source,
            }
        })?;
    Ok((sink, stats))
}
