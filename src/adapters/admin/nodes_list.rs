//! `GET /admin/v1/nodes`: every configured node, connected or not, and its state.

use axum::Json;
use axum::extract::State;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::AdminState;
use super::views::{ErrorBody, NodeList, NodeView};

pub(super) fn register(router: OpenApiRouter<AdminState>) -> OpenApiRouter<AdminState> {
    router.routes(routes!(list_nodes))
}

/// Every configured node, ordered by id.
#[utoipa::path(
    get,
    path = "/admin/v1/nodes",
    tag = "nodes",
    responses(
        (status = 200, description = "Every configured node", body = NodeList),
        (status = 401, description = "No valid admin key", body = ErrorBody),
    ),
    security(("admin_key" = []))
)]
async fn list_nodes(State(state): State<AdminState>) -> Json<NodeList> {
    let nodes = state.management.nodes().iter().map(NodeView::of).collect();
    Json(NodeList {
        nodes,
        now_ms: state.management.now_ms(),
    })
}
