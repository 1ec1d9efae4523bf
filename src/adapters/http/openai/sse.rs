//! The streamed answer: Server-Sent Events in OpenAI's chunk format, ending with
//! `data: [DONE]` after success, or with one error chunk (`{"error":{...}}`) when the run
//! fails after streaming began. A stream never ends silently.
//!
//! The SSE body owns the run: when the client disconnects, hyper drops the body and the run
//! is cancelled on the node. Every event the run has ready when hyper asks for more goes
//! out in one body frame (one write), rendered straight into that frame's buffer.

use std::convert::Infallible;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::{Body, Bytes, HttpBody};
use axum::http::{HeaderValue, header};
use axum::response::Response;
use bytes::{BufMut, BytesMut};
use http_body::Frame;
use serde::Serialize;
use serde_json::Value;
use tokio::time::{Instant, Sleep};

use super::reply::{Piece, Reply, usage_json};
use super::request::Endpoint;
use super::run::{ActiveRun, Step};

/// The data of the stream's last event after success.
const DONE: &str = "[DONE]";

/// How long a stream may stay silent before a comment line keeps idle-timeout proxies from
/// closing it.
const KEEP_ALIVE_INTERVAL: Duration = Duration::from_secs(15);

/// The keep-alive comment.
const KEEP_ALIVE_COMMENT: &[u8] = b":\n\n";

/// A frame stops taking ready events at this size; the rest go in the next one.
const MAX_FRAME_BYTES: usize = 64 * 1024;

/// The first buffer's size: a typical short completion fits in one.
const FIRST_FRAME_CAPACITY: usize = 4 * 1024;

/// Answers with an SSE stream whose first step (output or a successful end) has already
/// been read.
pub(super) fn respond(run: ActiveRun, reply: Reply, first: Step) -> Response {
    let mut body = SseBody {
        run,
        chunks: ChunkWriter::new(&reply),
        reply,
        frame: BytesMut::with_capacity(FIRST_FRAME_CAPACITY),
        done: false,
        last_sent: Instant::now(),
        keep_alive: None,
    };
    body.push(Piece::Start);
    body.absorb(first);
    let mut response = Response::new(Body::new(body));
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

/// The body of one streamed answer.
struct SseBody {
    run: ActiveRun,
    reply: Reply,
    /// What every chunk of the stream ends with.
    chunks: ChunkWriter,
    /// Events rendered and not yet handed to hyper.
    frame: BytesMut,
    /// The run has ended; send what is rendered, then end.
    done: bool,
    /// When the last frame was handed to hyper.
    last_sent: Instant,
    /// Armed only once the stream has had to wait (a stream answered at once needs none).
    keep_alive: Option<Pin<Box<Sleep>>>,
}

impl HttpBody for SseBody {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        let body = self.get_mut();
        while !body.done && body.frame.len() < MAX_FRAME_BYTES {
            match body.run.poll_step(cx) {
                Poll::Ready(step) => body.absorb(step),
                Poll::Pending => break,
            }
        }
        if !body.frame.is_empty() {
            body.last_sent = Instant::now();
            return Poll::Ready(Some(Ok(Frame::data(body.frame.split().freeze()))));
        }
        if body.done {
            return Poll::Ready(None);
        }
        body.poll_keep_alive(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.done && self.frame.is_empty()
    }
}

impl SseBody {
    /// The keep-alive comment once the stream has been silent for the interval.
    fn poll_keep_alive(
        &mut self,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
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
        Poll::Ready(Some(Ok(Frame::data(Bytes::from_static(
            KEEP_ALIVE_COMMENT,
        )))))
    }

    /// A chunk of `piece` (completions have no opening chunk).
    fn push(&mut self, piece: Piece<'_>) {
        if matches!(piece, Piece::Start) && self.reply.endpoint == Endpoint::Completion {
            return;
        }
        let chunks = &self.chunks;
        push_event(&mut self.frame, |frame| chunks.render(piece, frame));
    }

    fn absorb(&mut self, step: Step) {
        match step {
            Step::Output(text) => self.push(Piece::Text(text.as_str())),
            Step::End(Ok(finished)) => {
                self.push(Piece::Finish(&finished.finish_reason));
                if self.reply.include_usage {
                    self.push(Piece::Usage(finished.usage));
                }
                push_event(&mut self.frame, |frame| frame.put_slice(DONE.as_bytes()));
                self.done = true;
            }
            Step::End(Err(error)) => {
                let error = error.to_json();
                push_event(&mut self.frame, |frame| frame.put_slice(error.as_bytes()));
                self.done = true;
            }
        }
    }
}

/// Appends one SSE event whose data `write_data` writes (JSON, or `[DONE]`: never a line
/// break).
fn push_event(frame: &mut BytesMut, write_data: impl FnOnce(&mut BytesMut)) {
    frame.put_slice(b"data: ");
    write_data(frame);
    frame.put_slice(b"\n\n");
}

/// Writes `text` as a JSON string.
fn write_json_string(frame: &mut BytesMut, text: &str) {
    // Writing JSON into a `BytesMut` cannot fail.
    let _ = serde_json::to_writer(frame.writer(), text);
}

/// Writes the chunks of one stream without building a `serde_json::Value` tree per chunk
/// (which cost more than everything else the edge does per streamed token).
///
/// A chunk is an object whose keys serde_json writes in order: `choices` first, then the
/// envelope (`created`, `id`, `model`, `object`, `system_fingerprint`), the same for every
/// chunk of the stream, then `usage` when asked for. So the envelope is serialized once and
/// each chunk is its `choices`, the envelope and its `usage` — byte for byte what
/// serializing the chunk's `Value` gives (the tests compare both).
struct ChunkWriter {
    endpoint: Endpoint,
    /// `"created":…,"system_fingerprint":null`: the chunk between `"choices":[…],` and
    /// `usage` or the closing brace.
    envelope: String,
    /// Every chunk carries `usage` (`stream_options.include_usage`).
    include_usage: bool,
}

/// The fields every chunk of a stream shares, in serde_json's key order.
#[derive(Serialize)]
struct Envelope<'a> {
    created: u64,
    id: &'a str,
    model: &'a str,
    object: &'static str,
    system_fingerprint: (),
}

impl ChunkWriter {
    fn new(reply: &Reply) -> Self {
        let envelope = Envelope {
            created: reply.created,
            id: &reply.id,
            model: &reply.model,
            object: reply.chunk_object(),
            system_fingerprint: (),
        };
        // Serializing strings and numbers into a `String` cannot fail.
        let envelope = serde_json::to_string(&envelope).unwrap_or_default();
        Self {
            endpoint: reply.endpoint,
            envelope: envelope
                .get(1..envelope.len().saturating_sub(1))
                .unwrap_or_default()
                .to_owned(),
            include_usage: reply.include_usage,
        }
    }

    /// Writes the chunk of `piece`.
    fn render(&self, piece: Piece<'_>, frame: &mut BytesMut) {
        frame.put_slice(b"{\"choices\":[");
        if let Piece::Usage(usage) = piece {
            frame.put_slice(b"],");
            frame.put_slice(self.envelope.as_bytes());
            frame.put_slice(b",\"usage\":");
            let usage = usage.map_or(Value::Null, usage_json);
            // Writing JSON into a `BytesMut` cannot fail.
            let _ = serde_json::to_writer(frame.writer(), &usage);
            frame.put_slice(b"}");
            return;
        }
        frame.put_slice(b"{");
        self.render_choice(piece, frame);
        frame.put_slice(b"}],");
        frame.put_slice(self.envelope.as_bytes());
        if self.include_usage {
            frame.put_slice(b",\"usage\":null");
        }
        frame.put_slice(b"}");
    }

    /// Writes the one choice of an opening (chat only), text or closing chunk.
    fn render_choice(&self, piece: Piece<'_>, frame: &mut BytesMut) {
        let (text, finish_reason) = match piece {
            Piece::Start | Piece::Usage(_) => ("", None),
            Piece::Text(text) => (text, None),
            Piece::Finish(reason) => ("", Some(reason)),
        };
        if self.endpoint == Endpoint::Chat {
            frame.put_slice(b"\"delta\":");
            match piece {
                Piece::Start => frame.put_slice(b"{\"content\":\"\",\"role\":\"assistant\"}"),
                Piece::Text(text) => {
                    frame.put_slice(b"{\"content\":");
                    write_json_string(frame, text);
                    frame.put_slice(b"}");
                }
                Piece::Finish(_) | Piece::Usage(_) => frame.put_slice(b"{}"),
            }
            frame.put_slice(b",");
        }
        frame.put_slice(b"\"finish_reason\":");
        match finish_reason {
            Some(reason) => write_json_string(frame, reason),
            None => frame.put_slice(b"null"),
        }
        frame.put_slice(b",\"index\":0,\"logprobs\":null");
        if self.endpoint == Endpoint::Completion {
            frame.put_slice(b",\"text\":");
            write_json_string(frame, text);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use futures::FutureExt;
    use serde_json::json;
    use tokio::sync::mpsc;

    use super::*;
    use crate::adapters::lock_registry::LockRegistry;
    use crate::adapters::sinks::format::tests::{completed, output};
    use crate::app::settings::RunsConfig;
    use crate::app::{RunHandle, RunService};
    use crate::domain::{RunEvent, RunId, Usage};
    use crate::ports::event_sink::MockEventSink;
    use crate::ports::transport::MockNodeTransport;

    /// A streamed chat answer fed by the returned sender, as the run service would feed it.
    async fn streamed_chat() -> (mpsc::Sender<Arc<RunEvent>>, Body) {
        let runs = RunService::new(
            Arc::new(LockRegistry::new()),
            Arc::new(MockNodeTransport::new()),
            Arc::new(MockEventSink::new()),
            RunsConfig::default(),
            &opentelemetry::global::meter("edge-test"),
        );
        let (events, receiver) = mpsc::channel(64);
        let handle = RunHandle {
            run_id: RunId::new("r1"),
            events: receiver,
        };
        let mut run = ActiveRun::new(runs, handle, 1);
        let reply = Reply::new(Endpoint::Chat, run.id(), "echo/m1".to_owned(), false);
        events.send(output("first")).await.unwrap();
        let first = run.next().await;
        (events, respond(run, reply, first).into_body())
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

    /// A chunk built as a `serde_json::Value` tree, the plain way: what the writer must
    /// match byte for byte once serialized. `None` for the completion's opening chunk.
    fn value_chunk(reply: &Reply, piece: Piece<'_>) -> Option<Value> {
        let (text, delta, finish_reason) = match piece {
            Piece::Start => ("", json!({"role": "assistant", "content": ""}), Value::Null),
            Piece::Text(text) => (text, json!({"content": text}), Value::Null),
            Piece::Finish(reason) => ("", json!({}), Value::from(reason)),
            Piece::Usage(_) => ("", Value::Null, Value::Null),
        };
        let choices = match (reply.endpoint, piece) {
            (_, Piece::Usage(_)) => json!([]),
            (Endpoint::Completion, Piece::Start) => return None,
            (Endpoint::Chat, _) => json!([{
                "index": 0, "delta": delta, "logprobs": null, "finish_reason": finish_reason,
            }]),
            (Endpoint::Completion, _) => json!([{
                "text": text, "index": 0, "logprobs": null, "finish_reason": finish_reason,
            }]),
        };
        let mut chunk = json!({
            "id": reply.id,
            "object": reply.chunk_object(),
            "created": reply.created,
            "model": reply.model,
            "system_fingerprint": null,
            "choices": choices,
        });
        if let Piece::Usage(usage) = piece {
            chunk["usage"] = usage.map_or(Value::Null, usage_json);
        } else if reply.include_usage {
            chunk["usage"] = Value::Null;
        }
        Some(chunk)
    }

    #[test]
    fn a_written_chunk_is_the_serialized_chunk() {
        let models = ["echo/target", "echo/\"quoted\"\\ ✓", "\u{0}odd\u{0}"];
        for endpoint in [Endpoint::Chat, Endpoint::Completion] {
            for include_usage in [false, true] {
                for model in models {
                    let reply = Reply::new(
                        endpoint,
                        &RunId::new("run-\"1\""),
                        model.to_owned(),
                        include_usage,
                    );
                    let chunks = ChunkWriter::new(&reply);
                    let texts = ["hello ", "", "a\"b\\c\nd\u{1}é✓"];
                    let reasons = ["stop", "length", "we\"ird\n"];
                    let pieces = texts
                        .iter()
                        .map(|text| Piece::Text(text))
                        .chain(reasons.iter().map(|reason| Piece::Finish(reason)))
                        .chain([Piece::Start, Piece::Usage(None)])
                        .chain([Piece::Usage(Some(Usage::new(3, 4)))]);
                    for piece in pieces {
                        let Some(expected) = value_chunk(&reply, piece) else {
                            continue;
                        };
                        let mut frame = BytesMut::new();
                        chunks.render(piece, &mut frame);
                        assert_eq!(
                            std::str::from_utf8(&frame).unwrap(),
                            expected.to_string(),
                            "{endpoint:?} {piece:?} usage={include_usage}"
                        );
                    }
                }
            }
        }
    }
}
