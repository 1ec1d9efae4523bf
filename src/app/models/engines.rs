//! The pool as the lifecycle's decisions see it: each connected node's managed engines,
//! their targets' states with the edge's own commands in progress applied, and each
//! target's use there.

use std::sync::Arc;

use tokio::time::Instant;

use super::book::Book;
use crate::domain::models::{Engine, LoadState, ModelAction, ModelName, Slot, TargetLoad};
use crate::ports::{ConnectedNode, Registry};

/// Records what `node`'s managed engines hold (what may be loaded there, and each
/// target's state); returns whether it has any.
pub(super) fn observe(book: &mut Book, node: &ConnectedNode) -> bool {
    let Some(availability) = node
        .availability
        .as_ref()
        .filter(|_| node.can_manage_models)
    else {
        return false;
    };
    let id = node.record.id();
    let mut managed = false;
    for (adapter, engine) in availability.managed_adapters() {
        for (target, load) in &engine.targets {
            if !node.record.serves(adapter, target) {
                continue;
            }
            let model = ModelName::new(adapter.clone(), target.clone());
            book.see(id, &model, load.state, None);
            book.loadable.entry(model).or_default().insert(id.clone());
            managed = true;
        }
    }
    if managed {
        book.managed_nodes.insert(id.clone());
    }
    managed
}

/// The connected nodes with managed engines.
pub(super) fn managed(registry: &Arc<dyn Registry>, book: &Book) -> Vec<ConnectedNode> {
    book.managed_nodes
        .iter()
        .filter_map(|id| registry.get(id.as_str()))
        .collect()
}

/// The engines of `nodes` for a plan.
pub(super) fn of(nodes: &[ConnectedNode], book: &Book) -> Vec<Engine> {
    let mut engines = Vec::new();
    for node in nodes {
        let Some(availability) = node.availability.as_ref() else {
            continue;
        };
        let id = node.record.id();
        for (adapter, managed) in availability.managed_adapters() {
            let slots = managed
                .targets
                .iter()
                .filter(|(target, _)| node.record.serves(adapter, target))
                .map(|(target, load)| {
                    let model = ModelName::new(adapter.clone(), target.clone());
                    (target.clone(), slot(book, id, &model, load))
                })
                .collect();
            engines.push(Engine {
                node: id.clone(),
                adapter: adapter.clone(),
                capacity: managed.capacity,
                accepts_loads: node.can_manage_models && !node.drained,
                slots,
                budget: managed.budget.as_ref().map(|b| b.bytes),
            });
        }
    }
    engines
}

/// One target's slot: its reported state under the command in progress, its runs in
/// flight, since when it has been idle (its last use, or when it was seen loaded), whether
/// its node keeps it loaded of its own, and its footprint.
fn slot(book: &Book, node: &crate::domain::NodeId, model: &ModelName, load: &TargetLoad) -> Slot {
    // A command in progress holds the target's place until it ends, and the target may be
    // neither loaded again nor chosen to make room meanwhile: as a load in progress.
    let state = match book.busy.get(&(node.clone(), model.clone())) {
        Some(ModelAction::Load | ModelAction::Unload) => LoadState::Loading,
        None => load.state,
    };
    let seen = book
        .seen
        .get(&(node.clone(), model.clone()))
        .map(|s| s.since);
    let used = book.use_of(node, model);
    let idle_since = [seen, used.map(|u| u.last_used)]
        .into_iter()
        .flatten()
        .max()
        .unwrap_or_else(Instant::now);
    Slot {
        state,
        in_flight: used.map_or(0, |u| u.in_flight),
        idle_since: idle_since.into_std(),
        stays: load.stays_loaded,
        footprint: load.footprint.map(|f| f.bytes),
    }
}
