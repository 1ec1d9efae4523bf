//! What goes wrong talking to an engine, at the HTTP level: [`UpstreamFault`], which the
//! engine's client ([`crate::upstream`]) returns, the probers log, and the `openai`
//! adapter's classification table (`openai::errors`) turns into a run's terminal event.
//!
//! Vocabulary only: nothing here sends a request or decides whose fault a failure is. A
//! fault's text never carries the API key; it may carry the engine's own words, clipped to
//! [`MAX_MESSAGE`].

use serde_json::Value;

/// The longest engine message passed on, in bytes.
pub const MAX_MESSAGE: usize = 1_000;

/// What went wrong talking to the engine.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum UpstreamFault {
    /// No connection: refused, unresolvable, TLS failed.
    #[error("unreachable: {0}")]
    Unreachable(String),
    /// A timeout passed: which one.
    #[error("timed out ({0})")]
    Timeout(&'static str),
    /// The engine answered with a status that is not a success, and this body.
    #[error("HTTP {status}: {}", clip(String::from_utf8_lossy(body).into_owned()))]
    Status {
        /// The HTTP status.
        status: u16,
        /// The body (bounded by the caller).
        body: Vec<u8>,
    },
    /// The body broke off, or ended before the answer did.
    #[error("broken off: {0}")]
    Broken(String),
    /// The body is not what the API promises.
    #[error("malformed: {0}")]
    Malformed(String),
    /// An error object inside a successful stream.
    #[error("error in the stream: {0}")]
    InStream(Value),
}

/// `message` cut to at most [`MAX_MESSAGE`] bytes (on a character boundary), with `…`
/// marking a cut.
pub fn clip(mut message: String) -> String {
    if message.len() > MAX_MESSAGE {
        let mut end = MAX_MESSAGE;
        while !message.is_char_boundary(end) {
            end -= 1;
        }
        message.truncate(end);
        message.push('…');
    }
    message
}
