//! `POST /admin/v1/nodes/{node}/resume`: a drained node takes runs again.

use axum::Json;
use axum::extract::{Path, State};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::AdminState;
use super::error::AdminError;
use super::views::{ErrorBody, NodeView};

pub(super) fn register(router: OpenApiRouter<AdminState>) -> OpenApiRouter<AdminState> {
    router.routes(routes!(resume_node))
}

/// Ends a node's drain (resuming a node that is not drained changes nothing).
#[utoipa::path(
    post,
    path = "/admin/v1/nodes/{node}/resume",
    tag = "nodes",
    params(("node" = String, Path, description = "The node's id or alias")),
    responses(
        (status = 200, description = "The resumed node", body = NodeView),
        (status = 401, description = "No valid admin key", body = ErrorBody),
        (status = 404, description = "No configured node has that id or alias", body = ErrorBody),
    ),
    security(("admin_key" = []))
)]
async fn resume_node(
    State(state): State<AdminState>,
    Path(node): Path<String>,
) -> Result<Json<NodeView>, AdminError> {
    let status = state.management.undrain(&node)?;
    Ok(Json(NodeView::of(&status)))
}
