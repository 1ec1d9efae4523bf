//! The `openai` adapter's settings, read from the `[[nodes.adapters]] settings` table the
//! edge sends in its `RegisterResponse` (every value is a string there).
//!
//! Pure: a map in, validated settings or a [`SettingsError`] naming the key out. The API key itself
//! is never in the edge's file: `api_key_env` names an environment variable on the node, and
//! the caller reads it. Nothing here logs.

use std::collections::BTreeMap;
use std::fmt;
use std::num::ParseIntError;
use std::path::PathBuf;
use std::time::Duration;

use edge::domain::models::{Footprint, FootprintSource};

/// Why an adapter's settings cannot be used: each names the key, and the value it got where
/// the message shows one. The node reports it to the edge as `adapter_misconfigured`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SettingsError {
    /// `base_url` is missing, or not an `http://` or `https://` URL.
    #[error(
        "`base_url` must be set to the engine's http://HOST:PORT/v1 \
         (or https://HOST:PORT/v1) URL"
    )]
    BaseUrl {
        /// What it was set to, if anything.
        value: Option<String>,
    },
    /// `tls_ca` is set for an engine that is not reached over `https://`.
    #[error(
        "`tls_ca` is set but `base_url` ({base_url}) is not https://: \
         drop `tls_ca` or use the engine's https:// URL"
    )]
    TlsCaWithoutHttps {
        /// The engine's URL.
        base_url: String,
    },
    /// A number setting that is not a whole number.
    #[error("`{key}` must be a whole number, got {value:?}")]
    NotANumber {
        /// The key.
        key: String,
        /// Its value.
        value: String,
        /// Why it does not parse.
        #[source]
        source: ParseIntError,
    },
    /// A setting that must be at least 1 is 0.
    #[error("`{key}` must be at least 1")]
    Zero {
        /// The key.
        key: String,
    },
    /// A flag that is neither `"true"` nor `"false"`.
    #[error("`{key}` must be \"true\" or \"false\", got {value:?}")]
    NotAFlag {
        /// The key.
        key: String,
        /// Its value (trimmed).
        value: String,
    },
    /// A flag that may be left to the node, and is neither `"true"`, `"false"` nor `"auto"`.
    #[error("`{key}` must be \"true\", \"false\" or \"auto\"")]
    NotAnAutoFlag {
        /// The key.
        key: String,
        /// Its value (trimmed).
        value: String,
    },
    /// `availability` names no mode the node knows.
    #[error("`availability` must be \"listed\" or \"reachable\", got {value:?}")]
    UnknownAvailability {
        /// Its value (trimmed).
        value: String,
    },
    /// `lifecycle` names no lifecycle the node knows.
    #[error(
        "`lifecycle` must be \"llama-router\", \"ollama\" or \"vllm\" (or left out), got {value:?}"
    )]
    UnknownLifecycle {
        /// Its value (trimmed).
        value: String,
    },
    /// A lifecycle whose engine does not say how many models it holds, without `capacity`.
    #[error(
        "`capacity` must be set with `lifecycle = \"{lifecycle}\"`: {what}, which the engine's \
         API does not report"
    )]
    CapacityRequired {
        /// The lifecycle.
        lifecycle: &'static str,
        /// What the capacity is for that engine.
        what: &'static str,
    },
    /// A target of `lifecycle = "vllm"` without its own server.
    #[error(
        "`base_url.{target}` must be set with `lifecycle = \"vllm\"`: each target is a vLLM \
         server of its own (http://HOST:PORT/v1)"
    )]
    NoTargetBaseUrl {
        /// The target.
        target: String,
    },
    /// A `footprint.<target>` that is not a size.
    #[error("`footprint.{target}`: {source}")]
    Footprint {
        /// The target.
        target: String,
        /// Why it is not a size.
        #[source]
        source: edge::domain::BytesError,
    },
    /// A `gpu_memory_utilization.<target>` that is not a share between 0 and 1.
    #[error(
        "`gpu_memory_utilization.{target}` must be the share of its GPUs the vLLM server \
         takes (its --gpu-memory-utilization, 0.9 by default), got {value:?}"
    )]
    GpuShare {
        /// The target.
        target: String,
        /// Its value.
        value: String,
    },
    /// A `base_url.<target>` that is not an `http://` or `https://` URL.
    #[error("`base_url.{target}` must be the engine's http://HOST:PORT/v1 URL, got {value:?}")]
    TargetBaseUrl {
        /// The target.
        target: String,
        /// Its value.
        value: String,
    },
}

/// How the prober decides which targets are available.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AvailabilityMode {
    /// A target is available when the engine's `GET /models` lists its upstream model.
    Listed,
    /// Every target is available whenever `GET /models` answers at all (engines that serve
    /// one model whatever the request names, such as llama.cpp's `llama-server`).
    Reachable,
}

/// How the node loads and unloads an adapter's targets on the edge's model commands
/// (`lifecycle`); an adapter without one serves whatever its engine has loaded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lifecycle {
    /// llama.cpp's `llama-server` in router mode (`--models-dir`): `POST /models/load` and
    /// `/models/unload`, the states in `GET /models`, the capacity in `GET /props`.
    LlamaRouter,
    /// Ollama: `POST /api/generate` with `keep_alive` -1 (load) or 0 (unload), the catalogue
    /// in `GET /api/tags`, what is loaded in `GET /api/ps`; `capacity` required.
    Ollama,
    /// vLLM servers in sleep mode, one per target (`base_url.<target>`): `POST /wake_up`
    /// (load) and `POST /sleep?level=1&mode=wait` (unload), `GET /is_sleeping`; `capacity`
    /// (how many may be awake at once) required.
    Vllm,
}

impl Lifecycle {
    /// Its `lifecycle` setting's value.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::LlamaRouter => "llama-router",
            Self::Ollama => "ollama",
            Self::Vllm => "vllm",
        }
    }
}

/// The validated settings of one `openai` adapter.
#[derive(Clone, PartialEq, Eq)]
pub struct OpenAiSettings {
    /// The engine's OpenAI base URL (`http://` or `https://`), up to and including `/v1`,
    /// without a trailing slash.
    pub base_url: String,
    /// For an `https://` engine: the PEM file of the CA certificates its certificate is
    /// checked against instead of the system's (a self-signed or private-CA engine).
    pub tls_ca: Option<PathBuf>,
    /// The name of the environment variable holding the engine's API key, if it needs one.
    pub api_key_env: Option<String>,
    /// Upstream model names by target; a target not listed is its own upstream name.
    pub models: BTreeMap<String, String>,
    /// Context windows set by hand, by target (`context_window.<target>`), and for every
    /// other target (`context_window`); they win over what the engine says.
    pub windows: BTreeMap<String, u32>,
    /// `context_window`: the window of a target with none of its own.
    pub window: Option<u32>,
    /// The longest one upstream request may take, streaming included.
    pub request_timeout: Duration,
    /// The longest the engine may take to accept a TCP connection.
    pub connect_timeout: Duration,
    /// The longest the engine may stay silent: before its headers and between chunks.
    pub idle_timeout: Duration,
    /// How often `GET /models` is probed while the engine is up.
    pub probe_interval: Duration,
    /// How often it is probed while the engine is down.
    pub probe_down_interval: Duration,
    /// The longest one probe may take.
    pub probe_timeout: Duration,
    /// What counts as an available target.
    pub availability: AvailabilityMode,
    /// Extra attempts when the engine cannot be reached or answers 502/503 before any output.
    pub max_retries: u32,
    /// Pause before each retry.
    pub retry_backoff: Duration,
    /// Whether to ask for a usage chunk (`stream_options.include_usage`).
    pub stream_usage: bool,
    /// A continued chat run asks with `continue_final_message: true` and
    /// `add_generation_prompt: false` (vLLM, SGLang) besides its trailing assistant message
    /// (all llama.cpp's `llama-server` needs).
    pub continue_final_message: bool,
    /// Ask llama-server for its running counts on every chunk (`timings_per_token: true`),
    /// so the prompt's tokens are known at once and a run cancelled or failed mid-stream
    /// reports them too. `None` (the default, `"auto"`): asked when the engine is
    /// llama-server, as its `/props` shows.
    pub timings_per_token: Option<bool>,
    /// After a streamed answer, open the next request's connection ahead of it (the engine
    /// closed the answer's; see `Upstream::preconnect`).
    pub preconnect: bool,
    /// How its targets are loaded and unloaded on command; `None`: they are not (the
    /// engine serves what it has loaded, and the edge is told nothing of loads).
    pub lifecycle: Option<Lifecycle>,
    /// The longest a load (or an unload) commanded by the edge may take.
    pub load_timeout: Duration,
    /// How many targets the edge may keep loaded at once, when lower than the engine's own
    /// limit (room kept for something else on the machine); `None`: the engine's. Required
    /// for Ollama (its `OLLAMA_MAX_LOADED_MODELS`) and vLLM (how many servers may be awake).
    pub capacity: Option<u32>,
    /// How many runs of one target the engine serves at once (`parallel`; Ollama's
    /// `OLLAMA_NUM_PARALLEL`, 1 by default there): the edge sends no more; 0: no cap.
    pub parallel: u32,
    /// With `lifecycle = "vllm"`: each target's own server (`base_url.<target>`), which
    /// replaces `base_url`.
    pub base_urls: BTreeMap<String, String>,
    /// With `lifecycle = "vllm"`: the targets never put to sleep (`never_sleep.<target>`):
    /// pooling models, which sleep frees little of.
    pub never_sleep: Vec<String>,
    /// Footprints set by hand, in bytes, by target (`footprint.<target>`): they win over
    /// what the node derives.
    pub footprints: BTreeMap<String, u64>,
    /// With `lifecycle = "vllm"`: each server's `--gpu-memory-utilization`, per mille of its
    /// devices' memory, by target (`gpu_memory_utilization.<target>`; vLLM's 0.9 when left
    /// out).
    pub gpu_shares: BTreeMap<String, u32>,
}

/// API keys are never in the settings; the debug form still names every key's value.
impl fmt::Debug for OpenAiSettings {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("OpenAiSettings")
            .field("base_url", &self.base_url)
            .field("tls_ca", &self.tls_ca)
            .field("api_key_env", &self.api_key_env)
            .field("models", &self.models)
            .field("windows", &self.windows)
            .field("window", &self.window)
            .field("request_timeout", &self.request_timeout)
            .field("availability", &self.availability)
            .field("lifecycle", &self.lifecycle)
            .finish_non_exhaustive()
    }
}

/// The keys this adapter reads; any other key is reported as unknown (a typo, usually).
pub const KEYS: &[&str] = &[
    "kind",
    "base_url",
    "tls_ca",
    "api_key_env",
    "request_timeout_ms",
    "connect_timeout_ms",
    "idle_timeout_ms",
    "probe_interval_ms",
    "probe_down_interval_ms",
    "probe_timeout_ms",
    "availability",
    "max_retries",
    "retry_backoff_ms",
    "stream_usage",
    "continue_final_message",
    "timings_per_token",
    "preconnect",
    "context_window",
    "lifecycle",
    "load_timeout_ms",
    "capacity",
    "parallel",
    "memory",
    "devices",
];

/// The prefix of the per-target upstream model keys: `"model.<target>" = "<upstream name>"`.
pub const MODEL_PREFIX: &str = "model.";

/// The prefix of the per-target context window keys: `"context_window.<target>" = "<tokens>"`.
pub const WINDOW_PREFIX: &str = "context_window.";

/// The prefix of the per-target engine URLs of `lifecycle = "vllm"`:
/// `"base_url.<target>" = "http://HOST:PORT/v1"`.
pub const BASE_URL_PREFIX: &str = "base_url.";

/// The prefix of `lifecycle = "vllm"`'s never-sleep marks: `"never_sleep.<target>" = "true"`.
pub const NEVER_SLEEP_PREFIX: &str = "never_sleep.";

/// The prefix of the footprints set by hand: `"footprint.<target>" = "6GiB"`.
pub const FOOTPRINT_PREFIX: &str = "footprint.";

/// The prefix of `lifecycle = "vllm"`'s shares of the GPUs:
/// `"gpu_memory_utilization.<target>" = "0.45"`.
pub const GPU_SHARE_PREFIX: &str = "gpu_memory_utilization.";

/// vLLM's default `--gpu-memory-utilization`, per mille.
pub const DEFAULT_GPU_SHARE: u32 = 900;

impl OpenAiSettings {
    /// Reads `settings`. Returns the settings and the keys it did not know (to be logged).
    ///
    /// # Errors
    /// The [`SettingsError`] of the first value that is missing or invalid, naming its key.
    pub fn parse(
        settings: &BTreeMap<String, String>,
    ) -> Result<(Self, Vec<String>), SettingsError> {
        let lifecycle = lifecycle(settings)?;
        let per_target = lifecycle == Some(Lifecycle::Vllm);
        let (base_url, tls_ca) = endpoint(settings, per_target)?;
        let models = settings
            .iter()
            .filter_map(|(key, value)| {
                let target = key.strip_prefix(MODEL_PREFIX)?;
                Some((target.to_owned(), value.clone()))
            })
            .collect();
        let unknown = unknown_keys(settings, per_target);
        let (base_urls, never_sleep, gpu_shares) = if per_target {
            let shares = gpu_shares(settings)?;
            (target_base_urls(settings)?, never_sleep(settings)?, shares)
        } else {
            (BTreeMap::new(), Vec::new(), BTreeMap::new())
        };
        let parsed = Self {
            base_url,
            tls_ca,
            api_key_env: settings
                .get("api_key_env")
                .filter(|v| !v.is_empty())
                .cloned(),
            models,
            windows: target_windows(settings)?,
            window: window(settings, "context_window")?,
            request_timeout: millis(settings, "request_timeout_ms", 600_000)?,
            connect_timeout: millis(settings, "connect_timeout_ms", 5_000)?,
            idle_timeout: millis(settings, "idle_timeout_ms", 300_000)?,
            probe_interval: millis(settings, "probe_interval_ms", 5_000)?,
            probe_down_interval: millis(settings, "probe_down_interval_ms", 1_000)?,
            probe_timeout: millis(settings, "probe_timeout_ms", 2_000)?,
            availability: availability(settings)?,
            max_retries: number(settings, "max_retries", 0)?,
            retry_backoff: millis(settings, "retry_backoff_ms", 250)?,
            stream_usage: flag(settings, "stream_usage", true)?,
            continue_final_message: flag(settings, "continue_final_message", false)?,
            timings_per_token: auto_flag(settings, "timings_per_token")?,
            preconnect: flag(settings, "preconnect", true)?,
            lifecycle,
            load_timeout: millis(settings, "load_timeout_ms", 300_000)?,
            capacity: capacity(settings, lifecycle)?,
            parallel: parallel(settings, lifecycle)?,
            base_urls,
            never_sleep,
            footprints: footprints(settings)?,
            gpu_shares,
        };
        Ok((parsed, unknown))
    }

    /// The context window set by hand for `target`, if any.
    pub fn window_of(&self, target: &str) -> Option<u32> {
        self.windows.get(target).copied().or(self.window)
    }

    /// The upstream model name of `target`.
    pub fn upstream_model<'a>(&'a self, target: &'a str) -> &'a str {
        self.models.get(target).map_or(target, String::as_str)
    }

    /// The footprint the settings give `target`: its `footprint.<target>`, else — for a
    /// vLLM server — its `gpu_memory_utilization.<target>` (vLLM's 0.9 when left out) of
    /// `device_bytes`, the memory of the adapter's devices, when known.
    pub fn footprint_of(&self, target: &str, device_bytes: Option<u64>) -> Option<Footprint> {
        if let Some(bytes) = self.footprints.get(target) {
            return Some(Footprint::whole(*bytes, FootprintSource::Setting));
        }
        if self.lifecycle != Some(Lifecycle::Vllm) {
            return None;
        }
        let share = self
            .gpu_shares
            .get(target)
            .copied()
            .unwrap_or(DEFAULT_GPU_SHARE);
        let bytes = u128::from(device_bytes?) * u128::from(share) / 1000;
        let bytes = u64::try_from(bytes).unwrap_or(u64::MAX);
        Some(Footprint::whole(bytes, FootprintSource::VllmShare))
    }

    /// Whether `target` is marked never to sleep (`never_sleep.<target>`).
    pub fn never_sleeps(&self, target: &str) -> bool {
        self.never_sleep.iter().any(|t| t == target)
    }
}

/// The keys this adapter does not read (with `per_target`, vLLM's per-server keys are read).
fn unknown_keys(settings: &BTreeMap<String, String>, per_target: bool) -> Vec<String> {
    settings
        .keys()
        .filter(|key| {
            !KEYS.contains(&key.as_str())
                && !key.starts_with(MODEL_PREFIX)
                && !key.starts_with(WINDOW_PREFIX)
                && !key.starts_with(FOOTPRINT_PREFIX)
                && !(per_target
                    && (key.starts_with(BASE_URL_PREFIX)
                        || key.starts_with(NEVER_SLEEP_PREFIX)
                        || key.starts_with(GPU_SHARE_PREFIX)))
        })
        .cloned()
        .collect()
}

/// An `http://` or `https://` URL without its trailing slash, or `None`.
fn http_url(value: &str) -> Option<String> {
    let url = value.trim().trim_end_matches('/').to_owned();
    (url.starts_with("http://") || url.starts_with("https://")).then_some(url)
}

/// `base_url`, and `tls_ca` (only for an `https://` one). With `per_target` (vLLM's one
/// server per target), `base_url` may be left out: the servers are `base_url.<target>`.
fn endpoint(
    settings: &BTreeMap<String, String>,
    per_target: bool,
) -> Result<(String, Option<PathBuf>), SettingsError> {
    let set = settings.get("base_url");
    let base_url = match set.and_then(|url| http_url(url)) {
        Some(url) => url,
        None if per_target && set.is_none() => String::new(),
        None => {
            return Err(SettingsError::BaseUrl {
                value: set.cloned(),
            });
        }
    };
    let tls_ca = settings
        .get("tls_ca")
        .map(|path| path.trim())
        .filter(|path| !path.is_empty())
        .map(PathBuf::from);
    if tls_ca.is_some() && !base_url.starts_with("https://") && !per_target {
        return Err(SettingsError::TlsCaWithoutHttps { base_url });
    }
    Ok((base_url, tls_ca))
}

/// The `base_url.<target>` settings, by target.
fn target_base_urls(
    settings: &BTreeMap<String, String>,
) -> Result<BTreeMap<String, String>, SettingsError> {
    let mut urls = BTreeMap::new();
    for (key, value) in settings {
        if let Some(target) = key.strip_prefix(BASE_URL_PREFIX) {
            let url = http_url(value).ok_or_else(|| SettingsError::TargetBaseUrl {
                target: target.to_owned(),
                value: value.clone(),
            })?;
            urls.insert(target.to_owned(), url);
        }
    }
    Ok(urls)
}

/// The targets marked `never_sleep.<target>` = `"true"`.
fn never_sleep(settings: &BTreeMap<String, String>) -> Result<Vec<String>, SettingsError> {
    let mut marked = Vec::new();
    for key in settings.keys() {
        if let Some(target) = key.strip_prefix(NEVER_SLEEP_PREFIX)
            && flag(settings, key, false)?
        {
            marked.push(target.to_owned());
        }
    }
    Ok(marked)
}

fn number(
    settings: &BTreeMap<String, String>,
    key: &str,
    default: u32,
) -> Result<u32, SettingsError> {
    settings.get(key).map_or(Ok(default), |value| {
        value
            .trim()
            .parse()
            .map_err(|source| SettingsError::NotANumber {
                key: key.to_owned(),
                value: value.clone(),
                source,
            })
    })
}

/// The `footprint.<target>` settings, in bytes, by target.
fn footprints(settings: &BTreeMap<String, String>) -> Result<BTreeMap<String, u64>, SettingsError> {
    let mut sizes = BTreeMap::new();
    for (key, value) in settings {
        if let Some(target) = key.strip_prefix(FOOTPRINT_PREFIX) {
            let bytes =
                edge::domain::parse_bytes(value).map_err(|source| SettingsError::Footprint {
                    target: target.to_owned(),
                    source,
                })?;
            sizes.insert(target.to_owned(), bytes);
        }
    }
    Ok(sizes)
}

/// The `gpu_memory_utilization.<target>` settings, per mille, by target: a share above 0
/// and at most 1, to three decimals.
fn gpu_shares(settings: &BTreeMap<String, String>) -> Result<BTreeMap<String, u32>, SettingsError> {
    let mut shares = BTreeMap::new();
    for (key, value) in settings {
        if let Some(target) = key.strip_prefix(GPU_SHARE_PREFIX) {
            let share = value
                .trim()
                .parse::<f64>()
                .ok()
                .filter(|share| *share > 0.0 && *share <= 1.0)
                .ok_or_else(|| SettingsError::GpuShare {
                    target: target.to_owned(),
                    value: value.clone(),
                })?;
            // Between 0 and 1000 after the check above.
            #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
            shares.insert(target.to_owned(), (share * 1000.0).round() as u32);
        }
    }
    Ok(shares)
}

/// The `context_window.<target>` settings, by target.
fn target_windows(
    settings: &BTreeMap<String, String>,
) -> Result<BTreeMap<String, u32>, SettingsError> {
    let mut windows = BTreeMap::new();
    for key in settings.keys() {
        if let Some(target) = key.strip_prefix(WINDOW_PREFIX)
            && let Some(tokens) = window(settings, key)?
        {
            windows.insert(target.to_owned(), tokens);
        }
    }
    Ok(windows)
}

/// A context window setting: `None` when absent or 0.
fn window(settings: &BTreeMap<String, String>, key: &str) -> Result<Option<u32>, SettingsError> {
    Ok(Some(number(settings, key, 0)?).filter(|tokens| *tokens > 0))
}

/// `capacity`: at least 1 when set; required for the engines that do not report theirs.
fn capacity(
    settings: &BTreeMap<String, String>,
    lifecycle: Option<Lifecycle>,
) -> Result<Option<u32>, SettingsError> {
    if !settings.contains_key("capacity") {
        let what = match lifecycle {
            Some(Lifecycle::Ollama) => {
                "how many models this Ollama may hold at once (its OLLAMA_MAX_LOADED_MODELS)"
            }
            Some(Lifecycle::Vllm) => {
                "how many of this node's vLLM servers may be awake at once on its GPUs"
            }
            Some(Lifecycle::LlamaRouter) | None => return Ok(None),
        };
        let lifecycle = lifecycle.map_or("", Lifecycle::as_str);
        return Err(SettingsError::CapacityRequired { lifecycle, what });
    }
    match number(settings, "capacity", 0)? {
        0 => Err(SettingsError::Zero {
            key: "capacity".to_owned(),
        }),
        places => Ok(Some(places)),
    }
}

/// `parallel`: at least 1 when set; 1 for Ollama when left out (`OLLAMA_NUM_PARALLEL`'s
/// default), no cap (0) for the other engines.
fn parallel(
    settings: &BTreeMap<String, String>,
    lifecycle: Option<Lifecycle>,
) -> Result<u32, SettingsError> {
    let default = u32::from(lifecycle == Some(Lifecycle::Ollama));
    match number(settings, "parallel", default)? {
        0 if settings.contains_key("parallel") => Err(SettingsError::Zero {
            key: "parallel".to_owned(),
        }),
        runs => Ok(runs),
    }
}

fn millis(
    settings: &BTreeMap<String, String>,
    key: &str,
    default: u32,
) -> Result<Duration, SettingsError> {
    let ms = number(settings, key, default)?;
    if ms == 0 {
        return Err(SettingsError::Zero {
            key: key.to_owned(),
        });
    }
    Ok(Duration::from_millis(u64::from(ms)))
}

fn flag(
    settings: &BTreeMap<String, String>,
    key: &str,
    default: bool,
) -> Result<bool, SettingsError> {
    match settings.get(key).map(|value| value.trim()) {
        None => Ok(default),
        Some("true") => Ok(true),
        Some("false") => Ok(false),
        Some(other) => Err(SettingsError::NotAFlag {
            key: key.to_owned(),
            value: other.to_owned(),
        }),
    }
}

/// A flag that may be left to the node: `"auto"` or absent is `None`.
fn auto_flag(
    settings: &BTreeMap<String, String>,
    key: &str,
) -> Result<Option<bool>, SettingsError> {
    match settings.get(key).map(|value| value.trim()) {
        None | Some("auto") => Ok(None),
        Some(other) => {
            flag(settings, key, false)
                .map(Some)
                .map_err(|_| SettingsError::NotAnAutoFlag {
                    key: key.to_owned(),
                    value: other.to_owned(),
                })
        }
    }
}

fn availability(settings: &BTreeMap<String, String>) -> Result<AvailabilityMode, SettingsError> {
    match settings.get("availability").map(|value| value.trim()) {
        None | Some("listed") => Ok(AvailabilityMode::Listed),
        Some("reachable") => Ok(AvailabilityMode::Reachable),
        Some(other) => Err(SettingsError::UnknownAvailability {
            value: other.to_owned(),
        }),
    }
}

fn lifecycle(settings: &BTreeMap<String, String>) -> Result<Option<Lifecycle>, SettingsError> {
    match settings.get("lifecycle").map(|value| value.trim()) {
        None => Ok(None),
        Some("llama-router") => Ok(Some(Lifecycle::LlamaRouter)),
        Some("ollama") => Ok(Some(Lifecycle::Ollama)),
        Some("vllm") => Ok(Some(Lifecycle::Vllm)),
        Some(other) => Err(SettingsError::UnknownLifecycle {
            value: other.to_owned(),
        }),
    }
}

/// Settings for the node's own tests: `pairs` for an engine at an unreachable address.
#[cfg(test)]
pub(crate) fn for_tests(pairs: &[(&str, &str)]) -> OpenAiSettings {
    let mut map: BTreeMap<String, String> = pairs
        .iter()
        .map(|(k, v)| ((*k).into(), (*v).into()))
        .collect();
    map.insert("base_url".into(), "http://127.0.0.1:1/v1".into());
    OpenAiSettings::parse(&map).expect("valid").0
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    #[test]
    fn defaults_and_the_model_map() {
        let (settings, unknown) = OpenAiSettings::parse(&map(&[
            ("base_url", "http://127.0.0.1:8080/v1/"),
            ("model.qwen2.5", "Qwen/Qwen2.5-0.5B-Instruct"),
            ("colour", "blue"),
        ]))
        .expect("valid");
        assert_eq!(settings.base_url, "http://127.0.0.1:8080/v1");
        assert_eq!(
            settings.upstream_model("qwen2.5"),
            "Qwen/Qwen2.5-0.5B-Instruct"
        );
        assert_eq!(settings.upstream_model("llama3.1:8b"), "llama3.1:8b");
        assert_eq!(settings.availability, AvailabilityMode::Listed);
        assert_eq!(settings.probe_interval, Duration::from_secs(5));
        assert!(settings.stream_usage);
        assert!(settings.preconnect);
        assert_eq!(settings.lifecycle, None);
        assert_eq!(settings.load_timeout, Duration::from_secs(300));
        assert_eq!(unknown, ["colour"]);
    }

    #[test]
    fn a_llama_router_lifecycle_and_its_load_timeout() {
        let (settings, unknown) = OpenAiSettings::parse(&map(&[
            ("base_url", "http://127.0.0.1:8080/v1"),
            ("lifecycle", " llama-router "),
            ("load_timeout_ms", "1500"),
            ("capacity", "1"),
        ]))
        .expect("valid");
        assert_eq!(settings.lifecycle, Some(Lifecycle::LlamaRouter));
        assert_eq!(settings.load_timeout, Duration::from_millis(1_500));
        assert_eq!(settings.capacity, Some(1));
        assert!(unknown.is_empty());
        let error = OpenAiSettings::parse(&map(&[
            ("base_url", "http://127.0.0.1:8080/v1"),
            ("lifecycle", "vllm-sleep"),
        ]))
        .expect_err("an unknown lifecycle");
        assert_eq!(
            error,
            SettingsError::UnknownLifecycle {
                value: "vllm-sleep".into()
            }
        );
        let error = error.to_string();
        assert!(
            error.contains("`lifecycle`") && error.contains("\"vllm-sleep\""),
            "{error}"
        );
    }

    #[test]
    fn ollama_needs_its_capacity_and_caps_one_run_per_model_by_default() {
        let ollama = |extra: &[(&str, &str)]| {
            let base = [
                ("base_url", "http://127.0.0.1:11434/v1"),
                ("lifecycle", "ollama"),
            ];
            OpenAiSettings::parse(&map(&[&base[..], extra].concat()))
        };
        let missing = ollama(&[]).expect_err("no capacity").to_string();
        assert!(
            missing.contains("`capacity`") && missing.contains("OLLAMA_MAX_LOADED_MODELS"),
            "{missing}"
        );
        let (settings, unknown) = ollama(&[("capacity", "2")]).expect("valid");
        assert_eq!(settings.lifecycle, Some(Lifecycle::Ollama));
        assert_eq!((settings.capacity, settings.parallel), (Some(2), 1));
        assert!(unknown.is_empty());
        let (settings, _) = ollama(&[("capacity", "2"), ("parallel", "4")]).expect("valid");
        assert_eq!(settings.parallel, 4);
        // No cap elsewhere unless set.
        let (router, _) = OpenAiSettings::parse(&map(&[
            ("base_url", "http://h/v1"),
            ("lifecycle", "llama-router"),
        ]))
        .expect("valid");
        assert_eq!(router.parallel, 0);
    }

    #[test]
    fn the_managed_engines_settings_name_their_key_when_wrong() {
        let cases = [
            (
                map(&[("base_url", "http://h/v1"), ("lifecycle", "ollama")]),
                "capacity",
            ),
            (map(&[("lifecycle", "vllm")]), "capacity"),
            (
                map(&[
                    ("lifecycle", "vllm"),
                    ("capacity", "1"),
                    ("base_url.alpha", "h:1"),
                ]),
                "base_url.alpha",
            ),
            (
                map(&[
                    ("base_url", "http://h/v1"),
                    ("lifecycle", "ollama"),
                    ("capacity", "2"),
                    ("parallel", "0"),
                ]),
                "parallel",
            ),
        ];
        for (settings, key) in cases {
            let error = OpenAiSettings::parse(&settings).expect_err(key).to_string();
            assert!(error.contains(key), "{error}");
        }
    }

    #[test]
    fn vllm_servers_are_per_target_and_pooling_ones_may_never_sleep() {
        let (settings, unknown) = OpenAiSettings::parse(&map(&[
            ("lifecycle", "vllm"),
            ("capacity", "1"),
            ("base_url.chat", "http://127.0.0.1:8001/v1/"),
            ("base_url.embed", "http://127.0.0.1:8002/v1"),
            ("never_sleep.embed", "true"),
        ]))
        .expect("valid");
        assert_eq!(settings.lifecycle, Some(Lifecycle::Vllm));
        assert_eq!(settings.base_urls["chat"], "http://127.0.0.1:8001/v1");
        assert_eq!(settings.base_urls.len(), 2);
        assert!(settings.never_sleeps("embed") && !settings.never_sleeps("chat"));
        assert!(unknown.is_empty());
        // Elsewhere those keys mean nothing.
        let (_, unknown) = OpenAiSettings::parse(&map(&[
            ("base_url", "http://h/v1"),
            ("base_url.chat", "http://h:2/v1"),
        ]))
        .expect("valid");
        assert_eq!(unknown, ["base_url.chat"]);
    }

    #[test]
    fn a_footprint_is_set_by_hand_or_is_a_vllm_servers_share_of_its_gpus() {
        let (settings, unknown) = OpenAiSettings::parse(&map(&[
            ("lifecycle", "vllm"),
            ("capacity", "2"),
            ("memory", "70GiB"),
            ("devices", "0"),
            ("base_url.chat", "http://127.0.0.1:8001/v1"),
            ("base_url.embed", "http://127.0.0.1:8002/v1"),
            ("gpu_memory_utilization.chat", "0.45"),
            ("footprint.embed", "3GiB"),
        ]))
        .expect("valid");
        assert!(unknown.is_empty(), "{unknown:?}");
        let gpu = Some(80 << 30);
        let chat = settings.footprint_of("chat", gpu).expect("a share");
        assert_eq!(
            (chat.bytes, chat.source),
            ((80 << 30) * 45 / 100, FootprintSource::VllmShare)
        );
        let embed = settings.footprint_of("embed", gpu).expect("by hand");
        assert_eq!(
            (embed.bytes, embed.source),
            (3 << 30, FootprintSource::Setting)
        );
        // vLLM's own default share where none is set; nothing without the devices' memory.
        assert_eq!(
            settings.footprint_of("other", gpu).map(|f| f.bytes),
            Some((80u64 << 30) * 9 / 10)
        );
        assert_eq!(settings.footprint_of("other", None), None);
        for bad in ["0", "1.5", "most"] {
            let error = OpenAiSettings::parse(&map(&[
                ("lifecycle", "vllm"),
                ("capacity", "1"),
                ("base_url.chat", "http://127.0.0.1:8001/v1"),
                ("gpu_memory_utilization.chat", bad),
            ]))
            .expect_err("not a share");
            assert!(
                error.to_string().contains("gpu_memory_utilization.chat"),
                "{error}"
            );
        }
        let error =
            OpenAiSettings::parse(&map(&[("base_url", "http://h/v1"), ("footprint.a", "big")]))
                .expect_err("not a size");
        assert!(error.to_string().contains("footprint.a"), "{error}");
    }

    #[test]
    fn an_https_engine_with_its_own_ca() {
        let (settings, unknown) = OpenAiSettings::parse(&map(&[
            ("base_url", "https://engine.lan:8443/v1"),
            ("tls_ca", " /etc/engine-ca.pem "),
        ]))
        .expect("valid");
        assert_eq!(settings.base_url, "https://engine.lan:8443/v1");
        assert_eq!(
            settings.tls_ca.as_deref(),
            Some(std::path::Path::new("/etc/engine-ca.pem"))
        );
        assert!(unknown.is_empty());
        let (public, _) =
            OpenAiSettings::parse(&map(&[("base_url", "https://api.example/v1")])).expect("valid");
        assert_eq!(public.tls_ca, None);
    }

    #[test]
    fn invalid_values_name_their_key() {
        let cases = [
            (map(&[]), "base_url"),
            (map(&[("base_url", "localhost:8080")]), "base_url"),
            (map(&[("base_url", "ftp://engine/v1")]), "base_url"),
            (
                map(&[
                    ("base_url", "http://h/v1"),
                    ("tls_ca", "/etc/engine-ca.pem"),
                ]),
                "tls_ca",
            ),
            (
                map(&[("base_url", "http://h/v1"), ("probe_interval_ms", "soon")]),
                "probe_interval_ms",
            ),
            (
                map(&[("base_url", "http://h/v1"), ("request_timeout_ms", "0")]),
                "request_timeout_ms",
            ),
            (
                map(&[("base_url", "http://h/v1"), ("availability", "maybe")]),
                "availability",
            ),
            (
                map(&[("base_url", "http://h/v1"), ("stream_usage", "yes")]),
                "stream_usage",
            ),
            (
                map(&[("base_url", "http://h/v1"), ("lifecycle", "ollama-ish")]),
                "lifecycle",
            ),
            (
                map(&[("base_url", "http://h/v1"), ("load_timeout_ms", "0")]),
                "load_timeout_ms",
            ),
        ];
        for (settings, key) in cases {
            let error = OpenAiSettings::parse(&settings).expect_err(key).to_string();
            assert!(error.contains(key), "{error}");
        }
    }
}
