//! The adapters the edge configured: each one built from its config and its budget on the
//! node's devices (or found broken, and why: a misconfigured budget among them), its prober
//! started, and its engine's availability put on the board ([`crate::board`]), which tells
//! the edge.
//!
//! Rebuilt only when a registration brings a different adapter config; each adapter's
//! prober runs as an owned task until the next rebuild or the node's exit.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};

use edge::client::ReceivedAdapter;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use edge::domain::Inventory;

use crate::board::Board;
use crate::budget::{AdapterBudget, BudgetError, budgets};
use crate::openai::{self, AdapterError, OpenAiAdapter};
use crate::probe::probe_loop;

/// Why a configured adapter cannot run; its targets are not offered, and a run or a model
/// command for it is answered with this (`adapter_misconfigured`).
#[derive(Debug, thiserror::Error)]
pub enum Misconfigured {
    /// The `kind` setting names an adapter this node does not have.
    #[error("unknown adapter kind {kind:?} (this node runs \"{}\")", openai::KIND)]
    UnknownKind {
        /// The kind named.
        kind: String,
    },
    /// The `openai` adapter cannot be built from its settings.
    #[error(transparent)]
    OpenAi(#[from] AdapterError),
    /// Its `memory` or `devices` cannot be met on this node's devices (or adapters sharing
    /// a device budget more than it has).
    #[error(transparent)]
    Budget(#[from] BudgetError),
}

/// What the node knows of an adapter a run asks for.
#[derive(Debug, Clone)]
pub enum Lookup {
    /// The edge configured no such adapter.
    Unknown,
    /// It is configured but cannot work (bad settings, unknown kind).
    Broken(Arc<Misconfigured>),
    /// It works; `available` is `Some(false)` when its prober says the target is not served
    /// now, `None` before the first probe.
    Ready {
        /// The adapter.
        adapter: Arc<OpenAiAdapter>,
        /// Whether the target is available now, when known.
        available: Option<bool>,
    },
}

#[derive(Debug)]
enum Slot {
    Ready(Arc<OpenAiAdapter>),
    Broken(Arc<Misconfigured>),
}

#[derive(Debug, Default)]
struct Inner {
    config: Vec<ReceivedAdapter>,
    slots: HashMap<String, Slot>,
    probes: CancellationToken,
}

/// The configured adapters and what they can serve now (a cheap-to-clone handle).
#[derive(Debug, Clone, Default)]
pub struct AdapterSet {
    inner: Arc<Mutex<Inner>>,
    board: Board,
}

impl AdapterSet {
    fn inner(&self) -> MutexGuard<'_, Inner> {
        self.inner
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Applies the adapter config of a registration, each adapter's budget read against
    /// `inventory` (the node's devices); unchanged config keeps everything as it is (probers,
    /// last known availability). New probers are tracked by `tasks`.
    pub fn configure(
        &self,
        config: &[ReceivedAdapter],
        inventory: &Inventory,
        tasks: &TaskTracker,
    ) {
        let mut inner = self.inner();
        if inner.config == config && !inner.slots.is_empty() {
            return;
        }
        inner.probes.cancel();
        inner.probes = CancellationToken::new();
        inner.config = config.to_vec();
        let mut budgets = budgets(config, inventory);
        inner.slots = config
            .iter()
            .map(|adapter| {
                let budget = budgets.remove(&adapter.name).unwrap_or(Ok(None));
                let slot = match budget.map_err(Misconfigured::from).and_then(|budget| build(adapter, budget)) {
                    Ok(built) => Slot::Ready(Arc::new(built)),
                    Err(problem) => {
                        tracing::error!(adapter = %adapter.name, %problem, "adapter cannot run; its targets are not offered");
                        Slot::Broken(Arc::new(problem))
                    }
                };
                (adapter.name.clone(), slot)
            })
            .collect();
        let working = inner.slots.iter().filter_map(|(name, slot)| match slot {
            Slot::Ready(_) => Some(name.clone()),
            Slot::Broken(_) => None,
        });
        // On the board before its prober can report.
        self.board.hold(working);
        for slot in inner.slots.values() {
            if let Slot::Ready(adapter) = slot {
                let prober = probe_loop(
                    Arc::clone(adapter),
                    self.board.clone(),
                    inner.probes.clone(),
                );
                tasks.spawn(prober);
            }
        }
    }

    /// What the node knows of `adapter` and its `target`.
    pub fn lookup(&self, adapter: &str, target: &str) -> Lookup {
        let ready = match self.inner().slots.get(adapter) {
            None => return Lookup::Unknown,
            Some(Slot::Broken(problem)) => return Lookup::Broken(Arc::clone(problem)),
            Some(Slot::Ready(ready)) => Arc::clone(ready),
        };
        Lookup::Ready {
            adapter: ready,
            available: self.board.serves(adapter, target),
        }
    }

    /// The board the adapters' probers report to: what the node can serve now.
    pub fn board(&self) -> &Board {
        &self.board
    }

    /// Stops every prober.
    pub fn stop(&self) {
        self.inner().probes.cancel();
    }
}

/// The adapter `config` describes, with `budget`.
///
/// # Errors
/// [`Misconfigured::UnknownKind`] for a kind this node does not run;
/// [`Misconfigured::OpenAi`] when the `openai` adapter cannot be built.
fn build(
    config: &ReceivedAdapter,
    budget: Option<AdapterBudget>,
) -> Result<OpenAiAdapter, Misconfigured> {
    let kind = config
        .settings
        .get("kind")
        .map_or(openai::KIND, String::as_str);
    if kind != openai::KIND {
        return Err(Misconfigured::UnknownKind {
            kind: kind.to_owned(),
        });
    }
    Ok(OpenAiAdapter::new(config)?.with_budget(budget))
}
