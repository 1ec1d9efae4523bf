//! `edge healthcheck`: asks the edge's own `GET /healthz` (liveness) and says whether it
//! answered `200`, for a container's health check or a probe where no HTTP client is
//! installed. Never `/readyz`: a standby member of a site or a draining edge answers it
//! `503` by design, and a health check that restarted them would break the site.

use std::path::Path;
use std::time::Duration;

use super::http::{AdminClient, AdminClientError, Listener};

/// Why the edge is not healthy, or could not be asked.
#[derive(Debug, thiserror::Error)]
pub enum HealthcheckError {
    /// The URL or the CA is unusable, the edge cannot be reached, or it answered another
    /// status than `2xx` (the client's error says which).
    #[error("{url}")]
    Unhealthy {
        /// What was asked.
        url: String,
        /// Why it failed.
        #[source]
        source: AdminClientError,
    },
    /// The edge did not answer within the patience.
    #[error("{url} did not answer within {} ms", .patience.as_millis())]
    TimedOut {
        /// What was asked.
        url: String,
        /// How long it was given.
        patience: Duration,
    },
}

/// `GET url` (the `/healthz` of an edge's HTTP listener; a bare `http://host:port` asks
/// `/healthz`): `Ok` on a `2xx` within `patience`.
///
/// # Errors
/// [`HealthcheckError::Unhealthy`] when the edge cannot be reached or answered another
/// status, [`HealthcheckError::TimedOut`] when it did not answer within `patience`.
pub async fn healthcheck(
    url: &str,
    cacert: Option<&Path>,
    patience: Duration,
) -> Result<(), HealthcheckError> {
    let url = if url.trim_end_matches('/').matches('/').count() <= 2 {
        format!("{}/healthz", url.trim_end_matches('/'))
    } else {
        url.to_owned()
    };
    let unhealthy = |source| HealthcheckError::Unhealthy {
        url: url.clone(),
        source,
    };
    let client = AdminClient::to(Listener::Api, &url, None, cacert).map_err(unhealthy)?;
    // The URL's path is the client's prefix: the request asks for it exactly.
    match tokio::time::timeout(patience, client.lines("", |_| {})).await {
        Ok(answered) => answered.map_err(unhealthy),
        Err(_) => Err(HealthcheckError::TimedOut {
            url: url.clone(),
            patience,
        }),
    }
}
