//! Connecting to NATS: the client's options from `[events.nats]` (authentication, TLS,
//! reconnection backoff, an event callback that keeps the connection counters) and the
//! small runtime of its own the client's connection runs on, so its socket I/O takes no
//! time from the edge's workers. Secrets go to the client only; nothing here logs them.

use std::time::Duration;

use async_nats::{Client, ConnectOptions, Event};
use tokio::runtime::{Handle, Runtime};

use super::config::NatsSinkConfig;
use super::stats::NatsStats;
use crate::adapters::sinks::SinkError;
use crate::domain::EdgeId;

/// The first wait between reconnection attempts; it doubles up to the configured maximum.
const FIRST_RECONNECT_DELAY: Duration = Duration::from_millis(50);

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
    let options = options(config, edge, stats)?;
    let servers: Vec<String> = config.url.split(',').map(|s| s.trim().to_owned()).collect();
    let runtime = NatsRuntime::new()
        .map_err(|error| nats_error(format!("cannot start its runtime: {error}")))?;
    let handle = runtime.handle();
    let _entered = handle.enter();
    // With `retry_on_initial_connect` this only spawns the connection task and returns.
    let client = futures::executor::block_on(options.connect(servers))
        .map_err(|error| nats_error(format!("cannot start the client: {error}")))?;
    Ok((runtime, client))
}

fn nats_error(detail: String) -> SinkError {
    SinkError::Nats { detail }
}

/// The client's options: name, background (re)connection with backoff, credentials, TLS.
fn options(
    config: &NatsSinkConfig,
    edge: &EdgeId,
    stats: &NatsStats,
) -> Result<ConnectOptions, SinkError> {
    let max_delay = Duration::from_millis(config.reconnect_max_delay_ms);
    let callback_stats = stats.clone();
    let options = ConnectOptions::new()
        .name(format!("edge {edge}"))
        .retry_on_initial_connect()
        .max_reconnects(None)
        .connection_timeout(Duration::from_millis(config.connect_timeout_ms))
        .reconnect_delay_callback(move |attempts| reconnect_delay(attempts, max_delay))
        .event_callback(move |event| {
            let stats = callback_stats.clone();
            async move { stats.on_event(&event) }
        });
    let options = with_credentials(options, config)?;
    with_tls(options, config)
}

/// The wait before reconnection attempt `attempts` (0 first): 50 ms doubling up to `max`.
fn reconnect_delay(attempts: usize, max: Duration) -> Duration {
    let shift = u32::try_from(attempts).unwrap_or(u32::MAX).min(16);
    FIRST_RECONNECT_DELAY.saturating_mul(1 << shift).min(max)
}

fn with_credentials(
    options: ConnectOptions,
    config: &NatsSinkConfig,
) -> Result<ConnectOptions, SinkError> {
    if let (Some(user), Some(password)) = (&config.user, &config.password) {
        return Ok(options.user_and_password(user.clone(), password.expose().to_owned()));
    }
    if let Some(token) = &config.token {
        return Ok(options.token(token.expose().to_owned()));
    }
    if let Some(seed) = &config.nkey_seed {
        return Ok(options.nkey(seed.expose().to_owned()));
    }
    if let Some(path) = &config.creds_file {
        let creds = std::fs::read_to_string(path).map_err(|error| {
            nats_error(format!(
                "cannot read `events.nats.creds_file` {}: {error}",
                path.display()
            ))
        })?;
        return options.credentials(&creds).map_err(|_| {
            nats_error(format!(
                "`events.nats.creds_file` {} holds no user JWT and nkey seed",
                path.display()
            ))
        });
    }
    Ok(options)
}

fn with_tls(
    mut options: ConnectOptions,
    config: &NatsSinkConfig,
) -> Result<ConnectOptions, SinkError> {
    let Some(tls) = &config.tls else {
        return Ok(options);
    };
    let readable = |key: &str, path: &std::path::Path| {
        std::fs::metadata(path).map(|_| ()).map_err(|error| {
            nats_error(format!(
                "cannot read `events.nats.tls.{key}` {}: {error}",
                path.display()
            ))
        })
    };
    if let Some(ca) = &tls.ca_path {
        readable("ca_path", ca)?;
        options = options.add_root_certificates(ca.clone());
    }
    if let (Some(cert), Some(key)) = (&tls.cert_path, &tls.key_path) {
        readable("cert_path", cert)?;
        readable("key_path", key)?;
        options = options.add_client_certificate(cert.clone(), key.clone());
    }
    Ok(options.require_tls(tls.required))
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reconnection_waits_double_up_to_the_maximum() {
        let max = Duration::from_secs(1);
        let delays: Vec<u128> = (0..7)
            .map(|n| reconnect_delay(n, max).as_millis())
            .collect();
        assert_eq!(delays, [50, 100, 200, 400, 800, 1000, 1000]);
        assert_eq!(reconnect_delay(usize::MAX, max), max);
    }
}
