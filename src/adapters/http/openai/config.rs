//! `[api]`: the settings of the OpenAI-compatible API.
//!
//! Deserialized by `crate::app::settings` together with the other sections; checked there at
//! load through [`ApiConfig::problems`], so a running edge never holds an alias it cannot
//! route. API keys are hashed as they are read and never shown, not even through `Debug`.

use std::collections::BTreeMap;
use std::fmt;
use std::time::Duration;

use serde::{Deserialize, Deserializer};

use super::models::ModelMap;
use crate::domain::{Token, TokenDigest};

/// `[api]`: client keys, model aliases, request limits and deadlines.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ApiConfig {
    /// Keys a client must present as `Authorization: Bearer <key>`; empty leaves the API open.
    pub keys: Vec<ApiKey>,
    /// Aliases: an external model id mapped to `ADAPTER/TARGET`.
    pub models: BTreeMap<String, String>,
    /// The largest request body accepted; larger ones get 413.
    pub max_body_bytes: usize,
    /// The deadline of a request that does not send `x-edge-deadline-ms`; 0 leaves it to
    /// `[runs] default_deadline_ms`.
    pub default_deadline_ms: u64,
    /// The cap on a deadline asked for with `x-edge-deadline-ms`.
    pub max_deadline_ms: u64,
    /// The `Retry-After` (seconds) sent with 429 and 503.
    pub retry_after_secs: u64,
}

impl Default for ApiConfig {
    fn default() -> Self {
        Self {
            keys: Vec::new(),
            models: BTreeMap::new(),
            max_body_bytes: 1024 * 1024,
            default_deadline_ms: 300_000,
            max_deadline_ms: 600_000,
            retry_after_secs: 1,
        }
    }
}

impl ApiConfig {
    /// `default_deadline_ms` as a duration, or `None` when it is 0.
    pub fn default_deadline(&self) -> Option<Duration> {
        (self.default_deadline_ms > 0).then(|| Duration::from_millis(self.default_deadline_ms))
    }

    /// `max_deadline_ms` as a duration.
    pub fn max_deadline(&self) -> Duration {
        Duration::from_millis(self.max_deadline_ms)
    }

    /// Values that deserialize but cannot work, each naming its key: an alias whose value is
    /// not `ADAPTER/TARGET`, a zero body limit or deadline cap, a default deadline above the
    /// cap.
    pub fn problems(&self) -> Vec<String> {
        let mut problems = ModelMap::problems(&self.models);
        if self.max_body_bytes == 0 {
            problems.push("`api.max_body_bytes` must be at least 1".to_owned());
        }
        if self.max_deadline_ms == 0 {
            problems.push("`api.max_deadline_ms` must be at least 1".to_owned());
        }
        if self.default_deadline_ms > self.max_deadline_ms {
            problems.push(format!(
                "`api.default_deadline_ms` ({}) must not exceed `api.max_deadline_ms` ({})",
                self.default_deadline_ms, self.max_deadline_ms
            ));
        }
        problems
    }
}

/// A client API key, kept only as its SHA-256 digest. `Debug` never shows it.
#[derive(Clone, PartialEq, Eq)]
pub struct ApiKey(TokenDigest);

impl ApiKey {
    /// Hashes `key`.
    pub fn new(key: &str) -> Self {
        Self(Token::new(key).digest())
    }

    /// Whether `presented` (already hashed) is this key, compared in constant time.
    pub fn matches(&self, presented: &TokenDigest) -> bool {
        self.0.matches(presented)
    }
}

impl fmt::Debug for ApiKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("ApiKey(<redacted>)")
    }
}

impl<'de> Deserialize<'de> for ApiKey {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let key = Token::new(String::deserialize(deserializer)?);
        if key.is_empty() {
            return Err(serde::de::Error::custom("an API key must not be empty"));
        }
        Ok(Self(key.digest()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_never_shown() {
        let config = ApiConfig {
            keys: vec![ApiKey::new("sk-very-secret")],
            ..ApiConfig::default()
        };
        assert!(!format!("{config:?}").contains("very-secret"));
        assert!(ApiKey::new("sk-very-secret").matches(&Token::new("sk-very-secret").digest()));
        assert!(!ApiKey::new("sk-very-secret").matches(&Token::new("sk-other").digest()));
    }

    #[test]
    fn problems_name_the_key() {
        let config = ApiConfig {
            max_body_bytes: 0,
            default_deadline_ms: 10,
            max_deadline_ms: 5,
            models: BTreeMap::from([("gpt".to_owned(), "no-slash".to_owned())]),
            ..ApiConfig::default()
        };
        let problems = config.problems().join("; ");
        assert!(problems.contains("api.models"), "{problems}");
        assert!(problems.contains("\"gpt\""), "{problems}");
        assert!(problems.contains("api.max_body_bytes"), "{problems}");
        assert!(problems.contains("api.default_deadline_ms"), "{problems}");
        assert!(ApiConfig::default().problems().is_empty());
    }
}
