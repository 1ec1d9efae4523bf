//! What the engine fakes ([`super::fake_ollama`], [`super::fake_vllm`]) share: an HTTP
//! server on a port of its own that can be stopped and started again on the same port (an
//! engine going down and coming back), an SSE body fed by a stream, and wall-clock times
//! written as RFC 3339, as Go and Python write them.

use std::net::SocketAddr;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use axum::Router;
use axum::body::{Body, Bytes};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::serve::ListenerExt as _;
use futures::Stream;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

/// A server listening on one address, which stays the same across [`Listening::down`] and
/// [`Listening::up`].
pub struct Listening {
    /// Where it listens.
    pub addr: SocketAddr,
    app: Router,
    server: Option<(CancellationToken, JoinHandle<()>)>,
}

impl Listening {
    /// Serves `app` on a free port of 127.0.0.1.
    pub async fn start(app: Router) -> Self {
        let mut listening = Self {
            addr: SocketAddr::from(([127, 0, 0, 1], 0)),
            app,
            server: None,
        };
        listening.up().await;
        listening
    }

    /// Stops listening and closes every connection: the engine is down.
    pub async fn down(&mut self) {
        if let Some((stop, serving)) = self.server.take() {
            stop.cancel();
            let aborter = serving.abort_handle();
            if tokio::time::timeout(Duration::from_millis(500), serving)
                .await
                .is_err()
            {
                aborter.abort();
            }
        }
    }

    /// Listens again on the same address.
    pub async fn up(&mut self) {
        let listener = tokio::net::TcpListener::bind(self.addr)
            .await
            .expect("bind the fake engine");
        self.addr = listener.local_addr().expect("the fake engine's address");
        let app = self.app.clone();
        let stop = CancellationToken::new();
        let signal = stop.clone().cancelled_owned();
        // As the engines' servers do (Go's net/http, uvicorn): no Nagle delay on small
        // writes, or a stream's second chunk waits for the client's delayed ACK.
        let listener = listener.tap_io(|tcp| {
            let _ = tcp.set_nodelay(true);
        });
        let serving = tokio::spawn(async move {
            let _ = axum::serve(listener, app)
                .with_graceful_shutdown(signal)
                .await;
        });
        self.server = Some((stop, serving));
    }
}

impl Drop for Listening {
    fn drop(&mut self) {
        if let Some((stop, serving)) = self.server.take() {
            stop.cancel();
            serving.abort();
        }
    }
}

/// `200 text/event-stream` whose body is `frames`, each already `data: ...\n\n`.
pub fn sse(frames: impl Stream<Item = Bytes> + Send + 'static) -> Response {
    use futures::StreamExt as _;
    let body = Body::from_stream(frames.map(Ok::<_, std::io::Error>));
    Response::builder()
        .header(header::CONTENT_TYPE, "text/event-stream")
        .body(body)
        .unwrap_or_else(|_| StatusCode::INTERNAL_SERVER_ERROR.into_response())
}

/// One SSE frame carrying `data`.
pub fn frame(data: &str) -> Bytes {
    Bytes::from(format!("data: {data}\n\n"))
}

/// Seconds since the epoch, as OpenAI's `created`.
pub fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// `at` as RFC 3339 in UTC with nanoseconds (Go's `time.RFC3339Nano`, which Ollama's JSON
/// uses); times past the year 9999 are written as 9999-12-31.
pub fn rfc3339(at: SystemTime) -> String {
    let since = at.duration_since(UNIX_EPOCH).unwrap_or_default();
    let secs = since.as_secs().min(253_402_300_799);
    let days = i64::try_from(secs / 86_400).unwrap_or(0);
    let rest = secs % 86_400;
    // Howard Hinnant's civil_from_days.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{:09}Z",
        rest / 3_600,
        rest % 3_600 / 60,
        rest % 60,
        since.subsec_nanos()
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[crate::common::test]
    fn times_are_written_as_go_writes_them() {
        assert_eq!(rfc3339(UNIX_EPOCH), "1970-01-01T00:00:00.000000000Z");
        let later = UNIX_EPOCH + Duration::new(1_709_251_199, 5);
        assert_eq!(rfc3339(later), "2024-02-29T23:59:59.000000005Z");
    }
}
