//! vLLM servers in sleep mode (`lifecycle = "vllm"`): one server per target
//! (`base_url.<target>`), each loaded by waking it and unloaded by putting it to sleep.
//!
//! What the node uses of each server: `GET {base}/models` (its model and `max_model_len`,
//! the window, asleep or not) and, below its root, the development routes of
//! `VLLM_SERVER_DEV_MODE=1` with `--enable-sleep-mode`: `GET /is_sleeping`,
//! `POST /sleep?level=1&mode=wait` and `POST /wake_up`.
//!
//! - **An asleep server is not loaded.** A request reaching it is finished at once with
//!   `finish_reason: "abort"` and no text, so it is reported [`LoadState::Asleep`]: never
//!   served, holding none of the capacity, loadable by waking.
//! - **Sleep waits.** `mode=wait` lets the requests in flight finish first; vLLM's default
//!   (`abort`) would cut them, so it is never used.
//! - **Wake, then make sure.** `/wake_up` may answer before the weights are back, so
//!   `/is_sleeping` is polled until `false`, then one 1-token request is sent (after a wake
//!   only, never as a probe) before the target is reported loaded.
//! - **Never more awake than `capacity`.** A wake is refused while as many servers as
//!   `capacity` are awake (the edge puts one to sleep first); waking one more would run the
//!   GPUs out of memory.
//! - **Each server on its own.** A server that cannot be reached makes only its target
//!   unavailable; a target marked `never_sleep.<target>` (a pooling model, which sleep frees
//!   little of) is never put to sleep.

use std::collections::BTreeMap;
use std::time::Duration;

use edge::domain::models::{LoadState, ModelAction};
use serde_json::{Value, json};

use super::{BeginError, Catalogue, EngineModel, refusal};
use crate::fault::UpstreamFault;
use crate::upstream::{Upstream, same_model};

/// The most of an answer read (sleep, wake and the warm-up are small).
const MAX_ANSWER: usize = 64 * 1024;

/// How often a wake asks whether the server is still asleep.
const WAKE_POLL: Duration = Duration::from_millis(10);

/// One target's server.
#[derive(Debug)]
pub struct Server {
    /// The target it serves.
    pub target: String,
    /// Where it is.
    pub upstream: Upstream,
    /// Marked never to sleep.
    pub never_sleep: bool,
}

/// A node's vLLM servers, by the model id each serves.
#[derive(Debug)]
pub struct Vllm {
    servers: BTreeMap<String, Server>,
    /// How many may be awake at once.
    capacity: u32,
    /// How long a sleep may take (`load_timeout_ms`): the call is held open that long.
    load_timeout: Duration,
}

impl Vllm {
    /// `servers` by model id, of which at most `capacity` may be awake at once.
    pub fn new(servers: BTreeMap<String, Server>, capacity: u32, load_timeout: Duration) -> Self {
        Self {
            servers,
            capacity,
            load_timeout,
        }
    }

    /// Every server's model with its state and window; a server that cannot be reached is
    /// left out (its target is unavailable), one that cannot sleep is refused.
    ///
    /// # Errors
    /// The first fault when no server can be reached.
    pub async fn catalogue(&self) -> Result<Catalogue, UpstreamFault> {
        let mut catalogue = Catalogue::default();
        let mut first_fault = None;
        for (id, server) in &self.servers {
            match observe(id, &server.upstream).await {
                Ok(Observed::Serving(model)) => {
                    catalogue.models.insert(id.clone(), model);
                }
                Ok(Observed::Refused(reason)) => {
                    catalogue.refused.insert(id.clone(), reason);
                }
                Err(fault) => {
                    catalogue.unreachable.insert(id.clone(), fault.to_string());
                    first_fault.get_or_insert(fault);
                }
            }
        }
        match first_fault {
            Some(fault) if catalogue.unreachable.len() == self.servers.len() => Err(fault),
            _ => Ok(catalogue),
        }
    }

    /// Wakes `id`'s server (when at most `capacity - 1` others are awake), waits until it
    /// says it is awake and warms it with one 1-token request; or puts it to sleep, letting
    /// its requests in flight finish.
    ///
    /// # Errors
    /// [`BeginError::Full`] when as many servers as `capacity` are awake,
    /// [`BeginError::NeverSleeps`] for a target marked never to sleep,
    /// [`BeginError::NotAwake`] when the warm-up is aborted, the server's refusal or why it
    /// could not be asked.
    pub async fn begin(&self, action: ModelAction, id: &str) -> Result<(), BeginError> {
        let Some(server) = self.servers.get(id) else {
            return Err(BeginError::Refused {
                status: 404,
                message: format!("no vLLM server serves {id} (set `base_url.<target>`)"),
            });
        };
        match action {
            ModelAction::Load => self.wake(id, server).await,
            ModelAction::Unload if server.never_sleep => Err(BeginError::NeverSleeps {
                target: server.target.clone(),
            }),
            ModelAction::Unload => {
                let path = "/sleep?level=1&mode=wait";
                let answer = server
                    .upstream
                    .post_root_within(path, &json!({}), self.load_timeout)
                    .await;
                read_answer(&server.upstream, answer).await.map(drop)
            }
        }
    }

    async fn wake(&self, id: &str, server: &Server) -> Result<(), BeginError> {
        if !is_sleeping(&server.upstream).await? {
            return Ok(());
        }
        let mut awake = Vec::new();
        for (other, them) in &self.servers {
            if other != id && matches!(is_sleeping(&them.upstream).await, Ok(false)) {
                awake.push(them.target.clone());
            }
        }
        if u32::try_from(awake.len()).unwrap_or(u32::MAX) >= self.capacity {
            return Err(BeginError::Full {
                awake,
                capacity: self.capacity,
            });
        }
        let woken = server.upstream.post_root("/wake_up", &json!({})).await;
        read_answer(&server.upstream, woken).await?;
        // The answer may come before the weights are back.
        while is_sleeping(&server.upstream).await? {
            tokio::time::sleep(WAKE_POLL).await;
        }
        let warm = json!({"model": id, "prompt": "Hi", "max_tokens": 1});
        let answer = server.upstream.post("/completions", &warm).await;
        let body = match read_answer(&server.upstream, answer).await {
            Ok(body) => body,
            // A pooling model has no completions: it answered, so it is awake.
            Err(BeginError::Refused { status, .. }) if (400..500).contains(&status) => {
                return Ok(());
            }
            Err(error) => return Err(error),
        };
        match finish_reason(&body).as_deref() {
            Some("abort") => Err(BeginError::NotAwake {
                target: server.target.clone(),
            }),
            _ => Ok(()),
        }
    }
}

/// What one server said when observed.
enum Observed {
    /// It serves the model, asleep or awake.
    Serving(EngineModel),
    /// It cannot be managed, saying why.
    Refused(String),
}

/// Asks `upstream` what it serves and whether it sleeps.
async fn observe(id: &str, upstream: &Upstream) -> Result<Observed, UpstreamFault> {
    let list = upstream.models().await?;
    if !list.ids.iter().any(|listed| same_model(listed, id)) {
        return Ok(Observed::Refused(format!(
            "the vLLM server for {id} serves {:?}, not {id}: set `model.<target>` to its \
             --served-model-name",
            list.ids
        )));
    }
    let sleeping = match is_sleeping(upstream).await {
        Ok(sleeping) => sleeping,
        Err(BeginError::Refused { status: 404, .. }) => {
            return Ok(Observed::Refused(format!(
                "the vLLM server for {id} has no /is_sleeping: start it with \
                 VLLM_SERVER_DEV_MODE=1 and --enable-sleep-mode"
            )));
        }
        Err(BeginError::Fault(fault)) => return Err(fault),
        Err(other) => return Err(UpstreamFault::Malformed(other.to_string())),
    };
    let state = if sleeping {
        LoadState::Asleep
    } else {
        LoadState::Loaded
    };
    let window = list.windows.get(id).copied().or_else(|| {
        list.windows
            .iter()
            .find(|(listed, _)| same_model(listed, id))
            .map(|(_, window)| *window)
    });
    Ok(Observed::Serving(EngineModel::new(state, window)))
}

/// `GET /is_sleeping`'s answer.
async fn is_sleeping(upstream: &Upstream) -> Result<bool, BeginError> {
    let body = match upstream.get_root("/is_sleeping").await {
        Ok(body) => body,
        Err(UpstreamFault::Status { status, body }) => return Err(refusal(status, &body)),
        Err(fault) => return Err(fault.into()),
    };
    sleeping_of(&body).map_err(BeginError::from)
}

/// The `is_sleeping` of `GET /is_sleeping`'s body.
///
/// # Errors
/// [`UpstreamFault::Malformed`] when it is not `{"is_sleeping": bool}`.
pub fn sleeping_of(body: &[u8]) -> Result<bool, UpstreamFault> {
    let answer: Value = serde_json::from_slice(body).unwrap_or(Value::Null);
    answer["is_sleeping"].as_bool().ok_or_else(|| {
        UpstreamFault::Malformed(format!(
            "/is_sleeping answered {}",
            String::from_utf8_lossy(body)
        ))
    })
}

/// The first choice's `finish_reason` of a whole answer.
fn finish_reason(body: &[u8]) -> Option<String> {
    let answer: Value = serde_json::from_slice(body).ok()?;
    answer
        .pointer("/choices/0/finish_reason")
        .and_then(Value::as_str)
        .map(str::to_owned)
}

/// The whole body of `answer`, or the server's refusal.
async fn read_answer(
    upstream: &Upstream,
    answer: Result<reqwest::Response, UpstreamFault>,
) -> Result<Vec<u8>, BeginError> {
    match answer {
        Ok(mut response) => Ok(upstream.read_to_end(&mut response, MAX_ANSWER).await?),
        Err(UpstreamFault::Status { status, body }) => Err(refusal(status, &body)),
        Err(fault) => Err(fault.into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn is_sleeping_is_read_from_its_answer() {
        assert!(sleeping_of(br#"{"is_sleeping": true}"#).expect("an answer"));
        assert!(!sleeping_of(br#"{"is_sleeping": false}"#).expect("an answer"));
        assert!(sleeping_of(b"{}").is_err());
    }

    #[test]
    fn an_aborted_answer_is_told_by_its_finish_reason() {
        let aborted = br#"{"choices":[{"index":0,"text":"","finish_reason":"abort"}]}"#;
        assert_eq!(finish_reason(aborted).as_deref(), Some("abort"));
        assert_eq!(finish_reason(b"{}"), None);
    }
}
