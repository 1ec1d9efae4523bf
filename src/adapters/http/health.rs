//! `GET /healthz`, `GET /readyz` and `GET /metrics`.

use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};

use super::server::HttpState;

/// The process is alive and serving HTTP.
pub(super) async fn healthz() -> &'static str {
    "ok\n"
}

/// Ready for work: the node transport is listening, the config is loaded (both hold once
/// the server runs), and the edge is not draining.
pub(super) async fn readyz(State(state): State<HttpState>) -> Response {
    if state.transport.is_draining() {
        (StatusCode::SERVICE_UNAVAILABLE, "draining\n").into_response()
    } else {
        (StatusCode::OK, "ready\n").into_response()
    }
}

/// Every metric in the Prometheus text format.
pub(super) async fn metrics(State(state): State<HttpState>) -> Response {
    match crate::app::metrics::render(&state.metrics) {
        Ok(text) => (
            [(
                header::CONTENT_TYPE,
                "text/plain; version=0.0.4; charset=utf-8",
            )],
            text,
        )
            .into_response(),
        Err(error) => (
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("cannot render metrics: {error}\n"),
        )
            .into_response(),
    }
}
