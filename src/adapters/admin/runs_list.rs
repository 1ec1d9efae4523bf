//! `GET /admin/v1/runs`: runs newest first, open and finished, filtered, a page at a time.

use axum::Json;
use axum::extract::rejection::QueryRejection;
use axum::extract::{Query, State};
use serde::Deserialize;
use utoipa::IntoParams;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::AdminState;
use super::error::AdminError;
use super::views::{ErrorBody, RunList, RunView};
use crate::adapters::journal::HumanDuration;
use crate::domain::{AdapterName, NodeId, RunCursor, RunOutcome, RunQuery, RunStateFilter, Target};

/// Runs per page when `limit` is not given.
const DEFAULT_LIMIT: usize = 100;
/// The largest page.
const MAX_LIMIT: usize = 1_000;

pub(super) fn register(router: OpenApiRouter<AdminState>) -> OpenApiRouter<AdminState> {
    router.routes(routes!(list_runs))
}

/// The filters and page of a run listing; every one is optional.
#[derive(Debug, Default, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub(super) struct RunListParams {
    /// `open`, `finished` or `all` (the default).
    state: Option<String>,
    /// Only runs placed on this node (id or alias), at any attempt.
    node: Option<String>,
    /// Only runs for this adapter.
    adapter: Option<String>,
    /// Only runs for this target.
    target: Option<String>,
    /// Only runs that ended this way: `completed`, `failed`, `cancelled`, `unknown`, or
    /// `open`.
    outcome: Option<String>,
    /// Only runs whose caller used the API key of this name (`[[api.keys]]` `name`).
    key: Option<String>,
    /// Only runs accepted since then: ms since the Unix epoch, or a time ago with a unit
    /// (`90s`, `15m`, `2h`, `7d`).
    since: Option<String>,
    /// The previous page's `next_cursor`.
    cursor: Option<String>,
    /// Runs per page, 1 to 1000 (default 100).
    limit: Option<String>,
}

/// Runs, newest first.
#[utoipa::path(
    get,
    path = "/admin/v1/runs",
    tag = "runs",
    params(RunListParams),
    responses(
        (status = 200, description = "One page of runs", body = RunList),
        (status = 400, description = "A filter is not valid", body = ErrorBody),
        (status = 401, description = "No valid admin key", body = ErrorBody),
        (status = 503, description = "The journal cannot be read", body = ErrorBody),
    ),
    security(("admin_key" = []))
)]
async fn list_runs(
    State(state): State<AdminState>,
    params: Result<Query<RunListParams>, QueryRejection>,
) -> Result<Json<RunList>, AdminError> {
    let Query(params) = params.map_err(|e| AdminError::bad_request(e.body_text()))?;
    let query = run_query(&state, params)?;
    let page = state.management.runs(&query).await?;
    Ok(Json(RunList {
        runs: page.runs.iter().map(RunView::of).collect(),
        next_cursor: page.next.map(|c| c.encode()),
    }))
}

fn run_query(state: &AdminState, params: RunListParams) -> Result<RunQuery, AdminError> {
    let bad = |what: &str| AdminError::bad_request(what.to_owned());
    let state_filter = match params.state.as_deref() {
        None | Some("all") => RunStateFilter::Any,
        Some("open") => RunStateFilter::Open,
        Some("finished") => RunStateFilter::Finished,
        Some(_) => return Err(bad("`state` must be open, finished or all")),
    };
    let node = params
        .node
        .map(|name| match state.management.node(&name) {
            Some(status) => Ok(status.record.id().clone()),
            None => NodeId::parse(&name).map_err(|e| bad(&format!("`node`: {e}"))),
        })
        .transpose()?;
    let limit = match params.limit {
        None => DEFAULT_LIMIT,
        Some(text) => text
            .parse()
            .ok()
            .filter(|n| (1..=MAX_LIMIT).contains(n))
            .ok_or_else(|| bad("`limit` must be a number from 1 to 1000"))?,
    };
    Ok(RunQuery {
        state: state_filter,
        node,
        adapter: params
            .adapter
            .map(|a| AdapterName::parse(&a).map_err(|e| bad(&format!("`adapter`: {e}"))))
            .transpose()?,
        target: params
            .target
            .map(|t| Target::parse(&t).map_err(|e| bad(&format!("`target`: {e}"))))
            .transpose()?,
        outcome: params
            .outcome
            .map(|o| RunOutcome::parse(&o).ok_or_else(|| bad("`outcome` is not an outcome")))
            .transpose()?,
        api_key_name: params.key,
        since_ms: params
            .since
            .map(|s| time_ms("since", &s, state.management.now_ms()))
            .transpose()?,
        after: params
            .cursor
            .map(|c| RunCursor::decode(&c).ok_or_else(|| bad("`cursor` is not a cursor")))
            .transpose()?,
        limit,
    })
}

/// A time parameter (`since`, `until`) as ms since the Unix epoch: digits are taken as
/// such, a duration as that long before `now_ms`.
pub(super) fn time_ms(name: &str, text: &str, now_ms: u64) -> Result<u64, AdminError> {
    if !text.is_empty() && text.bytes().all(|b| b.is_ascii_digit()) {
        return text
            .parse()
            .map_err(|_| AdminError::bad_request(format!("`{name}` is out of range")));
    }
    let ago = HumanDuration::parse(text).ok_or_else(|| {
        AdminError::bad_request(format!(
            "`{name}` must be ms since the Unix epoch or a duration such as 15m"
        ))
    })?;
    let ago_ms = u64::try_from(ago.0.as_millis()).unwrap_or(u64::MAX);
    Ok(now_ms.saturating_sub(ago_ms))
}
