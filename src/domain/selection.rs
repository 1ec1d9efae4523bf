//! What a run asks of its node: the adapter and target, and an optional pin. Which node
//! takes it is routing's decision (`super::routing::decide`).

use super::names::{AdapterName, Target};

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
