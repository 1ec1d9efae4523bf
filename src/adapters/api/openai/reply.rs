//! The chat and completions answers: serving one request as one run, and the envelope (ids,
//! timestamps, model name) every JSON answer and SSE chunk carries.

use std::time::{SystemTime, UNIX_EPOCH};

use axum::Json;
use axum::extract::rejection::BytesRejection;
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use bytes::Bytes;

use crate::adapters::api::ApiState;
use crate::adapters::api::auth::Caller;
use crate::adapters::api::request::{self, ApiRequest};
use crate::adapters::api::run::{self, Step};
use crate::adapters::api::sse;
use crate::adapters::api::translators::ResumableStream;
use crate::adapters::api::translators::openai::chunks::ChunkWriter;
use crate::adapters::api::translators::openai::{Endpoint, Reply};

/// Serves a chat or completion request: checks it, starts its run, and answers with JSON
/// or, for `stream: true`, with SSE.
///
/// No status is chosen before the run's first output or terminal event: a run that fails
/// before producing anything gets a proper error status even when streaming was asked for.
pub(in crate::adapters::api) async fn respond(
    state: ApiState,
    endpoint: Endpoint,
    caller: Caller,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    let ApiRequest {
        model,
        stream,
        include_usage,
        resumable,
        mut spec,
    } = match request::prepare(&state.api, endpoint, &caller, &headers, body) {
        Ok(request) => request,
        Err(error) => return error.into_response(),
    };
    let created = unix_now();
    if stream && resumable {
        let resumable_stream = ResumableStream::openai(endpoint, &model, created, include_usage);
        spec.routing.client_stream = Some(resumable_stream.to_json());
    }
    let mut run = match run::start(&state, spec, &model) {
        Ok(run) => run,
        Err(error) => return error.into_response(),
    };
    let reply = Reply::new(endpoint, run.id(), model, created, include_usage);
    let (response, headers) = if stream {
        let first = run.next().await;
        let headers = run.headers();
        let response = match first {
            Step::End(Err(error)) => error.into_response(),
            first => sse::respond(run, ChunkWriter::new(&reply), Some(first)),
        };
        (response, headers)
    } else {
        let response = match run::collect(&mut run).await {
            Ok((collected, finished)) => Json(reply.full(&collected, &finished)).into_response(),
            Err(error) => error.into_response(),
        };
        (response, run.headers())
    };
    run::with_headers(response, &headers)
}

/// Now, in Unix seconds.
pub(in crate::adapters::api) fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}
