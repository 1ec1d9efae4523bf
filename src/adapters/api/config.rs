//! `[api]`: the settings of the OpenAI-compatible API.
//!
//! Deserialized by the edge's settings (`app/compose/settings.rs`) together with the other sections; checked there at
//! load through [`ApiConfig::problems`], so a running edge never holds an alias it cannot
//! route. API keys are hashed as they are read and never shown, not even through `Debug`.
//! A key is a plain string, or a table that also names it (its tenant for fair queueing
//! and limits) and sets its priority class and limits.

use std::collections::BTreeMap;
use std::fmt;
use std::num::NonZeroU32;
use std::time::Duration;

use serde::{Deserialize, Deserializer};

use super::models::ModelMap;
use crate::domain::routing::{LimitPolicy, Priority, TenantKey, TokenBudget};
use crate::domain::{Token, TokenDigest};

/// `[api]`: client keys, model aliases, request limits and deadlines.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ApiConfig {
    /// Keys a client must present as `Authorization: Bearer <key>` (or `x-api-key`); empty
    /// leaves the API open.
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

    /// The keys' own limits, by the name their runs count under (`ApiKey::tenant`): the
    /// keys whose tables set any.
    pub fn key_limits(&self) -> std::collections::HashMap<TenantKey, LimitPolicy> {
        self.keys
            .iter()
            .enumerate()
            .filter_map(|(index, key)| Some((key.tenant(index), key.limits()?)))
            .collect()
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
        let mut names = std::collections::BTreeSet::new();
        for (index, key) in self.keys.iter().enumerate() {
            let name = key.tenant(index);
            if !names.insert(name.clone()) {
                problems.push(format!(
                    "`api.keys[{index}]`: the name {:?} is used by another key",
                    name.as_str()
                ));
            }
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

/// A client API key, kept only as its SHA-256 digest, and what it grants. `Debug` never
/// shows the key.
#[derive(Clone, PartialEq, Eq)]
pub struct ApiKey {
    digest: TokenDigest,
    grant: KeyGrant,
}

/// What a key's table sets besides the key itself.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
struct KeyGrant {
    name: Option<TenantKey>,
    priority: Priority,
    allow_priority_header: bool,
    limits: Option<LimitPolicy>,
    budget: Option<TokenBudget>,
    resumable: bool,
}

impl ApiKey {
    /// Hashes `key`; a key with no name, interactive priority and the edge's limits.
    pub fn new(key: &str) -> Self {
        Self {
            digest: Token::new(key).digest(),
            grant: KeyGrant::default(),
        }
    }

    /// Whether `presented` (already hashed) is this key, compared in constant time.
    pub fn matches(&self, presented: &TokenDigest) -> bool {
        self.digest.matches(presented)
    }

    /// The key's tenant: its `name`, else `key-N` from its position (`index` from 0).
    pub fn tenant(&self, index: usize) -> TenantKey {
        self.grant.name.clone().unwrap_or_else(|| {
            // `key-N` is always a valid tenant name.
            TenantKey::parse(&format!("key-{}", index + 1))
                .unwrap_or_else(|_| TenantKey::anonymous())
        })
    }

    /// The priority class of its runs.
    pub fn priority(&self) -> Priority {
        self.grant.priority
    }

    /// Whether its clients may choose the priority with `x-edge-priority`.
    pub fn allows_priority_header(&self) -> bool {
        self.grant.allow_priority_header
    }

    /// Its own limits, when its table sets any; `None` applies `[limits]`.
    pub fn limits(&self) -> Option<LimitPolicy> {
        self.grant.limits
    }

    /// Its token budget, when its table sets one.
    pub fn budget(&self) -> Option<TokenBudget> {
        self.grant.budget
    }

    /// Whether its clients' streams are resumable without asking for it.
    pub fn resumable(&self) -> bool {
        self.grant.resumable
    }
}

impl fmt::Debug for ApiKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ApiKey")
            .field("key", &"<redacted>")
            .field("grant", &self.grant)
            .finish()
    }
}

/// `[[api.keys]]`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct KeyTable {
    #[serde(default)]
    key: Option<String>,
    #[serde(default)]
    key_sha256: Option<String>,
    #[serde(default)]
    name: Option<String>,
    #[serde(default)]
    priority: Option<String>,
    #[serde(default)]
    allow_priority_header: bool,
    #[serde(default)]
    max_concurrent_runs: u32,
    #[serde(default)]
    requests_per_minute: u32,
    #[serde(default)]
    burst: u32,
    #[serde(default)]
    budget_tokens_per_day: u64,
    #[serde(default)]
    budget_tokens_per_month: u64,
    #[serde(default)]
    budget_reserve_tokens: Option<u64>,
    #[serde(default)]
    resumable: bool,
}

/// What a run reserves of its key's budget when its request sets no `max_tokens`.
const DEFAULT_BUDGET_RESERVE: u64 = 1_024;

impl KeyTable {
    /// The key this table describes, or what is wrong with it (never quoting the key).
    fn into_key(self) -> Result<ApiKey, String> {
        let digest = match (self.key, self.key_sha256) {
            (Some(key), None) if !key.is_empty() => Token::new(key).digest(),
            (None, Some(hex)) => TokenDigest::from_hex(&hex)
                .map_err(|reason| format!("`key_sha256` is not a SHA-256 digest: {reason}"))?,
            (Some(_), None) => return Err("an API key must not be empty".to_owned()),
            _ => return Err("give exactly one of `key` and `key_sha256`".to_owned()),
        };
        let name = self
            .name
            .map(|name| {
                TenantKey::parse(&name).map_err(|_| {
                    format!(
                        "`name` {name:?} must be 1 to 128 characters, none of them control characters"
                    )
                })
            })
            .transpose()?;
        let priority = self
            .priority
            .map(|p| Priority::parse(&p))
            .transpose()
            .map_err(|error| error.to_string())?
            .unwrap_or_default();
        let limits = LimitPolicy {
            max_concurrent: NonZeroU32::new(self.max_concurrent_runs),
            per_minute: NonZeroU32::new(self.requests_per_minute),
            burst: NonZeroU32::new(self.burst),
        };
        let own_limits = limits != LimitPolicy::default();
        let budget = TokenBudget {
            per_day: (self.budget_tokens_per_day > 0).then_some(self.budget_tokens_per_day),
            per_month: (self.budget_tokens_per_month > 0).then_some(self.budget_tokens_per_month),
            default_reserve: self.budget_reserve_tokens.unwrap_or(DEFAULT_BUDGET_RESERVE),
        };
        let has_budget = budget.per_day.is_some() || budget.per_month.is_some();
        Ok(ApiKey {
            digest,
            grant: KeyGrant {
                name,
                priority,
                allow_priority_header: self.allow_priority_header,
                limits: own_limits.then_some(limits),
                budget: has_budget.then_some(budget),
                resumable: self.resumable,
            },
        })
    }
}

impl<'de> Deserialize<'de> for ApiKey {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_any(KeyVisitor)
    }
}

/// Reads a key written as a string or as a table, so each form keeps its own errors.
struct KeyVisitor;

impl<'de> serde::de::Visitor<'de> for KeyVisitor {
    type Value = ApiKey;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("an API key string, or a table with `key` or `key_sha256`")
    }

    fn visit_str<E: serde::de::Error>(self, key: &str) -> Result<ApiKey, E> {
        if key.is_empty() {
            return Err(E::custom("an API key must not be empty"));
        }
        Ok(ApiKey::new(key))
    }

    fn visit_map<A: serde::de::MapAccess<'de>>(self, map: A) -> Result<ApiKey, A::Error> {
        let table = KeyTable::deserialize(serde::de::value::MapAccessDeserializer::new(map))?;
        table.into_key().map_err(serde::de::Error::custom)
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
    fn a_key_table_may_make_its_streams_resumable() {
        let keys: Vec<ApiKey> = serde_json::from_value(serde_json::json!([
            "sk-plain",
            { "key": "sk-table" },
            { "key": "sk-resumable", "resumable": true },
        ]))
        .unwrap();
        let resumable: Vec<bool> = keys.iter().map(ApiKey::resumable).collect();
        assert_eq!(resumable, [false, false, true]);
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
