//! Churn: mock nodes that drop their connection at random and come back a little later
//! while streamed chat requests run a few at a time, and how every request ended as its
//! client saw it.
//!
//! Shared by `tests/it/routing.rs`, which asserts that no request ends `404` and each ends
//! complete or with a 5xx or a stream error, and by `loadgen churn`, which reports the shares
//! (`docs/benchmarks.md`, "Routing under churn"). It only drives and observes: the edge is
//! the caller's. Seeded: a seed gives every node the same schedule of stays and absences.

use std::net::SocketAddr;
use std::ops::Range;
use std::time::Duration;

use futures::StreamExt;
use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use crate::{MockNode, MockOptions};

/// What to run.
#[derive(Debug, Clone)]
pub struct Churn {
    /// Where the nodes connect.
    pub node_addr: SocketAddr,
    /// Where the clients send their requests.
    pub http_addr: SocketAddr,
    /// One churning node per token.
    pub tokens: Vec<String>,
    /// The model every request asks for.
    pub model: String,
    /// Requests in all.
    pub requests: usize,
    /// Requests in flight at once.
    pub concurrency: usize,
    /// Words in each answer (the prompt is echoed back word by word).
    pub words: usize,
    /// The nodes' pause between two words.
    pub word_delay: Duration,
    /// How long a node stays connected, in ms, drawn for each stay.
    pub up_ms: Range<u64>,
    /// How long a node stays away after dropping its connection, in ms.
    pub down_ms: Range<u64>,
    /// Seeds the schedules (node `i` uses `seed + i`).
    pub seed: u64,
}

/// How one request ended, as its client saw it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Ending {
    /// `200`, the whole echo, then `[DONE]`.
    Completed,
    /// An error status before any stream began, with the error's code.
    Refused {
        /// The HTTP status.
        status: u16,
        /// `error.code`.
        code: String,
    },
    /// The stream began and ended with an error chunk.
    StreamError {
        /// `error.code` of the chunk.
        code: String,
        /// Whether some of the answer came before it: the run was cut after its first output.
        after_output: bool,
    },
    /// Anything else: a dropped connection, a stream with no end, an answer that is not
    /// the echo. Never right.
    Broken(String),
}

/// One request's ending and the run it became (`x-edge-run-id`), if the edge accepted it.
#[derive(Debug, Clone)]
pub struct Answer {
    /// The run's id.
    pub run_id: Option<String>,
    /// How it ended.
    pub ending: Ending,
}

/// What a churn did.
#[derive(Debug, Clone, Default)]
pub struct Report {
    /// One per request, in no particular order.
    pub answers: Vec<Answer>,
    /// Connections the nodes dropped.
    pub drops: usize,
}

impl Report {
    /// How many requests ended as `pick` says.
    pub fn count(&self, pick: impl Fn(&Ending) -> bool) -> usize {
        self.answers.iter().filter(|a| pick(&a.ending)).count()
    }

    /// Requests answered whole.
    pub fn completed(&self) -> usize {
        self.count(|e| *e == Ending::Completed)
    }

    /// Requests whose stream carried some of the answer and then an error: runs a node cut
    /// after their first output (the ones failover cannot save).
    pub fn cut_after_output(&self) -> usize {
        self.count(|e| {
            matches!(
                e,
                Ending::StreamError {
                    after_output: true,
                    ..
                }
            )
        })
    }

    /// Requests answered with `status`.
    pub fn refused_with(&self, status: u16) -> usize {
        self.count(|e| matches!(e, Ending::Refused { status: s, .. } if *s == status))
    }
}

/// Runs `churn`: the nodes come and go until every request has ended, then drop for good.
pub async fn run(churn: &Churn) -> Report {
    let stop = CancellationToken::new();
    let nodes: Vec<_> = churn
        .tokens
        .iter()
        .zip(0..)
        .map(|(token, i)| {
            let rng = StdRng::seed_from_u64(churn.seed.wrapping_add(i));
            tokio::spawn(churn_node(churn.clone(), token.clone(), rng, stop.clone()))
        })
        .collect();
    // The reference node's builder: it works whether or not reqwest's rustls is on.
    let client = edge_node::upstream::client_builder(None)
        .expect("the system's CA certificates load")
        .timeout(Duration::from_secs(60))
        .build()
        .expect("an HTTP client");
    let url = format!("http://{}/v1/chat/completions", churn.http_addr);
    let answers = futures::stream::iter(0..churn.requests)
        .map(|i| request(&client, &url, churn, i))
        .buffer_unordered(churn.concurrency.max(1))
        .collect()
        .await;
    stop.cancel();
    let mut drops = 0;
    for node in nodes {
        drops += node.await.unwrap_or_default();
    }
    Report { answers, drops }
}

/// One node's life: register (again while the edge still holds its last connection), stay
/// for a while, drop the connection, stay away for a while; until `stop`. Returns the drops.
async fn churn_node(
    churn: Churn,
    token: String,
    mut rng: StdRng,
    stop: CancellationToken,
) -> usize {
    let options = MockOptions {
        delay: churn.word_delay,
        ..MockOptions::new(&token)
    };
    let mut drops = 0;
    loop {
        let node = loop {
            if stop.is_cancelled() {
                return drops;
            }
            match MockNode::start(churn.node_addr, options.clone()).await {
                Ok(node) => break node,
                Err(_) => tokio::time::sleep(Duration::from_millis(10)).await,
            }
        };
        let up = Duration::from_millis(rng.random_range(churn.up_ms.clone()));
        let stopped = tokio::select! {
            () = stop.cancelled() => true,
            () = tokio::time::sleep(up) => false,
        };
        node.kill();
        if stopped {
            return drops;
        }
        drops += 1;
        let down = Duration::from_millis(rng.random_range(churn.down_ms.clone()));
        tokio::select! {
            () = stop.cancelled() => return drops,
            () = tokio::time::sleep(down) => {}
        }
    }
}

/// Request `i`: a streamed chat completion whose answer must echo its prompt.
async fn request(client: &reqwest::Client, url: &str, churn: &Churn, i: usize) -> Answer {
    let prompt: Vec<String> = (0..churn.words).map(|w| format!("r{i}w{w}")).collect();
    let prompt = prompt.join(" ");
    let body = json!({
        "model": churn.model,
        "stream": true,
        "messages": [{"role": "user", "content": prompt}],
    });
    let response = match client.post(url).json(&body).send().await {
        Ok(response) => response,
        Err(error) => return broken(None, format!("no response: {error}")),
    };
    let run_id = response
        .headers()
        .get("x-edge-run-id")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    let status = response.status().as_u16();
    if status != 200 {
        let error: Value = response.json().await.unwrap_or(Value::Null);
        let code = error["error"]["code"]
            .as_str()
            .unwrap_or_default()
            .to_owned();
        let ending = Ending::Refused { status, code };
        return Answer { run_id, ending };
    }
    let mut stream = response.bytes_stream();
    let mut body = Vec::new();
    while let Some(piece) = stream.next().await {
        match piece {
            Ok(bytes) => body.extend_from_slice(&bytes),
            Err(error) => return broken(run_id, format!("the stream broke: {error}")),
        }
    }
    let ending = ending_of(&String::from_utf8_lossy(&body), &prompt);
    Answer { run_id, ending }
}

fn broken(run_id: Option<String>, why: String) -> Answer {
    Answer {
        run_id,
        ending: Ending::Broken(why),
    }
}

/// How a chat chunk stream (`data:` lines) that should echo `prompt` ended.
fn ending_of(body: &str, prompt: &str) -> Ending {
    let mut content = String::new();
    let mut done = false;
    for data in body.lines().filter_map(|l| l.strip_prefix("data: ")) {
        if data == "[DONE]" {
            done = true;
            continue;
        }
        let chunk: Value = match serde_json::from_str(data) {
            Ok(chunk) => chunk,
            Err(error) => return Ending::Broken(format!("a chunk is not JSON ({error}): {data}")),
        };
        if let Some(code) = chunk["error"]["code"].as_str() {
            return Ending::StreamError {
                code: code.to_owned(),
                after_output: !content.is_empty(),
            };
        }
        if let Some(text) = chunk["choices"][0]["delta"]["content"].as_str() {
            content.push_str(text);
        }
    }
    if done && content == prompt {
        Ending::Completed
    } else {
        Ending::Broken(format!("done: {done}, content {content:?}"))
    }
}
