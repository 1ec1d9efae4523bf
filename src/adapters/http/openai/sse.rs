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
use super::run::{ActiveRun, Step};

/// The data of the stream's last event after success.
const DONE: &str = "[DONE]";

/// Answers with an SSE stream whose first step (output or a successful end) has already
/// been read.
pub(super) fn respond(run: ActiveRun, reply: Reply, first: Step) -> Response {
    let mut stream = Stream {
        run,
        reply,
        pending: VecDeque::new(),
        done: false,
    };
    stream.push(Piece::Start);
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
}

impl Stream {
    fn push(&mut self, piece: Piece<'_>) {
        if let Some(chunk) = self.reply.chunk(piece) {
            self.pending
                .push_back(Event::default().data(chunk.to_string()));
        }
    }

    fn absorb(&mut self, step: Step) {
        match step {
            Step::Output(text) => self.push(Piece::Text(&text)),
            Step::End(Ok(finished)) => {
                self.push(Piece::Finish(&finished.finish_reason));
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
