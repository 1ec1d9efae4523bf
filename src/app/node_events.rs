//! What the node transport hears, handed to the services that own it: runs, their events
//! and resumes to the run service; what nodes' engines hold and how model commands ended to
//! the model lifecycle; the LoRAs a node reports to the LoRA book; a node coming, changing or
//! going to all three (the book first, so a run waiting for a LoRA finds it known).

use async_trait::async_trait;

use super::loras::LoraService;
use super::models::ModelService;
use super::runs::RunService;
use crate::domain::{NodeId, ResumeAnswer, ResumeClaim};
use crate::ports::{CloseReason, ConnectionId, ModelOutcome, NodeEventHandler, ReportedEvent};

/// The node transport's handler: the run service, the model lifecycle and the LoRA book.
pub struct NodeEvents {
    runs: RunService,
    models: ModelService,
    loras: LoraService,
}

impl NodeEvents {
    /// The handler for `runs`, `models` and `loras`.
    pub fn new(runs: RunService, models: ModelService, loras: LoraService) -> Self {
        Self {
            runs,
            models,
            loras,
        }
    }
}

#[async_trait]
impl NodeEventHandler for NodeEvents {
    fn node_connected(&self, node: &NodeId) {
        self.loras.node_changed(node);
        self.models.node_changed(node);
        self.runs.node_connected(node);
    }

    fn node_changed(&self, node: &NodeId) {
        self.loras.node_changed(node);
        self.models.node_changed(node);
        self.runs.node_changed(node);
    }

    fn model_outcome(&self, _node: &NodeId, outcome: ModelOutcome) {
        self.models.outcome(outcome);
    }

    async fn run_events(
        &self,
        node: &NodeId,
        connection: ConnectionId,
        events: &mut Vec<ReportedEvent>,
    ) {
        self.runs.run_events(node, connection, events).await;
    }

    async fn events_kept(&self) -> bool {
        self.runs.events_kept().await
    }

    async fn resume_runs(
        &self,
        node: &NodeId,
        connection: ConnectionId,
        claims: &[ResumeClaim],
    ) -> Vec<ResumeAnswer> {
        self.runs.resume_runs(node, connection, claims).await
    }

    async fn node_disconnected(
        &self,
        node: &NodeId,
        connection: ConnectionId,
        reason: CloseReason,
        resumable: bool,
    ) {
        self.runs
            .node_disconnected(node, connection, reason, resumable)
            .await;
        self.models.node_left(node);
    }
}
