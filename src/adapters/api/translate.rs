//! Where the translators of the Anthropic Messages and Responses APIs meet HTTP: reading a
//! request into the chat run it becomes ([`chat_run`]), the one handler both endpoints are
//! ([`serve_chat_run`] over a [`ChatApi`]), and the [`EventWriter`] that writes a
//! translator's events as named SSE events. The translators themselves, and what they
//! share, are pure (`protocol.rs`).

use axum::Json;
use axum::extract::State;
use axum::extract::rejection::BytesRejection;
use axum::http::HeaderMap;
use axum::response::{IntoResponse as _, Response};
use bytes::Bytes;
use serde_json::Value;

use super::ApiError;
use super::auth::Caller;
use super::request::{self, deadline, read_body, run_spec};
use super::response::ErrorShape;
use super::routing::{ClientKeys, max_output, prefix_of_value, run_routing};
use super::run::{self, ActiveRun, Step};
use super::sse;
use super::translators::output::{Collected, Finished};
use super::translators::{ApiEvent, ChatTranslation, StreamTranslator};
use crate::adapters::api::ApiState;
use crate::adapters::api::translators::frame::{
    EventWriter, KEEP_ALIVE_COMMENT, SseFrame, push_named_event,
};
use crate::domain::{Operation, RunId, RunSpec, StructuredOutput, Usage};

/// One API served as a chat run: how its requests translate, where its client keys are,
/// its error shape, and its answers — streamed through a translator, or whole.
pub(super) struct ChatApi<T, S> {
    /// The request translator.
    pub translate: fn(&Value) -> Result<T, ApiError>,
    /// The client keys (user, session) in a request.
    pub keys: fn(&Value) -> ClientKeys<'_>,
    /// The API's error body.
    pub error_shape: ErrorShape,
    /// The stream translator answering the request of run `run_id`.
    pub stream: fn(T, &RunId) -> S,
    /// The whole answer to the request of run `run_id`.
    pub whole: fn(T, &RunId, &Collected, &Finished) -> Value,
    /// The answer, at once, to a non-streamed request that asked for a run outliving the
    /// connection ([`ChatTranslation::background`]); `None` where the API has no such thing.
    pub accepted: Option<fn(T, &RunId) -> Value>,
}

/// The handler of every API served as a chat run, given its [`ChatApi`] (the route is
/// `post(|s, c, h, b| serve_chat_run(&API, s, c, h, b))`): reads and translates the request
/// ([`chat_run`]), starts the run, and answers streamed or whole, with the run's headers;
/// every error in the API's shape.
pub(super) async fn serve_chat_run<T: ChatTranslation, S: StreamTranslator>(
    api: &ChatApi<T, S>,
    State(state): State<ApiState>,
    caller: Caller,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    let (state, caller, headers) = (&state, &caller, &headers);
    let error_response = |error: &ApiError| api.error_shape.render(error);
    let chat = Operation::Chat;
    let prepared = chat_run(state, caller, headers, body, api.translate, api.keys, chat);
    let (translated, mut spec) = match prepared {
        Ok(prepared) => prepared,
        Err(error) => return error_response(&error),
    };
    match request::resumable(caller, headers) {
        Ok(true) => {
            spec.routing.client_stream =
                translated.resumable_stream().map(|stream| stream.to_json());
        }
        Ok(false) => {}
        Err(error) => return error_response(&error),
    }
    let mut run = match run::start(state, spec, translated.model()) {
        Ok(run) => run,
        Err(error) => return error_response(&error),
    };
    if let Some(accepted) = api.accepted.filter(|_| translated.background()) {
        return background(run, translated, accepted, api.stream);
    }
    let run_id = run.id().clone();
    let (response, headers) = if translated.stream() {
        let first = run.next().await;
        let headers = run.headers();
        let response = match first {
            Step::End(Err(error)) => error_response(&error),
            first => {
                let writer = NamedEvents((api.stream)(translated, &run_id));
                sse::respond(run, writer, Some(first))
            }
        };
        (response, headers)
    } else {
        let response = match run::collect(&mut run).await {
            Ok((collected, finished)) => {
                Json((api.whole)(translated, &run_id, &collected, &finished)).into_response()
            }
            Err(error) => error_response(&error),
        };
        (response, run.headers())
    };
    run::with_headers(response, &headers)
}

/// The answer to a request whose run outlives the connection: the run is detached (a
/// disconnect no longer cancels it) and answered without waiting for its node — the
/// `accepted` answer, or a stream that starts with its opening events.
fn background<T: ChatTranslation, S: StreamTranslator>(
    mut run: ActiveRun,
    translated: T,
    accepted: fn(T, &RunId) -> Value,
    stream: fn(T, &RunId) -> S,
) -> Response {
    run.detach();
    let run_id = run.id().clone();
    let headers = run.headers();
    let response = if translated.stream() {
        sse::respond(run, NamedEvents(stream(translated, &run_id)), None)
    } else {
        Json(accepted(translated, &run_id)).into_response()
    };
    run::with_headers(response, &headers)
}

/// Reads a JSON request `body`, translates it with `translate`, and builds the run of the
/// chat body it becomes, as `operation` (a chat run; a tokenize run counts the prompt a chat
/// run would have): its deadline from `headers`, its routing from `caller`, `headers`, the
/// client keys `keys` finds in the request, or the chat prompt's prefix.
///
/// # Errors
/// The body's or the translation's 4xx, an unknown model, a bad header.
pub(super) fn chat_run<T: ChatTranslation>(
    state: &ApiState,
    caller: &Caller,
    headers: &HeaderMap,
    body: Result<Bytes, BytesRejection>,
    translate: impl FnOnce(&Value) -> Result<T, ApiError>,
    keys: fn(&Value) -> ClientKeys<'_>,
    operation: Operation,
) -> Result<(T, RunSpec), ApiError> {
    let body = read_body(&state.api, body)?;
    let value: Value = serde_json::from_slice(&body)
        .map_err(|error| ApiError::malformed_json(&error.to_string()))?;
    let translated = translate(&value)?;
    let deadline = deadline(&state.api, headers)?;
    let prefix = state.api.prefix_affinity();
    let chat = translated.chat();
    let mut keys = keys(&value);
    keys.max_output = max_output(|name| chat.get(name).and_then(Value::as_u64));
    let routing = run_routing(caller, headers, keys, || {
        prefix.then(|| prefix_of_value(chat)).flatten()
    })?;
    let input = Bytes::from(chat.to_string());
    let model = translated.model();
    let spec = run_spec(&state.api, model, input, operation, deadline, routing)?;
    Ok((translated, spec))
}

/// Writes a [`StreamTranslator`]'s events as named SSE events.
pub(super) struct NamedEvents<T>(pub T);

impl<T: StreamTranslator> EventWriter for NamedEvents<T> {
    fn open(&mut self, counts: Option<Usage>, frame: &mut SseFrame) {
        write_all(frame, self.0.open(counts));
    }

    fn output(&mut self, text: &str, structured: Option<&StructuredOutput>, frame: &mut SseFrame) {
        write_all(frame, self.0.output(text, structured));
    }

    fn close(&mut self, end: Result<Finished, ApiError>, frame: &mut SseFrame) {
        write_all(frame, self.0.close(end.as_ref()));
    }

    fn keep_alive(&self) -> bytes::Bytes {
        match self.0.keep_alive() {
            Some(event) => {
                let mut frame = SseFrame::default();
                push_named_event(&mut frame, event.name, &event.data);
                frame.split()
            }
            None => bytes::Bytes::from_static(KEEP_ALIVE_COMMENT),
        }
    }
}

/// Appends `events` as named SSE events.
pub(super) fn write_all(frame: &mut SseFrame, events: Vec<ApiEvent>) {
    for event in events {
        push_named_event(frame, event.name, &event.data);
    }
}
