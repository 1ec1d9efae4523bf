//! The error the APIs answer with: OpenAI's fields (`{"error":{"message","type","param",
//! "code"}}`), its [`ErrorKind`] and the `Retry-After` that fits, so the official clients
//! raise the exception they document.
//!
//! Used for a response before streaming starts and, once an SSE stream has begun, as its
//! last chunk. Messages name what the client sent, never an API key. The error is data,
//! with no HTTP status: the kind says what went wrong, and the handlers choose the status
//! for it (`api/response.rs`), Anthropic's shape its error type.

use serde::Serialize;

use crate::domain::models::{MODEL_TOO_LARGE, TooLarge};
use crate::domain::routing::LimitRefusal;
use crate::domain::{Bytes, EdgeFailure, FailureClass, Operation};
use crate::ports::{StartError, waiting_for};

const INVALID_REQUEST: &str = "invalid_request_error";
const RATE_LIMIT: &str = "rate_limit_error";
const SERVER: &str = "server_error";
/// The code of a prompt longer than the model's context window (OpenAI's).
pub const CONTEXT_LENGTH_EXCEEDED: &str = "context_length_exceeded";
/// The code of an operation the pool (or the node's engine) does not support.
pub const NOT_SUPPORTED: &str = "not_supported";

/// What went wrong, as the APIs tell their callers apart: each kind has one HTTP status
/// and one Anthropic error type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorKind {
    /// The request is malformed or asks for something the API does not accept.
    InvalidRequest,
    /// No API key, or a wrong one.
    Authentication,
    /// The key may not do this.
    Permission,
    /// No such model, response or stream; no such path.
    NotFound,
    /// The path does not serve the method.
    MethodNotAllowed,
    /// The request conflicts with the target's state.
    Conflict,
    /// The body is larger than the API takes.
    TooLarge,
    /// The request is well formed but cannot be processed.
    Unprocessable,
    /// Over a limit: the caller retries later.
    RateLimited,
    /// The request must be made another way (a WebSocket upgrade on an HTTP-only path).
    UpgradeRequired,
    /// Something that should not happen.
    Internal,
    /// No node serving the model supports the operation.
    NotSupported,
    /// The node failed the request, or the run was cancelled by someone else.
    Upstream,
    /// Nothing can take the request now: the caller retries later.
    Unavailable,
    /// The run's deadline passed.
    Timeout,
}

impl ErrorKind {
    /// The kind a node's HTTP-style status stands for (a node judging a request bad reports
    /// its engine's status); a status the APIs have no kind for is an invalid request.
    fn of_node_status(status: Option<u16>) -> Self {
        match status {
            Some(401) => Self::Authentication,
            Some(403) => Self::Permission,
            Some(404) => Self::NotFound,
            Some(405) => Self::MethodNotAllowed,
            Some(409) => Self::Conflict,
            Some(413) => Self::TooLarge,
            Some(422) => Self::Unprocessable,
            Some(429) => Self::RateLimited,
            Some(501) => Self::NotSupported,
            _ => Self::InvalidRequest,
        }
    }
}

/// An error the API answers with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiError {
    kind: ErrorKind,
    /// OpenAI's `type`.
    openai_type: &'static str,
    message: String,
    param: Option<&'static str>,
    code: Option<String>,
    retry_after_secs: Option<u64>,
    overflow: Option<Overflow>,
}

/// A prompt longer than the model's context window, in tokens.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Overflow {
    /// The prompt's size, when the engine said.
    pub prompt: Option<u32>,
    /// The window's.
    pub window: u32,
}

#[derive(Serialize)]
pub(in crate::adapters::api) struct Body<'a> {
    error: Detail<'a>,
}

#[derive(Serialize)]
pub(in crate::adapters::api) struct Detail<'a> {
    message: &'a str,
    #[serde(rename = "type")]
    kind: &'a str,
    param: Option<&'a str>,
    code: Option<&'a str>,
}

impl ApiError {
    fn new(kind: ErrorKind, openai_type: &'static str, message: impl Into<String>) -> Self {
        Self {
            kind,
            openai_type,
            message: message.into(),
            param: None,
            code: None,
            retry_after_secs: None,
            overflow: None,
        }
    }

    fn param(mut self, param: &'static str) -> Self {
        self.param = Some(param);
        self
    }

    fn code(mut self, code: impl Into<String>) -> Self {
        self.code = Some(code.into());
        self
    }

    fn retry_after(mut self, secs: u64) -> Self {
        self.retry_after_secs = Some(secs);
        self
    }

    /// What went wrong.
    pub fn kind(&self) -> ErrorKind {
        self.kind
    }

    /// The machine-readable code, if any.
    pub fn error_code(&self) -> Option<&str> {
        self.code.as_deref()
    }

    /// The human-readable message.
    pub fn message(&self) -> &str {
        &self.message
    }

    /// The prompt and window sizes of a prompt over the model's context window.
    pub fn overflow(&self) -> Option<Overflow> {
        self.overflow
    }

    /// The `Retry-After` the answer carries, in seconds, if any.
    pub fn retry_after_secs(&self) -> Option<u64> {
        self.retry_after_secs
    }

    /// A 400 about `param` with `message` and `code`, for an API's own request checks.
    pub fn bad_request(
        param: Option<&'static str>,
        code: &str,
        message: impl Into<String>,
    ) -> Self {
        let mut error = Self::new(ErrorKind::InvalidRequest, INVALID_REQUEST, message).code(code);
        error.param = param;
        error
    }

    pub(in crate::adapters::api) fn body(&self) -> Body<'_> {
        Body {
            error: Detail {
                message: &self.message,
                kind: self.openai_type,
                param: self.param,
                code: self.code.as_deref(),
            },
        }
    }

    /// The body as JSON text: the response body, or the SSE error chunk.
    pub fn to_json(&self) -> String {
        serde_json::to_string(&self.body()).unwrap_or_else(|_| {
            r#"{"error":{"message":"internal error","type":"server_error","param":null,"code":null}}"#.to_owned()
        })
    }

    /// 400: the body is not JSON (or not an object).
    pub fn malformed_json(detail: &str) -> Self {
        Self::new(
            ErrorKind::InvalidRequest,
            INVALID_REQUEST,
            format!("We could not parse the JSON body of your request: {detail}"),
        )
    }

    /// 400: a required field is missing.
    pub fn missing(param: &'static str) -> Self {
        Self::new(
            ErrorKind::InvalidRequest,
            INVALID_REQUEST,
            format!("Missing required parameter: '{param}'."),
        )
        .param(param)
        .code("missing_required_parameter")
    }

    /// 400: a field has a value the API does not accept.
    pub fn invalid(param: &'static str, message: impl Into<String>) -> Self {
        Self::new(ErrorKind::InvalidRequest, INVALID_REQUEST, message)
            .param(param)
            .code("invalid_value")
    }

    /// 400: a header has a value the API does not accept.
    pub fn invalid_header(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::InvalidRequest, INVALID_REQUEST, message).code("invalid_header")
    }

    /// 401: no API key, or a wrong one.
    pub fn invalid_api_key(missing: bool) -> Self {
        let message = if missing {
            "You didn't provide an API key. Send it as `Authorization: Bearer <key>` or `x-api-key: <key>`."
        } else {
            "Incorrect API key provided."
        };
        Self::new(ErrorKind::Authentication, INVALID_REQUEST, message).code("invalid_api_key")
    }

    /// 404: the model is not an alias, not `ADAPTER/TARGET`, or no node is configured to
    /// serve it (a configured model whose nodes are away is not unknown: its runs wait).
    pub fn model_not_found(model: &str) -> Self {
        Self::new(
            ErrorKind::NotFound,
            INVALID_REQUEST,
            format!("The model `{model}` does not exist: no node is configured to serve it."),
        )
        .param("model")
        .code("model_not_found")
    }

    /// 404: no background response has this id (or it belongs to another API key).
    pub fn response_not_found(id: &str) -> Self {
        Self::new(
            ErrorKind::NotFound,
            INVALID_REQUEST,
            format!("No response found with id '{id}'."),
        )
        .code("not_found")
    }

    /// 404: no run with this id has a stream that can be resumed (or it belongs to
    /// another API key).
    pub fn stream_not_found(run_id: &str) -> Self {
        Self::new(
            ErrorKind::NotFound,
            INVALID_REQUEST,
            format!("No resumable stream found for run '{run_id}'."),
        )
        .code("not_found")
    }

    /// 404 for a path the API does not have.
    pub fn unknown_url(method: &str, path: &str) -> Self {
        Self::new(
            ErrorKind::NotFound,
            INVALID_REQUEST,
            format!("Unknown request URL: {method} {path}."),
        )
        .code("unknown_url")
    }

    /// 405 for a method a path does not serve.
    pub fn method_not_allowed(method: &str, path: &str, allowed: &str) -> Self {
        Self::new(
            ErrorKind::MethodNotAllowed,
            INVALID_REQUEST,
            format!("{method} is not allowed on {path}: use {allowed}."),
        )
        .code("method_not_allowed")
    }

    /// 426 for a WebSocket upgrade: the API is served over plain HTTP. Codex falls back to
    /// HTTP at once on this status (any other has it retry first).
    pub fn websocket_not_supported(path: &str) -> Self {
        Self::new(
            ErrorKind::UpgradeRequired,
            INVALID_REQUEST,
            format!("WebSockets are not served on {path}: send the request over HTTP."),
        )
        .code("websocket_not_supported")
    }

    /// 413: the body exceeds `api.max_body_bytes`.
    pub fn body_too_large(limit: usize) -> Self {
        Self::new(
            ErrorKind::TooLarge,
            INVALID_REQUEST,
            format!("The request body is larger than the limit of {limit} bytes."),
        )
        .code("request_too_large")
    }

    /// 400 `context_length_exceeded` in OpenAI's words: the prompt is longer than the model's
    /// context window (each API says it its own way: [`Self::overflow`] keeps the sizes).
    pub fn context_length_exceeded(prompt: Option<u32>, window: u32) -> Self {
        let resulted = prompt.map_or_else(String::new, |prompt| {
            format!(" However, your messages resulted in {prompt} tokens.")
        });
        let message = format!(
            "This model's maximum context length is {window} tokens.{resulted} Please reduce the length of the messages."
        );
        let mut error = Self::new(ErrorKind::InvalidRequest, INVALID_REQUEST, message)
            .param("messages")
            .code(CONTEXT_LENGTH_EXCEEDED);
        error.overflow = Some(Overflow { prompt, window });
        error
    }

    /// This failure as a prompt over the context window when its node measured one
    /// (`context_length_exceeded` with the window's size; the prompt's from its usage).
    #[must_use]
    pub fn with_context_window(self, prompt: Option<u32>, window: Option<u32>) -> Self {
        match window {
            Some(window) if self.code.as_deref() == Some(CONTEXT_LENGTH_EXCEEDED) => {
                Self::context_length_exceeded(prompt.filter(|tokens| *tokens > 0), window)
            }
            _ => self,
        }
    }

    /// 500: something that should not happen.
    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::Internal, SERVER, message).code("internal_error")
    }

    /// Why the run service did not accept a run for `model`.
    pub fn not_started(error: &StartError, model: &str, retry_after_secs: u64) -> Self {
        match error {
            StartError::NoNode(_) => Self::model_not_found(model),
            StartError::QueueFull { capacity, cause } => Self::new(
                ErrorKind::RateLimited,
                RATE_LIMIT,
                format!(
                    "No node can take `{model}` now ({}) and the wait queue is full ({capacity} waiting). Retry later.",
                    waiting_for(*cause)
                ),
            )
            .code("queue_full")
            .retry_after(retry_after_secs),
            StartError::Limited(refusal) => Self::limited(refusal),
            StartError::NotSupported { operation } => Self::not_supported(model, *operation),
            StartError::ModelTooLarge(refusal) => Self::model_too_large(model, refusal),
            StartError::ShuttingDown => {
                Self::new(ErrorKind::Unavailable, SERVER, "The edge is shutting down. Retry later.")
                    .code(EdgeFailure::EdgeShutdown.code())
                    .retry_after(retry_after_secs)
            }
        }
    }

    /// 400 `model_too_large`: `model` fits on no node that can load it (its footprint is
    /// above every budget), said with both sizes; Anthropic's `invalid_request_error`.
    pub fn model_too_large(model: &str, refusal: &TooLarge) -> Self {
        Self::new(
            ErrorKind::InvalidRequest,
            INVALID_REQUEST,
            format!(
                "The model `{model}` is too large for every node that can load it: its \
                 footprint is {} and the largest budget is {}.",
                Bytes(refusal.footprint),
                Bytes(refusal.largest_budget)
            ),
        )
        .param("model")
        .code(MODEL_TOO_LARGE)
    }

    /// 501 `not_supported`: no connected node serving `model` can do `operation`.
    pub fn not_supported(model: &str, operation: Operation) -> Self {
        Self::new(
            ErrorKind::NotSupported,
            INVALID_REQUEST,
            format!(
                "No node serving `{model}` supports the {} operation (none declared it).",
                operation.as_str()
            ),
        )
        .code(NOT_SUPPORTED)
    }

    /// 429: the API key is over one of its limits, with the time until it may try again.
    pub fn limited(refusal: &LimitRefusal) -> Self {
        let code = match refusal {
            LimitRefusal::Concurrency { .. } => "concurrency_limit_exceeded",
            LimitRefusal::Rate { .. } => "rate_limit_exceeded",
            LimitRefusal::Budget { .. } => "token_budget_exceeded",
        };
        Self::new(
            ErrorKind::RateLimited,
            RATE_LIMIT,
            format!("Refused by your API key's limits: {refusal}. Retry later."),
        )
        .code(code)
        .retry_after(refusal.retry_after_secs())
    }

    /// A run that ended with `failed`, by class: REQUEST the node's 4xx or 501 (else 400), code and
    /// message; NODE 502; REFUSED 503 with `Retry-After`; unclassified by code.
    pub fn run_failed(
        code: &str,
        message: &str,
        class: FailureClass,
        status: Option<u16>,
        retry_after_secs: u64,
    ) -> Self {
        match class {
            FailureClass::Request => Self::bad_run_request(code, message, status, retry_after_secs),
            FailureClass::Node => Self::new(
                ErrorKind::Upstream,
                SERVER,
                format!("The node failed the request: {message}"),
            )
            .code(code),
            FailureClass::Refused => Self::new(
                ErrorKind::Unavailable,
                SERVER,
                format!("No node could take the request: {message}. Retry later."),
            )
            .code(code)
            .retry_after(retry_after_secs),
            FailureClass::Unspecified => Self::unclassified(code, message, retry_after_secs),
        }
    }

    /// A run its node judged a bad request: the kind of the node's 4xx (or 501) status, its
    /// code and message.
    fn bad_run_request(code: &str, message: &str, status: Option<u16>, retry_after: u64) -> Self {
        let kind = ErrorKind::of_node_status(status);
        let openai_type = match kind {
            ErrorKind::Authentication => "authentication_error",
            ErrorKind::Permission => "permission_error",
            ErrorKind::RateLimited => RATE_LIMIT,
            _ => INVALID_REQUEST,
        };
        let message = if message.is_empty() { code } else { message };
        let error = Self::new(kind, openai_type, message).code(code);
        if kind == ErrorKind::RateLimited {
            error.retry_after(retry_after)
        } else {
            error
        }
    }

    /// A failure without a class, judged by its code.
    fn unclassified(code: &str, message: &str, retry_after_secs: u64) -> Self {
        let edge = |failure: EdgeFailure| failure.code() == code;
        let unavailable = [
            EdgeFailure::QueueTimeout,
            EdgeFailure::EdgeShutdown,
            EdgeFailure::NoNodeAvailable,
            EdgeFailure::QueueFull,
        ];
        if unavailable.into_iter().any(edge) {
            Self::new(
                ErrorKind::Unavailable,
                SERVER,
                format!("{message}. Retry later."),
            )
            .code(code)
            .retry_after(retry_after_secs)
        } else if edge(EdgeFailure::DeadlineExceeded) {
            Self::new(ErrorKind::Timeout, SERVER, message).code(code)
        } else {
            Self::new(
                ErrorKind::Upstream,
                SERVER,
                format!("The node failed the request: {message}"),
            )
            .code(code)
        }
    }

    /// 503: the edge is serving `[http] max_concurrent_requests` API requests already.
    pub fn overloaded(retry_after_secs: u64) -> Self {
        Self::new(
            ErrorKind::Unavailable,
            SERVER,
            "The edge is serving as many requests as it allows at once. Retry later.",
        )
        .code("server_overloaded")
        .retry_after(retry_after_secs)
    }

    /// 503: this edge is a standby member of its site; the active member answers at
    /// `active_api` (`HOST:PORT`, of edge `active_edge`) when known. The caller retries there
    /// or through the site's balancer.
    pub fn standby(active: Option<(&str, &str)>, retry_after_secs: u64) -> Self {
        let message = match active {
            Some((edge, api)) => format!(
                "This edge is a standby member of its site. The active member is edge `{edge}`, \
                 answering at {api}. Retry there, or through the site's load balancer."
            ),
            None => "This edge is a standby member of its site and no active member is known \
                     yet. Retry later, or through the site's load balancer."
                .to_owned(),
        };
        Self::new(ErrorKind::Unavailable, SERVER, message)
            .code("standby")
            .retry_after(retry_after_secs)
    }

    /// A run cancelled by someone other than the client (an operator, the edge).
    pub fn run_cancelled(reason: &str) -> Self {
        Self::new(
            ErrorKind::Upstream,
            SERVER,
            format!("The run was cancelled: {reason}"),
        )
        .code("run_cancelled")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shape_is_openai_s() {
        let json: serde_json::Value =
            serde_json::from_str(&ApiError::missing("messages").to_json()).unwrap();
        assert_eq!(json["error"]["type"], "invalid_request_error");
        assert_eq!(json["error"]["param"], "messages");
        assert_eq!(json["error"]["code"], "missing_required_parameter");
        assert!(
            json["error"]["message"]
                .as_str()
                .unwrap()
                .contains("messages")
        );
        let json: serde_json::Value =
            serde_json::from_str(&ApiError::internal("x").to_json()).unwrap();
        assert!(json["error"]["param"].is_null());
    }

    #[test]
    fn a_prompt_over_the_window_is_openai_s_context_length_exceeded() {
        let failed = ApiError::run_failed(
            CONTEXT_LENGTH_EXCEEDED,
            "request (4339 tokens) exceeds the available context size (2048 tokens)",
            FailureClass::Request,
            Some(400),
            1,
        );
        let error = failed.clone().with_context_window(Some(4339), Some(2048));
        assert_eq!(error.kind(), ErrorKind::InvalidRequest);
        assert_eq!(error.error_code(), Some(CONTEXT_LENGTH_EXCEEDED));
        assert_eq!(
            error.message(),
            "This model's maximum context length is 2048 tokens. However, your messages resulted in 4339 tokens. Please reduce the length of the messages."
        );
        let json: serde_json::Value = serde_json::from_str(&error.to_json()).unwrap();
        assert_eq!(json["error"]["param"], "messages");
        assert_eq!(
            error.overflow(),
            Some(Overflow {
                prompt: Some(4339),
                window: 2048
            })
        );
        // Without the window (a node that did not measure it), the node's own words stay.
        assert_eq!(failed.clone().with_context_window(Some(4339), None), failed);
        // Another failure with a window is left alone.
        let other = ApiError::run_failed("bad_tool", "m", FailureClass::Request, Some(400), 1);
        assert_eq!(other.clone().with_context_window(Some(1), Some(2)), other);
    }

    #[test]
    fn failures_map_to_kinds() {
        let unclassified = FailureClass::Unspecified;
        let kind = |code| ApiError::run_failed(code, "m", unclassified, None, 1).kind();
        assert_eq!(kind("queue_timeout"), ErrorKind::Unavailable);
        assert_eq!(kind("edge_shutdown"), ErrorKind::Unavailable);
        assert_eq!(kind("no_node_available"), ErrorKind::Unavailable);
        assert_eq!(kind("queue_full"), ErrorKind::Unavailable);
        assert_eq!(kind("deadline_exceeded"), ErrorKind::Timeout);
        assert_eq!(kind("node_disconnected"), ErrorKind::Upstream);
        assert_eq!(kind("cuda_oom"), ErrorKind::Upstream);
        assert_eq!(
            ApiError::run_failed("queue_timeout", "m", unclassified, None, 7).retry_after_secs,
            Some(7)
        );
    }

    #[test]
    fn failure_classes_choose_the_kind() {
        let failed = |class, status| ApiError::run_failed("c", "upstream says", class, status, 2);
        let request = failed(FailureClass::Request, Some(413));
        assert_eq!(request.kind(), ErrorKind::TooLarge);
        assert_eq!(request.openai_type, INVALID_REQUEST);
        assert_eq!(request.message(), "upstream says");
        assert_eq!(request.error_code(), Some("c"));
        for status in [None, Some(500), Some(200), Some(99)] {
            assert_eq!(
                failed(FailureClass::Request, status).kind(),
                ErrorKind::InvalidRequest
            );
        }
        let limited = failed(FailureClass::Request, Some(429));
        assert_eq!(
            (limited.openai_type, limited.retry_after_secs),
            (RATE_LIMIT, Some(2))
        );
        let node = failed(FailureClass::Node, Some(500));
        assert_eq!(
            (node.kind(), node.openai_type),
            (ErrorKind::Upstream, SERVER)
        );
        let refused = failed(FailureClass::Refused, None);
        assert_eq!(refused.kind(), ErrorKind::Unavailable);
        assert_eq!(refused.retry_after_secs(), Some(2));
    }
}
