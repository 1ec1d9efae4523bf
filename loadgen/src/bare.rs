//! The bare baseline of the shared-core rig (issue 50): hyper's HTTP/1.1 server and nothing
//! else — no axum, no router, no run, no node — answering a chat completion with the edge's
//! own answer, captured beforehand: the streamed one as its SSE events, one body frame each,
//! the other whole. It reads the request body (so the connection stays reusable) and looks
//! only at whether it asks for a stream. It must not do more work per request than that, or
//! it stops being the floor the edge is measured against.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;

use bytes::Bytes;
use http_body_util::{BodyExt, Either, Full, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper::header::{CACHE_CONTROL, CONTENT_TYPE, HeaderValue};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

/// What the bare server answers: the edge's answers, captured.
#[derive(Debug, Clone)]
pub struct Canned {
    /// The whole non-streamed answer (JSON).
    pub full: Bytes,
    /// The SSE events of the streamed answer, each sent as its own body frame.
    pub events: Vec<Bytes>,
}

type Frames = futures::stream::Iter<std::vec::IntoIter<Result<Frame<Bytes>, Infallible>>>;
type Answer = Either<StreamBody<Frames>, Full<Bytes>>;

async fn answer(
    canned: Arc<Canned>,
    request: Request<Incoming>,
) -> anyhow::Result<Response<Answer>> {
    let body = request.into_body().collect().await?.to_bytes();
    let stream = body.windows(13).any(|w| w == b"\"stream\":true");
    let response = if stream {
        let frames: Vec<_> = canned
            .events
            .iter()
            .map(|event| Ok(Frame::data(event.clone())))
            .collect();
        let mut response =
            Response::new(Either::Left(StreamBody::new(futures::stream::iter(frames))));
        let headers = response.headers_mut();
        headers.insert(CONTENT_TYPE, HeaderValue::from_static("text/event-stream"));
        headers.insert(CACHE_CONTROL, HeaderValue::from_static("no-cache"));
        response
    } else {
        let mut response = Response::new(Either::Right(Full::new(canned.full.clone())));
        response
            .headers_mut()
            .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
        response
    };
    Ok(response)
}

/// Binds loopback port 0 and serves `canned` on the current runtime until `stop`; returns
/// the address. Connections still open at `stop` end with the runtime.
pub async fn start(canned: Canned, stop: CancellationToken) -> anyhow::Result<SocketAddr> {
    let listener = TcpListener::bind(SocketAddr::from(([127, 0, 0, 1], 0))).await?;
    let addr = listener.local_addr()?;
    tokio::spawn(serve_http(listener, Arc::new(canned), answer, stop));
    Ok(addr)
}

/// Serves HTTP/1.1 on `listener` until `stop` (the bare server's, and the floor relay's):
/// each connection with `answer` over `state`, its small SSE frames sent without waiting for
/// Nagle's algorithm. Connections still open at `stop` end with the runtime.
pub async fn serve_http<T, A, F, B>(
    listener: TcpListener,
    state: Arc<T>,
    answer: A,
    stop: CancellationToken,
) where
    T: Send + Sync + 'static,
    A: Fn(Arc<T>, Request<Incoming>) -> F + Copy + Send + Sync + 'static,
    F: Future<Output = anyhow::Result<Response<B>>> + Send + 'static,
    B: hyper::body::Body + Send + 'static,
    B::Data: Send,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    loop {
        let accepted = tokio::select! {
            () = stop.cancelled() => return,
            accepted = listener.accept() => accepted,
        };
        let Ok((tcp, _)) = accepted else { continue };
        let _ = tcp.set_nodelay(true);
        let state = Arc::clone(&state);
        tokio::spawn(async move {
            let service = service_fn(move |request| answer(Arc::clone(&state), request));
            let _ = http1::Builder::new()
                .serve_connection(TokioIo::new(tcp), service)
                .await;
        });
    }
}
