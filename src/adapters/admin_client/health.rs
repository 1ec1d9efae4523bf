//! `edge healthcheck`: asks the edge's own `GET /healthz` (liveness) and says whether it
//! answered `200`, for a container's health check or a probe where no HTTP client is
//! installed. Never `/readyz`: a standby member of a site or a draining edge answers it
//! `503` by design, and a health check that restarted them would break the site.

use std::path::Path;
use std::time::Duration;

use anyhow::anyhow;

use super::http::{AdminClient, Listener};

/// `GET url` (the `/healthz` of an edge's HTTP listener): `Ok` on a `2xx` within `patience`.
///
/// # Errors
/// The edge cannot be reached, did not answer within `patience`, or answered another status;
/// the message says which.
pub async fn healthcheck(
    url: &str,
    cacert: Option<&Path>,
    patience: Duration,
) -> anyhow::Result<()> {
    // A bare `http://host:port` asks `/healthz`.
    let url = if url.trim_end_matches('/').matches('/').count() <= 2 {
        format!("{}/healthz", url.trim_end_matches('/'))
    } else {
        url.to_owned()
    };
    let url = url.as_str();
    let client = AdminClient::to(Listener::Api, url, None, cacert)?;
    // The URL's path is the client's prefix: the request asks for it exactly.
    tokio::time::timeout(patience, client.lines("", |_| {}))
        .await
        .map_err(|_| anyhow!("{url} did not answer within {} ms", patience.as_millis()))?
        .map_err(|error| anyhow!("{url}: {error:#}"))
}
