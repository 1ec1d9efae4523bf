//! One API request as one run: start it through the run service, read its events, and
//! cancel it on the node when the client goes away before it ends.
//!
//! The run service is the only way to a node: this module never touches the transport.

use std::future::poll_fn;
use std::sync::Arc;
use std::task::{Context, Poll, ready};

use axum::Json;
use axum::extract::rejection::BytesRejection;
use axum::http::{HeaderMap, HeaderValue};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use tokio::runtime::Handle;
use tokio::sync::mpsc;
use tracing::debug;

use super::error::ApiError;
use super::reply::Reply;
use super::request::{self, ApiRequest, Endpoint};
use super::sse;
use crate::adapters::http::HttpState;
use crate::app::{RunHandle, RunService};
use crate::domain::{RunEvent, RunEventKind, RunId, Usage};

/// The reason a run is cancelled with when its client disconnects.
pub const CLIENT_GONE: &str = "client disconnected";

/// The header every answer to an accepted run carries, for correlating with event sinks.
pub const RUN_ID_HEADER: &str = "x-edge-run-id";

/// Serves a chat or completion request: checks it, starts its run, and answers with JSON
/// or, for `stream: true`, with SSE.
///
/// No status is chosen before the run's first output or terminal event: a run that fails
/// before producing anything gets a proper error status even when streaming was asked for.
pub(super) async fn respond(
    state: HttpState,
    endpoint: Endpoint,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    let ApiRequest {
        model,
        stream,
        include_usage,
        spec,
    } = match request::prepare(&state.api, endpoint, &headers, body) {
        Ok(request) => request,
        Err(error) => return error.into_response(),
    };
    let retry_after = state.api.config().retry_after_secs;
    let (adapter, target) = (spec.selector.adapter.clone(), spec.selector.target.clone());
    let handle = match state.runs.start(spec) {
        Ok(handle) => handle,
        Err(error) => {
            debug!(%model, %adapter, %target, %error, "API run not accepted");
            return ApiError::not_started(&error, &model, retry_after).into_response();
        }
    };
    debug!(run_id = %handle.run_id, %model, %adapter, %target, stream, "API run accepted");
    let mut run = ActiveRun::new(state.runs.clone(), handle, retry_after);
    let reply = Reply::new(endpoint, run.id(), model, include_usage);
    let run_id = HeaderValue::from_str(run.id().as_str()).ok();
    let mut response = if stream {
        match run.next().await {
            Step::End(Err(error)) => error.into_response(),
            first => sse::respond(run, reply, first),
        }
    } else {
        collect(run, &reply).await
    };
    if let Some(run_id) = run_id {
        response.headers_mut().insert(RUN_ID_HEADER, run_id);
    }
    response
}

/// Reads the whole run and answers with one JSON object.
async fn collect(mut run: ActiveRun, reply: &Reply) -> Response {
    let mut text = String::new();
    loop {
        match run.next().await {
            Step::Output(piece) => text.push_str(piece.as_str()),
            Step::End(Ok(finished)) => return Json(reply.full(&text, &finished)).into_response(),
            Step::End(Err(error)) => return error.into_response(),
        }
    }
}

/// How a run ended well.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Finished {
    /// Why generation stopped (`stop`, `length`, ...).
    pub finish_reason: String,
    /// Token counts, when the node reported them.
    pub usage: Option<Usage>,
}

/// What a run did next, as the API sees it.
#[derive(Debug)]
pub(super) enum Step {
    /// Some text.
    Output(Text),
    /// The run ended: completed, or an error to answer with.
    End(Result<Finished, ApiError>),
}

/// A run the API is answering for. Dropping it before its end cancels the run on the node.
pub(super) struct ActiveRun {
    events: mpsc::Receiver<Arc<RunEvent>>,
    guard: CancelOnDrop,
    retry_after_secs: u64,
}

impl ActiveRun {
    pub(super) fn new(runs: RunService, handle: RunHandle, retry_after_secs: u64) -> Self {
        let RunHandle { run_id, events } = handle;
        Self {
            events,
            guard: CancelOnDrop {
                runs,
                run_id,
                open: true,
            },
            retry_after_secs,
        }
    }

    /// The run's id.
    pub fn id(&self) -> &RunId {
        &self.guard.run_id
    }

    /// Waits for the next text or the end, skipping `started` and empty output.
    pub async fn next(&mut self) -> Step {
        poll_fn(|cx| self.poll_step(cx)).await
    }

    /// The next text or the end if the run has one ready, skipping `started` and empty
    /// output; else registers `cx` to be woken when it has.
    pub fn poll_step(&mut self, cx: &mut Context<'_>) -> Poll<Step> {
        loop {
            let Some(event) = ready!(self.events.poll_recv(cx)) else {
                self.guard.open = false;
                return Poll::Ready(Step::End(Err(ApiError::internal(
                    "the run ended without a terminal event",
                ))));
            };
            let end = match &event.kind {
                RunEventKind::Started => continue,
                RunEventKind::Output { text, .. } if text.is_empty() => continue,
                RunEventKind::Output { .. } => return Poll::Ready(Step::Output(Text(event))),
                RunEventKind::Completed {
                    finish_reason,
                    usage,
                } => Ok(Finished {
                    finish_reason: if finish_reason.is_empty() {
                        "stop".to_owned()
                    } else {
                        finish_reason.clone()
                    },
                    usage: *usage,
                }),
                RunEventKind::Failed { code, message, .. } => {
                    debug!(run_id = %event.run_id, code, message, "API run failed");
                    Err(ApiError::run_failed(code, message, self.retry_after_secs))
                }
                RunEventKind::Cancelled { reason } => Err(ApiError::run_cancelled(reason)),
            };
            self.guard.open = false;
            return Poll::Ready(Step::End(end));
        }
    }
}

/// The text of one output event, kept in the event itself rather than copied out.
#[derive(Debug)]
pub(super) struct Text(Arc<RunEvent>);

impl Text {
    /// The text.
    pub fn as_str(&self) -> &str {
        match &self.0.kind {
            RunEventKind::Output { text, .. } => text,
            // `poll_step` makes a `Text` of output events only.
            _ => "",
        }
    }
}

/// Cancels the run on drop while it is open: the handler's future (before the answer) or
/// the SSE body (while streaming) owns it, and both are dropped when the client goes away.
struct CancelOnDrop {
    runs: RunService,
    run_id: RunId,
    open: bool,
}

impl Drop for CancelOnDrop {
    fn drop(&mut self) {
        if !self.open {
            return;
        }
        let Ok(runtime) = Handle::try_current() else {
            return;
        };
        debug!(run_id = %self.run_id, "the client went away; cancelling the run");
        let runs = self.runs.clone();
        let run_id = self.run_id.clone();
        // Short-lived: `cancel` sends CancelRun and arms the run service's own (tracked)
        // grace timer, then returns.
        runtime.spawn(async move {
            runs.cancel(&run_id, CLIENT_GONE).await;
        });
    }
}
