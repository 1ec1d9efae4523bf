//! llama.cpp's `llama-server` in router mode (`--models-dir`, `--models-preset`): one child
//! process per loaded model behind one port, loaded and unloaded on request.
//!
//! What the node uses of it, all below the engine's root (the base URL without `/v1`):
//! `GET /models` (every model it can load, by id, with `status.value` `unloaded`, `loading`,
//! `loaded` or `sleeping`; a load that failed leaves `unloaded` with `failed: true` and the
//! child's `exit_code`), `GET /props` (`role: "router"`, `max_instances`: its capacity),
//! `GET /props?model=<id>` (a loaded model's own props: its context window), and
//! `POST /models/load` / `POST /models/unload` with `{"model": id}`, which answer at once
//! and do the work in the background. The parsing is pure; this module decides nothing about
//! which model to load.
//!
//! Each model's footprint comes from its GGUF file's header ([`crate::gguf`]): the router
//! lists how it starts each model (`status.args`: `--model <file>`, `--ctx-size`, …), and the
//! node, on the router's machine, reads the file there — once per file and arguments.

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::Mutex;

use edge::domain::models::{LoadState, ModelAction};
use serde_json::{Value, json};

use super::{BeginError, Catalogue, EngineModel, refusal};
use crate::fault::UpstreamFault;
use crate::gguf::{EngineArgs, footprint, read_header};
use crate::upstream::{Upstream, props_window};
use edge::domain::models::Footprint;

/// The most of an answer to a load or unload read (they are a few bytes).
const MAX_ANSWER: usize = 64 * 1024;

/// Footprints already read, by model file and arguments, with the file's length then.
type Footprints = HashMap<(PathBuf, Vec<String>), (u64, Option<Footprint>)>;

/// A router-mode `llama-server`.
#[derive(Debug)]
pub struct LlamaRouter {
    upstream: Upstream,
    footprints: Mutex<Footprints>,
}

impl LlamaRouter {
    /// The router `upstream` reaches.
    pub fn new(upstream: Upstream) -> Self {
        Self {
            upstream,
            footprints: Mutex::new(HashMap::new()),
        }
    }

    /// Every model it can load with its state, and its capacity.
    ///
    /// # Errors
    /// The fault when it cannot be asked, or when it is not a router.
    pub async fn catalogue(&self) -> Result<Catalogue, UpstreamFault> {
        let capacity = capacity_of(&self.upstream.get_root("/props").await?)?;
        Ok(Catalogue {
            capacity,
            models: self.states().await?,
            ..Catalogue::default()
        })
    }

    /// Every model it can load, by id, with its state.
    ///
    /// # Errors
    /// The fault when it cannot be asked or lists nothing readable.
    pub async fn states(&self) -> Result<BTreeMap<String, EngineModel>, UpstreamFault> {
        let body = self.upstream.get_root("/models").await?;
        let mut models = models_of(&body)?;
        for (id, file, args) in launches_of(&body) {
            if let Some(model) = models.get_mut(&id) {
                model.footprint = self.footprint(file, args).await;
            }
        }
        Ok(models)
    }

    /// The footprint of the model in `file` run with `args`, read from its header once per
    /// file (and length) and arguments; `None` when the file cannot be read here (the
    /// router on another machine) or is no GGUF model.
    async fn footprint(&self, file: PathBuf, args: Vec<String>) -> Option<Footprint> {
        let length = tokio::fs::metadata(&file).await.ok()?.len();
        let key = (file, args);
        let known = self.known().get(&key).copied();
        if let Some((read_at, footprint)) = known
            && read_at == length
        {
            return footprint;
        }
        let (path, engine) = (
            key.0.clone(),
            EngineArgs::parse(key.1.iter().map(String::as_str)),
        );
        let read = tokio::task::spawn_blocking(move || {
            let file = std::fs::File::open(&path)?;
            read_header(std::io::BufReader::new(file))
        })
        .await;
        let found = match read {
            Ok(Ok(header)) => Some(footprint(&header, &engine, length)),
            Ok(Err(error)) => {
                tracing::warn!(file = %key.0.display(), %error, "no footprint: the model's header cannot be read");
                None
            }
            Err(_) => None,
        };
        self.known().insert(key, (length, found));
        found
    }

    fn known(&self) -> std::sync::MutexGuard<'_, Footprints> {
        self.footprints
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The context window the loaded model `id` serves with; `None` when it cannot say.
    pub async fn window(&self, id: &str) -> Option<u32> {
        let path = format!("/props?model={}", query_value(id));
        let props = self.upstream.get_root(&path).await.ok()?;
        props_window(&props)
    }

    /// Asks it to load or unload `id`; a load of a model already running, or an unload of
    /// one not running, is accepted too. Its answer only says the work has begun.
    ///
    /// # Errors
    /// As [`accepted`]: its refusal, or why it could not be asked.
    pub async fn begin(&self, action: ModelAction, id: &str) -> Result<(), BeginError> {
        let path = match action {
            ModelAction::Load => "/models/load",
            ModelAction::Unload => "/models/unload",
        };
        let answer = match self.upstream.post_root(path, &json!({"model": id})).await {
            // Read to its end, so the connection goes back to the pool.
            Ok(mut response) => self
                .upstream
                .read_to_end(&mut response, MAX_ANSWER)
                .await
                .map(drop),
            Err(fault) => Err(fault),
        };
        accepted(action, answer)
    }
}

/// The capacity in the router's `/props` (`max_instances`; 0: no limit).
///
/// # Errors
/// [`UpstreamFault::Malformed`] when the answer is not a router's (`role` is not `router`):
/// a `llama-server` serving one `--model` cannot load or unload.
pub fn capacity_of(props: &[u8]) -> Result<u32, UpstreamFault> {
    let props: Value = serde_json::from_slice(props)
        .map_err(|error| UpstreamFault::Malformed(format!("/props is not JSON: {error}")))?;
    if props["role"] != "router" {
        return Err(UpstreamFault::Malformed(
            "llama-server is not in router mode (`lifecycle = \"llama-router\"` needs it \
             started with --models-dir or --models-preset and no --model)"
                .into(),
        ));
    }
    Ok(props["max_instances"]
        .as_u64()
        .and_then(|n| u32::try_from(n).ok())
        .unwrap_or(0))
}

/// The models in the router's `GET /models`, by id, with their states.
///
/// # Errors
/// [`UpstreamFault::Malformed`] when the body is not a model list.
pub fn models_of(body: &[u8]) -> Result<BTreeMap<String, EngineModel>, UpstreamFault> {
    let list: Value = serde_json::from_slice(body).map_err(|error| {
        UpstreamFault::Malformed(format!("the model list is not JSON: {error}"))
    })?;
    let Some(data) = list["data"].as_array() else {
        return Err(UpstreamFault::Malformed(
            "the model list has no `data` array".into(),
        ));
    };
    Ok(data
        .iter()
        .filter_map(|model| {
            let id = model["id"].as_str()?;
            Some((id.to_owned(), model_of(id, &model["status"])))
        })
        .collect())
}

/// How the router starts each model it lists: its id, its file (`--model`) and its whole
/// argument list (`status.args`); a model listed without them is left out.
pub fn launches_of(body: &[u8]) -> Vec<(String, PathBuf, Vec<String>)> {
    let list: Value = serde_json::from_slice(body).unwrap_or(Value::Null);
    let data = list["data"].as_array().map_or(&[][..], Vec::as_slice);
    data.iter()
        .filter_map(|model| {
            let id = model["id"].as_str()?;
            let args: Vec<String> = model["status"]["args"]
                .as_array()?
                .iter()
                .filter_map(|arg| arg.as_str().map(str::to_owned))
                .collect();
            let file = args
                .windows(2)
                .find(|pair| pair[0] == "--model" || pair[0] == "-m")
                .map(|pair| PathBuf::from(&pair[1]))?;
            Some((id.to_owned(), file, args))
        })
        .collect()
}

/// One model's `status`: `value` is its state, except that a model left `unloaded` by a
/// failed load (`failed: true`) is failed, with the child's exit code as the reason (the
/// router says no more; the cause is in its log).
fn model_of(id: &str, status: &Value) -> EngineModel {
    let failed_load = || {
        let exit = status["exit_code"]
            .as_i64()
            .map_or_else(String::new, |code| format!(" with code {code}"));
        EngineModel {
            state: LoadState::Failed,
            failure: format!(
                "llama-server's process for {id} exited{exit} while loading it (its log says why)"
            ),
            window: None,
            footprint: None,
        }
    };
    let state = match status["value"].as_str() {
        Some("loaded") => LoadState::Loaded,
        Some("loading" | "downloading") => LoadState::Loading,
        Some("sleeping") => LoadState::Sleeping,
        Some("failed") => return failed_load(),
        _ if status["failed"] == true => return failed_load(),
        _ => LoadState::Unloaded,
    };
    EngineModel::new(state, None)
}

/// Whether the router's answer to a load or unload means the work is (being) done: a
/// success, or `model is already running` to a load and `model is not running` to an
/// unload.
///
/// # Errors
/// [`BeginError::Refused`] with the router's message for another status;
/// [`BeginError::Fault`] when it could not be asked.
pub fn accepted(action: ModelAction, answer: Result<(), UpstreamFault>) -> Result<(), BeginError> {
    let Err(fault) = answer else {
        return Ok(());
    };
    let UpstreamFault::Status { status, body } = &fault else {
        return Err(BeginError::Fault(fault));
    };
    let refused = refusal(*status, body);
    let done_already = match action {
        ModelAction::Load => "already running",
        ModelAction::Unload => "not running",
    };
    match &refused {
        BeginError::Refused {
            status: 400,
            message,
        } if message.contains(done_already) => Ok(()),
        _ => Err(refused),
    }
}

/// `value` percent-encoded for a URL's query (everything but RFC 3986's unreserved
/// characters).
fn query_value(value: &str) -> String {
    value
        .bytes()
        .map(|byte| match byte {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => {
                char::from(byte).to_string()
            }
            _ => format!("%{byte:02X}"),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A router's `/models` as llama-server (router mode) answers it, `args` and `preset`
    /// left out.
    const MODELS: &str = r#"{"object":"list","data":[
        {"id":"alpha","object":"model","status":{"value":"loaded"}},
        {"id":"beta","object":"model","status":{"value":"loading"}},
        {"id":"gamma","object":"model","status":{"value":"unloaded"}},
        {"id":"broken","object":"model","status":{"value":"unloaded","exit_code":1,"failed":true}},
        {"id":"dozing","object":"model","status":{"value":"sleeping"}},
        {"id":"reloading","object":"model","status":{"value":"loading","failed":true}},
        {"object":"model","status":{"value":"loaded"}}
    ]}"#;

    fn state(models: &BTreeMap<String, EngineModel>, id: &str) -> LoadState {
        models[id].state
    }

    #[test]
    fn the_routers_model_list_gives_each_models_state() {
        let models = models_of(MODELS.as_bytes()).expect("a model list");
        assert_eq!(models.len(), 6, "a model without an id is left out");
        assert_eq!(state(&models, "alpha"), LoadState::Loaded);
        assert_eq!(state(&models, "beta"), LoadState::Loading);
        assert_eq!(state(&models, "gamma"), LoadState::Unloaded);
        assert_eq!(state(&models, "dozing"), LoadState::Sleeping);
        // A new load of a model whose last one failed is loading, not failed.
        assert_eq!(state(&models, "reloading"), LoadState::Loading);
        assert!(models["alpha"].failure.is_empty());
    }

    #[test]
    fn a_failed_load_is_failed_with_the_exit_code_as_its_reason() {
        let models = models_of(MODELS.as_bytes()).expect("a model list");
        let broken = &models["broken"];
        assert_eq!(broken.state, LoadState::Failed);
        assert!(broken.failure.contains("broken"), "{}", broken.failure);
        assert!(broken.failure.contains("code 1"), "{}", broken.failure);
        let later = br#"{"data":[{"id":"x","status":{"value":"failed"}}]}"#;
        assert_eq!(
            state(&models_of(later).expect("a model list"), "x"),
            LoadState::Failed
        );
    }

    #[test]
    fn the_routers_arguments_say_where_each_models_file_is() {
        let body = br#"{"data":[
            {"id":"alpha","status":{"value":"unloaded","args":["/bin/llama-server","--ctx-size","4096","--model","/m/alpha.gguf","--parallel","4"]}},
            {"id":"beta","status":{"value":"loaded"}},
            {"id":"gamma","status":{"value":"unloaded","args":["llama-server","-m","/m/gamma.gguf"]}}
        ]}"#;
        let launches = launches_of(body);
        assert_eq!(launches.len(), 2, "a model without args is left out");
        assert_eq!(launches[0].0, "alpha");
        assert_eq!(launches[0].1, PathBuf::from("/m/alpha.gguf"));
        let args = EngineArgs::parse(launches[0].2.iter().map(String::as_str));
        assert_eq!((args.context, args.parallel), (4096, 4));
        assert_eq!(launches[1].1, PathBuf::from("/m/gamma.gguf"));
    }

    #[test]
    fn what_is_not_a_model_list_is_malformed() {
        assert!(models_of(b"<html>").is_err());
        assert!(models_of(br#"{"error":"x"}"#).is_err());
    }

    #[test]
    fn the_capacity_is_the_routers_max_instances() {
        let router = br#"{"role":"router","max_instances":2,"models_autoload":false}"#;
        assert_eq!(capacity_of(router).expect("a router"), 2);
        let unlimited = br#"{"role":"router","max_instances":0}"#;
        assert_eq!(capacity_of(unlimited).expect("a router"), 0);
        // One model served with --model: not a router, nothing to load or unload.
        let single = br#"{"default_generation_settings":{"n_ctx":4096},"total_slots":4}"#;
        let refused = capacity_of(single).expect_err("not a router");
        assert!(refused.to_string().contains("router mode"), "{refused}");
    }

    fn status(status: u16, message: &str) -> Result<(), UpstreamFault> {
        let body = json!({"error": {"code": status, "message": message}});
        Err(UpstreamFault::Status {
            status,
            body: body.to_string().into_bytes(),
        })
    }

    #[test]
    fn a_load_of_a_running_model_and_an_unload_of_a_stopped_one_are_accepted() {
        assert_eq!(accepted(ModelAction::Load, Ok(())), Ok(()));
        let running = status(400, "model is already running");
        assert_eq!(accepted(ModelAction::Load, running.clone()), Ok(()));
        let stopped = status(400, "model is not running");
        assert_eq!(accepted(ModelAction::Unload, stopped.clone()), Ok(()));
        // Each only for its own action.
        assert!(accepted(ModelAction::Unload, running).is_err());
        assert!(accepted(ModelAction::Load, stopped).is_err());
    }

    #[test]
    fn a_refusal_carries_the_routers_message() {
        let unknown = accepted(ModelAction::Load, status(404, "File Not Found"));
        let refused = unknown.expect_err("refused");
        assert_eq!(refused.to_string(), "HTTP 404: File Not Found");
        let down = accepted(
            ModelAction::Unload,
            Err(UpstreamFault::Unreachable("connection refused".into())),
        );
        assert!(down.is_err_and(|error| error.to_string().contains("connection refused")));
    }

    #[test]
    fn a_model_id_is_escaped_in_the_query() {
        assert_eq!(query_value("alpha-1.5_b~"), "alpha-1.5_b~");
        assert_eq!(
            query_value("ggml-org/gemma:Q4 K"),
            "ggml-org%2Fgemma%3AQ4%20K"
        );
    }
}
