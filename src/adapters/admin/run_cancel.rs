//! `DELETE /admin/v1/runs/{run}`: cancels an open run, as its caller could.

use axum::Json;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::AdminState;
use super::error::AdminError;
use super::views::{CancelView, ErrorBody};
use crate::domain::RunId;

pub(super) fn register(router: OpenApiRouter<AdminState>) -> OpenApiRouter<AdminState> {
    router.routes(routes!(cancel_run))
}

/// Cancels an open run: a queued run ends at once; a running one is sent `CancelRun` and
/// ends with the node's answer, or the edge's own `cancelled` after the cancel grace.
#[utoipa::path(
    delete,
    path = "/admin/v1/runs/{run}",
    tag = "runs",
    params(("run" = String, Path, description = "The run's id")),
    responses(
        (status = 202, description = "The cancel was sent", body = CancelView),
        (status = 401, description = "No valid admin key", body = ErrorBody),
        (status = 404, description = "No run has that id", body = ErrorBody),
        (status = 409, description = "The run has already ended", body = ErrorBody),
    ),
    security(("admin_key" = []))
)]
async fn cancel_run(
    State(state): State<AdminState>,
    Path(run): Path<String>,
) -> Result<(StatusCode, Json<CancelView>), AdminError> {
    state.management.cancel(&RunId::new(run.as_str())).await?;
    let view = CancelView {
        id: run,
        cancelling: true,
    };
    Ok((StatusCode::ACCEPTED, Json(view)))
}
