//! Node selection: which connected node takes a run.
//!
//! [`select_node`] is pure. Candidates are the connected nodes whose config serves the
//! requested `adapter + target` (narrowed to one node when the request pins an id or alias)
//! and that have a free slot under their `max_concurrent_runs`. The least busy candidate wins;
//! ties rotate round-robin with the caller's `turn` counter.

use std::sync::Arc;

use super::names::{AdapterName, Target};
use super::node::NodeRecord;

/// A connected node as selection sees it: its definition and how many runs it holds.
#[derive(Debug, Clone)]
pub struct NodeLoad {
    /// The node's definition.
    pub record: Arc<NodeRecord>,
    /// Runs the edge has sent it that have not ended.
    pub active_runs: u32,
}

impl NodeLoad {
    fn has_capacity(&self) -> bool {
        self.active_runs < self.record.runtime().max_concurrent_runs()
    }
}

/// What a run asks of its node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeSelector {
    /// The adapter that must run it.
    pub adapter: AdapterName,
    /// The adapter's target.
    pub target: Target,
    /// Only this node (by id or alias) may take it.
    pub pin: Option<String>,
}

/// Why no node can take a run now.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SelectError {
    /// No connected node serves the adapter and target.
    #[error("no connected node serves adapter {adapter} target {target}")]
    NoNodeServes {
        /// The requested adapter.
        adapter: AdapterName,
        /// The requested target.
        target: Target,
    },
    /// The pinned node is not connected (or no node has that id or alias).
    #[error("node {pin:?} is not connected")]
    PinnedNodeNotConnected {
        /// The requested id or alias.
        pin: String,
    },
    /// The pinned node is connected but does not serve the adapter and target.
    #[error("node {pin:?} does not serve adapter {adapter} target {target}")]
    PinnedNodeDoesNotServe {
        /// The requested id or alias.
        pin: String,
        /// The requested adapter.
        adapter: AdapterName,
        /// The requested target.
        target: Target,
    },
    /// Every node that serves it is at its `max_concurrent_runs`.
    #[error("all {serving} node(s) serving adapter {adapter} target {target} are busy")]
    AllBusy {
        /// The requested adapter.
        adapter: AdapterName,
        /// The requested target.
        target: Target,
        /// How many connected nodes serve it.
        serving: usize,
    },
}

impl SelectError {
    /// Whether waiting may help: only when serving nodes exist but are all busy.
    pub fn is_busy(&self) -> bool {
        matches!(self, Self::AllBusy { .. })
    }
}

/// Chooses the node for a run.
///
/// `nodes` are the connected nodes in a stable order (the registry lists them by id); `turn`
/// is a counter the caller advances on every selection, which rotates ties.
///
/// # Errors
/// [`SelectError`] telling "nobody serves this" (or the pinned node is absent or does not
/// serve it) from "everybody who serves it is busy".
pub fn select_node<'a>(
    nodes: &'a [NodeLoad],
    selector: &NodeSelector,
    turn: u64,
) -> Result<&'a NodeLoad, SelectError> {
    if let Some(pin) = &selector.pin {
        return select_pinned(nodes, selector, pin);
    }
    let serves = |node: &&NodeLoad| node.record.serves(&selector.adapter, &selector.target);

    // One pass over the nodes: the least busy candidates' positions are kept, so the
    // round-robin pick among them needs no second pass (matching a node to the route is
    // the costly part with thousands of nodes).
    let mut serving = 0;
    let mut least: Option<u32> = None;
    let mut ties: Vec<usize> = Vec::new();
    for (index, node) in nodes.iter().enumerate().filter(|(_, node)| serves(node)) {
        serving += 1;
        if !node.has_capacity() {
            continue;
        }
        match least {
            Some(l) if node.active_runs > l => {}
            Some(l) if node.active_runs == l => ties.push(index),
            _ => {
                least = Some(node.active_runs);
                ties.clear();
                ties.push(index);
            }
        }
    }
    if least.is_none() {
        return Err(if serving == 0 {
            SelectError::NoNodeServes {
                adapter: selector.adapter.clone(),
                target: selector.target.clone(),
            }
        } else {
            all_busy(selector, serving)
        });
    }
    let pick = usize::try_from(turn % ties.len().max(1) as u64).unwrap_or(0);
    ties.get(pick)
        .and_then(|&index| nodes.get(index))
        .ok_or_else(|| all_busy(selector, serving))
}

/// The pinned node named `pin` (by id or alias), if it serves the run and has room.
fn select_pinned<'a>(
    nodes: &'a [NodeLoad],
    selector: &NodeSelector,
    pin: &str,
) -> Result<&'a NodeLoad, SelectError> {
    let node = nodes
        .iter()
        .find(|n| n.record.is_named(pin))
        .ok_or_else(|| SelectError::PinnedNodeNotConnected {
            pin: pin.to_owned(),
        })?;
    if !node.record.serves(&selector.adapter, &selector.target) {
        return Err(SelectError::PinnedNodeDoesNotServe {
            pin: pin.to_owned(),
            adapter: selector.adapter.clone(),
            target: selector.target.clone(),
        });
    }
    if node.has_capacity() {
        Ok(node)
    } else {
        Err(all_busy(selector, 1))
    }
}

fn all_busy(selector: &NodeSelector, serving: usize) -> SelectError {
    SelectError::AllBusy {
        adapter: selector.adapter.clone(),
        target: selector.target.clone(),
        serving,
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use proptest::prelude::*;

    use super::*;
    use crate::domain::node::{AdapterConfig, RuntimeConfig};
    use crate::domain::{Alias, NodeId, Token};

    fn node(id: &str, targets: &[&str], max: u32, active: u32) -> NodeLoad {
        NodeLoad {
            record: Arc::new(NodeRecord::new(
                NodeId::parse(id).unwrap(),
                Alias::parse(&format!("alias-{id}")).unwrap(),
                Token::new(id).digest(),
                vec![
                    AdapterConfig::new(
                        AdapterName::parse("echo").unwrap(),
                        targets.iter().map(|t| Target::parse(t).unwrap()).collect(),
                        BTreeMap::new(),
                    )
                    .unwrap(),
                ],
                RuntimeConfig::new(max, 1000, BTreeMap::new()).unwrap(),
            )),
            active_runs: active,
        }
    }

    fn want(target: &str, pin: Option<&str>) -> NodeSelector {
        NodeSelector {
            adapter: AdapterName::parse("echo").unwrap(),
            target: Target::parse(target).unwrap(),
            pin: pin.map(str::to_owned),
        }
    }

    fn chosen(nodes: &[NodeLoad], selector: &NodeSelector, turn: u64) -> String {
        select_node(nodes, selector, turn)
            .unwrap()
            .record
            .id()
            .to_string()
    }

    #[test]
    fn picks_the_least_loaded_serving_node() {
        let nodes = [
            node("a", &["t"], 4, 2),
            node("b", &["t"], 4, 1),
            node("c", &["other"], 4, 0),
        ];
        assert_eq!(chosen(&nodes, &want("t", None), 0), "b");
        assert_eq!(chosen(&nodes, &want("t", None), 1), "b");
    }

    #[test]
    fn tells_nobody_serves_from_everybody_busy() {
        let nodes = [
            node("a", &["t"], 1, 1),
            node("b", &["t"], 2, 2),
            node("c", &["u"], 1, 0),
        ];
        assert!(matches!(
            select_node(&nodes, &want("x", None), 0),
            Err(SelectError::NoNodeServes { .. })
        ));
        let busy = select_node(&nodes, &want("t", None), 0).unwrap_err();
        assert!(matches!(busy, SelectError::AllBusy { serving: 2, .. }));
        assert!(busy.is_busy());
        assert_eq!(
            busy.to_string(),
            "all 2 node(s) serving adapter echo target t are busy"
        );
        assert!(matches!(
            select_node(&[], &want("t", None), 0),
            Err(SelectError::NoNodeServes { .. })
        ));
    }

    #[test]
    fn pins_by_id_or_alias() {
        let nodes = [node("a", &["t"], 4, 0), node("b", &["t"], 4, 3)];
        assert_eq!(chosen(&nodes, &want("t", Some("b")), 0), "b");
        assert_eq!(chosen(&nodes, &want("t", Some("alias-b")), 0), "b");
        assert_eq!(
            select_node(&nodes, &want("t", Some("zzz")), 0).unwrap_err(),
            SelectError::PinnedNodeNotConnected { pin: "zzz".into() }
        );
        assert!(matches!(
            select_node(&nodes, &want("u", Some("a")), 0),
            Err(SelectError::PinnedNodeDoesNotServe { .. })
        ));
        let full = [node("a", &["t"], 1, 1)];
        assert!(matches!(
            select_node(&full, &want("t", Some("a")), 0),
            Err(SelectError::AllBusy { serving: 1, .. })
        ));
    }

    #[test]
    fn never_exceeds_max_concurrent_runs() {
        let nodes = [node("a", &["t"], 2, 2), node("b", &["t"], 8, 5)];
        assert_eq!(chosen(&nodes, &want("t", None), 0), "b");
    }

    proptest! {
        /// Over `count` consecutive turns, idle equal nodes are each chosen exactly once.
        #[test]
        fn ties_rotate_round_robin(count in 1usize..20, load in 0u32..3, start in any::<u64>()) {
            let nodes: Vec<NodeLoad> =
                (0..count).map(|i| node(&format!("n{i:02}"), &["t"], 4, load)).collect();
            let mut picks: Vec<String> = (0..count as u64)
                .map(|k| chosen(&nodes, &want("t", None), start.wrapping_add(k)))
                .collect();
            picks.sort();
            picks.dedup();
            prop_assert_eq!(picks.len(), count);
        }

        /// The chosen node always serves the request, has capacity and is least loaded.
        #[test]
        fn choice_is_valid_and_least_loaded(
            loads in proptest::collection::vec((0u32..4, 1u32..4, any::<bool>()), 1..30),
            turn in any::<u64>(),
        ) {
            let nodes: Vec<NodeLoad> = loads.iter().enumerate()
                .map(|(i, (active, max, serves))| {
                    node(&format!("n{i:02}"), if *serves { &["t"] } else { &["u"] }, *max, *active)
                })
                .collect();
            match select_node(&nodes, &want("t", None), turn) {
                Ok(pick) => {
                    prop_assert!(pick.active_runs < pick.record.runtime().max_concurrent_runs());
                    prop_assert!(pick.record.serves(pick.record.adapters()[0].name(), &Target::parse("t").unwrap()));
                    let least = nodes.iter()
                        .filter(|n| n.record.adapters()[0].targets()[0].as_str() == "t" && n.has_capacity())
                        .map(|n| n.active_runs).min();
                    prop_assert_eq!(Some(pick.active_runs), least);
                }
                Err(SelectError::NoNodeServes { .. }) => {
                    prop_assert!(loads.iter().all(|(_, _, serves)| !serves));
                }
                Err(SelectError::AllBusy { .. }) => {
                    prop_assert!(nodes.iter().all(|n| n.record.adapters()[0].targets()[0].as_str() != "t" || !n.has_capacity()));
                }
                Err(other) => prop_assert!(false, "unexpected {other:?}"),
            }
        }
    }
}
