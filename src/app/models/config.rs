//! The model lifecycle's sections: `[[models]]` (the desired state of each model) and
//! `[lifecycle]` (how long commands and cold starts may take, how often the edge
//! reconciles), and [`policies`], which checks the entries against the node definitions and
//! sets aside those naming LoRAs.
//!
//! Deserialized by `crate::app::compose::settings` with the other sections; the reference is
//! `docs/configuration.md` and `docs/models.md`.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use serde::Deserialize;

use crate::domain::models::{ModelName, ModelPolicy};
use crate::domain::{NodeId, NodeRecord};

/// One `[[models]]` entry as written.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelEntry {
    /// `adapter/target`.
    pub model: String,
    /// Kept loaded on at least this many nodes.
    #[serde(default)]
    pub min_loaded: u32,
    /// Nodes (ids or aliases) where it is kept loaded and never unloaded.
    #[serde(default)]
    pub pin: Vec<String>,
    /// Unloaded where unused this long (beyond `min_loaded` and the pins).
    #[serde(default)]
    pub idle_unload_ms: Option<u64>,
}

/// `[lifecycle]`: how the edge drives the nodes' engines.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct LifecycleConfig {
    /// How long a load or unload command may take before the edge gives up on it.
    pub command_timeout_ms: u64,
    /// How long a request for a model loaded nowhere may wait for its load (at least the
    /// `runs.no_node_timeout_ms`).
    pub cold_start_timeout_ms: u64,
    /// How often the edge compares the pool with the desired state (idle unloads are
    /// found at this resolution).
    pub reconcile_interval_ms: u64,
}

impl Default for LifecycleConfig {
    fn default() -> Self {
        Self {
            command_timeout_ms: 300_000,
            cold_start_timeout_ms: 300_000,
            reconcile_interval_ms: 1_000,
        }
    }
}

impl LifecycleConfig {
    /// What cannot work: a zero timeout or interval.
    pub fn problems(&self) -> Vec<String> {
        [
            ("lifecycle.command_timeout_ms", self.command_timeout_ms),
            (
                "lifecycle.cold_start_timeout_ms",
                self.cold_start_timeout_ms,
            ),
            (
                "lifecycle.reconcile_interval_ms",
                self.reconcile_interval_ms,
            ),
        ]
        .iter()
        .filter(|(_, value)| *value == 0)
        .map(|(key, _)| format!("`{key}` must be at least 1"))
        .collect()
    }

    /// `command_timeout_ms`.
    pub fn command_timeout(&self) -> Duration {
        Duration::from_millis(self.command_timeout_ms)
    }

    /// `cold_start_timeout_ms`.
    pub fn cold_start_timeout(&self) -> Duration {
        Duration::from_millis(self.cold_start_timeout_ms)
    }

    /// `reconcile_interval_ms`.
    pub fn reconcile_interval(&self) -> Duration {
        Duration::from_millis(self.reconcile_interval_ms)
    }
}

/// The `[[models]]` entries: the policies of configured models, and the entries set aside
/// as LoRAs' (no node definition serves their target, but one has their adapter: a LoRA's
/// name, known only once a node reports it; checked then).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Policies {
    /// Each configured model's policy.
    pub models: BTreeMap<ModelName, ModelPolicy>,
    /// The entries naming what may be a LoRA.
    pub loras: Vec<LoraEntry>,
}

/// A `[[models]]` entry naming no configured target of a configured adapter: a LoRA's name,
/// checked when nodes report.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LoraEntry {
    /// Where it is written (`models[1] (model "llama/sql")`).
    pub at: String,
    /// Its model.
    pub model: ModelName,
    /// It sets `min_loaded`, `pin` or `idle_unload_ms`, which do not apply to a LoRA (its
    /// node registers it itself).
    pub sets_policy: bool,
}

/// The `[[models]]` entries as policies, checked against the node definitions `records`.
///
/// # Errors
/// Every problem at once, each naming its entry (`models[1] (model "llama/alpha")`): a
/// model that is not `adapter/target` or whose adapter no node's config has, one listed
/// twice, `min_loaded` above the nodes that serve it, a pin on a node that is not defined or
/// does not serve it, an `idle_unload_ms` of 0.
pub fn policies(
    entries: &[ModelEntry],
    records: &[Arc<NodeRecord>],
) -> Result<Policies, Vec<String>> {
    let mut policies = Policies::default();
    let mut problems = Vec::new();
    for (index, entry) in entries.iter().enumerate() {
        let at = format!("models[{index}] (model {:?})", entry.model);
        match policy(entry, records) {
            Ok(Entry::Model(model, policy)) => {
                if policies.models.insert(model, policy).is_some() {
                    problems.push(format!("{at}: the model is listed twice"));
                }
            }
            Ok(Entry::Lora(model)) => policies.loras.push(LoraEntry {
                at,
                model,
                sets_policy: entry.min_loaded > 0
                    || !entry.pin.is_empty()
                    || entry.idle_unload_ms.is_some(),
            }),
            Err(found) => problems.extend(found.into_iter().map(|p| format!("{at}: {p}"))),
        }
    }
    if problems.is_empty() {
        Ok(policies)
    } else {
        Err(problems)
    }
}

/// One entry, read.
enum Entry {
    /// A configured model and its policy.
    Model(ModelName, ModelPolicy),
    /// What may be a LoRA.
    Lora(ModelName),
}

fn policy(entry: &ModelEntry, records: &[Arc<NodeRecord>]) -> Result<Entry, Vec<String>> {
    let model = ModelName::parse(&entry.model)
        .map_err(|error| vec![format!("`model` is not `adapter/target`: {error}")])?;
    let serving: Vec<&Arc<NodeRecord>> = records
        .iter()
        .filter(|r| r.serves(&model.adapter, &model.target))
        .collect();
    let has_adapter =
        |r: &&Arc<NodeRecord>| r.adapters().iter().any(|a| a.name() == &model.adapter);
    if serving.is_empty() && records.iter().any(|r| has_adapter(&r)) {
        return Ok(Entry::Lora(model));
    }
    let mut problems = Vec::new();
    if serving.is_empty() {
        problems.push(format!(
            "no `[[nodes]]` entry has adapter `{}` (for its target `{}`, or a LoRA of it)",
            model.adapter, model.target
        ));
    } else if entry.min_loaded as usize > serving.len() {
        problems.push(format!(
            "`min_loaded` = {} is above the {} node(s) that serve it",
            entry.min_loaded,
            serving.len()
        ));
    }
    let mut pin = BTreeSet::new();
    for name in &entry.pin {
        match records.iter().find(|r| r.is_named(name)) {
            None => problems.push(format!(
                "`pin` names {name:?}, which no `[[nodes]]` entry is"
            )),
            Some(record) if !serving.iter().any(|s| s.id() == record.id()) => problems.push(
                format!("`pin` names node {name:?}, whose config does not serve the model"),
            ),
            Some(record) => {
                pin.insert(record.id().clone());
            }
        }
    }
    if entry.idle_unload_ms == Some(0) {
        problems.push("`idle_unload_ms` must be at least 1".to_owned());
    }
    if !problems.is_empty() {
        return Err(problems);
    }
    let policy = ModelPolicy {
        min_loaded: entry.min_loaded,
        pin: pin.into_iter().collect::<Vec<NodeId>>(),
        idle_unload: entry.idle_unload_ms.map(Duration::from_millis),
    };
    Ok(Entry::Model(model, policy))
}
