//! `GET /admin/v1/stats`: the last hour of runs in 10-second buckets — requests, errors,
//! output tokens, time to first output and queue depth — for the whole edge and per node,
//! from the series the edge keeps in memory (no Prometheus needed to draw a chart).

use axum::Json;
use axum::extract::State;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::AdminState;
use super::views::{ErrorBody, StatsView};

pub(super) fn register(router: OpenApiRouter<AdminState>) -> OpenApiRouter<AdminState> {
    router.routes(routes!(stats))
}

/// The last hour, in buckets; buckets without activity are left out.
#[utoipa::path(
    get,
    path = "/admin/v1/stats",
    tag = "stats",
    responses(
        (status = 200, description = "The last hour's buckets, whole edge and per node", body = StatsView),
        (status = 401, description = "No valid admin key", body = ErrorBody),
    ),
    security(("admin_key" = []))
)]
async fn stats(State(state): State<AdminState>) -> Json<StatsView> {
    let now_ms = state.management.now_ms();
    Json(StatsView::of(&state.management.stats(), now_ms))
}
