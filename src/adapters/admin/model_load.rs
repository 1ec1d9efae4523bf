//! `POST /admin/v1/models/load`: loads a model on a node whose engine the edge manages, and
//! answers once the engine has loaded it.

use axum::Json;
use axum::body::Bytes;
use axum::extract::State;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::AdminState;
use super::error::AdminError;
use super::model_command::{carried_out, lifecycle, model_name, read_request, view_of};
use super::views::{ErrorBody, ModelLoadRequest, ModelStateView};

pub(super) fn register(router: OpenApiRouter<AdminState>) -> OpenApiRouter<AdminState> {
    router.routes(routes!(load_model))
}

/// Loads a model on a node (making room there with its least recently used idle model if
/// the node is full); nothing to do when it is loaded, loading or asleep there already.
#[utoipa::path(
    post,
    path = "/admin/v1/models/load",
    tag = "models",
    request_body(content = ModelLoadRequest, content_type = "application/json"),
    responses(
        (status = 200, description = "Loaded: the model's view", body = ModelStateView),
        (status = 400, description = "The body is not a load request, or the model is not `adapter/target`", body = ErrorBody),
        (status = 401, description = "No valid admin key", body = ErrorBody),
        (status = 404, description = "No connected node has that id or alias", body = ErrorBody),
        (status = 409, description = "`not_managed`: the node cannot load it on command (or is drained); `conflict`: no room the pool's state allows", body = ErrorBody),
        (status = 502, description = "`model_command_failed`: the node's engine did not load it", body = ErrorBody),
        (status = 503, description = "This edge has no model lifecycle", body = ErrorBody),
    ),
    security(("admin_key" = []))
)]
async fn load_model(
    State(state): State<AdminState>,
    body: Bytes,
) -> Result<Json<ModelStateView>, AdminError> {
    let request: ModelLoadRequest = read_request(&body, "a load")?;
    let model = model_name(&request.model)?;
    let models = lifecycle(&state)?;
    let command = {
        let (models, model) = (models.clone(), model.clone());
        async move { models.load(&model, &request.node).await }
    };
    carried_out(command).await?;
    Ok(Json(view_of(models.as_ref(), &model)))
}
