//! The `[[nodes]]` entries as written in the config file, and the parsed file they come from.
//!
//! These serde structs mirror the file's key names exactly (they are a contract with
//! operators) and reject unknown keys. They do no validation beyond shape: turning an entry
//! into a [`NodeDefinition`] is a field-for-field move, and the domain's
//! `validate_definitions` decides what is valid. The plaintext token is wrapped into a
//! [`Token`] the moment it is read, so no struct here can print it.

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};

use serde::Deserialize;
use serde::de::{self, Deserializer, Unexpected, Visitor};

use crate::domain::{AdapterDefinition, NodeDefinition, Token};

/// The parsed config file (merged with its environment overrides) and where it was read from.
///
/// Built once by the settings loader; every part of the edge that reads its own key from the
/// config file (the node store reads `nodes`) reads it from here, so all parts see one source.
#[derive(Clone)]
pub struct ConfigSource {
    path: PathBuf,
    found: bool,
    config: config::Config,
}

impl ConfigSource {
    /// Wraps a built config. `path` is the file it was read from (named in every error
    /// message); `found` says whether that file existed (a missing default file is allowed).
    pub fn new(path: PathBuf, found: bool, config: config::Config) -> Self {
        Self {
            path,
            found,
            config,
        }
    }

    /// The config file's path, as given.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Whether the file existed; when it did not, only defaults and overrides apply.
    pub fn found(&self) -> bool {
        self.found
    }

    /// The merged configuration.
    pub fn config(&self) -> &config::Config {
        &self.config
    }
}

// Not derived: the config holds every node's plaintext token.
impl fmt::Debug for ConfigSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ConfigSource")
            .field("path", &self.path)
            .field("found", &self.found)
            .finish_non_exhaustive()
    }
}

/// One `[[nodes]]` entry.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct NodeEntry {
    id: String,
    alias: String,
    #[serde(default, deserialize_with = "token")]
    token: Option<Token>,
    #[serde(default)]
    token_sha256: Option<String>,
    #[serde(default)]
    runtime: RuntimeEntry,
    #[serde(default)]
    adapters: Vec<AdapterEntry>,
}

/// `[nodes.runtime]`.
#[derive(Debug, Deserialize)]
#[serde(default, deny_unknown_fields)]
struct RuntimeEntry {
    max_concurrent_runs: u32,
    heartbeat_interval_ms: u32,
    settings: BTreeMap<String, String>,
}

impl Default for RuntimeEntry {
    fn default() -> Self {
        Self {
            max_concurrent_runs: 4,
            heartbeat_interval_ms: 5_000,
            settings: BTreeMap::new(),
        }
    }
}

/// One `[[nodes.adapters]]` entry.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct AdapterEntry {
    name: String,
    #[serde(default)]
    targets: Vec<String>,
    #[serde(default)]
    settings: BTreeMap<String, String>,
}

impl From<NodeEntry> for NodeDefinition {
    fn from(entry: NodeEntry) -> Self {
        let NodeEntry {
            id,
            alias,
            token,
            token_sha256,
            runtime,
            adapters,
        } = entry;
        let RuntimeEntry {
            max_concurrent_runs,
            heartbeat_interval_ms,
            settings,
        } = runtime;
        NodeDefinition {
            id,
            alias,
            token,
            token_sha256,
            adapters: adapters.into_iter().map(AdapterDefinition::from).collect(),
            max_concurrent_runs,
            heartbeat_interval_ms,
            runtime_settings: settings,
        }
    }
}

impl From<AdapterEntry> for AdapterDefinition {
    fn from(entry: AdapterEntry) -> Self {
        let AdapterEntry {
            name,
            targets,
            settings,
        } = entry;
        AdapterDefinition {
            name,
            targets,
            settings,
        }
    }
}

/// Reads `token` straight into a [`Token`]. A value of the wrong type is reported without
/// echoing it, since it may still be someone's secret.
fn token<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Option<Token>, D::Error> {
    deserializer.deserialize_string(TokenVisitor).map(Some)
}

struct TokenVisitor;

impl TokenVisitor {
    fn not_a_string<E: de::Error>(&self) -> E {
        E::invalid_type(Unexpected::Other("a value that is not a string"), self)
    }
}

impl Visitor<'_> for TokenVisitor {
    type Value = Token;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("the node's token as a string")
    }

    fn visit_str<E: de::Error>(self, value: &str) -> Result<Token, E> {
        Ok(Token::new(value))
    }

    fn visit_string<E: de::Error>(self, value: String) -> Result<Token, E> {
        Ok(Token::new(value))
    }

    fn visit_bool<E: de::Error>(self, _: bool) -> Result<Token, E> {
        Err(self.not_a_string())
    }

    fn visit_i64<E: de::Error>(self, _: i64) -> Result<Token, E> {
        Err(self.not_a_string())
    }

    fn visit_u64<E: de::Error>(self, _: u64) -> Result<Token, E> {
        Err(self.not_a_string())
    }

    fn visit_f64<E: de::Error>(self, _: f64) -> Result<Token, E> {
        Err(self.not_a_string())
    }

    fn visit_bytes<E: de::Error>(self, _: &[u8]) -> Result<Token, E> {
        Err(self.not_a_string())
    }
}
