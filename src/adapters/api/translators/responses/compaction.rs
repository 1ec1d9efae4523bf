//! Codex's remote compaction, served by the session's own node. A Responses request whose
//! last input item is `{"type":"compaction_trigger"}` asks for the conversation to be
//! compacted: it runs as a chat run of the conversation followed by [`SUMMARY_PROMPT`] (no
//! tools), and its answer is exactly one `compaction` item whose `encrypted_content` carries
//! the model's summary, sealed ([`seal`]). A later request sends that item back among its
//! input; it is opened ([`open`]) and becomes the summary as a user message
//! ([`SUMMARY_INTRO`] and the summary) before the node sees the prompt.
//!
//! The seal is opaque to the client and tamper-evident, not secret: `edge-compaction-v1.`,
//! the summary in URL-safe base64, `.`, and the first 16 bytes of its SHA-256 in hex. A
//! client can write any text into its own conversation anyway; the digest only makes a
//! damaged or foreign item a clear 400 instead of a garbled prompt. Any edge opens any
//! edge's items (nothing is kept), after restarts too.

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

use crate::adapters::api::translators::ApiError;

/// The input item that asks for a compaction (the last of the request's input).
pub(in crate::adapters::api) const TRIGGER: &str = "compaction_trigger";

/// What the node is asked after the conversation, as the last user message of the run.
pub(in crate::adapters::api) const SUMMARY_PROMPT: &str = "Summarize this conversation so that \
it can continue from your summary alone, without the messages above. Keep: the user's goals, \
requests and constraints; the decisions made and why; every file, function and command that \
matters, with paths and exact names; what was done and its results, errors included; and \
what remains to do next. Write only the summary.";

/// What precedes the summary where a `compaction` item stood in a later request.
pub(in crate::adapters::api) const SUMMARY_INTRO: &str =
    "Summary of the conversation so far, written for its continuation:\n\n";

const SEAL_PREFIX: &str = "edge-compaction-v1.";

/// Bytes of the summary's SHA-256 kept in the seal.
const DIGEST_BYTES: usize = 16;

/// Whether `item` is an input item of compaction `kind` (Codex also names it
/// `compaction_summary`).
pub(in crate::adapters::api) fn is_compaction(kind: &str) -> bool {
    kind == "compaction" || kind == "compaction_summary"
}

/// `summary` as a `compaction` item's `encrypted_content`.
pub(in crate::adapters::api) fn seal(summary: &str) -> String {
    format!(
        "{SEAL_PREFIX}{}.{}",
        URL_SAFE_NO_PAD.encode(summary),
        digest_hex(summary)
    )
}

/// The summary a `compaction` item's `encrypted_content` carries.
///
/// # Errors
/// A 400 when it is not one this server sealed, or was changed.
pub(in crate::adapters::api) fn open(encrypted: &str) -> Result<String, ApiError> {
    let refused = || {
        ApiError::invalid(
            "input",
            "A `compaction` item's `encrypted_content` was not made by this server, or was changed: send the items it answered with unchanged.",
        )
    };
    let sealed = encrypted.strip_prefix(SEAL_PREFIX).ok_or_else(refused)?;
    let (body, digest) = sealed.split_once('.').ok_or_else(refused)?;
    let bytes = URL_SAFE_NO_PAD.decode(body).map_err(|_| refused())?;
    let summary = String::from_utf8(bytes).map_err(|_| refused())?;
    if digest_hex(&summary) != digest {
        return Err(refused());
    }
    Ok(summary)
}

/// A `compaction` input item as the chat message it stands for: the summary it carries.
///
/// # Errors
/// A 400 when it has no `encrypted_content`, or one [`open`] refuses.
pub(in crate::adapters::api) fn expand(item: &Value) -> Result<Value, ApiError> {
    let Some(encrypted) = item.get("encrypted_content").and_then(Value::as_str) else {
        return Err(ApiError::invalid(
            "input",
            "A `compaction` item needs its `encrypted_content`.",
        ));
    };
    let summary = open(encrypted)?;
    Ok(json!({ "role": "user", "content": format!("{SUMMARY_INTRO}{summary}") }))
}

/// The chat message that asks for the summary, after the conversation.
pub(in crate::adapters::api) fn summary_request() -> Value {
    json!({ "role": "user", "content": SUMMARY_PROMPT })
}

fn digest_hex(summary: &str) -> String {
    Sha256::digest(summary.as_bytes())[..DIGEST_BYTES]
        .iter()
        .map(|byte| format!("{byte:02x}"))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sealed_summary_opens_to_itself_and_a_changed_one_does_not() {
        for summary in [
            "",
            "goals: ship it\nfiles: src/main.rs",
            "ünïcödé ✓ \"quoted\"",
        ] {
            let sealed = seal(summary);
            assert!(sealed.starts_with(SEAL_PREFIX), "{sealed}");
            assert_eq!(open(&sealed).as_deref(), Ok(summary));
        }
        let sealed = seal("the real summary");
        let forged = sealed.replacen(
            &URL_SAFE_NO_PAD.encode("the real summary"),
            &URL_SAFE_NO_PAD.encode("another summary"),
            1,
        );
        for bad in [
            forged.as_str(),
            "",
            "opaque-blob-from-elsewhere",
            "edge-compaction-v1.!!!.00",
            &sealed[..sealed.len() - 1],
        ] {
            let error = open(bad).unwrap_err();
            assert_eq!(error.error_code(), Some("invalid_value"), "{bad}");
        }
    }

    #[test]
    fn an_item_expands_into_the_summary_as_a_user_message() {
        let item = json!({"type": "compaction", "encrypted_content": seal("we fixed the parser")});
        let message = expand(&item).unwrap();
        assert_eq!(message["role"], "user");
        assert_eq!(
            message["content"],
            format!("{SUMMARY_INTRO}we fixed the parser")
        );
        assert!(expand(&json!({"type": "compaction"})).is_err());
    }
}
