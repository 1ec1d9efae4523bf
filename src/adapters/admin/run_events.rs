//! `GET /admin/v1/runs/{run}/events`: a run's events replayed from the journal, then live
//! while the run is open, as Server-Sent Events or JSON lines.

use axum::body::Bytes;
use axum::extract::rejection::QueryRejection;
use axum::extract::{Path, Query, State};
use axum::http::HeaderMap;
use axum::response::Response;
use futures::StreamExt;
use serde::Deserialize;
use utoipa::IntoParams;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::AdminState;
use super::error::AdminError;
use super::feed::{respond, wants_sse};
use super::views::ErrorBody;
use crate::adapters::event_format::feed_json;
use crate::domain::RunId;
use crate::ports::FeedItem;

pub(super) fn register(router: OpenApiRouter<AdminState>) -> OpenApiRouter<AdminState> {
    router.routes(routes!(run_events))
}

/// Where to start and how to answer.
#[derive(Debug, Default, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub(super) struct EventParams {
    /// Only events after this position (an SSE `id`); `Last-Event-ID` does the same.
    after: Option<u64>,
    /// `true` (default): keep the answer open and send events as they happen until the run
    /// ends; `false`: only what has happened so far.
    follow: Option<bool>,
    /// `sse` or `jsonl`; without it, `sse` when `Accept` asks for `text/event-stream`.
    format: Option<String>,
}

/// A run's events, each exactly as the `file` sink writes it.
#[utoipa::path(
    get,
    path = "/admin/v1/runs/{run}/events",
    tag = "runs",
    params(("run" = String, Path, description = "The run's id"), EventParams),
    responses(
        (status = 200, description = "SSE: `id` is the event's position, `event` its kind, `data` the event; JSON lines: one event per line",
            content(
                (String = "text/event-stream"),
                (String = "application/jsonl"),
            )),
        (status = 400, description = "A parameter is not valid", body = ErrorBody),
        (status = 401, description = "No valid admin key", body = ErrorBody),
        (status = 404, description = "No open or journaled run has that id", body = ErrorBody),
    ),
    security(("admin_key" = []))
)]
async fn run_events(
    State(state): State<AdminState>,
    Path(run): Path<String>,
    headers: HeaderMap,
    params: Result<Query<EventParams>, QueryRejection>,
) -> Result<Response, AdminError> {
    let Query(params) = params.map_err(|e| AdminError::bad_request(e.body_text()))?;
    let sse = wants_sse(params.format.as_deref(), &headers)?;
    let last_event_id = headers
        .get("last-event-id")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok());
    let from = params
        .after
        .or(last_event_id)
        .map_or(0, |a| a.saturating_add(1));
    let follow = params.follow.unwrap_or(true);
    let feed = state
        .management
        .events(&RunId::new(run.as_str()), from, follow)
        .await?;
    let frames = feed.map(move |item| {
        Bytes::from(if sse {
            sse_frame(&item)
        } else {
            feed_json(&item.event).into_owned() + "\n"
        })
    });
    Ok(respond(frames, sse))
}

fn sse_frame(item: &FeedItem) -> String {
    format!(
        "id: {}\nevent: {}\ndata: {}\n\n",
        item.index,
        item.kind,
        feed_json(&item.event)
    )
}
