//! `POST /tokenize` and `POST /detokenize`, the bodies llama.cpp's `llama-server` and vLLM
//! take, with a `model` naming the edge's model: one tokenize (or detokenize) run through a
//! node whose engine's tokenizer answers. OpenAI's error shape.
//!
//! `/tokenize` takes the text as `content` (llama.cpp) or `prompt` (vLLM), with
//! `add_special` (llama.cpp) or `add_special_tokens` (vLLM) — false when neither is given —
//! or a chat body's `messages` (vLLM; with `tools` and the rest), counted as the engine's chat
//! template renders them. It answers `{"tokens": [...], "count": N}`. `/detokenize` takes
//! `tokens` and answers the text as both `content` (llama.cpp) and `prompt` (vLLM).

use axum::Json;
use axum::extract::State;
use axum::extract::rejection::BytesRejection;
use axum::http::HeaderMap;
use axum::response::{IntoResponse as _, Response};
use bytes::Bytes;
use serde_json::{Value, json};

use crate::adapters::api::ApiError;
use crate::adapters::api::ApiState;
use crate::adapters::api::auth::Caller;
use crate::adapters::api::request::{
    Fields, deadline, encode_object, field_value, parse_object, read_body, run_spec, take_model,
};
use crate::adapters::api::routing::{ClientKeys, run_routing};
use crate::adapters::api::run;
use crate::domain::Operation;

/// `POST /tokenize`.
pub(in crate::adapters::api) async fn tokenize(
    state: State<ApiState>,
    caller: Caller,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    serve(state, &caller, &headers, body, Operation::Tokenize).await
}

/// `POST /detokenize`.
pub(in crate::adapters::api) async fn detokenize(
    state: State<ApiState>,
    caller: Caller,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    serve(state, &caller, &headers, body, Operation::Detokenize).await
}

async fn serve(
    State(state): State<ApiState>,
    caller: &Caller,
    headers: &HeaderMap,
    body: Result<Bytes, BytesRejection>,
    operation: Operation,
) -> Response {
    let prepared = read_body(&state.api, body).and_then(|body| {
        let mut fields = parse_object(&body)?;
        let model = take_model(&mut fields)?;
        let input = match operation {
            Operation::Detokenize => detokenize_input(&mut fields)?,
            _ => tokenize_input(&mut fields)?,
        };
        let deadline = deadline(&state.api, headers)?;
        let routing = run_routing(caller, headers, ClientKeys::default(), || None)?;
        let spec = run_spec(&state.api, &model, input, operation, deadline, routing)?;
        Ok((model, spec))
    });
    let (model, spec) = match prepared {
        Ok(prepared) => prepared,
        Err(error) => return error.into_response(),
    };
    let mut run = match run::start(&state, spec, &model) {
        Ok(run) => run,
        Err(error) => return error.into_response(),
    };
    let answer = match operation {
        Operation::Detokenize => run::collect(&mut run)
            .await
            .map(|(collected, _)| json!({ "content": collected.text, "prompt": collected.text })),
        _ => run::tokens(&mut run)
            .await
            .map(|(tokens, count)| json!({ "tokens": tokens, "count": count })),
    };
    let response = match answer {
        Ok(body) => Json(body).into_response(),
        Err(error) => error.into_response(),
    };
    run::with_headers(response, &run.headers())
}

/// The node's input for a `/tokenize` body (without `model`): the chat body when it has
/// `messages`, else `{"content", "add_special"}`.
fn tokenize_input(fields: &mut Fields<'_>) -> Result<Bytes, ApiError> {
    if field_value(fields, "with_pieces").is_some_and(|pieces| pieces == Value::Bool(true)) {
        return Err(ApiError::invalid(
            "with_pieces",
            "`with_pieces` is not supported: the edge answers token ids only.",
        ));
    }
    if fields.contains_key("messages") {
        return Ok(encode_object(fields));
    }
    let content = match field_value(fields, "content").or_else(|| field_value(fields, "prompt")) {
        Some(Value::String(content)) => content,
        None | Some(Value::Null) => return Err(ApiError::missing("content")),
        Some(_) => {
            return Err(ApiError::invalid(
                "content",
                "`content` (or `prompt`) must be a string.",
            ));
        }
    };
    let add_special = match field_value(fields, "add_special")
        .or_else(|| field_value(fields, "add_special_tokens"))
    {
        None | Some(Value::Null) => false,
        Some(Value::Bool(add)) => add,
        Some(_) => {
            return Err(ApiError::invalid(
                "add_special",
                "`add_special` must be a boolean.",
            ));
        }
    };
    Ok(Bytes::from(
        json!({ "content": content, "add_special": add_special }).to_string(),
    ))
}

/// The node's input for a `/detokenize` body: `{"tokens"}`, token ids.
fn detokenize_input(fields: &mut Fields<'_>) -> Result<Bytes, ApiError> {
    match field_value(fields, "tokens") {
        Some(Value::Array(tokens))
            if tokens
                .iter()
                .all(|t| t.as_u64().is_some_and(|t| u32::try_from(t).is_ok())) =>
        {
            Ok(Bytes::from(json!({ "tokens": tokens }).to_string()))
        }
        None | Some(Value::Null) => Err(ApiError::missing("tokens")),
        Some(_) => Err(ApiError::invalid(
            "tokens",
            "`tokens` must be an array of token ids.",
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn input(body: &str, detokenize: bool) -> Result<Value, ApiError> {
        let mut fields = parse_object(body.as_bytes())?;
        let bytes = if detokenize {
            detokenize_input(&mut fields)?
        } else {
            tokenize_input(&mut fields)?
        };
        Ok(serde_json::from_slice(&bytes).unwrap())
    }

    #[test]
    fn llama_cpp_and_vllm_bodies_become_the_node_input() {
        let llama = input(r#"{"content":"Hi","add_special":true}"#, false).unwrap();
        assert_eq!(llama, json!({"content": "Hi", "add_special": true}));
        let vllm = input(r#"{"prompt":"Hi","add_special_tokens":false}"#, false).unwrap();
        assert_eq!(vllm, json!({"content": "Hi", "add_special": false}));
        let plain = input(r#"{"content":"Hi"}"#, false).unwrap();
        assert_eq!(plain["add_special"], false);
        let chat = input(r#"{"messages":[{"role":"user","content":"Hi"}]}"#, false).unwrap();
        assert_eq!(chat["messages"][0]["content"], "Hi");
        assert_eq!(
            input(r#"{"tokens":[1,2]}"#, true).unwrap(),
            json!({"tokens": [1, 2]})
        );
    }

    #[test]
    fn bad_bodies_are_400s_naming_the_field() {
        for (body, detokenize, param) in [
            ("{}", false, "content"),
            (r#"{"content":1}"#, false, "content"),
            (
                r#"{"content":"a","add_special":"yes"}"#,
                false,
                "add_special",
            ),
            (
                r#"{"content":"a","with_pieces":true}"#,
                false,
                "with_pieces",
            ),
            ("{}", true, "tokens"),
            (r#"{"tokens":[-1]}"#, true, "tokens"),
            (r#"{"tokens":"1"}"#, true, "tokens"),
        ] {
            let error = input(body, detokenize).unwrap_err();
            assert_eq!(error.status().as_u16(), 400, "{body}");
            let param = format!("param: Some({param:?})");
            assert!(format!("{error:?}").contains(&param), "{body}: {error:?}");
        }
    }
}
