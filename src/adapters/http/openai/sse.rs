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
use tokio::time::{Instant, Sleep};

use super::reply::{Piece, Reply};
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
    let text_chunk = TextChunk::new(&reply);
    let mut body = SseBody {
        run,
        reply,
        text_chunk,
        frame: BytesMut::with_capacity(FIRST_FRAME_CAPACITY),
        done: false,
        last_sent: Instant::now(),
        keep_alive: None,
    };
    body.push_framed(Piece::Start);
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
    /// The text chunks' JSON around their text (`None`: serialize every chunk whole).
    text_chunk: Option<TextChunk>,
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

    /// A chunk serialized whole.
    fn push(&mut self, piece: Piece<'_>) {
        if let Some(chunk) = self.reply.chunk(piece) {
            // Writing JSON into a `BytesMut` cannot fail.
            push_event(&mut self.frame, |frame| {
                let _ = serde_json::to_writer(frame.writer(), &chunk);
            });
        }
    }

    /// The opening or the closing chunk, from the cached envelope when it has the chat
    /// shape, else serialized whole.
    fn push_framed(&mut self, piece: Piece<'_>) {
        let chat = self
            .text_chunk
            .as_ref()
            .and_then(|chunk| chunk.chat.as_ref());
        match (chat, piece) {
            (Some(chat), Piece::Start) => push_event(&mut self.frame, |frame| {
                chat.render_start(frame);
            }),
            (Some(chat), Piece::Finish(reason)) => push_event(&mut self.frame, |frame| {
                chat.render_finish(reason, frame);
            }),
            _ => self.push(piece),
        }
    }

    /// A text chunk: the cached JSON around the text, with the text's JSON string between.
    fn push_text(&mut self, text: &str) {
        match &self.text_chunk {
            Some(chunk) => push_event(&mut self.frame, |frame| chunk.render(text, frame)),
            None => self.push(Piece::Text(text)),
        }
    }

    fn absorb(&mut self, step: Step) {
        match step {
            Step::Output(text) => self.push_text(text.as_str()),
            Step::End(Ok(finished)) => {
                self.push_framed(Piece::Finish(&finished.finish_reason));
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

/// A text chunk's JSON on either side of its text: every text chunk of a stream has the same
/// envelope (id, created, model, ...), so it is serialized once, with a placeholder text,
/// and each chunk is the two halves around the JSON string of its own text — byte for byte
/// what serializing the whole chunk gives, without building a `serde_json::Value` tree per
/// chunk (which cost more than everything else the edge does per streamed token).
struct TextChunk {
    before: String,
    after: String,
    /// For the chat shape, the envelope around the whole delta and finish reason, so the
    /// opening and the closing chunk come from it too.
    chat: Option<ChatFrame>,
}

/// A chat chunk is `{"choices":[{"delta":DELTA,"finish_reason":REASON,` `"index":0,...`:
/// `head` is what comes before DELTA, `tail` what follows REASON.
struct ChatFrame {
    head: String,
    tail: String,
}

/// A chat text chunk's JSON just before its text.
const CHAT_TEXT_BEFORE: &str = "{\"content\":";
/// A chat text chunk's JSON just after its text.
const CHAT_TEXT_AFTER: &str = "},\"finish_reason\":null";

/// Text no model output is: it holds NUL characters, which `\u0000` escapes in JSON.
const PLACEHOLDER: &str = "\u{0}edge-text-placeholder\u{0}";

impl TextChunk {
    /// The halves around a text chunk's text, or `None` when they cannot be told apart
    /// (then every chunk is serialized whole).
    fn new(reply: &Reply) -> Option<Self> {
        let chunk = serde_json::to_string(&reply.chunk(Piece::Text(PLACEHOLDER))?).ok()?;
        let quoted = serde_json::to_string(PLACEHOLDER).ok()?;
        let (before, after) = chunk.split_once(&quoted)?;
        if after.contains(&quoted) {
            return None;
        }
        let chat = (reply.endpoint == Endpoint::Chat)
            .then(|| {
                Some(ChatFrame {
                    head: before.strip_suffix(CHAT_TEXT_BEFORE)?.to_owned(),
                    tail: after.strip_prefix(CHAT_TEXT_AFTER)?.to_owned(),
                })
            })
            .flatten();
        Some(Self {
            before: before.to_owned(),
            after: after.to_owned(),
            chat,
        })
    }

    /// Writes the chunk for `text`.
    fn render(&self, text: &str, frame: &mut BytesMut) {
        frame.put_slice(self.before.as_bytes());
        write_json_string(frame, text);
        frame.put_slice(self.after.as_bytes());
    }
}

/// The delta of the chat opening chunk (the assistant role, empty content).
const CHAT_START_DELTA: &str = "{\"content\":\"\",\"role\":\"assistant\"},\"finish_reason\":null";

/// The delta of the chat closing chunk, up to its finish reason.
const CHAT_FINISH_DELTA: &str = "{},\"finish_reason\":";

impl ChatFrame {
    /// Writes the chat opening chunk.
    fn render_start(&self, frame: &mut BytesMut) {
        frame.put_slice(self.head.as_bytes());
        frame.put_slice(CHAT_START_DELTA.as_bytes());
        frame.put_slice(self.tail.as_bytes());
    }

    /// Writes the chat closing chunk (an empty delta and the finish reason).
    fn render_finish(&self, reason: &str, frame: &mut BytesMut) {
        frame.put_slice(self.head.as_bytes());
        frame.put_slice(CHAT_FINISH_DELTA.as_bytes());
        write_json_string(frame, reason);
        frame.put_slice(self.tail.as_bytes());
    }
}

#[cfg(test)]
mod text_chunk_tests {
    use super::*;
    use crate::domain::RunId;

    fn rendered(render: impl FnOnce(&mut BytesMut)) -> String {
        let mut frame = BytesMut::new();
        render(&mut frame);
        String::from_utf8(frame.to_vec()).unwrap()
    }

    #[test]
    fn a_rendered_text_chunk_is_the_serialized_chunk() {
        for endpoint in [Endpoint::Chat, Endpoint::Completion] {
            for include_usage in [false, true] {
                // A model named like the placeholder: the halves cannot be told apart.
                let reply = Reply::new(
                    endpoint,
                    &RunId::new("run-1"),
                    PLACEHOLDER.to_owned(),
                    include_usage,
                );
                assert!(TextChunk::new(&reply).is_none());
                let model = "echo/\"quoted\"".to_owned();
                let reply = Reply::new(endpoint, &RunId::new("run-1"), model, include_usage);
                let chunk = TextChunk::new(&reply).unwrap();
                for text in ["hello ", "", "a\"b\\c\nd\u{1}é✓"] {
                    assert_eq!(
                        rendered(|frame| chunk.render(text, frame)),
                        reply.chunk(Piece::Text(text)).unwrap().to_string()
                    );
                }
                let Some(chat) = &chunk.chat else {
                    assert_eq!(endpoint, Endpoint::Completion);
                    continue;
                };
                assert_eq!(
                    rendered(|frame| chat.render_start(frame)),
                    reply.chunk(Piece::Start).unwrap().to_string()
                );
                for reason in ["stop", "length", "we\"ird\n"] {
                    assert_eq!(
                        rendered(|frame| chat.render_finish(reason, frame)),
                        reply.chunk(Piece::Finish(reason)).unwrap().to_string()
                    );
                }
            }
        }
    }
}
