//! `POST /v1/embeddings`: one embeddings run per request (`Operation::Embeddings`) whose
//! input is the request body without `model` and `encoding_format`; the node answers with
//! float vectors (`RunOutput.embeddings`) and the edge renders them as the client asked,
//! `float` or `base64` (little-endian `f32`s, as OpenAI encodes them). `dimensions` and
//! everything else reach the node untouched.

use axum::Json;
use axum::extract::State;
use axum::extract::rejection::BytesRejection;
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use serde::Serialize;
use serde_json::Value;

use crate::adapters::api::ApiError;
use crate::adapters::api::ApiState;
use crate::adapters::api::auth::Caller;
use crate::adapters::api::request::{
    Fields, deadline, encode_object, field_value, parse_object, read_body, run_spec, take_model,
};
use crate::adapters::api::routing::{ClientKeys, run_routing};
use crate::adapters::api::run;
use crate::adapters::api::translators::output::Collected;
use crate::adapters::api::translators::output::Finished;
use crate::domain::{Embedding, FailureClass, Operation, RunRouting};

/// How the vectors are rendered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(in crate::adapters::api) enum Encoding {
    /// JSON arrays of numbers.
    Float,
    /// Base64 of the little-endian `f32` bytes.
    Base64,
}

/// `POST /v1/embeddings`.
pub(in crate::adapters::api) async fn create(
    State(state): State<ApiState>,
    caller: Caller,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    let prepared = read_body(&state.api, body).and_then(|body| {
        let mut fields = parse_object(&body)?;
        let model = take_model(&mut fields)?;
        let encoding = match field_value(&mut fields, "encoding_format") {
            None | Some(Value::Null) => Encoding::Float,
            Some(Value::String(format)) if format == "float" => Encoding::Float,
            Some(Value::String(format)) if format == "base64" => Encoding::Base64,
            Some(_) => {
                return Err(ApiError::invalid(
                    "encoding_format",
                    "`encoding_format` must be `float` or `base64`.",
                ));
            }
        };
        check_input(fields.get("input").map(|raw| raw.get()))?;
        if let Some(dimensions) = fields.get("dimensions").map(|raw| raw.get())
            && dimensions != "null"
            && !dimensions.parse::<u32>().is_ok_and(|d| d > 0)
        {
            return Err(ApiError::invalid(
                "dimensions",
                "`dimensions` must be a positive integer.",
            ));
        }
        let deadline = deadline(&state.api, &headers)?;
        let routing = embeddings_routing(&caller, &headers, &fields)?;
        let input = encode_object(&fields);
        let operation = Operation::Embeddings;
        let spec = run_spec(&state.api, &model, input, operation, deadline, routing)?;
        Ok((model, encoding, spec))
    });
    let (model, encoding, spec) = match prepared {
        Ok(prepared) => prepared,
        Err(error) => return error.into_response(),
    };
    let mut run = match run::start(&state, spec, &model) {
        Ok(run) => run,
        Err(error) => return error.into_response(),
    };
    let response = match run::collect(&mut run).await {
        Ok((collected, finished)) => match answer(&model, encoding, collected, &finished) {
            Ok(body) => Json(body).into_response(),
            Err(error) => error.into_response(),
        },
        Err(error) => error.into_response(),
    };
    run::with_headers(response, &run.headers())
}

/// The routing of an embeddings run: keyed by its `user` or session, never by content.
fn embeddings_routing(
    caller: &Caller,
    headers: &HeaderMap,
    fields: &Fields<'_>,
) -> Result<RunRouting, ApiError> {
    let user = fields
        .get("user")
        .and_then(|raw| serde_json::from_str::<String>(raw.get()).ok());
    let keys = ClientKeys {
        user: user.as_deref(),
        ..ClientKeys::default()
    };
    run_routing(caller, headers, keys, || None)
}

/// `input`: a string, an array of strings, an array of token ids, or an array of arrays of
/// token ids; never empty.
fn check_input(raw: Option<&str>) -> Result<(), ApiError> {
    let Some(raw) = raw.filter(|raw| *raw != "null") else {
        return Err(ApiError::missing("input"));
    };
    let valid = match serde_json::from_str::<Value>(raw) {
        Ok(Value::String(_)) => true,
        Ok(Value::Array(items)) => {
            !items.is_empty()
                && (items.iter().all(Value::is_string)
                    || items.iter().all(Value::is_u64)
                    || items.iter().all(|item| {
                        item.as_array().is_some_and(|tokens| {
                            !tokens.is_empty() && tokens.iter().all(Value::is_u64)
                        })
                    }))
        }
        _ => false,
    };
    if valid {
        Ok(())
    } else {
        Err(ApiError::invalid(
            "input",
            "`input` must be a string, an array of strings, an array of token ids or an array of token-id arrays, and not empty.",
        ))
    }
}

/// The `list` answer.
#[derive(Debug, Serialize)]
pub(in crate::adapters::api) struct EmbeddingList<'a> {
    object: &'static str,
    data: Vec<EmbeddingItem>,
    model: &'a str,
    usage: EmbeddingUsage,
}

#[derive(Debug, Serialize)]
struct EmbeddingItem {
    object: &'static str,
    index: u32,
    embedding: Vector,
}

/// A vector as the client asked: `f32`s written as such (shortest form, as OpenAI writes
/// them), or base64 text.
#[derive(Debug, Serialize)]
#[serde(untagged)]
enum Vector {
    Float(Vec<f32>),
    Base64(String),
}

#[derive(Debug, Serialize)]
struct EmbeddingUsage {
    prompt_tokens: u32,
    total_tokens: u32,
}

/// The `list` of embeddings, ordered by index, with the usage.
///
/// # Errors
/// 502 when the node completed the run without any vector.
pub(in crate::adapters::api) fn answer<'a>(
    model: &'a str,
    encoding: Encoding,
    collected: Collected,
    finished: &Finished,
) -> Result<EmbeddingList<'a>, ApiError> {
    let mut embeddings = collected.embeddings;
    if embeddings.is_empty() {
        return Err(ApiError::run_failed(
            "no_embeddings",
            "the node completed the run without any embedding",
            FailureClass::Node,
            None,
            0,
        ));
    }
    embeddings.sort_by_key(|embedding| embedding.index);
    let data = embeddings
        .into_iter()
        .map(|embedding| EmbeddingItem {
            object: "embedding",
            index: embedding.index,
            embedding: render(embedding, encoding),
        })
        .collect();
    let prompt_tokens = finished.usage.map_or(0, |usage| usage.input_tokens);
    Ok(EmbeddingList {
        object: "list",
        data,
        model,
        usage: EmbeddingUsage {
            prompt_tokens,
            total_tokens: prompt_tokens,
        },
    })
}

fn render(embedding: Embedding, encoding: Encoding) -> Vector {
    match encoding {
        Encoding::Float => Vector::Float(embedding.values),
        Encoding::Base64 => {
            let bytes: Vec<u8> = embedding
                .values
                .iter()
                .flat_map(|value| value.to_le_bytes())
                .collect();
            Vector::Base64(base64(&bytes))
        }
    }
}

/// Standard base64 with padding.
fn base64(bytes: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for chunk in bytes.chunks(3) {
        let b = [
            chunk[0],
            *chunk.get(1).unwrap_or(&0),
            *chunk.get(2).unwrap_or(&0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for (i, shift) in [18, 12, 6, 0].into_iter().enumerate() {
            if i <= chunk.len() {
                out.push(char::from(ALPHABET[((n >> shift) & 63) as usize]));
            } else {
                out.push('=');
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::domain::Usage;

    #[test]
    fn base64_matches_the_standard() {
        assert_eq!(base64(b""), "");
        assert_eq!(base64(b"f"), "Zg==");
        assert_eq!(base64(b"fo"), "Zm8=");
        assert_eq!(base64(b"foo"), "Zm9v");
        assert_eq!(base64(b"foobar"), "Zm9vYmFy");
        assert_eq!(base64(&1.0f32.to_le_bytes()), "AACAPw==");
    }

    #[test]
    fn inputs_are_checked() {
        for good in [r#""a""#, r#"["a","b"]"#, "[1,2]", "[[1],[2,3]]"] {
            assert!(check_input(Some(good)).is_ok(), "{good}");
        }
        for bad in ["null", "[]", "1", r#"[1,"a"]"#, "[[]]", r#"{"a":1}"#] {
            assert!(check_input(Some(bad)).is_err(), "{bad}");
        }
        assert!(check_input(None).is_err());
    }

    #[test]
    fn vectors_come_back_in_index_order() {
        let collected = Collected {
            embeddings: vec![
                Embedding {
                    index: 1,
                    values: vec![0.5],
                },
                Embedding {
                    index: 0,
                    values: vec![1.0, -2.0],
                },
            ],
            ..Collected::default()
        };
        let finished = Finished {
            finish_reason: "stop".into(),
            usage: Some(Usage::new(4, 0)),
        };
        let json = |list: EmbeddingList<'_>| serde_json::to_value(list).unwrap();
        let body = json(answer("m", Encoding::Float, collected.clone(), &finished).unwrap());
        assert_eq!(body["data"][0]["embedding"], json!([1.0, -2.0]));
        assert_eq!(body["data"][1]["index"], 1);
        assert_eq!(body["usage"]["prompt_tokens"], 4);
        let body = json(answer("m", Encoding::Base64, collected, &finished).unwrap());
        assert_eq!(
            body["data"][0]["embedding"],
            base64(&[0, 0, 128, 63, 0, 0, 0, 192])
        );
        let empty = answer("m", Encoding::Float, Collected::default(), &finished);
        assert_eq!(empty.unwrap_err().status().as_u16(), 502);
    }
}
