//! Validated names: the edge's id, node ids, aliases, adapter names and targets.
//!
//! Each is a newtype with a private field, so a value that exists has passed validation.

use std::fmt;
use std::sync::Arc;

/// Why a string is not a valid name.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NameError {
    /// The string is empty.
    #[error("{kind} must not be empty")]
    Empty {
        /// What was being named (`node id`, `alias`, ...).
        kind: &'static str,
    },
    /// The string is longer than allowed.
    #[error("{kind} {value:?} is longer than {max} bytes")]
    TooLong {
        /// What was being named.
        kind: &'static str,
        /// The offending value.
        value: String,
        /// The limit.
        max: usize,
    },
    /// The string holds a character the name may not contain.
    #[error("{kind} {value:?} contains {found:?}; allowed: {allowed}")]
    BadCharacter {
        /// What was being named.
        kind: &'static str,
        /// The offending value.
        value: String,
        /// The first offending character.
        found: char,
        /// A description of the allowed characters.
        allowed: &'static str,
    },
}

/// Characters allowed in ids, aliases and adapter names.
fn is_identifier_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.')
}

/// Characters allowed in targets: anything printable but whitespace (model names carry
/// `:` and `/`, as in `llama3.1:8b` or `Qwen/Qwen2.5-7B`).
fn is_target_char(c: char) -> bool {
    !c.is_whitespace() && !c.is_control()
}

/// Checks `value` as a name of `kind`: 1 to `max` bytes, each character `is_allowed`
/// (`allowed` says which, for the error).
///
/// # Errors
/// [`NameError::Empty`], [`NameError::TooLong`] or [`NameError::BadCharacter`].
pub(in crate::domain) fn validate(
    kind: &'static str,
    value: &str,
    max: usize,
    allowed: &'static str,
    is_allowed: fn(char) -> bool,
) -> Result<(), NameError> {
    if value.is_empty() {
        return Err(NameError::Empty { kind });
    }
    if value.len() > max {
        return Err(NameError::TooLong {
            kind,
            value: value.to_owned(),
            max,
        });
    }
    if let Some(found) = value.chars().find(|c| !is_allowed(*c)) {
        return Err(NameError::BadCharacter {
            kind,
            value: value.to_owned(),
            found,
            allowed,
        });
    }
    Ok(())
}

macro_rules! validated_name {
    ($(#[$doc:meta])* $name:ident, $kind:literal, $max:expr, $allowed:expr, $is_allowed:path) => {
        $(#[$doc])*
        #[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub struct $name(Arc<str>);

        impl $name {
            /// Validates `value` and wraps it.
            ///
            /// # Errors
            /// [`NameError`] when `value` is empty, too long, or holds a disallowed character.
            pub fn parse(value: &str) -> Result<Self, NameError> {
                validate($kind, value, $max, $allowed, $is_allowed)?;
                Ok(Self(Arc::from(value)))
            }

            /// The name as a string slice.
            pub fn as_str(&self) -> &str {
                &self.0
            }

            /// The name as a shared string, without copying it (for labels that keep it).
            pub fn to_shared(&self) -> Arc<str> {
                Arc::clone(&self.0)
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.pad(&self.0)
            }
        }

        impl fmt::Debug for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, "{:?}", &*self.0)
            }
        }

        impl AsRef<str> for $name {
            fn as_ref(&self) -> &str {
                &self.0
            }
        }
    };
}

const IDENTIFIER_CHARS: &str = "ASCII letters, digits, '-', '_' and '.'";

validated_name!(
    /// The id that names this edge wherever it is seen from outside (`[edge] id`: NATS
    /// subjects, trace resources, a future control plane): `site-a`, `rack-12`.
    EdgeId, "edge id", 64, IDENTIFIER_CHARS, is_identifier_char
);
validated_name!(
    /// The stable id of a pre-registered node (`node-a`).
    NodeId, "node id", 64, IDENTIFIER_CHARS, is_identifier_char
);
validated_name!(
    /// A node's second, operator-friendly name (`gpu-a`); unique across ids and aliases.
    Alias, "alias", 64, IDENTIFIER_CHARS, is_identifier_char
);
validated_name!(
    /// The name of an adapter a node runs (`llama.cpp`, `ollama`, `echo`).
    AdapterName, "adapter name", 64, IDENTIFIER_CHARS, is_identifier_char
);
validated_name!(
    /// What an adapter runs: a model or profile name (`llama3.1:8b`).
    Target, "target", 256, "printable characters except whitespace", is_target_char
);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_typical_names() {
        assert_eq!(NodeId::parse("node-a.1_x").unwrap().as_str(), "node-a.1_x");
        assert_eq!(
            Target::parse("Qwen/Qwen2.5-7B:q4").unwrap().to_string(),
            "Qwen/Qwen2.5-7B:q4"
        );
    }

    #[test]
    fn rejects_empty_long_and_bad_characters() {
        assert_eq!(NodeId::parse(""), Err(NameError::Empty { kind: "node id" }));
        assert!(matches!(
            Alias::parse(&"a".repeat(65)),
            Err(NameError::TooLong { max: 64, .. })
        ));
        assert!(matches!(
            AdapterName::parse("llama cpp"),
            Err(NameError::BadCharacter { found: ' ', .. })
        ));
        assert!(matches!(
            Target::parse("a\tb"),
            Err(NameError::BadCharacter { found: '\t', .. })
        ));
    }
}
