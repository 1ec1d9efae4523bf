//! A fake Ollama, faithful to Ollama's own code where the model lifecycle meets it, with the
//! traps the edge must not fall into, and a record of everything done to it.
//!
//! No package registry here ships Ollama, so the tests cannot run the real one; this fake
//! follows its source instead (ollama/ollama at commit `fb3076099`, fetched for issue 62).
//! Each behaviour below names where it comes from:
//!
//! - **The catalogue** (`GET /api/tags`, `server/routes.go` `ListHandler`, `api/types.go`
//!   `ListModelResponse`): every pulled model by `name`; a **cloud model** carries
//!   `remote_model` and `remote_host` and runs on ollama.com, never here.
//! - **What is loaded** (`GET /api/ps`, `routes.go` `PsHandler`, `sched.go`
//!   `loadedModels`): every runner of the scheduler's `loaded` map, with `context_length`
//!   (what the runner allocated: `llama.ContextLength()`) and `expires_at`. A runner is put in
//!   that map as soon as its load *starts* (`sched.go` `load`: `s.loaded[runner.modelKey] =
//!   runner` with `loading: true`, before `WaitUntilRunning`), so a model still loading is
//!   listed like a loaded one: **Ollama reports no loading state**.
//! - **The window** (`POST /api/show`, `routes.go` `ShowHandler`): `model_info` holds the
//!   model's *trained* `<arch>.context_length`, larger than what `/api/ps` says Ollama
//!   allocated (131,072 against 4,096 here).
//! - **Load** (`routes.go` `GenerateHandler`: an empty `prompt` loads and answers
//!   `done_reason: "load"`): the answer comes once the runner is up; the load is the
//!   request's (`sched.go` `load`: `llama.WaitUntilRunning(req.ctx)`), so **a client that
//!   goes away aborts it** and the runner is expired.
//! - **Unload** (`GenerateHandler`: empty `prompt` and `keep_alive: 0` →
//!   `sched.expireRunner`, answered at once with `done_reason: "unload"`): the runner's
//!   duration becomes 0 and it is unloaded only when its reference count reaches 0
//!   (`processCompleted`: "expired event with positive ref count, retrying"), so **an
//!   unload waits for the requests in flight**, and the model stays in `/api/ps` meanwhile.
//! - **Keep-alive** (`api/types.go` `Duration.UnmarshalJSON`: a negative number is forever,
//!   a number is seconds, a string a Go duration; `envconfig.KeepAlive`: 5 minutes when a
//!   request says none; `sched.go` `useLoadedRunner` sets a loaded runner's duration only
//!   when the request gives one).
//! - **Autoload** (`sched.go` `getRunner` → `processPending`): any request for a model that
//!   is not loaded loads it — the OpenAI-compatible `/v1/chat/completions` too.
//! - **Eviction** (`processPending`: with `OLLAMA_MAX_LOADED_MODELS` reached,
//!   `findRunnerToUnload` sorts the runners by duration — `ByDurationAndName`, the duration
//!   cast to `uint64` — and expires the first **idle** one, else the shortest): **an idle
//!   runner loaded with `keep_alive: -1` is evicted too**, only later than the others.
//! - **Parallel requests** (`envconfig.NumParallel`, default 1): a runner serves that many
//!   requests at once; more wait inside Ollama.
//!
//! What the record holds ([`OllamaEvent`]) is the ground truth the tests assert on: what
//! was asked, what the fake's scheduler did of its own accord (an autoload, an eviction),
//! what a client's request carried that it should not have (`keep_alive`,
//! `options.num_ctx`).

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant, SystemTime};

use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde_json::{Value, json};
use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore};

use super::fake_serve::{Listening, frame, rfc3339, sse, unix_now};

/// One model an Ollama has pulled.
#[derive(Debug, Clone)]
pub struct OllamaModel {
    /// Its name (`qwen2.5:0.5b`).
    pub name: String,
    /// A cloud model: `remote_host` and `remote_model` in `/api/tags`.
    pub cloud: bool,
    /// The trained window `/api/show` reports (`<arch>.context_length`).
    pub trained_context: u32,
    /// The window a runner allocates, which `/api/ps` reports.
    pub context_length: u32,
    /// How long a load takes.
    pub load_time: Duration,
    /// The answer's pieces, one per chunk.
    pub reply: Vec<String>,
    /// The pause before each chunk.
    pub chunk_delay: Duration,
}

impl OllamaModel {
    /// A local model: trained for 131,072 tokens, loaded with 4,096, in 50 ms.
    pub fn local(name: &str) -> Self {
        Self {
            name: name.to_owned(),
            cloud: false,
            trained_context: 131_072,
            context_length: 4_096,
            load_time: Duration::from_millis(50),
            reply: vec!["Hello".into(), " from".into(), format!(" {name}.")],
            chunk_delay: Duration::ZERO,
        }
    }

    /// A cloud model (`gpt-oss:120b-cloud`), served by ollama.com.
    pub fn cloud(name: &str) -> Self {
        Self {
            cloud: true,
            ..Self::local(name)
        }
    }

    /// This model, loaded in `time`.
    #[must_use]
    pub fn load_time(mut self, time: Duration) -> Self {
        self.load_time = time;
        self
    }

    /// This model, answering `pieces` chunks `delay` apart.
    #[must_use]
    pub fn paced(mut self, pieces: usize, delay: Duration) -> Self {
        self.reply = (0..pieces).map(|i| format!(" w{i}")).collect();
        self.chunk_delay = delay;
        self
    }
}

/// How long a runner stays loaded once idle (`api.Duration`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeepAlive {
    /// A negative duration: never unloaded when idle.
    Forever,
    /// This long (0: unloaded once idle).
    For(Duration),
}

impl KeepAlive {
    /// The order `findRunnerToUnload` sorts in: the duration as nanoseconds, forever being
    /// `math.MaxInt64`.
    fn sort_key(self) -> u64 {
        match self {
            Self::Forever => i64::MAX as u64,
            Self::For(d) => u64::try_from(d.as_nanos()).unwrap_or(u64::MAX),
        }
    }

    /// Reads a request's `keep_alive` as `Duration.UnmarshalJSON` does.
    fn parse(value: &Value) -> Option<Self> {
        match value {
            Value::Number(n) => {
                let seconds = n.as_f64()?;
                Some(if seconds < 0.0 {
                    Self::Forever
                } else {
                    Self::For(Duration::from_secs_f64(seconds))
                })
            }
            Value::String(s) => go_duration(s),
            _ => None,
        }
    }
}

/// A Go duration string (`5m`, `30s`, `250ms`, `1h`, `0`; a leading `-` is forever).
fn go_duration(text: &str) -> Option<KeepAlive> {
    if text == "0" {
        return Some(KeepAlive::For(Duration::ZERO));
    }
    if text.starts_with('-') {
        return Some(KeepAlive::Forever);
    }
    let split = text.find(|c: char| c.is_ascii_alphabetic())?;
    let (number, unit) = text.split_at(split);
    let number: f64 = number.parse().ok()?;
    let seconds = match unit {
        "ms" => number / 1_000.0,
        "s" => number,
        "m" => number * 60.0,
        "h" => number * 3_600.0,
        _ => return None,
    };
    Some(KeepAlive::For(Duration::from_secs_f64(seconds)))
}

/// Why a runner went.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum UnloadCause {
    /// Its duration ran out, or a request set it to 0 (`keep_alive: 0`).
    Expired,
    /// The scheduler made room for `for_model` (`findRunnerToUnload`).
    Evicted {
        /// The model it made room for.
        for_model: String,
    },
}

/// One thing that happened to the fake.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OllamaEvent {
    /// `POST /api/generate` with no prompt: a load (`keep_alive` as given).
    LoadAsked {
        /// The model.
        model: String,
        /// Its `keep_alive`, if any.
        keep_alive: Option<KeepAlive>,
    },
    /// `POST /api/generate` with no prompt and `keep_alive: 0`: an unload.
    UnloadAsked {
        /// The model.
        model: String,
    },
    /// A runner started loading; `autoload` when a request other than a load asked for it.
    LoadStarted {
        /// The model.
        model: String,
        /// Whether a plain request (not a load) brought it in.
        autoload: bool,
    },
    /// A runner is up.
    Loaded {
        /// The model.
        model: String,
    },
    /// The client of the request that was loading went away: the load was abandoned.
    LoadAborted {
        /// The model.
        model: String,
    },
    /// The scheduler chose `model` to make room for `for_model` (its own eviction).
    Evicted {
        /// The runner expired.
        model: String,
        /// The model it made room for.
        for_model: String,
    },
    /// A runner left `loaded` (it is gone from `/api/ps`).
    Unloaded {
        /// The model.
        model: String,
        /// Why.
        cause: UnloadCause,
    },
    /// An OpenAI-compatible request arrived, with what it carried of Ollama's own knobs.
    Request {
        /// The model.
        model: String,
        /// The body's `keep_alive`, if any.
        keep_alive: Option<Value>,
        /// The body's `options.num_ctx`, if any.
        num_ctx: Option<Value>,
    },
    /// A request waited for one of the runner's `OLLAMA_NUM_PARALLEL` slots.
    WaitedForSlot {
        /// The model.
        model: String,
    },
    /// A request was answered to its end.
    Answered {
        /// The model.
        model: String,
    },
}

/// A runner in the scheduler's `loaded` map.
#[derive(Debug)]
struct Runner {
    /// Requests holding it (`refCount`).
    refs: u32,
    keep_alive: KeepAlive,
    /// Still loading (`runner.loading`).
    loading: bool,
    /// Expired, being torn down (it is still listed until it is gone).
    unloading: bool,
    expires_at: SystemTime,
    /// Bumped whenever its idle timer is set or stopped, so a stale timer does nothing.
    timer: u64,
    slots: Arc<Semaphore>,
}

#[derive(Debug, Default)]
struct Scheduler {
    loaded: BTreeMap<String, Runner>,
    /// A load is under way: Ollama loads one model at a time (`processPending`).
    load_active: bool,
    events: Vec<(Instant, OllamaEvent)>,
}

#[derive(Debug)]
struct Inner {
    models: Vec<OllamaModel>,
    max_loaded: usize,
    num_parallel: usize,
    /// How long a runner takes to go once expired (`runner.unload` and the wait for VRAM).
    unload_time: Duration,
    scheduler: Mutex<Scheduler>,
    changed: Notify,
}

/// The fake Ollama, listening on a port of its own.
pub struct FakeOllama {
    inner: Arc<Inner>,
    listening: Listening,
}

/// How a fake Ollama runs.
#[derive(Debug, Clone)]
pub struct OllamaOptions {
    /// `OLLAMA_MAX_LOADED_MODELS`.
    pub max_loaded: usize,
    /// `OLLAMA_NUM_PARALLEL`.
    pub num_parallel: usize,
    /// How long an expired runner takes to leave `/api/ps`.
    pub unload_time: Duration,
}

impl Default for OllamaOptions {
    fn default() -> Self {
        Self {
            max_loaded: 2,
            num_parallel: 1,
            unload_time: Duration::from_millis(30),
        }
    }
}

impl FakeOllama {
    /// An Ollama that has pulled `models`, nothing loaded.
    pub async fn start(models: Vec<OllamaModel>, options: OllamaOptions) -> Self {
        let inner = Arc::new(Inner {
            models,
            max_loaded: options.max_loaded,
            num_parallel: options.num_parallel.max(1),
            unload_time: options.unload_time,
            scheduler: Mutex::new(Scheduler::default()),
            changed: Notify::new(),
        });
        let app = Router::new()
            .route("/api/tags", get(tags))
            .route("/api/ps", get(ps))
            .route("/api/show", post(show))
            .route("/api/generate", post(generate))
            .route("/api/version", get(version))
            .route("/v1/models", get(openai_models))
            .route("/v1/chat/completions", post(chat))
            .with_state(Arc::clone(&inner));
        let listening = Listening::start(app).await;
        Self { inner, listening }
    }

    /// `http://ADDR/v1`, the adapter's `base_url`.
    pub fn base_url(&self) -> String {
        format!("http://{}/v1", self.listening.addr)
    }

    /// `http://ADDR`, its root.
    pub fn root(&self) -> String {
        format!("http://{}", self.listening.addr)
    }

    /// Everything that happened so far, in order.
    pub fn events(&self) -> Vec<OllamaEvent> {
        self.inner
            .lock()
            .events
            .iter()
            .map(|(_, e)| e.clone())
            .collect()
    }

    /// Everything that happened so far, in order, each with when.
    pub fn timeline(&self) -> Vec<(Instant, OllamaEvent)> {
        self.inner.lock().events.clone()
    }

    /// The models `/api/ps` lists now.
    pub fn listed(&self) -> Vec<String> {
        self.inner.lock().loaded.keys().cloned().collect()
    }

    /// The evictions Ollama made of its own accord: (the runner expired, the model it made
    /// room for).
    pub fn evictions(&self) -> Vec<(String, String)> {
        self.events()
            .into_iter()
            .filter_map(|event| match event {
                OllamaEvent::Evicted { model, for_model } => Some((model, for_model)),
                _ => None,
            })
            .collect()
    }

    /// The models a plain request loaded (autoloads).
    pub fn autoloads(&self) -> Vec<String> {
        self.events()
            .into_iter()
            .filter_map(|event| match event {
                OllamaEvent::LoadStarted {
                    model,
                    autoload: true,
                } => Some(model),
                _ => None,
            })
            .collect()
    }

    /// Stops listening (Ollama is down).
    pub async fn down(&mut self) {
        self.listening.down().await;
    }

    /// Listens again on the same port.
    pub async fn up(&mut self) {
        self.listening.up().await;
    }
}

impl Inner {
    fn lock(&self) -> MutexGuard<'_, Scheduler> {
        self.scheduler
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn model(&self, name: &str) -> Option<&OllamaModel> {
        self.models.iter().find(|m| m.name == name)
    }

    /// Takes the runner of `model` for one request, loading it first when it is not
    /// loaded (making room as `processPending` does); `keep_alive` replaces its duration
    /// when given. Dropping the future while it loads abandons the load.
    async fn acquire(
        self: &Arc<Self>,
        model: &OllamaModel,
        keep_alive: Option<KeepAlive>,
        plain_request: bool,
    ) -> Lease {
        loop {
            let changed = self.changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            {
                let mut scheduler = self.lock();
                let count = scheduler.loaded.len();
                let load_active = scheduler.load_active;
                let present = scheduler
                    .loaded
                    .get(&model.name)
                    .map(|r| r.loading || r.unloading);
                match present {
                    Some(false) => {
                        // useLoadedRunner
                        let Some(runner) = scheduler.loaded.get_mut(&model.name) else {
                            unreachable!("just seen")
                        };
                        runner.refs += 1;
                        runner.timer += 1;
                        if let Some(keep_alive) = keep_alive {
                            runner.keep_alive = keep_alive;
                        }
                        return Lease::new(self, &model.name, &runner.slots);
                    }
                    Some(true) => {}
                    None if load_active => {}
                    None if count >= self.max_loaded => self.make_room(&mut scheduler, model),
                    None => {
                        scheduler.load_active = true;
                        let slots = Arc::new(Semaphore::new(self.num_parallel));
                        let keep_alive =
                            keep_alive.unwrap_or(KeepAlive::For(Duration::from_secs(300)));
                        scheduler.loaded.insert(
                            model.name.clone(),
                            Runner {
                                refs: 0,
                                keep_alive,
                                loading: true,
                                unloading: false,
                                expires_at: SystemTime::now() + ttl(keep_alive),
                                timer: 0,
                                slots,
                            },
                        );
                        scheduler.events.push((
                            Instant::now(),
                            OllamaEvent::LoadStarted {
                                model: model.name.clone(),
                                autoload: plain_request,
                            },
                        ));
                        break;
                    }
                }
            }
            changed.await;
        }
        let mut loading = Loading {
            inner: Arc::clone(self),
            model: model.name.clone(),
            done: false,
        };
        tokio::time::sleep(model.load_time).await;
        let mut scheduler = self.lock();
        scheduler.load_active = false;
        scheduler.events.push((
            Instant::now(),
            OllamaEvent::Loaded {
                model: model.name.clone(),
            },
        ));
        loading.done = true;
        let Some(runner) = scheduler.loaded.get_mut(&model.name) else {
            unreachable!("a loading runner leaves only through its load's guard")
        };
        runner.loading = false;
        runner.refs += 1;
        let lease = Lease::new(self, &model.name, &runner.slots);
        drop(scheduler);
        self.changed.notify_waiters();
        lease
    }

    /// `findRunnerToUnload`: the first idle runner by duration then name, else the
    /// shortest; it is expired (and goes once idle).
    fn make_room(self: &Arc<Self>, scheduler: &mut Scheduler, for_model: &OllamaModel) {
        if scheduler.loaded.values().any(|r| r.unloading) {
            return; // one is already on its way out: wait for it
        }
        let mut runners: Vec<(&String, &Runner)> = scheduler.loaded.iter().collect();
        runners.sort_by(|a, b| {
            (a.1.keep_alive.sort_key(), a.0).cmp(&(b.1.keep_alive.sort_key(), b.0))
        });
        let victim = runners
            .iter()
            .find(|(_, r)| r.refs == 0)
            .or_else(|| runners.first())
            .map(|(name, _)| (*name).clone());
        let Some(victim) = victim else { return };
        scheduler.events.push((
            Instant::now(),
            OllamaEvent::Evicted {
                model: victim.clone(),
                for_model: for_model.name.clone(),
            },
        ));
        let cause = UnloadCause::Evicted {
            for_model: for_model.name.clone(),
        };
        self.expire(scheduler, &victim, cause);
    }

    /// `expireRunner`: the runner's duration becomes 0; it goes now when idle, else when
    /// its last request ends.
    fn expire(self: &Arc<Self>, scheduler: &mut Scheduler, model: &str, cause: UnloadCause) {
        let Some(runner) = scheduler.loaded.get_mut(model) else {
            return;
        };
        runner.keep_alive = KeepAlive::For(Duration::ZERO);
        runner.expires_at = SystemTime::now();
        runner.timer += 1;
        if runner.refs == 0 && !runner.loading {
            self.unload(runner, model, cause);
        }
    }

    /// Tears `runner` down: it leaves `/api/ps` after `unload_time`.
    fn unload(self: &Arc<Self>, runner: &mut Runner, model: &str, cause: UnloadCause) {
        if runner.unloading {
            return;
        }
        runner.unloading = true;
        let inner = Arc::clone(self);
        let model = model.to_owned();
        tokio::spawn(async move {
            tokio::time::sleep(inner.unload_time).await;
            let mut scheduler = inner.lock();
            scheduler.loaded.remove(&model);
            scheduler
                .events
                .push((Instant::now(), OllamaEvent::Unloaded { model, cause }));
            drop(scheduler);
            inner.changed.notify_waiters();
        });
    }

    /// A request on `model` ended (`processCompleted`): an idle runner with duration 0 goes,
    /// one with a duration gets its timer, one kept forever stays.
    fn release(self: &Arc<Self>, model: &str) {
        let mut scheduler = self.lock();
        let Some(runner) = scheduler.loaded.get_mut(model) else {
            return;
        };
        runner.refs = runner.refs.saturating_sub(1);
        if runner.refs == 0 && !runner.unloading {
            match runner.keep_alive {
                KeepAlive::For(d) if d.is_zero() => {
                    self.unload(runner, model, UnloadCause::Expired);
                }
                KeepAlive::For(d) => {
                    runner.timer += 1;
                    runner.expires_at = SystemTime::now() + d;
                    let (inner, model, timer) = (Arc::clone(self), model.to_owned(), runner.timer);
                    tokio::spawn(async move {
                        tokio::time::sleep(d).await;
                        let mut scheduler = inner.lock();
                        if let Some(runner) = scheduler.loaded.get_mut(&model)
                            && runner.timer == timer
                            && runner.refs == 0
                        {
                            inner.unload(runner, &model, UnloadCause::Expired);
                        }
                    });
                }
                KeepAlive::Forever => {
                    runner.expires_at = SystemTime::now() + ttl(KeepAlive::Forever)
                }
            }
        }
        drop(scheduler);
        self.changed.notify_waiters();
    }
}

/// When an idle runner kept `keep_alive` expires, from now (forever: Go's `time.Now().Add`
/// of `math.MaxInt64`, 292 years on).
fn ttl(keep_alive: KeepAlive) -> Duration {
    match keep_alive {
        KeepAlive::Forever => Duration::from_nanos(i64::MAX as u64),
        KeepAlive::For(d) => d,
    }
}

/// A load in progress; dropped before it is done (its request went away), the runner is
/// thrown away (`WaitUntilRunning` fails on the request's context, `expiredCh`).
struct Loading {
    inner: Arc<Inner>,
    model: String,
    done: bool,
}

impl Drop for Loading {
    fn drop(&mut self) {
        if self.done {
            return;
        }
        let mut scheduler = self.inner.lock();
        scheduler.load_active = false;
        scheduler.loaded.remove(&self.model);
        scheduler.events.push((
            Instant::now(),
            OllamaEvent::LoadAborted {
                model: self.model.clone(),
            },
        ));
        drop(scheduler);
        self.inner.changed.notify_waiters();
    }
}

/// One request's hold on a runner; dropping it ends the request.
struct Lease {
    inner: Arc<Inner>,
    model: String,
    slots: Arc<Semaphore>,
}

impl Lease {
    fn new(inner: &Arc<Inner>, model: &str, slots: &Arc<Semaphore>) -> Self {
        Self {
            inner: Arc::clone(inner),
            model: model.to_owned(),
            slots: Arc::clone(slots),
        }
    }

    /// One of the runner's parallel slots, waiting (and saying so) when all are taken.
    async fn slot(&self) -> OwnedSemaphorePermit {
        if let Ok(permit) = Arc::clone(&self.slots).try_acquire_owned() {
            return permit;
        }
        self.inner.lock().events.push((
            Instant::now(),
            OllamaEvent::WaitedForSlot {
                model: self.model.clone(),
            },
        ));
        Arc::clone(&self.slots)
            .acquire_owned()
            .await
            .expect("the slots are never closed")
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        self.inner.release(&self.model);
    }
}

fn error(status: StatusCode, message: &str) -> Response {
    (status, axum::Json(json!({"error": message}))).into_response()
}

fn details(model: &OllamaModel) -> Value {
    let format = if model.cloud { "" } else { "gguf" };
    json!({"parent_model": "", "format": format, "family": "qwen2", "families": ["qwen2"],
        "parameter_size": "494.03M", "quantization_level": "Q4_K_M"})
}

async fn version() -> Response {
    axum::Json(json!({"version": "0.13.0"})).into_response()
}

async fn tags(State(inner): State<Arc<Inner>>) -> Response {
    let models: Vec<Value> = inner
        .models
        .iter()
        .map(|m| {
            let mut entry = json!({"name": m.name, "model": m.name,
                "modified_at": rfc3339(SystemTime::now()), "size": 397_821_319,
                "digest": "a8b0c51577010a279d933d14c2a8ab4b268079d44c5c8830c0a93900f1827c67",
                "details": details(m)});
            if m.cloud {
                let remote = m.name.trim_end_matches("-cloud").to_owned();
                entry["remote_model"] = json!(remote);
                entry["remote_host"] = json!("https://ollama.com:443");
                entry["size"] = json!(384);
            }
            entry
        })
        .collect();
    axum::Json(json!({"models": models})).into_response()
}

async fn ps(State(inner): State<Arc<Inner>>) -> Response {
    let scheduler = inner.lock();
    let mut models: Vec<(SystemTime, Value)> = scheduler
        .loaded
        .iter()
        .filter_map(|(name, runner)| {
            let model = inner.model(name)?;
            let entry = json!({"name": name, "model": name, "size": 1_006_000_000,
                "digest": "a8b0c51577010a279d933d14c2a8ab4b268079d44c5c8830c0a93900f1827c67",
                "details": details(model), "expires_at": rfc3339(runner.expires_at),
                "size_vram": 1_006_000_000, "context_length": model.context_length});
            Some((runner.expires_at, entry))
        })
        .collect();
    // "longest duration remaining listed first"
    models.sort_by_key(|m| std::cmp::Reverse(m.0));
    let models: Vec<Value> = models.into_iter().map(|(_, m)| m).collect();
    axum::Json(json!({"models": models})).into_response()
}

async fn show(State(inner): State<Arc<Inner>>, body: axum::body::Bytes) -> Response {
    let body: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    let name = body["model"]
        .as_str()
        .or(body["name"].as_str())
        .unwrap_or("");
    let Some(model) = inner.model(name) else {
        return error(StatusCode::NOT_FOUND, &format!("model '{name}' not found"));
    };
    let mut answer = json!({"details": details(model), "capabilities": ["completion"],
        "modified_at": rfc3339(SystemTime::now())});
    if model.cloud {
        answer["remote_model"] = json!(model.name.trim_end_matches("-cloud"));
        answer["remote_host"] = json!("https://ollama.com:443");
    } else {
        answer["model_info"] = json!({"general.architecture": "qwen2",
            "qwen2.context_length": model.trained_context});
    }
    axum::Json(answer).into_response()
}

async fn generate(State(inner): State<Arc<Inner>>, body: axum::body::Bytes) -> Response {
    let body: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    let name = body["model"].as_str().unwrap_or("").to_owned();
    let Some(model) = inner.model(&name).cloned() else {
        return error(StatusCode::NOT_FOUND, &format!("model '{name}' not found"));
    };
    let prompt = body["prompt"].as_str().unwrap_or("");
    let keep_alive = body.get("keep_alive").and_then(KeepAlive::parse);
    if prompt.is_empty() && keep_alive == Some(KeepAlive::For(Duration::ZERO)) {
        let mut scheduler = inner.lock();
        scheduler.events.push((
            Instant::now(),
            OllamaEvent::UnloadAsked {
                model: name.clone(),
            },
        ));
        inner.expire(&mut scheduler, &name, UnloadCause::Expired);
        drop(scheduler);
        inner.changed.notify_waiters();
        return axum::Json(
            json!({"model": name, "created_at": rfc3339(SystemTime::now()),
            "response": "", "done": true, "done_reason": "unload"}),
        )
        .into_response();
    }
    if model.cloud {
        // routes.go: a remote model this server may not proxy
        return error(
            StatusCode::BAD_REQUEST,
            "this server cannot run this remote model",
        );
    }
    if !prompt.is_empty() {
        return error(
            StatusCode::NOT_IMPLEMENTED,
            "the fake only loads and unloads here",
        );
    }
    inner.lock().events.push((
        Instant::now(),
        OllamaEvent::LoadAsked {
            model: name.clone(),
            keep_alive,
        },
    ));
    // The lease ends with this request, as Ollama's does when the handler returns.
    let lease = inner.acquire(&model, keep_alive, false).await;
    drop(lease);
    axum::Json(
        json!({"model": name, "created_at": rfc3339(SystemTime::now()),
        "response": "", "done": true, "done_reason": "load"}),
    )
    .into_response()
}

async fn openai_models(State(inner): State<Arc<Inner>>) -> Response {
    let data: Vec<Value> = inner
        .models
        .iter()
        .map(|m| json!({"id": m.name, "object": "model", "created": unix_now(), "owned_by": "library"}))
        .collect();
    axum::Json(json!({"object": "list", "data": data})).into_response()
}

async fn chat(State(inner): State<Arc<Inner>>, body: axum::body::Bytes) -> Response {
    let body: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    let name = body["model"].as_str().unwrap_or("").to_owned();
    inner.lock().events.push((
        Instant::now(),
        OllamaEvent::Request {
            model: name.clone(),
            keep_alive: body.get("keep_alive").cloned(),
            num_ctx: body.pointer("/options/num_ctx").cloned(),
        },
    ));
    let Some(model) = inner.model(&name).cloned() else {
        let message = format!("model \"{name}\" not found, try pulling it first");
        let body = json!({"error": {"message": message, "type": "api_error", "param": null, "code": null}});
        return (StatusCode::NOT_FOUND, axum::Json(body)).into_response();
    };
    let lease = inner.acquire(&model, None, true).await;
    let permit = lease.slot().await;
    let stream = body["stream"].as_bool().unwrap_or(false);
    let usage = body.pointer("/stream_options/include_usage") == Some(&json!(true));
    let max_tokens = body["max_tokens"]
        .as_u64()
        .map(|n| usize::try_from(n).unwrap_or(usize::MAX));
    let mut pieces = model.reply.clone();
    let mut finish = "stop";
    if let Some(max) = max_tokens
        && max < pieces.len()
    {
        pieces.truncate(max);
        finish = "length";
    }
    let completion_tokens = pieces.len();
    let created = unix_now();
    let id = format!("chatcmpl-{}", created % 1000);
    let usage_body = json!({"prompt_tokens": 11, "completion_tokens": completion_tokens,
        "total_tokens": 11 + completion_tokens});
    if !stream {
        tokio::time::sleep(model.chunk_delay * u32::try_from(pieces.len()).unwrap_or(0)).await;
        inner.lock().events.push((
            Instant::now(),
            OllamaEvent::Answered {
                model: name.clone(),
            },
        ));
        drop((permit, lease));
        let answer = json!({"id": id, "object": "chat.completion", "created": created,
            "model": name, "system_fingerprint": "fp_ollama",
            "choices": [{"index": 0, "message": {"role": "assistant", "content": pieces.concat()},
                "finish_reason": finish}],
            "usage": usage_body});
        return axum::Json(answer).into_response();
    }
    let chunk = move |delta: Value, finish: Value| {
        json!({"id": id, "object": "chat.completion.chunk", "created": created, "model": name,
            "system_fingerprint": "fp_ollama",
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]})
        .to_string()
    };
    let mut frames: Vec<(Duration, String)> = pieces
        .iter()
        .map(|p| {
            (
                model.chunk_delay,
                chunk(json!({"role": "assistant", "content": p}), Value::Null),
            )
        })
        .collect();
    frames.push((
        Duration::ZERO,
        chunk(json!({"role": "assistant", "content": ""}), json!(finish)),
    ));
    if usage {
        let mut last: Value =
            serde_json::from_str(&chunk(json!({}), Value::Null)).unwrap_or_default();
        last["choices"] = json!([]);
        last["usage"] = usage_body;
        frames.push((Duration::ZERO, last.to_string()));
    }
    frames.push((Duration::ZERO, "[DONE]".to_owned()));
    let model_name = model.name.clone();
    let held = (lease, permit, inner);
    let body = futures::stream::unfold(
        (frames.into_iter(), Some(held)),
        move |(mut frames, mut held)| {
            let model_name = model_name.clone();
            async move {
                let Some((delay, data)) = frames.next() else {
                    if let Some((lease, permit, inner)) = held.take() {
                        inner
                            .lock()
                            .events
                            .push((Instant::now(), OllamaEvent::Answered { model: model_name }));
                        drop((permit, lease));
                    }
                    return None;
                };
                tokio::time::sleep(delay).await;
                Some((frame(&data), (frames, held)))
            }
        },
    );
    sse(body)
}
