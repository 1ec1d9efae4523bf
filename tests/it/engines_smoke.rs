//! The real engines other tests build on, checked on their own: `llama-server` with the tiny
//! model answers the OpenAI-compatible API whole and streamed, comes back on the same port
//! after a stop, and serves embeddings; `nats-server` runs JetStream and keeps its streams
//! across a restart. The first run on a machine builds llama-server (see docs/engines.md).

use crate::common;

use std::net::SocketAddr;

use common::engines::{
    LlamaOptions, LlamaServer, NatsServer, TINY_EMBEDDING_LENGTH, TINY_EOS_TOKEN, TINY_REPLY,
    TINY_REPLY_TOKENS, nats_info,
};
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;

fn client() -> reqwest::Client {
    crate::common::http()
        .timeout(std::time::Duration::from_secs(30))
        .build()
        .expect("http client")
}

/// POSTs `body` to `{v1}{path}` and returns the JSON answer, which must be a 200.
async fn post(server: &LlamaServer, path: &str, body: Value) -> Value {
    let response = client()
        .post(format!("{}{path}", server.v1_url()))
        .json(&body)
        .send()
        .await
        .expect("send to llama-server");
    let status = response.status();
    let text = response.text().await.expect("read the answer");
    assert!(status.is_success(), "{path} answered {status}: {text}");
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{path} answered non-JSON ({e}): {text}"))
}

/// POSTs a streamed request and returns the `data:` payloads of the event stream, up to
/// and without `[DONE]`, which must end it.
async fn post_stream(server: &LlamaServer, path: &str, body: Value) -> Vec<Value> {
    let response = client()
        .post(format!("{}{path}", server.v1_url()))
        .json(&body)
        .send()
        .await
        .expect("send to llama-server");
    assert!(
        response.status().is_success(),
        "{path}: {}",
        response.status()
    );
    let text = response.text().await.expect("read the stream");
    let payloads: Vec<&str> = text
        .lines()
        .filter_map(|line| line.strip_prefix("data: "))
        .collect();
    assert_eq!(payloads.last(), Some(&"[DONE]"), "stream: {text}");
    payloads[..payloads.len() - 1]
        .iter()
        .map(|p| serde_json::from_str(p).unwrap_or_else(|e| panic!("chunk {p}: {e}")))
        .collect()
}

fn chat(content: &str) -> Value {
    json!({"model": "tiny", "messages": [{"role": "user", "content": content}]})
}

fn with(mut body: Value, key: &str, value: Value) -> Value {
    body[key] = value;
    body
}

#[crate::common::test]
async fn llama_server_lists_the_tiny_model_and_answers_chats() {
    let server = LlamaServer::start().await;

    let models: Value = client()
        .get(format!("{}/models", server.v1_url()))
        .send()
        .await
        .expect("GET /v1/models")
        .json()
        .await
        .expect("models JSON");
    assert_eq!(models["data"][0]["id"], server.model(), "{models}");

    let answer = post(&server, "/chat/completions", chat("Hi there")).await;
    assert_eq!(answer["choices"][0]["message"]["content"], TINY_REPLY);
    assert_eq!(answer["choices"][0]["finish_reason"], "stop");
    // llama-server counts the end-of-sequence token as generated.
    assert_eq!(
        answer["usage"]["completion_tokens"],
        TINY_REPLY_TOKENS.len() + 1
    );
    assert!(
        answer["usage"]["prompt_tokens"].as_u64() > Some(0),
        "{answer}"
    );

    let cut = post(
        &server,
        "/chat/completions",
        with(chat("Hi there"), "max_tokens", json!(3)),
    )
    .await;
    assert_eq!(
        cut["choices"][0]["message"]["content"],
        TINY_REPLY_TOKENS[..3].concat()
    );
    assert_eq!(cut["choices"][0]["finish_reason"], "length");
    assert_eq!(cut["usage"]["completion_tokens"], 3);
}

#[crate::common::test]
async fn llama_server_streams_chat_chunks_with_usage() {
    let server = LlamaServer::start().await;
    let body = with(chat("Stream it"), "stream", json!(true));
    let body = with(body, "stream_options", json!({"include_usage": true}));

    let chunks = post_stream(&server, "/chat/completions", body).await;
    let text: String = chunks
        .iter()
        .filter_map(|c| c["choices"][0]["delta"]["content"].as_str())
        .collect();
    assert_eq!(text, TINY_REPLY);
    let finish: Vec<&Value> = chunks
        .iter()
        .map(|c| &c["choices"][0]["finish_reason"])
        .filter(|f| !f.is_null())
        .collect();
    assert_eq!(finish, [&json!("stop")], "{chunks:?}");
    let usage = &chunks.last().expect("a chunk")["usage"];
    assert_eq!(
        usage["completion_tokens"],
        TINY_REPLY_TOKENS.len() + 1,
        "{usage}"
    );
}

#[crate::common::test]
async fn llama_server_completes_prompts_and_repeats_when_eos_is_banned() {
    let server = LlamaServer::start().await;

    let answer = post(
        &server,
        "/completions",
        json!({"model": "tiny", "prompt": "Once upon a time"}),
    )
    .await;
    assert_eq!(answer["choices"][0]["text"], TINY_REPLY);
    assert_eq!(answer["choices"][0]["finish_reason"], "stop");

    let banned = json!({
        "model": "tiny",
        "prompt": "Once upon a time",
        "max_tokens": 10,
        "logit_bias": {TINY_EOS_TOKEN.to_string(): -100},
    });
    let endless = post(&server, "/completions", banned).await;
    let expected = format!("{TINY_REPLY}{}", TINY_REPLY_TOKENS[..3].concat());
    assert_eq!(endless["choices"][0]["text"], expected.as_str());
    assert_eq!(endless["choices"][0]["finish_reason"], "length");
}

#[crate::common::test]
async fn llama_server_comes_back_on_the_same_port() {
    let mut server = LlamaServer::start().await;
    let addr = server.addr();

    server.stop().await;
    assert!(!server.is_running());
    assert!(
        TcpStream::connect(addr).await.is_err(),
        "{addr} still accepts"
    );

    server.restart().await;
    assert_eq!(server.addr(), addr);
    let answer = post(&server, "/chat/completions", chat("Back?")).await;
    assert_eq!(answer["choices"][0]["message"]["content"], TINY_REPLY);

    server.terminate().await;
    assert!(!server.is_running());
    assert!(
        TcpStream::connect(addr).await.is_err(),
        "{addr} still accepts after SIGTERM"
    );
}

#[crate::common::test]
async fn llama_server_serves_mean_pooled_embeddings() {
    let server = LlamaServer::start_with(LlamaOptions::default().embeddings()).await;

    let answer = post(
        &server,
        "/embeddings",
        json!({"model": "tiny", "input": ["red apples", "a blue whale"]}),
    )
    .await;
    let vectors: Vec<&Vec<Value>> = answer["data"]
        .as_array()
        .expect("data")
        .iter()
        .map(|d| d["embedding"].as_array().expect("an embedding"))
        .collect();
    assert_eq!(vectors.len(), 2, "{answer}");
    assert!(vectors.iter().all(|v| v.len() == TINY_EMBEDDING_LENGTH));
    assert_ne!(vectors[0], vectors[1], "different inputs, same embedding");
    assert!(
        answer["usage"]["prompt_tokens"].as_u64() > Some(0),
        "{answer}"
    );

    // With this model, an embeddings server still answers chats.
    let chat = post(&server, "/chat/completions", chat("And you?")).await;
    assert_eq!(chat["choices"][0]["message"]["content"], TINY_REPLY);
}

/// A minimal NATS protocol client: enough to make JetStream API requests.
struct Nats {
    reader: BufReader<tokio::net::tcp::OwnedReadHalf>,
    writer: tokio::net::tcp::OwnedWriteHalf,
}

impl Nats {
    async fn connect(addr: SocketAddr) -> Self {
        let (read, writer) = TcpStream::connect(addr)
            .await
            .expect("connect to nats-server")
            .into_split();
        let mut nats = Self {
            reader: BufReader::new(read),
            writer,
        };
        let mut info = String::new();
        common::bounded(
            "nats-server's INFO greeting",
            nats.reader.read_line(&mut info),
        )
        .await
        .expect("INFO line");
        assert!(info.starts_with("INFO "), "greeting: {info}");
        nats.send("CONNECT {\"verbose\":false,\"pedantic\":false}\r\nSUB _INBOX.smoke 1\r\n")
            .await;
        nats
    }

    async fn send(&mut self, text: &str) {
        self.writer
            .write_all(text.as_bytes())
            .await
            .expect("write to nats-server");
    }

    /// Publishes `body` to `subject` and returns the reply's JSON.
    async fn request(&mut self, subject: &str, body: &str) -> Value {
        self.send(&format!(
            "PUB {subject} _INBOX.smoke {}\r\n{body}\r\n",
            body.len()
        ))
        .await;
        loop {
            let mut line = String::new();
            let read = self.reader.read_line(&mut line);
            common::bounded(format!("nats-server's reply to {subject}"), read)
                .await
                .expect("read");
            if line.starts_with("PING") {
                self.send("PONG\r\n").await;
            } else if line.starts_with("MSG ") {
                let size: usize = line
                    .split_whitespace()
                    .last()
                    .and_then(|n| n.parse().ok())
                    .expect("MSG size");
                let mut payload = vec![0; size + 2];
                let read = self.reader.read_exact(&mut payload);
                common::bounded(format!("the payload of the reply to {subject}"), read)
                    .await
                    .expect("payload");
                payload.truncate(size);
                return serde_json::from_slice(&payload).expect("a JSON reply");
            } else {
                assert!(!line.starts_with("-ERR"), "nats-server: {line}");
            }
        }
    }
}

#[crate::common::test]
async fn nats_server_keeps_jetstream_streams_across_a_restart() {
    let mut server = NatsServer::start_jetstream().await;
    let info = nats_info(server.addr()).await.expect("INFO");
    assert_eq!(info["jetstream"], true, "{info}");

    let mut nats = Nats::connect(server.addr()).await;
    let created = nats
        .request(
            "$JS.API.STREAM.CREATE.SMOKE",
            r#"{"name":"SMOKE","subjects":["smoke.>"],"storage":"file"}"#,
        )
        .await;
    assert_eq!(created["did_create"], true, "{created}");
    let ack = nats.request("smoke.one", "hello").await;
    assert_eq!(ack["seq"], 1, "{ack}");
    drop(nats);

    server.stop().await;
    server.restart().await;
    let mut nats = Nats::connect(server.addr()).await;
    let stream = nats.request("$JS.API.STREAM.INFO.SMOKE", "").await;
    assert_eq!(stream["state"]["messages"], 1, "{stream}");
}

#[crate::common::test]
async fn nats_server_without_jetstream_greets_clients() {
    let server = NatsServer::start().await;
    let info = nats_info(server.addr()).await.expect("INFO");
    assert!(info["jetstream"] != true, "{info}");
    assert!(server.store_dir().is_none());
}
