//! `GET /admin/v1/models`: every model some connected node serves or can load, and where it
//! is, node by node.

use axum::Json;
use axum::extract::State;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::AdminState;
use super::views::{ErrorBody, ModelList, ModelStateView};

pub(super) fn register(router: OpenApiRouter<AdminState>) -> OpenApiRouter<AdminState> {
    router.routes(routes!(list_models))
}

/// Every model, by name: its `[[models]]` policy and, per node, its state, since when, runs
/// in flight, last use and the reason of its last load or unload.
#[utoipa::path(
    get,
    path = "/admin/v1/models",
    tag = "models",
    responses(
        (status = 200, description = "Every model some connected node serves or can load (or is configured with and a `[[models]]` entry names)", body = ModelList),
        (status = 401, description = "No valid admin key", body = ErrorBody),
    ),
    security(("admin_key" = []))
)]
async fn list_models(State(state): State<AdminState>) -> Json<ModelList> {
    let models = state
        .models
        .as_ref()
        .map(|models| models.models().iter().map(ModelStateView::of).collect())
        .unwrap_or_default();
    Json(ModelList { models })
}
