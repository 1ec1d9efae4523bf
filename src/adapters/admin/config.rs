//! `[admin]`: where the management API listens and the keys it takes.
//!
//! Admin keys are hashed as they are read (`keys`) or given as digests (`key_sha256`), never
//! shown, and are separate from the `[api]` keys: an API key cannot use the management API
//! and an admin key cannot run models.

use std::fmt;
use std::net::SocketAddr;

use serde::{Deserialize, Deserializer};

use crate::adapters::tls::TlsConfig;
use crate::domain::{Token, TokenDigest};

/// `[admin]`: the management API's listener and keys.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct AdminConfig {
    /// Its own listener; port 0 picks a free port. Ignored with `on_http_listener`.
    pub listen: SocketAddr,
    /// Serve `/admin/v1` on the `[http]` listener (and its TLS) instead of its own.
    pub on_http_listener: bool,
    /// Keys an operator presents as `Authorization: Bearer <key>`, hashed on load.
    pub keys: Vec<AdminKey>,
    /// The same, given as SHA-256 digests (64 hex digits), so the file holds no secret.
    pub key_sha256: Vec<String>,
    /// `[admin.tls]`: when present, the admin listener speaks HTTPS only.
    pub tls: Option<TlsConfig>,
}

impl Default for AdminConfig {
    fn default() -> Self {
        Self {
            listen: SocketAddr::from(([127, 0, 0, 1], 8081)),
            on_http_listener: false,
            keys: Vec::new(),
            key_sha256: Vec::new(),
            tls: None,
        }
    }
}

impl AdminConfig {
    /// Every configured key's digest: `keys` hashed, then `key_sha256` (entries that are
    /// not digests are left out; [`AdminConfig::problems`] reports them).
    pub fn digests(&self) -> Vec<TokenDigest> {
        let given = self
            .key_sha256
            .iter()
            .filter_map(|hex| TokenDigest::from_hex(hex).ok());
        self.keys.iter().map(|k| k.0).chain(given).collect()
    }

    /// Values that deserialize but cannot work, each naming its key and entry (never the
    /// value): a `key_sha256` entry that is not a digest, no key at all while the API is
    /// reachable beyond this machine (`http_listen` is the `[http]` listener, used with
    /// `on_http_listener`), a key that `is_api_key` says is also an API key.
    pub fn problems(
        &self,
        http_listen: SocketAddr,
        is_api_key: impl Fn(&TokenDigest) -> bool,
    ) -> Vec<String> {
        let mut problems: Vec<String> = self
            .key_sha256
            .iter()
            .enumerate()
            .filter(|(_, hex)| TokenDigest::from_hex(hex).is_err())
            .map(|(i, _)| format!("`admin.key_sha256[{i}]` is not 64 hex digits"))
            .collect();
        let digests = self.digests();
        let listen = if self.on_http_listener {
            ("http.listen", http_listen)
        } else {
            ("admin.listen", self.listen)
        };
        if digests.is_empty() && !listen.1.ip().is_loopback() {
            problems.push(format!(
                "the management API would listen on {} (`{}`) without a key: set `admin.keys` or `admin.key_sha256`, or listen on a loopback address",
                listen.1, listen.0
            ));
        }
        for (i, digest) in digests.iter().enumerate() {
            if is_api_key(digest) {
                problems.push(format!(
                    "admin key #{} is also an API key (`api.keys`): the two must differ",
                    i + 1
                ));
            }
        }
        if self
            .tls
            .as_ref()
            .is_some_and(|t| t.handshake_timeout_ms == 0)
        {
            problems.push("`admin.tls.handshake_timeout_ms` must be at least 1".to_owned());
        }
        problems
    }
}

/// An admin key, kept only as its SHA-256 digest. `Debug` never shows it.
#[derive(Clone, PartialEq, Eq)]
pub struct AdminKey(TokenDigest);

impl AdminKey {
    /// Hashes `key`.
    pub fn new(key: &str) -> Self {
        Self(Token::new(key).digest())
    }
}

impl fmt::Debug for AdminKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("AdminKey(<redacted>)")
    }
}

impl<'de> Deserialize<'de> for AdminKey {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let key = Token::new(String::deserialize(deserializer)?);
        if key.is_empty() {
            return Err(serde::de::Error::custom("an admin key must not be empty"));
        }
        Ok(Self(key.digest()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn loopback() -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], 8080))
    }

    #[test]
    fn keys_are_hashed_and_never_shown() {
        let config = AdminConfig {
            keys: vec![AdminKey::new("adm-very-secret")],
            key_sha256: vec![Token::new("adm-other").digest().to_hex()],
            ..AdminConfig::default()
        };
        assert!(!format!("{config:?}").contains("very-secret"));
        let digests = config.digests();
        assert_eq!(digests.len(), 2);
        assert!(digests[1].matches(&Token::new("adm-other").digest()));
        assert!(config.problems(loopback(), |_| false).is_empty());
    }

    #[test]
    fn problems_name_the_key_and_entry_but_not_the_value() {
        let open_wide = AdminConfig {
            listen: SocketAddr::from(([0, 0, 0, 0], 8081)),
            key_sha256: vec!["nothex-SECRET".into()],
            ..AdminConfig::default()
        };
        let problems = open_wide.problems(loopback(), |_| false).join("; ");
        assert!(problems.contains("`admin.key_sha256[0]`"), "{problems}");
        assert!(problems.contains("without a key"), "{problems}");
        assert!(!problems.contains("SECRET"), "{problems}");

        let on_http = AdminConfig {
            on_http_listener: true,
            ..AdminConfig::default()
        };
        let wide = SocketAddr::from(([0, 0, 0, 0], 8080));
        assert!(
            on_http
                .problems(wide, |_| false)
                .join("")
                .contains("`http.listen`")
        );

        let shared = AdminConfig {
            keys: vec![AdminKey::new("same")],
            ..AdminConfig::default()
        };
        let api = Token::new("same").digest();
        let problems = shared.problems(loopback(), |d| d.matches(&api)).join("");
        assert!(problems.contains("also an API key"), "{problems}");
    }
}
