//! The run service as the model lifecycle reaches it: when every load of a model failed,
//! the runs queued for it end with the engine's reason instead of waiting out their time;
//! when it turned out too large for every node, they end with its footprint and the largest
//! budget.

use std::sync::{Arc, Weak};

use tracing::info;

use super::placer::Placer;
use super::relay::Relay;
use crate::domain::models::{MODEL_TOO_LARGE, ModelName, TooLarge};
use crate::domain::{FailureClass, RunEventKind};
use crate::ports::WaitingRuns;

/// The `RunFailed.code` of a run whose model could not be loaded on any node.
pub const MODEL_LOAD_FAILED: &str = "model_load_failed";

/// A handle on the run service's placer and relay that keeps neither alive.
pub(super) struct ColdStarts {
    placer: Weak<Placer>,
    relay: Weak<Relay>,
}

impl ColdStarts {
    pub(super) fn of(placer: &Arc<Placer>, relay: &Arc<Relay>) -> Self {
        Self {
            placer: Arc::downgrade(placer),
            relay: Arc::downgrade(relay),
        }
    }
}

impl WaitingRuns for ColdStarts {
    fn load_failed(&self, model: &ModelName, reason: &str) {
        let (Some(placer), Some(relay)) = (self.placer.upgrade(), self.relay.upgrade()) else {
            return;
        };
        for run in placer.unqueue_cold(model) {
            info!(parent: run.span(), run_id = %run.id(), %model, reason, "run failed: its model could not be loaded on any node");
            relay.end_soon(run, load_failed(reason));
        }
    }

    fn too_large(&self, model: &ModelName, refusal: TooLarge) {
        let (Some(placer), Some(relay)) = (self.placer.upgrade(), self.relay.upgrade()) else {
            return;
        };
        for run in placer.unqueue_cold(model) {
            info!(parent: run.span(), run_id = %run.id(), %model, %refusal, "run failed: its model fits on no node");
            relay.end_soon(run, too_large(model, refusal));
        }
    }

    fn placements_settled(&self) {
        if let Some(placer) = self.placer.upgrade() {
            placer.placements_settled();
        }
    }
}

/// The terminal event of a run whose model fits on no node: a bad request (400), with its
/// footprint and the largest budget.
fn too_large(model: &ModelName, refusal: TooLarge) -> RunEventKind {
    RunEventKind::Failed {
        context_window: None,
        code: MODEL_TOO_LARGE.into(),
        message: format!("the model {model} fits on no node: {refusal}"),
        class: FailureClass::Request,
        status: Some(400),
        usage: None,
    }
}

/// The terminal event of a run whose model could not be loaded: the engine's reason.
fn load_failed(reason: &str) -> RunEventKind {
    RunEventKind::Failed {
        context_window: None,
        code: MODEL_LOAD_FAILED.into(),
        message: format!("the model could not be loaded on any node: {reason}"),
        class: FailureClass::Node,
        status: None,
        usage: None,
    }
}
