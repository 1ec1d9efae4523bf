//! What routing needs from a request: the caller's tenant, priority and limits, and the
//! affinity key — the first of the body's `prompt_cache_key`, a session header
//! (`x-session-id`, then Claude Code's `x-claude-code-session-id` and the Codex CLI's
//! `session-id`), a session the body names (Claude Code's, in `metadata.user_id`), the
//! body's `user`, and, for chat runs with `routing.prefix_affinity` on, a hash of the
//! prompt's stable prefix (the system messages before the first user message, and that
//! message).
//!
//! Only reads: the body goes to the node untouched. Messages and Responses requests are
//! keyed by the chat body they are translated into, so the same conversation gets the same
//! key through any of the three APIs.

use std::borrow::Cow;

use axum::http::HeaderMap;
use serde::Deserialize;
use serde_json::Value;
use serde_json::value::RawValue;

use super::ApiError;
use super::auth::Caller;
use crate::domain::RunRouting;
use crate::domain::routing::{AffinityKey, BudgetClaim, KeySource, Priority};

/// The header a client sets to keep its runs on one node (a conversation, a session).
pub const SESSION_HEADER: &str = "x-session-id";

/// The session headers read for affinity, in order: the edge's own, then the ones agent
/// harnesses send on every request of a session (Claude Code, the Codex CLI).
const SESSION_HEADERS: [&str; 3] = [SESSION_HEADER, "x-claude-code-session-id", "session-id"];

/// The header a client whose key allows it sets to choose its priority class
/// (`interactive` or `batch`).
pub const PRIORITY_HEADER: &str = "x-edge-priority";

/// The values a client gave to key its runs by, as found in its request.
#[derive(Debug, Default, Clone)]
pub(super) struct ClientKeys<'a> {
    /// `prompt_cache_key`.
    pub prompt_cache_key: Option<&'a str>,
    /// A session the body names (Claude Code: the `session_id` inside `metadata.user_id`).
    pub session: Option<String>,
    /// `user` (Anthropic: `metadata.user_id`).
    pub user: Option<&'a str>,
    /// The most tokens the run may generate (`max_completion_tokens`, `max_tokens`), which
    /// it reserves of its key's token budget.
    pub max_output: Option<u64>,
}

impl<'a> ClientKeys<'a> {
    /// The keys of a JSON request object.
    pub fn of(body: &'a Value) -> Self {
        Self {
            prompt_cache_key: body.get("prompt_cache_key").and_then(Value::as_str),
            session: None,
            user: body.get("user").and_then(Value::as_str),
            max_output: None,
        }
    }
}

/// The routing of a run `caller` asks for with `headers`: affinity from `keys` or the
/// session header, else from `prefix` (called only when needed).
///
/// # Errors
/// 400 `invalid_header` when `x-edge-priority` is neither `interactive` nor `batch`.
pub(super) fn run_routing(
    caller: &Caller,
    headers: &HeaderMap,
    keys: ClientKeys<'_>,
    prefix: impl FnOnce() -> Option<AffinityKey>,
) -> Result<RunRouting, ApiError> {
    let session = SESSION_HEADERS
        .iter()
        .find_map(|name| headers.get(*name).and_then(|value| value.to_str().ok()))
        .or(keys.session.as_deref());
    let affinity = keys
        .prompt_cache_key
        .and_then(|key| AffinityKey::from_client(KeySource::PromptCacheKey, key))
        .or_else(|| session.and_then(|s| AffinityKey::from_client(KeySource::Session, s)))
        .or_else(|| {
            keys.user
                .and_then(|u| AffinityKey::from_client(KeySource::User, u))
        })
        .or_else(prefix);
    Ok(RunRouting {
        affinity,
        tenant: caller.tenant.clone(),
        priority: priority(caller, headers)?,
        limits: caller.limits,
        budget: caller.budget.map(|budget| BudgetClaim {
            budget,
            reserve: keys.max_output.unwrap_or(budget.default_reserve),
        }),
        client_stream: None,
        lora: None,
    })
}

/// The most tokens a chat body lets the run generate: `max_completion_tokens`, else
/// `max_tokens`, each read through `field`.
pub(super) fn max_output(field: impl Fn(&str) -> Option<u64>) -> Option<u64> {
    field("max_completion_tokens").or_else(|| field("max_tokens"))
}

/// The caller's class, or the header's when the caller may choose (otherwise the header is
/// ignored: the key's class stands).
fn priority(caller: &Caller, headers: &HeaderMap) -> Result<Priority, ApiError> {
    let Some(value) = headers.get(PRIORITY_HEADER) else {
        return Ok(caller.priority);
    };
    let asked = value
        .to_str()
        .ok()
        .and_then(|text| Priority::parse(text.trim()).ok())
        .ok_or_else(|| {
            ApiError::invalid_header(format!(
                "`{PRIORITY_HEADER}` must be `interactive` or `batch`."
            ))
        })?;
    Ok(if caller.allow_priority_header {
        asked
    } else {
        caller.priority
    })
}

/// The prefix key of a chat body's `messages` as the client sent it (raw JSON), read in
/// place: each message's role and content are borrowed from the body, not built into a
/// JSON tree (this runs for every chat request).
pub(super) fn prefix_of_raw(messages: Option<&RawValue>) -> Option<AffinityKey> {
    let messages: Vec<RawMessage<'_>> = serde_json::from_str(messages?.get()).ok()?;
    prefix_of(&messages)
}

/// The prefix key of a chat body's `messages` (a translated body's).
pub(super) fn prefix_of_value(chat: &Value) -> Option<AffinityKey> {
    prefix_of(chat.get("messages")?.as_array()?)
}

/// The system (and developer) messages before the first user message, and that message,
/// hashed; `None` when they are all empty. Stops reading at the first user message.
fn prefix_of<M: PromptMessage>(messages: &[M]) -> Option<AffinityKey> {
    let mut system = Vec::new();
    let mut first_user = None;
    for message in messages {
        match message.role() {
            Some("system" | "developer") => system.push(message.text()),
            Some("user") => {
                first_user = Some(message.text());
                break;
            }
            _ => {}
        }
    }
    let system: Vec<&str> = system.iter().map(AsRef::as_ref).collect();
    AffinityKey::from_prompt_prefix(&system, first_user.as_deref())
}

/// A chat message as the prefix key reads it.
trait PromptMessage {
    /// Its role, when it is a string.
    fn role(&self) -> Option<&str>;
    /// Its text: the string content, or its text parts joined by newlines (images and
    /// other parts left out).
    fn text(&self) -> Cow<'_, str>;
}

impl PromptMessage for Value {
    fn role(&self) -> Option<&str> {
        self.get("role").and_then(Value::as_str)
    }

    fn text(&self) -> Cow<'_, str> {
        match self.get("content") {
            Some(Value::String(text)) => Cow::Borrowed(text),
            Some(Value::Array(parts)) => {
                let texts = parts
                    .iter()
                    .filter_map(|p| p.get("text").and_then(Value::as_str));
                Cow::Owned(texts.collect::<Vec<_>>().join("\n"))
            }
            _ => Cow::Borrowed(""),
        }
    }
}

/// A message of a raw request body: its role and content left as the client wrote them.
#[derive(Deserialize)]
struct RawMessage<'a> {
    #[serde(borrow, default)]
    role: Option<&'a RawValue>,
    #[serde(borrow, default)]
    content: Option<&'a RawValue>,
}

/// A content part of a raw request body; only its text counts.
#[derive(Deserialize)]
struct RawPart<'a> {
    #[serde(borrow, default)]
    text: Option<Cow<'a, str>>,
}

impl PromptMessage for RawMessage<'_> {
    fn role(&self) -> Option<&str> {
        // Roles are plain words: a role written with escapes counts as none.
        self.role?.get().strip_prefix('"')?.strip_suffix('"')
    }

    fn text(&self) -> Cow<'_, str> {
        let Some(content) = self.content.map(RawValue::get) else {
            return Cow::Borrowed("");
        };
        match content.as_bytes().first() {
            Some(b'"') => serde_json::from_str::<&str>(content)
                .map(Cow::Borrowed)
                .or_else(|_| serde_json::from_str::<String>(content).map(Cow::Owned))
                .unwrap_or_default(),
            Some(b'[') => {
                let parts: Vec<Option<RawPart<'_>>> =
                    serde_json::from_str(content).unwrap_or_default();
                let texts = parts.into_iter().flatten().filter_map(|part| part.text);
                Cow::Owned(texts.collect::<Vec<_>>().join("\n"))
            }
            _ => Cow::Borrowed(""),
        }
    }
}

#[cfg(test)]
mod tests {
    use axum::http::HeaderValue;
    use serde_json::json;

    use super::*;

    fn raw(value: &Value) -> Box<RawValue> {
        RawValue::from_string(value.to_string()).unwrap()
    }

    #[test]
    fn later_turns_of_a_conversation_share_the_prefix_key() {
        let first = json!([
            {"role": "system", "content": "be brief"},
            {"role": "user", "content": "hello"},
        ]);
        let later = json!([
            {"role": "system", "content": [{"type": "text", "text": "be brief"}]},
            {"role": "user", "content": "hello"},
            {"role": "assistant", "content": "hi"},
            {"role": "user", "content": "more"},
        ]);
        let other = json!([{"role": "user", "content": "goodbye"}]);
        let key = |messages: &Value| prefix_of_raw(Some(&raw(messages)));
        assert!(key(&first).is_some());
        assert_eq!(key(&first), key(&later));
        assert_ne!(key(&first), key(&other));
        assert_eq!(
            key(&first),
            prefix_of_value(&json!({ "messages": first.clone() }))
        );
        let escaped = json!([
            {"role": "developer", "content": [{"type": "image_url"}, {"type": "text", "text": "line\none"}]},
            {"role": "user", "content": "caf\u{e9} \"quoted\""},
        ]);
        assert!(key(&escaped).is_some());
        assert_eq!(
            key(&escaped),
            prefix_of_value(&json!({ "messages": escaped.clone() }))
        );
        assert_eq!(key(&json!([{"role": "user", "content": ""}])), None);
        assert_eq!(prefix_of_raw(None), None);
        assert_eq!(key(&json!("not an array")), None);
    }

    #[test]
    fn client_keys_come_first_then_the_session_then_the_user() {
        let caller = Caller::default();
        let mut headers = HeaderMap::new();
        let keys = ClientKeys {
            prompt_cache_key: Some("pck"),
            session: None,
            user: Some("u"),
            max_output: None,
        };
        let prefix = || AffinityKey::from_client(KeySource::Prefix, "p");
        let routed = |headers: &HeaderMap, keys| {
            run_routing(&caller, headers, keys, prefix)
                .unwrap()
                .affinity
        };
        let source = |headers: &HeaderMap, keys| routed(headers, keys).map(AffinityKey::source);
        assert_eq!(
            source(&headers, keys.clone()),
            Some(KeySource::PromptCacheKey)
        );
        let no_pck = ClientKeys {
            prompt_cache_key: None,
            ..keys
        };
        assert_eq!(
            source(&HeaderMap::new(), no_pck.clone()),
            Some(KeySource::User)
        );
        let body_session = ClientKeys {
            session: Some("claude".into()),
            ..no_pck.clone()
        };
        let by_body = routed(&HeaderMap::new(), body_session.clone());
        assert_eq!(by_body.map(AffinityKey::source), Some(KeySource::Session));
        // Every session header is a session key; the same session, the same key.
        for name in ["session-id", "x-claude-code-session-id", SESSION_HEADER] {
            headers.insert(name, HeaderValue::from_static("claude"));
            assert_eq!(routed(&headers, no_pck.clone()), by_body, "{name}");
        }
        assert_eq!(
            source(&HeaderMap::new(), ClientKeys::default()),
            Some(KeySource::Prefix)
        );
    }

    #[test]
    fn the_priority_header_counts_only_when_the_key_allows_it() {
        let mut headers = HeaderMap::new();
        headers.insert(PRIORITY_HEADER, HeaderValue::from_static("batch"));
        let open = Caller::default();
        assert_eq!(priority(&open, &headers).unwrap(), Priority::Batch);
        let strict = Caller {
            allow_priority_header: false,
            ..Caller::default()
        };
        assert_eq!(priority(&strict, &headers).unwrap(), Priority::Interactive);
        headers.insert(PRIORITY_HEADER, HeaderValue::from_static("urgent"));
        assert_eq!(
            priority(&open, &headers).unwrap_err().error_code(),
            Some("invalid_header")
        );
    }
}
