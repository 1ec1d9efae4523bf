//! Connecting the sink to NATS: the shared client options (`crate::adapters::nats`) for
//! `[events.nats]`, with an event callback that keeps the connection counters, and the
//! small runtime of its own the client's connection runs on, so its socket I/O takes no
//! time from the edge's workers. Secrets go to the client only; nothing here logs them.

use async_nats::{Client, Event};
use tokio::runtime::{Handle, Runtime};

use super::config::NatsSinkConfig;
use super::stats::NatsStats;
use crate::adapters::nats::connect;
use crate::adapters::sinks::SinkError;
use crate::domain::EdgeId;

/// The runtime the NATS client runs on (one worker thread, `edge-sink-nats-io`). Dropped
/// in the background, so dropping it anywhere (even inside another runtime) is safe.
pub(super) struct NatsRuntime(Option<Runtime>);

impl NatsRuntime {
    fn new() -> std::io::Result<Self> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("edge-sink-nats-io")
            .enable_all()
            .build()?;
        Ok(Self(Some(runtime)))
    }

    /// A handle to spawn on or block on.
    pub(super) fn handle(&self) -> Handle {
        match &self.0 {
            Some(runtime) => runtime.handle().clone(),
            // Only `drop` takes the runtime out.
            None => unreachable!("the NATS runtime is gone"),
        }
    }
}

impl Drop for NatsRuntime {
    fn drop(&mut self) {
        if let Some(runtime) = self.0.take() {
            runtime.shutdown_background();
        }
    }
}

/// Starts the client on a runtime of its own. It connects in the background (and keeps
/// reconnecting, with backoff, for as long as the edge runs), so an unreachable server
/// does not stop the edge from starting.
///
/// # Errors
/// [`SinkError::Nats`] when a file named in `[events.nats]` cannot be read or the
/// runtime cannot start.
pub(super) fn start_client(
    config: &NatsSinkConfig,
    edge: &EdgeId,
    stats: &NatsStats,
) -> Result<(NatsRuntime, Client), SinkError> {
    let connection = config.connection();
    let callback_stats = stats.clone();
    let options = connect::options(&connection, format!("edge {edge}"))
        .map_err(|error| nats_error(error.to_string()))?
        .event_callback(move |event| {
            let stats = callback_stats.clone();
            async move { stats.on_event(&event) }
        });
    let runtime = NatsRuntime::new()
        .map_err(|error| nats_error(format!("cannot start its runtime: {error}")))?;
    let handle = runtime.handle();
    let _entered = handle.enter();
    // With `retry_on_initial_connect` this only spawns the connection task and returns.
    let client = futures::executor::block_on(options.connect(connection.servers()))
        .map_err(|error| nats_error(format!("cannot start the client: {error}")))?;
    Ok((runtime, client))
}

fn nats_error(detail: String) -> SinkError {
    SinkError::Nats { detail }
}

impl NatsStats {
    /// Keeps the connection counters and logs the changes that matter to an operator.
    fn on_event(&self, event: &Event) {
        use std::sync::atomic::Ordering::Relaxed;
        let counters = &self.counters;
        match event {
            Event::Connected => {
                counters.connected.store(true, Relaxed);
                counters.connects.fetch_add(1, Relaxed);
                tracing::info!(sink = "nats", "connected to the NATS server");
            }
            Event::Disconnected => {
                counters.connected.store(false, Relaxed);
                counters.disconnects.fetch_add(1, Relaxed);
                tracing::warn!(
                    sink = "nats",
                    "lost the NATS server; holding events and reconnecting"
                );
            }
            _ => {}
        }
    }
}
