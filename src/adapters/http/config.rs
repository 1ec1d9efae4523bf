//! Settings of the HTTP server (`[http]` in the config file).

use std::net::SocketAddr;
use std::time::Duration;

use serde::Deserialize;

use crate::adapters::tls::TlsConfig;

/// `[http]`: where the HTTP server listens and the limits every connection and request
/// lives under.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct HttpConfig {
    /// Address the HTTP server (metrics, health, the API) listens on; port 0 picks a free
    /// port.
    pub listen: SocketAddr,
    /// `[http.tls]`: when present, the server speaks HTTPS only.
    pub tls: Option<TlsConfig>,
    /// How long a client has to send a request's headers (HTTP/1) before the connection
    /// is closed; stops slow-header (slowloris) clients from holding connections.
    pub header_read_timeout_ms: u64,
    /// How long reading one request body may take before the request fails.
    pub body_read_timeout_ms: u64,
    /// HTTP connections held at once; more are accepted and closed at once.
    pub max_connections: usize,
    /// Connections the kernel queues for the accept loop (the listen backlog) of the HTTP
    /// listener and of the management API's own, capped by `net.core.somaxconn`.
    pub listen_backlog: u32,
    /// `/v1` API requests served at once; more get `503` with `Retry-After`. The
    /// operations endpoints are never limited.
    pub max_concurrent_requests: usize,
}

impl Default for HttpConfig {
    fn default() -> Self {
        Self {
            listen: SocketAddr::from(([127, 0, 0, 1], 8080)),
            tls: None,
            header_read_timeout_ms: 10_000,
            body_read_timeout_ms: 30_000,
            max_connections: 4_096,
            listen_backlog: 4_096,
            max_concurrent_requests: 1_024,
        }
    }
}

impl HttpConfig {
    /// `header_read_timeout_ms` as a duration.
    pub fn header_read_timeout(&self) -> Duration {
        Duration::from_millis(self.header_read_timeout_ms)
    }

    /// `body_read_timeout_ms` as a duration.
    pub fn body_read_timeout(&self) -> Duration {
        Duration::from_millis(self.body_read_timeout_ms)
    }
}
