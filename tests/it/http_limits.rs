//! The HTTP server's limits over real sockets: slow headers, slow bodies, too many
//! connections, too many concurrent API requests.

use crate::common;
use crate::mock_node;

use std::time::Duration;

use common::{TWO_NODES, eventually, spawn_app};
use mock_node::{Behaviour, MockNode, MockOptions};
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// The longest any single asynchronous effect may take before a test gives up.
const PATIENCE: Duration = Duration::from_secs(10);

fn config(http: &str) -> String {
    format!("{TWO_NODES}\n[http]\n{http}\n")
}

/// Reads until the server closes (or resets) the connection; returns what it sent.
async fn read_to_close(stream: &mut TcpStream) -> String {
    let mut received = Vec::new();
    let read = tokio::time::timeout(PATIENCE, stream.read_to_end(&mut received))
        .await
        .expect("the server closes the connection");
    match read {
        Ok(_) => {}
        Err(error) if error.kind() == std::io::ErrorKind::ConnectionReset => {}
        Err(error) => panic!("read: {error}"),
    }
    String::from_utf8_lossy(&received).into_owned()
}

#[crate::common::test]
async fn a_client_that_sends_headers_too_slowly_is_disconnected() {
    let app = spawn_app(&config("header_read_timeout_ms = 200")).await;
    let mut slow = TcpStream::connect(app.http_addr).await.expect("connect");
    slow.write_all(b"GET /healthz HTTP/1.1\r\nHost: edge\r\n")
        .await
        .expect("write");
    // The request's headers never end: the server gives up on them.
    let answer = read_to_close(&mut slow).await;
    assert!(!answer.contains("200 OK"), "{answer}");
    let health = crate::common::http_get(format!("http://{}/healthz", app.http_addr))
        .await
        .expect("get");
    assert_eq!(health.status(), 200, "other clients are served");
    app.stop().await;
}

#[crate::common::test]
async fn a_body_that_never_arrives_fails_the_request() {
    let app = spawn_app(&config("body_read_timeout_ms = 200")).await;
    let mut slow = TcpStream::connect(app.http_addr).await.expect("connect");
    let head = "POST /v1/chat/completions HTTP/1.1\r\nHost: edge\r\nContent-Type: application/json\r\nContent-Length: 1000\r\nConnection: close\r\n\r\n{\"model\":";
    slow.write_all(head.as_bytes()).await.expect("write");
    let answer = read_to_close(&mut slow).await;
    let status: u16 = answer
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("an HTTP answer, got {answer:?}"));
    assert!((400..500).contains(&status), "{answer}");
    app.stop().await;
}

#[crate::common::test]
async fn connections_beyond_the_limit_are_closed_at_once() {
    let app = spawn_app(&config(
        "max_connections = 2\nheader_read_timeout_ms = 60000",
    ))
    .await;
    let _first = TcpStream::connect(app.http_addr).await.expect("connect");
    let _second = TcpStream::connect(app.http_addr).await.expect("connect");
    let mut third = TcpStream::connect(app.http_addr).await.expect("connect");
    // A request on the third connection gets no answer: it is closed unanswered.
    let _ = third
        .write_all(b"GET /healthz HTTP/1.1\r\nHost: edge\r\n\r\n")
        .await;
    let answer = read_to_close(&mut third).await;
    assert!(answer.is_empty(), "{answer}");
    drop((_first, _second));
    app.stop().await;
}

#[crate::common::test]
async fn api_requests_beyond_the_limit_get_503_and_ops_endpoints_still_answer() {
    let app = spawn_app(&config("max_concurrent_requests = 1")).await;
    let options = MockOptions {
        behaviour: Behaviour::Hang,
        ..MockOptions::new("token-a")
    };
    let _node = MockNode::start(app.node_addr, options)
        .await
        .expect("mock node");
    let client = crate::common::http()
        .timeout(PATIENCE)
        .build()
        .expect("client");
    let url = format!("http://{}/v1/chat/completions", app.http_addr);
    let body = |stream: bool| -> Value {
        json!({"model": "echo/default", "stream": stream, "messages": [{"role": "user", "content": "hi"}]})
    };

    // The first request holds the only slot: its run hangs on the node.
    let held = tokio::spawn({
        let (client, url, body) = (client.clone(), url.clone(), body(false));
        async move { client.post(url).json(&body).send().await }
    });
    eventually("the first run started", || app.parts.runs.open_runs() > 0).await;

    let refused = client
        .post(&url)
        .json(&body(true))
        .send()
        .await
        .expect("request");
    assert_eq!(refused.status(), 503);
    assert!(refused.headers().contains_key("retry-after"));
    let error: Value = refused.json().await.expect("json");
    assert_eq!(error["error"]["code"], "server_overloaded");
    // The limit is shared by every API, and answers in each one's shape.
    let messages = client
        .post(format!("http://{}/v1/messages", app.http_addr))
        .json(&json!({"model": "echo/default", "max_tokens": 8,
            "messages": [{"role": "user", "content": "hi"}]}))
        .send()
        .await
        .expect("request");
    assert_eq!(messages.status(), 503);
    let error: Value = messages.json().await.expect("json");
    assert_eq!(error["type"], "error", "Anthropic's shape: {error}");
    assert_eq!(error["error"]["type"], "overloaded_error", "{error}");

    let health = client
        .get(format!("http://{}/healthz", app.http_addr))
        .send()
        .await
        .expect("get");
    assert_eq!(
        health.status(),
        200,
        "operations endpoints are never limited"
    );

    held.abort();
    app.stop().await;
}
