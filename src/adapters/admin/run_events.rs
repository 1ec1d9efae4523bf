//! `GET /admin/v1/runs/{run}/events`: a run's events replayed from the journal, then live
//! while the run is open, as Server-Sent Events or JSON lines.

use std::convert::Infallible;
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::rejection::QueryRejection;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, HeaderValue, header};
use axum::response::{IntoResponse, Response};
use futures::StreamExt;
use serde::Deserialize;
use utoipa::IntoParams;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::AdminState;
use super::error::AdminError;
use super::views::ErrorBody;
use crate::adapters::event_format::feed_json;
use crate::domain::RunId;
use crate::ports::{FeedItem, FeedStream};

/// How long an SSE stream may stay silent before a keep-alive comment.
const KEEP_ALIVE: Duration = Duration::from_secs(15);

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
    let sse = match params.format.as_deref() {
        Some("sse") => true,
        Some("jsonl") => false,
        Some(_) => return Err(AdminError::bad_request("`format` must be sse or jsonl")),
        None => headers
            .get(header::ACCEPT)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.contains("text/event-stream")),
    };
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
    Ok(respond(feed, sse))
}

fn respond(feed: FeedStream, sse: bool) -> Response {
    let content_type = if sse {
        "text/event-stream"
    } else {
        "application/jsonl"
    };
    let body = if sse {
        Body::from_stream(sse_stream(feed))
    } else {
        Body::from_stream(feed.map(|item| {
            Ok::<_, Infallible>(Bytes::from(feed_json(&item.event).into_owned() + "\n"))
        }))
    };
    let mut response = body.into_response();
    let headers = response.headers_mut();
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    response
}

/// Each event as `id`, `event` and `data` lines; a comment after each silent
/// [`KEEP_ALIVE`], so proxies and clients know the stream is alive.
fn sse_stream(feed: FeedStream) -> impl futures::Stream<Item = Result<Bytes, Infallible>> + Send {
    futures::stream::unfold(Some(feed), |feed| async move {
        let mut feed = feed?;
        match tokio::time::timeout(KEEP_ALIVE, feed.next()).await {
            Ok(Some(item)) => Some((Ok(Bytes::from(sse_frame(&item))), Some(feed))),
            Ok(None) => None,
            Err(_) => Some((Ok(Bytes::from_static(b": keep-alive\n\n")), Some(feed))),
        }
    })
}

fn sse_frame(item: &FeedItem) -> String {
    format!(
        "id: {}\nevent: {}\ndata: {}\n\n",
        item.index,
        item.kind,
        feed_json(&item.event)
    )
}
