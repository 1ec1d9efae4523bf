//! The adapters the edge configured, and the availability board: which `adapter + target`
//! pairs this node can serve now (and, for a managed adapter, every target's load state),
//! published to the connection so it tells the edge.
//!
//! Rebuilt only when a registration brings a different adapter config; each adapter's
//! prober runs as an owned task until the next rebuild or the node's exit. While the node
//! drains, the board publishes nothing available, so the edge stops routing to it.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use edge::client::ReceivedAdapter;
use edge::domain::models::ManagedAdapter;
use edge::domain::{AdapterName, Availability, Target};
use tokio::sync::{Notify, watch};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::openai::{self, OpenAiAdapter};
use super::probe::probe_loop;

/// What the node knows of an adapter a run asks for.
#[derive(Debug, Clone)]
pub enum Lookup {
    /// The edge configured no such adapter.
    Unknown,
    /// It is configured but cannot work (bad settings, unknown kind).
    Broken(String),
    /// It works; `available` is `Some(false)` when its prober says the target is not served
    /// now, `None` before the first probe.
    Ready {
        /// The adapter.
        adapter: Arc<OpenAiAdapter>,
        /// Whether the target is available now, when known.
        available: Option<bool>,
    },
}

/// What a prober found an adapter's engine can serve now.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Finding {
    /// The targets it serves now.
    pub targets: Vec<String>,
    /// The context windows of those targets, where its engine (or its settings) said.
    pub windows: BTreeMap<String, u32>,
    /// For a managed adapter whose engine answered: its capacity and every target's state.
    pub managed: Option<ManagedAdapter>,
}

#[derive(Debug)]
enum Slot {
    Ready {
        adapter: Arc<OpenAiAdapter>,
        /// The latest finding; `None` before the first probe.
        found: Option<Finding>,
    },
    Broken(String),
}

#[derive(Debug, Default)]
struct Inner {
    config: Vec<ReceivedAdapter>,
    slots: HashMap<String, Slot>,
    draining: bool,
    probes: CancellationToken,
}

/// The configured adapters and what they can serve now (a cheap-to-clone handle).
#[derive(Debug, Clone)]
pub struct AdapterSet {
    inner: Arc<Mutex<Inner>>,
    published: Arc<watch::Sender<Availability>>,
    probed: Arc<Notify>,
}

impl Default for AdapterSet {
    fn default() -> Self {
        Self {
            inner: Arc::default(),
            published: Arc::new(watch::Sender::new(Availability::default())),
            probed: Arc::default(),
        }
    }
}

impl AdapterSet {
    fn inner(&self) -> MutexGuard<'_, Inner> {
        self.inner
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Applies the adapter config of a registration; unchanged config keeps everything as it
    /// is (probers, last known availability). New probers are tracked by `tasks`.
    pub fn configure(&self, config: &[ReceivedAdapter], tasks: &TaskTracker) {
        let mut inner = self.inner();
        if inner.config == config && !inner.slots.is_empty() {
            return;
        }
        inner.probes.cancel();
        inner.probes = CancellationToken::new();
        inner.config = config.to_vec();
        inner.slots.clear();
        for adapter in config {
            let slot = match build(adapter) {
                Ok(built) => {
                    let built = Arc::new(built);
                    tasks.spawn(probe_loop(
                        Arc::clone(&built),
                        self.clone(),
                        inner.probes.clone(),
                    ));
                    Slot::Ready {
                        adapter: built,
                        found: None,
                    }
                }
                Err(problem) => {
                    tracing::error!(adapter = %adapter.name, %problem, "adapter cannot run; its targets are not offered");
                    Slot::Broken(problem)
                }
            };
            inner.slots.insert(adapter.name.clone(), slot);
        }
        self.publish(&inner);
    }

    /// What the node knows of `adapter` and its `target`.
    pub fn lookup(&self, adapter: &str, target: &str) -> Lookup {
        match self.inner().slots.get(adapter) {
            None => Lookup::Unknown,
            Some(Slot::Broken(problem)) => Lookup::Broken(problem.clone()),
            Some(Slot::Ready { adapter, found }) => Lookup::Ready {
                adapter: Arc::clone(adapter),
                available: found
                    .as_ref()
                    .map(|found| found.targets.iter().any(|t| t == target)),
            },
        }
    }

    /// A prober's latest finding for `adapter`.
    pub fn report(&self, adapter: &str, finding: Finding) {
        let mut inner = self.inner();
        if let Some(Slot::Ready { found, .. }) = inner.slots.get_mut(adapter) {
            *found = Some(finding);
        }
        self.publish(&inner);
        drop(inner);
        self.probed.notify_waiters();
    }

    /// Waits (at most `limit`) until every working adapter has been probed once.
    pub async fn wait_probed(&self, limit: Duration) {
        let all_probed = async {
            loop {
                let probed = self.probed.notified();
                tokio::pin!(probed);
                probed.as_mut().enable();
                let waiting = self
                    .inner()
                    .slots
                    .values()
                    .any(|s| matches!(s, Slot::Ready { found: None, .. }));
                if !waiting {
                    return;
                }
                probed.await;
            }
        };
        let _ = tokio::time::timeout(limit, all_probed).await;
    }

    /// Follows what the node can serve now.
    pub fn subscribe(&self) -> watch::Receiver<Availability> {
        self.published.subscribe()
    }

    /// Offers nothing from now on (the node is shutting down).
    pub fn set_draining(&self) {
        let mut inner = self.inner();
        inner.draining = true;
        self.publish(&inner);
    }

    /// Stops every prober.
    pub fn stop(&self) {
        self.inner().probes.cancel();
    }

    fn publish(&self, inner: &Inner) {
        let mut pairs = Vec::new();
        let mut windows = Vec::new();
        let mut managed = Vec::new();
        for (name, slot) in &inner.slots {
            let Slot::Ready {
                found: Some(found), ..
            } = slot
            else {
                continue;
            };
            let Ok(adapter) = AdapterName::parse(name) else {
                continue;
            };
            if inner.draining {
                continue;
            }
            for name in &found.targets {
                let Ok(target) = Target::parse(name) else {
                    continue;
                };
                if let Some(window) = found.windows.get(name) {
                    windows.push((adapter.clone(), target.clone(), *window));
                }
                pairs.push((adapter.clone(), target));
            }
            if let Some(lifecycle) = &found.managed {
                managed.push((adapter, lifecycle.clone()));
            }
        }
        let availability = windows.into_iter().fold(
            Availability::new(pairs),
            |availability, (adapter, target, window)| {
                availability.with_context_window(&adapter, &target, window)
            },
        );
        let availability = managed
            .into_iter()
            .fold(availability, |availability, (adapter, lifecycle)| {
                availability.with_managed(adapter, lifecycle)
            });
        self.published.send_if_modified(|current| {
            let changed = *current != availability;
            *current = availability;
            changed
        });
    }
}

fn build(config: &ReceivedAdapter) -> Result<OpenAiAdapter, String> {
    let kind = config
        .settings
        .get("kind")
        .map_or(openai::KIND, String::as_str);
    if kind != openai::KIND {
        return Err(format!(
            "unknown adapter kind {kind:?} (this node runs \"{}\")",
            openai::KIND
        ));
    }
    OpenAiAdapter::new(config)
}
