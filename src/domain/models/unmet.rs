//! Which `[[models]]` entries cannot be met once the nodes' footprints and budgets are
//! known: a pin on a node whose budget is below the model's footprint, a `min_loaded` above
//! the nodes it fits on. The config is checked before any node reports, so these are found
//! when nodes report, and said (the log, the feed, the management API), not refused.

use std::collections::BTreeMap;
use std::fmt;

use super::plan::Engine;
use super::state::{ModelName, ModelPolicy};
use crate::domain::NodeId;
use crate::domain::inventory::Bytes;

/// A `[[models]]` entry the pool cannot meet.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Unmet {
    /// Pinned on a node whose engine's budget is below the model's footprint there.
    Pin {
        /// The model.
        model: ModelName,
        /// The node it is pinned on.
        node: NodeId,
        /// Its footprint there, in bytes.
        footprint: u64,
        /// The engine's budget, in bytes.
        budget: u64,
    },
    /// `min_loaded` is above the number of connected nodes it fits on.
    MinLoaded {
        /// The model.
        model: ModelName,
        /// Its `min_loaded`.
        min_loaded: u32,
        /// The connected nodes it may fit on (a node that does not know its footprint or
        /// budget counts).
        fits_on: u32,
    },
}

impl Unmet {
    /// The model the entry is for.
    pub fn model(&self) -> &ModelName {
        match self {
            Self::Pin { model, .. } | Self::MinLoaded { model, .. } => model,
        }
    }

    /// The node, for a pin.
    pub fn node(&self) -> Option<&NodeId> {
        match self {
            Self::Pin { node, .. } => Some(node),
            Self::MinLoaded { .. } => None,
        }
    }
}

impl fmt::Display for Unmet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Pin {
                model,
                node,
                footprint,
                budget,
            } => write!(
                f,
                "{model} is pinned on {node}, where it does not fit: its footprint ({}) is \
                 above the node's budget ({})",
                Bytes(*footprint),
                Bytes(*budget)
            ),
            Self::MinLoaded {
                model,
                min_loaded,
                fits_on,
            } => write!(
                f,
                "{model} has min_loaded = {min_loaded} but fits on {fits_on} connected \
                 node(s): the others' budgets are below its footprint"
            ),
        }
    }
}

/// The entries of `policies` that `engines` cannot meet, as far as their footprints and
/// budgets are known, in the order of the models' names.
pub fn unmet(engines: &[Engine], policies: &BTreeMap<ModelName, ModelPolicy>) -> Vec<Unmet> {
    let mut found = Vec::new();
    for (model, policy) in policies {
        let listing: Vec<&Engine> = engines
            .iter()
            .filter(|e| e.adapter == model.adapter && e.slots.contains_key(&model.target))
            .collect();
        for engine in &listing {
            if !policy.pinned_on(&engine.node) || engine.fits_at_all(&model.target) != Some(false) {
                continue;
            }
            let footprint = engine.slots[&model.target].footprint.unwrap_or(0);
            found.push(Unmet::Pin {
                model: model.clone(),
                node: engine.node.clone(),
                footprint,
                budget: engine.budget.unwrap_or(0),
            });
        }
        let too_small = listing
            .iter()
            .filter(|e| e.fits_at_all(&model.target) == Some(false))
            .count();
        let fits_on = u32::try_from(listing.len() - too_small).unwrap_or(u32::MAX);
        if too_small > 0 && fits_on < policy.min_loaded {
            found.push(Unmet::MinLoaded {
                model: model.clone(),
                min_loaded: policy.min_loaded,
                fits_on,
            });
        }
    }
    found
}
