//! [`ApiError`] as an HTTP response: its status, OpenAI's JSON body and the headers that
//! go with it (`Retry-After`, `WWW-Authenticate` on a 401). The other APIs' error shapes
//! (Anthropic's) reuse [`ApiError::add_headers`].

use axum::Json;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};

use super::error::ApiError;

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
