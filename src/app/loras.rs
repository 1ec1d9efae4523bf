//! The LoRAs the edge knows: every LoRA some node has reported since the edge started,
//! kept in a [`LoraBook`] the client and management APIs read through [`KnownLoras`].
//!
//! It hears each node's report (`node_changed`, from `app/node_events.rs`), learns from it
//! by the book's pure rules, logs each LoRA heard of first and each conflict (a LoRA named
//! like a target of its adapter; a name reported with other weights), and says what each
//! model the config names but no node definition serves turned out to be (an
//! `[api.models]` alias's model, a `[[models]]` entry set aside): a LoRA once a node reports
//! it. It decides no placement: routing reads each node's own report, and a run carries
//! the weights the book heard of first. A report that teaches nothing (every report of a
//! pool without LoRAs) costs one snapshot load and a look at the report's LoRAs.

use std::sync::{Arc, Mutex, MutexGuard};

use arc_swap::ArcSwap;
use tracing::{info, warn};

use super::models::LoraEntry;
use crate::domain::models::ModelName;
use crate::domain::routing::Catalog;
use crate::domain::{AdapterName, ConflictKind, Lessons, LoraBook, NamedModel, NodeId, Target};
use crate::ports::{KnownLoras, LoraOnNode, LoraView, Registry};

/// The LoRA book and what feeds it. Cheap to clone.
#[derive(Clone)]
pub struct LoraService {
    inner: Arc<Inner>,
}

struct Inner {
    registry: Arc<dyn Registry>,
    /// What the node definitions configure: a name a definition serves is a target.
    catalog: Catalog,
    book: ArcSwap<LoraBook>,
    /// The models the config names that no definition serves, each with what it was last.
    named: Mutex<Vec<Named>>,
}

/// A model the config names that no node definition serves.
struct Named {
    /// Where (`api.models."sql-writer"`, `models[1] (model "llama/sql")`).
    at: String,
    model: ModelName,
    /// A `[[models]]` entry setting what does not apply to a LoRA.
    sets_policy: bool,
    /// What it was when last looked at.
    last: NamedModel,
}

impl LoraService {
    /// The book of a pool configured as `catalog` says, reading nodes' reports from
    /// `registry`; `aliases` (each alias with its model) and `entries` (the `[[models]]`
    /// entries set aside) are checked as nodes report.
    pub fn new(
        registry: Arc<dyn Registry>,
        catalog: Catalog,
        aliases: Vec<(String, ModelName)>,
        entries: Vec<LoraEntry>,
    ) -> Self {
        let unserved = |model: &ModelName| !catalog.knows(&model.adapter, &model.target);
        let aliases = aliases
            .into_iter()
            .filter(|(_, model)| unserved(model))
            .map(|(alias, model)| Named {
                at: format!("api.models.{alias:?}"),
                model,
                sets_policy: false,
                last: NamedModel::Unknown,
            });
        let entries = entries.into_iter().map(|entry| Named {
            at: entry.at,
            model: entry.model,
            sets_policy: entry.sets_policy,
            last: NamedModel::Unknown,
        });
        let named: Vec<Named> = aliases.chain(entries).collect();
        for named in &named {
            info!(
                at = %named.at, model = %named.model,
                "the config names a model no node definition serves: taken as a LoRA's name, \
                 checked when nodes report"
            );
        }
        Self {
            inner: Arc::new(Inner {
                registry,
                catalog,
                book: ArcSwap::from_pointee(LoraBook::default()),
                named: Mutex::new(named),
            }),
        }
    }

    /// `node`'s report changed (or it connected): learns the LoRAs it names.
    pub fn node_changed(&self, node: &NodeId) {
        let Some(availability) = self
            .inner
            .registry
            .get(node.as_str())
            .and_then(|n| n.availability)
        else {
            return;
        };
        let is_target = |a: &AdapterName, t: &Target| self.inner.catalog.knows(a, t);
        if self
            .inner
            .book
            .load()
            .observe(node, &availability, is_target)
            .is_empty()
        {
            return;
        }
        // One learner at a time (under the names' lock), so no lesson is lost.
        let mut named = lock(&self.inner.named);
        let mut book = LoraBook::clone(&self.inner.book.load());
        let lessons = book.observe(node, &availability, is_target);
        log_lessons(&lessons);
        book.learn(lessons);
        check_named(&mut named, &book, is_target);
        self.inner.book.store(Arc::new(book));
    }
}

impl KnownLoras for LoraService {
    fn book(&self) -> Arc<LoraBook> {
        self.inner.book.load_full()
    }

    fn listing(&self) -> Vec<LoraView> {
        let book = self.inner.book.load();
        let nodes = self.inner.registry.snapshot();
        book.known()
            .map(|(adapter, name, known)| {
                let on = nodes.iter().filter_map(|node| {
                    let lora = node.availability.as_ref()?.lora(adapter, name)?;
                    Some(LoraOnNode {
                        node: node.record.id().clone(),
                        state: lora.state,
                        agrees: book.agrees(adapter, lora),
                    })
                });
                LoraView {
                    adapter: adapter.clone(),
                    name: name.clone(),
                    known: known.clone(),
                    nodes: on.collect(),
                }
            })
            .collect()
    }
}

fn lock(named: &Mutex<Vec<Named>>) -> MutexGuard<'_, Vec<Named>> {
    named
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

fn log_lessons(lessons: &Lessons) {
    for (adapter, lora, known) in &lessons.learned {
        info!(
            %adapter, %lora, base = %known.base, node = %known.first_node,
            path = %known.file.path, sha256 = known.file.sha256.as_deref().unwrap_or(""),
            "a LoRA is known: served as {adapter}/{lora}"
        );
    }
    for conflict in &lessons.conflicts {
        let (adapter, lora, node) = (&conflict.adapter, &conflict.lora, &conflict.node);
        match &conflict.kind {
            ConflictKind::NamedLikeTarget => warn!(
                %adapter, %lora, %node,
                "a LoRA is named like a configured target of its adapter: {adapter}/{lora} is \
                 the target, and the LoRA is not served; rename its file (or folder)"
            ),
            ConflictKind::OtherWeights { base, file } => warn!(
                %adapter, %lora, %node, %base, path = %file.path,
                sha256 = file.sha256.as_deref().unwrap_or(""),
                "a node reports a LoRA the edge knows with other weights (or another base): \
                 it is not served there; the nodes that agree with its first report serve it"
            ),
        }
    }
}

/// Logs what each model named in the config became, when that changed.
fn check_named(
    named: &mut [Named],
    book: &LoraBook,
    is_target: impl Fn(&AdapterName, &Target) -> bool,
) {
    for entry in named {
        let now = book.named(&entry.model.adapter, &entry.model.target, &is_target);
        if now == entry.last {
            continue;
        }
        if let NamedModel::Lora(known) = &now {
            info!(
                at = %entry.at, model = %entry.model, base = %known.base,
                "a model the config names is a LoRA a node reported"
            );
            if entry.sets_policy {
                warn!(
                    at = %entry.at, model = %entry.model,
                    "`min_loaded`, `pin` and `idle_unload_ms` do not apply to a LoRA: its \
                     nodes register it themselves (vLLM's `max_registered`); they are ignored"
                );
            }
        }
        entry.last = now;
    }
}
