//! `GET /admin/v1/models/events`: the feed of loads and unloads — the last ones the
//! lifecycle keeps, then, when followed, each new one as it happens — as JSON lines or
//! Server-Sent Events.

use axum::body::Bytes;
use axum::extract::rejection::QueryRejection;
use axum::extract::{Query, State};
use axum::http::HeaderMap;
use axum::response::Response;
use futures::{Stream, StreamExt};
use serde::Deserialize;
use tokio::sync::broadcast;
use utoipa::IntoParams;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::AdminState;
use super::error::AdminError;
use super::feed::{respond, wants_sse};
use super::views::{ErrorBody, ModelEventView};
use crate::ports::ModelEvent;

pub(super) fn register(router: OpenApiRouter<AdminState>) -> OpenApiRouter<AdminState> {
    router.routes(routes!(model_events))
}

/// How to answer.
#[derive(Debug, Default, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub(super) struct ModelEventParams {
    /// `true`: after the history, keep the answer open and send loads and unloads as they
    /// happen; `false` (default): only the history.
    follow: Option<bool>,
    /// `sse` or `jsonl`; without it, `sse` when `Accept` asks for `text/event-stream`, else
    /// `jsonl`.
    format: Option<String>,
}

/// The last loads and unloads (oldest first), then, followed, the next ones. A follower
/// that falls too far behind is disconnected: asking again replays the history.
#[utoipa::path(
    get,
    path = "/admin/v1/models/events",
    tag = "models",
    params(ModelEventParams),
    responses(
        (status = 200, description = "JSON lines: one event per line; SSE: `event` is the action (`load` or `unload`), `data` the event",
            content(
                (ModelEventView = "application/jsonl"),
                (String = "text/event-stream"),
            )),
        (status = 400, description = "A parameter is not valid", body = ErrorBody),
        (status = 401, description = "No valid admin key", body = ErrorBody),
    ),
    security(("admin_key" = []))
)]
async fn model_events(
    State(state): State<AdminState>,
    headers: HeaderMap,
    params: Result<Query<ModelEventParams>, QueryRejection>,
) -> Result<Response, AdminError> {
    let Query(params) = params.map_err(|e| AdminError::bad_request(e.body_text()))?;
    let sse = wants_sse(params.format.as_deref(), &headers)?;
    let (history, live) = match &state.models {
        Some(models) => models.model_events(),
        // Without a lifecycle nothing is ever loaded: an empty history, nothing to follow.
        None => return Ok(respond(futures::stream::empty(), sse)),
    };
    let live = params.follow.unwrap_or(false).then_some(live);
    let frames = events(history, live).map(move |event| frame(&ModelEventView::of(&event), sse));
    Ok(respond(frames, sse))
}

/// `history`, then what `live` receives until it closes or lags behind.
fn events(
    history: Vec<ModelEvent>,
    live: Option<broadcast::Receiver<ModelEvent>>,
) -> impl Stream<Item = ModelEvent> + Send + 'static {
    let next = futures::stream::unfold(live, |live| async move {
        let mut live = live?;
        // A lagged follower ends here rather than skip events unseen.
        let event = live.recv().await.ok()?;
        Some((event, Some(live)))
    });
    futures::stream::iter(history).chain(next)
}

/// `event` as one SSE record or one JSON line.
fn frame(event: &ModelEventView, sse: bool) -> Bytes {
    let json = serde_json::to_string(event).unwrap_or_default();
    Bytes::from(if sse {
        format!("event: {}\ndata: {json}\n\n", event.action)
    } else {
        json + "\n"
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::NodeId;
    use crate::domain::models::{ModelAction, ModelName};

    fn event(at_ms: u64) -> ModelEvent {
        ModelEvent {
            at_ms,
            model: ModelName::parse("llama/alpha").expect("a model"),
            node: Some(NodeId::parse("node-a").expect("a node")),
            action: ModelAction::Load.into(),
            reason: "demand".into(),
            outcome: "started",
            message: String::new(),
            took_ms: None,
            fit: None,
        }
    }

    async fn times(stream: impl Stream<Item = ModelEvent>) -> Vec<u64> {
        stream.map(|e| e.at_ms).collect().await
    }

    #[tokio::test]
    async fn the_history_comes_first_then_what_follows_until_the_feed_closes() {
        let (sender, receiver) = broadcast::channel(4);
        sender.send(event(3)).expect("a receiver");
        drop(sender);
        assert_eq!(
            times(events(vec![event(1), event(2)], Some(receiver))).await,
            [1, 2, 3]
        );
        assert_eq!(times(events(vec![event(1)], None)).await, [1]);
    }

    #[tokio::test]
    async fn a_follower_that_lagged_behind_is_ended() {
        let (sender, receiver) = broadcast::channel(1);
        for at in [3, 4] {
            sender.send(event(at)).expect("a receiver");
        }
        assert_eq!(times(events(vec![event(1)], Some(receiver))).await, [1]);
    }

    #[test]
    fn an_event_is_one_line_or_one_sse_record() {
        let view = ModelEventView::of(&event(7));
        let line = String::from_utf8(frame(&view, false).to_vec()).expect("UTF-8");
        assert!(
            line.starts_with("{\"at_ms\":7,") && line.ends_with("}\n"),
            "{line}"
        );
        let record = String::from_utf8(frame(&view, true).to_vec()).expect("UTF-8");
        assert!(
            record.starts_with("event: load\ndata: {") && record.ends_with("}\n\n"),
            "{record}"
        );
    }
}
