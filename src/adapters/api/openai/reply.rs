//! The chat and completions answers: serving one request as one run, and the envelope (ids,
//! timestamps, model name) every JSON answer and SSE chunk carries.

use std::time::{SystemTime, UNIX_EPOCH};

use axum::Json;
use axum::extract::rejection::BytesRejection;
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use serde_json::Value;

use super::super::auth::Caller;
use super::super::output::Finished;
use super::super::output::{Collected, usage_json};
use super::super::request::{self, ApiRequest, Endpoint};
use super::super::resume::ClientStream;
use super::super::run::{self, Step};
use super::super::sse;
use super::chunks::ChunkWriter;
use super::{chat, completions};
use crate::adapters::api::ApiState;
use crate::domain::RunId;

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
        mut spec,
    } = match request::prepare(&state.api, endpoint, &caller, &headers, body) {
        Ok(request) => request,
        Err(error) => return error.into_response(),
    };
    let created = unix_now();
    if stream {
        let resumable = ClientStream::openai(endpoint, &model, created, include_usage);
        spec.routing.client_stream = Some(resumable.to_json());
    }
    let mut run = match run::start(&state, spec, &model) {
        Ok(run) => run,
        Err(error) => return error.into_response(),
    };
    let mut reply = Reply::new(endpoint, run.id(), model, include_usage);
    reply.created = created;
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

/// What every part of one answer shares.
#[derive(Debug, Clone)]
pub(in crate::adapters::api) struct Reply {
    /// Which endpoint's shape.
    pub endpoint: Endpoint,
    /// The answer's id (`chatcmpl-<run id>`, `cmpl-<run id>`).
    pub id: String,
    /// Unix seconds.
    pub created: u64,
    /// The model as the client named it.
    pub model: String,
    /// Whether chunks carry `usage` and a usage chunk closes the stream.
    pub include_usage: bool,
}

impl Reply {
    /// The envelope of the answer to run `run_id`.
    pub fn new(endpoint: Endpoint, run_id: &RunId, model: String, include_usage: bool) -> Self {
        let prefix = match endpoint {
            Endpoint::Chat => "chatcmpl",
            Endpoint::Completion => "cmpl",
        };
        Self {
            endpoint,
            id: format!("{prefix}-{run_id}"),
            created: unix_now(),
            model,
            include_usage,
        }
    }

    /// The non-streaming answer.
    pub fn full(&self, collected: &Collected, finished: &Finished) -> Value {
        let mut body = match self.endpoint {
            Endpoint::Chat => chat::full(self, collected, &finished.finish_reason),
            Endpoint::Completion => completions::full(self, collected, &finished.finish_reason),
        };
        if let Some(usage) = finished.usage {
            body["usage"] = usage_json(usage);
        }
        body
    }

    /// The `object` of a chunk.
    pub fn chunk_object(&self) -> &'static str {
        match self.endpoint {
            Endpoint::Chat => "chat.completion.chunk",
            Endpoint::Completion => "text_completion",
        }
    }
}

/// Now, in Unix seconds.
pub(in crate::adapters::api) fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}
