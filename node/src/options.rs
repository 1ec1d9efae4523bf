//! How the node itself is run: where the edge is, how to reconnect, how long to drain, how
//! much to buffer. Everything about the engines comes from the edge at registration instead.

use std::sync::Arc;
use std::time::Duration;

use edge::client::{LinkStats, ServerName};

use super::runs::BufferLimits;

/// The host part of `HOST:PORT` (`[::1]:7100` gives `::1`).
pub fn host_of(address: &str) -> String {
    let host = address.rsplit_once(':').map_or(address, |(host, _)| host);
    host.trim_start_matches('[')
        .trim_end_matches(']')
        .to_owned()
}

/// TLS towards the edge.
#[derive(Debug, Clone)]
pub struct TlsOptions {
    /// Trusted CAs and, for mutual TLS, the node's certificate.
    pub config: Arc<rustls::ClientConfig>,
    /// The name the edge's certificate must be valid for; `None`: the host of the address
    /// dialled (each member of a site is checked against its own name).
    pub server_name: Option<ServerName<'static>>,
}

/// The node's own options (the CLI flags).
#[derive(Debug, Clone)]
pub struct NodeOptions {
    /// The edge's node address, `HOST:PORT`, or the node addresses of a site's members,
    /// comma-separated (`A,B[,C]`); resolved again on every connect.
    pub edge: String,
    /// The pre-shared token.
    pub token: String,
    /// The node id to claim; empty lets the token decide.
    pub node_id: String,
    /// TLS, when the edge speaks it.
    pub tls: Option<TlsOptions>,
    /// The first reconnect delay's ceiling.
    pub reconnect_min: Duration,
    /// The largest reconnect delay.
    pub reconnect_max: Duration,
    /// Heartbeat intervals of silence (with a ping unanswered) after which the link is dead.
    pub dead_after_intervals: u32,
    /// TCP keepalive idle time (probes follow at a third of it, 3 of them); `None` for off.
    pub tcp_keepalive: Option<Duration>,
    /// How long running runs may go on after SIGTERM before they are cancelled.
    pub shutdown_grace: Duration,
    /// How long to wait for the edge to take the last events before exiting anyway.
    pub flush_timeout: Duration,
    /// Buffer bounds.
    pub buffers: BufferLimits,
    /// Where the node counts how its connections to the edge ended (shared, so whoever
    /// started the node can read it).
    pub link_stats: Arc<LinkStats>,
}

impl NodeOptions {
    /// The addresses in [`NodeOptions::edge`], in order, without blanks.
    pub fn edges(&self) -> Vec<String> {
        self.edge
            .split(',')
            .map(str::trim)
            .filter(|address| !address.is_empty())
            .map(str::to_owned)
            .collect()
    }

    /// Options for `edge` and `token` with every default.
    pub fn new(edge: impl Into<String>, token: impl Into<String>) -> Self {
        Self {
            edge: edge.into(),
            token: token.into(),
            node_id: String::new(),
            tls: None,
            reconnect_min: Duration::from_millis(500),
            reconnect_max: Duration::from_secs(30),
            dead_after_intervals: 3,
            tcp_keepalive: Some(Duration::from_secs(30)),
            shutdown_grace: Duration::from_secs(30),
            flush_timeout: Duration::from_secs(5),
            buffers: BufferLimits::default(),
            link_stats: Arc::default(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_address_or_a_comma_separated_list() {
        let one = NodeOptions::new("127.0.0.1:7100", "t");
        assert_eq!(one.edges(), ["127.0.0.1:7100"]);
        let site = NodeOptions::new(" a:1, b:2,,c:3 ", "t");
        assert_eq!(site.edges(), ["a:1", "b:2", "c:3"]);
        assert!(NodeOptions::new("", "t").edges().is_empty());
    }

    #[test]
    fn the_host_of_an_address() {
        assert_eq!(host_of("edge.example:7100"), "edge.example");
        assert_eq!(host_of("[::1]:7100"), "::1");
        assert_eq!(host_of("10.0.0.1:7100"), "10.0.0.1");
    }
}
