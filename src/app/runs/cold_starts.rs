//! The run service as the model lifecycle reaches it: when every load of a model failed,
//! the runs queued for it end with the engine's reason instead of waiting out their time.

use std::sync::{Arc, Weak};

use tracing::info;

use super::service::{Inner, RunService};
use super::table::{Placement, Run, lock};
use crate::domain::models::ModelName;
use crate::domain::{FailureClass, RunEventKind};
use crate::ports::WaitingRuns;

/// The `RunFailed.code` of a run whose model could not be loaded on any node.
pub const MODEL_LOAD_FAILED: &str = "model_load_failed";

/// A handle on the run service that does not keep it alive.
pub(super) struct ColdStarts(Weak<Inner>);

impl ColdStarts {
    pub(super) fn of(service: &RunService) -> Self {
        Self(Arc::downgrade(&service.inner))
    }
}

impl WaitingRuns for ColdStarts {
    fn load_failed(&self, model: &ModelName, reason: &str) {
        let Some(inner) = self.0.upgrade() else {
            return;
        };
        let service = RunService { inner };
        let served = service
            .inner
            .registry
            .statuses_serving(&model.adapter, &model.target)
            .iter()
            .any(|node| {
                node.availability
                    .as_ref()
                    .is_none_or(|a| a.serves(&model.adapter, &model.target))
                    && !node.drained
            });
        if served {
            return;
        }
        let waiting: Vec<Arc<Run>> = {
            let mut table = lock(&service.inner.table);
            let cold: Vec<Arc<Run>> = table
                .runs
                .values()
                .filter(|run| waits_for(run, model))
                .cloned()
                .collect();
            cold.into_iter()
                .filter(|run| table.unqueue(&run.id))
                .collect()
        };
        for run in waiting {
            info!(parent: &run.span, run_id = %run.id, %model, reason, "run failed: its model could not be loaded on any node");
            service.end_soon(run, load_failed(reason));
        }
    }

    fn placements_settled(&self) {
        // Placements happen under the table's lock: taking it waits them out.
        if let Some(inner) = self.0.upgrade() {
            drop(lock(&inner.table));
        }
    }
}

/// Whether `run` waits in the queue for `model` to be loaded.
fn waits_for(run: &Run, model: &ModelName) -> bool {
    let selector = &run.spec.selector;
    let route = lock(&run.route);
    selector.adapter == model.adapter
        && selector.target == model.target
        && selector.pin.is_none()
        && matches!(route.placement, Placement::Queued)
        && route.waiting.is_some_and(|w| w.cold_start.is_some())
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
