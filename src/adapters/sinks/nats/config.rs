//! `[events.nats]`: where the NATS sink connects, how it authenticates, and the optional
//! JetStream stream it publishes into. Secrets (password, token, nkey seed) are kept in
//! [`Secret`], whose `Debug` never shows them; [`NatsSinkConfig::problems`] names every
//! bad key without repeating a secret.

use std::path::PathBuf;
use std::time::Duration;

use serde::Deserialize;

pub use crate::adapters::nats::{NatsConnection, NatsTlsConfig, Secret};

/// `[events.nats]`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct NatsSinkConfig {
    /// The servers, comma-separated: `nats://127.0.0.1:4222` or `tls://a:4222,tls://b:4222`.
    pub url: String,
    /// The first token of every subject (may itself hold dots: `acme.edge`).
    pub subject_prefix: String,
    /// `user` and `password` authenticate together.
    pub user: Option<String>,
    /// With `user`.
    pub password: Option<Secret>,
    /// A server token.
    pub token: Option<Secret>,
    /// An nkey seed (`SU...`).
    pub nkey_seed: Option<Secret>,
    /// A `.creds` file (user JWT and nkey seed), as `nsc` writes it.
    pub creds_file: Option<PathBuf>,
    /// `[events.nats.tls]`.
    pub tls: Option<NatsTlsConfig>,
    /// How long the first connection attempt waits before the sink starts without it (it
    /// keeps trying in the background).
    pub connect_timeout_ms: u64,
    /// The longest wait between two reconnection attempts (the waits double up to it).
    pub reconnect_max_delay_ms: u64,
    /// How long a publish waits for its confirmation (a JetStream ack, or the server's
    /// answer to a flush) before the events are published again.
    pub ack_timeout_ms: u64,
    /// Events published and not yet confirmed, at most.
    pub max_in_flight: usize,
    /// Events held while the server is unreachable (or slower than the edge) before the
    /// oldest are dropped and counted.
    pub backlog_capacity: usize,
    /// `[events.nats.jetstream]`: publish into a stream, with acks.
    pub jetstream: Option<JetStreamConfig>,
}

impl Default for NatsSinkConfig {
    fn default() -> Self {
        Self {
            url: "nats://127.0.0.1:4222".to_owned(),
            subject_prefix: "edge".to_owned(),
            user: None,
            password: None,
            token: None,
            nkey_seed: None,
            creds_file: None,
            tls: None,
            connect_timeout_ms: 2_000,
            reconnect_max_delay_ms: 5_000,
            ack_timeout_ms: 5_000,
            max_in_flight: 4_096,
            backlog_capacity: 65_536,
            jetstream: None,
        }
    }
}

/// `[events.nats.jetstream]`: the stream events are published into.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct JetStreamConfig {
    /// The stream's name.
    pub stream: String,
    /// Create the stream (capturing `<prefix>.<edge id>.runs.>`) when it does not exist;
    /// `false` binds to an existing stream that captures those subjects.
    pub create: bool,
    /// Messages older than this are removed (seconds; 0: kept until a size limit).
    pub max_age_secs: u64,
    /// The stream's size limit in bytes (0: none); the oldest messages go first.
    pub max_bytes: u64,
    /// The window in which a republished event (same `Nats-Msg-Id`) is stored once.
    pub duplicate_window_secs: u64,
    /// Replicas of the stream in a clustered JetStream.
    pub replicas: usize,
}

impl Default for JetStreamConfig {
    fn default() -> Self {
        Self {
            stream: "EDGE_EVENTS".to_owned(),
            create: true,
            max_age_secs: 7 * 24 * 3600,
            max_bytes: 0,
            duplicate_window_secs: 120,
            replicas: 1,
        }
    }
}

impl NatsSinkConfig {
    /// [`Self::ack_timeout_ms`] as a duration.
    pub fn ack_timeout(&self) -> Duration {
        Duration::from_millis(self.ack_timeout_ms)
    }

    /// What is wrong with these settings, each naming its `events.nats.*` key; empty when
    /// they can work. Secrets are never repeated.
    pub fn problems(&self) -> Vec<String> {
        let mut problems = self.connection().problems();
        if let Err(problem) = super::subject::check_prefix(&self.subject_prefix) {
            problems.push(format!("`events.nats.subject_prefix`: {problem}"));
        }
        for (key, value) in [
            ("ack_timeout_ms", self.ack_timeout_ms),
            ("max_in_flight", self.max_in_flight as u64),
            ("backlog_capacity", self.backlog_capacity as u64),
        ] {
            if value == 0 {
                problems.push(format!("`events.nats.{key}` must be at least 1"));
            }
        }
        if let Some(js) = &self.jetstream {
            js.problems(&mut problems);
        }
        problems
    }

    /// Where the sink connects and how it authenticates, as the shared NATS client reads it.
    pub fn connection(&self) -> NatsConnection<'_> {
        NatsConnection {
            section: "events.nats",
            url_key: "url",
            url: &self.url,
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
}

impl JetStreamConfig {
    fn problems(&self, problems: &mut Vec<String>) {
        let valid_name = !self.stream.is_empty()
            && self
                .stream
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_'));
        if !valid_name {
            problems.push(format!(
                "`events.nats.jetstream.stream` {:?}: a stream name is ASCII letters, digits, \
                 '-' and '_'",
                self.stream
            ));
        }
        if self.replicas == 0 {
            problems.push("`events.nats.jetstream.replicas` must be at least 1".to_owned());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_defaults_work() {
        assert!(NatsSinkConfig::default().problems().is_empty());
        let with_stream = NatsSinkConfig {
            jetstream: Some(JetStreamConfig::default()),
            ..NatsSinkConfig::default()
        };
        assert!(with_stream.problems().is_empty());
    }

    #[test]
    fn every_problem_names_its_key_and_no_secret() {
        let config = NatsSinkConfig {
            url: "nats://a:4222,".into(),
            subject_prefix: "edge.*".into(),
            token: Some(Secret::new("tok-SECRET")),
            password: Some(Secret::new("pw-SECRET")),
            nkey_seed: Some(Secret::new("not-a-SECRET-seed")),
            ack_timeout_ms: 0,
            jetstream: Some(JetStreamConfig {
                stream: "a.b".into(),
                ..JetStreamConfig::default()
            }),
            ..NatsSinkConfig::default()
        };
        let problems = config.problems().join("\n");
        for key in [
            "events.nats.url",
            "events.nats.subject_prefix",
            "not several",
            "`events.nats.user` and `events.nats.password`",
            "events.nats.nkey_seed",
            "events.nats.ack_timeout_ms",
            "events.nats.jetstream.stream",
        ] {
            assert!(problems.contains(key), "{key} in {problems}");
        }
        assert!(!problems.contains("SECRET"), "{problems}");
        assert!(!format!("{config:?}").contains("SECRET"));
    }
}
