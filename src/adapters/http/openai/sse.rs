//! The streamed answer: Server-Sent Events in OpenAI's chunk format, ending with
//! `data: [DONE]` after success, or with one error chunk (`{"error":{...}}`) when the run
//! fails after streaming began. A stream never ends silently.
//!
//! The SSE body owns the run: when the client disconnects, hyper drops the body and the run
//! is cancelled on the node.

use std::collections::VecDeque;
use std::convert::Infallible;

use axum::http::{HeaderValue, header::HeaderName};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};

use super::reply::{Piece, Reply};
use super::request::Endpoint;
use super::run::{ActiveRun, Step};

/// The data of the stream's last event after success.
const DONE: &str = "[DONE]";

/// Answers with an SSE stream whose first step (output or a successful end) has already
/// been read.
pub(super) fn respond(run: ActiveRun, reply: Reply, first: Step) -> Response {
    let text_chunk = TextChunk::new(&reply);
    let mut stream = Stream {
        run,
        reply,
        pending: VecDeque::new(),
        done: false,
        text_chunk,
    };
    stream.push_framed(Piece::Start);
    stream.absorb(first);
    let events = futures::stream::unfold(stream, |mut stream| async move {
        loop {
            if let Some(event) = stream.pending.pop_front() {
                return Some((Ok::<_, Infallible>(event), stream));
            }
            if stream.done {
                return None;
            }
            let step = stream.run.next().await;
            stream.absorb(step);
        }
    });
    let mut response = Sse::new(events)
        .keep_alive(KeepAlive::default())
        .into_response();
    // Ask proxies such as nginx not to buffer the stream.
    response.headers_mut().insert(
        HeaderName::from_static("x-accel-buffering"),
        HeaderValue::from_static("no"),
    );
    response
}

/// The state of one streamed answer.
struct Stream {
    run: ActiveRun,
    reply: Reply,
    /// Events made from the last step, not yet sent.
    pending: VecDeque<Event>,
    /// The run has ended; send what is pending, then end.
    done: bool,
    /// The text chunks' JSON around their text (`None`: serialize every chunk whole).
    text_chunk: Option<TextChunk>,
}

impl Stream {
    fn push(&mut self, piece: Piece<'_>) {
        // `serde_json::to_string` writes the same bytes as `Value`'s `Display`, without
        // going through `fmt` for every token.
        if let Some(data) = self
            .reply
            .chunk(piece)
            .and_then(|chunk| serde_json::to_string(&chunk).ok())
        {
            self.pending.push_back(Event::default().data(data));
        }
    }

    /// The opening or the closing chunk, from the cached envelope when it has the chat
    /// shape, else serialized whole.
    fn push_framed(&mut self, piece: Piece<'_>) {
        let data = self.text_chunk.as_ref().and_then(|chunk| match piece {
            Piece::Start => chunk.render_start(),
            Piece::Finish(reason) => chunk.render_finish(reason),
            Piece::Text(_) | Piece::Usage(_) => None,
        });
        match data {
            Some(data) => self.pending.push_back(Event::default().data(data)),
            None => self.push(piece),
        }
    }

    /// A text chunk: the cached JSON around the text, with the text's JSON string between.
    fn push_text(&mut self, text: &str) {
        match self
            .text_chunk
            .as_ref()
            .and_then(|chunk| chunk.render(text))
        {
            Some(data) => self.pending.push_back(Event::default().data(data)),
            None => self.push(Piece::Text(text)),
        }
    }

    fn absorb(&mut self, step: Step) {
        match step {
            Step::Output(text) => self.push_text(&text),
            Step::End(Ok(finished)) => {
                self.push_framed(Piece::Finish(&finished.finish_reason));
                if self.reply.include_usage {
                    self.push(Piece::Usage(finished.usage));
                }
                self.pending.push_back(Event::default().data(DONE));
                self.done = true;
            }
            Step::End(Err(error)) => {
                self.pending
                    .push_back(Event::default().data(error.to_json()));
                self.done = true;
            }
        }
    }
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

    /// The chat opening chunk (the assistant role, empty content).
    fn render_start(&self) -> Option<String> {
        let chat = self.chat.as_ref()?;
        Some(format!(
            "{}{{\"content\":\"\",\"role\":\"assistant\"}},\"finish_reason\":null{}",
            chat.head, chat.tail
        ))
    }

    /// The chat closing chunk (an empty delta and the finish reason).
    fn render_finish(&self, reason: &str) -> Option<String> {
        let chat = self.chat.as_ref()?;
        let reason = serde_json::to_string(reason).ok()?;
        Some(format!(
            "{}{{}},\"finish_reason\":{reason}{}",
            chat.head, chat.tail
        ))
    }

    /// The chunk for `text`.
    fn render(&self, text: &str) -> Option<String> {
        let quoted = serde_json::to_string(text).ok()?;
        let mut chunk = String::with_capacity(self.before.len() + quoted.len() + self.after.len());
        chunk.push_str(&self.before);
        chunk.push_str(&quoted);
        chunk.push_str(&self.after);
        Some(chunk)
    }
}

#[cfg(test)]
mod text_chunk_tests {
    use super::*;
    use crate::domain::RunId;

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
                        chunk.render(text).unwrap(),
                        reply.chunk(Piece::Text(text)).unwrap().to_string()
                    );
                }
                if endpoint == Endpoint::Chat {
                    assert_eq!(
                        chunk.render_start().unwrap(),
                        reply.chunk(Piece::Start).unwrap().to_string()
                    );
                    for reason in ["stop", "length", "we\"ird\n"] {
                        assert_eq!(
                            chunk.render_finish(reason).unwrap(),
                            reply.chunk(Piece::Finish(reason)).unwrap().to_string()
                        );
                    }
                } else {
                    assert!(chunk.render_start().is_none());
                }
            }
        }
    }
}
