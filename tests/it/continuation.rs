//! Continuation over real TCP: a real edge with the file sink, two reference nodes, each in
//! front of its own scripted OpenAI engine, and a client streaming a chat completion or a
//! completion. The first node's link is cut mid-answer (resume off, so its run is lost for
//! good); the edge continues the run on the second node, which asks its engine to go on from
//! the text the client has (chat: a trailing assistant message, whose echo — `llama-server`
//! sends one — it drops; completions: the prompt plus that text). The client's stream
//! completes with nothing repeated or lost, and one terminal event reaches the sink. The same
//! when the first node is drained with a deadline that passes mid-answer.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use serde_json::{Value, json};
use tokio::sync::Semaphore;

use crate::common::{PATIENCE, TestApp};
use crate::node_support::relay::Relay;
use crate::node_support::upstream::{Reply, ScriptedEngine};
use crate::node_support::{QWEN, edge_config, edge_on, spawn_node};
use crate::resume::{is_terminal, open_stream, sunk};

/// Deltas the first engine has; the client reads [`BEFORE`] of them before the cut.
const DELTAS: usize = 20;
const BEFORE: usize = 6;

fn delta(n: usize) -> String {
    format!("d{n} ")
}

/// One kind of streamed request: its path, body, and how a chunk carries text.
#[derive(Clone, Copy)]
struct Case {
    path: &'static str,
    chat: bool,
}

impl Case {
    const CHAT: Self = Self {
        path: "/v1/chat/completions",
        chat: true,
    };
    const COMPLETION: Self = Self {
        path: "/v1/completions",
        chat: false,
    };

    fn body(self) -> Value {
        if self.chat {
            json!({"model": "llama/qwen", "stream": true,
                   "messages": [{"role": "user", "content": "tell me a story"}]})
        } else {
            json!({"model": "llama/qwen", "stream": true, "prompt": "Story: "})
        }
    }

    /// An engine chunk carrying `text`.
    fn chunk(self, text: &str) -> String {
        let choice = if self.chat {
            json!({"index": 0, "delta": {"content": text}})
        } else {
            json!({"index": 0, "text": text})
        };
        json!({ "choices": [choice] }).to_string()
    }

    /// The text a client chunk carries.
    fn text(self, chunk: &Value) -> Option<String> {
        let choice = &chunk["choices"][0];
        let text = if self.chat {
            &choice["delta"]["content"]
        } else {
            &choice["text"]
        };
        text.as_str().filter(|t| !t.is_empty()).map(str::to_owned)
    }

    /// `chunks` followed by a `stop` chunk and `[DONE]`.
    fn finished(self, mut chunks: Vec<String>) -> Vec<String> {
        let stop = if self.chat {
            json!({"index": 0, "delta": {}, "finish_reason": "stop"})
        } else {
            json!({"index": 0, "text": "", "finish_reason": "stop"})
        };
        chunks.push(json!({ "choices": [stop] }).to_string());
        chunks.push("[DONE]".to_owned());
        chunks
    }
}

/// A client's stream: the response, and what of it is not yet read.
struct Client {
    response: reqwest::Response,
    buffer: String,
    run_id: String,
    case: Case,
}

impl Client {
    async fn open(app: &TestApp, case: Case) -> Self {
        let (response, run_id) = open_stream(app, case.path, &case.body()).await;
        Self {
            response,
            buffer: String::new(),
            run_id,
            case,
        }
    }

    /// Texts until `n` arrived, or (with `None`) until `[DONE]`.
    async fn read(&mut self, n: Option<usize>) -> Vec<String> {
        let mut texts = Vec::new();
        while n.is_none_or(|n| texts.len() < n) {
            let Some(end) = self.buffer.find("\n\n") else {
                let chunk = tokio::time::timeout(PATIENCE, self.response.chunk())
                    .await
                    .expect("the stream goes on")
                    .expect("the stream reads")
                    .expect("the stream ended without [DONE]");
                self.buffer
                    .push_str(std::str::from_utf8(&chunk).expect("UTF-8"));
                continue;
            };
            let block: String = self.buffer.drain(..end + 2).collect();
            let Some(data) = block.lines().find_map(|l| l.strip_prefix("data: ")) else {
                continue;
            };
            if data == "[DONE]" {
                assert_eq!(n, None, "[DONE] came early");
                break;
            }
            let chunk: Value = serde_json::from_str(data).expect("a JSON chunk");
            texts.extend(self.case.text(&chunk));
        }
        texts
    }
}

/// `edge_config`'s node, as `node-2` with `token-2` in front of `base_url`.
fn second_node(base_url: &str) -> String {
    edge_config(base_url, &["qwen"], 1_000)
        .replace("node-1", "node-2")
        .replace("box-1", "box-2")
        .replace("token-1", "token-2")
}

/// How the first node loses the run mid-answer.
#[derive(Clone, Copy, PartialEq)]
enum Loss {
    /// Its link to the edge is cut (resume off: lost for good).
    Cut,
    /// An operator drains it with a deadline that has passed at once.
    DrainDeadline,
}

/// Streams `case` through the loss of its first node; returns the second engine's request.
async fn continued(case: Case, loss: Loss) -> Value {
    let first = ScriptedEngine::start(&[QWEN]).await;
    let gate = Arc::new(Semaphore::new(0));
    let chunks = case.finished((0..DELTAS).map(|n| case.chunk(&delta(n))).collect());
    let gated = Some(Arc::clone(&gate));
    first.script(
        QWEN,
        Reply::Sse {
            chunks,
            gate: gated,
            hang: false,
        },
    );
    let prefix: String = (0..BEFORE).map(delta).collect();
    let second = ScriptedEngine::start(&[QWEN]).await;
    // llama-server streams a continued chat's text back first, then what it adds.
    let echo = if case.chat { prefix.as_str() } else { "" };
    let chunks = case.finished(vec![case.chunk(&format!("{echo}e0 ")), case.chunk("e1")]);
    second.script(
        QWEN,
        Reply::Sse {
            chunks,
            gate: None,
            hang: false,
        },
    );

    let events_dir = tempfile::tempdir().expect("tempdir");
    let events_file = events_dir.path().join("events.jsonl");
    let config = format!(
        "{}{}\n[runs]\nresume_grace_ms = 0\n[events]\nsinks = [\"file\"]\n[events.file]\npath = {:?}\nflush_interval_ms = 20\n",
        edge_config(&first.base_url(), &["qwen"], 1_000),
        second_node(&second.base_url()),
        events_file.display().to_string(),
    );
    let app = edge_on(&config, SocketAddr::from(([127, 0, 0, 1], 0))).await;
    let relay = Relay::start(app.node_addr).await;
    let node_1 = spawn_node(relay.addr, "token-1", |_| {});
    app.wait_for_nodes(1).await;

    gate.add_permits(BEFORE);
    let mut client = Client::open(&app, case).await;
    let mut texts = client.read(Some(BEFORE)).await;
    // The second node arrives once the run is on the first.
    let node_2 = spawn_node(app.node_addr, "token-2", |_| {});
    app.wait_for_nodes(2).await;
    match loss {
        Loss::Cut => relay.cut(),
        Loss::DrainDeadline => {
            let drain = app.parts.management.drain("node-1", Some(Duration::ZERO));
            drain.expect("node-1 is configured");
        }
    }
    texts.extend(client.read(None).await);

    let mut expected: Vec<String> = (0..BEFORE).map(delta).collect();
    expected.extend(["e0 ".to_owned(), "e1".to_owned()]);
    assert_eq!(texts, expected, "the prefix, then only the continuation");
    let lines = sunk(&events_file, &client.run_id).await;
    assert_eq!(lines.iter().filter(|l| is_terminal(l)).count(), 1);
    assert_eq!(
        lines.last().map(|l| l["kind"].clone()),
        Some(json!("completed"))
    );
    let started = lines.iter().filter(|l| l["kind"] == "started").count();
    assert_eq!(started, 2, "{lines:?}");

    gate.add_permits(DELTAS + 2);
    node_2.stop().await.expect("clean stop");
    node_1.stop.cancel();
    app.assert_settled().await;
    let asked = second.seen();
    assert_eq!(asked.len(), 1);
    asked[0].body.clone()
}

/// Checks that the second engine was `asked` to go on from the prefix in a trailing
/// assistant message.
fn assert_asked_to_go_on_in_chat(asked: &Value) {
    let prefix: String = (0..BEFORE).map(delta).collect();
    let messages = asked["messages"].as_array().expect("messages");
    assert_eq!(
        messages.last(),
        Some(&json!({"role": "assistant", "content": prefix}))
    );
}

#[crate::common::test]
async fn a_chat_whose_node_is_lost_mid_answer_is_finished_by_another_node() {
    assert_asked_to_go_on_in_chat(&continued(Case::CHAT, Loss::Cut).await);
}

#[crate::common::test]
async fn a_completion_whose_node_is_lost_mid_answer_is_finished_by_another_node() {
    let asked = continued(Case::COMPLETION, Loss::Cut).await;
    let prefix: String = (0..BEFORE).map(delta).collect();
    assert_eq!(asked["prompt"], format!("Story: {prefix}"));
}

#[crate::common::test]
async fn a_chat_left_on_a_node_at_its_drain_deadline_is_finished_by_another_node() {
    assert_asked_to_go_on_in_chat(&continued(Case::CHAT, Loss::DrainDeadline).await);
}
