//! Turns an OpenAI request into a run: checks the body, maps `model` to `adapter + target`,
//! and builds the [`RunSpec`] whose input is the body without `model` and `stream`.
//!
//! Everything the node needs stays in the body untouched (`messages`, `max_tokens`,
//! `max_completion_tokens`, `temperature`, ...): the edge does not interpret it.

use std::collections::BTreeMap;
use std::time::Duration;

use axum::extract::rejection::BytesRejection;
use axum::http::{HeaderMap, StatusCode};
use bytes::Bytes;
use serde_json::Value;
use serde_json::error::Category;
use serde_json::value::RawValue;

use super::Api;
use super::ApiError;
use super::auth::Caller;
use super::routing::{ClientKeys, max_output, prefix_of_raw, run_routing};
use super::translators::openai::Endpoint;
use crate::domain::{NodeSelector, Operation, RunRouting, RunSpec};

/// The header a client sets to ask for a deadline, in milliseconds.
pub const DEADLINE_HEADER: &str = "x-edge-deadline-ms";

/// The header a client sets (`true`) to have its streamed answer resumable: its run goes on
/// for `runs.client_resume_grace_ms` when the connection drops, for `GET
/// /v1/runs/{run_id}/stream`; `false` turns off a key's `resumable = true`.
pub const RESUMABLE_HEADER: &str = "x-edge-resumable";

/// What a request's body is read as by the node.
pub const CONTENT_TYPE: &str = "application/json";

/// A checked request, ready to start.
#[derive(Debug)]
pub(super) struct ApiRequest {
    /// The model id as the client sent it (answers name it back).
    pub model: String,
    /// Whether the answer is an SSE stream.
    pub stream: bool,
    /// Whether a streamed answer ends with a usage chunk.
    pub include_usage: bool,
    /// Whether a streamed answer may be resumed ([`resumable`]).
    pub resumable: bool,
    /// The run.
    pub spec: RunSpec,
}

/// Checks a request to `endpoint` from `caller`.
///
/// # Errors
/// 413 for a body over the limit, 400 for a body that is not a JSON object, a missing or
/// mistyped field, or a bad deadline or priority header, and 404 for a model that is
/// neither an alias nor `ADAPTER/TARGET`.
pub(super) fn prepare(
    api: &Api,
    endpoint: Endpoint,
    caller: &Caller,
    headers: &HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<ApiRequest, ApiError> {
    let body = read_body(api, body)?;
    let mut fields = parse_object(&body)?;
    let model = take_model(&mut fields)?;
    let stream = take_stream(&mut fields)?;
    let include_usage = include_usage(&fields)?;
    check_required(endpoint, &fields)?;
    if let Some(n) = fields.get("n").map(|n| n.get())
        && !(n == "null" || n == "1")
    {
        return Err(ApiError::invalid(
            "n",
            "Only `n: 1` is supported: a run produces one choice.",
        ));
    }
    let deadline = deadline(api, headers)?;
    let resumable = resumable(caller, headers)?;
    let routing = fields_routing(api, endpoint, caller, headers, &fields)?;
    let input = encode_object(&fields);
    let spec = run_spec(api, &model, input, endpoint.operation(), deadline, routing)?;
    Ok(ApiRequest {
        model,
        stream,
        include_usage,
        resumable,
        spec,
    })
}

/// The body, or 413 when it is over the limit (400 when it could not be read).
pub(super) fn read_body(api: &Api, body: Result<Bytes, BytesRejection>) -> Result<Bytes, ApiError> {
    body.map_err(|rejection| {
        if rejection.status() == StatusCode::PAYLOAD_TOO_LARGE {
            ApiError::body_too_large(api.config().max_body_bytes)
        } else {
            ApiError::malformed_json(&rejection.body_text())
        }
    })
}

/// Takes `model` out of `fields`: a non-empty string.
pub(super) fn take_model(fields: &mut Fields<'_>) -> Result<String, ApiError> {
    match field_value(fields, "model") {
        Some(Value::String(model)) if !model.is_empty() => Ok(model),
        None | Some(Value::Null) => Err(ApiError::missing("model")),
        Some(_) => Err(ApiError::invalid(
            "model",
            "`model` must be a non-empty string.",
        )),
    }
}

/// The routing of a chat or completions request: the client's keys from its fields, and
/// for chat the prompt prefix when `routing.prefix_affinity` is on.
fn fields_routing(
    api: &Api,
    endpoint: Endpoint,
    caller: &Caller,
    headers: &HeaderMap,
    fields: &Fields<'_>,
) -> Result<RunRouting, ApiError> {
    let text = |name| {
        fields
            .get(name)
            .and_then(|raw| serde_json::from_str::<String>(raw.get()).ok())
    };
    let (prompt_cache_key, user) = (text("prompt_cache_key"), text("user"));
    let keys = ClientKeys {
        prompt_cache_key: prompt_cache_key.as_deref(),
        session: None,
        user: user.as_deref(),
        max_output: max_output(|name| {
            fields
                .get(name)
                .and_then(|raw| serde_json::from_str::<u64>(raw.get()).ok())
        }),
    };
    let prefix = api.prefix_affinity() && endpoint == Endpoint::Chat;
    run_routing(caller, headers, keys, || {
        prefix
            .then(|| prefix_of_raw(fields.get("messages").copied()))
            .flatten()
    })
}

/// The run of `input` for `model`: its alias or `ADAPTER/TARGET`, or 404.
pub(super) fn run_spec(
    api: &Api,
    model: &str,
    input: Bytes,
    operation: Operation,
    deadline: Option<Duration>,
    routing: RunRouting,
) -> Result<RunSpec, ApiError> {
    let route = api
        .models()
        .resolve(model)
        .map_err(|_| ApiError::model_not_found(model))?;
    Ok(RunSpec {
        selector: NodeSelector {
            adapter: route.adapter,
            target: route.target,
            pin: None,
        },
        input,
        content_type: CONTENT_TYPE.to_owned(),
        params: BTreeMap::new(),
        deadline,
        operation,
        routing,
    })
}

/// Takes `stream` out of `fields`: a boolean, false when absent.
fn take_stream(fields: &mut Fields<'_>) -> Result<bool, ApiError> {
    match field_value(fields, "stream") {
        None | Some(Value::Null) => Ok(false),
        Some(Value::Bool(stream)) => Ok(stream),
        Some(_) => Err(ApiError::invalid("stream", "`stream` must be a boolean.")),
    }
}

/// A body's top-level fields, each as the JSON text it came as: the edge reads the few it
/// needs and passes the rest on without building a tree of them.
pub(super) type Fields<'a> = BTreeMap<String, &'a RawValue>;

/// The body's fields; 400 unless it is a JSON object.
pub(super) fn parse_object(body: &[u8]) -> Result<Fields<'_>, ApiError> {
    serde_json::from_slice(body).map_err(|error| match error.classify() {
        Category::Data => ApiError::malformed_json("the body must be a JSON object"),
        Category::Io | Category::Syntax | Category::Eof => {
            ApiError::malformed_json(&error.to_string())
        }
    })
}

/// Takes field `name` out of `fields`, as a value.
pub(super) fn field_value(fields: &mut Fields<'_>, name: &str) -> Option<Value> {
    // The text is JSON already checked by the parser, so it parses again.
    fields
        .remove(name)
        .and_then(|raw| serde_json::from_str(raw.get()).ok())
}

/// The fields as one JSON object, in key order (as `serde_json` writes an object).
pub(super) fn encode_object(fields: &Fields<'_>) -> Bytes {
    let size = fields
        .iter()
        .map(|(name, value)| name.len() + value.get().len() + 4)
        .sum::<usize>();
    let mut out = Vec::with_capacity(size + 2);
    out.push(b'{');
    for (i, (name, value)) in fields.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        // Writing a string into a `Vec` cannot fail.
        let _ = serde_json::to_writer(&mut out, name);
        out.push(b':');
        out.extend_from_slice(value.get().as_bytes());
    }
    out.push(b'}');
    Bytes::from(out)
}

/// `stream_options.include_usage`, false when absent.
fn include_usage(fields: &Fields<'_>) -> Result<bool, ApiError> {
    let Some(options) = fields.get("stream_options") else {
        return Ok(false);
    };
    let options = match serde_json::from_str::<Value>(options.get()) {
        Ok(Value::Null) => return Ok(false),
        Ok(Value::Object(options)) => options,
        _ => {
            return Err(ApiError::invalid(
                "stream_options",
                "`stream_options` must be an object.",
            ));
        }
    };
    match options.get("include_usage") {
        None | Some(Value::Null) => Ok(false),
        Some(Value::Bool(include)) => Ok(*include),
        Some(_) => Err(ApiError::invalid(
            "stream_options",
            "`stream_options.include_usage` must be a boolean.",
        )),
    }
}

/// `messages` (a non-empty array) for chat, `prompt` (a string or an array) for completions.
fn check_required(endpoint: Endpoint, fields: &Fields<'_>) -> Result<(), ApiError> {
    let name = endpoint.required();
    let value = match fields.get(name).map(|value| value.get()) {
        None | Some("null") => return Err(ApiError::missing(name)),
        Some(value) => value,
    };
    let valid = match endpoint {
        // An array with something other than whitespace between its brackets.
        Endpoint::Chat => value
            .strip_prefix('[')
            .is_some_and(|inside| !inside.trim_start().starts_with(']')),
        Endpoint::Completion => value.starts_with('"') || value.starts_with('['),
    };
    if valid {
        Ok(())
    } else {
        Err(match endpoint {
            Endpoint::Chat => ApiError::invalid(name, "`messages` must be a non-empty array."),
            Endpoint::Completion => {
                ApiError::invalid(name, "`prompt` must be a string or an array.")
            }
        })
    }
}

/// The run's deadline: the header's (capped by `api.max_deadline_ms`), else the default.
pub(super) fn deadline(api: &Api, headers: &HeaderMap) -> Result<Option<Duration>, ApiError> {
    let Some(value) = headers.get(DEADLINE_HEADER) else {
        return Ok(api.config().default_deadline());
    };
    let millis = value
        .to_str()
        .ok()
        .and_then(|text| text.trim().parse::<u64>().ok())
        .filter(|millis| *millis > 0)
        .ok_or_else(|| {
            ApiError::invalid_header(format!(
                "`{DEADLINE_HEADER}` must be a positive number of milliseconds."
            ))
        })?;
    Ok(Some(
        Duration::from_millis(millis).min(api.config().max_deadline()),
    ))
}

/// Whether the caller asked for a resumable stream: `x-edge-resumable`, else its key's
/// `resumable`. Without either, a stream whose client goes away is cancelled at once, as
/// every engine does.
///
/// # Errors
/// 400 `invalid_header` for a value other than `true`/`false` (`1`/`0`).
pub(super) fn resumable(caller: &Caller, headers: &HeaderMap) -> Result<bool, ApiError> {
    let Some(value) = headers.get(RESUMABLE_HEADER) else {
        return Ok(caller.resumable);
    };
    match value.to_str().map(|text| text.trim().to_ascii_lowercase()) {
        Ok(text) if text == "true" || text == "1" => Ok(true),
        Ok(text) if text == "false" || text == "0" => Ok(false),
        _ => Err(ApiError::invalid_header(format!(
            "`{RESUMABLE_HEADER}` must be `true` or `false`."
        ))),
    }
}

#[cfg(test)]
mod tests {
    use axum::http::HeaderValue;

    use super::*;
    use crate::adapters::api::ApiConfig;

    fn api() -> Api {
        let mut config = ApiConfig::default();
        config
            .models
            .insert("gpt-4o-mini".into(), "echo/fast".into());
        Api::new(config).unwrap()
    }

    fn prepare_json(endpoint: Endpoint, body: &str) -> Result<ApiRequest, ApiError> {
        prepare(
            &api(),
            endpoint,
            &Caller::default(),
            &HeaderMap::new(),
            Ok(Bytes::from(body.to_owned())),
        )
    }

    #[test]
    fn the_input_is_the_body_without_model_and_stream() {
        let request = prepare_json(
            Endpoint::Chat,
            r#"{"model":"gpt-4o-mini","stream":true,"stream_options":{"include_usage":true},
                "messages":[{"role":"user","content":"hi"}],"max_tokens":7}"#,
        )
        .unwrap();
        assert_eq!(request.model, "gpt-4o-mini");
        assert!(request.stream && request.include_usage);
        assert_eq!(request.spec.selector.adapter.as_str(), "echo");
        assert_eq!(request.spec.selector.target.as_str(), "fast");
        assert_eq!(request.spec.content_type, "application/json");
        assert_eq!(request.spec.deadline, Some(Duration::from_secs(300)));
        let input: Value = serde_json::from_slice(&request.spec.input).unwrap();
        assert!(input.get("model").is_none() && input.get("stream").is_none());
        assert_eq!(input["max_tokens"], 7);
        assert_eq!(input["messages"][0]["content"], "hi");
    }

    #[test]
    fn fields_pass_to_the_node_as_they_came_in_key_order() {
        let request = prepare_json(
            Endpoint::Chat,
            "{ \"z\" : [ 1, 2 ] ,\"model\": \"echo/x\" , \"n\" : 1 ,\n\
             \"messages\" : [ {\"content\":\"a\\u00e9\"} ], \"a\\\"b\": null }",
        )
        .unwrap();
        assert_eq!(
            std::str::from_utf8(&request.spec.input).unwrap(),
            r#"{"a\"b":null,"messages":[ {"content":"a\u00e9"} ],"n":1,"z":[ 1, 2 ]}"#
        );
        let whitespace_only = prepare_json(Endpoint::Chat, r#"{"model":"echo/x","messages":[ ]}"#);
        assert!(whitespace_only.is_err());
    }

    #[test]
    fn bad_bodies_are_400_and_unknown_models_404() {
        let status = |endpoint, body| prepare_json(endpoint, body).unwrap_err().status();
        assert_eq!(status(Endpoint::Chat, "{nope"), StatusCode::BAD_REQUEST);
        assert_eq!(status(Endpoint::Chat, "[1]"), StatusCode::BAD_REQUEST);
        assert_eq!(
            status(Endpoint::Chat, r#"{"messages":[{}]}"#),
            StatusCode::BAD_REQUEST
        );
        assert_eq!(
            status(Endpoint::Chat, r#"{"model":"echo/x"}"#),
            StatusCode::BAD_REQUEST
        );
        assert_eq!(
            status(Endpoint::Chat, r#"{"model":"echo/x","messages":[]}"#),
            StatusCode::BAD_REQUEST
        );
        assert_eq!(
            status(Endpoint::Completion, r#"{"model":"echo/x"}"#),
            StatusCode::BAD_REQUEST
        );
        assert_eq!(
            status(
                Endpoint::Completion,
                r#"{"model":"echo/x","prompt":"a","stream":"yes"}"#
            ),
            StatusCode::BAD_REQUEST
        );
        assert_eq!(
            status(Endpoint::Completion, r#"{"model":"gpt-4o","prompt":"a"}"#),
            StatusCode::NOT_FOUND
        );
    }

    #[test]
    fn a_stream_is_resumable_when_the_request_or_the_key_asks() {
        let asking = |value: Option<&'static str>, key_default: bool| {
            let mut headers = HeaderMap::new();
            if let Some(value) = value {
                headers.insert(RESUMABLE_HEADER, HeaderValue::from_static(value));
            }
            let caller = Caller {
                resumable: key_default,
                ..Caller::default()
            };
            resumable(&caller, &headers)
        };
        assert_eq!(asking(None, false), Ok(false));
        assert_eq!(asking(None, true), Ok(true));
        assert_eq!(asking(Some("true"), false), Ok(true));
        assert_eq!(asking(Some(" TRUE "), false), Ok(true));
        assert_eq!(asking(Some("1"), false), Ok(true));
        assert_eq!(asking(Some("false"), true), Ok(false));
        assert_eq!(asking(Some("0"), true), Ok(false));
        let refused = asking(Some("maybe"), true).unwrap_err();
        assert_eq!(refused.error_code(), Some("invalid_header"));
    }

    #[test]
    fn the_deadline_header_is_capped() {
        let mut headers = HeaderMap::new();
        headers.insert(DEADLINE_HEADER, HeaderValue::from_static("999999999"));
        let body = Ok(Bytes::from_static(br#"{"model":"echo/x","prompt":"a"}"#));
        let caller = Caller::default();
        let request = prepare(&api(), Endpoint::Completion, &caller, &headers, body).unwrap();
        assert_eq!(request.spec.deadline, Some(Duration::from_secs(600)));
        headers.insert(DEADLINE_HEADER, HeaderValue::from_static("soon"));
        let body = Ok(Bytes::from_static(br#"{"model":"echo/x","prompt":"a"}"#));
        assert!(prepare(&api(), Endpoint::Completion, &caller, &headers, body).is_err());
    }
}
