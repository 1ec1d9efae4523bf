//! A NATS client's options from a [`NatsConnection`]: its name, background (re)connection
//! with backoff, credentials and TLS. The caller adds what is its own (an event callback)
//! and connects. Secrets go to the client only; nothing here logs them.

use std::time::Duration;

use async_nats::ConnectOptions;

use super::config::NatsConnection;

/// The first wait between reconnection attempts; it doubles up to the configured maximum.
const FIRST_RECONNECT_DELAY: Duration = Duration::from_millis(50);

/// A file named in the settings that cannot be used; the message names its key and path.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub(crate) struct OptionsError(String);

/// The client's options: `name`, a first connection that may be retried in the background
/// (so an unreachable server does not stop the edge from starting), reconnection for as
/// long as the client lives with waits doubling from 50 ms up to
/// `reconnect_max_delay_ms`, the credentials and the TLS of `connection`.
///
/// # Errors
/// [`OptionsError`] when a file it names (`creds_file`, a `tls` file) cannot be read.
pub(crate) fn options(
    connection: &NatsConnection<'_>,
    name: String,
) -> Result<ConnectOptions, OptionsError> {
    let max_delay = Duration::from_millis(connection.reconnect_max_delay_ms);
    let options = ConnectOptions::new()
        .name(name)
        .retry_on_initial_connect()
        .max_reconnects(None)
        .connection_timeout(Duration::from_millis(connection.connect_timeout_ms))
        .reconnect_delay_callback(move |attempts| reconnect_delay(attempts, max_delay));
    let options = with_credentials(options, connection)?;
    with_tls(options, connection)
}

/// The wait before reconnection attempt `attempts` (0 first): 50 ms doubling up to `max`.
fn reconnect_delay(attempts: usize, max: Duration) -> Duration {
    let shift = u32::try_from(attempts).unwrap_or(u32::MAX).min(16);
    FIRST_RECONNECT_DELAY.saturating_mul(1 << shift).min(max)
}

fn with_credentials(
    options: ConnectOptions,
    connection: &NatsConnection<'_>,
) -> Result<ConnectOptions, OptionsError> {
    if let (Some(user), Some(password)) = (connection.user, connection.password) {
        return Ok(options.user_and_password(user.clone(), password.expose().to_owned()));
    }
    if let Some(token) = connection.token {
        return Ok(options.token(token.expose().to_owned()));
    }
    if let Some(seed) = connection.nkey_seed {
        return Ok(options.nkey(seed.expose().to_owned()));
    }
    if let Some(path) = connection.creds_file {
        let key = connection.key("creds_file");
        let creds = std::fs::read_to_string(path).map_err(|error| {
            OptionsError(format!("cannot read `{key}` {}: {error}", path.display()))
        })?;
        return options.credentials(&creds).map_err(|_| {
            OptionsError(format!(
                "`{key}` {} holds no user JWT and nkey seed",
                path.display()
            ))
        });
    }
    Ok(options)
}

fn with_tls(
    mut options: ConnectOptions,
    connection: &NatsConnection<'_>,
) -> Result<ConnectOptions, OptionsError> {
    let Some(tls) = connection.tls else {
        return Ok(options);
    };
    let readable = |key: &str, path: &std::path::Path| {
        std::fs::metadata(path).map(|_| ()).map_err(|error| {
            OptionsError(format!(
                "cannot read `{}` {}: {error}",
                connection.key(&format!("tls.{key}")),
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
