//! What the load and unload routes share: reading their body, the model lifecycle they
//! ask, carrying a command out to its end, and the model's view they answer with.

use std::future::Future;
use std::sync::Arc;

use axum::body::Bytes;
use serde::de::DeserializeOwned;

use super::AdminState;
use super::error::AdminError;
use super::views::ModelStateView;
use crate::domain::models::ModelName;
use crate::ports::{ManageModels, ModelCommandError, ModelView};

/// `body` read as a `what` request (JSON).
///
/// # Errors
/// `400` when it is not one.
pub(super) fn read_request<T: DeserializeOwned>(body: &Bytes, what: &str) -> Result<T, AdminError> {
    serde_json::from_slice(body)
        .map_err(|error| AdminError::bad_request(format!("not {what} request: {error}")))
}

/// `model` read as `adapter/target`.
///
/// # Errors
/// `400` naming what is wrong with it.
pub(super) fn model_name(model: &str) -> Result<ModelName, AdminError> {
    ModelName::parse(model).map_err(|error| {
        AdminError::bad_request(format!(
            "`model` {model:?} is not `adapter/target`: {error}"
        ))
    })
}

/// The model lifecycle.
///
/// # Errors
/// `503` when this edge has none.
pub(super) fn lifecycle(state: &AdminState) -> Result<Arc<dyn ManageModels>, AdminError> {
    state
        .models
        .clone()
        .ok_or_else(AdminError::models_unavailable)
}

/// Runs `command` to its end on a task of its own, so that a caller who hangs up does not
/// abandon a load or unload half done (the lifecycle marks the model busy until the
/// node's answer, bounded by `lifecycle.command_timeout_ms`, and a drain's deadline).
///
/// # Errors
/// The command's error, or `500` when its task panicked.
pub(super) async fn carried_out<F>(command: F) -> Result<(), AdminError>
where
    F: Future<Output = Result<(), ModelCommandError>> + Send + 'static,
{
    tokio::spawn(command)
        .await
        .map_err(|error| AdminError::internal(format!("the model command failed: {error}")))?
        .map_err(AdminError::from)
}

/// `model` as the lifecycle shows it now (no node, when none serves or can load it).
pub(super) fn view_of(models: &dyn ManageModels, model: &ModelName) -> ModelStateView {
    let view = models
        .models()
        .into_iter()
        .find(|view| view.model == *model)
        .unwrap_or_else(|| ModelView {
            model: model.clone(),
            policy: None,
            nodes: Vec::new(),
            warnings: Vec::new(),
        });
    ModelStateView::of(&view)
}
