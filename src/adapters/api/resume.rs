//! `GET /v1/runs/{run_id}/stream`: a streamed chat completion, completion or Messages
//! answer resumed after `Last-Event-ID`, in the API the run was started with — the same
//! ids, model name and framing as the first stream, because the same writer is fed the
//! run's events again (from the journal, then live, through the management port), and every
//! SSE event gets the same [`EventId`] from its run event's position. Works across a
//! client's network drop and across an edge restart alike.
//!
//! What the journal lacks to render the stream ([`ResumableStream`]: which API, the model as
//! the client named it, ...) is kept in the run's record from its start. The resumed
//! reader keeps the run from being cancelled for want of one (`Runs::reader_back`).

use std::sync::Arc;

use axum::body::{Body, Bytes};
use axum::extract::{Path, State};
use axum::http::HeaderMap;
use axum::response::Response;

use super::ApiError;
use super::anthropic;
use super::auth::Caller;
use super::follow::{Followed, RunFollower};
use super::response::ErrorShape;
use super::responses::{Replayed, replayed};
use super::run::{CancelOnDrop, RUN_ID_HEADER};
use super::sse::{KEEP_ALIVE_INTERVAL, StreamCut, event_stream};
use crate::adapters::api::ApiState;
use crate::adapters::api::translators::ResumableStream;
use crate::adapters::api::translators::frame::{EventId, EventWriter, SseFrame};
use crate::adapters::api::translators::openai::chunks::ChunkWriter;
use crate::adapters::api::translators::openai::{Endpoint, Reply};
use crate::adapters::event_format::feed_json;
use crate::domain::{RunId, Usage};
use crate::ports::{FeedStream, ManageError, Runs};

/// The header a resuming client names the last event it has in (SSE's own).
const LAST_EVENT_ID: &str = "last-event-id";

/// `GET /v1/runs/{run_id}/stream`.
pub(super) async fn resume(
    State(state): State<ApiState>,
    caller: Caller,
    Path(run): Path<String>,
    headers: HeaderMap,
) -> Response {
    let run_id = RunId::new(run.as_str());
    let answer = async {
        let after = match headers.get(LAST_EVENT_ID).map(|v| v.to_str()) {
            None => None,
            Some(Ok(id)) if id.trim().is_empty() => None,
            Some(Ok(id)) => Some(EventId::parse(id).ok_or_else(|| {
                ApiError::invalid("Last-Event-ID", format!("{id:?} is not an event id"))
            })?),
            Some(Err(_)) => {
                let message = "is not an event id".to_owned();
                return Err(ApiError::invalid("Last-Event-ID", message));
            }
        };
        let stream = find(&state, &caller, &run_id).await?;
        // A reader first, then the feed: the run's grace cannot run out in between.
        let reader = state
            .runs
            .reader_back(&run_id)
            .then(|| CancelOnDrop::resumed(Arc::clone(&state.runs), run_id.clone()));
        let feed = events(&state, &run_id, 0).await?;
        let frame = SseFrame::resumed(after);
        let resumed = (state.clone(), run_id.clone(), feed, frame, reader);
        Ok(match stream {
            ResumableStream::Chat {
                model,
                created,
                include_usage,
            } => openai(resumed, Endpoint::Chat, model, created, include_usage),
            ResumableStream::Completion {
                model,
                created,
                include_usage,
            } => openai(resumed, Endpoint::Completion, model, created, include_usage),
            ResumableStream::Messages { model, thinking } => {
                let writer = anthropic::stream_writer(&run_id, model, thinking);
                respond(Resumed::new(resumed, writer))
            }
        })
    };
    match answer.await {
        Ok(mut response) => {
            if let Ok(value) = run_id.as_str().parse() {
                response.headers_mut().insert(RUN_ID_HEADER, value);
            }
            response
        }
        Err(error) => ErrorShape::OpenAi.render(&error),
    }
}

/// How run `run_id`'s stream is rendered, if the caller may see it (the API key that
/// started it, or anyone on an open API) and it can be resumed.
///
/// # Errors
/// 404 for an unknown run, another key's run, or a run whose stream cannot be resumed.
async fn find(
    state: &ApiState,
    caller: &Caller,
    run_id: &RunId,
) -> Result<ResumableStream, ApiError> {
    let not_found = || ApiError::stream_not_found(run_id.as_str());
    let record = match state.manage.run(run_id).await {
        Ok(Some(record)) if caller.owns(&record.accepted) => record,
        Ok(_) => return Err(not_found()),
        Err(error) => return Err(manage_error(&error, not_found)),
    };
    record
        .accepted
        .client_stream
        .as_deref()
        .and_then(|json| serde_json::from_str(json).ok())
        .ok_or_else(not_found)
}

async fn events(state: &ApiState, run_id: &RunId, from: u64) -> Result<FeedStream, ApiError> {
    let not_found = || ApiError::stream_not_found(run_id.as_str());
    state
        .manage
        .events(run_id, from, true)
        .await
        .map_err(|error| manage_error(&error, not_found))
}

fn manage_error(error: &ManageError, not_found: impl FnOnce() -> ApiError) -> ApiError {
    match error {
        ManageError::UnknownRun(_) => not_found(),
        error => ApiError::internal(error.to_string()),
    }
}

/// What every resumed stream starts from: the edge, the run, its events, the frame that
/// skips what the caller has, and the reader's hold on the run.
type Start = (ApiState, RunId, FeedStream, SseFrame, Option<CancelOnDrop>);

/// The resumed OpenAI stream of `endpoint`.
fn openai(
    start: Start,
    endpoint: Endpoint,
    model: String,
    created: u64,
    include_usage: bool,
) -> Response {
    let reply = Reply::new(endpoint, &start.1, model, created, include_usage);
    respond(Resumed::new(start, ChunkWriter::new(&reply)))
}

fn respond<W: EventWriter>(resumed: Resumed<W>) -> Response {
    let body = futures::stream::unfold(resumed, |mut resumed| async move {
        let frame = resumed.next_frame().await?;
        Some((frame, resumed))
    });
    event_stream(Body::from_stream(body))
}

/// What the resumed stream's body reads from and writes with.
struct Resumed<W> {
    follower: RunFollower,
    retry_after_secs: u64,
    writer: W,
    frame: SseFrame,
    opened: bool,
    done: bool,
    /// The run's events stopped before its end (this member let it go): the stream is
    /// broken off once what is rendered is sent, and resumed on the member that acts now.
    cut: bool,
    /// The reader's hold on an open run; `None` once the run ended.
    reader: Option<CancelOnDrop>,
    /// Asked whether an end read from the journal may be shown yet.
    runs: Arc<dyn Runs>,
}

impl<W: EventWriter> Resumed<W> {
    fn new(start: Start, writer: W) -> Self {
        let (state, run_id, feed, frame, reader) = start;
        let retry_after_secs = state.api.config().retry_after_secs;
        let runs = Arc::clone(&state.runs);
        Self {
            follower: RunFollower::new(state, run_id, feed),
            retry_after_secs,
            writer,
            frame,
            opened: false,
            done: false,
            cut: false,
            reader,
            runs,
        }
    }

    /// The next events, written (a keep-alive after a silence); [`StreamCut`] once, when
    /// the run's events stopped before its end; `None` once the run's end has been written.
    async fn next_frame(&mut self) -> Option<Result<Bytes, StreamCut>> {
        if let Some(frame) = self.next_events().await {
            return Some(Ok(frame));
        }
        std::mem::take(&mut self.cut).then_some(Err(StreamCut))
    }

    async fn next_events(&mut self) -> Option<Bytes> {
        while !self.done {
            let expected = self.follower.next_position();
            let item = match self.follower.next(Some(KEEP_ALIVE_INTERVAL)).await {
                Followed::Event(item) => item,
                Followed::Silent => return Some(self.writer.keep_alive()),
                Followed::Stopped => {
                    self.cut = true;
                    self.done = true;
                    break;
                }
            };
            if item.index != expected {
                // Events the journal does not hold (disabled, or over its per-run limit):
                // what follows cannot be rendered as the first stream was.
                self.end(Err(ApiError::internal(format!(
                    "the run's events from position {expected} are not kept"
                ))));
                break;
            }
            self.frame.group(item.index);
            match replayed(&item.kind, &feed_json(&item.event), self.retry_after_secs) {
                Replayed::Skip => continue,
                Replayed::Output(text, structured) => {
                    self.open(structured.as_ref().and_then(|s| s.usage));
                    self.writer
                        .output(&text, structured.as_ref(), &mut self.frame);
                }
                Replayed::End(end) => {
                    if !self.runs.ends_kept().await {
                        // Not yet where a takeover finds it: resumed again, later or
                        // where the run acts then.
                        self.cut = true;
                        self.done = true;
                        break;
                    }
                    self.frame.group_end(item.index);
                    self.end(end);
                }
            }
            if !self.frame.is_empty() {
                return Some(self.frame.split());
            }
        }
        (!self.frame.is_empty()).then(|| self.frame.split())
    }

    /// Writes the opening events, once, with the run's counts when they came by then (as
    /// the first stream's were written).
    fn open(&mut self, counts: Option<Usage>) {
        if !self.opened {
            self.opened = true;
            self.writer.open(counts, &mut self.frame);
        }
    }

    fn end(&mut self, end: Result<super::translators::output::Finished, ApiError>) {
        self.open(None);
        self.writer.close(end, &mut self.frame);
        self.done = true;
        if let Some(reader) = &mut self.reader {
            reader.ended();
        }
    }
}
