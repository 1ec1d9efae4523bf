//! `POST /v1/embeddings` through a real edge and a mock node over real TCP: one embeddings
//! run per request, float and base64 answers, `dimensions` passed through, token-array
//! inputs, and malformed bodies answered in OpenAI's shape.

use crate::api_support;

use api_support::{Edge, json_with, ok_json};
use edge::domain::Operation;
use reqwest::StatusCode;
use serde_json::{Value, json};

const EMBEDDINGS: &str = "/v1/embeddings";

/// The floats of a base64 embedding (little-endian f32s).
fn decode(text: &str) -> Vec<f32> {
    let value = |c: u8| -> u32 {
        match c {
            b'A'..=b'Z' => u32::from(c - b'A'),
            b'a'..=b'z' => u32::from(c - b'a') + 26,
            b'0'..=b'9' => u32::from(c - b'0') + 52,
            b'+' => 62,
            _ => 63,
        }
    };
    let mut bytes = Vec::new();
    for chunk in text.as_bytes().chunks(4) {
        let n = chunk
            .iter()
            .filter(|c| **c != b'=')
            .fold(0, |n, c| (n << 6) | value(*c));
        let real = chunk.iter().filter(|c| **c != b'=').count();
        let n = n << (6 * (4 - real));
        bytes.extend_from_slice(&n.to_be_bytes()[1..real]);
    }
    bytes
        .chunks(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect()
}

#[crate::common::test]
async fn float_and_base64_vectors_for_string_and_array_inputs() {
    let edge = Edge::start("").await;
    let body = json!({"model": "echo/default", "input": ["ab", "cde"], "dimensions": 3});
    let response = edge.send(EMBEDDINGS, &body).await;
    assert!(response.headers().contains_key("x-edge-run-id"));
    let answer = ok_json(response).await;
    assert_eq!(answer["object"], "list");
    assert_eq!(answer["model"], "echo/default");
    assert_eq!(
        answer["data"][0],
        json!({"object": "embedding", "index": 0, "embedding": [2.01, 0.02, 0.03]})
    );
    assert_eq!(answer["data"][1]["embedding"].as_array().unwrap().len(), 3);
    assert_eq!(
        answer["usage"],
        json!({"prompt_tokens": 5, "total_tokens": 5})
    );

    let run = edge.runs().pop().unwrap();
    assert_eq!(run.operation, Operation::Embeddings);
    let input: Value = serde_json::from_slice(&run.input).unwrap();
    assert_eq!(input, json!({"input": ["ab", "cde"], "dimensions": 3}));

    let body = json!({"model": "echo/default", "input": "abcd", "encoding_format": "base64"});
    let answer = ok_json(edge.send(EMBEDDINGS, &body).await).await;
    let vector = decode(
        answer["data"][0]["embedding"]
            .as_str()
            .expect("base64 text"),
    );
    assert_eq!(vector.len(), 8);
    assert!(
        (vector[0] - 4.01).abs() < 1e-6 && (vector[7] - 0.08).abs() < 1e-6,
        "{vector:?}"
    );
    let input = edge.last_input();
    assert!(
        input.get("encoding_format").is_none(),
        "the node always answers floats: {input}"
    );

    let tokens = json!({"model": "echo/default", "input": [[1, 2, 3], [4]]});
    let answer = ok_json(edge.send(EMBEDDINGS, &tokens).await).await;
    assert_eq!(answer["data"].as_array().unwrap().len(), 2);
    edge.stop().await;
}

#[crate::common::test]
async fn malformed_embedding_requests_are_400_in_openai_s_shape() {
    let edge = Edge::start("").await;
    for raw in [
        "{nope",
        r#"{"model":"echo/default"}"#,
        r#"{"model":"echo/default","input":[]}"#,
        r#"{"model":"echo/default","input":[1,"a"]}"#,
        r#"{"model":"echo/default","input":"a","encoding_format":"hex"}"#,
        r#"{"model":"echo/default","input":"a","dimensions":0}"#,
        r#"{"input":"a"}"#,
    ] {
        let body = json_with(
            edge.send_raw(EMBEDDINGS, raw).await,
            StatusCode::BAD_REQUEST,
        )
        .await;
        assert_eq!(
            body["error"]["type"], "invalid_request_error",
            "{raw}: {body}"
        );
    }
    let body = json!({"model": "echo/node_error", "input": "x"});
    let error = json_with(edge.send(EMBEDDINGS, &body).await, StatusCode::OK).await;
    // An embeddings run ignores the chat behaviours: the mock always embeds.
    assert_eq!(error["data"][0]["index"], 0);
    edge.stop().await;
}
