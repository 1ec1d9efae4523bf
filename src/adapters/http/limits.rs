//! The bound on the client APIs' requests served at once.

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use axum::body::{Body, Bytes, HttpBody};
use axum::extract::{Request, State};
use axum::middleware::Next;
use axum::response::Response;
use http_body::{Frame, SizeHint};
use tokio::sync::Semaphore;

/// Slots for the limited routes; a request holds one until its response body (a whole
/// stream, for SSE) has been sent or dropped.
#[derive(Clone)]
pub(super) struct RequestSlots {
    slots: Arc<Semaphore>,
}

impl RequestSlots {
    /// `max` slots.
    pub(super) fn new(max: usize) -> Self {
        Self {
            slots: Arc::new(Semaphore::new(max.max(1))),
        }
    }

    /// The limit of one group of routes: these slots, and `refuse` for a request that
    /// finds none free.
    pub(super) fn for_group(&self, refuse: Arc<dyn Fn() -> Response + Send + Sync>) -> GroupLimit {
        GroupLimit {
            slots: Arc::clone(&self.slots),
            refuse,
        }
    }
}

/// One group's view of the slots.
#[derive(Clone)]
pub(super) struct GroupLimit {
    slots: Arc<Semaphore>,
    refuse: Arc<dyn Fn() -> Response + Send + Sync>,
}

/// Middleware: serves the request in a free slot, or answers with the group's refusal
/// (a `503` with `Retry-After`) instead of queueing without bound.
pub(super) async fn limit(
    State(limit): State<GroupLimit>,
    request: Request,
    next: Next,
) -> Response {
    let Ok(slot) = Arc::clone(&limit.slots).try_acquire_owned() else {
        return (limit.refuse)();
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
