//! `[cluster]`: the site this edge is a member of (`site`, naming its KV bucket), the NATS
//! servers that hold the site's lease (`nats`, with the NATS sink's keys for credentials
//! and TLS), the lease's timing and the addresses this member advertises to callers and
//! nodes while it is active. [`ClusterConfig::problems`] names every bad key; secrets are
//! never repeated.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use serde::Deserialize;

use super::journal_stream::SnapshotPolicy;
use crate::adapters::nats::{NatsConnection, NatsTlsConfig, Secret};
use crate::domain::site::LeaseTiming;

/// The longest site name: bucket names stay short in `nats` listings.
const MAX_SITE_LEN: usize = 64;

/// `[cluster]`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ClusterConfig {
    /// The site's name, the same on every member: the lease lives in the KV bucket
    /// `edge-<site>`. ASCII letters, digits, `-` and `_`.
    pub site: String,
    /// The NATS servers, comma-separated (as `[events.nats] url` takes them).
    pub nats: String,
    /// `user` and `password` authenticate together.
    pub user: Option<String>,
    /// With `user`.
    pub password: Option<Secret>,
    /// A server token.
    pub token: Option<Secret>,
    /// An nkey seed (`SU...`).
    pub nkey_seed: Option<Secret>,
    /// A `.creds` file (user JWT and nkey seed).
    pub creds_file: Option<PathBuf>,
    /// `[cluster.tls]`: TLS to the servers.
    pub tls: Option<NatsTlsConfig>,
    /// How long one connection attempt to NATS may take.
    pub connect_timeout_ms: u64,
    /// The longest wait between two reconnection attempts.
    pub reconnect_max_delay_ms: u64,
    /// How long a written lease lasts: how long a site may go without an active member
    /// after its active member dies without releasing the lease.
    pub lease_ms: u64,
    /// How often the active member renews the lease (and a standby reads it); at most half
    /// of `lease_ms`.
    pub renew_ms: u64,
    /// How long a member that acquired the lease may take to catch up on the site's
    /// journal and adopt the open runs before it acts; it keeps the lease renewed meanwhile,
    /// and past this it lets the lease go (another member may do better).
    pub takeover_timeout_ms: u64,
    /// Replicas of the site's bucket in a clustered JetStream (3 for a NATS cluster of 3).
    pub replicas: usize,
    /// Once the site's journal stream holds this many bytes, the active member snapshots
    /// its journal into the site's object store and purges the stream below the snapshot
    /// (0: never; the stream keeps every batch).
    pub snapshot_after_bytes: u64,
    /// How often the active member compares the stream's size with
    /// `snapshot_after_bytes`.
    pub snapshot_check_ms: u64,
    /// The `HOST:PORT` nodes dial to reach this member (default: the node listener's
    /// address, unless it is a wildcard).
    pub advertise_nodes: Option<String>,
    /// The `HOST:PORT` callers reach this member's HTTP API at (default: the HTTP
    /// listener's address, unless it is a wildcard).
    pub advertise_api: Option<String>,
}

impl Default for ClusterConfig {
    fn default() -> Self {
        Self {
            site: String::new(),
            nats: String::new(),
            user: None,
            password: None,
            token: None,
            nkey_seed: None,
            creds_file: None,
            tls: None,
            connect_timeout_ms: 2_000,
            reconnect_max_delay_ms: 1_000,
            lease_ms: 3_000,
            renew_ms: 1_000,
            takeover_timeout_ms: 60_000,
            replicas: 1,
            snapshot_after_bytes: 256 << 20,
            snapshot_check_ms: 30_000,
            advertise_nodes: None,
            advertise_api: None,
        }
    }
}

impl ClusterConfig {
    /// The KV bucket holding the site's lease.
    pub fn bucket(&self) -> String {
        format!("edge-{}", self.site)
    }

    /// The lease's timing.
    pub fn timing(&self) -> LeaseTiming {
        LeaseTiming {
            lease_ms: self.lease_ms,
            renew_ms: self.renew_ms,
        }
    }

    /// How long a takeover may take before the member lets the lease go.
    pub fn takeover_timeout(&self) -> Duration {
        Duration::from_millis(self.takeover_timeout_ms)
    }

    /// When the active member snapshots the journal.
    pub fn snapshot_policy(&self) -> SnapshotPolicy {
        SnapshotPolicy {
            after_bytes: self.snapshot_after_bytes,
            check: Duration::from_millis(self.snapshot_check_ms),
        }
    }

    /// How long one request to NATS (a read, a write) may take before it counts as
    /// unanswered: the renewal interval.
    pub fn request_timeout(&self) -> Duration {
        Duration::from_millis(self.renew_ms.max(1))
    }

    /// Where the lease's client connects and how it authenticates.
    pub fn connection(&self) -> NatsConnection<'_> {
        NatsConnection {
            section: "cluster",
            url_key: "nats",
            url: &self.nats,
            user: self.user.as_ref(),
            password: self.password.as_ref(),
            token: self.token.as_ref(),
            nkey_seed: self.nkey_seed.as_ref(),
            creds_file: self.creds_file.as_ref(),
            tls: self.tls.as_ref(),
            connect_timeout_ms: self.connect_timeout_ms,
            reconnect_max_delay_ms: self.reconnect_max_delay_ms,
        }
    }

    /// What is wrong with these settings, each naming its `cluster.*` key; empty when they
    /// can work. `listeners` are the node and HTTP listeners' addresses, which stand in for
    /// an advertised address not given (and must not then be wildcards).
    pub fn problems(&self, listeners: (SocketAddr, SocketAddr)) -> Vec<String> {
        let mut problems = Vec::new();
        let valid_site = !self.site.is_empty()
            && self.site.len() <= MAX_SITE_LEN
            && self
                .site
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_'));
        if !valid_site {
            problems.push(format!(
                "`cluster.site` {:?}: a site is 1 to {MAX_SITE_LEN} ASCII letters, digits, '-' \
                 and '_', the same on every member",
                self.site
            ));
        }
        if self.nats.trim().is_empty() {
            problems.push("`cluster.nats` must name the NATS servers of the site".to_owned());
        } else {
            problems.extend(self.connection().problems());
        }
        problems.extend(self.timing().problems("cluster"));
        if self.takeover_timeout_ms < self.lease_ms {
            problems.push(format!(
                "`cluster.takeover_timeout_ms` ({}) must be at least `cluster.lease_ms` ({}): a \
                 takeover catches up on the whole journal stream and adopts every open run",
                self.takeover_timeout_ms, self.lease_ms
            ));
        }
        if self.replicas == 0 {
            problems.push("`cluster.replicas` must be at least 1".to_owned());
        }
        if self.snapshot_after_bytes > 0 && self.snapshot_check_ms == 0 {
            problems.push(
                "`cluster.snapshot_check_ms` must be at least 1 while \
                 `cluster.snapshot_after_bytes` is set"
                    .to_owned(),
            );
        }
        let (nodes, api) = listeners;
        for (key, given, listener) in [
            ("advertise_nodes", &self.advertise_nodes, nodes),
            ("advertise_api", &self.advertise_api, api),
        ] {
            if let Err(problem) = advertised(given.as_deref(), listener) {
                problems.push(format!("`cluster.{key}`: {problem}"));
            }
        }
        problems
    }
}

/// Why an address cannot be advertised; the message is written to follow the key's name.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AdvertiseError {
    /// The address given is not `HOST:PORT` (a host without whitespace, a port from 1).
    #[error("{0:?} is not HOST:PORT")]
    NotHostPort(String),
    /// None given, and the listener standing in for it listens on every address.
    #[error(
        "not set, and the listener {0} is a wildcard nobody can dial; set the address this \
         member is reached at"
    )]
    Wildcard(SocketAddr),
}

/// The address to advertise: `given` (checked to be `HOST:PORT`), else `listener` unless
/// it is a wildcard or has no port yet.
///
/// # Errors
/// [`AdvertiseError::NotHostPort`] for a `given` address that is not `HOST:PORT`,
/// [`AdvertiseError::Wildcard`] for none given and a wildcard `listener`.
pub fn advertised(given: Option<&str>, listener: SocketAddr) -> Result<String, AdvertiseError> {
    match given {
        Some(address) => {
            let valid = address.rsplit_once(':').is_some_and(|(host, port)| {
                !host.is_empty()
                    && !host.chars().any(char::is_whitespace)
                    && port.parse::<u16>().is_ok_and(|port| port > 0)
            });
            if valid {
                Ok(address.to_owned())
            } else {
                Err(AdvertiseError::NotHostPort(address.to_owned()))
            }
        }
        None if listener.ip().is_unspecified() => Err(AdvertiseError::Wildcard(listener)),
        None => Ok(listener.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn local() -> (SocketAddr, SocketAddr) {
        (
            SocketAddr::from(([127, 0, 0, 1], 7100)),
            SocketAddr::from(([127, 0, 0, 1], 8080)),
        )
    }

    fn cluster(site: &str, nats: &str) -> ClusterConfig {
        ClusterConfig {
            site: site.into(),
            nats: nats.into(),
            ..ClusterConfig::default()
        }
    }

    #[test]
    fn a_site_and_its_servers_are_enough() {
        let config = cluster("west-1", "nats://a:4222,nats://b:4222");
        assert!(config.problems(local()).is_empty());
        assert_eq!(config.bucket(), "edge-west-1");
        assert_eq!(advertised(None, local().0).unwrap(), "127.0.0.1:7100");
    }

    #[test]
    fn every_problem_names_its_key_and_no_secret() {
        let config = ClusterConfig {
            token: Some(Secret::new("tok-SECRET")),
            nkey_seed: Some(Secret::new("SECRET-seed")),
            renew_ms: 2_000,
            takeover_timeout_ms: 1_000,
            replicas: 0,
            snapshot_check_ms: 0,
            advertise_api: Some("no-port".into()),
            ..cluster("a.b", "nats://a:4222,")
        };
        let wildcard = (SocketAddr::from(([0, 0, 0, 0], 7100)), local().1);
        let problems = config.problems(wildcard).join("\n");
        for key in [
            "`cluster.site` \"a.b\"",
            "`cluster.nats` must name at least one server",
            "`cluster`: use one of",
            "`cluster.nkey_seed`",
            "`cluster.renew_ms` (2000)",
            "`cluster.takeover_timeout_ms` (1000) must be at least `cluster.lease_ms` (3000)",
            "`cluster.replicas`",
            "`cluster.snapshot_check_ms` must be at least 1",
            "`cluster.advertise_nodes`: not set, and the listener 0.0.0.0:7100",
            "`cluster.advertise_api`: \"no-port\" is not HOST:PORT",
        ] {
            assert!(problems.contains(key), "{key} in {problems}");
        }
        assert!(!problems.contains("SECRET"), "{problems}");
        assert!(!format!("{config:?}").contains("SECRET"));
    }

    #[test]
    fn an_empty_section_names_what_is_missing() {
        let problems = ClusterConfig::default().problems(local()).join("\n");
        assert!(problems.contains("`cluster.site` \"\""), "{problems}");
        assert!(problems.contains("`cluster.nats` must name"), "{problems}");
    }

    #[test]
    fn advertised_addresses_take_names_and_v6() {
        for good in ["edge-a.example:7100", "[::1]:7100", "10.0.0.1:1"] {
            assert_eq!(advertised(Some(good), local().0).as_deref(), Ok(good));
        }
        for bad in ["", ":7100", "host:0", "host:99999", "a b:1"] {
            assert_eq!(
                advertised(Some(bad), local().0),
                Err(AdvertiseError::NotHostPort(bad.to_owned())),
                "{bad}"
            );
        }
        let wildcard = SocketAddr::from(([0, 0, 0, 0], 7100));
        assert_eq!(
            advertised(None, wildcard),
            Err(AdvertiseError::Wildcard(wildcard))
        );
    }

    proptest! {
        #[test]
        fn an_address_given_as_host_and_port_is_advertised_as_given(
            host in "[a-z0-9.-]{1,40}|\\[[0-9a-f:]{2,39}\\]",
            port in 1_u16..,
        ) {
            let address = format!("{host}:{port}");
            prop_assert_eq!(advertised(Some(&address), local().0), Ok(address));
        }

        #[test]
        fn an_address_without_a_port_or_with_a_blank_is_refused_naming_it(
            host in "[a-z0-9.-]{0,20}",
            blank in "[a-z]{1,5} [a-z]{1,5}",
        ) {
            for address in [host.clone(), format!("{host}:0"), format!("{blank}:7100")] {
                let error = advertised(Some(&address), local().0).unwrap_err();
                prop_assert_eq!(error.to_string(), format!("{address:?} is not HOST:PORT"));
            }
        }

        #[test]
        fn a_site_is_a_short_name_of_letters_digits_dashes_and_underscores(
            site in "[a-zA-Z0-9_-]{1,64}",
            bad in "[a-z]{0,3}[./ :*>]{1,3}[a-z]{0,3}",
        ) {
            let key = "`cluster.site`";
            let good = cluster(&site, "nats://a:4222").problems(local()).join("\n");
            prop_assert!(!good.contains(key), "{}", good);
            let refused = cluster(&bad, "nats://a:4222").problems(local()).join("\n");
            prop_assert!(refused.contains(key), "{} in {}", bad, refused);
        }
    }
}
