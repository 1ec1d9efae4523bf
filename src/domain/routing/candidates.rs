//! Who may take a run: the connected nodes as routing sees them, the catalog of what is
//! configured at all, and the one filtering pass that keeps the eligible nodes and counts
//! why every other serving node was left out.
//!
//! Filtering only narrows; choosing among the eligible is `affinity` and `least_busy`'s job.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;

use super::breaker::BreakerBook;
use super::failover::Tried;
use super::hash::NodeHash;
use crate::domain::lora::{LoraChoice, LoraState};
use crate::domain::names::{AdapterName, Target};
use crate::domain::node::{Availability, NodeRecord};
use crate::domain::operation::{DeclaredOperations, Operation};
use crate::domain::selection::NodeSelector;

/// A connected node as routing sees it: the registry's facts about it, copied per placement.
#[derive(Debug, Clone)]
pub struct NodeStatus {
    /// The node's definition.
    pub record: Arc<NodeRecord>,
    /// Runs the edge has sent it that have not ended.
    pub active_runs: u32,
    /// What the node last reported it can serve now; `None` when it never reported, which
    /// means everything its config lists.
    pub availability: Option<Arc<Availability>>,
    /// An operator drained it: it keeps its runs but takes no new ones.
    pub drained: bool,
    /// [`NodeHash::of`] its id, computed once when it connected.
    pub hash: NodeHash,
    /// It registered `can_continue`: it may be sent a continuation.
    pub can_continue: bool,
    /// The operations needing a declaration that it declared it serves.
    pub operations: DeclaredOperations,
}

impl NodeStatus {
    /// A connected node that never reported availability and is not drained.
    pub fn new(record: Arc<NodeRecord>, active_runs: u32) -> Self {
        let hash = NodeHash::of(record.id());
        Self {
            record,
            active_runs,
            availability: None,
            drained: false,
            hash,
            can_continue: false,
            operations: DeclaredOperations::default(),
        }
    }

    /// Its slots: `max_concurrent_runs`.
    pub fn slots(&self) -> u32 {
        self.record.runtime().max_concurrent_runs()
    }

    /// Whether it has a free slot.
    pub fn has_room(&self) -> bool {
        self.active_runs < self.slots()
    }

    /// Whether it can serve `adapter + target` now: its config lists the pair and, if it
    /// reported availability, so did its last report.
    fn available_for(&self, adapter: &AdapterName, target: &Target) -> bool {
        self.availability
            .as_ref()
            .is_none_or(|a| a.serves(adapter, target))
    }

    /// The state of `lora` on top of `adapter + target` here, when its last report has that
    /// LoRA with the same weights; `None` otherwise (a node that never reported has none).
    pub fn lora_state(
        &self,
        adapter: &AdapterName,
        target: &Target,
        lora: &LoraChoice,
    ) -> Option<LoraState> {
        let reported = self.availability.as_ref()?.lora(adapter, &lora.name)?;
        reported.serves(target, lora).then_some(reported.state)
    }
}

/// Everything the node definitions configure, connected or not: which routes exist and
/// which names a pin may use. Built once from the definitions, which never change at run
/// time, so "unknown" (404) can be told from "configured but not connected now" (wait).
#[derive(Debug, Clone, Default)]
pub struct Catalog {
    /// Each configured route and how many definitions serve it.
    routes: BTreeMap<AdapterName, BTreeMap<Target, u32>>,
    by_name: HashMap<String, Arc<NodeRecord>>,
}

impl Catalog {
    /// The catalog of `records` (every node definition).
    pub fn new(records: impl IntoIterator<Item = Arc<NodeRecord>>) -> Self {
        let mut catalog = Self::default();
        for record in records {
            for adapter in record.adapters() {
                let targets = catalog.routes.entry(adapter.name().clone()).or_default();
                let distinct: BTreeSet<&Target> = adapter.targets().iter().collect();
                for target in distinct {
                    *targets.entry(target.clone()).or_default() += 1;
                }
            }
            catalog
                .by_name
                .insert(record.alias().as_str().to_owned(), Arc::clone(&record));
            catalog
                .by_name
                .insert(record.id().as_str().to_owned(), record);
        }
        catalog
    }

    /// Whether some definition serves `adapter + target`.
    pub fn knows(&self, adapter: &AdapterName, target: &Target) -> bool {
        self.serving(adapter, target) > 0
    }

    /// How many definitions serve `adapter + target`, connected or not.
    pub fn serving(&self, adapter: &AdapterName, target: &Target) -> u32 {
        self.routes
            .get(adapter)
            .and_then(|t| t.get(target))
            .copied()
            .unwrap_or(0)
    }

    /// The definition with this id or alias.
    pub fn node(&self, id_or_alias: &str) -> Option<&NodeRecord> {
        self.by_name.get(id_or_alias).map(|r| &**r)
    }
}

/// Why connected serving nodes were left out of a placement, one reason per node (the first
/// that applies, in this order), so a decision can say why nothing was eligible.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Filtered {
    /// Connected nodes whose config serves the route (only the pinned one, with a pin).
    pub serving: u32,
    /// Already tried by this run (failover never goes back to one).
    pub tried: u32,
    /// Drained by an operator.
    pub drained: u32,
    /// Reported availability without the route.
    pub unavailable: u32,
    /// Their circuit breaker is open (or half-open with its probe out).
    pub breaker_open: u32,
    /// Eligible but at `max_concurrent_runs`.
    pub full: u32,
}

impl Filtered {
    /// Nodes that passed every filter, full or not.
    pub fn eligible(&self) -> u32 {
        self.serving - self.tried - self.drained - self.unavailable - self.breaker_open
    }

    /// Whether a node left out now could take the run later without this run's own
    /// history changing: it could become available, undrained, closed, or free a slot.
    pub fn could_change(&self) -> bool {
        self.drained + self.unavailable + self.breaker_open + self.full > 0
    }
}

/// One node's runs of the model being placed against how many its engine serves at once
/// (the managed adapter's `parallel`, Ollama's `OLLAMA_NUM_PARALLEL`): at its cap the node
/// is full for that model, however many other runs it could take.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ModelSeats {
    /// Runs of the model in flight on the node.
    pub running: u32,
    /// How many its engine serves at once; 0: no cap.
    pub parallel: u32,
}

impl ModelSeats {
    /// Whether another run of the model would exceed the cap.
    pub fn full(&self) -> bool {
        self.parallel > 0 && self.running >= self.parallel
    }
}

/// What choosing needs of one candidate, copied out of its node during filtering so the
/// choosing passes read one compact array instead of chasing every node's record again.
#[derive(Debug, Clone, Copy)]
pub(super) struct Seat {
    /// Its position in the node list.
    pub(super) index: usize,
    pub(super) active: u32,
    pub(super) slots: u32,
    pub(super) hash: NodeHash,
    /// The model being placed is at its engine's cap there.
    pub(super) model_full: bool,
    /// The run's LoRA is loaded (registered) there: such nodes are chosen first.
    pub(super) lora_loaded: bool,
}

impl Seat {
    pub(super) fn has_room(&self) -> bool {
        self.active < self.slots && !self.model_full
    }
}

/// The eligible nodes of one placement and the sums the load bound needs.
#[derive(Debug, Default)]
pub(super) struct Pool {
    /// Every eligible node, full or not, in node order.
    pub(super) eligible: Vec<Seat>,
    /// Active runs summed over the eligible nodes.
    pub(super) load: u64,
    /// Slots summed over the eligible nodes.
    pub(super) slots: u64,
    /// Whether every serving node has as many slots as the first.
    pub(super) uniform: bool,
    /// Serving nodes left out for a reason other than load (affinity's "miss" looks at them).
    pub(super) left_out: Vec<Seat>,
    pub(super) filtered: Filtered,
}

impl Pool {
    /// LoRA affinity: when some eligible node with room has the run's LoRA loaded, only
    /// those nodes (one that must load it first waits its turn); otherwise every eligible
    /// node. Prefix affinity then holds among the nodes kept.
    pub(super) fn loaded_first(mut self) -> Self {
        if !self.eligible.iter().any(|s| s.lora_loaded && s.has_room()) {
            return self;
        }
        self.eligible.retain(|seat| seat.lora_loaded);
        self.load = self.eligible.iter().map(|s| u64::from(s.active)).sum();
        self.slots = self.eligible.iter().map(|s| u64::from(s.slots)).sum();
        let first = self.eligible.first().map(|s| s.slots);
        self.uniform &= self.eligible.iter().all(|s| Some(s.slots) == first);
        self
    }
}

/// What filtering looks at besides the nodes.
pub(super) struct Filter<'a> {
    pub(super) selector: &'a NodeSelector,
    /// A node that may not get this operation (it did not declare it) is as one that does
    /// not serve the route.
    pub(super) operation: Operation,
    pub(super) tried: &'a Tried,
    pub(super) breakers: &'a BreakerBook,
    pub(super) now: std::time::Instant,
    /// Per node of the list, by position, its runs of the model against its engine's cap.
    pub(super) model_seats: &'a [Option<ModelSeats>],
    /// The run's LoRA: a node without it (with these weights) is as one whose report does
    /// not list the route.
    pub(super) lora: Option<&'a LoraChoice>,
}

impl Filter<'_> {
    /// One pass over `nodes` (or just `pinned`): the eligible ones and why the rest are not.
    pub(super) fn pool(&self, nodes: &[NodeStatus], pinned: Option<usize>) -> Pool {
        let mut pool = Pool {
            uniform: true,
            ..Pool::default()
        };
        match pinned {
            Some(index) => self.fill(&mut pool, nodes, index..index + 1),
            None => self.fill(&mut pool, nodes, 0..nodes.len()),
        }
        pool
    }

    fn fill(&self, pool: &mut Pool, nodes: &[NodeStatus], indices: std::ops::Range<usize>) {
        let (adapter, target) = (&self.selector.adapter, &self.selector.target);
        let mut first_slots = None;
        pool.eligible.reserve(indices.len());
        for (index, node) in nodes
            .get(indices.clone())
            .unwrap_or_default()
            .iter()
            .enumerate()
        {
            let index = indices.start + index;
            if !node.record.serves(adapter, target) || !node.operations.serves(self.operation) {
                continue;
            }
            let slots = node.slots();
            pool.uniform &= *first_slots.get_or_insert(slots) == slots;
            pool.filtered.serving += 1;
            let model_full = self
                .model_seats
                .get(index)
                .copied()
                .flatten()
                .is_some_and(|seats| seats.full());
            let lora = self.lora.map(|lora| node.lora_state(adapter, target, lora));
            let seat = Seat {
                index,
                active: node.active_runs,
                slots,
                hash: node.hash,
                model_full,
                lora_loaded: lora == Some(Some(LoraState::Loaded)),
            };
            let counter = if self.tried.contains(node.hash, node.record.id()) {
                &mut pool.filtered.tried
            } else if node.drained {
                &mut pool.filtered.drained
            } else if !node.available_for(adapter, target) || lora == Some(None) {
                &mut pool.filtered.unavailable
            } else if !self.breakers.admits(node.hash, node.record.id(), self.now) {
                &mut pool.filtered.breaker_open
            } else {
                pool.filtered.full += u32::from(!seat.has_room());
                pool.load += u64::from(node.active_runs);
                pool.slots += u64::from(slots);
                pool.eligible.push(seat);
                continue;
            };
            *counter += 1;
            pool.left_out.push(seat);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::domain::node::{AdapterConfig, RuntimeConfig};
    use crate::domain::{Alias, NodeId, Token};

    fn record(id: &str, targets: &[&str]) -> Arc<NodeRecord> {
        Arc::new(NodeRecord::new(
            NodeId::parse(id).unwrap(),
            Alias::parse(&format!("{id}-alias")).unwrap(),
            Token::new(id).digest(),
            vec![
                AdapterConfig::new(
                    AdapterName::parse("echo").unwrap(),
                    targets.iter().map(|t| Target::parse(t).unwrap()).collect(),
                    BTreeMap::new(),
                )
                .unwrap(),
            ],
            RuntimeConfig::new(2, 1000, BTreeMap::new()).unwrap(),
        ))
    }

    #[test]
    fn the_catalog_knows_every_configured_route_and_name() {
        let catalog = Catalog::new([record("a", &["t"]), record("b", &["u", "v"])]);
        let echo = AdapterName::parse("echo").unwrap();
        let other = AdapterName::parse("other").unwrap();
        for t in ["t", "u", "v"] {
            assert!(catalog.knows(&echo, &Target::parse(t).unwrap()));
        }
        assert!(!catalog.knows(&echo, &Target::parse("w").unwrap()));
        assert_eq!(catalog.serving(&echo, &Target::parse("u").unwrap()), 1);
        let both = Catalog::new([record("a", &["t"]), record("b", &["t", "t"])]);
        assert_eq!(both.serving(&echo, &Target::parse("t").unwrap()), 2);
        assert!(!catalog.knows(&other, &Target::parse("t").unwrap()));
        assert_eq!(catalog.node("b-alias").map(|r| r.id().as_str()), Some("b"));
        assert_eq!(catalog.node("a").map(|r| r.id().as_str()), Some("a"));
        assert!(catalog.node("c").is_none());
    }

    #[test]
    fn a_node_that_never_reported_serves_its_config() {
        let mut node = NodeStatus::new(record("a", &["t", "u"]), 1);
        let (echo, t) = (
            AdapterName::parse("echo").unwrap(),
            Target::parse("t").unwrap(),
        );
        assert!(node.available_for(&echo, &t) && node.has_room() && !node.drained);
        node.availability = Some(Arc::new(Availability::new([])));
        assert!(!node.available_for(&echo, &t));
        node.active_runs = 2;
        assert!(!node.has_room());
    }

    #[test]
    fn a_node_gets_an_operation_needing_a_declaration_only_if_it_made_one() {
        let v1 = NodeStatus::new(record("a", &["t"]), 0);
        let declared = NodeStatus {
            operations: DeclaredOperations::new([Operation::Tokenize]),
            ..NodeStatus::new(record("b", &["t"]), 0)
        };
        let nodes = [v1, declared];
        let selector = NodeSelector {
            adapter: AdapterName::parse("echo").unwrap(),
            target: Target::parse("t").unwrap(),
            pin: None,
        };
        let (tried, breakers) = (Tried::default(), BreakerBook::default());
        let eligible = |operation| {
            let filter = Filter {
                selector: &selector,
                operation,
                tried: &tried,
                breakers: &breakers,
                now: std::time::Instant::now(),
                model_seats: &[],
                lora: None,
            };
            let pool = filter.pool(&nodes, None);
            (
                pool.eligible.iter().map(|s| s.index).collect::<Vec<_>>(),
                pool.filtered.serving,
            )
        };
        assert_eq!(eligible(Operation::Tokenize), (vec![1], 1));
        assert_eq!(eligible(Operation::Detokenize), (vec![], 0));
        assert_eq!(eligible(Operation::Chat), (vec![0, 1], 2));
        assert_eq!(eligible(Operation::Embeddings), (vec![0, 1], 2));
    }

    #[test]
    fn filtered_counts_add_up() {
        let filtered = Filtered {
            serving: 6,
            tried: 1,
            drained: 1,
            unavailable: 1,
            breaker_open: 1,
            full: 1,
        };
        assert_eq!(filtered.eligible(), 2);
        assert!(filtered.could_change());
        let only_tried = Filtered {
            serving: 2,
            tried: 2,
            ..Filtered::default()
        };
        assert!(!only_tried.could_change());
    }
}
