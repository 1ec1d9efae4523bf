//! The bound on `/v1` requests served at once.

use std::sync::Arc;

use axum::body::Body;
use axum::extract::{Request, State};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use futures::StreamExt;
use tokio::sync::Semaphore;

use super::openai::ApiError;

/// Slots for `/v1` requests; a request holds one until its response body (a whole
/// stream, for SSE) has been sent or dropped.
#[derive(Clone)]
pub(super) struct RequestSlots {
    slots: Arc<Semaphore>,
    retry_after_secs: u64,
}

impl RequestSlots {
    /// `max` slots; a refused request is told to retry after `retry_after_secs`.
    pub(super) fn new(max: usize, retry_after_secs: u64) -> Self {
        Self {
            slots: Arc::new(Semaphore::new(max.max(1))),
            retry_after_secs,
        }
    }
}

/// Middleware: serves the request in a free slot, or answers `503` with `Retry-After` in
/// OpenAI's error shape instead of queueing without bound.
pub(super) async fn limit(
    State(slots): State<RequestSlots>,
    request: Request,
    next: Next,
) -> Response {
    let Ok(permit) = Arc::clone(&slots.slots).try_acquire_owned() else {
        return ApiError::overloaded(slots.retry_after_secs).into_response();
    };
    let response = next.run(request).await;
    response.map(|body| {
        let held = body.into_data_stream().map(move |chunk| {
            let _slot = &permit;
            chunk
        });
        Body::from_stream(held)
    })
}
