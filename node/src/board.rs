//! The availability board: what each working adapter's engine can serve now, as its prober
//! (or a model command) last found it, and the LoRAs it applies, published to the connection
//! so it tells the edge.
//!
//! The engines' observers — the plain prober ([`crate::probe`]), the managed engines'
//! ([`crate::openai::engine_models`]) and each adapter's LoRA table
//! ([`crate::openai::loras`]) — report here, and only here; none knows the others,
//! nor the adapters that hold them. Which adapters are on the board is set by the adapter
//! set ([`crate::adapters`]) when the edge configures them. While the node drains, the board
//! publishes nothing available, so the edge stops routing to it.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use edge::domain::models::ManagedAdapter;
use edge::domain::{AdapterName, Availability, NodeLora, Target};
use tokio::sync::{Notify, watch};

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

#[derive(Debug, Default)]
struct Inner {
    /// The latest finding of each working adapter; `None` before its first probe.
    found: HashMap<String, Option<Finding>>,
    /// Each working adapter's LoRAs, as its table last had them.
    loras: HashMap<String, Vec<NodeLora>>,
    draining: bool,
}

/// Every working adapter's latest finding, and what they add up to (a cheap-to-clone
/// handle).
#[derive(Debug, Clone)]
pub struct Board {
    inner: Arc<Mutex<Inner>>,
    published: Arc<watch::Sender<Availability>>,
    probed: Arc<Notify>,
}

impl Default for Board {
    fn default() -> Self {
        Self {
            inner: Arc::default(),
            published: Arc::new(watch::Sender::new(Availability::default())),
            probed: Arc::default(),
        }
    }
}

impl Board {
    fn inner(&self) -> MutexGuard<'_, Inner> {
        self.inner
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// From now on the board holds `adapters`, none of them probed yet; what it held
    /// before is dropped (and no longer published).
    pub fn hold(&self, adapters: impl IntoIterator<Item = String>) {
        let mut inner = self.inner();
        inner.found = adapters.into_iter().map(|name| (name, None)).collect();
        inner.loras.clear();
        self.publish(&inner);
    }

    /// `adapter`'s LoRAs now (ignored for an adapter the board does not hold); told to the
    /// edge with its targets once it has been probed.
    pub fn set_loras(&self, adapter: &str, loras: Vec<NodeLora>) {
        let mut inner = self.inner();
        if inner.found.contains_key(adapter) {
            inner.loras.insert(adapter.to_owned(), loras);
            self.publish(&inner);
        }
    }

    /// A prober's latest finding for `adapter` (ignored for an adapter the board does not
    /// hold).
    pub fn report(&self, adapter: &str, finding: Finding) {
        let mut inner = self.inner();
        if let Some(found) = inner.found.get_mut(adapter) {
            *found = Some(finding);
        }
        self.publish(&inner);
        drop(inner);
        self.probed.notify_waiters();
    }

    /// Whether `adapter` serves `target` now: `None` before its first probe (or for an
    /// adapter the board does not hold).
    pub fn serves(&self, adapter: &str, target: &str) -> Option<bool> {
        let inner = self.inner();
        let found = inner.found.get(adapter)?.as_ref()?;
        Some(found.targets.iter().any(|t| t == target))
    }

    /// Waits (at most `limit`) until every adapter on the board has been probed once.
    pub async fn wait_probed(&self, limit: Duration) {
        let all_probed = async {
            loop {
                let probed = self.probed.notified();
                tokio::pin!(probed);
                probed.as_mut().enable();
                let waiting = self.inner().found.values().any(Option::is_none);
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

    fn publish(&self, inner: &Inner) {
        let mut pairs = Vec::new();
        let mut windows = Vec::new();
        let mut managed = Vec::new();
        for (name, found) in &inner.found {
            let Some(found) = found else {
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
        let availability = inner
            .loras
            .iter()
            .filter(|(name, _)| {
                !inner.draining && inner.found.get(*name).is_some_and(Option::is_some)
            })
            .filter_map(|(name, loras)| Some((AdapterName::parse(name).ok()?, loras.clone())))
            .fold(availability, |availability, (adapter, loras)| {
                availability.with_loras(adapter, loras)
            });
        self.published.send_if_modified(|current| {
            let changed = *current != availability;
            *current = availability;
            changed
        });
    }
}
