//! The model lifecycle's instruments: loads and unloads by model, node, reason and
//! outcome; how long loads take; how long a cold request waited for its model.

use std::time::Duration;

use opentelemetry::KeyValue;
use opentelemetry::metrics::{Counter, Histogram, Meter};

use crate::domain::NodeId;
use crate::domain::models::{ModelAction, ModelName};

/// The lifecycle's instruments.
pub(super) struct ModelMetrics {
    commands: Counter<u64>,
    load_seconds: Histogram<f64>,
    cold_start_seconds: Histogram<f64>,
}

/// Seconds buckets from a tiny model's load to a large one's.
const BUCKETS: &[f64] = &[
    0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0,
];

impl ModelMetrics {
    pub(super) fn new(meter: &Meter) -> Self {
        Self {
            commands: meter
                .u64_counter("edge_model_commands")
                .with_description(
                    "Model loads and unloads, by model, node, action, reason and outcome",
                )
                .build(),
            load_seconds: meter
                .f64_histogram("edge_model_load")
                .with_unit("s")
                .with_description("How long a model's load took on its node, by model and node")
                .with_boundaries(BUCKETS.to_vec())
                .build(),
            cold_start_seconds: meter
                .f64_histogram("edge_model_cold_start_wait")
                .with_unit("s")
                .with_description(
                    "How long requests for a model loaded nowhere waited for its load, by model",
                )
                .with_boundaries(BUCKETS.to_vec())
                .build(),
        }
    }

    pub(super) fn command(
        &self,
        action: ModelAction,
        model: &ModelName,
        node: &NodeId,
        reason: &str,
        ok: bool,
    ) {
        let outcome = if ok { "done" } else { "failed" };
        self.commands.add(
            1,
            &[
                KeyValue::new("action", action.as_str()),
                KeyValue::new("model", model.to_string()),
                KeyValue::new("node", node.to_string()),
                KeyValue::new("reason", reason.to_owned()),
                KeyValue::new("outcome", outcome),
            ],
        );
    }

    pub(super) fn load_time(&self, model: &ModelName, node: &NodeId, took: Duration) {
        let labels = [
            KeyValue::new("model", model.to_string()),
            KeyValue::new("node", node.to_string()),
        ];
        self.load_seconds.record(took.as_secs_f64(), &labels);
    }

    pub(super) fn cold_start(&self, model: &ModelName, waited: Duration) {
        let labels = [KeyValue::new("model", model.to_string())];
        self.cold_start_seconds
            .record(waited.as_secs_f64(), &labels);
    }
}
