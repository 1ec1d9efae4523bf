//! Where a NATS client connects and how it authenticates, as `[events.nats]` and
//! `[cluster]` both write it: the servers, one of `user`+`password`, `token`, `nkey_seed`
//! or `creds_file`, an optional TLS table, and the connection's timeouts. Secrets are kept
//! in [`Secret`], whose `Debug` never shows them; [`NatsConnection::problems`] names every
//! bad key (under its section) without repeating a secret.

use std::fmt;
use std::path::PathBuf;

use serde::Deserialize;

/// A credential from the config: never printed.
#[derive(Clone, PartialEq, Eq, Deserialize)]
#[serde(transparent)]
pub struct Secret(String);

impl Secret {
    /// A secret holding `value` (for settings built in code).
    pub fn new(value: impl Into<String>) -> Self {
        Self(value.into())
    }

    /// The secret itself, for the connection only.
    pub(crate) fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("<redacted>")
    }
}

/// A `tls` table of a NATS connection: TLS to the servers (rustls, `ring`).
#[derive(Debug, Clone, PartialEq, Eq, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct NatsTlsConfig {
    /// PEM file of the CA(s) the servers' certificates chain to; the system's roots too.
    pub ca_path: Option<PathBuf>,
    /// A client certificate (PEM), for servers that verify clients; with `key_path`.
    pub cert_path: Option<PathBuf>,
    /// The client certificate's key (PEM).
    pub key_path: Option<PathBuf>,
    /// Refuse servers that do not offer TLS (default: TLS is used when the URL says
    /// `tls://` or the server asks for it).
    pub required: bool,
}

/// One NATS connection's settings, borrowed from the section that holds them, with the
/// names its keys have there (for messages).
#[derive(Debug, Clone, Copy)]
pub struct NatsConnection<'a> {
    /// The section, as messages name it: `events.nats`, `cluster`.
    pub section: &'a str,
    /// The key holding the servers in that section: `url`, `nats`.
    pub url_key: &'a str,
    /// The servers, comma-separated: `nats://127.0.0.1:4222` or `tls://a:4222,tls://b:4222`.
    pub url: &'a str,
    /// `user` and `password` authenticate together.
    pub user: Option<&'a String>,
    /// With `user`.
    pub password: Option<&'a Secret>,
    /// A server token.
    pub token: Option<&'a Secret>,
    /// An nkey seed (`SU...`).
    pub nkey_seed: Option<&'a Secret>,
    /// A `.creds` file (user JWT and nkey seed), as `nsc` writes it.
    pub creds_file: Option<&'a PathBuf>,
    /// The section's `tls` table.
    pub tls: Option<&'a NatsTlsConfig>,
    /// How long one connection attempt may take.
    pub connect_timeout_ms: u64,
    /// The longest wait between two reconnection attempts (the waits double up to it).
    pub reconnect_max_delay_ms: u64,
}

impl NatsConnection<'_> {
    /// The servers, one address each.
    pub fn servers(&self) -> Vec<String> {
        self.url.split(',').map(|s| s.trim().to_owned()).collect()
    }

    /// `section.key`, as messages name a key.
    pub(crate) fn key(&self, key: &str) -> String {
        format!("{}.{key}", self.section)
    }

    /// What is wrong with these settings, each naming its key; empty when they can work.
    /// Secrets are never repeated.
    pub fn problems(&self) -> Vec<String> {
        let mut problems = Vec::new();
        let url_key = self.key(self.url_key);
        if self.url.split(',').any(|url| url.trim().is_empty()) {
            problems.push(format!("`{url_key}` must name at least one server"));
        } else if let Some(bad) = self
            .url
            .split(',')
            .map(str::trim)
            .find(|url| url.parse::<async_nats::ServerAddr>().is_err())
        {
            problems.push(format!("`{url_key}`: {bad:?} is not a NATS server address"));
        }
        self.auth_problems(&mut problems);
        for (key, value) in [
            ("connect_timeout_ms", self.connect_timeout_ms),
            ("reconnect_max_delay_ms", self.reconnect_max_delay_ms),
        ] {
            if value == 0 {
                problems.push(format!("`{}` must be at least 1", self.key(key)));
            }
        }
        if let Some(tls) = self.tls
            && tls.cert_path.is_some() != tls.key_path.is_some()
        {
            problems.push(format!(
                "`{}` and `{}` go together",
                self.key("tls.cert_path"),
                self.key("tls.key_path")
            ));
        }
        problems
    }

    fn auth_problems(&self, problems: &mut Vec<String>) {
        let methods = [
            self.user.is_some() || self.password.is_some(),
            self.token.is_some(),
            self.nkey_seed.is_some(),
            self.creds_file.is_some(),
        ];
        if methods.iter().filter(|&&set| set).count() > 1 {
            problems.push(format!(
                "`{}`: use one of `user`+`password`, `token`, `nkey_seed` and `creds_file`, \
                 not several",
                self.section
            ));
        }
        if self.user.is_some() != self.password.is_some() {
            problems.push(format!(
                "`{}` and `{}` go together",
                self.key("user"),
                self.key("password")
            ));
        }
        if let Some(seed) = self.nkey_seed
            && nkeys::KeyPair::from_seed(seed.expose()).is_err()
        {
            problems.push(format!(
                "`{}` is not an nkey seed (not shown)",
                self.key("nkey_seed")
            ));
        }
    }
}
