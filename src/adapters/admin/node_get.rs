//! `GET /admin/v1/nodes/{node}`: one node by id or alias.

use axum::Json;
use axum::extract::{Path, State};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::AdminState;
use super::error::AdminError;
use super::views::{ErrorBody, NodeView};

pub(super) fn register(router: OpenApiRouter<AdminState>) -> OpenApiRouter<AdminState> {
    router.routes(routes!(get_node))
}

/// One configured node.
#[utoipa::path(
    get,
    path = "/admin/v1/nodes/{node}",
    tag = "nodes",
    params(("node" = String, Path, description = "The node's id or alias")),
    responses(
        (status = 200, description = "The node", body = NodeView),
        (status = 401, description = "No valid admin key", body = ErrorBody),
        (status = 404, description = "No configured node has that id or alias", body = ErrorBody),
    ),
    security(("admin_key" = []))
)]
async fn get_node(
    State(state): State<AdminState>,
    Path(node): Path<String>,
) -> Result<Json<NodeView>, AdminError> {
    state
        .management
        .node(&node)
        .map(|status| Json(NodeView::of(&status)))
        .ok_or_else(|| AdminError::not_found(format!("no node has id or alias {node:?}")))
}
