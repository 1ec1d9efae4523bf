//! W3C trace context on the API: with span export on, every `/v1` request runs inside an
//! `api_request` span whose parent is the client's `traceparent` (when it sends one), so
//! the client's trace continues through the edge; the run a handler starts is a child of
//! that span. The span stays open until the response body has been sent (a stream's
//! whole length).
//!
//! Installed only when `[tracing]` exports spans (`HttpServer::with_request_traces`);
//! otherwise no request pays for it. It neither reads nor changes a body.

use axum::extract::Request;
use axum::http::HeaderMap;
use axum::middleware::Next;
use axum::response::Response;
use opentelemetry::propagation::{Extractor, TextMapPropagator as _};
use opentelemetry_sdk::propagation::TraceContextPropagator;
use tracing::{Instrument as _, info_span};
use tracing_opentelemetry::OpenTelemetrySpanExt as _;

use super::limits::Holding;
use crate::ports::EXPORT_TARGET;

/// Runs a `/v1` request inside its `api_request` span, continuing the client's trace.
pub(super) async fn traced(request: Request, next: Next) -> Response {
    let path = request.uri().path();
    if !path.starts_with("/v1/") {
        return next.run(request).await;
    }
    let method = request.method().clone();
    let span = info_span!(
        target: EXPORT_TARGET,
        "api_request",
        otel.name = %format_args!("{method} {path}"),
        otel.kind = "server",
        http.request.method = %method,
        url.path = %path,
        http.response.status_code = tracing::field::Empty,
    );
    let parent = TraceContextPropagator::new().extract(&Headers(request.headers()));
    // Fails only for a span no exporter records; then there is nothing to continue.
    let _ = span.set_parent(parent);
    let response = next.run(request).instrument(span.clone()).await;
    span.record("http.response.status_code", response.status().as_u16());
    response.map(|body| Holding::body(body, span))
}

/// A request's headers as the propagator reads them.
struct Headers<'a>(&'a HeaderMap);

impl Extractor for Headers<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).and_then(|value| value.to_str().ok())
    }

    fn keys(&self) -> Vec<&str> {
        self.0.keys().map(|name| name.as_str()).collect()
    }
}
