//! The streamed answer's body, for every API: Server-Sent Events written by an API's
//! [`EventWriter`] (`translators/frame.rs`) as the run's events arrive. A stream never ends silently: the writer
//! closes it with the API's own end (`[DONE]`, `message_stop`, `response.completed`) or
//! error event.
//!
//! The SSE body owns the run: when the client disconnects, hyper drops the body and the run
//! is cancelled on the node (unless the run was detached: Responses `background: true`; a
//! resumable stream's run goes on for `runs.client_resume_grace_ms`, see `resume.rs`).
//! Every event the run has ready when hyper asks for more goes out in one body frame (one
//! write), rendered straight into that frame's buffer.
//! A resumable stream's events carry ids (`frame.rs`'s `EventId`).

use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::{Body, Bytes, HttpBody};
use axum::http::{HeaderValue, header};
use axum::response::Response;
use http_body::Frame;
use tokio::time::{Instant, Sleep};

use super::run::{ActiveRun, Step};
use super::translators::frame::{EventWriter, SseFrame};
use crate::domain::Usage;
use crate::hops;

/// How long a stream may stay silent before a comment line keeps idle-timeout proxies from
/// closing it.
pub(super) const KEEP_ALIVE_INTERVAL: Duration = Duration::from_secs(15);

/// A frame stops taking ready events at this size; the rest go in the next one.
const MAX_FRAME_BYTES: usize = 64 * 1024;

/// The first buffer's size: a typical short completion fits in one.
const FIRST_FRAME_CAPACITY: usize = 4 * 1024;

/// Answers with an SSE stream, given its first step (output or a successful end) when it
/// has already been read.
pub(super) fn respond<W: EventWriter>(
    mut run: ActiveRun,
    writer: W,
    first: Option<Step>,
) -> Response {
    run.streaming();
    let ids = run.resumable();
    let mut body = SseBody {
        run,
        writer,
        frame: SseFrame::with_capacity(FIRST_FRAME_CAPACITY),
        ids,
        opened: false,
        done: false,
        cut: false,
        last_sent: Instant::now(),
        keep_alive: None,
    };
    match first {
        Some(first) => body.absorb(first),
        // The stream begins at once, before the run's first event.
        None => body.open(None),
    }
    event_stream(Body::new(body))
}

/// The response whose body is the SSE stream `body`, with the headers every stream has.
pub(super) fn event_stream(body: Body) -> Response {
    let mut response = Response::new(body);
    let headers = response.headers_mut();
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/event-stream"),
    );
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    // Ask proxies such as nginx not to buffer the stream.
    headers.insert(
        header::HeaderName::from_static("x-accel-buffering"),
        HeaderValue::from_static("no"),
    );
    response
}

/// Why a resumable stream's connection is broken off rather than ended: its run's events
/// stopped before its end — this member let the run go, standing down — and an error event
/// would tell its client the run failed while the member that acts now completes it (found
/// by the nemesis, issue 66). Broken off, the stream is resumed there, as after a crash.
#[derive(Debug, thiserror::Error)]
#[error("the run's events stopped before its end: resume its stream")]
pub(super) struct StreamCut;

/// The body of one streamed answer.
struct SseBody<W> {
    run: ActiveRun,
    /// Renders the API's events.
    writer: W,
    /// Events rendered and not yet handed to hyper.
    frame: SseFrame,
    /// Whether the events carry ids (the stream can be resumed).
    ids: bool,
    /// Whether the opening events are written.
    opened: bool,
    /// The run has ended; send what is rendered, then end.
    done: bool,
    /// The run's events stopped before its end on a resumable stream: broken off, not
    /// ended, once what is rendered is sent.
    cut: bool,
    /// When the last frame was handed to hyper.
    last_sent: Instant,
    /// Armed only once the stream has had to wait (a stream answered at once needs none).
    keep_alive: Option<Pin<Box<Sleep>>>,
}

impl<W: EventWriter> HttpBody for SseBody<W> {
    type Data = Bytes;
    type Error = StreamCut;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, StreamCut>>> {
        let body = self.get_mut();
        while !body.done && body.frame.len() < MAX_FRAME_BYTES {
            match body.run.poll_step(cx) {
                Poll::Ready(step) => body.absorb(step),
                Poll::Pending => break,
            }
        }
        if !body.frame.is_empty() {
            body.last_sent = Instant::now();
            tracing::trace!(target: hops::TARGET, hop = hops::API_FRAME, run_id = %body.run.id());
            return Poll::Ready(Some(Ok(Frame::data(body.frame.split()))));
        }
        if body.done {
            return Poll::Ready(std::mem::take(&mut body.cut).then_some(Err(StreamCut)));
        }
        body.poll_keep_alive(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.done && self.frame.is_empty()
    }
}

impl<W: EventWriter> SseBody<W> {
    /// The keep-alive once the stream has been silent for the interval.
    fn poll_keep_alive(
        &mut self,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, StreamCut>>> {
        let due = self.last_sent + KEEP_ALIVE_INTERVAL;
        let timer = self
            .keep_alive
            .get_or_insert_with(|| Box::pin(tokio::time::sleep_until(due)));
        if timer.deadline() != due {
            timer.as_mut().reset(due);
        }
        if timer.as_mut().poll(cx).is_pending() {
            return Poll::Pending;
        }
        self.last_sent = Instant::now();
        Poll::Ready(Some(Ok(Frame::data(self.writer.keep_alive()))))
    }

    /// Writes the opening events, once, with the run's counts when they came by then.
    fn open(&mut self, counts: Option<Usage>) {
        if !self.opened {
            self.opened = true;
            self.writer.open(counts, &mut self.frame);
        }
    }

    /// Writes `step`, the opening events first; its events' ids follow the position of
    /// the run's event it came from.
    fn absorb(&mut self, step: Step) {
        if self.ids {
            self.frame.group(self.run.position());
        }
        if !self.opened {
            // The counts the engine reported with the first output open the stream.
            let counts = match &step {
                Step::Output(output) => output.structured().and_then(|s| s.usage),
                Step::End(_) => None,
            };
            self.open(counts);
        }
        match step {
            Step::Output(output) => {
                let (text, structured) = (output.text(), output.structured());
                self.writer.output(text, structured, &mut self.frame);
            }
            Step::End(_) if self.ids && self.run.cut() => {
                self.cut = true;
                self.done = true;
            }
            Step::End(end) => {
                self.writer.close(end, &mut self.frame);
                self.done = true;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use bytes::BufMut as _;
    use futures::FutureExt;
    use tokio::sync::mpsc;

    use super::*;
    use crate::adapters::api::translators::frame::{EventId, push_event};
    use crate::adapters::api::translators::openai::chunks::ChunkWriter;
    use crate::adapters::api::translators::openai::{Endpoint, Reply};
    use crate::adapters::event_format::tests::{completed, output};
    use crate::domain::routing::WaitCause;
    use crate::domain::{RunEvent, RunId};
    use crate::ports::runs::MockRuns;
    use crate::ports::{Placed, RunHandle};

    /// A streamed chat answer fed by the returned sender, as the run service would feed it.
    async fn streamed_chat() -> (mpsc::Sender<Arc<RunEvent>>, Body) {
        // The run ends with its terminal event, so nothing is cancelled; a cancel would be
        // answered as the run service does for a run it no longer holds.
        let mut runs = MockRuns::new();
        runs.expect_cancel().returning(|_, _| false);
        let (events, receiver) = mpsc::channel(64);
        let handle = RunHandle {
            run_id: RunId::new("r1"),
            events: receiver,
            placed: Placed::Waiting(WaitCause::AllBusy),
        };
        let mut run = ActiveRun::new(Arc::new(runs), handle, 1);
        let reply = Reply::new(Endpoint::Chat, run.id(), "echo/m1".to_owned(), 0, false);
        events.send(output("first")).await.unwrap();
        let first = run.next().await;
        (
            events,
            respond(run, ChunkWriter::new(&reply), Some(first)).into_body(),
        )
    }

    /// The body's next frame as text, if it has one ready.
    fn ready_frame(body: &mut Body) -> Option<Option<String>> {
        let frame =
            std::future::poll_fn(|cx| Pin::new(&mut *body).poll_frame(cx)).now_or_never()?;
        Some(frame.map(|frame| {
            let data = frame.unwrap().into_data().unwrap();
            String::from_utf8(data.to_vec()).unwrap()
        }))
    }

    fn events_in(frame: &str) -> Vec<&str> {
        frame.split_terminator("\n\n").collect()
    }

    #[test]
    fn a_resumed_frame_leaves_out_the_events_up_to_the_last_one_seen() {
        let write = |frame: &mut SseFrame| {
            for position in [3, 5] {
                frame.group(position);
                for data in ["a", "b"] {
                    push_event(frame, |buf| buf.put_slice(data.as_bytes()));
                }
            }
            String::from_utf8(frame.split().to_vec()).unwrap()
        };
        assert_eq!(
            write(&mut SseFrame::resumed(None)),
            "id: 3\ndata: a\n\nid: 3.1\ndata: b\n\nid: 5\ndata: a\n\nid: 5.1\ndata: b\n\n"
        );
        assert_eq!(
            write(&mut SseFrame::resumed(EventId::parse("3.1"))),
            "id: 5\ndata: a\n\nid: 5.1\ndata: b\n\n"
        );
        // Without a group, no ids.
        let mut plain = SseFrame::default();
        push_event(&mut plain, |buf| buf.put_slice(b"x"));
        assert_eq!(plain.split(), "data: x\n\n");
    }

    #[tokio::test(start_paused = true)]
    async fn ready_events_share_one_frame_and_silence_gets_a_keep_alive() {
        let (events, mut body) = streamed_chat().await;
        let opening = ready_frame(&mut body).unwrap().unwrap();
        let opening = events_in(&opening);
        assert_eq!(opening.len(), 2, "{opening:?}");
        assert!(opening[0].contains(r#""role":"assistant""#));
        assert!(opening[1].contains(r#""content":"first""#));

        for text in ["a", "b", "c"] {
            events.send(output(text)).await.unwrap();
        }
        let batch = ready_frame(&mut body).unwrap().unwrap();
        let batch = events_in(&batch);
        assert_eq!(batch.len(), 3, "{batch:?}");
        assert!(batch.iter().all(|event| event.starts_with("data: {")));

        assert!(ready_frame(&mut body).is_none(), "nothing to send yet");
        tokio::time::sleep(KEEP_ALIVE_INTERVAL).await;
        assert_eq!(ready_frame(&mut body).unwrap().unwrap(), ":\n\n");

        events.send(completed()).await.unwrap();
        let closing = ready_frame(&mut body).unwrap().unwrap();
        let closing = events_in(&closing);
        assert!(closing[0].contains(r#""finish_reason":"stop""#));
        assert_eq!(closing.last(), Some(&"data: [DONE]"));
        assert!(body.is_end_stream());
        assert_eq!(ready_frame(&mut body), Some(None));
    }
}
