//! Whose fault an upstream failure is: the table from an engine's answer (or its silence) to
//! the run's terminal `failed { class, status, code, message }`.
//!
//! Pure. The caller's mistakes (context too long, a bad tool schema, an unknown model: 4xx)
//! are `REQUEST` failures carrying the engine's status, code and message, so the edge answers
//! the caller with them and does not hold them against the node. A busy engine (429) is a
//! `REFUSED` run the edge places elsewhere. Everything else (unreachable, timed out, 5xx, a
//! broken or malformed stream, a key the engine refuses) is the node's: `NODE`, with a stable
//! code. Messages never carry the API key; they may carry the engine's own words.

use edge::domain::{FailureClass, RunEventKind};
use serde_json::Value;

/// The longest engine message passed on, in bytes.
const MAX_MESSAGE: usize = 1_000;

/// What went wrong talking to the engine.
#[derive(Debug, Clone, PartialEq)]
pub enum UpstreamFault {
    /// No connection: refused, unresolvable, TLS failed.
    Unreachable(String),
    /// A timeout passed: which one.
    Timeout(&'static str),
    /// The engine answered with a status that is not a success, and this body.
    Status {
        /// The HTTP status.
        status: u16,
        /// The body (bounded by the caller).
        body: Vec<u8>,
    },
    /// The body broke off, or ended before the answer did.
    Broken(String),
    /// The body is not what the API promises.
    Malformed(String),
    /// An error object inside a successful stream.
    InStream(Value),
}

impl std::fmt::Display for UpstreamFault {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Unreachable(detail) => write!(f, "unreachable: {detail}"),
            Self::Timeout(what) => write!(f, "timed out ({what})"),
            Self::Status { status, body } => {
                write!(
                    f,
                    "HTTP {status}: {}",
                    clip(String::from_utf8_lossy(body).into_owned())
                )
            }
            Self::Broken(detail) => write!(f, "broken off: {detail}"),
            Self::Malformed(detail) => write!(f, "malformed: {detail}"),
            Self::InStream(error) => write!(f, "error in the stream: {error}"),
        }
    }
}

/// The terminal event for `fault`.
pub fn classify(fault: &UpstreamFault) -> RunEventKind {
    match fault {
        UpstreamFault::Unreachable(detail) => node(
            "engine_unavailable",
            None,
            format!("the engine cannot be reached: {detail}"),
        ),
        UpstreamFault::Timeout(what) => node(
            "engine_timeout",
            None,
            format!("the engine did not answer in time ({what})"),
        ),
        UpstreamFault::Status { status, body } => {
            let parsed = serde_json::from_slice(body).unwrap_or(Value::Null);
            let (code, message) = error_fields(&parsed);
            let message =
                message.unwrap_or_else(|| String::from_utf8_lossy(body).trim().to_owned());
            by_status(*status, code, message)
        }
        UpstreamFault::Broken(detail) => node(
            "engine_error",
            None,
            format!("the engine's answer broke off: {detail}"),
        ),
        UpstreamFault::Malformed(detail) => node(
            "engine_error",
            None,
            format!("the engine's answer is malformed: {detail}"),
        ),
        UpstreamFault::InStream(error) => {
            let (code, message) = error_fields(error);
            let message = message.unwrap_or_else(|| error.to_string());
            match status_in(error) {
                Some(status) => by_status(status, code, message),
                None => node(
                    "engine_error",
                    None,
                    format!("the engine reported an error: {}", clip(message)),
                ),
            }
        }
    }
}

/// The table for an engine's HTTP status.
fn by_status(status: u16, code: Option<String>, message: String) -> RunEventKind {
    let engine_said = |what: &str| format!("{what} (HTTP {status}): {}", clip(message.clone()));
    match status {
        401 | 403 => node(
            "engine_auth",
            Some(status),
            engine_said("the engine refused the node's credentials"),
        ),
        408 => node(
            "engine_timeout",
            Some(status),
            engine_said("the engine timed out"),
        ),
        429 => failed(
            FailureClass::Refused,
            "engine_busy",
            Some(status),
            engine_said("the engine is busy"),
        ),
        400..=499 => failed(
            FailureClass::Request,
            &code.unwrap_or_else(|| {
                if status == 404 {
                    "not_found".into()
                } else {
                    "invalid_request".into()
                }
            }),
            Some(status),
            clip(message),
        ),
        503 => node(
            "engine_unavailable",
            Some(status),
            engine_said("the engine is unavailable"),
        ),
        _ => node(
            "engine_error",
            Some(status),
            engine_said("the engine failed"),
        ),
    }
}

/// The code and message of an OpenAI-style error body, in the shapes engines use:
/// `{"error":{"code","type","message"}}` (OpenAI, llama.cpp, Ollama), top-level
/// `{"code","type","message"}` (vLLM), `{"error":"…","error_type":"…"}` (TGI).
fn error_fields(body: &Value) -> (Option<String>, Option<String>) {
    let text = |value: &Value| value.as_str().filter(|s| !s.is_empty()).map(str::to_owned);
    let (holder, message) = match body.get("error") {
        Some(Value::Object(_)) => (&body["error"], text(&body["error"]["message"])),
        Some(Value::String(message)) => (body, Some(message.clone())),
        _ => (body, text(&body["message"])),
    };
    let code = text(&holder["code"])
        .or_else(|| text(&holder["type"]))
        .or_else(|| text(&holder["error_type"]));
    (code, message)
}

/// A numeric HTTP status inside an in-stream error object (`"code": 400`).
fn status_in(error: &Value) -> Option<u16> {
    let inner = error
        .get("error")
        .filter(|e| e.is_object())
        .unwrap_or(error);
    inner["code"]
        .as_u64()
        .and_then(|code| u16::try_from(code).ok())
        .filter(|code| (400..=599).contains(code))
}

fn node(code: &str, status: Option<u16>, message: String) -> RunEventKind {
    failed(FailureClass::Node, code, status, message)
}

fn failed(class: FailureClass, code: &str, status: Option<u16>, message: String) -> RunEventKind {
    RunEventKind::Failed {
        code: code.to_owned(),
        message,
        class,
        status,
        usage: None,
    }
}

fn clip(mut message: String) -> String {
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

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    type Expected = (FailureClass, &'static str, Option<u16>);

    fn parts(kind: &RunEventKind) -> (FailureClass, &str, Option<u16>, &str) {
        match kind {
            RunEventKind::Failed {
                code,
                message,
                class,
                status,
                ..
            } => (*class, code, *status, message),
            other => panic!("expected failed, got {other:?}"),
        }
    }

    fn status(status: u16, body: Value) -> RunEventKind {
        classify(&UpstreamFault::Status {
            status,
            body: body.to_string().into_bytes(),
        })
    }

    fn check(kind: &RunEventKind, (class, code, status): Expected) {
        let (got_class, got_code, got_status, _) = parts(kind);
        assert_eq!(
            (got_class, got_code, got_status),
            (class, code, status),
            "{kind:?}"
        );
    }

    #[test]
    fn engine_statuses_and_their_error_bodies() {
        use FailureClass::{Node, Refused, Request};
        let openai = json!({"error": {"message": "maximum context length is 4096",
            "type": "invalid_request_error", "code": "context_length_exceeded"}});
        let llama = json!({"error": {"code": 400, "message": "bad tool schema",
            "type": "invalid_request_error"}});
        let vllm = json!({"object": "error", "message": "The model `x` does not exist.",
            "type": "NotFoundError", "code": 404});
        let tgi = json!({"error": "Input validation error", "error_type": "validation"});
        let loading = json!({"error": {"message": "Loading model"}});
        let table = [
            (400, openai, Request, "context_length_exceeded"),
            (400, llama, Request, "invalid_request_error"),
            (404, vllm, Request, "NotFoundError"),
            (422, tgi, Request, "validation"),
            (404, json!("no body"), Request, "not_found"),
            (401, json!({}), Node, "engine_auth"),
            (408, json!({}), Node, "engine_timeout"),
            (429, json!({}), Refused, "engine_busy"),
            (500, json!({}), Node, "engine_error"),
            (503, loading, Node, "engine_unavailable"),
        ];
        for (code, body, class, name) in table {
            check(&status(code, body), (class, name, Some(code)));
        }
    }

    #[test]
    fn transport_and_stream_faults() {
        use FailureClass::{Node, Request};
        let too_long = json!({"error": {"code": 400, "message": "too long"}});
        let table = [
            (
                UpstreamFault::Unreachable("connection refused".into()),
                (Node, "engine_unavailable", None),
            ),
            (
                UpstreamFault::Timeout("idle"),
                (Node, "engine_timeout", None),
            ),
            (
                UpstreamFault::Broken("eof".into()),
                (Node, "engine_error", None),
            ),
            (
                UpstreamFault::Malformed("not json".into()),
                (Node, "engine_error", None),
            ),
            (
                UpstreamFault::InStream(too_long),
                (Request, "invalid_request", Some(400)),
            ),
            (
                UpstreamFault::InStream(json!({"error": {"message": "oom"}})),
                (Node, "engine_error", None),
            ),
        ];
        for (fault, expected) in table {
            check(&classify(&fault), expected);
        }
    }

    #[test]
    fn request_failures_carry_the_engines_own_message() {
        let body = json!({"error": {"message": "maximum context length is 4096",
            "code": "context_length_exceeded"}});
        assert_eq!(
            parts(&status(400, body)).3,
            "maximum context length is 4096"
        );
        let long = status(400, json!({"error": {"message": "é".repeat(2_000)}}));
        assert!(parts(&long).3.len() <= MAX_MESSAGE + '…'.len_utf8());
    }
}
