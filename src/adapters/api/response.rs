//! [`ApiError`] as an HTTP response: the status of its kind, OpenAI's JSON body and the
//! headers that go with it (`Retry-After`, `WWW-Authenticate` on a 401), and [`ErrorShape`],
//! which of the APIs' error bodies a route answers with, rendered here in either shape:
//! Anthropic's takes its body from Anthropic's translator and reuses
//! [`ApiError::status`] and [`ApiError::add_headers`]. It calls no route's module.

use axum::Json;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};

use super::translators::anthropic::message::error_body as anthropic_error_body;
use super::translators::{ApiError, ErrorKind};

/// The error body a route answers with: each API's routes carry theirs (as a request
/// extension set around the route group, `api::route_groups`), so the middleware in front
/// of them (the request limit, the key check) answers in the shape the client's SDK reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) enum ErrorShape {
    /// `{"error": {"message", "type", "code", "param"}}`, OpenAI's (chat, completions,
    /// embeddings, Responses, models, and any path the edge does not serve).
    #[default]
    OpenAi,
    /// `{"type": "error", "error": {"type", "message"}}`, Anthropic's (Messages).
    Anthropic,
}

impl ErrorShape {
    /// The shape of the route `request` is for (OpenAI's where none is set).
    pub(crate) fn of<B>(request: &axum::http::Request<B>) -> Self {
        request
            .extensions()
            .get::<Self>()
            .copied()
            .unwrap_or_default()
    }

    /// `error` as a response in this shape.
    pub(crate) fn render(self, error: &ApiError) -> Response {
        match self {
            Self::OpenAi => error.clone().into_response(),
            Self::Anthropic => {
                let body = Json(anthropic_error_body(error));
                let mut response = (error.status(), body).into_response();
                error.add_headers(&mut response);
                response
            }
        }
    }
}

impl ApiError {
    /// The HTTP status of the error's kind.
    pub fn status(&self) -> StatusCode {
        match self.kind() {
            ErrorKind::InvalidRequest => StatusCode::BAD_REQUEST,
            ErrorKind::Authentication => StatusCode::UNAUTHORIZED,
            ErrorKind::Permission => StatusCode::FORBIDDEN,
            ErrorKind::NotFound => StatusCode::NOT_FOUND,
            ErrorKind::MethodNotAllowed => StatusCode::METHOD_NOT_ALLOWED,
            ErrorKind::Conflict => StatusCode::CONFLICT,
            ErrorKind::TooLarge => StatusCode::PAYLOAD_TOO_LARGE,
            ErrorKind::Unprocessable => StatusCode::UNPROCESSABLE_ENTITY,
            ErrorKind::RateLimited => StatusCode::TOO_MANY_REQUESTS,
            ErrorKind::UpgradeRequired => StatusCode::UPGRADE_REQUIRED,
            ErrorKind::Internal => StatusCode::INTERNAL_SERVER_ERROR,
            ErrorKind::NotSupported => StatusCode::NOT_IMPLEMENTED,
            ErrorKind::Upstream => StatusCode::BAD_GATEWAY,
            ErrorKind::Unavailable => StatusCode::SERVICE_UNAVAILABLE,
            ErrorKind::Timeout => StatusCode::GATEWAY_TIMEOUT,
        }
    }

    /// Adds the headers every rendering of this error carries (`Retry-After`).
    pub fn add_headers(&self, response: &mut Response) {
        if let Some(secs) = self.retry_after_secs() {
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(secs));
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut response = (self.status(), Json(self.body())).into_response();
        self.add_headers(&mut response);
        if self.status() == StatusCode::UNAUTHORIZED {
            response
                .headers_mut()
                .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
        }
        response
    }
}
