//! `POST /admin/v1/models/unload`: unloads a model from a node whose engine the edge
//! manages — refused while runs of it are in flight there, unless a drain deadline lets
//! them end first.

use std::time::Duration;

use axum::Json;
use axum::body::Bytes;
use axum::extract::State;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::AdminState;
use super::error::AdminError;
use super::model_command::{carried_out, lifecycle, model_name, read_request, view_of};
use super::views::{ErrorBody, ModelStateView, ModelUnloadRequest};

pub(super) fn register(router: OpenApiRouter<AdminState>) -> OpenApiRouter<AdminState> {
    router.routes(routes!(unload_model))
}

/// Unloads a model from a node; with `drain_deadline_seconds`, first waits up to that long
/// for its runs in flight there to end.
#[utoipa::path(
    post,
    path = "/admin/v1/models/unload",
    tag = "models",
    request_body(content = ModelUnloadRequest, content_type = "application/json"),
    responses(
        (status = 200, description = "Unloaded: the model's view", body = ModelStateView),
        (status = 400, description = "The body is not an unload request, or the model is not `adapter/target`", body = ErrorBody),
        (status = 401, description = "No valid admin key", body = ErrorBody),
        (status = 404, description = "No connected node has that id or alias", body = ErrorBody),
        (status = 409, description = "`not_managed`: the node cannot unload it on command (or is drained); `conflict`: runs of it in flight there (past the drain deadline, if any), or it is pinned there", body = ErrorBody),
        (status = 502, description = "`model_command_failed`: the node's engine did not unload it", body = ErrorBody),
        (status = 503, description = "This edge has no model lifecycle", body = ErrorBody),
    ),
    security(("admin_key" = []))
)]
async fn unload_model(
    State(state): State<AdminState>,
    body: Bytes,
) -> Result<Json<ModelStateView>, AdminError> {
    let request: ModelUnloadRequest = read_request(&body, "an unload")?;
    let model = model_name(&request.model)?;
    let models = lifecycle(&state)?;
    let drain = request.drain_deadline_seconds.map(Duration::from_secs);
    let command = {
        let (models, model) = (models.clone(), model.clone());
        async move { models.unload(&model, &request.node, drain).await }
    };
    carried_out(command).await?;
    Ok(Json(view_of(models.as_ref(), &model)))
}
