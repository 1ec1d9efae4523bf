//! The echo of a continued chat's prefix: llama.cpp's `llama-server` streams the trailing
//! assistant message it continues back at the start of its answer ("Once" + " upon" arrives
//! as "Once upon"), while vLLM and SGLang stream only what they add. The caller already has
//! that text, so it is dropped when — and only when — the stream begins with it.
//!
//! Pure: text in, text to relay out.

/// Drops the continued text from the start of a stream that echoes it; passes a stream
/// that does not through unchanged.
#[derive(Debug)]
pub struct EchoFilter {
    /// The text the stream may begin with.
    prefix: String,
    /// Text held while it still matches the start of `prefix`.
    held: String,
    /// The start of the stream has been decided: everything passes now.
    done: bool,
}

impl EchoFilter {
    /// A filter for a stream that may begin with `prefix`.
    pub fn new(prefix: &str) -> Self {
        Self {
            prefix: prefix.to_owned(),
            held: String::new(),
            done: prefix.is_empty(),
        }
    }

    /// The part of `text`, the stream's next piece, to relay now (possibly empty).
    pub fn filter(&mut self, text: &str) -> String {
        if self.done {
            return text.to_owned();
        }
        self.held.push_str(text);
        if self.held.len() >= self.prefix.len() {
            self.done = true;
            let held = std::mem::take(&mut self.held);
            return match held.strip_prefix(self.prefix.as_str()) {
                Some(rest) => rest.to_owned(),
                None => held,
            };
        }
        if self.prefix.starts_with(self.held.as_str()) {
            return String::new();
        }
        self.done = true;
        std::mem::take(&mut self.held)
    }

    /// What is still held when the stream ends (it ended inside a partial match).
    pub fn finish(&mut self) -> String {
        self.done = true;
        std::mem::take(&mut self.held)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(prefix: &str, pieces: &[&str]) -> String {
        let mut filter = EchoFilter::new(prefix);
        let mut out: String = pieces.iter().map(|p| filter.filter(p)).collect();
        out.push_str(&filter.finish());
        out
    }

    #[test]
    fn an_echoed_prefix_is_dropped_however_it_is_split() {
        assert_eq!(run("Once", &["Once upon", " a time"]), " upon a time");
        assert_eq!(run("Once", &["On", "ce", " upon"]), " upon");
        assert_eq!(run("Once", &["Once"]), "");
    }

    #[test]
    fn a_stream_that_does_not_echo_passes_unchanged() {
        assert_eq!(run("Once", &[" upon", " a time"]), " upon a time");
        assert_eq!(run("Once", &["On", " the"]), "On the");
        assert_eq!(run("Once", &["On"]), "On");
        assert_eq!(run("", &["x"]), "x");
    }
}
