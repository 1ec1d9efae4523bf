//! [`FileNodeStore`]: the node definitions read once from the config file's `[[nodes]]`.
//!
//! Loading reads every entry, reports every malformed or invalid one at once (naming the file
//! and the entry, never a token), and indexes the valid records by token digest and by id.
//! After loading the store never changes, so it needs no lock and every lookup is a plain map
//! read.

use std::collections::HashMap;
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use config::ConfigError;

use crate::domain::{
    DefinitionsError, EntryRef, NodeDefinition, NodeId, NodeRecord, Token, TokenDigest,
    validate_definitions,
};
use crate::ports::NodeStore;

use super::config::{ConfigSource, NodeEntry};

/// The config key the node definitions live under.
const NODES_KEY: &str = "nodes";

/// Why the node definitions could not be loaded. Every message names the config file.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StoreError {
    /// `nodes` is present but is not a list of `[[nodes]]` tables.
    #[error("config file {}: `nodes` must be a list of [[nodes]] tables: {reason}", .path.display())]
    NotAList {
        /// The config file.
        path: PathBuf,
        /// What the config reader said.
        reason: String,
    },
    /// Some entries do not have the shape of a node definition (unknown or missing keys,
    /// values of the wrong type).
    #[error(
        "config file {}: {} malformed node definition(s):\n{}",
        .path.display(),
        .entries.len(),
        render(.entries)
    )]
    Malformed {
        /// The config file.
        path: PathBuf,
        /// Every malformed entry, in file order.
        entries: Vec<MalformedEntry>,
    },
    /// The entries are well-formed but break the rules for definitions (see
    /// [`validate_definitions`]).
    #[error("config file {}: {definitions}", .path.display())]
    Invalid {
        /// The config file.
        path: PathBuf,
        /// Every problem, each naming its entry.
        definitions: DefinitionsError,
    },
}

/// One `[[nodes]]` entry that could not be read as a node definition.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MalformedEntry {
    /// The entry.
    pub at: EntryRef,
    /// What is wrong with it (never the value of `token`).
    pub reason: String,
}

impl fmt::Display for MalformedEntry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.at, self.reason)
    }
}

/// Reads the `index`th `[[nodes]]` entry into a definition, or says what is wrong with it.
fn read_entry(index: usize, value: config::Value) -> Result<NodeDefinition, MalformedEntry> {
    // Checked first because the config reader's own message for a non-table entry quotes
    // the value, which may be a token written in the wrong place.
    let Ok(mut table) = value.clone().into_table() else {
        return Err(MalformedEntry {
            at: EntryRef {
                index,
                id: String::new(),
            },
            reason: "is not a table; write each node as a [[nodes]] section".into(),
        });
    };
    let id = table
        .remove("id")
        .and_then(|id| id.into_string().ok())
        .unwrap_or_default();
    value
        .try_deserialize::<NodeEntry>()
        .map(NodeDefinition::from)
        .map_err(|error| MalformedEntry {
            at: EntryRef { index, id },
            reason: describe(&error),
        })
}

/// Logs how many node definitions `path` held; none at all is worth a warning.
fn log_loaded(path: &Path, nodes: usize) {
    if nodes == 0 {
        tracing::warn!(
            file = %path.display(),
            "no [[nodes]] are defined: every node registration will be refused"
        );
    } else {
        tracing::info!(file = %path.display(), nodes, "loaded node definitions");
    }
}

fn render(entries: &[MalformedEntry]) -> String {
    entries
        .iter()
        .map(|e| format!("  - {e}"))
        .collect::<Vec<_>>()
        .join("\n")
}

/// The pre-registered nodes, read from the config file and never changed afterwards.
#[derive(Debug)]
pub struct FileNodeStore {
    records: Vec<Arc<NodeRecord>>,
    by_token: HashMap<TokenDigest, usize>,
    by_id: HashMap<NodeId, usize>,
}

impl FileNodeStore {
    /// Reads and validates the `[[nodes]]` entries of `source`.
    ///
    /// An absent or empty `nodes` list is allowed: the store is then empty and every
    /// registration is refused (a warning is logged).
    ///
    /// # Errors
    /// [`StoreError::NotAList`] when `nodes` is not a list of tables,
    /// [`StoreError::Malformed`] listing every entry with unknown or missing keys or values of
    /// the wrong type, and [`StoreError::Invalid`] listing every entry that breaks a rule of
    /// [`validate_definitions`] (bad names, missing, empty or duplicate tokens, duplicate ids
    /// or aliases). No message contains a token.
    pub fn load_from_config(source: &ConfigSource) -> Result<Self, StoreError> {
        let path = source.path();
        let values = match source.config().get_array(NODES_KEY) {
            Ok(values) => values,
            Err(ConfigError::NotFound(_)) => Vec::new(),
            Err(error) => {
                return Err(StoreError::NotAList {
                    path: path.to_owned(),
                    reason: describe(&error),
                });
            }
        };

        let mut definitions = Vec::with_capacity(values.len());
        let mut malformed = Vec::new();
        for (index, value) in values.into_iter().enumerate() {
            match read_entry(index, value) {
                Ok(definition) => definitions.push(definition),
                Err(entry) => malformed.push(entry),
            }
        }
        if !malformed.is_empty() {
            return Err(StoreError::Malformed {
                path: path.to_owned(),
                entries: malformed,
            });
        }

        let store =
            Self::from_definitions(&definitions).map_err(|definitions| StoreError::Invalid {
                path: path.to_owned(),
                definitions,
            })?;
        log_loaded(path, store.records.len());
        Ok(store)
    }

    /// Validates `definitions` and builds a store from them.
    ///
    /// # Errors
    /// [`DefinitionsError`] listing every problem, as [`validate_definitions`] reports it.
    pub fn from_definitions(definitions: &[NodeDefinition]) -> Result<Self, DefinitionsError> {
        validate_definitions(definitions).map(Self::from_records)
    }

    /// Indexes validated records; validation guarantees ids and digests are unique.
    fn from_records(records: Vec<NodeRecord>) -> Self {
        let records: Vec<Arc<NodeRecord>> = records.into_iter().map(Arc::new).collect();
        let mut by_token = HashMap::with_capacity(records.len());
        let mut by_id = HashMap::with_capacity(records.len());
        for (index, record) in records.iter().enumerate() {
            by_token.entry(*record.token()).or_insert(index);
            by_id.entry(record.id().clone()).or_insert(index);
        }
        Self {
            records,
            by_token,
            by_id,
        }
    }
}

impl NodeStore for FileNodeStore {
    fn find_by_token(&self, token: &Token) -> Option<Arc<NodeRecord>> {
        if token.is_empty() {
            return None;
        }
        // The map is keyed by SHA-256 digests and probed with the digest of the presented
        // token, never with the token itself. The probe's `==` may stop at the first
        // differing byte, but an attacker controls only the preimage: to learn anything from
        // that timing they would have to steer the digest of their guess byte by byte, which
        // SHA-256 does not allow, so the lookup reveals nothing about stored digests or
        // tokens. The final comparison is constant-time all the same, so the answer never
        // rests on a variable-time comparison.
        let digest = token.digest();
        let index = *self.by_token.get(&digest)?;
        let record = self.records.get(index)?;
        record.token().matches(&digest).then(|| Arc::clone(record))
    }

    fn find_by_id(&self, id: &NodeId) -> Option<Arc<NodeRecord>> {
        let index = *self.by_id.get(id)?;
        self.records.get(index).cloned()
    }

    fn records(&self) -> Vec<Arc<NodeRecord>> {
        self.records.clone()
    }
}

/// A config error as text, leaving out the offending value of a type error: in a node entry
/// that value may be a token.
fn describe(error: &ConfigError) -> String {
    match error {
        ConfigError::Type { expected, key, .. } => match key {
            Some(key) => format!("`{key}` has the wrong type: expected {expected}"),
            None => format!("wrong type: expected {expected}"),
        },
        ConfigError::At {
            error,
            key: Some(key),
            ..
        } => format!("{} (at `{key}`)", describe(error)),
        ConfigError::At { error, .. } => describe(error),
        ConfigError::NotFound(key) => format!("missing key `{key}`"),
        other => other.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use config::{Config, File, FileFormat};

    use super::*;

    const FILE: &str = "/etc/edge/test-nodes.toml";

    fn source(toml: &str) -> ConfigSource {
        let config = Config::builder()
            .add_source(File::from_str(toml, FileFormat::Toml))
            .build()
            .unwrap();
        ConfigSource::new(FILE.into(), true, config)
    }

    fn load(toml: &str) -> Result<FileNodeStore, StoreError> {
        FileNodeStore::load_from_config(&source(toml))
    }

    fn node(id: &str, alias: &str, token: &str) -> String {
        format!(
            r#"
[[nodes]]
id = "{id}"
alias = "{alias}"
token = "{token}"
[[nodes.adapters]]
name = "echo"
targets = ["default"]
"#
        )
    }

    fn id(text: &str) -> NodeId {
        NodeId::parse(text).unwrap()
    }

    #[test]
    fn loads_nodes_with_defaults_and_settings() {
        let toml = r#"
[[nodes]]
id = "node-a"
alias = "gpu-a"
token = "secret-a"
[nodes.runtime]
max_concurrent_runs = 2
[nodes.runtime.settings]
threads = "8"
[[nodes.adapters]]
name = "echo"
targets = ["default", "fast"]
[nodes.adapters.settings]
greeting = "hi"
capacity = 2
"never_sleep.embed" = true

[[nodes]]
id = "node-b"
alias = "gpu-b"
token = "secret-b"
"#;
        let store = load(toml).unwrap();
        let records = store.records();
        assert_eq!(records.len(), 2);
        let a = &records[0];
        assert_eq!(a.id().as_str(), "node-a");
        assert_eq!(a.runtime().max_concurrent_runs(), 2);
        assert_eq!(a.runtime().heartbeat_interval_ms(), 5_000);
        assert_eq!(a.runtime().settings()["threads"], "8");
        assert_eq!(a.adapters()[0].targets().len(), 2);
        assert_eq!(a.adapters()[0].settings()["greeting"], "hi");
        // Settings are strings; a TOML integer or boolean is read as its text.
        assert_eq!(a.adapters()[0].settings()["capacity"], "2");
        assert_eq!(a.adapters()[0].settings()["never_sleep.embed"], "true");
        let b = &records[1];
        assert_eq!(b.runtime().max_concurrent_runs(), 4);
        assert!(b.runtime().settings().is_empty());
        assert!(b.adapters().is_empty());
    }

    #[test]
    fn absent_or_empty_nodes_give_an_empty_store() {
        assert!(load("").unwrap().records().is_empty());
        assert!(load("nodes = []").unwrap().records().is_empty());
        assert!(
            load("[server]\nlisten = \"127.0.0.1:1\"")
                .unwrap()
                .records()
                .is_empty()
        );
    }

    #[test]
    fn find_by_token_accepts_only_the_right_token() {
        let store =
            load(&(node("node-a", "gpu-a", "ta") + &node("node-b", "gpu-b", "tb"))).unwrap();
        let found = store.find_by_token(&Token::new("tb")).unwrap();
        assert_eq!(found.id().as_str(), "node-b");
        assert!(store.find_by_token(&Token::new("tc")).is_none());
        assert!(store.find_by_token(&Token::new("t")).is_none());
        assert!(store.find_by_token(&Token::new("")).is_none());
    }

    #[test]
    fn find_by_id_finds_known_ids_only() {
        let store =
            load(&(node("node-a", "gpu-a", "ta") + &node("node-b", "gpu-b", "tb"))).unwrap();
        assert_eq!(
            store.find_by_id(&id("node-a")).unwrap().alias().as_str(),
            "gpu-a"
        );
        assert!(store.find_by_id(&id("gpu-a")).is_none());
        assert!(store.find_by_id(&id("node-c")).is_none());
    }

    #[test]
    fn token_sha256_stands_in_for_the_token() {
        let digest = Token::new("hashed-secret").digest().to_hex();
        let toml = format!(
            "[[nodes]]\nid = \"node-a\"\nalias = \"gpu-a\"\ntoken_sha256 = \"{}\"\n",
            digest.to_uppercase()
        );
        let store = load(&toml).unwrap();
        let found = store.find_by_token(&Token::new("hashed-secret")).unwrap();
        assert_eq!(found.id().as_str(), "node-a");
        assert!(store.find_by_token(&Token::new(digest)).is_none());
    }

    #[test]
    fn invalid_definitions_name_the_file_and_every_entry_but_no_token() {
        let toml = node("node-a", "gpu-a", "tok-SECRET-1")
            + &node("node-b", "gpu-b", "tok-SECRET-1")
            + &node("node-c", "gpu-c", "")
            + &node("node-a", "gpu-d", "tok-SECRET-2");
        let error = load(&toml).unwrap_err();
        assert!(matches!(error, StoreError::Invalid { .. }));
        let message = error.to_string();
        assert!(message.contains(FILE), "{message}");
        assert!(
            message.contains(
                r#"nodes[1] (id "node-b"): uses the same token as nodes[0] (id "node-a")"#
            ),
            "{message}"
        );
        assert!(
            message.contains(r#"nodes[2] (id "node-c"): `token` is empty"#),
            "{message}"
        );
        assert!(
            message.contains(r#"nodes[3] (id "node-a"): duplicate id, already used by nodes[0]"#),
            "{message}"
        );
        assert!(!message.contains("SECRET"), "{message}");
        assert!(!format!("{error:?}").contains("SECRET"));
    }

    #[test]
    fn malformed_entries_are_all_listed_without_token_values() {
        let toml = r#"
[[nodes]]
id = "node-a"
alias = "gpu-a"
token = "tok-SECRET"
colour = "blue"

[[nodes]]
id = "node-b"
alias = "gpu-b"
token = ["tok-SECRET-IN-A-LIST"]

[[nodes]]
id = "node-c"
token = "tok-SECRET-3"
"#;
        let error = load(toml).unwrap_err();
        let StoreError::Malformed { entries, .. } = &error else {
            panic!("expected Malformed, got {error}");
        };
        assert_eq!(
            entries.iter().map(|e| e.at.index).collect::<Vec<_>>(),
            vec![0, 1, 2]
        );
        let message = error.to_string();
        assert!(message.contains(FILE), "{message}");
        assert!(message.contains(r#"nodes[0] (id "node-a")"#), "{message}");
        assert!(message.contains("colour"), "{message}");
        assert!(message.contains(r#"nodes[1] (id "node-b")"#), "{message}");
        assert!(message.contains(r#"nodes[2] (id "node-c")"#), "{message}");
        assert!(message.contains("alias"), "{message}");
        assert!(!message.contains("SECRET"), "{message}");
        assert!(!format!("{error:?}").contains("SECRET"));
    }

    #[test]
    fn entries_that_are_not_tables_are_listed_without_quoting_them() {
        let error = load(r#"nodes = ["tok-SECRET", 3]"#).unwrap_err();
        let StoreError::Malformed { entries, .. } = &error else {
            panic!("expected Malformed, got {error}");
        };
        assert_eq!(entries.len(), 2);
        let message = error.to_string();
        assert!(message.contains("nodes[1]"), "{message}");
        assert!(!message.contains("SECRET"), "{message}");
    }

    #[test]
    fn nodes_that_is_not_a_list_is_an_error() {
        let error = load("[nodes]\nid = \"x\"").unwrap_err();
        assert!(matches!(error, StoreError::NotAList { .. }), "{error}");
        assert!(error.to_string().contains(FILE));
        let error = load(r#"nodes = "tok-SECRET""#).unwrap_err();
        assert!(!error.to_string().contains("SECRET"), "{error}");
    }

    #[test]
    fn debug_output_never_shows_tokens() {
        let source = source(&node("node-a", "gpu-a", "tok-SECRET"));
        assert!(!format!("{source:?}").contains("SECRET"));
        assert_eq!(source.path(), Path::new(FILE));
        let store = FileNodeStore::load_from_config(&source).unwrap();
        assert!(!format!("{store:?}").contains("SECRET"));
    }
}
