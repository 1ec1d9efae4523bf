//! A simulated managed engine, for the model lifecycle's tests: which of its targets are
//! loaded, how many it holds at once, which loads fail. It answers the edge's model
//! commands like llama-server's router with `--no-models-autoload`: a load into a full
//! engine is refused (the edge must unload first), a run for a target that is not loaded
//! fails, every change is reported in a fresh availability report.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use edge::client::{NodeCommand, NodeFrame, run_event};
use edge::domain::models::{LoadState, ManagedAdapter, ModelAction, TargetLoad};
use edge::domain::{AdapterName, Availability, RunEventKind, Target};
use edge::ports::{ModelCommand, ModelOutcome};
use tokio::sync::mpsc;

/// What a mock node's managed engine can do.
#[derive(Debug, Clone)]
pub struct MockEngine {
    /// How many targets it holds at once.
    pub capacity: u32,
    /// Every target it may hold (of the `echo` adapter).
    pub targets: Vec<String>,
    /// Those loaded at start.
    pub loaded: Vec<String>,
    /// Targets whose loads fail, with the engine's reason.
    pub failing: Vec<String>,
    /// How long a load takes.
    pub load_time: Duration,
}

impl MockEngine {
    /// An engine holding `capacity` of `targets`, nothing loaded, every load instant.
    pub fn new(capacity: u32, targets: &[&str]) -> Self {
        Self {
            capacity,
            targets: targets.iter().map(|t| (*t).to_owned()).collect(),
            loaded: Vec::new(),
            failing: Vec::new(),
            load_time: Duration::ZERO,
        }
    }
}

/// The engine's state, shared with the test that started the node.
#[derive(Debug, Clone)]
pub struct EngineState {
    inner: Arc<Mutex<Held>>,
}

#[derive(Debug)]
struct Held {
    engine: MockEngine,
    states: BTreeMap<String, TargetLoad>,
    /// Every command, in order: `load alpha`, `unload beta`.
    log: Vec<String>,
}

/// The reason a failing load gives.
pub const LOAD_FAILURE: &str = "mock engine: out of memory loading the model";

impl EngineState {
    pub(crate) fn new(engine: MockEngine) -> Self {
        let states = engine
            .targets
            .iter()
            .map(|t| {
                let state = if engine.loaded.contains(t) {
                    LoadState::Loaded
                } else {
                    LoadState::Unloaded
                };
                (t.clone(), TargetLoad::new(state))
            })
            .collect();
        let held = Held {
            engine,
            states,
            log: Vec::new(),
        };
        Self {
            inner: Arc::new(Mutex::new(held)),
        }
    }

    fn held(&self) -> MutexGuard<'_, Held> {
        self.inner
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The targets loaded now, as the engine itself says.
    pub fn loaded(&self) -> BTreeSet<String> {
        let held = self.held();
        held.states
            .iter()
            .filter(|(_, load)| load.state == LoadState::Loaded)
            .map(|(t, _)| t.clone())
            .collect()
    }

    /// Every command the engine was given, in order (`load alpha`, `unload beta`).
    pub fn log(&self) -> Vec<String> {
        self.held().log.clone()
    }

    /// Whether `target` is loaded.
    pub fn is_loaded(&self, target: &str) -> bool {
        self.loaded().contains(target)
    }

    /// The availability report of this engine's state.
    pub fn availability(&self) -> Availability {
        let held = self.held();
        let adapter = echo();
        let mut pairs = Vec::new();
        let mut targets = BTreeMap::new();
        for (name, load) in &held.states {
            let Ok(target) = Target::parse(name) else {
                continue;
            };
            if load.state == LoadState::Loaded {
                pairs.push((adapter.clone(), target.clone()));
            }
            targets.insert(target, load.clone());
        }
        let capacity = held.engine.capacity;
        Availability::new(pairs).with_managed(
            adapter,
            ManagedAdapter {
                capacity,
                parallel: 0,
                targets,
                budget: None,
            },
        )
    }

    /// Takes what the engine answers itself: a model command (carried out on a task of its
    /// own) and a run for a target that is not loaded (failed, as llama-server's router
    /// refuses it). Returns any other command.
    pub(crate) async fn intercept(
        &self,
        command: NodeCommand,
        frames: &mpsc::Sender<NodeFrame>,
    ) -> Option<NodeCommand> {
        match command {
            NodeCommand::Model(command) => {
                let (engine, frames) = (self.clone(), frames.clone());
                tokio::spawn(async move { engine.obey(command, frames).await });
                None
            }
            NodeCommand::Run(run) if !self.is_loaded(run.target.as_str()) => {
                let refused = RunEventKind::failed("model_not_loaded", "model is not loaded");
                let _ = frames
                    .send(run_event(run.run_id.as_str(), 1, refused))
                    .await;
                None
            }
            other => Some(other),
        }
    }

    /// Carries out `command`, reporting each state change, then answers it.
    pub(crate) async fn obey(&self, command: ModelCommand, frames: mpsc::Sender<NodeFrame>) {
        let target = command.model.target.to_string();
        let result = match command.action {
            ModelAction::Load => self.load(&target, &frames).await,
            ModelAction::Unload => self.unload(&target),
        };
        let _ = frames.send(self.report()).await;
        let state = self.held().states.get(&target).map(|l| l.state);
        let (ok, message) = match result {
            Ok(()) => (true, String::new()),
            Err(message) => (false, message),
        };
        let outcome = ModelOutcome {
            command_id: command.command_id,
            ok,
            message,
            state,
        };
        let _ = frames.send(NodeFrame::ModelOutcome(outcome)).await;
    }

    async fn load(&self, target: &str, frames: &mpsc::Sender<NodeFrame>) -> Result<(), String> {
        let (load_time, fails) = {
            let mut held = self.held();
            held.log.push(format!("load {target}"));
            let Some(state) = held.states.get(target).map(|l| l.state) else {
                return Err(format!("mock engine: no model {target:?}"));
            };
            if state == LoadState::Loaded {
                return Ok(());
            }
            let holding = held
                .states
                .values()
                .filter(|l| l.state.holds_a_place())
                .count();
            if holding >= held.engine.capacity as usize {
                return Err(format!("mock engine: full ({} loaded)", holding));
            }
            held.states
                .insert(target.to_owned(), TargetLoad::new(LoadState::Loading));
            (
                held.engine.load_time,
                held.engine.failing.iter().any(|t| t == target),
            )
        };
        let _ = frames.send(self.report()).await;
        tokio::time::sleep(load_time).await;
        let mut held = self.held();
        if fails {
            let failed = TargetLoad {
                failure: LOAD_FAILURE.to_owned(),
                ..TargetLoad::new(LoadState::Failed)
            };
            held.states.insert(target.to_owned(), failed);
            return Err(LOAD_FAILURE.to_owned());
        }
        held.states
            .insert(target.to_owned(), TargetLoad::new(LoadState::Loaded));
        Ok(())
    }

    fn unload(&self, target: &str) -> Result<(), String> {
        let mut held = self.held();
        held.log.push(format!("unload {target}"));
        match held.states.get_mut(target) {
            Some(load) => {
                *load = TargetLoad::new(LoadState::Unloaded);
                Ok(())
            }
            None => Err(format!("mock engine: no model {target:?}")),
        }
    }

    /// A heartbeat carrying the engine's state.
    pub(crate) fn report(&self) -> NodeFrame {
        NodeFrame::Heartbeat {
            active_runs: 0,
            ping: 0,
            availability: Some(self.availability()),
            inventory: None,
        }
    }
}

fn echo() -> AdapterName {
    AdapterName::parse("echo").unwrap_or_else(|_| unreachable!("`echo` is a valid adapter name"))
}
