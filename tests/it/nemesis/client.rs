//! Clients as the SDKs behave, through the balancer: each operation is a streamed chat
//! completion, resumable (`x-edge-resumable: true`). No answer or a 503: asked again after a
//! backoff (a new attempt, its prompt naming it, so the engines' counts tell attempts apart).
//! Headers: the run is accepted; its stream is read to `[DONE]`, and when it breaks or goes
//! silent it is resumed with `Last-Event-ID` at `GET /v1/runs/{id}/stream`, again through the
//! balancer, until it ends or the client's patience runs out. What happened is one [`Op`].

use std::time::Duration;

use serde_json::{Value, json};
use tokio::time::Instant;

use super::history::{Attempt, Op, Outcome};

/// How long a client waits for headers, and for the next bytes of a stream, before it takes
/// the connection as dead.
const SILENCE: Duration = Duration::from_secs(6);
/// How long an accepted run may go without any event before its client gives up.
const PATIENCE: Duration = Duration::from_secs(120);

/// One client: its number, the key it calls with, the balancer's address, when it started.
pub(crate) struct Client {
    pub(crate) n: usize,
    pub(crate) key: &'static str,
    pub(crate) base: String,
    pub(crate) seed: u64,
    pub(crate) epoch: Instant,
    pub(crate) http: reqwest::Client,
}

/// What a stream's reading left: the events' ids in order, the text, and how it ended.
#[derive(Default)]
struct Read {
    /// Each event's id as (position, part), and the last id as sent.
    ids: Vec<(u64, u32)>,
    last: Option<String>,
    text: String,
    done: bool,
    error: Option<String>,
}

impl Read {
    /// Takes in the complete events of `text` (`id:` and `data:` lines).
    fn events(&mut self, text: &str) {
        for event in text.split("\n\n") {
            let mut id = None;
            for line in event.lines() {
                if let Some(value) = line.strip_prefix("id: ") {
                    let value = value.trim();
                    let (position, part) = value.split_once('.').unwrap_or((value, "0"));
                    id = position.parse().ok().zip(part.parse().ok());
                    self.last = Some(value.to_owned());
                } else if let Some(data) = line.strip_prefix("data: ") {
                    self.data(data);
                }
            }
            self.ids.extend(id);
        }
    }

    fn data(&mut self, data: &str) {
        if data.trim() == "[DONE]" {
            self.done = true;
            return;
        }
        let Ok(json) = serde_json::from_str::<Value>(data) else {
            return;
        };
        if let Some(error) = json.get("error") {
            let code = error["code"].as_str().or(error["type"].as_str());
            self.error = Some(code.unwrap_or("error").to_owned());
        }
        if let Some(text) = json["choices"][0]["delta"]["content"].as_str() {
            self.text.push_str(text);
        }
    }

    fn last_id(&self) -> Option<String> {
        self.last.clone()
    }
}

impl Client {
    fn ms(&self) -> u64 {
        u64::try_from(self.epoch.elapsed().as_millis()).unwrap_or(u64::MAX)
    }

    /// Operation `op`, asked until it ends (or the client's patience runs out).
    pub(crate) async fn operate(&self, op: u64) -> Op {
        let start_ms = self.ms();
        let mut record = Op {
            op,
            client: self.n,
            key: self.key.to_owned(),
            start_ms,
            end_ms: start_ms,
            attempts: Vec::new(),
            outcome: Outcome::Abandoned {
                why: "never asked".into(),
            },
            resumes: 0,
            disordered: false,
        };
        let mut backoff = Duration::from_millis(50);
        let given_up = Instant::now() + PATIENCE;
        let response = loop {
            let prompt = format!(
                "nemesis {} op {op} attempt {}",
                self.seed,
                record.attempts.len()
            );
            match self.ask(&prompt).await {
                Ok(response) if response.status().is_success() => {
                    let run_id = response
                        .headers()
                        .get("x-edge-run-id")
                        .and_then(|v| v.to_str().ok())
                        .unwrap_or_default()
                        .to_owned();
                    record.attempts.push(Attempt::Accepted { prompt, run_id });
                    break response;
                }
                Ok(response) => {
                    let status = response.status().as_u16();
                    record.attempts.push(Attempt::Refused { prompt, status });
                    if status != 503 {
                        record.outcome = Outcome::Rejected { status };
                        record.end_ms = self.ms();
                        return record;
                    }
                }
                Err(()) => record.attempts.push(Attempt::NoAnswer { prompt }),
            }
            if Instant::now() > given_up {
                record.outcome = Outcome::Abandoned {
                    why: "never accepted".into(),
                };
                record.end_ms = self.ms();
                return record;
            }
            tokio::time::sleep(backoff).await;
            backoff = (backoff * 2).min(Duration::from_secs(1));
        };
        let run_id = record.run_id().unwrap_or_default().to_owned();
        let mut read = Read::default();
        stream(response, &mut read).await;
        record.outcome = self.resume(&run_id, &mut read, &mut record.resumes).await;
        record.disordered = !read.ids.is_sorted_by(|a, b| a < b);
        record.end_ms = self.ms();
        record
    }

    async fn ask(&self, prompt: &str) -> Result<reqwest::Response, ()> {
        let body = json!({
            "model": "llama/tiny", "stream": true, "max_tokens": 16,
            "messages": [{"role": "user", "content": prompt}],
        });
        let request = self
            .http
            .post(format!("{}/v1/chat/completions", self.base))
            .header("authorization", format!("Bearer {}", self.key))
            .header("x-edge-resumable", "true")
            .json(&body);
        match tokio::time::timeout(SILENCE, request.send()).await {
            Ok(Ok(response)) => Ok(response),
            _ => Err(()),
        }
    }

    /// Resumes run `run_id` until its stream ends (or no event came for [`PATIENCE`]).
    async fn resume(&self, run_id: &str, read: &mut Read, resumes: &mut u32) -> Outcome {
        let mut backoff = Duration::from_millis(50);
        let mut progress = Instant::now();
        // What the last resume that got nowhere was answered, for the history.
        let mut last_answer = String::from("none asked");
        loop {
            if let Some(code) = read.error.clone() {
                return Outcome::Failed { code };
            }
            if read.done {
                return Outcome::Completed {
                    text: read.text.clone(),
                };
            }
            if progress.elapsed() > PATIENCE {
                return Outcome::Abandoned {
                    why: format!(
                        "no event for {PATIENCE:?} after event {:?}; the last resume: {last_answer}",
                        read.last_id()
                    ),
                };
            }
            let mut request = self
                .http
                .get(format!("{}/v1/runs/{run_id}/stream", self.base))
                .header("authorization", format!("Bearer {}", self.key));
            if let Some(last) = read.last_id() {
                request = request.header("last-event-id", last);
            }
            match tokio::time::timeout(SILENCE, request.send()).await {
                Ok(Ok(response)) if response.status().is_success() => {
                    *resumes += 1;
                    let before = read.ids.len();
                    stream(response, read).await;
                    if read.ids.len() > before {
                        progress = Instant::now();
                        backoff = Duration::from_millis(50);
                    } else {
                        last_answer = "a stream with no new event".into();
                    }
                    continue;
                }
                Ok(Ok(response)) if response.status().as_u16() == 404 => {
                    return Outcome::Failed {
                        code: "not_found".into(),
                    };
                }
                Ok(Ok(response)) => last_answer = format!("status {}", response.status()),
                Ok(Err(error)) => last_answer = format!("no answer: {error}"),
                Err(_) => last_answer = format!("no headers within {SILENCE:?}"),
            }
            tokio::time::sleep(backoff).await;
            backoff = (backoff * 2).min(Duration::from_secs(1));
        }
    }
}

/// Reads `response`'s events into `read` until the stream ends, breaks or goes silent for
/// [`SILENCE`].
async fn stream(mut response: reqwest::Response, read: &mut Read) {
    let mut pending = String::new();
    loop {
        match tokio::time::timeout(SILENCE, response.chunk()).await {
            Ok(Ok(Some(bytes))) => {
                pending.push_str(&String::from_utf8_lossy(&bytes));
                if let Some(end) = pending.rfind("\n\n") {
                    let complete: String = pending.drain(..end + 2).collect();
                    read.events(&complete);
                }
            }
            _ => return,
        }
    }
}
