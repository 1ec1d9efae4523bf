//! Background responses found again by id: `GET /v1/responses/{id}` (the response object,
//! or with `?stream=true&starting_after=N` the event stream resumed after sequence number
//! N) and `POST /v1/responses/{id}/cancel`. Everything comes from the run's record and
//! events through the management port (the journal, then the live relay), so a response
//! survives its caller's connection and an edge restart alike; the id names the run.
//!
//! The replayed stream is the first stream again: the translator is fed the same events in
//! the same order, so every event has the same `sequence_number`.

use std::convert::Infallible;

use axum::Json;
use axum::body::{Body, Bytes};
use axum::extract::rejection::QueryRejection;
use axum::extract::{Path, Query, State};
use axum::response::{IntoResponse as _, Response};
use serde::Deserialize;
use serde_json::Value;

use super::{BACKGROUND_ID_PREFIX, response_id};
use crate::adapters::api::ApiError;
use crate::adapters::api::ApiState;
use crate::adapters::api::auth::Caller;
use crate::adapters::api::follow::{EVENTS_STOPPED, Followed, RunFollower};
use crate::adapters::api::models::ModelRoute;
use crate::adapters::api::response::ErrorShape;
use crate::adapters::api::sse::event_stream;
use crate::adapters::api::translate::write_all;
use crate::adapters::api::translators::frame::SseFrame;
use crate::adapters::api::translators::responses::items::ResponseBase;
use crate::adapters::api::translators::responses::replay::{Replayed, replayed};
use crate::adapters::api::translators::responses::stream::ResponsesStream;
use crate::adapters::api::translators::{ApiEvent, StreamTranslator};
use crate::adapters::event_format::feed_json;
use crate::domain::{RunId, RunRecord};
use crate::ports::{FeedStream, ManageError};

/// The reason a run cancelled by `POST /v1/responses/{id}/cancel` ends with.
const CANCELLED_BY_CALLER: &str = "cancelled by its caller";

/// `GET /v1/responses/{id}`'s query.
#[derive(Debug, Deserialize)]
pub(in crate::adapters::api) struct RetrieveQuery {
    /// Answer with the event stream rather than the response object.
    #[serde(default)]
    stream: bool,
    /// Resume the stream after the event with this sequence number.
    starting_after: Option<u64>,
}

/// `GET /v1/responses/{id}`.
pub(in crate::adapters::api) async fn retrieve(
    State(state): State<ApiState>,
    caller: Caller,
    Path(id): Path<String>,
    query: Result<Query<RetrieveQuery>, QueryRejection>,
) -> Response {
    let answer = async {
        let Query(query) = query.map_err(|e| ApiError::invalid("stream", e.body_text()))?;
        let (run_id, base) = find(&state, &caller, &id).await?;
        if query.stream {
            let feed = events(&state, &run_id, 0, true).await?;
            let after = query.starting_after;
            Ok(stream(state, run_id, feed, Replay::new(base, after)))
        } else {
            let feed = events(&state, &run_id, 0, false).await?;
            Ok(
                Json(whole(feed, Replay::new(base, None), retry_after(&state)).await)
                    .into_response(),
            )
        }
    };
    answer
        .await
        .unwrap_or_else(|error| ErrorShape::OpenAi.render(&error))
}

/// `POST /v1/responses/{id}/cancel`: cancels the run (reason [`CANCELLED_BY_CALLER`]),
/// waits for its end, and answers
/// with the response (cancelled, or as it ended if it had already).
pub(in crate::adapters::api) async fn cancel(
    State(state): State<ApiState>,
    caller: Caller,
    Path(id): Path<String>,
) -> Response {
    let answer = async {
        if !id.starts_with(BACKGROUND_ID_PREFIX) && id.starts_with("resp_") {
            let message = "Only responses created with `background: true` can be cancelled.";
            return Err(ApiError::bad_request(None, "invalid_request", message));
        }
        let (run_id, base) = find(&state, &caller, &id).await?;
        // A run that has ended already is answered as it ended.
        state.runs.cancel(&run_id, CANCELLED_BY_CALLER).await;
        let feed = events(&state, &run_id, 0, true).await?;
        Ok(Json(whole(feed, Replay::new(base, None), retry_after(&state)).await).into_response())
    };
    answer
        .await
        .unwrap_or_else(|error| ErrorShape::OpenAi.render(&error))
}

/// The run behind response `id`, and what its response starts from, if the caller may
/// see it (the API key that created it, or anyone on an open API).
///
/// # Errors
/// 404 for an unknown id or another key's response; 400 for a cancel of a response that
/// is not a background one.
async fn find(
    state: &ApiState,
    caller: &Caller,
    id: &str,
) -> Result<(RunId, ResponseBase), ApiError> {
    let not_found = || ApiError::response_not_found(id);
    let Some(run) = id.strip_prefix(BACKGROUND_ID_PREFIX) else {
        return Err(not_found());
    };
    let run_id = RunId::new(run);
    let record = match state.manage.run(&run_id).await {
        Ok(Some(record)) => record,
        Ok(None) => return Err(not_found()),
        Err(error) => return Err(manage_error(id, &error)),
    };
    if !caller.owns(&record.accepted) {
        return Err(not_found());
    }
    let base = base_of(&record);
    Ok((run_id, base))
}

/// A background response's base, from its run's record: the model as `ADAPTER/TARGET`,
/// created when the run was accepted. The request's `instructions`, tool namespaces and
/// whether it was a compaction are not kept.
fn base_of(record: &RunRecord) -> ResponseBase {
    let accepted = &record.accepted;
    let route = ModelRoute {
        adapter: accepted.adapter.clone(),
        target: accepted.target.clone(),
    };
    ResponseBase {
        id: response_id(&accepted.run_id, true),
        model: route.id(),
        created_at: accepted.queued_ms / 1000,
        instructions: Value::Null,
        namespaces: std::collections::BTreeMap::new(),
        background: true,
        compaction: false,
    }
}

async fn events(
    state: &ApiState,
    run_id: &RunId,
    from: u64,
    follow: bool,
) -> Result<FeedStream, ApiError> {
    state
        .manage
        .events(run_id, from, follow)
        .await
        .map_err(|error| manage_error(&response_id(run_id, true), &error))
}

fn manage_error(id: &str, error: &ManageError) -> ApiError {
    match error {
        ManageError::UnknownRun(_) => ApiError::response_not_found(id),
        error => ApiError::internal(error.to_string()),
    }
}

fn retry_after(state: &ApiState) -> u64 {
    state.api.config().retry_after_secs
}

/// The translator fed a run's events again, keeping the events after `after` only.
struct Replay {
    stream: ResponsesStream,
    after: Option<u64>,
    /// The last event the translator wrote, once the run has ended.
    end: Option<ApiEvent>,
}

impl Replay {
    fn new(base: ResponseBase, after: Option<u64>) -> Self {
        Self {
            stream: ResponsesStream::new(base),
            after,
            end: None,
        }
    }

    /// The stream's opening events.
    fn open(&mut self) -> Vec<ApiEvent> {
        // The Responses stream opens with no counts (its `response.created` has none).
        let events = self.stream.open(None);
        self.keep(events)
    }

    /// The events one of the run's events makes.
    fn feed(&mut self, kind: &str, json: &str, retry_after_secs: u64) -> Vec<ApiEvent> {
        let events = match replayed(kind, json, retry_after_secs) {
            Replayed::Output(text, structured) => self.stream.output(&text, structured.as_ref()),
            Replayed::End(end) => self.close(end.as_ref()),
            Replayed::Skip => Vec::new(),
        };
        self.keep(events)
    }

    fn close(
        &mut self,
        end: Result<&crate::adapters::api::translators::output::Finished, &ApiError>,
    ) -> Vec<ApiEvent> {
        let events = self.stream.close(end);
        self.end = events.last().cloned();
        events
    }

    fn keep(&self, mut events: Vec<ApiEvent>) -> Vec<ApiEvent> {
        if let Some(after) = self.after {
            events.retain(|event| event.data["sequence_number"].as_u64() > Some(after));
        }
        events
    }
}

/// The response object after every event `feed` yields: as the run ended, or in progress
/// with its output so far.
async fn whole(mut feed: FeedStream, mut replay: Replay, retry_after_secs: u64) -> Value {
    use futures::StreamExt as _;
    while let Some(item) = feed.next().await {
        replay.feed(&item.kind, &feed_json(&item.event), retry_after_secs);
    }
    match replay.end {
        Some(mut end) => end.data["response"].take(),
        None => replay.stream.snapshot(),
    }
}

/// What the resumed stream's body reads from.
struct Resumed {
    follower: RunFollower,
    retry_after_secs: u64,
    replay: Replay,
    done: bool,
}

/// The Responses event stream of run `run_id`, replayed and then followed.
fn stream(state: ApiState, run_id: RunId, feed: FeedStream, mut replay: Replay) -> Response {
    let mut first = SseFrame::default();
    write_all(&mut first, replay.open());
    let resumed = Resumed {
        retry_after_secs: retry_after(&state),
        follower: RunFollower::new(state, run_id, feed),
        replay,
        done: false,
    };
    let opening = futures::stream::iter([Ok::<_, Infallible>(first.split())]);
    let rest = futures::stream::unfold(resumed, |mut resumed| async move {
        let frame = resumed.next_frame().await?;
        Some((Ok::<_, Infallible>(frame), resumed))
    });
    event_stream(Body::from_stream(futures::StreamExt::chain(opening, rest)))
}

impl Resumed {
    /// The next events, written; `None` once the run's end has been written. Events that
    /// stop before the run's end end the stream with an error event.
    async fn next_frame(&mut self) -> Option<Bytes> {
        while !self.done {
            let events = match self.follower.next(None).await {
                Followed::Event(item) => {
                    self.replay
                        .feed(&item.kind, &feed_json(&item.event), self.retry_after_secs)
                }
                Followed::Silent | Followed::Stopped => {
                    let error = ApiError::internal(EVENTS_STOPPED);
                    let events = self.replay.close(Err(&error));
                    self.replay.keep(events)
                }
            };
            self.done = self.replay.end.is_some();
            if !events.is_empty() {
                let mut frame = SseFrame::default();
                write_all(&mut frame, events);
                return Some(frame.split());
            }
        }
        None
    }
}
