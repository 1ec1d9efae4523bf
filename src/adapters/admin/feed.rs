//! How the management API's event routes answer a feed: as Server-Sent Events, with a
//! keep-alive comment after each silent while, or as JSON lines — chosen by the `format`
//! parameter or the `Accept` header. It frames nothing itself: the routes hand it finished
//! frames (an SSE record, or a line), whatever their events are.

use std::convert::Infallible;
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::http::{HeaderMap, HeaderValue, header};
use axum::response::{IntoResponse, Response};
use futures::{Stream, StreamExt};

use super::error::AdminError;

/// How long an SSE stream may stay silent before a keep-alive comment.
const KEEP_ALIVE: Duration = Duration::from_secs(15);

/// Whether to answer as SSE: `format` says (`sse` or `jsonl`), else whether `Accept` asks
/// for `text/event-stream`.
///
/// # Errors
/// `400` for any other `format`.
pub(super) fn wants_sse(format: Option<&str>, headers: &HeaderMap) -> Result<bool, AdminError> {
    match format {
        Some("sse") => Ok(true),
        Some("jsonl") => Ok(false),
        Some(_) => Err(AdminError::bad_request("`format` must be sse or jsonl")),
        None => Ok(headers
            .get(header::ACCEPT)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.contains("text/event-stream"))),
    }
}

/// The answer streaming `frames`: SSE records (`sse`) with keep-alives between them, or
/// JSON lines, uncached.
pub(super) fn respond<S>(frames: S, sse: bool) -> Response
where
    S: Stream<Item = Bytes> + Send + 'static,
{
    let (body, content_type) = if sse {
        (Body::from_stream(keep_alive(frames)), "text/event-stream")
    } else {
        (
            Body::from_stream(frames.map(Ok::<_, Infallible>)),
            "application/jsonl",
        )
    };
    let mut response = body.into_response();
    let headers = response.headers_mut();
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    response
}

/// `frames`, with a comment after each silent [`KEEP_ALIVE`], so proxies and clients know
/// the stream is alive.
fn keep_alive<S>(frames: S) -> impl Stream<Item = Result<Bytes, Infallible>> + Send
where
    S: Stream<Item = Bytes> + Send + 'static,
{
    futures::stream::unfold(Box::pin(frames), |mut frames| async move {
        match tokio::time::timeout(KEEP_ALIVE, frames.next()).await {
            Ok(Some(frame)) => Some((Ok(frame), frames)),
            Ok(None) => None,
            Err(_) => Some((Ok(Bytes::from_static(b": keep-alive\n\n")), frames)),
        }
    })
}
