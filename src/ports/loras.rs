//! The LoRAs port, inbound: what the edge knows of LoRAs from its nodes' reports, read by
//! the client APIs (a model id naming a LoRA, `/v1/models`) and the management API (each
//! LoRA, the nodes reporting it and the conflicts). The LoRA service (`crate::app::loras`)
//! implements it; the adapters hold an `Arc<dyn KnownLoras>` and never name the service.

use std::sync::Arc;

use crate::domain::{AdapterName, KnownLora, LoraBook, LoraName, LoraState, NodeId};

/// The LoRAs the edge knows.
pub trait KnownLoras: Send + Sync {
    /// What the edge knows of LoRAs now: a snapshot, cheap enough for every request (one
    /// atomic load and a reference count).
    fn book(&self) -> Arc<LoraBook>;

    /// Every LoRA the edge knows, ordered by adapter and name, with each connected node
    /// reporting it now.
    fn listing(&self) -> Vec<LoraView>;
}

/// A LoRA the edge knows, as the management API shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LoraView {
    /// Its adapter.
    pub adapter: AdapterName,
    /// Its name.
    pub name: LoraName,
    /// Its first report.
    pub known: KnownLora,
    /// Each connected node reporting it now, ordered by id.
    pub nodes: Vec<LoraOnNode>,
}

/// A LoRA on one connected node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LoraOnNode {
    /// The node.
    pub node: NodeId,
    /// Whether its engine has it loaded, or the node registers it before a run.
    pub state: LoraState,
    /// Whether its report agrees with the first one (same base, same weights): only then
    /// does the node serve it.
    pub agrees: bool,
}
