//! The bound on `/v1` requests served at once.

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use axum::body::{Body, Bytes, HttpBody};
use axum::extract::{Request, State};
use axum::middleware::Next;
use axum::response::Response;
use http_body::{Frame, SizeHint};
use tokio::sync::Semaphore;

use crate::adapters::api::{ApiError, ErrorShape};
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
    let Ok(slot) = Arc::clone(&slots.slots).try_acquire_owned() else {
        let error = ApiError::overloaded(slots.retry_after_secs);
        return ErrorShape::of(&request).render(&error);
    };
    next.run(request)
        .await
        .map(|body| Holding::body(body, slot))
}

/// A response body that holds `guard` (its request's slot, its request's span) until it
/// is sent or dropped; otherwise the body itself, frame for frame (its size hint too, so
/// `Content-Length` stays).
pub(super) struct Holding<G> {
    body: Body,
    _guard: G,
}

impl<G: Send + Unpin + 'static> Holding<G> {
    /// `body`, holding `guard` until it is sent or dropped.
    pub(super) fn body(body: Body, guard: G) -> Body {
        Body::new(Self {
            body,
            _guard: guard,
        })
    }
}

impl<G: Unpin> HttpBody for Holding<G> {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        Pin::new(&mut self.body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}
