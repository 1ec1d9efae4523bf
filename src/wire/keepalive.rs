//! TCP keepalive on a node connection: the kernel probes an idle connection and closes it
//! when the peer stops answering, a second line under the heartbeat rule for a link that
//! died without a FIN or RST. Used by the edge on accepted node sockets
//! (`server.tcp_keepalive_*`) and by the node client (`edge::client::Keepalive`), so it
//! lives with the protocol, not among the server's adapters.
//!
//! It only sets socket options; it decides nothing about the connection.

use std::io;
use std::time::Duration;

use tokio::net::TcpStream;

/// TCP keepalive timings: the first probe after `idle` without traffic, then one every
/// `interval`, and the connection is closed after `retries` unanswered probes. The kernel
/// counts in whole seconds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Keepalive {
    /// Idle time before the first probe.
    pub idle: Duration,
    /// Time between probes.
    pub interval: Duration,
    /// Unanswered probes before the connection is closed.
    pub retries: u32,
}

impl Keepalive {
    /// Probes after `idle`, then every third of it (at least a second), three of them: an
    /// idle dead peer is found after about twice `idle`.
    pub fn after_idle(idle: Duration) -> Self {
        Self {
            idle,
            interval: (idle / 3).max(Duration::from_secs(1)),
            retries: 3,
        }
    }

    /// How long an idle connection to a peer that has gone lasts: `idle + interval ×
    /// retries`.
    pub fn dead_after(&self) -> Duration {
        self.idle
            .saturating_add(self.interval.saturating_mul(self.retries))
    }

    /// Turns keepalive on for `stream` with these timings.
    ///
    /// # Errors
    /// The socket error when the options cannot be set.
    pub fn apply(&self, stream: &TcpStream) -> io::Result<()> {
        let keepalive = socket2::TcpKeepalive::new().with_time(self.idle);
        #[cfg(any(
            target_os = "linux",
            target_os = "android",
            target_os = "macos",
            target_os = "ios",
            target_os = "freebsd",
            target_os = "netbsd",
            target_os = "windows"
        ))]
        let keepalive = keepalive
            .with_interval(self.interval)
            .with_retries(self.retries);
        socket2::SockRef::from(stream).set_tcp_keepalive(&keepalive)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn after_idle_probes_at_a_third_of_it_three_times() {
        let keepalive = Keepalive::after_idle(Duration::from_secs(30));
        assert_eq!(keepalive.interval, Duration::from_secs(10));
        assert_eq!(keepalive.retries, 3);
        assert_eq!(keepalive.dead_after(), Duration::from_secs(60));
        assert_eq!(
            Keepalive::after_idle(Duration::from_secs(2)).interval,
            Duration::from_secs(1)
        );
    }

    #[tokio::test]
    async fn the_options_reach_the_socket() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let stream = TcpStream::connect(listener.local_addr().unwrap())
            .await
            .unwrap();
        let keepalive = Keepalive {
            idle: Duration::from_secs(7),
            interval: Duration::from_secs(2),
            retries: 4,
        };
        keepalive.apply(&stream).unwrap();
        let socket = socket2::SockRef::from(&stream);
        assert!(socket.keepalive().unwrap());
        #[cfg(target_os = "linux")]
        {
            assert_eq!(socket.tcp_keepalive_time().unwrap(), keepalive.idle);
            assert_eq!(socket.tcp_keepalive_interval().unwrap(), keepalive.interval);
            assert_eq!(socket.tcp_keepalive_retries().unwrap(), keepalive.retries);
        }
    }
}
