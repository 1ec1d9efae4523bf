//! The lifecycle as operators see it ([`ManageModels`]): every model some node serves or
//! can load, where and in what state, the feed of loads and unloads, and loads and unloads
//! on request.

use std::collections::BTreeMap;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use async_trait::async_trait;
use tokio::sync::broadcast;
use tokio::time::Instant;

use super::book::Book;
use super::commands::{CommandError, Load};
use super::{ModelService, engines, lock};
use crate::domain::NodeId;
use crate::domain::models::{
    LoadReason, LoadState, ManagedAdapter, ModelAction, ModelName, UnloadReason, place_load,
};
use crate::ports::{
    ConnectedNode, ManageModels, ModelCommandError, ModelEvent, ModelOnNode, ModelView,
};

fn unix_ms(at: SystemTime) -> u64 {
    at.duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// `model` on `node` as the book and the node's report say.
fn on_node(book: &Book, node: &ConnectedNode, model: &ModelName) -> Option<ModelOnNode> {
    let id = node.record.id();
    let adapter = node
        .availability
        .as_ref()
        .and_then(|a| a.managed(&model.adapter))
        .filter(|_| node.can_manage_models);
    let managed = adapter.and_then(|m| m.targets.get(&model.target));
    let budget = adapter.and_then(|m| m.budget.as_ref()).map(|b| b.bytes);
    let serving = node.serves_now(&model.adapter, &model.target);
    let (state, progress_percent, failure) = match managed {
        Some(load) => (load.state, load.progress_percent, load.failure.clone()),
        None if serving => (LoadState::Loaded, 0, String::new()),
        None => return None,
    };
    let key = (id.clone(), model.clone());
    let seen = book.seen.get(&key);
    let used = book.use_of(id, model);
    Some(ModelOnNode {
        node: id.clone(),
        state,
        managed: managed.is_some(),
        progress_percent,
        failure,
        since_ms: unix_ms(seen.map_or(node.connected_since, |s| s.since_wall)),
        in_flight: used.map_or(0, |u| u.in_flight),
        last_used_ms: used.map(|u| unix_ms(u.last_used_wall)),
        reason: seen.map(|s| s.reason.clone()).unwrap_or_default(),
        command: book.busy.get(&key).copied(),
        footprint: managed.and_then(|load| load.footprint),
        budget,
        room: adapter.and_then(ManagedAdapter::room),
        decided: seen.and_then(|s| s.fit),
    })
}

/// An operator's command as its task ended.
fn finished(
    ended: Result<Result<(), CommandError>, tokio::task::JoinError>,
) -> Result<(), ModelCommandError> {
    match ended {
        Ok(done) => done.map_err(|error| ModelCommandError::Failed(error.to_string())),
        Err(error) => Err(ModelCommandError::Failed(format!(
            "the command's task ended: {error}"
        ))),
    }
}

impl ModelService {
    /// The connected node named `name`, which must manage `model`'s adapter and list it.
    fn managing(&self, model: &ModelName, name: &str) -> Result<ConnectedNode, ModelCommandError> {
        let node = self
            .inner
            .registry
            .get(name)
            .ok_or_else(|| ModelCommandError::UnknownNode(name.to_owned()))?;
        if !node.can_load(&model.adapter, &model.target) {
            return Err(ModelCommandError::NotManaged {
                node: node.record.id().to_string(),
                model: model.to_string(),
                why: "it is drained, or its engine does not load and unload it on command"
                    .to_owned(),
            });
        }
        Ok(node)
    }

    /// Waits up to `drain` (or not at all) for `model`'s runs on `node` to end; `Err` with
    /// how many are left.
    async fn runs_ended(
        &self,
        node: &NodeId,
        model: &ModelName,
        drain: Option<Duration>,
    ) -> Result<(), u32> {
        let until = Instant::now() + drain.unwrap_or_default();
        loop {
            let left = self.inner.run_left.notified();
            let in_flight = lock(&self.inner.book)
                .use_of(node, model)
                .map_or(0, |u| u.in_flight);
            if in_flight == 0 {
                return Ok(());
            }
            if drain.is_none() || Instant::now() >= until {
                return Err(in_flight);
            }
            let _ = tokio::time::timeout_at(until, left).await;
        }
    }
}

#[async_trait]
impl ManageModels for ModelService {
    fn models(&self) -> Vec<ModelView> {
        let nodes = self.inner.registry.snapshot();
        let book = lock(&self.inner.book);
        let mut names: BTreeMap<ModelName, ()> = BTreeMap::new();
        for node in &nodes {
            for adapter in node.record.adapters() {
                for target in adapter.targets() {
                    let model = ModelName::new(adapter.name().clone(), target.clone());
                    names.insert(model, ());
                }
            }
        }
        names
            .into_keys()
            .filter_map(|model| {
                let on: Vec<ModelOnNode> = nodes
                    .iter()
                    .filter_map(|n| on_node(&book, n, &model))
                    .collect();
                let policy = self.inner.policies.get(&model).cloned();
                let warnings = book
                    .unmet
                    .iter()
                    .filter(|u| u.model() == &model)
                    .map(ToString::to_string)
                    .collect();
                (!on.is_empty() || policy.is_some()).then_some(ModelView {
                    model,
                    policy,
                    nodes: on,
                    warnings,
                })
            })
            .collect()
    }

    fn model_events(&self) -> (Vec<ModelEvent>, broadcast::Receiver<ModelEvent>) {
        let book = lock(&self.inner.book);
        // After the stop: a receiver whose feed has ended already.
        let receiver = match super::feed(&self.inner.feed).as_ref() {
            Some(feed) => feed.subscribe(),
            None => broadcast::channel(1).1,
        };
        (book.history.iter().cloned().collect(), receiver)
    }

    async fn load(&self, model: &ModelName, node: &str) -> Result<(), ModelCommandError> {
        let node = self.managing(model, node)?;
        let id = node.record.id().clone();
        let placement = {
            let mut book = lock(&self.inner.book);
            let engines = engines::of(std::slice::from_ref(&node), &book);
            let holds = engines.iter().any(|e| {
                e.slots
                    .get(&model.target)
                    .is_some_and(|s| s.state.holds_a_place())
            });
            if holds {
                return Ok(());
            }
            let placement =
                place_load(&engines, model, &self.inner.policies, &[]).map_err(|why| {
                    ModelCommandError::Conflict(format!("{model} cannot go on {id}: {why}"))
                })?;
            book.busy
                .insert((id.clone(), model.clone()), ModelAction::Load);
            let evict: Vec<ModelName> = placement
                .evict
                .into_iter()
                .map(|t| ModelName::new(model.adapter.clone(), t))
                .collect();
            for victim in &evict {
                book.busy
                    .insert((id.clone(), victim.clone()), ModelAction::Unload);
            }
            (evict, placement.fit)
        };
        // On the service's own task: a caller that goes away does not cut the command short.
        let (service, model) = (self.clone(), model.clone());
        let task = self.inner.tasks.spawn(async move {
            let (evict, fit) = placement;
            let load = Load {
                reason: LoadReason::Operator,
                fit,
            };
            let loaded = service.load(&id, &model, &evict, load).await;
            service.inner.wake.notify_one();
            loaded
        });
        finished(task.await)
    }

    async fn unload(
        &self,
        model: &ModelName,
        node: &str,
        drain: Option<Duration>,
    ) -> Result<(), ModelCommandError> {
        let node = self.managing(model, node)?;
        let id = node.record.id().clone();
        if self
            .inner
            .policies
            .get(model)
            .is_some_and(|p| p.pinned_on(&id))
        {
            let message = format!("{model} is pinned on {id} (`[[models]] pin`)");
            return Err(ModelCommandError::Conflict(message));
        }
        // While it drains, no new run of it is placed there.
        let registry = &self.inner.registry;
        let draining = drain.is_some();
        if draining {
            registry.set_withheld(&id, &model.adapter, &model.target, true);
            if let Some(runs) = self.inner.runs.get() {
                runs.placements_settled();
            }
        }
        if let Err(in_flight) = self.runs_ended(&id, model, drain).await {
            if draining {
                registry.set_withheld(&id, &model.adapter, &model.target, false);
            }
            let message = format!(
                "{in_flight} run(s) of {model} in flight on {id}; unload with a drain deadline to wait for them"
            );
            return Err(ModelCommandError::Conflict(message));
        }
        lock(&self.inner.book)
            .busy
            .insert((id.clone(), model.clone()), ModelAction::Unload);
        let (service, model) = (self.clone(), model.clone());
        let task = self.inner.tasks.spawn(async move {
            let unloaded = service
                .unload(&id, &model, UnloadReason::Operator.as_str())
                .await;
            service.inner.wake.notify_one();
            unloaded
        });
        finished(task.await)
    }
}
