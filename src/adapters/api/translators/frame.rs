//! One API's stream written as Server-Sent Events: the [`EventWriter`] each API implements,
//! the frame it appends its events to ([`SseFrame`]) and the [`EventId`] the events of a
//! resumable stream carry. Bytes only: the HTTP body that sends the frames is `api/sse.rs`.
//!
//! A resumable stream's events carry an `id:` ([`EventId`]): the position of the run's
//! event they were rendered from, so a replay of the run's events gives every SSE event
//! the same id again and a resume can continue after any of them.

use std::fmt::{self, Write as _};

use bytes::{BufMut, Bytes, BytesMut};
use serde::Serialize;

use super::ApiError;
use super::output::Finished;
use crate::domain::{StructuredOutput, Usage};

/// The keep-alive comment.
pub(in crate::adapters::api) const KEEP_ALIVE_COMMENT: &[u8] = b":\n\n";

/// Renders one API's stream: the opening events, one or more events per run output, and the
/// closing events of a run's end, each appended to the frame being filled.
pub(in crate::adapters::api) trait EventWriter:
    Send + Unpin + 'static
{
    /// The events that open the stream (written before the first output), with the run's
    /// token counts when they are known by then (the prompt's, with the first output).
    fn open(&mut self, counts: Option<Usage>, frame: &mut SseFrame);
    /// The events of one piece of output: its text and its structured parts.
    fn output(&mut self, text: &str, structured: Option<&StructuredOutput>, frame: &mut SseFrame);
    /// The events that end the stream: after success, or the API's error event.
    fn close(&mut self, end: Result<Finished, ApiError>, frame: &mut SseFrame);
    /// What is sent when the stream has been silent for a while (an SSE comment unless the
    /// API has an event for it).
    fn keep_alive(&self) -> Bytes {
        Bytes::from_static(KEEP_ALIVE_COMMENT)
    }
}

/// The id of one SSE event of a resumable stream: the position of the run's event it was
/// rendered from, and its place among the SSE events that one made. Written `P` for the
/// first of them and `P.K` for the next; a resume continues after it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(in crate::adapters::api) struct EventId {
    position: u64,
    part: u32,
}

impl EventId {
    /// Reads an id as [`fmt::Display`] writes it; `None` when it is not one.
    pub fn parse(text: &str) -> Option<Self> {
        let (position, part) = match text.trim().split_once('.') {
            Some((position, part)) => (position, part.parse().ok()?),
            None => (text.trim(), 0),
        };
        Some(Self {
            position: position.parse().ok()?,
            part,
        })
    }
}

impl fmt::Display for EventId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.part {
            0 => write!(f, "{}", self.position),
            part => write!(f, "{}.{part}", self.position),
        }
    }
}

/// SSE events being written into one body frame, each with its [`EventId`] when the
/// stream has them.
#[derive(Debug, Default)]
pub(in crate::adapters::api) struct SseFrame {
    buf: BytesMut,
    /// The next event's id; `None` when the events carry none.
    next: Option<EventId>,
    /// A resumed stream's caller has every event up to this one: they are rendered (the
    /// writers keep state across events) but not written.
    skip_through: Option<EventId>,
}

impl SseFrame {
    /// An empty frame whose events carry no ids.
    pub fn with_capacity(capacity: usize) -> Self {
        Self {
            buf: BytesMut::with_capacity(capacity),
            ..Self::default()
        }
    }

    /// An empty frame of a resumed stream: the events up to `skip_through` are left out.
    pub fn resumed(skip_through: Option<EventId>) -> Self {
        Self {
            skip_through,
            ..Self::default()
        }
    }

    /// The events written from now on come from the run's event at `position`.
    pub fn group(&mut self, position: u64) {
        self.next = Some(EventId { position, part: 0 });
    }

    /// [`SseFrame::group`] for the events that end a run: numbered past what a resumed
    /// stream's caller has when that is later, so the end is never left out — a run taken
    /// over by a member that never had all the events its caller saw ends at a position
    /// the caller is past (found by the nemesis, seed 6601, issue 66).
    pub fn group_end(&mut self, position: u64) {
        let past = self.skip_through.map_or(0, |id| id.position + 1);
        self.group(position.max(past));
    }

    /// Whether nothing is written.
    pub fn is_empty(&self) -> bool {
        self.buf.is_empty()
    }

    /// How many bytes are written.
    pub fn len(&self) -> usize {
        self.buf.len()
    }

    /// What is written, taken out of the frame.
    pub fn split(&mut self) -> Bytes {
        self.buf.split().freeze()
    }

    /// Appends one event: its id line, then what `write` writes (its `event`/`data`
    /// lines); leaves it out again when the resumed stream's caller has it.
    fn event(&mut self, write: impl FnOnce(&mut BytesMut)) {
        let start = self.buf.len();
        let id = self.next;
        if let Some(id) = id {
            // Formatting into a `BytesMut` cannot fail, and allocates nothing new.
            let _ = writeln!(self.buf, "id: {id}");
            self.next = Some(EventId {
                part: id.part + 1,
                ..id
            });
        }
        write(&mut self.buf);
        if id.is_some() && id <= self.skip_through {
            self.buf.truncate(start);
        }
    }
}

/// Appends one unnamed SSE event whose data `write_data` writes (JSON, or `[DONE]`: never
/// a line break).
pub(in crate::adapters::api) fn push_event(
    frame: &mut SseFrame,
    write_data: impl FnOnce(&mut BytesMut),
) {
    frame.event(|buf| {
        buf.put_slice(b"data: ");
        write_data(buf);
        buf.put_slice(b"\n\n");
    });
}

/// Appends one SSE event named `name` whose data is `data` as JSON.
pub(in crate::adapters::api) fn push_named_event(
    frame: &mut SseFrame,
    name: &str,
    data: &impl Serialize,
) {
    frame.event(|buf| {
        buf.put_slice(b"event: ");
        buf.put_slice(name.as_bytes());
        buf.put_slice(b"\ndata: ");
        write_json(buf, data);
        buf.put_slice(b"\n\n");
    });
}

/// Writes `value` as JSON (serde_json escapes line breaks inside strings, so it is one line).
pub(in crate::adapters::api) fn write_json(frame: &mut BytesMut, value: &impl Serialize) {
    // Writing JSON into a `BytesMut` cannot fail.
    let _ = serde_json::to_writer(frame.writer(), value);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn event_ids_read_back_as_written_and_order_by_position_then_part() {
        for text in ["0", "7", "7.1", "12.3"] {
            assert_eq!(EventId::parse(text).unwrap().to_string(), text);
        }
        assert_eq!(EventId::parse(" 7.0 ").unwrap().to_string(), "7");
        for bad in ["", "x", "7.", ".1", "-1", "7.1.2"] {
            assert_eq!(EventId::parse(bad), None, "{bad:?}");
        }
        assert!(EventId::parse("7.2") < EventId::parse("8"));
        assert!(EventId::parse("7") < EventId::parse("7.1"));
    }

    #[test]
    fn a_resumed_streams_end_is_written_even_at_a_position_its_caller_is_past() {
        let mut frame = SseFrame::resumed(EventId::parse("7"));
        frame.group(3);
        push_event(&mut frame, |buf| buf.put_slice(b"skipped"));
        assert!(frame.is_empty(), "an event the caller has is left out");
        frame.group_end(3);
        push_event(&mut frame, |buf| buf.put_slice(b"[DONE]"));
        assert_eq!(&frame.split()[..], b"id: 8\ndata: [DONE]\n\n");
        // Past what the caller has, an end keeps its own position.
        frame.group_end(9);
        push_event(&mut frame, |buf| buf.put_slice(b"[DONE]"));
        assert_eq!(&frame.split()[..], b"id: 9\ndata: [DONE]\n\n");
    }
}
