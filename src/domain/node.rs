//! A pre-registered node definition, as the edge holds it after validation.
//!
//! The fields are private: a record, an adapter config and a runtime config are made only
//! through their constructors, which keep the invariants the rest of the edge relies on
//! (an adapter serves at least one target; a node takes at least one run at a time and
//! heartbeats at a non-zero interval). The `*Parts` views let the one config mapper
//! destructure every field, so a field added here is a compile error there.

use std::collections::BTreeMap;
use std::time::Duration;

use super::models::{LoadState, ManagedAdapter};
use super::names::{AdapterName, Alias, NodeId, Target};
use super::token::TokenDigest;

/// Why a config value was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum NodeConfigError {
    /// An adapter lists no target.
    #[error("an adapter must serve at least one target")]
    NoTargets,
    /// `max_concurrent_runs` is 0.
    #[error("max_concurrent_runs must be at least 1")]
    NoConcurrentRuns,
    /// `heartbeat_interval_ms` is 0.
    #[error("heartbeat_interval_ms must be at least 1")]
    NoHeartbeatInterval,
}

/// One adapter a node runs, with the targets it serves and free-form settings passed to it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AdapterConfig {
    name: AdapterName,
    targets: Vec<Target>,
    settings: BTreeMap<String, String>,
}

/// Every field of an [`AdapterConfig`], borrowed.
#[derive(Debug, Clone, Copy)]
pub struct AdapterParts<'a> {
    /// The adapter's name.
    pub name: &'a AdapterName,
    /// The targets (models, profiles) this adapter serves on this node; never empty.
    pub targets: &'a [Target],
    /// Settings handed to the node untouched.
    pub settings: &'a BTreeMap<String, String>,
}

impl AdapterConfig {
    /// An adapter serving `targets`.
    ///
    /// # Errors
    /// [`NodeConfigError::NoTargets`] when `targets` is empty.
    pub fn new(
        name: AdapterName,
        targets: Vec<Target>,
        settings: BTreeMap<String, String>,
    ) -> Result<Self, NodeConfigError> {
        if targets.is_empty() {
            return Err(NodeConfigError::NoTargets);
        }
        Ok(Self {
            name,
            targets,
            settings,
        })
    }

    /// The adapter's name.
    pub fn name(&self) -> &AdapterName {
        &self.name
    }

    /// The targets (models, profiles) this adapter serves on this node; never empty.
    pub fn targets(&self) -> &[Target] {
        &self.targets
    }

    /// Settings handed to the node untouched.
    pub fn settings(&self) -> &BTreeMap<String, String> {
        &self.settings
    }

    /// Every field, borrowed, for a mapper that must handle each.
    pub fn parts(&self) -> AdapterParts<'_> {
        let Self {
            name,
            targets,
            settings,
        } = self;
        AdapterParts {
            name,
            targets,
            settings,
        }
    }
}

/// How a node is asked to run: its concurrency and heartbeat, plus free-form settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RuntimeConfig {
    max_concurrent_runs: u32,
    heartbeat_interval_ms: u32,
    settings: BTreeMap<String, String>,
}

/// Every field of a [`RuntimeConfig`], borrowed.
#[derive(Debug, Clone, Copy)]
pub struct RuntimeParts<'a> {
    /// How many runs the edge sends this node at once (at least 1).
    pub max_concurrent_runs: u32,
    /// How often the node must send a heartbeat, in milliseconds (at least 1).
    pub heartbeat_interval_ms: u32,
    /// Settings handed to the node untouched.
    pub settings: &'a BTreeMap<String, String>,
}

impl RuntimeConfig {
    /// A runtime config.
    ///
    /// # Errors
    /// [`NodeConfigError::NoConcurrentRuns`] or [`NodeConfigError::NoHeartbeatInterval`]
    /// when either is 0.
    pub fn new(
        max_concurrent_runs: u32,
        heartbeat_interval_ms: u32,
        settings: BTreeMap<String, String>,
    ) -> Result<Self, NodeConfigError> {
        if max_concurrent_runs == 0 {
            return Err(NodeConfigError::NoConcurrentRuns);
        }
        if heartbeat_interval_ms == 0 {
            return Err(NodeConfigError::NoHeartbeatInterval);
        }
        Ok(Self {
            max_concurrent_runs,
            heartbeat_interval_ms,
            settings,
        })
    }

    /// How many runs the edge sends this node at once (at least 1).
    pub fn max_concurrent_runs(&self) -> u32 {
        self.max_concurrent_runs
    }

    /// How often the node must send a heartbeat, in milliseconds (at least 1).
    pub fn heartbeat_interval_ms(&self) -> u32 {
        self.heartbeat_interval_ms
    }

    /// How often the node must send a heartbeat.
    pub fn heartbeat_interval(&self) -> Duration {
        Duration::from_millis(u64::from(self.heartbeat_interval_ms))
    }

    /// Settings handed to the node untouched.
    pub fn settings(&self) -> &BTreeMap<String, String> {
        &self.settings
    }

    /// Every field, borrowed, for a mapper that must handle each.
    pub fn parts(&self) -> RuntimeParts<'_> {
        let Self {
            max_concurrent_runs,
            heartbeat_interval_ms,
            settings,
        } = self;
        RuntimeParts {
            max_concurrent_runs: *max_concurrent_runs,
            heartbeat_interval_ms: *heartbeat_interval_ms,
            settings,
        }
    }
}

/// A validated node definition: who the node is, how it proves it, and its central config.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeRecord {
    id: NodeId,
    alias: Alias,
    token: TokenDigest,
    adapters: Vec<AdapterConfig>,
    runtime: RuntimeConfig,
}

/// Every field of a [`NodeRecord`], borrowed.
#[derive(Debug, Clone, Copy)]
pub struct NodeRecordParts<'a> {
    /// The node's id.
    pub id: &'a NodeId,
    /// The node's alias.
    pub alias: &'a Alias,
    /// The digest of the node's pre-shared token.
    pub token: &'a TokenDigest,
    /// The adapters the node runs.
    pub adapters: &'a [AdapterConfig],
    /// The node's runtime settings.
    pub runtime: &'a RuntimeConfig,
}

impl NodeRecord {
    /// A record of already validated parts.
    pub fn new(
        id: NodeId,
        alias: Alias,
        token: TokenDigest,
        adapters: Vec<AdapterConfig>,
        runtime: RuntimeConfig,
    ) -> Self {
        Self {
            id,
            alias,
            token,
            adapters,
            runtime,
        }
    }

    /// The node's id.
    pub fn id(&self) -> &NodeId {
        &self.id
    }

    /// The node's alias.
    pub fn alias(&self) -> &Alias {
        &self.alias
    }

    /// The digest of the node's pre-shared token.
    pub fn token(&self) -> &TokenDigest {
        &self.token
    }

    /// The adapters the node runs.
    pub fn adapters(&self) -> &[AdapterConfig] {
        &self.adapters
    }

    /// The node's runtime settings.
    pub fn runtime(&self) -> &RuntimeConfig {
        &self.runtime
    }

    /// Every field, borrowed, for a mapper that must handle each.
    pub fn parts(&self) -> NodeRecordParts<'_> {
        let Self {
            id,
            alias,
            token,
            adapters,
            runtime,
        } = self;
        NodeRecordParts {
            id,
            alias,
            token,
            adapters,
            runtime,
        }
    }

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

/// The adapter-target pairs a node says it can serve now, and what it knows of them (each
/// one's context window; the load state of every target of the adapters it loads and
/// unloads on command). A node that never reports is taken to serve everything its config
/// lists.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Availability {
    available: Vec<(AdapterName, Target)>,
    /// The context windows, in tokens, of the available pairs whose engine said.
    windows: BTreeMap<(AdapterName, Target), u32>,
    /// The adapters the node loads and unloads on command, with their targets' states.
    managed: BTreeMap<AdapterName, ManagedAdapter>,
}

impl Availability {
    /// The pairs in `available` (duplicates are kept once).
    pub fn new(available: impl IntoIterator<Item = (AdapterName, Target)>) -> Self {
        let mut available: Vec<_> = available.into_iter().collect();
        available.sort();
        available.dedup();
        Self {
            available,
            windows: BTreeMap::new(),
            managed: BTreeMap::new(),
        }
    }

    /// This availability with `adapter` managed: the node loads and unloads its targets on
    /// command; `managed` says what it can hold and every target's state. A target its
    /// catalogue says is [`LoadState::Asleep`] is not served, whatever the node listed: a
    /// request reaching an asleep engine is aborted, so nothing is ever routed to one.
    #[must_use]
    pub fn with_managed(mut self, adapter: AdapterName, managed: ManagedAdapter) -> Self {
        for (target, load) in &managed.targets {
            if load.state == LoadState::Asleep {
                self = self.with_served(&adapter, target, false);
            }
        }
        self.managed.insert(adapter, managed);
        self
    }

    /// `adapter`'s targets and capacity, when the node manages it.
    pub fn managed(&self, adapter: &AdapterName) -> Option<&ManagedAdapter> {
        self.managed.get(adapter)
    }

    /// Every managed adapter, ordered by name.
    pub fn managed_adapters(&self) -> impl Iterator<Item = (&AdapterName, &ManagedAdapter)> {
        self.managed.iter()
    }

    /// This availability with `adapter + target`'s context window: `tokens`. Ignored for a
    /// pair that is not available, or a window of 0 (unknown).
    #[must_use]
    pub fn with_context_window(
        mut self,
        adapter: &AdapterName,
        target: &Target,
        tokens: u32,
    ) -> Self {
        if tokens > 0 && self.serves(adapter, target) {
            self.windows
                .insert((adapter.clone(), target.clone()), tokens);
        }
        self
    }

    /// The context window `adapter + target` is served with, in tokens, when the node said;
    /// for a managed target not served now, the window its node says it will be served with
    /// once loaded (an asleep server's, or a setting's).
    pub fn context_window(&self, adapter: &AdapterName, target: &Target) -> Option<u32> {
        self.windows
            .get(&(adapter.clone(), target.clone()))
            .copied()
            .or_else(|| {
                let load = self.managed.get(adapter)?.targets.get(target)?;
                (load.context_window > 0).then_some(load.context_window)
            })
    }

    /// Whether `adapter + target` is available.
    pub fn serves(&self, adapter: &AdapterName, target: &Target) -> bool {
        self.available
            .binary_search_by(|(a, t)| (a, t).cmp(&(adapter, target)))
            .is_ok()
    }

    /// This availability with `adapter + target` served now (`true`) or not (`false`); its
    /// window and its managed state are kept.
    #[must_use]
    pub fn with_served(mut self, adapter: &AdapterName, target: &Target, served: bool) -> Self {
        let at = self
            .available
            .binary_search_by(|(a, t)| (a, t).cmp(&(adapter, target)));
        match (at, served) {
            (Err(index), true) => self
                .available
                .insert(index, (adapter.clone(), target.clone())),
            (Ok(index), false) => {
                self.available.remove(index);
            }
            _ => {}
        }
        self
    }

    /// Every available pair, ordered by adapter then target.
    pub fn pairs(&self) -> &[(AdapterName, Target)] {
        &self.available
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn constructors_refuse_what_would_break_an_invariant() {
        let target = Target::parse("m").unwrap();
        let name = AdapterName::parse("echo").unwrap();
        assert_eq!(
            AdapterConfig::new(name.clone(), vec![], BTreeMap::new()),
            Err(NodeConfigError::NoTargets)
        );
        assert!(AdapterConfig::new(name, vec![target], BTreeMap::new()).is_ok());
        assert_eq!(
            RuntimeConfig::new(0, 1_000, BTreeMap::new()),
            Err(NodeConfigError::NoConcurrentRuns)
        );
        assert_eq!(
            RuntimeConfig::new(1, 0, BTreeMap::new()),
            Err(NodeConfigError::NoHeartbeatInterval)
        );
        let runtime = RuntimeConfig::new(1, 1_500, BTreeMap::new()).unwrap();
        assert_eq!(runtime.heartbeat_interval(), Duration::from_millis(1_500));
    }

    #[test]
    fn an_asleep_target_is_never_served_and_a_managed_target_has_its_window_before_loading() {
        use super::super::models::TargetLoad;
        let vllm = AdapterName::parse("vllm").unwrap();
        let (alpha, beta) = (
            Target::parse("alpha").unwrap(),
            Target::parse("beta").unwrap(),
        );
        let asleep = TargetLoad {
            context_window: 16_384,
            ..TargetLoad::new(LoadState::Asleep)
        };
        let managed = ManagedAdapter {
            capacity: 1,
            parallel: 0,
            budget: None,
            targets: BTreeMap::from([
                (alpha.clone(), TargetLoad::new(LoadState::Loaded)),
                (beta.clone(), asleep),
            ]),
        };
        // Listed by mistake, the asleep one is still not served.
        let availability =
            Availability::new([(vllm.clone(), alpha.clone()), (vllm.clone(), beta.clone())])
                .with_context_window(&vllm, &alpha, 8_192)
                .with_managed(vllm.clone(), managed);
        assert!(availability.serves(&vllm, &alpha));
        assert!(!availability.serves(&vllm, &beta));
        assert_eq!(availability.context_window(&vllm, &alpha), Some(8_192));
        assert_eq!(availability.context_window(&vllm, &beta), Some(16_384));
    }
}
