//! Fake vLLM servers sharing a fake GPU, faithful to vLLM's own code where sleep mode meets
//! the model lifecycle, with the traps the edge must not fall into, and a record of
//! everything done to them.
//!
//! vLLM's sleep mode needs CUDA (`vllm/config/model.py`: "only cuda and hip platforms are
//! supported"), which this machine has not, so the tests cannot run the real one; this fake
//! follows its source instead (vllm-project/vllm, read for issue 62). Each behaviour below
//! names where it comes from:
//!
//! - **The routes** exist only with `VLLM_SERVER_DEV_MODE=1`
//!   (`vllm/entrypoints/serve/sleep/api_router.py`, `attach_router`: `if not
//!   envs.VLLM_SERVER_DEV_MODE: return`): `POST /sleep`, `POST /wake_up`, `GET /is_sleeping`
//!   (`{"is_sleeping": bool}`).
//! - **`/sleep`'s defaults** (same file: `level = ...get("level", "1")`, `mode =
//!   ...get("mode", "abort")`): **the default mode aborts the requests in flight**
//!   (`vllm/v1/engine/__init__.py` `PauseMode`: "abort": abort all in-flight requests
//!   immediately (default); "wait": wait for in-flight requests to complete before pausing;
//!   `vllm/v1/engine/core.py` `pause_scheduler`: `finish_requests(None, FINISHED_ABORTED)`).
//!   An aborted request ends with `finish_reason: "abort"` (`FINISH_REASON_STRINGS`).
//! - **`/wake_up` answers before the model is ready** (the same router, older versions:
//!   "FIXME: in v0 with frontend multiprocessing, the wake-up command is sent but does not
//!   finish yet when we return a response"): `/is_sleeping` stays `true` until the weights
//!   are back.
//! - **A request to a server that is not awake** is answered `200` with `finish_reason:
//!   "abort"` and no text — not an HTTP error (issue 62's observation of a paused,
//!   sleeping engine; the scheduler's paused state finishes what it cannot run as
//!   `FINISHED_ABORTED`).
//! - **Waking takes GPU memory back** (`vllm/device_allocator/cumem.py`
//!   `CuMemAllocator.wake_up`: `create_and_map` for every allocation): with the GPU already
//!   holding as many awake servers as it has room for, the wake fails — the fake records
//!   **an out-of-memory failure** and the server stays asleep.
//! - **The catalogue** (`vllm/entrypoints/openai/models/serving.py`
//!   `show_available_models`): `/v1/models` lists the served model name with its
//!   `max_model_len`, asleep or not (it reads the model config, not the GPU), then each
//!   registered LoRA as a model of its own: `id` its name, `root` its path, `parent` the
//!   served model name, no `max_model_len`.
//! - **LoRAs registered at run time** exist only with `VLLM_ALLOW_RUNTIME_LORA_UPDATING`
//!   (`vllm/entrypoints/serve/lora/api_router.py`, `attach_router`: without it, no route):
//!   `POST /v1/load_lora_adapter {"lora_name", "lora_path"}` answers 200 with a line of text
//!   (`"Success: LoRA adapter 'sql' added successfully."`); both fields are required (400,
//!   `InvalidUserInput`); a name already registered is a 400 ("has already been loaded. If
//!   you want to load the adapter in place, set 'load_inplace' to True."); a path that holds
//!   no adapter fails the engine's `add_lora` (404, `LoRAAdapterNotFoundError`). `POST
//!   /v1/unload_lora_adapter {"lora_name"}`: 200, or 404 ("cannot be found") for a name not
//!   registered — **and it unregisters a LoRA whose requests are still running**
//!   (`unload_lora_adapter` checks only that the name is registered), which the fake records
//!   with the requests in flight. A request names a LoRA by its `model`
//!   (`serving.py` `_check_model`, `_maybe_get_adapters`); a name not registered is the
//!   404 "The model `x` does not exist." The fake's answer through a LoRA ends with the
//!   LoRA's name, so a test sees which one answered.
//!
//! What the record holds ([`VllmEvent`], shared by every server of one [`Gpu`]) is the
//! ground truth the tests assert on.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use axum::Router;
use axum::extract::{Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde_json::{Value, json};
use tokio::sync::Notify;

use super::fake_serve::{Listening, frame, sse, unix_now};

/// One thing that happened to a server of the GPU.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum VllmEvent {
    /// `POST /sleep`, with the level and mode it ran with (vLLM's defaults filled in).
    Sleep {
        /// The server (its served model name).
        server: String,
        /// `level`.
        level: String,
        /// `mode`.
        mode: String,
    },
    /// Its GPU memory is released: it is asleep.
    Asleep {
        /// The server.
        server: String,
    },
    /// `POST /wake_up`.
    WakeUp {
        /// The server.
        server: String,
    },
    /// Its wake finished: `/is_sleeping` is `false`.
    Awake {
        /// The server.
        server: String,
    },
    /// A wake found no room on the GPU.
    OutOfMemory {
        /// The server that tried to wake.
        server: String,
        /// The servers awake at the time.
        awake: Vec<String>,
    },
    /// A request in flight was ended by a sleep in mode `abort`.
    AbortedInFlight {
        /// The server.
        server: String,
    },
    /// A request reached a server that was not awake: answered with `finish_reason:
    /// "abort"` and no text.
    AbortedAsleep {
        /// The server.
        server: String,
    },
    /// A request began on an awake server.
    Request {
        /// The server.
        server: String,
        /// The model it named: the served model, or a registered LoRA.
        model: String,
        /// Its `max_tokens`.
        max_tokens: Option<u64>,
        /// The path (`/v1/chat/completions`, `/v1/completions`).
        path: String,
    },
    /// `POST /v1/load_lora_adapter` registered a LoRA.
    LoraLoaded {
        /// The server.
        server: String,
        /// The LoRA's name.
        lora: String,
        /// The path it was registered from.
        path: String,
    },
    /// `POST /v1/unload_lora_adapter` unregistered a LoRA.
    LoraUnloaded {
        /// The server.
        server: String,
        /// The LoRA's name.
        lora: String,
        /// Its requests still running at that moment (vLLM lets them be).
        in_flight: u32,
    },
    /// A request was answered to its end.
    Answered {
        /// The server.
        server: String,
    },
}

#[derive(Debug, Default)]
struct GpuState {
    awake: BTreeSet<String>,
    most_awake: usize,
    events: Vec<(Instant, VllmEvent)>,
}

/// The GPUs of one node, shared by its vLLM servers: room for `capacity` awake servers.
#[derive(Debug)]
pub struct Gpu {
    capacity: usize,
    state: Mutex<GpuState>,
}

impl Gpu {
    /// GPUs with room for `capacity` awake servers.
    pub fn new(capacity: usize) -> Arc<Self> {
        Arc::new(Self {
            capacity,
            state: Mutex::new(GpuState::default()),
        })
    }

    fn lock(&self) -> MutexGuard<'_, GpuState> {
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn record(&self, event: VllmEvent) {
        self.lock().events.push((Instant::now(), event));
    }

    /// Everything that happened to its servers so far, in order.
    pub fn events(&self) -> Vec<VllmEvent> {
        self.lock().events.iter().map(|(_, e)| e.clone()).collect()
    }

    /// Everything that happened so far, in order, each with when.
    pub fn timeline(&self) -> Vec<(Instant, VllmEvent)> {
        self.lock().events.clone()
    }

    /// The servers awake now.
    pub fn awake(&self) -> Vec<String> {
        self.lock().awake.iter().cloned().collect()
    }

    /// The most servers ever awake at once.
    pub fn most_awake(&self) -> usize {
        self.lock().most_awake
    }

    /// The out-of-memory failures so far.
    pub fn out_of_memory(&self) -> Vec<VllmEvent> {
        self.events()
            .into_iter()
            .filter(|e| matches!(e, VllmEvent::OutOfMemory { .. }))
            .collect()
    }
}

/// How one fake vLLM server runs.
#[derive(Debug, Clone)]
pub struct VllmOptions {
    /// `--served-model-name`.
    pub name: String,
    /// `--max-model-len`.
    pub max_model_len: u32,
    /// Started asleep (the operator slept it, or the node did before a restart).
    pub asleep: bool,
    /// How long a wake takes after `/wake_up` has answered.
    pub wake_time: Duration,
    /// How long a sleep takes once nothing runs.
    pub sleep_time: Duration,
    /// The answer's pieces, one per chunk.
    pub reply: Vec<String>,
    /// The pause before each chunk.
    pub chunk_delay: Duration,
    /// `VLLM_ALLOW_RUNTIME_LORA_UPDATING=True`: the LoRA routes exist.
    pub runtime_loras: bool,
}

impl VllmOptions {
    /// A server of `name`, awake, with a window of 8,192 tokens, waking in 200 ms.
    pub fn new(name: &str) -> Self {
        Self {
            name: name.to_owned(),
            max_model_len: 8_192,
            asleep: false,
            wake_time: Duration::from_millis(200),
            sleep_time: Duration::from_millis(20),
            reply: vec!["Hello".into(), " from".into(), format!(" {name}.")],
            chunk_delay: Duration::ZERO,
            runtime_loras: false,
        }
    }

    /// This server, with LoRAs registered at run time (the LoRA routes).
    #[must_use]
    pub fn runtime_loras(mut self) -> Self {
        self.runtime_loras = true;
        self
    }

    /// This server, started asleep.
    #[must_use]
    pub fn asleep(mut self) -> Self {
        self.asleep = true;
        self
    }

    /// This server, answering `pieces` chunks `delay` apart.
    #[must_use]
    pub fn paced(mut self, pieces: usize, delay: Duration) -> Self {
        self.reply = (0..pieces).map(|i| format!(" w{i}")).collect();
        self.chunk_delay = delay;
        self
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    Awake,
    /// A sleep was asked: new requests are not run; in-flight ones end (abort) or finish
    /// (wait).
    FallingAsleep,
    Asleep,
    /// `/wake_up` answered; the weights are coming back.
    Waking,
}

#[derive(Debug)]
struct ServerState {
    phase: Phase,
    in_flight: u32,
    /// Bumped by a sleep in mode `abort`: the requests in flight end.
    aborts: u64,
    /// The LoRAs registered, by name: the path each came from and its requests in flight.
    loras: std::collections::BTreeMap<String, (String, u32)>,
    /// The most LoRAs ever registered at once.
    most_loras: usize,
}

#[derive(Debug)]
struct Server {
    options: VllmOptions,
    gpu: Arc<Gpu>,
    state: Mutex<ServerState>,
    changed: Notify,
}

impl Server {
    fn lock(&self) -> MutexGuard<'_, ServerState> {
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn name(&self) -> String {
        self.options.name.clone()
    }
}

/// One fake vLLM server (one model), listening on a port of its own.
pub struct FakeVllm {
    server: Arc<Server>,
    listening: Listening,
}

impl FakeVllm {
    /// Starts a server on `gpu`; awake unless `options.asleep`, in which case it takes no
    /// room. Panics if an awake start finds the GPU full (a test's mistake).
    pub async fn start(gpu: &Arc<Gpu>, options: VllmOptions) -> Self {
        let phase = if options.asleep {
            Phase::Asleep
        } else {
            let mut state = gpu.lock();
            assert!(
                state.awake.len() < gpu.capacity,
                "the fake GPU has no room to start {} awake",
                options.name
            );
            state.awake.insert(options.name.clone());
            state.most_awake = state.most_awake.max(state.awake.len());
            Phase::Awake
        };
        let server = Arc::new(Server {
            options,
            gpu: Arc::clone(gpu),
            state: Mutex::new(ServerState {
                phase,
                in_flight: 0,
                aborts: 0,
                loras: std::collections::BTreeMap::new(),
                most_loras: 0,
            }),
            changed: Notify::new(),
        });
        let mut app = Router::new();
        if server.options.runtime_loras {
            app = app
                .route("/v1/load_lora_adapter", post(load_lora))
                .route("/v1/unload_lora_adapter", post(unload_lora));
        }
        let app = app
            .route("/v1/models", get(models))
            .route("/health", get(health))
            .route("/sleep", post(sleep))
            .route("/wake_up", post(wake_up))
            .route("/is_sleeping", get(is_sleeping))
            .route("/v1/chat/completions", post(chat))
            .route("/v1/completions", post(completions))
            .with_state(Arc::clone(&server));
        let listening = Listening::start(app).await;
        Self { server, listening }
    }

    /// `http://ADDR/v1`, the target's `base_url.<target>`.
    pub fn base_url(&self) -> String {
        format!("http://{}/v1", self.listening.addr)
    }

    /// `http://ADDR`, its root (where the sleep routes are).
    pub fn root(&self) -> String {
        format!("http://{}", self.listening.addr)
    }

    /// Whether it is asleep (or not yet awake) now.
    pub fn is_sleeping(&self) -> bool {
        self.server.lock().phase != Phase::Awake
    }

    /// The LoRAs registered now, by name, with the path each came from.
    pub fn loras(&self) -> Vec<(String, String)> {
        let state = self.server.lock();
        let loras = state.loras.iter();
        loras
            .map(|(name, (path, _))| (name.clone(), path.clone()))
            .collect()
    }

    /// The most LoRAs it ever had registered at once.
    pub fn most_loras(&self) -> usize {
        self.server.lock().most_loras
    }

    /// Stops listening (this server is down).
    pub async fn down(&mut self) {
        self.listening.down().await;
    }

    /// Listens again on the same port.
    pub async fn up(&mut self) {
        self.listening.up().await;
    }
}

async fn health() -> Response {
    StatusCode::OK.into_response()
}

async fn models(State(server): State<Arc<Server>>) -> Response {
    let name = server.name();
    let card = |id: &str, root: String, parent: Value, window: Value| {
        json!({"id": id, "object": "model", "created": unix_now(), "owned_by": "vllm",
            "root": root, "parent": parent, "max_model_len": window,
            "permission": [{"id": "modelperm-0", "object": "model_permission",
                "created": unix_now(), "allow_create_engine": false, "allow_sampling": true,
                "allow_logprobs": true, "allow_search_indices": false, "allow_view": true,
                "allow_fine_tuning": false, "organization": "*", "group": null,
                "is_blocking": false}]})
    };
    let window = json!(server.options.max_model_len);
    let mut data = vec![card(&name, format!("/models/{name}"), Value::Null, window)];
    for (lora, (path, _)) in &server.lock().loras {
        data.push(card(lora, path.clone(), json!(name), Value::Null));
    }
    axum::Json(json!({"object": "list", "data": data})).into_response()
}

/// vLLM's error body (`ErrorResponse`): `{"error": {"message", "type", "param", "code"}}`.
fn lora_error(status: StatusCode, kind: &str, message: String) -> Response {
    let body = json!({"error": {"message": message, "type": kind, "param": null,
        "code": status.as_u16()}});
    (status, axum::Json(body)).into_response()
}

async fn load_lora(State(server): State<Arc<Server>>, body: axum::body::Bytes) -> Response {
    let body: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    let (Some(name), Some(path)) = (body["lora_name"].as_str(), body["lora_path"].as_str()) else {
        let message = "Both 'lora_name' and 'lora_path' must be provided.".to_owned();
        return lora_error(StatusCode::BAD_REQUEST, "InvalidUserInput", message);
    };
    let mut state = server.lock();
    if state.loras.contains_key(name) {
        let message = format!(
            "The lora adapter '{name}' has already been loaded. If you want to load the \
             adapter in place, set 'load_inplace' to True."
        );
        return lora_error(StatusCode::BAD_REQUEST, "InvalidUserInput", message);
    }
    if !std::path::Path::new(path)
        .join("adapter_config.json")
        .is_file()
    {
        let message = format!("Loading lora {name} failed: No adapter found for {path}");
        return lora_error(StatusCode::NOT_FOUND, "NotFoundError", message);
    }
    state.loras.insert(name.to_owned(), (path.to_owned(), 0));
    state.most_loras = state.most_loras.max(state.loras.len());
    drop(state);
    server.gpu.record(VllmEvent::LoraLoaded {
        server: server.name(),
        lora: name.to_owned(),
        path: path.to_owned(),
    });
    format!("Success: LoRA adapter '{name}' added successfully.").into_response()
}

async fn unload_lora(State(server): State<Arc<Server>>, body: axum::body::Bytes) -> Response {
    let body: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    let Some(name) = body["lora_name"].as_str() else {
        let message = "'lora_name' needs to be provided to unload a LoRA adapter.".to_owned();
        return lora_error(StatusCode::BAD_REQUEST, "InvalidUserInput", message);
    };
    let Some((_, in_flight)) = server.lock().loras.remove(name) else {
        let message = format!("The lora adapter '{name}' cannot be found.");
        return lora_error(StatusCode::NOT_FOUND, "NotFoundError", message);
    };
    server.gpu.record(VllmEvent::LoraUnloaded {
        server: server.name(),
        lora: name.to_owned(),
        in_flight,
    });
    format!("Success: LoRA adapter '{name}' removed successfully.").into_response()
}

async fn is_sleeping(State(server): State<Arc<Server>>) -> Response {
    let sleeping = server.lock().phase != Phase::Awake;
    axum::Json(json!({"is_sleeping": sleeping})).into_response()
}

async fn sleep(
    State(server): State<Arc<Server>>,
    Query(query): Query<std::collections::HashMap<String, String>>,
) -> Response {
    let level = query.get("level").cloned().unwrap_or_else(|| "1".into());
    let mode = query.get("mode").cloned().unwrap_or_else(|| "abort".into());
    server.gpu.record(VllmEvent::Sleep {
        server: server.name(),
        level,
        mode: mode.clone(),
    });
    if !matches!(mode.as_str(), "abort" | "wait" | "keep") {
        let message = format!("Invalid pause mode: {mode}");
        return (
            StatusCode::INTERNAL_SERVER_ERROR,
            axum::Json(json!({"error": message})),
        )
            .into_response();
    }
    {
        let mut state = server.lock();
        match state.phase {
            Phase::Asleep | Phase::FallingAsleep => return StatusCode::OK.into_response(),
            Phase::Awake | Phase::Waking => {}
        }
        state.phase = Phase::FallingAsleep;
        if mode == "abort" {
            state.aborts += 1;
        }
    }
    server.changed.notify_waiters();
    // Both modes wait for the requests in flight to be gone (aborted, or finished).
    loop {
        let changed = server.changed.notified();
        tokio::pin!(changed);
        changed.as_mut().enable();
        if server.lock().in_flight == 0 {
            break;
        }
        changed.await;
    }
    tokio::time::sleep(server.options.sleep_time).await;
    server.lock().phase = Phase::Asleep;
    {
        let mut gpu = server.gpu.lock();
        gpu.awake.remove(&server.options.name);
        gpu.events.push((
            Instant::now(),
            VllmEvent::Asleep {
                server: server.name(),
            },
        ));
    }
    StatusCode::OK.into_response()
}

async fn wake_up(State(server): State<Arc<Server>>) -> Response {
    server.gpu.record(VllmEvent::WakeUp {
        server: server.name(),
    });
    let asleep = {
        let mut state = server.lock();
        let asleep = state.phase == Phase::Asleep;
        if asleep {
            state.phase = Phase::Waking;
        }
        asleep
    };
    if asleep {
        // The answer goes before the work is done.
        let server = Arc::clone(&server);
        tokio::spawn(async move {
            let fits = {
                let mut gpu = server.gpu.lock();
                if gpu.awake.len() >= server.gpu.capacity {
                    let awake = gpu.awake.iter().cloned().collect();
                    gpu.events.push((
                        Instant::now(),
                        VllmEvent::OutOfMemory {
                            server: server.name(),
                            awake,
                        },
                    ));
                    false
                } else {
                    gpu.awake.insert(server.name());
                    gpu.most_awake = gpu.most_awake.max(gpu.awake.len());
                    true
                }
            };
            if !fits {
                server.lock().phase = Phase::Asleep;
                return;
            }
            tokio::time::sleep(server.options.wake_time).await;
            server.lock().phase = Phase::Awake;
            server.gpu.record(VllmEvent::Awake {
                server: server.name(),
            });
        });
    }
    StatusCode::OK.into_response()
}

/// What a request asked for, read from its body.
struct Asked {
    stream: bool,
    usage: bool,
    max_tokens: Option<u64>,
}

fn not_found(model: &str) -> Response {
    let body = json!({"error": {"message": format!("The model `{model}` does not exist."),
        "type": "NotFoundError", "param": "model", "code": 404}});
    (StatusCode::NOT_FOUND, axum::Json(body)).into_response()
}

async fn chat(State(server): State<Arc<Server>>, body: axum::body::Bytes) -> Response {
    answer(server, body, "/v1/chat/completions").await
}

async fn completions(State(server): State<Arc<Server>>, body: axum::body::Bytes) -> Response {
    answer(server, body, "/v1/completions").await
}

/// Ends the request in flight when dropped (its stream ended or its client went away),
/// and its LoRA's, if it named one.
struct InFlight(Arc<Server>, Option<String>);

impl Drop for InFlight {
    fn drop(&mut self) {
        let mut state = self.0.lock();
        state.in_flight = state.in_flight.saturating_sub(1);
        if let Some((_, running)) = self.1.as_ref().and_then(|l| state.loras.get_mut(l)) {
            *running = running.saturating_sub(1);
        }
        drop(state);
        self.0.changed.notify_waiters();
    }
}

async fn answer(server: Arc<Server>, body: axum::body::Bytes, path: &str) -> Response {
    let body: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    let model = body["model"].as_str().unwrap_or("");
    let lora = (model != server.options.name).then(|| model.to_owned());
    if lora
        .as_ref()
        .is_some_and(|lora| !server.lock().loras.contains_key(lora))
    {
        return not_found(model);
    }
    let chat = path == "/v1/chat/completions";
    let asked = Asked {
        stream: body["stream"].as_bool().unwrap_or(false),
        usage: body.pointer("/stream_options/include_usage") == Some(&json!(true)),
        max_tokens: body["max_tokens"].as_u64(),
    };
    let (awake, aborts) = {
        let mut state = server.lock();
        let awake = state.phase == Phase::Awake;
        if awake {
            state.in_flight += 1;
            if let Some((_, running)) = lora.as_ref().and_then(|l| state.loras.get_mut(l)) {
                *running += 1;
            }
        }
        (awake, state.aborts)
    };
    if !awake {
        server.gpu.record(VllmEvent::AbortedAsleep {
            server: server.name(),
        });
        return respond(&server, &asked, chat, Vec::new(), "abort", None).await;
    }
    let in_flight = InFlight(Arc::clone(&server), lora.clone());
    server.gpu.record(VllmEvent::Request {
        server: server.name(),
        model: model.to_owned(),
        max_tokens: asked.max_tokens,
        path: path.to_owned(),
    });
    let mut pieces = server.options.reply.clone();
    if let Some(lora) = &lora {
        pieces.push(format!(" ({lora})"));
    }
    let mut finish = "stop";
    if let Some(max) = asked.max_tokens.and_then(|m| usize::try_from(m).ok())
        && max < pieces.len()
    {
        pieces.truncate(max);
        finish = "length";
    }
    respond(
        &server,
        &asked,
        chat,
        pieces,
        finish,
        Some((in_flight, aborts)),
    )
    .await
}

/// The answer: whole, or streamed piece by piece (a sleep in mode `abort` ends a stream
/// with `finish_reason: "abort"`).
async fn respond(
    server: &Arc<Server>,
    asked: &Asked,
    chat: bool,
    pieces: Vec<String>,
    finish: &'static str,
    held: Option<(InFlight, u64)>,
) -> Response {
    let name = server.name();
    let created = unix_now();
    let id = if chat {
        format!("chatcmpl-{created}")
    } else {
        format!("cmpl-{created}")
    };
    let (object, chunk_object) = if chat {
        ("chat.completion", "chat.completion.chunk")
    } else {
        ("text_completion", "text_completion")
    };
    let usage =
        |n: usize| json!({"prompt_tokens": 9, "completion_tokens": n, "total_tokens": 9 + n});
    if !asked.stream {
        let text = pieces.concat();
        let tokens = pieces.len();
        let delay = server.options.chunk_delay * u32::try_from(tokens).unwrap_or(0);
        let choice = if chat {
            json!({"index": 0, "message": {"role": "assistant", "content": text},
                "logprobs": null, "finish_reason": finish})
        } else {
            json!({"index": 0, "text": text, "logprobs": null, "finish_reason": finish})
        };
        let body = json!({"id": id, "object": object, "created": created, "model": name,
            "choices": [choice], "usage": usage(tokens)});
        // Whole answers come at once, after their generation time.
        if held.is_some() {
            tokio::time::sleep(delay).await;
            server.gpu.record(VllmEvent::Answered {
                server: server.name(),
            });
        }
        drop(held);
        return axum::Json(body).into_response();
    }
    let piece = move |text: &str, finish: Value| {
        let choice = if chat {
            json!({"index": 0, "delta": {"content": text}, "logprobs": null, "finish_reason": finish})
        } else {
            json!({"index": 0, "text": text, "logprobs": null, "finish_reason": finish})
        };
        json!({"id": id, "object": chunk_object, "created": created, "model": name,
            "choices": [choice]})
    };
    let first = chat.then(|| {
        let mut role = piece("", Value::Null);
        role["choices"][0]["delta"] = json!({"role": "assistant", "content": ""});
        role.to_string()
    });
    let include_usage = asked.usage;
    let server = Arc::clone(server);
    let state = Stream {
        first,
        pieces: pieces.into_iter().collect(),
        sent: 0,
        finish: Some(finish),
        held,
        usage_left: include_usage,
        done: false,
    };
    let body = futures::stream::unfold(state, move |mut state| {
        let server = Arc::clone(&server);
        let piece = piece.clone();
        async move {
            if let Some(first) = state.first.take() {
                return Some((frame(&first), state));
            }
            if let Some(next) = state.pieces.pop_front() {
                tokio::time::sleep(server.options.chunk_delay).await;
                let aborted = state
                    .held
                    .as_ref()
                    .is_some_and(|(_, aborts)| server.lock().aborts != *aborts);
                if !aborted {
                    state.sent += 1;
                    return Some((frame(&piece(&next, Value::Null).to_string()), state));
                }
                state.pieces.clear();
                state.finish = Some("abort");
                server.gpu.record(VllmEvent::AbortedInFlight {
                    server: server.name(),
                });
            }
            if let Some(finish) = state.finish.take() {
                if finish != "abort" && state.held.is_some() {
                    server.gpu.record(VllmEvent::Answered {
                        server: server.name(),
                    });
                }
                let end = piece("", json!(finish));
                return Some((frame(&end.to_string()), state));
            }
            if state.usage_left {
                state.usage_left = false;
                let mut last = piece("", Value::Null);
                last["choices"] = json!([]);
                last["usage"] = usage(state.sent);
                return Some((frame(&last.to_string()), state));
            }
            if !state.done {
                state.done = true;
                drop(state.held.take());
                return Some((frame("[DONE]"), state));
            }
            None
        }
    });
    sse(body)
}

/// A streamed answer under way.
struct Stream {
    first: Option<String>,
    pieces: std::collections::VecDeque<String>,
    sent: usize,
    finish: Option<&'static str>,
    held: Option<(InFlight, u64)>,
    usage_left: bool,
    done: bool,
}
