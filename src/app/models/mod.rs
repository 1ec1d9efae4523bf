//! The model lifecycle: which model is loaded on which node's engine. It hears from the
//! run service which models runs want and where they run (`ModelDemand`), from the nodes
//! what their engines hold (their availability reports) and how commands ended; it loads
//! cold models on demand, keeps the `[[models]]` desired state (pins, `min_loaded`,
//! `idle_unload_ms`), says which entries the pool cannot meet once footprints are known,
//! refuses at once a model too large for every node, and answers operators. The decisions are the domain's
//! (`crate::domain::models::plan`); this service gathers their inputs, sends the commands
//! through the node transport and keeps what happened.

mod book;
mod commands;
pub mod config;
mod engines;
mod metrics;
mod operator;
#[cfg(test)]
mod tests;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::time::Duration;

use opentelemetry::metrics::Meter;
use tokio::sync::{Notify, broadcast};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::debug;

use self::book::{Book, Cold};
use self::metrics::ModelMetrics;
use crate::domain::models::{
    LoadReason, ModelName, ModelPolicy, NoPlace, TooLarge, Unmet, plan_cold, reconcile, too_large,
    unmet,
};
use crate::domain::routing::{ModelSeats, NodeStatus};
use crate::domain::{AdapterName, NodeId, Target};
use crate::ports::clock::now_ms;
use crate::ports::{
    FeedAction, ModelDemand, ModelEvent, ModelOutcome, NodeTransport, Registry, WaitingRuns,
};

pub use config::{LifecycleConfig, ModelEntry, policies};

/// The model lifecycle. Cheap to clone.
#[derive(Clone)]
pub struct ModelService {
    inner: Arc<Inner>,
}

struct Inner {
    registry: Arc<dyn Registry>,
    transport: Arc<dyn NodeTransport>,
    policies: BTreeMap<ModelName, ModelPolicy>,
    config: LifecycleConfig,
    book: Mutex<Book>,
    /// Something changed: reconcile now.
    wake: Notify,
    /// A run left a node: an unload waiting for a model's runs looks again.
    run_left: Notify,
    /// Set once any node reported a managed engine: until then the run service's calls
    /// return at once.
    managed_seen: AtomicBool,
    runs: OnceLock<Arc<dyn WaitingRuns>>,
    /// The loads and unloads as they happen; taken when the lifecycle stops, which ends
    /// every follower's feed.
    feed: Feed,
    metrics: ModelMetrics,
    tasks: TaskTracker,
}

fn lock(book: &Mutex<Book>) -> MutexGuard<'_, Book> {
    book.lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Where loads and unloads are told as they happen, until the lifecycle stops.
type Feed = Mutex<Option<broadcast::Sender<ModelEvent>>>;

fn feed(feed: &Feed) -> MutexGuard<'_, Option<broadcast::Sender<ModelEvent>>> {
    feed.lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl ModelService {
    /// A lifecycle keeping `policies`, reading what nodes hold from `registry` and
    /// sending commands through `transport`.
    pub fn new(
        registry: Arc<dyn Registry>,
        transport: Arc<dyn NodeTransport>,
        policies: BTreeMap<ModelName, ModelPolicy>,
        config: LifecycleConfig,
        meter: &Meter,
    ) -> Self {
        Self {
            inner: Arc::new(Inner {
                registry,
                transport,
                policies,
                config,
                book: Mutex::new(Book::default()),
                wake: Notify::new(),
                run_left: Notify::new(),
                managed_seen: AtomicBool::new(false),
                runs: OnceLock::new(),
                feed: Mutex::new(Some(broadcast::channel(256).0)),
                metrics: ModelMetrics::new(meter),
                tasks: TaskTracker::new(),
            }),
        }
    }

    /// Tells the run service, from now on, when every load of a model wanted by waiting
    /// runs failed (once; a second call is ignored).
    pub fn attach_runs(&self, runs: Arc<dyn WaitingRuns>) {
        let _ = self.inner.runs.set(runs);
    }

    /// Reconciles whenever something changed and every `reconcile_interval_ms`, until
    /// `stop`; then waits for the commands in progress to end.
    pub async fn run(&self, stop: CancellationToken) {
        let interval = self.inner.config.reconcile_interval();
        loop {
            tokio::select! {
                () = stop.cancelled() => break,
                () = self.inner.wake.notified() => {}
                () = tokio::time::sleep(interval) => {}
            }
            self.reconcile_now();
        }
        self.inner.tasks.close();
        self.inner.tasks.wait().await;
        feed(&self.inner.feed).take();
    }

    /// A node registered, changed what it reports, or was drained: records what its
    /// managed engines hold, and reconciles when it has any.
    pub fn node_changed(&self, node: &NodeId) {
        let connected = self.inner.registry.get(node.as_str());
        let managed = {
            let mut book = lock(&self.inner.book);
            book.forget_node(node);
            connected.is_some_and(|n| engines::observe(&mut book, &n))
        };
        if managed {
            self.inner.managed_seen.store(true, Ordering::Relaxed);
            self.inner.wake.notify_one();
        }
    }

    /// A node's connection ended: what it held is forgotten (unless a new connection of
    /// it took over already).
    pub fn node_left(&self, node: &NodeId) {
        if self.inner.registry.is_connected(node) {
            return self.node_changed(node);
        }
        let mut book = lock(&self.inner.book);
        book.forget_node(node);
        // Its commands' waits end now: it will not answer them.
        book.pending.retain(|_, (n, _)| n != node);
    }

    /// A node answered a model command.
    pub fn outcome(&self, outcome: ModelOutcome) {
        let waiting = lock(&self.inner.book).pending.remove(&outcome.command_id);
        match waiting {
            Some((_, sender)) => {
                let _ = sender.send(outcome);
            }
            None => debug!(
                command_id = outcome.command_id,
                "an outcome for no pending model command"
            ),
        }
    }

    /// Plans against the pool as it is now and starts each step.
    fn reconcile_now(&self) {
        let now = Instant::now();
        let (steps, unplaced, unmet) = {
            let mut book = lock(&self.inner.book);
            // A cold request nobody can still be waiting for is forgotten; a new one brings
            // its model back.
            let patience = self.inner.config.cold_start_timeout();
            book.cold
                .retain(|_, cold| now.duration_since(cold.since) < patience);
            if book.managed_nodes.is_empty() && book.cold.is_empty() {
                return;
            }
            let nodes = engines::managed(&self.inner.registry, &book);
            let engines = engines::of(&nodes, &book);
            let mut demands: Vec<(&ModelName, &Cold)> = book.cold.iter().collect();
            demands.sort_by_key(|(_, cold)| cold.since);
            let demands: Vec<_> = demands
                .into_iter()
                .map(|(model, cold)| (model.clone(), cold.tried.clone()))
                .collect();
            let policies = &self.inner.policies;
            let (mut steps, unplaced) = plan_cold(&engines, &demands, policies, now.into_std());
            steps.extend(reconcile(&engines, policies, now.into_std()));
            let found = unmet(&engines, policies);
            let new: Vec<Unmet> = found
                .iter()
                .filter(|u| !book.unmet.contains(u))
                .cloned()
                .collect();
            book.unmet = found;
            (steps, unplaced, new)
        };
        for entry in unmet {
            self.warn_unmet(&entry);
        }
        for (model, why) in unplaced {
            self.unplaced(&model, why);
        }
        for step in steps {
            self.start(step);
        }
    }

    /// A cold model no node can load now: when its loads failed everywhere it could go,
    /// its waiting runs end with the last engine's reason; when no node can load it (any
    /// more) or every one is full, the runs wait on (room may free, a node may come).
    fn unplaced(&self, model: &ModelName, why: NoPlace) {
        if let NoPlace::TooLarge(refusal) = why {
            lock(&self.inner.book).cold.remove(model);
            if let Some(runs) = self.inner.runs.get() {
                runs.too_large(model, refusal);
            }
            return;
        }
        let failure = {
            let mut book = lock(&self.inner.book);
            let given_up = why == NoPlace::Nowhere
                && book.cold.get(model).is_some_and(|c| !c.tried.is_empty());
            if !given_up {
                return;
            }
            book.cold.remove(model).and_then(|cold| cold.last_failure)
        };
        let reason = failure.unwrap_or_else(|| "every load failed".to_owned());
        if let Some(runs) = self.inner.runs.get() {
            runs.load_failed(model, &reason);
        }
    }
}

impl ModelService {
    /// Says a `[[models]]` entry the pool cannot meet, once (until it can again): the log and
    /// the feed; the management API lists it with the model.
    fn warn_unmet(&self, entry: &Unmet) {
        let reason = match entry {
            Unmet::Pin { .. } => LoadReason::Pinned,
            Unmet::MinLoaded { .. } => LoadReason::MinLoaded,
        };
        self.tell(ModelEvent {
            at_ms: now_ms(),
            model: entry.model().clone(),
            node: entry.node().cloned(),
            action: FeedAction::Warning,
            reason: reason.as_str().to_owned(),
            outcome: "unmet",
            message: entry.to_string(),
            took_ms: None,
            fit: None,
        });
    }
}

impl ModelDemand for ModelService {
    fn wanted(&self, adapter: &AdapterName, target: &Target) -> Option<Duration> {
        if !self.inner.managed_seen.load(Ordering::Relaxed) {
            return None;
        }
        let model = ModelName::new(adapter.clone(), target.clone());
        let mut book = lock(&self.inner.book);
        if !book.loadable.contains_key(&model) {
            return None;
        }
        if let std::collections::btree_map::Entry::Vacant(entry) = book.cold.entry(model) {
            entry.insert(Cold {
                since: Instant::now(),
                tried: Vec::new(),
                last_failure: None,
            });
            self.inner.wake.notify_one();
        }
        Some(self.inner.config.cold_start_timeout())
    }

    fn placed(&self, node: &NodeId, adapter: &AdapterName, target: &Target) {
        if self.inner.managed_seen.load(Ordering::Relaxed) {
            let model = ModelName::new(adapter.clone(), target.clone());
            lock(&self.inner.book).placed(node, model, Instant::now());
        }
    }

    fn left(&self, node: &NodeId, adapter: &AdapterName, target: &Target) {
        if self.inner.managed_seen.load(Ordering::Relaxed) {
            let model = ModelName::new(adapter.clone(), target.clone());
            let cold_waiting = {
                let mut book = lock(&self.inner.book);
                book.left(node, &model, Instant::now());
                !book.cold.is_empty()
            };
            self.inner.run_left.notify_waiters();
            // A cold model waiting for a full engine may make room now (a model whose
            // stream just ended may sleep or unload): decide at once, not at the next tick.
            if cold_waiting {
                self.inner.wake.notify_one();
            }
        }
    }

    fn too_large(&self, adapter: &AdapterName, target: &Target) -> Option<TooLarge> {
        if !self.inner.managed_seen.load(Ordering::Relaxed) {
            return None;
        }
        let model = ModelName::new(adapter.clone(), target.clone());
        let book = lock(&self.inner.book);
        let listing: Vec<_> = book
            .loadable
            .get(&model)?
            .iter()
            .filter_map(|id| self.inner.registry.get(id.as_str()))
            .collect();
        too_large(&engines::of(&listing, &book), &model)
    }

    fn model_seats(
        &self,
        nodes: &[NodeStatus],
        adapter: &AdapterName,
        target: &Target,
    ) -> Vec<Option<ModelSeats>> {
        if !self.inner.managed_seen.load(Ordering::Relaxed) {
            return Vec::new();
        }
        let cap = |node: &NodeStatus| {
            let managed = node.availability.as_ref().and_then(|a| a.managed(adapter));
            managed.map_or(0, |m| m.parallel)
        };
        // No allocation, no lock for a model no node caps.
        if nodes.iter().all(|node| cap(node) == 0) {
            return Vec::new();
        }
        let model = ModelName::new(adapter.clone(), target.clone());
        let book = lock(&self.inner.book);
        nodes
            .iter()
            .map(|node| {
                let parallel = cap(node);
                (parallel > 0).then(|| ModelSeats {
                    running: book
                        .use_of(node.record.id(), &model)
                        .map_or(0, |used| used.in_flight),
                    parallel,
                })
            })
            .collect()
    }
}
