//! Ollama (`lifecycle = "ollama"`): what it has pulled, what it holds, and its own verbs to
//! load and unload.
//!
//! What the node uses of it, all below the engine's root (the base URL without `/v1`):
//! `GET /api/tags` (every model it has pulled; one with `remote_host` is a **cloud model**,
//! run on ollama.com, which the node never serves), `GET /api/ps` (the models it holds, each
//! with `context_length`, what it allocated), and `POST /api/generate` with no prompt:
//! `"keep_alive": -1` loads a model and keeps it until told otherwise — the answer comes
//! once it is loaded, and Ollama abandons a load whose client goes away, so the call is held
//! open — and `"keep_alive": 0` unloads it: the answer comes at once, the model leaves
//! `/api/ps` once its requests in flight have ended.
//!
//! Ollama reports no loading state (`/api/ps` lists a model as soon as its load starts), so
//! a model is loading while the node's own load call is open ([`super::ManagedEngine`]
//! marks it). It reports no capacity either: `capacity` (its `OLLAMA_MAX_LOADED_MODELS`) is
//! a required setting. The window is `/api/ps`'s `context_length`, remembered once seen;
//! `/api/show`'s trained maximum is never used (it is larger than what Ollama allocates).
//! A model's footprint is `/api/ps`'s `size_vram` (its `size` where nothing is on a GPU)
//! once loaded — what Ollama allocated, remembered once seen — else `/api/tags`' `size`,
//! the file's, which is its weights alone.
//! The parsing is pure; this module decides nothing about which model to load.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::Duration;

use edge::domain::models::{Footprint, FootprintSource, LoadState, ModelAction};
use serde_json::{Value, json};

use super::{BeginError, Catalogue, EngineModel, refusal};
use crate::fault::UpstreamFault;
use crate::upstream::Upstream;

/// The most of an answer to a load or unload read (they are a few hundred bytes).
const MAX_ANSWER: usize = 64 * 1024;

/// An Ollama.
#[derive(Debug)]
pub struct Ollama {
    upstream: Upstream,
    /// How long a load may take (`load_timeout_ms`): the load call is held open that long.
    load_timeout: Duration,
    /// The windows `/api/ps` gave, by model: still known once a model is unloaded.
    windows: Mutex<BTreeMap<String, u32>>,
    /// What `/api/ps` said each model took, by model: still known once it is unloaded.
    allocated: Mutex<BTreeMap<String, u64>>,
}

impl Ollama {
    /// The Ollama `upstream` reaches; a load may take `load_timeout`.
    pub fn new(upstream: Upstream, load_timeout: Duration) -> Self {
        Self {
            upstream,
            load_timeout,
            windows: Mutex::new(BTreeMap::new()),
            allocated: Mutex::new(BTreeMap::new()),
        }
    }

    /// Every model it has pulled, with its state (cloud models refused); no capacity (the
    /// setting's).
    ///
    /// # Errors
    /// The fault when it cannot be asked or answers nothing readable.
    pub async fn catalogue(&self) -> Result<Catalogue, UpstreamFault> {
        let tags = self.upstream.get_root("/api/tags").await?;
        let ps = self.upstream.get_root("/api/ps").await?;
        let pulled = tags_of(&tags)?;
        let loaded = ps_of(&ps)?;
        let files = sizes_of(&tags, "/api/tags")?;
        let footprints = self.footprints(&files, &sizes_of(&ps, "/api/ps")?);
        let mut windows = self
            .windows
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        windows.extend(
            loaded
                .iter()
                .filter(|(_, w)| **w > 0)
                .map(|(id, w)| (id.clone(), *w)),
        );
        let mut catalogue = Catalogue::default();
        for (id, cloud) in pulled {
            if let Some(host) = cloud {
                let reason = format!(
                    "{id} is an Ollama cloud model (run on {host}, not on this machine): \
                     the node neither lists nor serves it"
                );
                catalogue.refused.insert(id, reason);
                continue;
            }
            let state = if loaded.contains_key(&id) {
                LoadState::Loaded
            } else {
                LoadState::Unloaded
            };
            let window = windows.get(&id).copied();
            let mut model = EngineModel::new(state, window);
            model.footprint = footprints.get(&id).copied();
            catalogue.models.insert(id, model);
        }
        // Held but not (or no longer) pulled: still holding a place.
        for (id, window) in loaded {
            catalogue
                .models
                .entry(id)
                .or_insert_with(|| EngineModel::new(LoadState::Loaded, Some(window)));
        }
        Ok(catalogue)
    }

    /// Each model's footprint: what `/api/ps` said it allocated (`allocated`, remembered),
    /// else its file's size in `/api/tags` (`files`).
    fn footprints(
        &self,
        files: &BTreeMap<String, u64>,
        allocated: &BTreeMap<String, u64>,
    ) -> BTreeMap<String, Footprint> {
        let mut known = self
            .allocated
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        known.extend(allocated.iter().map(|(id, bytes)| (id.clone(), *bytes)));
        let mut footprints: BTreeMap<String, Footprint> = files
            .iter()
            .map(|(id, bytes)| {
                (
                    id.clone(),
                    Footprint::whole(*bytes, FootprintSource::OllamaFile),
                )
            })
            .collect();
        for (id, bytes) in known.iter() {
            let loaded = Footprint::whole(*bytes, FootprintSource::OllamaLoaded);
            footprints.insert(id.clone(), loaded);
        }
        footprints
    }

    /// Loads `id` and keeps it (`keep_alive: -1`), answering once it is loaded; or asks it
    /// unloaded (`keep_alive: 0`), answered at once.
    ///
    /// # Errors
    /// Its refusal (an unknown model: 404), or why it could not be asked.
    pub async fn begin(&self, action: ModelAction, id: &str) -> Result<(), BeginError> {
        let keep_alive = match action {
            ModelAction::Load => -1,
            ModelAction::Unload => 0,
        };
        let body = json!({"model": id, "keep_alive": keep_alive});
        let answer = self
            .upstream
            .post_root_within("/api/generate", &body, self.load_timeout)
            .await;
        match answer {
            Ok(mut response) => {
                self.upstream.read_to_end(&mut response, MAX_ANSWER).await?;
                Ok(())
            }
            Err(UpstreamFault::Status { status, body }) => Err(refusal(status, &body)),
            Err(fault) => Err(fault.into()),
        }
    }
}

/// The models in `GET /api/tags`, each with the host of a cloud model (`remote_host`).
///
/// # Errors
/// [`UpstreamFault::Malformed`] when the body is not Ollama's model list.
pub fn tags_of(body: &[u8]) -> Result<Vec<(String, Option<String>)>, UpstreamFault> {
    Ok(models(body, "/api/tags")?
        .iter()
        .filter_map(|model| {
            let id = model["name"].as_str().or(model["model"].as_str())?;
            let host = model["remote_host"]
                .as_str()
                .filter(|h| !h.is_empty())
                .map(str::to_owned);
            Some((id.to_owned(), host))
        })
        .collect())
}

/// The models in `GET /api/ps`, each with its `context_length` (0 when it gives none).
///
/// # Errors
/// [`UpstreamFault::Malformed`] when the body is not Ollama's list of loaded models.
pub fn ps_of(body: &[u8]) -> Result<BTreeMap<String, u32>, UpstreamFault> {
    Ok(models(body, "/api/ps")?
        .iter()
        .filter_map(|model| {
            let id = model["name"].as_str().or(model["model"].as_str())?;
            let window = model["context_length"]
                .as_u64()
                .and_then(|n| u32::try_from(n).ok())
                .unwrap_or(0);
            Some((id.to_owned(), window))
        })
        .collect())
}

/// Each model's memory in one of Ollama's lists (`path`): `size_vram` where it is above 0
/// (`/api/ps`: what a GPU holds), else `size` (`/api/tags`: the file's; `/api/ps`: all it
/// allocated); a model with neither is left out.
///
/// # Errors
/// [`UpstreamFault::Malformed`] when the body is not one of Ollama's lists.
pub fn sizes_of(body: &[u8], path: &str) -> Result<BTreeMap<String, u64>, UpstreamFault> {
    Ok(models(body, path)?
        .iter()
        .filter_map(|model| {
            let id = model["name"].as_str().or(model["model"].as_str())?;
            let vram = model["size_vram"].as_u64().filter(|n| *n > 0);
            let bytes = vram.or(model["size"].as_u64()).filter(|n| *n > 0)?;
            Some((id.to_owned(), bytes))
        })
        .collect())
}

/// The `models` array of one of Ollama's lists.
fn models(body: &[u8], path: &str) -> Result<Vec<Value>, UpstreamFault> {
    let list: Value = serde_json::from_slice(body)
        .map_err(|error| UpstreamFault::Malformed(format!("{path} is not JSON: {error}")))?;
    match list.get("models") {
        Some(Value::Array(models)) => Ok(models.clone()),
        Some(Value::Null) => Ok(Vec::new()),
        _ => Err(UpstreamFault::Malformed(format!(
            "{path} has no `models` array"
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `/api/tags` as Ollama answers it (`api/types.go` `ListModelResponse`), details cut.
    const TAGS: &str = r#"{"models":[
        {"name":"qwen2.5:0.5b","model":"qwen2.5:0.5b","size":397821319,"digest":"a8b0"},
        {"name":"gpt-oss:120b-cloud","model":"gpt-oss:120b-cloud","remote_model":"gpt-oss:120b",
         "remote_host":"https://ollama.com:443","size":384},
        {"size":1}
    ]}"#;

    /// `/api/ps` (`ProcessModelResponse`).
    const PS: &str = r#"{"models":[
        {"name":"qwen2.5:0.5b","model":"qwen2.5:0.5b","size":1006000000,
         "expires_at":"2318-02-07T12:00:00Z","size_vram":1006000000,"context_length":4096}
    ]}"#;

    #[test]
    fn a_cloud_model_is_known_by_its_remote_host() {
        let tags = tags_of(TAGS.as_bytes()).expect("a model list");
        assert_eq!(
            tags,
            [
                ("qwen2.5:0.5b".to_owned(), None),
                (
                    "gpt-oss:120b-cloud".to_owned(),
                    Some("https://ollama.com:443".to_owned())
                ),
            ]
        );
    }

    #[test]
    fn a_models_size_is_its_files_until_ollama_says_what_it_allocated() {
        let files = sizes_of(TAGS.as_bytes(), "/api/tags").expect("a list");
        assert_eq!(files["qwen2.5:0.5b"], 397_821_319);
        let allocated = sizes_of(PS.as_bytes(), "/api/ps").expect("a list");
        assert_eq!(allocated["qwen2.5:0.5b"], 1_006_000_000);
        let on_cpu = br#"{"models":[{"name":"a","size":700,"size_vram":0}]}"#;
        assert_eq!(sizes_of(on_cpu, "/api/ps").expect("a list")["a"], 700);
    }

    #[test]
    fn what_ollama_holds_comes_with_the_window_it_allocated() {
        let ps = ps_of(PS.as_bytes()).expect("a list");
        assert_eq!(ps["qwen2.5:0.5b"], 4_096);
        assert!(ps_of(br#"{"models":[]}"#).expect("empty").is_empty());
        assert!(ps_of(br#"{"models":null}"#).expect("empty").is_empty());
        assert!(ps_of(b"<html>").is_err());
        assert!(tags_of(br#"{"error":"x"}"#).is_err());
    }
}
