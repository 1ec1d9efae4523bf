//! The model lifecycle of managed adapters (`lifecycle` in an adapter's settings): what the
//! engine holds, reported to the edge as the adapter's catalogue, and the engine's own verbs
//! to load and unload targets, which the edge's commands use.
//!
//! An adapter's engine is a [`ManagedEngine`], one variant per lifecycle (today llama.cpp's
//! router, [`llama_router`]); Ollama's `keep_alive` or vLLM's sleep mode would be further
//! variants behind the same four verbs (catalogue, states, window, begin). The mapping from
//! the engine's models to the adapter's targets ([`target_states`]) is pure; [`refresh`]
//! observes the engine and reports the finding to the availability board
//! ([`crate::board`]), and [`probe_loop`] does that every probe interval (the plain prober,
//! [`crate::probe`], hands a managed adapter's engine to it). The command side is in
//! [`crate::model_commands`], above the adapters. Nothing here decides which model to load:
//! the edge does.

pub mod llama_router;

use std::collections::BTreeMap;

use edge::domain::Target;
use edge::domain::models::{LoadState, ManagedAdapter, ModelAction, TargetLoad};
use tokio_util::sync::CancellationToken;

use super::OpenAiAdapter;
use super::settings::{Lifecycle, OpenAiSettings};
use crate::board::{Board, Finding};
use crate::engine_health::EngineHealth;
use crate::fault::UpstreamFault;
use crate::upstream::{Upstream, same_model};
use llama_router::LlamaRouter;

/// One model as its engine holds it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EngineModel {
    /// Its state.
    pub state: LoadState,
    /// With [`LoadState::Failed`]: the engine's reason.
    pub failure: String,
}

/// What a managed engine holds: every model it can load, by the engine's own id, and how
/// many it holds loaded at once.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Catalogue {
    /// How many models it holds loaded at once; 0 when it sets no limit.
    pub capacity: u32,
    /// Its models by id.
    pub models: BTreeMap<String, EngineModel>,
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
}

/// The engine of a managed adapter.
#[derive(Debug)]
pub struct ManagedEngine {
    engine: Engine,
    /// Held while the engine is observed and the finding reported, so that an older
    /// observation (the prober's) never overwrites a newer one (a command's).
    observing: tokio::sync::Mutex<()>,
}

/// The lifecycles the node knows, one per `lifecycle` setting.
#[derive(Debug)]
enum Engine {
    /// `lifecycle = "llama-router"`.
    LlamaRouter(LlamaRouter),
}

impl ManagedEngine {
    /// The engine `upstream` reaches, managed as `lifecycle` says.
    pub fn new(lifecycle: Lifecycle, upstream: Upstream) -> Self {
        let engine = match lifecycle {
            Lifecycle::LlamaRouter => Engine::LlamaRouter(LlamaRouter::new(upstream)),
        };
        Self {
            engine,
            observing: tokio::sync::Mutex::new(()),
        }
    }

    /// The engine's name, for messages.
    pub fn name(&self) -> &'static str {
        match self.engine {
            Engine::LlamaRouter(_) => "llama-server",
        }
    }

    async fn catalogue(&self) -> Result<Catalogue, UpstreamFault> {
        match &self.engine {
            Engine::LlamaRouter(router) => router.catalogue().await,
        }
    }

    /// Every model it can load, by id, with its state.
    ///
    /// # Errors
    /// The fault when it cannot be asked or lists nothing readable.
    pub async fn states(&self) -> Result<BTreeMap<String, EngineModel>, UpstreamFault> {
        match &self.engine {
            Engine::LlamaRouter(router) => router.states().await,
        }
    }

    async fn window(&self, id: &str) -> Option<u32> {
        match &self.engine {
            Engine::LlamaRouter(router) => router.window(id).await,
        }
    }

    /// Asks it to load or unload `id`; its answer only says the work has begun.
    ///
    /// # Errors
    /// [`BeginError::Refused`] when it refuses, [`BeginError::Fault`] when it cannot be
    /// asked.
    pub async fn begin(&self, action: ModelAction, id: &str) -> Result<(), BeginError> {
        match &self.engine {
            Engine::LlamaRouter(router) => router.begin(action, id).await,
        }
    }
}

/// A managed adapter's configured targets as its engine's catalogue has them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TargetStates {
    /// The engine's capacity and every configured target it lists, with its state.
    pub managed: ManagedAdapter,
    /// The targets it serves now (loaded or asleep), each with its engine model id.
    pub served: Vec<(String, String)>,
    /// The configured targets it does not list.
    pub unlisted: Vec<String>,
}

/// Maps `catalogue` onto `targets` through the model map of `settings` (a target's engine
/// model is `model.<target>`, else the target itself; Ollama's `:latest` may be left out).
pub fn target_states(
    targets: &[String],
    settings: &OpenAiSettings,
    catalogue: &Catalogue,
) -> TargetStates {
    // The engine's limit, or the setting's when lower (0: the engine gave none).
    let capacity = match (catalogue.capacity, settings.capacity) {
        (engine, None) => engine,
        (0, Some(setting)) => setting,
        (engine, Some(setting)) => engine.min(setting),
    };
    let mut states = TargetStates {
        managed: ManagedAdapter {
            capacity,
            targets: BTreeMap::new(),
        },
        served: Vec::new(),
        unlisted: Vec::new(),
    };
    for target in targets {
        let wanted = settings.upstream_model(target);
        let listed = catalogue.models.get_key_value(wanted).or_else(|| {
            catalogue
                .models
                .iter()
                .find(|(id, _)| same_model(id, wanted))
        });
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
        };
        states.managed.targets.insert(name, load);
    }
    states
}

/// What the engine said when it was last observed.
#[derive(Debug, Clone)]
pub struct Observed {
    /// Its catalogue.
    pub catalogue: Catalogue,
    /// The configured targets it does not list.
    pub unlisted: Vec<String>,
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
    let states = target_states(adapter.targets(), settings, &catalogue);
    let mut windows = BTreeMap::new();
    for (target, id) in &states.served {
        let loaded = catalogue
            .models
            .get(id)
            .is_some_and(|model| model.state == LoadState::Loaded);
        // A setting wins; an asleep model is not asked (it would wake).
        let window = match settings.window_of(target) {
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
    })
}

/// What to do so `target` (whose engine model is `wanted`) is among the engine's `listed`
/// models, for the warning about a target the engine does not list.
pub fn unlisted_fix(target: &str, wanted: &str, listed: &[&String]) -> String {
    format!(
        "the engine lists no model {wanted:?} (it lists {listed:?}): set `model.{target}` to \
         one of those, or give the engine that model (llama-server's router lists each GGUF \
         file of --models-dir by its name without `.gguf`)"
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
            warn_unlisted(adapter, seen, &mut warned);
        }
        let settings = adapter.settings();
        let wait = if observed.is_ok() {
            settings.probe_interval
        } else {
            settings.probe_down_interval
        };
        tokio::select! {
            () = tokio::time::sleep(wait) => {}
            () = stop.cancelled() => return,
        }
    }
}

/// Warns about each configured target the engine does not list, when the set changed.
fn warn_unlisted(adapter: &OpenAiAdapter, seen: &Observed, warned: &mut Vec<String>) {
    if seen.unlisted == *warned {
        return;
    }
    let listed: Vec<&String> = seen.catalogue.models.keys().collect();
    for target in &seen.unlisted {
        let wanted = adapter.settings().upstream_model(target);
        tracing::warn!(
            adapter = adapter.name(),
            target = %target,
            fix = %unlisted_fix(target, wanted, &listed),
            "a configured target is not in the managed engine's catalogue, so the edge can neither use nor load it"
        );
    }
    warned.clone_from(&seen.unlisted);
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
                    };
                    ((*id).to_owned(), model)
                })
                .collect(),
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
            target_states(&targets, &settings(pairs), &engine)
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
            target_states(&targets, &set, &unlimited).managed.capacity,
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
        let states = target_states(&targets, &settings(&[]), &engine);
        assert_eq!(states.managed.capacity, 2);
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
        let states = target_states(&targets, &settings, &engine);
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
        let fix = unlisted_fix("qwen", "qwen2.5", &[&alpha]);
        assert!(fix.contains("`model.qwen`"), "{fix}");
        assert!(fix.contains(r#"["alpha"]"#), "{fix}");
        assert!(fix.contains("--models-dir"), "{fix}");
    }
}
