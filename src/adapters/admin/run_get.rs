//! `GET /admin/v1/runs/{run}`: one run's record, open or finished (after a restart too,
//! with the journal on).

use axum::Json;
use axum::extract::{Path, State};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::error::AdminError;
use super::views::{ErrorBody, RunView};
use super::{AdminState, standby};
use crate::domain::RunId;

pub(super) fn register(router: OpenApiRouter<AdminState>) -> OpenApiRouter<AdminState> {
    router.routes(routes!(get_run))
}

/// One run's record.
#[utoipa::path(
    get,
    path = "/admin/v1/runs/{run}",
    tag = "runs",
    params(("run" = String, Path, description = "The run's id")),
    responses(
        (status = 200, description = "The run", body = RunView),
        (status = 401, description = "No valid admin key", body = ErrorBody),
        (status = 404, description = "No open or journaled run has that id", body = ErrorBody),
        (status = 503, description = "The journal cannot be read; or this member stands by and its copy of the site's journal does not hold the run (yet)", body = ErrorBody),
    ),
    security(("admin_key" = []))
)]
async fn get_run(
    State(state): State<AdminState>,
    Path(run): Path<String>,
) -> Result<Json<RunView>, AdminError> {
    let id = RunId::new(run.as_str());
    match state.management.run(&id).await? {
        Some(record) => Ok(Json(RunView::of(&record))),
        None => Err(standby::run_not_known(&state, &run)),
    }
}
