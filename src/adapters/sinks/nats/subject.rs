//! The subjects run events are published on:
//!
//! ```text
//! <prefix>.<edge id>.runs.<adapter>.<target>.<run id>
//! edge.site-a.runs.llama%2Ecpp.llama3%2E1:8b.run-5f3a9c1e-000042
//! ```
//!
//! A NATS subject is tokens separated by `.`; a token must not contain `.`, `*`, `>` or
//! whitespace. Adapters, targets and edge ids may contain `.` (targets also `*`, `>` and
//! more), so every token taken from a name is escaped: each byte outside `A–Z a–z 0–9 - _ :
//! /` is written `%XX` (two upper-case hex digits, `%` itself included). Names made only of
//! those characters are their own token, and the escaping is reversible ([`unescape`]), so
//! consumers can subscribe by wildcard (`edge.*.runs.>`, `edge.site-a.runs.echo.>`,
//! `edge.*.runs.*.*.<run id>`) and read names back. Pure string work; no I/O.

use crate::domain::{EdgeId, RunEvent};

/// Whether `byte` stands for itself inside a token.
fn is_plain(byte: u8) -> bool {
    byte.is_ascii_alphanumeric() || matches!(byte, b'-' | b'_' | b':' | b'/')
}

/// Appends `name` to `out` as one subject token (see the module docs).
pub fn push_token(name: &str, out: &mut String) {
    const HEX: &[u8; 16] = b"0123456789ABCDEF";
    for &byte in name.as_bytes() {
        if is_plain(byte) {
            out.push(char::from(byte));
        } else {
            out.push('%');
            out.push(char::from(HEX[usize::from(byte >> 4)]));
            out.push(char::from(HEX[usize::from(byte & 0xF)]));
        }
    }
}

/// `name` as one subject token (the tests' view of [`push_token`]).
#[cfg(test)]
fn escape(name: &str) -> String {
    let mut out = String::with_capacity(name.len());
    push_token(name, &mut out);
    out
}

/// The name a token stands for; `None` when it is not an escaped token. How a subscriber
/// reads a token back (docs/sinks.md); here it checks that the escaping is reversible.
#[cfg(test)]
fn unescape(token: &str) -> Option<String> {
    let mut bytes = Vec::with_capacity(token.len());
    let mut rest = token.as_bytes();
    while let Some((&first, tail)) = rest.split_first() {
        if first == b'%' {
            let hex = std::str::from_utf8(tail.get(..2)?).ok()?;
            bytes.push(u8::from_str_radix(hex, 16).ok()?);
            rest = &tail[2..];
        } else {
            is_plain(first).then_some(())?;
            bytes.push(first);
            rest = tail;
        }
    }
    String::from_utf8(bytes).ok()
}

/// A configured subject prefix that cannot be one.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "{prefix:?} is not a subject prefix: dot-separated tokens, none empty, without `*`, `>` or \
     whitespace"
)]
pub struct BadPrefix {
    /// The prefix as configured.
    pub prefix: String,
}

/// Checks a configured subject prefix: dot-separated tokens, none empty, without wildcards
/// or whitespace.
///
/// # Errors
/// [`BadPrefix`], naming it.
pub fn check_prefix(prefix: &str) -> Result<(), BadPrefix> {
    let bad = |token: &str| {
        token.is_empty()
            || token
                .chars()
                .any(|c| c == '*' || c == '>' || c.is_whitespace() || c.is_control())
    };
    if prefix.split('.').any(bad) {
        return Err(BadPrefix {
            prefix: prefix.to_owned(),
        });
    }
    Ok(())
}

/// Builds the subject of each event of one edge.
#[derive(Debug, Clone)]
pub struct Subjects {
    /// `<prefix>.<edge id>.runs.`
    head: String,
}

impl Subjects {
    /// The subjects of edge `edge` under `prefix` (already checked by [`check_prefix`]).
    pub fn new(prefix: &str, edge: &EdgeId) -> Self {
        let mut head = String::with_capacity(prefix.len() + edge.as_str().len() + 8);
        head.push_str(prefix);
        head.push('.');
        push_token(edge.as_str(), &mut head);
        head.push_str(".runs.");
        Self { head }
    }

    /// The wildcard every event of this edge matches: `<prefix>.<edge id>.runs.>`.
    pub fn wildcard(&self) -> String {
        format!("{}>", self.head)
    }

    /// The subject of `event`.
    pub fn of(&self, event: &RunEvent) -> String {
        let mut subject = String::with_capacity(self.head.len() + 64);
        subject.push_str(&self.head);
        push_token(event.adapter.as_str(), &mut subject);
        subject.push('.');
        push_token(event.target.as_str(), &mut subject);
        subject.push('.');
        push_token(event.run_id.as_str(), &mut subject);
        subject
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;
    use crate::adapters::event_format::tests::completed;
    use crate::domain::{AdapterName, Target};

    #[test]
    fn names_with_dots_and_wildcards_become_single_tokens() {
        assert_eq!(escape("llama.cpp"), "llama%2Ecpp");
        assert_eq!(escape("llama3.1:8b"), "llama3%2E1:8b");
        assert_eq!(escape("Qwen/Qwen2.5-7B"), "Qwen/Qwen2%2E5-7B");
        assert_eq!(escape("a*b>c%d"), "a%2Ab%3Ec%25d");
        assert_eq!(escape("modèle"), "mod%C3%A8le");
        assert_eq!(escape("echo"), "echo");
    }

    #[test]
    fn the_subject_carries_edge_adapter_target_and_run() {
        let mut event = (*completed()).clone();
        event.adapter = AdapterName::parse("llama.cpp").unwrap();
        event.target = Target::parse("llama3.1:8b").unwrap();
        let subjects = Subjects::new("acme.edge", &EdgeId::parse("site.a").unwrap());
        let subject = subjects.of(&event);
        assert_eq!(
            subject,
            format!(
                "acme.edge.site%2Ea.runs.llama%2Ecpp.llama3%2E1:8b.{}",
                event.run_id
            )
        );
        assert_eq!(subjects.wildcard(), "acme.edge.site%2Ea.runs.>");
    }

    #[test]
    fn prefixes_are_checked() {
        assert!(check_prefix("edge").is_ok());
        assert!(check_prefix("acme.edge").is_ok());
        for bad in ["", "edge.", ".edge", "edge.*", "edge.>", "ed ge"] {
            assert!(check_prefix(bad).is_err(), "{bad:?}");
        }
    }

    proptest! {
        #[test]
        fn escaping_is_a_valid_token_and_reversible(name in "\\PC{0,40}") {
            let token = escape(&name);
            prop_assert!(!token.contains(['.', '*', '>']));
            prop_assert!(!token.chars().any(char::is_whitespace));
            prop_assert_eq!(unescape(&token), Some(name));
        }
    }
}
