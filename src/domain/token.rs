//! Pre-shared node tokens and their SHA-256 digests.
//!
//! The edge never keeps a configured token in plaintext past loading: records hold a
//! [`TokenDigest`], and a presented [`Token`] is hashed before it is compared (in constant
//! time). Neither type shows its bytes through `Debug` or `Display`.

use std::fmt;

use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

/// A token as presented by a node or written in a config file. The secret never leaves
/// this type except through [`Token::digest`].
#[derive(Clone)]
pub struct Token(String);

impl Token {
    /// Wraps a presented token. An empty token is representable (a node may send one) but
    /// never matches a record.
    pub fn new(secret: impl Into<String>) -> Self {
        Self(secret.into())
    }

    /// Whether the token is empty.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The secret itself, for the one place that must send it (a node's RegisterRequest).
    pub fn expose_secret(&self) -> &str {
        &self.0
    }

    /// The SHA-256 digest that records are keyed by.
    pub fn digest(&self) -> TokenDigest {
        TokenDigest(Sha256::digest(self.0.as_bytes()).into())
    }
}

impl fmt::Debug for Token {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Token(<redacted>)")
    }
}

impl fmt::Display for Token {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("<redacted>")
    }
}

/// Why a text is not a digest ([`TokenDigest::from_hex`]). It never quotes the text.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum DigestError {
    /// The text is not 64 bytes long.
    #[error("must be 64 hexadecimal digits (a SHA-256 digest)")]
    Length {
        /// Its length, in bytes.
        len: usize,
    },
    /// A character is not a hexadecimal digit.
    #[error("must be 64 hexadecimal digits (a SHA-256 digest)")]
    NotHex {
        /// The character's position, in bytes.
        at: usize,
    },
}

/// The SHA-256 digest of a token: what node records store and compare.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct TokenDigest([u8; 32]);

impl TokenDigest {
    /// Parses a digest written as 64 hexadecimal digits (the `token_sha256` config key).
    ///
    /// # Errors
    /// [`DigestError::Length`] or [`DigestError::NotHex`] (the text is not echoed back).
    pub fn from_hex(text: &str) -> Result<Self, DigestError> {
        let text = text.trim();
        if text.len() != 64 {
            return Err(DigestError::Length { len: text.len() });
        }
        // Every character an ASCII hex digit, so each pair below is one on char boundaries.
        if let Some(at) = text.find(|c: char| !c.is_ascii_hexdigit()) {
            return Err(DigestError::NotHex { at });
        }
        let mut bytes = [0u8; 32];
        for (i, byte) in bytes.iter_mut().enumerate() {
            let at = 2 * i;
            *byte = u8::from_str_radix(&text[at..at + 2], 16)
                .map_err(|_| DigestError::NotHex { at })?;
        }
        Ok(Self(bytes))
    }

    /// The digest as 64 lowercase hexadecimal digits.
    pub fn to_hex(&self) -> String {
        self.0.iter().map(|b| format!("{b:02x}")).collect()
    }

    /// Compares two digests in constant time.
    pub fn matches(&self, other: &TokenDigest) -> bool {
        self.0.ct_eq(&other.0).into()
    }
}

impl fmt::Debug for TokenDigest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("TokenDigest(<redacted>)")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn debug_and_display_never_show_the_secret() {
        let token = Token::new("super-secret-value");
        assert!(!format!("{token:?}").contains("super"));
        assert!(!format!("{token}").contains("super"));
        assert!(!format!("{:?}", token.digest()).contains(&token.digest().to_hex()[..8]));
    }

    #[test]
    fn digest_round_trips_through_hex() {
        let digest = Token::new("abc").digest();
        assert_eq!(
            digest.to_hex(),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
        assert!(
            TokenDigest::from_hex(&digest.to_hex())
                .unwrap()
                .matches(&digest)
        );
        assert_eq!(
            TokenDigest::from_hex("xyz").unwrap_err(),
            DigestError::Length { len: 3 }
        );
        assert_eq!(
            TokenDigest::from_hex(&"g".repeat(64)).unwrap_err(),
            DigestError::NotHex { at: 0 }
        );
        // A character of more than one byte is refused, not sliced through.
        let wide = format!("{}é{}", "0".repeat(31), "0".repeat(31));
        assert_eq!(wide.len(), 64);
        assert_eq!(
            TokenDigest::from_hex(&wide).unwrap_err(),
            DigestError::NotHex { at: 31 }
        );
    }
}
