//! One API request as one run: start it through the run service, read its events, and
//! cancel it on the node when the client goes away before it ends.
//!
//! Shared by every API the edge serves (chat, completions, embeddings, Anthropic Messages,
//! Responses). The run service is the only way to a node: this module never touches the
//! transport, and it knows no API's shapes beyond [`ApiError`].

use std::future::poll_fn;
use std::sync::Arc;
use std::task::{Context, Poll, ready};

use axum::http::HeaderValue;
use axum::response::Response;
use tokio::runtime::Handle;
use tokio::sync::mpsc;
use tracing::debug;

use super::ApiError;
use super::models::{smallest_window, with_lora};
use super::translators::output::{Collected, Finished};
use crate::adapters::api::ApiState;
use crate::domain::routing::RouteReason;
use crate::domain::{NodeId, Operation, RunEvent, RunEventKind, RunId, RunSpec, StructuredOutput};
use crate::hops;
use crate::ports::{RunHandle, Runs};

/// The reason a run is cancelled with when its client disconnects.
pub const CLIENT_GONE: &str = "client disconnected";

/// The header every answer to an accepted run carries, for correlating with event sinks.
pub const RUN_ID_HEADER: &str = "x-edge-run-id";

/// The node whose attempt the answer comes from (absent when the run reached no node).
pub const NODE_HEADER: &str = "x-edge-node";

/// Why the run went to that node: the rule, the attempt, the eligible nodes, the queue wait
/// (`least_busy; attempt=2; eligible=3; queued_ms=40`).
pub const ROUTE_HEADER: &str = "x-edge-route";

/// The most bytes one token takes in the vocabularies the edge expects (the longest tokens
/// are runs of one character; real text averages about 4): a prompt of `bytes` has at
/// least `bytes / 32` tokens.
const MAX_BYTES_PER_TOKEN: usize = 32;

/// Bytes per token in typical text, for the prompt size a refusal names.
const TYPICAL_BYTES_PER_TOKEN: usize = 4;

/// Inputs shorter than this are never checked against a window (2,048 tokens at most
/// would be clearly over): the common request costs nothing.
const CHECKED_FROM_BYTES: usize = 64 * 1024;

/// 400 `context_length_exceeded` for a chat or completion input clearly longer than the
/// smallest context window the model's nodes reported: even at [`MAX_BYTES_PER_TOKEN`] it
/// has more tokens than the window holds. Anything else is for the engine to judge.
fn clearly_over_window(state: &ApiState, spec: &RunSpec) -> Option<ApiError> {
    let bytes = spec.input.len();
    if bytes < CHECKED_FROM_BYTES
        || !matches!(spec.operation, Operation::Chat | Operation::Completion)
    {
        return None;
    }
    let (adapter, target) = (&spec.selector.adapter, &spec.selector.target);
    let window = smallest_window(&state.registry.snapshot(), adapter, target)?;
    let at_least = bytes / MAX_BYTES_PER_TOKEN;
    if at_least <= window as usize {
        return None;
    }
    let estimate = u32::try_from(bytes / TYPICAL_BYTES_PER_TOKEN).unwrap_or(u32::MAX);
    Some(ApiError::context_length_exceeded(Some(estimate), window))
}

/// Starts the run of `spec` for a client that named `model` (a model naming a LoRA runs
/// its base with the LoRA: [`with_lora`]). A run whose spec carries a
/// client stream is resumable: its stream's events carry ids, and its client going away
/// mid-stream leaves it to `runs.client_resume_grace_ms` rather than cancelling it.
///
/// # Errors
/// The API's answer when the run service does not accept the run (404, 429, 503), or a
/// 400 for an input clearly over the model's window ([`clearly_over_window`]).
pub(super) fn start(state: &ApiState, spec: RunSpec, model: &str) -> Result<ActiveRun, ApiError> {
    // A model naming a LoRA runs its base, with the LoRA.
    let spec = with_lora(spec, &state.loras.book());
    if let Some(refused) = clearly_over_window(state, &spec) {
        debug!(%model, bytes = spec.input.len(), "API run refused: clearly over the context window");
        return Err(refused);
    }
    let retry_after = state.api.config().retry_after_secs;
    let resumable = spec.routing.client_stream.is_some();
    let (adapter, target) = (spec.selector.adapter.clone(), spec.selector.target.clone());
    let operation = spec.operation.as_str();
    match state.runs.start(spec) {
        Ok(handle) => {
            debug!(run_id = %handle.run_id, %model, %adapter, %target, operation, "API run accepted");
            tracing::trace!(target: hops::TARGET, hop = hops::API_ACCEPTED, run_id = %handle.run_id);
            let mut run = ActiveRun::new(Arc::clone(&state.runs), handle, retry_after);
            run.resumable = resumable;
            Ok(run)
        }
        Err(error) => {
            debug!(%model, %adapter, %target, %error, "API run not accepted");
            Err(ApiError::not_started(&error, model, retry_after))
        }
    }
}

/// What an answer says about its run in headers: its id, and where and why it ran.
#[derive(Debug, Clone)]
pub(super) struct RunHeaders {
    run_id: RunId,
    node: Option<NodeId>,
    route: Option<Box<RouteReason>>,
}

/// `response` with the [`RUN_ID_HEADER`], [`NODE_HEADER`] and [`ROUTE_HEADER`] of a run.
pub(super) fn with_headers(mut response: Response, run: &RunHeaders) -> Response {
    let headers = response.headers_mut();
    if let Ok(value) = HeaderValue::from_str(run.run_id.as_str()) {
        headers.insert(RUN_ID_HEADER, value);
    }
    if let Some(Ok(value)) = run.node.as_ref().map(|n| HeaderValue::from_str(n.as_str())) {
        headers.insert(NODE_HEADER, value);
    }
    if let Some(Ok(value)) = run
        .route
        .as_ref()
        .map(|r| HeaderValue::from_str(&r.to_string()))
    {
        headers.insert(ROUTE_HEADER, value);
    }
    response
}

/// Reads the whole run: everything it output, and how it ended.
///
/// # Errors
/// The API's answer for a run that failed or was cancelled.
pub(super) async fn collect(run: &mut ActiveRun) -> Result<(Collected, Finished), ApiError> {
    let mut collected = Collected::default();
    loop {
        match run.next().await {
            Step::Output(output) => collected.push(output.text(), output.structured()),
            Step::End(end) => return end.map(|finished| (collected, finished)),
        }
    }
}

/// Reads a whole tokenize run: its token ids, and how many the prompt has (the node's
/// usage, else the ids counted).
///
/// # Errors
/// As [`collect`].
pub(super) async fn tokens(run: &mut ActiveRun) -> Result<(Vec<u32>, u32), ApiError> {
    let (collected, finished) = collect(run).await?;
    let count = finished.usage.map_or_else(
        || u32::try_from(collected.tokens.len()).unwrap_or(u32::MAX),
        |usage| usage.input_tokens,
    );
    Ok((collected.tokens, count))
}

/// What a run did next, as the API sees it.
#[derive(Debug)]
pub(super) enum Step {
    /// Some output.
    Output(Output),
    /// The run ended: completed, or an error to answer with.
    End(Result<Finished, ApiError>),
}

/// A run the API is answering for. Dropping it before its end cancels the run on the node.
pub(super) struct ActiveRun {
    events: mpsc::Receiver<Arc<RunEvent>>,
    /// Events received so far, skipped ones included: the run service hands the caller
    /// every event it relays, in order, so the latest is at position `received - 1`.
    received: u64,
    /// Whether a caller may resume its stream (`resume.rs`).
    resumable: bool,
    /// Its events stopped before its end (this member let it go, standing down).
    cut: bool,
    guard: CancelOnDrop,
    retry_after_secs: u64,
    /// The node of the latest attempt seen, and why it was chosen.
    node: Option<NodeId>,
    route: Option<Box<RouteReason>>,
}

impl ActiveRun {
    pub(super) fn new(runs: Arc<dyn Runs>, handle: RunHandle, retry_after_secs: u64) -> Self {
        let RunHandle { run_id, events, .. } = handle;
        Self {
            events,
            received: 0,
            resumable: false,
            cut: false,
            guard: CancelOnDrop {
                runs,
                run_id,
                open: true,
                resumable: false,
            },
            retry_after_secs,
            node: None,
            route: None,
        }
    }

    /// The run's id.
    pub fn id(&self) -> &RunId {
        &self.guard.run_id
    }

    /// Lets the run outlive this answer: dropping it no longer cancels the run (Responses
    /// `background: true`).
    pub fn detach(&mut self) {
        self.guard.open = false;
    }

    /// Whether a caller may resume the run's stream.
    pub fn resumable(&self) -> bool {
        self.resumable
    }

    /// Whether its events stopped before its end: the run service let it go (its member
    /// stood down) — a resumable stream is then broken off, not ended, so its client
    /// resumes it on the member that acts now.
    pub fn cut(&self) -> bool {
        self.cut
    }

    /// The position among the run's events of the latest one received.
    pub fn position(&self) -> u64 {
        self.received.saturating_sub(1)
    }

    /// The run's stream is being answered: from now on, a client that goes away leaves a
    /// resumable run to its grace rather than cancelling it.
    pub fn streaming(&mut self) {
        self.guard.resumable = self.resumable;
    }

    /// The headers that tell where the run went, as far as its events have said so far.
    pub fn headers(&self) -> RunHeaders {
        RunHeaders {
            run_id: self.guard.run_id.clone(),
            node: self.node.clone(),
            route: self.route.clone(),
        }
    }

    /// Waits for the next output or the end, skipping `started` and empty output.
    pub async fn next(&mut self) -> Step {
        poll_fn(|cx| self.poll_step(cx)).await
    }

    /// The next output or the end if the run has one ready, skipping `started` and output
    /// with neither text nor structured parts; else registers `cx` to be woken when it has.
    pub fn poll_step(&mut self, cx: &mut Context<'_>) -> Poll<Step> {
        loop {
            let Some(event) = ready!(self.events.poll_recv(cx)) else {
                self.guard.open = false;
                self.cut = true;
                // The stream's error event gets an id of its own.
                self.received += 1;
                // Let go by this member, which stood down: a `503` to retry through the
                // site's balancer (answered before any output, as it is to a request that
                // reached a standby), not an internal error a client takes for the run's
                // failure (found by the nemesis, seed 66, issue 66).
                return Poll::Ready(Step::End(Err(ApiError::standby(
                    None,
                    self.retry_after_secs,
                ))));
            };
            self.received += 1;
            let end = match &event.kind {
                RunEventKind::Started => {
                    // A failed-over run has one per attempt; the latest one counts.
                    self.node.clone_from(&event.node);
                    self.route.clone_from(&event.route);
                    continue;
                }
                RunEventKind::Output {
                    text, structured, ..
                } if text.is_empty() && structured.as_ref().is_none_or(|s| s.is_empty()) => {
                    continue;
                }
                RunEventKind::Output { .. } => {
                    if self.node.is_none() {
                        self.node.clone_from(&event.node);
                    }
                    return Poll::Ready(Step::Output(Output(event)));
                }
                kind => self.end_of(&event.run_id, kind),
            };
            if event.node.is_some() {
                self.node.clone_from(&event.node);
            }
            self.guard.open = false;
            return Poll::Ready(Step::End(end));
        }
    }
}

impl ActiveRun {
    /// What a terminal event means for the API: how the run finished, or its error.
    fn end_of(&self, run_id: &RunId, kind: &RunEventKind) -> Result<Finished, ApiError> {
        match kind {
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
            RunEventKind::Failed {
                code,
                message,
                class,
                status,
                usage,
                context_window,
            } => {
                debug!(%run_id, code, message, class = class.as_str(), "API run failed");
                let prompt = usage.map(|usage| usage.input_tokens);
                Err(
                    ApiError::run_failed(code, message, *class, *status, self.retry_after_secs)
                        .with_context_window(prompt, *context_window),
                )
            }
            RunEventKind::Cancelled { reason, .. } => Err(ApiError::run_cancelled(reason)),
            RunEventKind::Started | RunEventKind::Output { .. } => {
                Err(ApiError::internal("a run's event was taken for its end"))
            }
        }
    }
}

/// One output event, kept in the event itself rather than copied out.
#[derive(Debug)]
pub(super) struct Output(Arc<RunEvent>);

impl Output {
    /// The text (may be empty when the piece is structured only).
    pub fn text(&self) -> &str {
        match &self.0.kind {
            RunEventKind::Output { text, .. } => text,
            // `poll_step` makes an `Output` of output events only.
            _ => "",
        }
    }

    /// Reasoning, tool-call pieces, log probabilities or embeddings, when the piece has any.
    pub fn structured(&self) -> Option<&StructuredOutput> {
        match &self.0.kind {
            RunEventKind::Output { structured, .. } => {
                structured.as_deref().filter(|s| !s.is_empty())
            }
            _ => None,
        }
    }
}

/// Cancels the run on drop while it is open: the handler's future (before the answer) or
/// the SSE body (while streaming) owns it, and both are dropped when the client goes away.
/// A resumable stream's reader only tells the run service it went
/// ([`Runs::reader_gone`]): the run is cancelled when no caller resumes within the grace.
pub(super) struct CancelOnDrop {
    runs: Arc<dyn Runs>,
    run_id: RunId,
    open: bool,
    resumable: bool,
}

impl CancelOnDrop {
    /// The guard of a resumed stream's reader of open run `run_id`.
    pub(super) fn resumed(runs: Arc<dyn Runs>, run_id: RunId) -> Self {
        Self {
            runs,
            run_id,
            open: true,
            resumable: true,
        }
    }

    /// The run has ended: dropping the guard does nothing.
    pub(super) fn ended(&mut self) {
        self.open = false;
    }
}

impl Drop for CancelOnDrop {
    fn drop(&mut self) {
        if !self.open {
            return;
        }
        let Ok(runtime) = Handle::try_current() else {
            return;
        };
        let runs = Arc::clone(&self.runs);
        let run_id = self.run_id.clone();
        // Short-lived: `cancel` sends CancelRun and arms the run service's own (tracked)
        // grace timer, `reader_gone` arms its resume grace timer; both then return.
        if self.resumable {
            debug!(run_id = %self.run_id, "the client went away; the run waits for a resume");
            runtime.spawn(async move {
                runs.reader_gone(&run_id, CLIENT_GONE).await;
            });
        } else {
            debug!(run_id = %self.run_id, "the client went away; cancelling the run");
            runtime.spawn(async move {
                runs.cancel(&run_id, CLIENT_GONE).await;
            });
        }
    }
}
