//! `GET /admin/v1/usage`: what runs consumed, from the journal's usage rollups, summed by
//! key, model, node and affinity source as asked, over a range, optionally per bucket.

use axum::Json;
use axum::extract::rejection::QueryRejection;
use axum::extract::{Query, State};
use serde::Deserialize;
use utoipa::IntoParams;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::AdminState;
use super::error::AdminError;
use super::runs_list::time_ms;
use super::views::{ErrorBody, UsageCountsView, UsageReport, UsageRowView};
use crate::domain::{Bucket, GroupBy, UsageCounts, UsageQuery};

pub(super) fn register(router: OpenApiRouter<AdminState>) -> OpenApiRouter<AdminState> {
    router.routes(routes!(get_usage))
}

/// What to sum and over which range; every one is optional.
#[derive(Debug, Default, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub(super) struct UsageParams {
    /// The dimensions to split by, comma-separated: any of `key`, `model`, `node`,
    /// `affinity` (the source of the runs' affinity keys) (none: one row of totals).
    group_by: Option<String>,
    /// Runs that ended since then: ms since the Unix epoch, or a time ago with a unit
    /// (`90s`, `15m`, `2h`, `7d`); rounded down to its bucket's start. Default: everything
    /// retained.
    since: Option<String>,
    /// Runs that ended before then (buckets that start before it), in the same forms.
    /// Default: now (the current bucket included).
    until: Option<String>,
    /// `minute`, `hour` or `day`: one row per bucket of that size. Without it, totals over
    /// the range, read from the hourly rollups (so `since` rounds down to its hour).
    bucket: Option<String>,
}

/// Usage by API key, model, node and affinity source.
#[utoipa::path(
    get,
    path = "/admin/v1/usage",
    tag = "usage",
    params(UsageParams),
    responses(
        (status = 200, description = "Usage sums, with the cache hit rate", body = UsageReport),
        (status = 400, description = "A parameter is not valid", body = ErrorBody),
        (status = 401, description = "No valid admin key", body = ErrorBody),
        (status = 503, description = "The journal is disabled or cannot be read", body = ErrorBody),
    ),
    security(("admin_key" = []))
)]
async fn get_usage(
    State(state): State<AdminState>,
    params: Result<Query<UsageParams>, QueryRejection>,
) -> Result<Json<UsageReport>, AdminError> {
    let Query(params) = params.map_err(|e| AdminError::bad_request(e.body_text()))?;
    let query = usage_query(&state, &params)?;
    let rows = state.management.usage(&query).await?;
    let mut totals = UsageCounts::default();
    for row in &rows {
        totals.add(&row.counts);
    }
    let by = query.group_by;
    let group_by = [
        ("key", by.key),
        ("model", by.model),
        ("node", by.node),
        ("affinity", by.affinity),
    ]
    .into_iter()
    .filter(|&(_, on)| on)
    .map(|(name, _)| name.to_owned())
    .collect();
    Ok(Json(UsageReport {
        bucket: query.bucket.as_str().to_owned(),
        per_bucket: query.per_bucket,
        group_by,
        since_ms: query.bucket.start_of(query.since_ms),
        until_ms: query.until_ms,
        rows: rows.iter().map(UsageRowView::of).collect(),
        totals: UsageCountsView::of(&totals),
    }))
}

fn usage_query(state: &AdminState, params: &UsageParams) -> Result<UsageQuery, AdminError> {
    let now = state.management.now_ms();
    let group_by = GroupBy::parse(params.group_by.as_deref().unwrap_or_default())
        .map_err(|error| AdminError::bad_request(error.to_string()))?;
    let bucket = params
        .bucket
        .as_deref()
        .map(|b| {
            Bucket::parse(b)
                .ok_or_else(|| AdminError::bad_request("`bucket` must be minute, hour or day"))
        })
        .transpose()?;
    let since_ms = params
        .since
        .as_deref()
        .map(|s| time_ms("since", s, now))
        .transpose()?
        .unwrap_or(0);
    let until_ms = params
        .until
        .as_deref()
        .map(|u| time_ms("until", u, now))
        .transpose()?
        .unwrap_or(now + 1);
    Ok(UsageQuery {
        group_by,
        since_ms,
        until_ms,
        bucket: bucket.unwrap_or(Bucket::Hour),
        per_bucket: bucket.is_some(),
    })
}
