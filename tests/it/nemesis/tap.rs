//! A tap in front of each `llama-server`: the engine as its node reaches it, every chat
//! completion request counted by its prompt and its answer kept as the engine streamed it —
//! the text, whether it reached its end, the usage it reported — so the checker holds every
//! execution against the runs that caused it. The answer is passed on event by event,
//! [`PACE`] apart, so a run of the tiny model lasts long enough for faults to land mid-answer.
//! Anything else (the node's probes, model listings) is passed through untouched.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use futures::StreamExt as _;
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// The pause before each event of an answer is passed on.
const PACE: Duration = Duration::from_millis(60);

/// One execution of a prompt by an engine, as the tap saw it.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
pub(crate) struct Execution {
    /// Which engine ran it.
    pub(crate) engine: usize,
    /// The text it streamed.
    pub(crate) text: String,
    /// Whether it streamed to its end (a finish reason and `[DONE]`).
    pub(crate) finished: bool,
    /// The tokens it reported, in and out (0 when it reported none).
    pub(crate) input_tokens: u64,
    pub(crate) output_tokens: u64,
}

/// Every execution of every prompt, by prompt; shared by the taps.
#[derive(Clone, Default)]
pub(crate) struct Executions(Arc<Mutex<BTreeMap<String, Vec<Execution>>>>);

impl Executions {
    /// What was executed so far.
    pub(crate) fn snapshot(&self) -> BTreeMap<String, Vec<Execution>> {
        self.0.lock().expect("executions").clone()
    }

    fn begin(&self, prompt: &str, engine: usize) -> usize {
        let mut all = self.0.lock().expect("executions");
        let list = all.entry(prompt.to_owned()).or_default();
        list.push(Execution {
            engine,
            ..Execution::default()
        });
        list.len() - 1
    }

    fn update(&self, prompt: &str, index: usize, change: impl FnOnce(&mut Execution)) {
        if let Some(execution) = self
            .0
            .lock()
            .expect("executions")
            .get_mut(prompt)
            .and_then(|list| list.get_mut(index))
        {
            change(execution);
        }
    }
}

#[derive(Clone)]
struct Tap {
    engine: usize,
    upstream: String,
    client: reqwest::Client,
    executions: Executions,
}

/// Starts the tap of engine number `engine` (at `upstream`, `http://…`) on `listen`; where
/// it listens. It serves until the test's runtime ends.
pub(crate) async fn start(
    engine: usize,
    upstream: String,
    listen: SocketAddr,
    executions: Executions,
) -> SocketAddr {
    let tap = Tap {
        engine,
        upstream,
        client: crate::common::http_client(),
        executions,
    };
    let app = Router::new().fallback(pass).with_state(tap);
    let listener = tokio::net::TcpListener::bind(listen)
        .await
        .unwrap_or_else(|e| panic!("the tap cannot listen on {listen}: {e}"));
    let addr = listener.local_addr().expect("the tap's address");
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    addr
}

/// The prompt of a chat request: its first message's text.
fn prompt_of(body: &Value) -> Option<String> {
    body["messages"][0]["content"].as_str().map(str::to_owned)
}

async fn pass(State(tap): State<Tap>, method: Method, uri: Uri, body: Bytes) -> Response {
    let url = format!("{}{uri}", tap.upstream);
    let json: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    let prompt = (method == Method::POST && uri.path().ends_with("/chat/completions"))
        .then(|| prompt_of(&json))
        .flatten();
    let request = tap
        .client
        .request(method, &url)
        .header("content-type", "application/json")
        .body(body);
    let Ok(answer) = request.send().await else {
        return StatusCode::BAD_GATEWAY.into_response();
    };
    let status = answer.status();
    let Some(prompt) = prompt else {
        let bytes = answer.bytes().await.unwrap_or_default();
        return (status, bytes).into_response();
    };
    let index = tap.executions.begin(&prompt, tap.engine);
    let executions = tap.executions.clone();
    let mut pending = String::new();
    let paced = answer.bytes_stream().then(move |chunk| {
        let executions = executions.clone();
        let prompt = prompt.clone();
        if let Ok(bytes) = &chunk {
            pending.push_str(&String::from_utf8_lossy(bytes));
            while let Some(end) = pending.find("\n\n") {
                let event: String = pending.drain(..end + 2).collect();
                executions.update(&prompt, index, |e| note(e, &event));
            }
        }
        async move {
            tokio::time::sleep(PACE).await;
            chunk
        }
    });
    Response::builder()
        .status(status)
        .header("content-type", "text/event-stream")
        .body(Body::from_stream(paced))
        .unwrap_or_else(|_| StatusCode::INTERNAL_SERVER_ERROR.into_response())
}

/// Notes what one SSE event of the engine's answer says.
fn note(execution: &mut Execution, event: &str) {
    for data in event.lines().filter_map(|l| l.strip_prefix("data: ")) {
        if data.trim() == "[DONE]" {
            execution.finished = true;
            continue;
        }
        let Ok(json) = serde_json::from_str::<Value>(data) else {
            continue;
        };
        if let Some(text) = json["choices"][0]["delta"]["content"].as_str() {
            execution.text.push_str(text);
        }
        if let Some(usage) = json.get("usage").filter(|u| u.is_object()) {
            execution.input_tokens = usage["prompt_tokens"].as_u64().unwrap_or(0);
            execution.output_tokens = usage["completion_tokens"].as_u64().unwrap_or(0);
        }
    }
}
