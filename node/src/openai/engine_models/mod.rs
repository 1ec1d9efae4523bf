//! The model lifecycle of managed adapters (`lifecycle` in an adapter's settings): what the
//! engine holds, reported to the edge as the adapter's catalogue, and the engine's own verbs
//! to load and unload targets, which the edge's commands use.
//!
//! An adapter's engine is a [`ManagedEngine`], one variant per lifecycle: llama.cpp's router
//! ([`llama_router`]), Ollama ([`ollama`]) and vLLM's sleep mode, one server per target
//! ([`vllm`]), behind the same four verbs (catalogue, states, window, begin). An engine
//! whose load is one call held open until done (Ollama's load, vLLM's wake) reports no
//! loading state of its own: the node marks the model loading while the call is open
//! ([`ManagedEngine::mark`]). The mapping from the engine's models to the adapter's targets
//! ([`target_states`]) is pure; [`refresh`] observes the engine and reports the finding to
//! the availability board ([`crate::board`]), and [`probe_loop`] does that every probe
//! interval (the plain prober, [`crate::probe`], hands a managed adapter's engine to it).
//! The command side is in [`crate::model_commands`], above the adapters. Nothing here
//! decides which model to load: the edge does.

pub mod llama_router;
pub mod ollama;
pub mod vllm;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};

use edge::domain::Target;
use edge::domain::models::{Footprint, LoadState, ManagedAdapter, ModelAction, TargetLoad};
use serde_json::Value;
use tokio_util::sync::CancellationToken;

use super::OpenAiAdapter;
use super::settings::{Lifecycle, OpenAiSettings};
use crate::board::{Board, Finding};
use crate::engine_health::EngineHealth;
use crate::fault::UpstreamFault;
use crate::upstream::{Upstream, same_model};
use llama_router::LlamaRouter;
use ollama::Ollama;
use vllm::Vllm;

/// One model as its engine holds it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EngineModel {
    /// Its state.
    pub state: LoadState,
    /// With [`LoadState::Failed`]: the engine's reason.
    pub failure: String,
    /// The window it is (or will be) served with, when the engine says so without being
    /// asked about this model alone (vLLM's `max_model_len`, Ollama's `context_length`).
    pub window: Option<u32>,
    /// The memory it takes once loaded, when the node can tell (the GGUF header of a
    /// router's model, Ollama's sizes).
    pub footprint: Option<Footprint>,
}

impl EngineModel {
    /// A model in `state`, with `window` when known, and no failure or footprint.
    pub fn new(state: LoadState, window: Option<u32>) -> Self {
        Self {
            state,
            failure: String::new(),
            window,
            footprint: None,
        }
    }
}

/// What a managed engine holds: every model it can load, by the engine's own id, and how
/// many it holds loaded at once.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Catalogue {
    /// How many models it holds loaded at once; 0 when it sets no limit (or says none).
    pub capacity: u32,
    /// Its models by id.
    pub models: BTreeMap<String, EngineModel>,
    /// Models it lists that the node will never serve, with why (an Ollama cloud model, a
    /// vLLM server that cannot sleep).
    pub refused: BTreeMap<String, String>,
    /// Models whose server could not be reached (vLLM: one server per model), with the
    /// fault: only their targets are unavailable.
    pub unreachable: BTreeMap<String, String>,
}

/// Why a managed engine did not begin a load or an unload.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum BeginError {
    /// It could not be asked.
    #[error(transparent)]
    Fault(#[from] UpstreamFault),
    /// It refused, saying why.
    #[error("HTTP {status}: {message}")]
    Refused {
        /// Its HTTP status.
        status: u16,
        /// Its message (or its body, when it gave none).
        message: String,
    },
    /// As many vLLM servers as `capacity` are awake: one must sleep first.
    #[error(
        "{} of this node's vLLM servers are awake ({awake:?}) and `capacity` is {capacity}: \
         one must sleep first",
        .awake.len()
    )]
    Full {
        /// The targets awake.
        awake: Vec<String>,
        /// The adapter's capacity.
        capacity: u32,
    },
    /// The target is marked never to sleep (`never_sleep.<target>`).
    #[error("{target} is marked never to sleep (`never_sleep.{target}`)")]
    NeverSleeps {
        /// The target.
        target: String,
    },
    /// The vLLM server said it was awake, then aborted its warm-up request.
    #[error("the vLLM server of {target} said it was awake but aborted a 1-token request")]
    NotAwake {
        /// The target.
        target: String,
    },
}

/// An engine's refusal with its HTTP `status`: the message of its JSON error
/// (`{"error": {"message": …}}`, `{"error": "…"}`), else its body.
pub fn refusal(status: u16, body: &[u8]) -> BeginError {
    let parsed: Value = serde_json::from_slice(body).unwrap_or(Value::Null);
    let message = parsed
        .pointer("/error/message")
        .or_else(|| parsed.get("error"))
        .and_then(Value::as_str)
        .map_or_else(|| String::from_utf8_lossy(body).into_owned(), str::to_owned);
    BeginError::Refused { status, message }
}

/// The engine of a managed adapter.
#[derive(Debug)]
pub struct ManagedEngine {
    engine: Engine,
    /// Held while the engine is observed and the finding reported, so that an older
    /// observation (the prober's) never overwrites a newer one (a command's).
    observing: tokio::sync::Mutex<()>,
    /// The models whose load (or wake) call is open: loading, whatever the engine says.
    loading: Arc<Mutex<BTreeSet<String>>>,
}

/// The lifecycles the node knows, one per `lifecycle` setting.
#[derive(Debug)]
enum Engine {
    /// `lifecycle = "llama-router"`.
    LlamaRouter(LlamaRouter),
    /// `lifecycle = "ollama"`.
    Ollama(Ollama),
    /// `lifecycle = "vllm"`.
    Vllm(Vllm),
}

/// A model marked loading while its load call is open; unmarked when dropped.
#[derive(Debug)]
pub struct Mark {
    loading: Arc<Mutex<BTreeSet<String>>>,
    id: String,
}

impl Drop for Mark {
    fn drop(&mut self) {
        lock(&self.loading).remove(&self.id);
    }
}

fn lock(loading: &Mutex<BTreeSet<String>>) -> std::sync::MutexGuard<'_, BTreeSet<String>> {
    loading
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl ManagedEngine {
    /// The engine `upstream` reaches (`servers`: vLLM's, one per target, by model id),
    /// managed as `lifecycle` says.
    pub fn new(
        lifecycle: Lifecycle,
        settings: &OpenAiSettings,
        upstream: Upstream,
        servers: BTreeMap<String, vllm::Server>,
    ) -> Self {
        let engine = match lifecycle {
            Lifecycle::LlamaRouter => Engine::LlamaRouter(LlamaRouter::new(upstream)),
            Lifecycle::Ollama => Engine::Ollama(Ollama::new(upstream, settings.load_timeout)),
            Lifecycle::Vllm => {
                let capacity = settings.capacity.unwrap_or(1);
                Engine::Vllm(Vllm::new(servers, capacity, settings.load_timeout))
            }
        };
        Self {
            engine,
            observing: tokio::sync::Mutex::new(()),
            loading: Arc::new(Mutex::new(BTreeSet::new())),
        }
    }

    /// The engine's name, for messages.
    pub fn name(&self) -> &'static str {
        match self.engine {
            Engine::LlamaRouter(_) => "llama-server",
            Engine::Ollama(_) => "Ollama",
            Engine::Vllm(_) => "vLLM",
        }
    }

    async fn catalogue(&self) -> Result<Catalogue, UpstreamFault> {
        let mut catalogue = match &self.engine {
            Engine::LlamaRouter(router) => router.catalogue().await?,
            Engine::Ollama(ollama) => ollama.catalogue().await?,
            Engine::Vllm(vllm) => vllm.catalogue().await?,
        };
        self.apply_marks(&mut catalogue.models);
        Ok(catalogue)
    }

    /// Every model it can load, by id, with its state.
    ///
    /// # Errors
    /// The fault when it cannot be asked or lists nothing readable.
    pub async fn states(&self) -> Result<BTreeMap<String, EngineModel>, UpstreamFault> {
        let mut models = match &self.engine {
            Engine::LlamaRouter(router) => router.states().await?,
            Engine::Ollama(_) | Engine::Vllm(_) => self.catalogue().await?.models,
        };
        self.apply_marks(&mut models);
        Ok(models)
    }

    /// Models whose load call is open are loading.
    fn apply_marks(&self, models: &mut BTreeMap<String, EngineModel>) {
        for id in lock(&self.loading).iter() {
            if let Some(model) = models.get_mut(id) {
                model.state = LoadState::Loading;
            }
        }
    }

    async fn window(&self, id: &str) -> Option<u32> {
        match &self.engine {
            Engine::LlamaRouter(router) => router.window(id).await,
            // Their catalogues carry the window.
            Engine::Ollama(_) | Engine::Vllm(_) => None,
        }
    }

    /// Marks `id` loading while `action`'s call is open, when the engine does the whole
    /// work in that call and reports no loading state of its own (Ollama's load, vLLM's
    /// wake); `None` otherwise.
    pub fn mark(&self, action: ModelAction, id: &str) -> Option<Mark> {
        let holds_the_work = matches!(
            (&self.engine, action),
            (Engine::Ollama(_) | Engine::Vllm(_), ModelAction::Load)
        );
        if !holds_the_work {
            return None;
        }
        lock(&self.loading).insert(id.to_owned());
        Some(Mark {
            loading: Arc::clone(&self.loading),
            id: id.to_owned(),
        })
    }

    /// Asks it to load or unload `id`. A router's answer only says the work has begun;
    /// Ollama's load and vLLM's wake and sleep answer once it is done.
    ///
    /// # Errors
    /// [`BeginError::Refused`] when it refuses, [`BeginError::Fault`] when it cannot be
    /// asked, and vLLM's own refusals ([`BeginError::Full`], [`BeginError::NeverSleeps`],
    /// [`BeginError::NotAwake`]).
    pub async fn begin(&self, action: ModelAction, id: &str) -> Result<(), BeginError> {
        match &self.engine {
            Engine::LlamaRouter(router) => router.begin(action, id).await,
            Engine::Ollama(ollama) => ollama.begin(action, id).await,
            Engine::Vllm(vllm) => vllm.begin(action, id).await,
        }
    }

    /// What to do about a configured target the engine does not list, in its own words.
    fn listing_hint(&self) -> &'static str {
        match self.engine {
            Engine::LlamaRouter(_) => {
                "llama-server's router lists each GGUF file of --models-dir by its name without `.gguf`"
            }
            Engine::Ollama(_) => "`ollama pull` it; Ollama lists the models it has pulled",
            Engine::Vllm(_) => {
                "each target needs its own `base_url.<target>` server, serving the model as its --served-model-name"
            }
        }
    }
}

/// A managed adapter's configured targets as its engine's catalogue has them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TargetStates {
    /// The capacity left to the configured targets and every one the engine lists, with its
    /// state.
    pub managed: ManagedAdapter,
    /// The targets it serves now (loaded or sleeping), each with its engine model id.
    pub served: Vec<(String, String)>,
    /// The configured targets it does not list.
    pub unlisted: Vec<String>,
    /// The configured targets the node refuses to serve, with why (a misconfigured target:
    /// an Ollama cloud model).
    pub refused: Vec<(String, String)>,
}

/// Maps `catalogue` onto `targets` through the model map of `settings` (a target's engine
/// model is `model.<target>`, else the target itself; Ollama's `:latest` may be left out).
///
/// The capacity is the engine's limit, or the setting's when lower, less the places models
/// no target maps to hold (loaded outside the edge's commands: `ollama run`), at least 1.
/// A target's footprint is its setting's (`footprint.<target>`, a vLLM server's share of
/// `device_bytes`, the memory of the adapter's devices), else what the engine's catalogue
/// says.
pub fn target_states(
    targets: &[String],
    settings: &OpenAiSettings,
    catalogue: &Catalogue,
    device_bytes: Option<u64>,
) -> TargetStates {
    let mut states = TargetStates {
        managed: ManagedAdapter {
            capacity: capacity_left(targets, settings, catalogue),
            parallel: settings.parallel,
            targets: BTreeMap::new(),
            budget: None,
        },
        served: Vec::new(),
        unlisted: Vec::new(),
        refused: Vec::new(),
    };
    for target in targets {
        let wanted = settings.upstream_model(target);
        let matching = |id: &String| id == wanted || same_model(id, wanted);
        if let Some((_, reason)) = catalogue.refused.iter().find(|(id, _)| matching(id)) {
            states.refused.push((target.clone(), reason.clone()));
            continue;
        }
        let listed = catalogue
            .models
            .get_key_value(wanted)
            .or_else(|| catalogue.models.iter().find(|(id, _)| matching(id)));
        let (Some((id, model)), Ok(name)) = (listed, Target::parse(target)) else {
            states.unlisted.push(target.clone());
            continue;
        };
        if matches!(model.state, LoadState::Loaded | LoadState::Sleeping) {
            states.served.push((target.clone(), id.clone()));
        }
        let load = TargetLoad {
            state: model.state,
            progress_percent: 0,
            failure: model.failure.clone(),
            context_window: settings.window_of(target).or(model.window).unwrap_or(0),
            stays_loaded: settings.never_sleeps(target),
            footprint: settings
                .footprint_of(target, device_bytes)
                .or(model.footprint),
        };
        states.managed.targets.insert(name, load);
    }
    states
}

/// The engine's capacity, or the setting's when lower, less the places models no target
/// maps to hold, at least 1 (0: no limit).
fn capacity_left(targets: &[String], settings: &OpenAiSettings, catalogue: &Catalogue) -> u32 {
    let capacity = match (catalogue.capacity, settings.capacity) {
        (engine, None) => engine,
        (0, Some(setting)) => setting,
        (engine, Some(setting)) => engine.min(setting),
    };
    let ours = |id: &str| {
        targets.iter().any(|target| {
            let wanted = settings.upstream_model(target);
            id == wanted || same_model(id, wanted)
        })
    };
    let foreign = catalogue
        .models
        .iter()
        .filter(|(id, model)| model.state.holds_a_place() && !ours(id))
        .count();
    let foreign = u32::try_from(foreign).unwrap_or(u32::MAX);
    if capacity > 0 && foreign > 0 {
        capacity.saturating_sub(foreign).max(1)
    } else {
        capacity
    }
}

/// What the engine said when it was last observed.
#[derive(Debug, Clone)]
pub struct Observed {
    /// Its catalogue.
    pub catalogue: Catalogue,
    /// The configured targets it does not list.
    pub unlisted: Vec<String>,
    /// The configured targets the node refuses to serve, with why.
    pub refused: Vec<(String, String)>,
}

/// Observes `adapter`'s engine and reports what it serves, and every target's state, to
/// `board`; an engine that cannot be asked serves nothing.
///
/// # Errors
/// The fault when the engine could not be asked.
pub async fn refresh(
    adapter: &OpenAiAdapter,
    engine: &ManagedEngine,
    board: &Board,
) -> Result<Observed, UpstreamFault> {
    let _one_at_a_time = engine.observing.lock().await;
    let catalogue = match engine.catalogue().await {
        Ok(catalogue) => catalogue,
        Err(fault) => {
            board.report(adapter.name(), Finding::default());
            return Err(fault);
        }
    };
    let settings = adapter.settings();
    let budget = adapter.budget();
    let device_bytes = budget.map(|b| b.device_bytes);
    let mut states = target_states(adapter.targets(), settings, &catalogue, device_bytes);
    states.managed.budget = budget.map(|b| b.budget.clone());
    let mut windows = BTreeMap::new();
    for (target, id) in &states.served {
        let model = catalogue.models.get(id);
        let loaded = model.is_some_and(|model| model.state == LoadState::Loaded);
        // A setting wins, then what the catalogue says; a sleeping model is not asked (it
        // would wake).
        let window = match settings.window_of(target).or(model.and_then(|m| m.window)) {
            Some(window) => Some(window),
            None if loaded => engine.window(id).await,
            None => None,
        };
        if let Some(window) = window {
            windows.insert(target.clone(), window);
        }
    }
    let finding = Finding {
        targets: states
            .served
            .into_iter()
            .map(|(target, _)| target)
            .collect(),
        windows,
        managed: Some(states.managed),
    };
    board.report(adapter.name(), finding);
    Ok(Observed {
        catalogue,
        unlisted: states.unlisted,
        refused: states.refused,
    })
}

/// What to do so `target` (whose engine model is `wanted`) is among the engine's `listed`
/// models, for the warning about a target the engine does not list; `hint` says how that
/// engine lists its models.
pub fn unlisted_fix(target: &str, wanted: &str, listed: &[&String], hint: &str) -> String {
    format!(
        "the engine lists no model {wanted:?} (it lists {listed:?}): set `model.{target}` to \
         one of those, or give the engine that model ({hint})"
    )
}

/// Observes `adapter`'s managed engine every probe interval until `stop`, reporting each
/// finding to `board`; logs when the engine comes and goes, and warns (once per change)
/// about configured targets it does not list.
pub async fn probe_loop(
    adapter: &OpenAiAdapter,
    engine: &ManagedEngine,
    board: &Board,
    stop: &CancellationToken,
) {
    let mut health = EngineHealth::new(adapter.name(), "managed engine");
    let mut warned = Vec::new();
    let mut refused = Vec::new();
    let mut unreachable = BTreeMap::new();
    loop {
        let observed = refresh(adapter, engine, board).await;
        match &observed {
            Ok(seen) => {
                if health.up() {
                    let models: Vec<&String> = seen.catalogue.models.keys().collect();
                    tracing::info!(
                        adapter = adapter.name(),
                        engine = engine.name(),
                        capacity = seen.catalogue.capacity,
                        ?models,
                        "managed engine is up"
                    );
                }
            }
            Err(fault) => health.down(fault),
        }
        if let Ok(seen) = &observed {
            warn_unlisted(adapter, engine, seen, &mut warned);
            refuse_misconfigured(adapter, seen, &mut refused);
            warn_unreachable(adapter, seen, &mut unreachable);
        }
        let settings = adapter.settings();
        let (up_every, down_every) = (settings.probe_interval, settings.probe_down_interval);
        if !health.until_next_probe(up_every, down_every, stop).await {
            return;
        }
    }
}

/// Warns about each configured target the engine does not list, when the set changed.
fn warn_unlisted(
    adapter: &OpenAiAdapter,
    engine: &ManagedEngine,
    seen: &Observed,
    warned: &mut Vec<String>,
) {
    let unlisted: Vec<String> = seen
        .unlisted
        .iter()
        .filter(|target| {
            let id = adapter.settings().upstream_model(target);
            !seen.catalogue.unreachable.contains_key(id)
        })
        .cloned()
        .collect();
    if unlisted == *warned {
        return;
    }
    let listed: Vec<&String> = seen.catalogue.models.keys().collect();
    for target in &unlisted {
        let wanted = adapter.settings().upstream_model(target);
        tracing::warn!(
            adapter = adapter.name(),
            target = %target,
            fix = %unlisted_fix(target, wanted, &listed, engine.listing_hint()),
            "a configured target is not in the managed engine's catalogue, so the edge can neither use nor load it"
        );
    }
    *warned = unlisted;
}

/// Logs each configured target the node refuses to serve (a misconfigured target), when the
/// set changed.
fn refuse_misconfigured(
    adapter: &OpenAiAdapter,
    seen: &Observed,
    refused: &mut Vec<(String, String)>,
) {
    if seen.refused == *refused {
        return;
    }
    for (target, reason) in &seen.refused {
        tracing::error!(
            adapter = adapter.name(),
            target = %target,
            %reason,
            "a configured target is misconfigured: the node refuses it, and the edge neither lists nor serves it"
        );
    }
    refused.clone_from(&seen.refused);
}

/// Warns about each model whose own server cannot be reached (its target alone is
/// unavailable), and says when it is back.
fn warn_unreachable(
    adapter: &OpenAiAdapter,
    seen: &Observed,
    unreachable: &mut BTreeMap<String, String>,
) {
    let now = &seen.catalogue.unreachable;
    for (id, fault) in now {
        if !unreachable.contains_key(id) {
            tracing::warn!(
                adapter = adapter.name(), model = %id, %fault,
                "an engine server is down: its target is unavailable"
            );
        }
    }
    for id in unreachable.keys() {
        if !now.contains_key(id) {
            tracing::info!(adapter = adapter.name(), model = %id, "an engine server is up again");
        }
    }
    unreachable.clone_from(now);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(pairs: &[(&str, &str)]) -> OpenAiSettings {
        let managed = [pairs, &[("lifecycle", "llama-router")]].concat();
        crate::openai::settings::for_tests(&managed)
    }

    fn catalogue(models: &[(&str, LoadState)]) -> Catalogue {
        Catalogue {
            capacity: 2,
            models: models
                .iter()
                .map(|(id, state)| {
                    let failure = if *state == LoadState::Failed {
                        "exited with code 1".to_owned()
                    } else {
                        String::new()
                    };
                    let model = EngineModel {
                        state: *state,
                        failure,
                        window: None,
                        footprint: None,
                    };
                    ((*id).to_owned(), model)
                })
                .collect(),
            ..Catalogue::default()
        }
    }

    fn names(list: &[&str]) -> Vec<String> {
        list.iter().map(|s| (*s).to_owned()).collect()
    }

    fn state_of(states: &TargetStates, target: &str) -> Option<LoadState> {
        let target = Target::parse(target).expect("target");
        states.managed.targets.get(&target).map(|load| load.state)
    }

    #[test]
    fn the_capacity_is_the_engines_or_the_settings_when_lower() {
        let engine = catalogue(&[("alpha", LoadState::Loaded)]);
        let targets = names(&["alpha"]);
        let of = |pairs: &[(&str, &str)]| {
            target_states(&targets, &settings(pairs), &engine, None)
                .managed
                .capacity
        };
        assert_eq!(of(&[]), 2);
        assert_eq!(of(&[("capacity", "1")]), 1);
        assert_eq!(of(&[("capacity", "5")]), 2);
        let unlimited = Catalogue {
            capacity: 0,
            ..engine.clone()
        };
        let set = settings(&[("capacity", "3")]);
        assert_eq!(
            target_states(&targets, &set, &unlimited, None)
                .managed
                .capacity,
            3
        );
    }

    #[test]
    fn every_listed_target_has_its_state_and_the_loaded_and_asleep_ones_are_served() {
        let engine = catalogue(&[
            ("alpha", LoadState::Loaded),
            ("beta", LoadState::Loading),
            ("gamma", LoadState::Unloaded),
            ("delta", LoadState::Sleeping),
            ("broken", LoadState::Failed),
            ("extra", LoadState::Loaded),
        ]);
        let targets = names(&["alpha", "beta", "gamma", "delta", "broken"]);
        let states = target_states(&targets, &settings(&[]), &engine, None);
        // `extra`, loaded and no target's, holds one of the two places.
        assert_eq!(states.managed.capacity, 1);
        assert_eq!(state_of(&states, "alpha"), Some(LoadState::Loaded));
        assert_eq!(state_of(&states, "beta"), Some(LoadState::Loading));
        assert_eq!(state_of(&states, "gamma"), Some(LoadState::Unloaded));
        assert_eq!(state_of(&states, "delta"), Some(LoadState::Sleeping));
        assert_eq!(state_of(&states, "broken"), Some(LoadState::Failed));
        let broken = Target::parse("broken").expect("target");
        assert_eq!(
            states.managed.targets[&broken].failure,
            "exited with code 1"
        );
        // A model no target maps to is not the adapter's.
        assert_eq!(states.managed.targets.len(), 5);
        let served = [("alpha", "alpha"), ("delta", "delta")];
        let served: Vec<(String, String)> = served
            .iter()
            .map(|(t, id)| ((*t).to_owned(), (*id).to_owned()))
            .collect();
        assert_eq!(states.served, served);
        assert!(states.unlisted.is_empty());
    }

    #[test]
    fn targets_map_to_engine_models_through_the_model_map_and_unlisted_ones_are_left_out() {
        let engine = catalogue(&[
            ("qwen2.5-0.5b-q4", LoadState::Loaded),
            ("llama3.1", LoadState::Unloaded),
        ]);
        let settings = settings(&[("model.qwen", "qwen2.5-0.5b-q4")]);
        let targets = names(&["qwen", "llama3.1:latest", "absent"]);
        let states = target_states(&targets, &settings, &engine, None);
        assert_eq!(state_of(&states, "qwen"), Some(LoadState::Loaded));
        assert_eq!(
            state_of(&states, "llama3.1:latest"),
            Some(LoadState::Unloaded)
        );
        assert_eq!(state_of(&states, "absent"), None);
        assert_eq!(states.unlisted, ["absent"]);
        assert_eq!(
            states.served,
            [("qwen".to_owned(), "qwen2.5-0.5b-q4".to_owned())]
        );
    }

    #[test]
    fn an_unlisted_target_is_told_what_the_engine_lists() {
        let alpha = "alpha".to_owned();
        let fix = unlisted_fix("qwen", "qwen2.5", &[&alpha], "pull it");
        assert!(fix.contains("`model.qwen`"), "{fix}");
        assert!(fix.contains(r#"["alpha"]"#), "{fix}");
        assert!(fix.contains("pull it"), "{fix}");
    }

    fn ollama(pairs: &[(&str, &str)]) -> OpenAiSettings {
        let managed = [pairs, &[("lifecycle", "ollama"), ("capacity", "2")]].concat();
        crate::openai::settings::for_tests(&managed)
    }

    #[test]
    fn a_cloud_target_is_refused_and_a_model_loaded_outside_the_edge_takes_a_place() {
        let mut engine = catalogue(&[
            ("qwen2.5:0.5b", LoadState::Loaded),
            ("llama3.2:1b", LoadState::Unloaded),
            ("someone-ran:7b", LoadState::Loaded),
        ]);
        engine.capacity = 0;
        let reason = "gpt-oss:120b-cloud is an Ollama cloud model".to_owned();
        engine
            .refused
            .insert("gpt-oss:120b-cloud".into(), reason.clone());
        let targets = names(&["qwen2.5:0.5b", "llama3.2:1b", "gpt-oss:120b-cloud"]);
        let states = target_states(&targets, &ollama(&[("parallel", "3")]), &engine, None);
        assert_eq!(states.refused, [("gpt-oss:120b-cloud".to_owned(), reason)]);
        assert_eq!(
            states.managed.targets.len(),
            2,
            "the cloud target is not managed"
        );
        assert!(states.unlisted.is_empty());
        assert_eq!(
            (states.managed.capacity, states.managed.parallel),
            (1, 3),
            "capacity 2 less the model loaded outside the edge; the per-model cap"
        );
        // Never below one place: 0 would read as "no limit".
        engine.models.insert(
            "another:1b".into(),
            EngineModel::new(LoadState::Loaded, None),
        );
        assert_eq!(
            target_states(&targets, &ollama(&[]), &engine, None)
                .managed
                .capacity,
            1
        );
    }

    #[test]
    fn a_managed_targets_window_is_its_setting_else_what_the_engine_says() {
        let mut engine = catalogue(&[("alpha", LoadState::Asleep), ("beta", LoadState::Unloaded)]);
        engine.models.get_mut("alpha").expect("alpha").window = Some(16_384);
        let targets = names(&["alpha", "beta"]);
        let set = settings(&[("context_window.beta", "2048")]);
        let states = target_states(&targets, &set, &engine, None);
        let window = |t: &str| states.managed.targets[&Target::parse(t).expect("t")].context_window;
        assert_eq!((window("alpha"), window("beta")), (16_384, 2_048));
        assert!(states.served.is_empty(), "an asleep server is not served");
        assert_eq!(state_of(&states, "alpha"), Some(LoadState::Asleep));
    }

    fn engine(lifecycle: Lifecycle, settings: &OpenAiSettings) -> ManagedEngine {
        let timeouts = crate::upstream::Timeouts {
            connect: std::time::Duration::from_secs(1),
            idle: std::time::Duration::from_secs(1),
            probe: std::time::Duration::from_secs(1),
        };
        let upstream =
            Upstream::new("http://127.0.0.1:1/v1", None, None, timeouts).expect("client");
        ManagedEngine::new(lifecycle, settings, upstream, BTreeMap::new())
    }

    #[test]
    fn a_model_whose_load_call_is_open_is_loading_whatever_the_engine_lists() {
        let ollama = engine(Lifecycle::Ollama, &ollama(&[]));
        let mut models = catalogue(&[("qwen2.5:0.5b", LoadState::Loaded)]).models;
        // Ollama lists a model in /api/ps as soon as its load starts.
        let mark = ollama.mark(ModelAction::Load, "qwen2.5:0.5b");
        assert!(mark.is_some());
        ollama.apply_marks(&mut models);
        assert_eq!(models["qwen2.5:0.5b"].state, LoadState::Loading);
        drop(mark);
        let mut models = catalogue(&[("qwen2.5:0.5b", LoadState::Loaded)]).models;
        ollama.apply_marks(&mut models);
        assert_eq!(models["qwen2.5:0.5b"].state, LoadState::Loaded);
        // Nothing to mark: an unload, or a router, which reports its own loading state.
        assert!(ollama.mark(ModelAction::Unload, "qwen2.5:0.5b").is_none());
        let router = engine(Lifecycle::LlamaRouter, &settings(&[]));
        assert!(router.mark(ModelAction::Load, "alpha").is_none());
    }

    #[test]
    fn a_target_marked_never_to_sleep_stays_loaded() {
        let engine = catalogue(&[("chat", LoadState::Loaded), ("embed", LoadState::Loaded)]);
        let set = crate::openai::settings::for_tests(&[
            ("lifecycle", "vllm"),
            ("capacity", "2"),
            ("base_url.chat", "http://127.0.0.1:1/v1"),
            ("base_url.embed", "http://127.0.0.1:2/v1"),
            ("never_sleep.embed", "true"),
        ]);
        let states = target_states(&names(&["chat", "embed"]), &set, &engine, None);
        let stays = |t: &str| states.managed.targets[&Target::parse(t).expect("t")].stays_loaded;
        assert!(stays("embed") && !stays("chat"));
    }
}
