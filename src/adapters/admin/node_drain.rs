//! `POST /admin/v1/nodes/{node}/drain`: no new runs for the node; its runs finish, or are
//! cancelled at the optional deadline. The node stays registered.

use axum::Json;
use axum::body::Bytes;
use axum::extract::{Path, State};
use std::time::Duration;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::AdminState;
use super::error::AdminError;
use super::views::{DrainRequest, ErrorBody, NodeView};

pub(super) fn register(router: OpenApiRouter<AdminState>) -> OpenApiRouter<AdminState> {
    router.routes(routes!(drain_node))
}

/// Drains a node (again: a new drain replaces the deadline).
#[utoipa::path(
    post,
    path = "/admin/v1/nodes/{node}/drain",
    tag = "nodes",
    params(("node" = String, Path, description = "The node's id or alias")),
    request_body(content = Option<DrainRequest>, description = "Optional: a deadline", content_type = "application/json"),
    responses(
        (status = 200, description = "The drained node", body = NodeView),
        (status = 400, description = "The body is not a drain request", body = ErrorBody),
        (status = 401, description = "No valid admin key", body = ErrorBody),
        (status = 404, description = "No configured node has that id or alias", body = ErrorBody),
    ),
    security(("admin_key" = []))
)]
async fn drain_node(
    State(state): State<AdminState>,
    Path(node): Path<String>,
    body: Bytes,
) -> Result<Json<NodeView>, AdminError> {
    let request: DrainRequest = if body.iter().all(u8::is_ascii_whitespace) {
        DrainRequest::default()
    } else {
        serde_json::from_slice(&body)
            .map_err(|error| AdminError::bad_request(format!("not a drain request: {error}")))?
    };
    let deadline = request.deadline_seconds.map(Duration::from_secs);
    let status = state.management.drain(&node, deadline)?;
    Ok(Json(NodeView::of(&status)))
}
