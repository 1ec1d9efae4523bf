//! Tests of the placement decision as a whole: the three placement cases, filtering,
//! affinity's properties, failover, and least busy without a key.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant};

use proptest::prelude::*;

use super::*;
use crate::domain::node::{AdapterConfig, Availability, RuntimeConfig};
use crate::domain::{
    AdapterName, Alias, FailureClass, NodeId, NodeRecord, NodeSelector, Target, Token,
};

mod affinity_props;
mod decide_cases;
mod lora_cases;

/// A node serving `targets` through `echo` (no adapter at all when `targets` is empty: an
/// adapter must serve at least one target).
fn record(id: &str, targets: &[&str], slots: u32) -> Arc<NodeRecord> {
    let adapters = AdapterConfig::new(
        AdapterName::parse("echo").unwrap(),
        targets.iter().map(|t| Target::parse(t).unwrap()).collect(),
        BTreeMap::new(),
    );
    Arc::new(NodeRecord::new(
        NodeId::parse(id).unwrap(),
        Alias::parse(&format!("alias-{id}")).unwrap(),
        Token::new(id).digest(),
        adapters.into_iter().collect(),
        RuntimeConfig::new(slots, 1000, BTreeMap::new()).unwrap(),
    ))
}

fn status(id: &str, targets: &[&str], slots: u32, active: u32) -> NodeStatus {
    NodeStatus::new(record(id, targets, slots), active)
}

fn want(target: &str, pin: Option<&str>) -> NodeSelector {
    NodeSelector {
        adapter: AdapterName::parse("echo").unwrap(),
        target: Target::parse(target).unwrap(),
        pin: pin.map(str::to_owned),
    }
}

fn pair(target: &str) -> (AdapterName, Target) {
    (
        AdapterName::parse("echo").unwrap(),
        Target::parse(target).unwrap(),
    )
}

fn catalog_of(nodes: &[NodeStatus]) -> Catalog {
    Catalog::new(nodes.iter().map(|n| Arc::clone(&n.record)))
}

/// A decision with no history: empty breakers, nothing tried, `c` = 1.25.
struct Setup {
    catalog: Catalog,
    breakers: BreakerBook,
    tried: Tried,
    now: Instant,
    /// Per node, its runs of the model against its engine's cap.
    model_seats: Vec<Option<ModelSeats>>,
    /// The run's LoRA.
    lora: Option<crate::domain::LoraChoice>,
}

impl Setup {
    fn new(catalog: Catalog) -> Self {
        Self {
            catalog,
            breakers: BreakerBook::default(),
            tried: Tried::default(),
            now: Instant::now(),
            model_seats: Vec::new(),
            lora: None,
        }
    }

    fn decide(
        &self,
        nodes: &[NodeStatus],
        selector: &NodeSelector,
        key: Option<AffinityKey>,
        turn: u64,
    ) -> Decision {
        let request = RouteRequest {
            selector,
            affinity: key,
            tried: &self.tried,
            operation: crate::domain::Operation::Chat,
            lora: self.lora.as_ref(),
        };
        let ctx = RouteContext {
            catalog: &self.catalog,
            breakers: &self.breakers,
            load_factor: LoadFactor::default(),
            now: self.now,
            turn,
            model_seats: &self.model_seats,
        };
        decide(nodes, &request, &ctx)
    }

    /// Trips `id`'s breaker.
    fn trip(&mut self, id: &str) {
        let id = NodeId::parse(id).unwrap();
        let hash = NodeHash::of(&id);
        for _ in 0..3 {
            let (admission, _) = self.breakers.admit(hash, &id, self.now).unwrap();
            self.breakers
                .record(hash, &id, admission, Outcome::NodeFailure, self.now);
        }
    }
}

fn placed(decision: &Decision) -> Option<usize> {
    match decision {
        Decision::Place { index, .. } => Some(*index),
        _ => None,
    }
}

fn key(n: u64) -> AffinityKey {
    AffinityKey::from_client(KeySource::Session, &format!("session-{n}")).unwrap()
}
