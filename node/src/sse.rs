//! Server-sent events decoded from the byte chunks an HTTP body arrives in, for the
//! upstream engines' streaming answers.
//!
//! Pure: bytes in, each event's `data` out. A chunk may end anywhere (inside a line, between
//! `\r` and `\n`, inside a UTF-8 character); the decoder keeps the partial line for the next
//! chunk. It knows nothing of OpenAI's JSON or of `[DONE]`, and it never allocates without
//! bound: a line longer than [`MAX_LINE_BYTES`] is an error.

/// The longest line (and the largest event) accepted from an upstream.
pub const MAX_LINE_BYTES: usize = 8 * 1024 * 1024;

/// Why a stream could not be decoded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SseError {
    /// A line or an event grew past [`MAX_LINE_BYTES`].
    #[error("an event line is longer than {MAX_LINE_BYTES} bytes")]
    LineTooLong,
}

/// Turns body chunks into the `data` of each complete event.
#[derive(Debug, Default)]
pub struct SseDecoder {
    line: Vec<u8>,
    data: String,
    has_data: bool,
    after_cr: bool,
}

impl SseDecoder {
    /// A decoder at the start of a stream.
    pub fn new() -> Self {
        Self::default()
    }

    /// Feeds one chunk and appends the data of every event it completes to `events`.
    ///
    /// # Errors
    /// [`SseError::LineTooLong`] when a line or an event exceeds the limit.
    pub fn feed(&mut self, chunk: &[u8], events: &mut Vec<String>) -> Result<(), SseError> {
        for &byte in chunk {
            let after_cr = std::mem::replace(&mut self.after_cr, byte == b'\r');
            match byte {
                b'\n' if after_cr => {}
                b'\n' | b'\r' => self.end_line(events)?,
                _ => {
                    if self.line.len() >= MAX_LINE_BYTES {
                        return Err(SseError::LineTooLong);
                    }
                    self.line.push(byte);
                }
            }
        }
        Ok(())
    }

    /// The data of an event the stream ended without closing (no blank line after it).
    pub fn finish(&mut self, events: &mut Vec<String>) -> Result<(), SseError> {
        if !self.line.is_empty() {
            self.end_line(events)?;
        }
        self.dispatch(events);
        Ok(())
    }

    fn end_line(&mut self, events: &mut Vec<String>) -> Result<(), SseError> {
        let line = std::mem::take(&mut self.line);
        if line.is_empty() {
            self.dispatch(events);
            return Ok(());
        }
        let text = String::from_utf8_lossy(&line);
        let (field, value) = match text.split_once(':') {
            Some((field, value)) => (field, value.strip_prefix(' ').unwrap_or(value)),
            None => (text.as_ref(), ""),
        };
        // Comments (`: keep-alive`) have an empty field; `event`, `id`, `retry` are unused.
        if field == "data" {
            if self.data.len() + value.len() >= MAX_LINE_BYTES {
                return Err(SseError::LineTooLong);
            }
            if self.has_data {
                self.data.push('\n');
            }
            self.data.push_str(value);
            self.has_data = true;
        }
        self.line = line;
        self.line.clear();
        Ok(())
    }

    fn dispatch(&mut self, events: &mut Vec<String>) {
        if std::mem::take(&mut self.has_data) {
            events.push(std::mem::take(&mut self.data));
        }
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn decode_in_pieces(stream: &[u8], cuts: &[usize]) -> Vec<String> {
        let mut decoder = SseDecoder::new();
        let mut events = Vec::new();
        let mut start = 0;
        for &cut in cuts.iter().chain(std::iter::once(&stream.len())) {
            let cut = cut.clamp(start, stream.len());
            decoder
                .feed(&stream[start..cut], &mut events)
                .expect("decodes");
            start = cut;
        }
        decoder.finish(&mut events).expect("finishes");
        events
    }

    const STREAM: &str = ": keep-alive\r\n\r\ndata: {\"a\":1}\r\n\r\nevent: x\ndata:{\"b\":\"é\"}\n\ndata: one\ndata: two\n\n\rdata: [DONE]\n\n";

    #[test]
    fn decodes_events_comments_and_multi_line_data() {
        assert_eq!(
            decode_in_pieces(STREAM.as_bytes(), &[]),
            ["{\"a\":1}", "{\"b\":\"é\"}", "one\ntwo", "[DONE]"]
        );
    }

    #[test]
    fn an_unterminated_last_event_is_still_delivered() {
        assert_eq!(decode_in_pieces(b"data: tail", &[]), ["tail"]);
    }

    #[test]
    fn an_overlong_line_is_an_error() {
        let mut decoder = SseDecoder::new();
        let long = vec![b'x'; MAX_LINE_BYTES + 1];
        assert_eq!(
            decoder.feed(&long, &mut Vec::new()),
            Err(SseError::LineTooLong)
        );
    }

    proptest! {
        /// However the body is cut into chunks (inside `\r\n`, inside a UTF-8 character),
        /// the events are the same.
        #[test]
        fn chunk_boundaries_do_not_matter(mut cuts in proptest::collection::vec(0usize..120, 0..12)) {
            cuts.sort_unstable();
            let whole = decode_in_pieces(STREAM.as_bytes(), &[]);
            prop_assert_eq!(decode_in_pieces(STREAM.as_bytes(), &cuts), whole);
        }
    }
}
