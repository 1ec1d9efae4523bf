//! A pre-registered node definition, as the edge holds it after validation.

use std::collections::BTreeMap;

use super::names::{AdapterName, Alias, NodeId, Target};
use super::token::TokenDigest;

/// One adapter a node runs, with the targets it serves and free-form settings passed to it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AdapterConfig {
    /// The adapter's name.
    pub name: AdapterName,
    /// The targets (models, profiles) this adapter serves on this node.
    pub targets: Vec<Target>,
    /// Settings handed to the node untouched.
    pub settings: BTreeMap<String, String>,
}

/// How a node is asked to run: its concurrency and heartbeat, plus free-form settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RuntimeConfig {
    /// How many runs the edge sends this node at once (at least 1).
    pub max_concurrent_runs: u32,
    /// How often the node must send a heartbeat, in milliseconds (at least 1).
    pub heartbeat_interval_ms: u32,
    /// Settings handed to the node untouched.
    pub settings: BTreeMap<String, String>,
}

/// A validated node definition: who the node is, how it proves it, and its central config.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeRecord {
    /// The node's id.
    pub id: NodeId,
    /// The node's alias.
    pub alias: Alias,
    /// The digest of the node's pre-shared token.
    pub token: TokenDigest,
    /// The adapters the node runs.
    pub adapters: Vec<AdapterConfig>,
    /// The node's runtime settings.
    pub runtime: RuntimeConfig,
}

impl NodeRecord {
    /// Whether this node's config serves `target` through `adapter`.
    pub fn serves(&self, adapter: &AdapterName, target: &Target) -> bool {
        self.adapters
            .iter()
            .any(|a| &a.name == adapter && a.targets.contains(target))
    }

    /// Whether `name` is this node's id or alias.
    pub fn is_named(&self, name: &str) -> bool {
        self.id.as_str() == name || self.alias.as_str() == name
    }
}

/// The adapter-target pairs a node says it can serve now. A node that never reports is
/// taken to serve everything its config lists.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Availability {
    available: Vec<(AdapterName, Target)>,
}

impl Availability {
    /// The pairs in `available` (duplicates are kept once).
    pub fn new(available: impl IntoIterator<Item = (AdapterName, Target)>) -> Self {
        let mut available: Vec<_> = available.into_iter().collect();
        available.sort();
        available.dedup();
        Self { available }
    }

    /// Whether `adapter + target` is available.
    pub fn serves(&self, adapter: &AdapterName, target: &Target) -> bool {
        self.available
            .binary_search_by(|(a, t)| (a, t).cmp(&(adapter, target)))
            .is_ok()
    }

    /// Every available pair, ordered by adapter then target.
    pub fn pairs(&self) -> &[(AdapterName, Target)] {
        &self.available
    }
}
