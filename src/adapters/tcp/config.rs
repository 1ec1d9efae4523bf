//! Settings of the node transport (`[server]` in the config file).

use std::net::SocketAddr;
use std::time::Duration;

use serde::Deserialize;

use crate::adapters::tls::TlsConfig;
use crate::wire::keepalive::Keepalive;

/// `[server]`: where nodes connect and the limits each connection lives under.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ServerConfig {
    /// Address the node transport listens on; port 0 picks a free port.
    pub listen: SocketAddr,
    /// How long a new connection has to send its RegisterRequest.
    pub register_timeout_ms: u64,
    /// The largest frame a registered node may send.
    pub max_frame_bytes: usize,
    /// The largest first frame (the RegisterRequest) an unauthenticated peer may send.
    pub max_register_frame_bytes: usize,
    /// How long a graceful stop waits for in-flight runs before ending them.
    pub shutdown_grace_ms: u64,
    /// Connections held at once; more are accepted and closed at once.
    pub max_connections: usize,
    /// Connections the kernel queues for the accept loop (the listen backlog), capped by
    /// `net.core.somaxconn`; a full queue drops SYNs, which the peer retries after 1 s.
    pub listen_backlog: u32,
    /// Commands queued for one node before it counts as not reading (slow consumer).
    pub outbound_queue: usize,
    /// How long one write to a node may take before it counts as not reading.
    pub write_timeout_ms: u64,
    /// The wait before answering a peer address's first failed registration (invalid
    /// token); it doubles with each further failure from that address.
    pub register_failure_delay_ms: u64,
    /// The longest such wait.
    pub register_failure_max_delay_ms: u64,
    /// TCP keepalive on node sockets: idle time before the first probe; 0 turns it off.
    pub tcp_keepalive_idle_ms: u64,
    /// TCP keepalive: time between probes.
    pub tcp_keepalive_interval_ms: u64,
    /// TCP keepalive: unanswered probes before the kernel closes the connection.
    pub tcp_keepalive_retries: u32,
    /// `[server.tls]`: when present, nodes must speak TLS (the same framing inside), and
    /// mutual TLS when it names a client CA. The application loads the files at startup and
    /// hands the result to [`TcpServer::with_tls`](super::TcpServer::with_tls).
    pub tls: Option<TlsConfig>,
}

impl Default for ServerConfig {
    fn default() -> Self {
        Self {
            listen: SocketAddr::from(([127, 0, 0, 1], 7100)),
            register_timeout_ms: 5_000,
            max_frame_bytes: 4 * 1024 * 1024,
            max_register_frame_bytes: 16 * 1024,
            shutdown_grace_ms: 10_000,
            max_connections: 16_384,
            listen_backlog: 4_096,
            outbound_queue: 1_024,
            write_timeout_ms: 10_000,
            register_failure_delay_ms: 100,
            register_failure_max_delay_ms: 5_000,
            tcp_keepalive_idle_ms: 30_000,
            tcp_keepalive_interval_ms: 10_000,
            tcp_keepalive_retries: 3,
            tls: None,
        }
    }
}

impl ServerConfig {
    /// `register_timeout_ms` as a duration.
    pub fn register_timeout(&self) -> Duration {
        Duration::from_millis(self.register_timeout_ms)
    }

    /// `shutdown_grace_ms` as a duration.
    pub fn shutdown_grace(&self) -> Duration {
        Duration::from_millis(self.shutdown_grace_ms)
    }

    /// `write_timeout_ms` as a duration.
    pub fn write_timeout(&self) -> Duration {
        Duration::from_millis(self.write_timeout_ms)
    }

    /// The TCP keepalive set on accepted node sockets; `None` when it is off.
    pub fn keepalive(&self) -> Option<Keepalive> {
        (self.tcp_keepalive_idle_ms > 0).then(|| Keepalive {
            idle: Duration::from_millis(self.tcp_keepalive_idle_ms),
            interval: Duration::from_millis(self.tcp_keepalive_interval_ms),
            retries: self.tcp_keepalive_retries,
        })
    }

    /// What is wrong with the keepalive keys: the kernel counts whole seconds and at least
    /// one probe.
    pub fn keepalive_problems(&self) -> Vec<String> {
        let mut problems = Vec::new();
        if self.tcp_keepalive_idle_ms == 0 {
            return problems;
        }
        for (key, value) in [
            ("tcp_keepalive_idle_ms", self.tcp_keepalive_idle_ms),
            ("tcp_keepalive_interval_ms", self.tcp_keepalive_interval_ms),
        ] {
            if value < 1_000 {
                problems.push(format!(
                    "`server.{key}` must be at least 1000 (the kernel counts whole seconds) while keepalive is on"
                ));
            }
        }
        if self.tcp_keepalive_retries == 0 {
            problems.push(
                "`server.tcp_keepalive_retries` must be at least 1 while keepalive is on".into(),
            );
        }
        problems
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keepalive_is_on_by_default_and_off_at_zero_idle() {
        let config = ServerConfig::default();
        let keepalive = config.keepalive().expect("on by default");
        assert_eq!(keepalive.idle, Duration::from_secs(30));
        assert_eq!(keepalive.dead_after(), Duration::from_secs(60));
        assert!(config.keepalive_problems().is_empty());
        let off = ServerConfig {
            tcp_keepalive_idle_ms: 0,
            tcp_keepalive_interval_ms: 0,
            tcp_keepalive_retries: 0,
            ..ServerConfig::default()
        };
        assert_eq!(off.keepalive(), None);
        assert!(off.keepalive_problems().is_empty());
    }

    #[test]
    fn sub_second_or_probeless_keepalive_is_refused() {
        let config = ServerConfig {
            tcp_keepalive_idle_ms: 500,
            tcp_keepalive_interval_ms: 999,
            tcp_keepalive_retries: 0,
            ..ServerConfig::default()
        };
        let problems = config.keepalive_problems().join("\n");
        for key in [
            "tcp_keepalive_idle_ms",
            "tcp_keepalive_interval_ms",
            "tcp_keepalive_retries",
        ] {
            assert!(problems.contains(&format!("`server.{key}`")), "{problems}");
        }
    }
}
