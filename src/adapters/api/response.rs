//! [`ApiError`] as an HTTP response: its status, OpenAI's JSON body and the headers that
//! go with it (`Retry-After`, `WWW-Authenticate` on a 401), and [`ErrorShape`], which of the
//! APIs' error bodies a route answers with. The other APIs' error shapes (Anthropic's) reuse
//! [`ApiError::add_headers`].

use axum::Json;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};

use super::anthropic;
use super::error::ApiError;

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
            Self::Anthropic => anthropic::error_response(error),
        }
    }
}

impl ApiError {
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
