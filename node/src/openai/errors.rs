//! Whose fault an upstream failure is: the table from an engine's answer (or its silence) to
//! the run's terminal `failed { class, status, code, message }`.
//!
//! Pure. The caller's mistakes (context too long, a bad tool schema, an unknown model: 4xx)
//! are `REQUEST` failures carrying the engine's status, code and message, so the edge answers
//! the caller with them and does not hold them against the node. A busy engine (429) is a
//! `REFUSED` run the edge places elsewhere. Everything else (unreachable, timed out, 5xx, a
//! broken or malformed stream, a key the engine refuses) is the node's: `NODE`, with a stable
//! code. Messages never carry the API key; they may carry the engine's own words.

use edge::domain::{FailureClass, RunEventKind, Usage};
use serde_json::Value;

use crate::fault::{UpstreamFault, clip};

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
            by_status(*status, code, message, &parsed)
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
                Some(status) => by_status(status, code, message, error),
                None => node(
                    "engine_error",
                    None,
                    format!("the engine reported an error: {}", clip(message)),
                ),
            }
        }
    }
}

/// The table for an engine's HTTP status, given its error `body`.
fn by_status(status: u16, code: Option<String>, message: String, body: &Value) -> RunEventKind {
    let engine_said = |what: &str| format!("{what} (HTTP {status}): {}", clip(message.clone()));
    if (400..=499).contains(&status)
        && let Some(overflow) = context_overflow(body, &message)
    {
        return RunEventKind::Failed {
            code: CONTEXT_LENGTH_EXCEEDED.to_owned(),
            message: clip(message),
            class: FailureClass::Request,
            status: Some(status),
            usage: overflow.prompt.map(|prompt| Usage::new(prompt, 0)),
            context_window: Some(overflow.window),
        };
    }
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

/// The code of a prompt longer than the model's context window (OpenAI's own).
const CONTEXT_LENGTH_EXCEEDED: &str = "context_length_exceeded";

/// A prompt over the model's context window, as the engine told it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Overflow {
    /// The prompt's tokens, when the engine said.
    prompt: Option<u32>,
    /// The window's tokens.
    window: u32,
}

/// The overflow an engine's 4xx `body` (with its `message`) reports, if it is one:
/// llama-server's `exceed_context_size_error` with `n_prompt_tokens` and `n_ctx`, or the
/// message OpenAI and vLLM write (`maximum context length is N tokens. However, you requested
/// M tokens` / `your messages resulted in M tokens`).
fn context_overflow(body: &Value, message: &str) -> Option<Overflow> {
    let holder = body.get("error").filter(|e| e.is_object()).unwrap_or(body);
    let count = |value: &Value| value.as_u64().and_then(|n| u32::try_from(n).ok());
    if holder["type"] == "exceed_context_size_error" {
        return Some(Overflow {
            prompt: count(&holder["n_prompt_tokens"]),
            window: count(&holder["n_ctx"])?,
        });
    }
    let window = number_after(message, "maximum context length is ")?;
    let prompt =
        number_after(message, "you requested ").or_else(|| number_after(message, "resulted in "));
    Some(Overflow { prompt, window })
}

/// The number that follows `prefix` in `text`.
fn number_after(text: &str, prefix: &str) -> Option<u32> {
    let rest = &text[text.find(prefix)? + prefix.len()..];
    let digits = rest
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(rest.len());
    rest[..digits].parse().ok()
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
        context_window: None,
        code: code.to_owned(),
        message,
        class,
        status,
        usage: None,
    }
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
    fn a_prompt_over_the_window_says_both_sizes() {
        let overflow = |kind: &RunEventKind| match kind {
            RunEventKind::Failed {
                code,
                class,
                usage,
                context_window,
                ..
            } => (
                code.clone(),
                *class,
                usage.map(|u| u.input_tokens),
                *context_window,
            ),
            other => panic!("expected failed, got {other:?}"),
        };
        let expected = |prompt: Option<u32>, window| {
            let code = "context_length_exceeded".to_owned();
            (code, FailureClass::Request, prompt, Some(window))
        };
        // llama.cpp's llama-server, as it answers (and streams) the error.
        let llama = json!({"error": {"code": 400, "type": "exceed_context_size_error",
            "message": "request (4339 tokens) exceeds the available context size (2048 tokens), try increasing it",
            "n_prompt_tokens": 4339, "n_ctx": 2048}});
        assert_eq!(
            overflow(&status(400, llama.clone())),
            expected(Some(4339), 2048)
        );
        let streamed = classify(&UpstreamFault::InStream(llama));
        assert_eq!(overflow(&streamed), expected(Some(4339), 2048));
        // vLLM and OpenAI write it in the message.
        let vllm = json!({"object": "error", "type": "BadRequestError", "code": 400,
            "message": "This model's maximum context length is 2048 tokens. However, you requested 4339 tokens (4331 in the messages, 8 in the completion)."});
        assert_eq!(overflow(&status(400, vllm)), expected(Some(4339), 2048));
        let openai = json!({"error": {"code": "context_length_exceeded", "type": "invalid_request_error",
            "message": "This model's maximum context length is 8192 tokens. However, your messages resulted in 9000 tokens."}});
        assert_eq!(overflow(&status(400, openai)), expected(Some(9000), 8192));
        // Any other 400 is not one.
        let other = json!({"error": {"code": 400, "message": "bad tool schema"}});
        assert_eq!(overflow(&status(400, other)).3, None);
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
        assert!(parts(&long).3.len() <= crate::fault::MAX_MESSAGE + '…'.len_utf8());
    }
}
