//! The edge's model commands (`ModelCommand`): load or unload one target of a managed
//! adapter, then answer with one `ModelOutcome`.
//!
//! Each command runs as an owned task (the node's task tracker), beside the runs and never
//! in the session's read loop: it asks the engine to begin, follows the engine's state with
//! a short poll until the target is loaded (or unloaded), the engine says the load failed,
//! or `load_timeout_ms` passes, and publishes every state change to the availability board
//! as it sees it, so the edge hears the availability report that shows the target served
//! before the outcome that says so. A command for an adapter that is not managed, or a
//! target it does not have, is answered `ok = false` at once; while the node drains, every
//! command is. The outcome goes to the session the command came on; if that one has ended,
//! the outcome is dropped (the edge reads the next availability report instead).
//!
//! Above the adapters, beside [`crate::dispatch`] (which does the same for runs): it finds
//! the adapter a command names, and drives its managed engine
//! ([`crate::openai::engine_models`]) through the engine's own verbs.

use std::sync::Arc;
use std::time::Duration;

use edge::client::{ModelCommand, ModelOutcome};
use edge::domain::models::{LoadState, ModelAction};
use tokio::sync::mpsc;
use tokio::time::Instant;

use crate::adapters::{AdapterSet, Lookup, Misconfigured};
use crate::board::Board;
use crate::fault::UpstreamFault;
use crate::openai::OpenAiAdapter;
use crate::openai::engine_models::{BeginError, EngineModel, ManagedEngine, refresh};
use crate::shared::Core;

/// Why a model command was not carried out: the outcome's `ok = false` and its message.
#[derive(Debug, thiserror::Error)]
pub enum CommandError {
    /// The node is shutting down.
    #[error("the node is shutting down")]
    ShuttingDown,
    /// The edge configured no such adapter here.
    #[error("this node has no adapter {adapter}")]
    NoAdapter {
        /// The adapter named.
        adapter: String,
    },
    /// The adapter is configured but cannot run.
    #[error("adapter {adapter} cannot run: {source}")]
    Broken {
        /// The adapter.
        adapter: String,
        /// Why.
        #[source]
        source: Arc<Misconfigured>,
    },
    /// The adapter's settings name no `lifecycle`.
    #[error("adapter {adapter} does not load or unload models: its settings set no `lifecycle`")]
    Unmanaged {
        /// The adapter.
        adapter: String,
    },
    /// The adapter has no such target.
    #[error("{target} is not a target of adapter {adapter}")]
    NotATarget {
        /// The adapter.
        adapter: String,
        /// The target named.
        target: String,
    },
    /// The engine did not begin the load or unload.
    #[error("{engine} did not {} {id}: {source}", .action.as_str())]
    NotBegun {
        /// The engine's name.
        engine: &'static str,
        /// What it was told.
        action: ModelAction,
        /// The engine's model id.
        id: String,
        /// Why.
        #[source]
        source: BeginError,
    },
    /// A load whose model the engine no longer lists.
    #[error("the engine no longer lists {id}")]
    NoLongerListed {
        /// The engine's model id.
        id: String,
    },
    /// The engine says the load failed.
    #[error("{reason}")]
    LoadFailed {
        /// The engine's reason.
        reason: String,
    },
    /// The model was unloaded (by someone else) while it was loading.
    #[error("{id} was unloaded before it finished loading")]
    UnloadedWhileLoading {
        /// The engine's model id.
        id: String,
    },
    /// The engine did not answer the load or unload within `load_timeout_ms`.
    #[error(
        "{engine} did not {action} {id}: {action} timed out after {ms} ms",
        action = .action.as_str(),
        ms = .limit.as_millis()
    )]
    BeginTimedOut {
        /// The engine's name.
        engine: &'static str,
        /// What it was told.
        action: ModelAction,
        /// The engine's model id.
        id: String,
        /// `load_timeout_ms`.
        limit: Duration,
    },
    /// The action did not settle within `load_timeout_ms`.
    #[error(
        "{action} timed out after {ms} ms{asked}",
        action = .action.as_str(),
        ms = .limit.as_millis(),
        asked = could_not_ask(.fault.as_ref())
    )]
    TimedOut {
        /// What it was told.
        action: ModelAction,
        /// `load_timeout_ms`.
        limit: Duration,
        /// Why the engine could not be asked at the last look, if it could not.
        #[source]
        fault: Option<UpstreamFault>,
    },
}

/// How often a command in progress asks the engine for the target's state.
const FOLLOW_INTERVAL: Duration = Duration::from_millis(10);

/// Starts carrying out `command` as a task of `core`; its outcome goes to `outcomes`.
pub fn start(command: ModelCommand, core: &Core, outcomes: &mpsc::Sender<ModelOutcome>) {
    tracing::info!(
        command_id = %command.command_id, model = %command.model, action = command.action.as_str(),
        reason = %command.reason, "the edge sent a model command"
    );
    let adapters = core.adapters.clone();
    let (draining, exit) = (core.draining.clone(), core.exit.clone());
    let outcomes = outcomes.clone();
    core.tasks.spawn(async move {
        let started = Instant::now();
        let outcome = tokio::select! {
            biased;
            () = exit.cancelled() => return,
            () = draining.cancelled() => refused(&command, CommandError::ShuttingDown),
            outcome = answer(&command, &adapters) => outcome,
        };
        tracing::info!(
            command_id = %outcome.command_id, model = %command.model, action = command.action.as_str(),
            ok = outcome.ok, message = %outcome.message, state = outcome.state.map(LoadState::as_str),
            elapsed_ms = started.elapsed().as_millis() as u64, "model command done"
        );
        let sent = tokio::select! {
            sent = outcomes.send(outcome) => sent.is_ok(),
            () = exit.cancelled() => false,
        };
        if !sent {
            tracing::debug!(
                command_id = %command.command_id,
                "the connection the command came on has ended: its outcome is dropped"
            );
        }
    });
}

/// What the node answers `command`, once carried out (or refused).
async fn answer(command: &ModelCommand, adapters: &AdapterSet) -> ModelOutcome {
    let lookup = adapters.lookup(
        command.model.adapter.as_str(),
        command.model.target.as_str(),
    );
    match managed(command, &lookup) {
        Ok((adapter, engine)) => carry_out(command, adapter, engine, adapters.board()).await,
        Err(refusal) => refused(command, refusal),
    }
}

/// The adapter and engine that can carry out `command`, or why there is none.
///
/// # Errors
/// [`CommandError::NoAdapter`], [`CommandError::Broken`], [`CommandError::Unmanaged`] or
/// [`CommandError::NotATarget`].
fn managed<'a>(
    command: &ModelCommand,
    lookup: &'a Lookup,
) -> Result<(&'a OpenAiAdapter, &'a ManagedEngine), CommandError> {
    let name = command.model.adapter.to_string();
    let adapter = match lookup {
        Lookup::Unknown => return Err(CommandError::NoAdapter { adapter: name }),
        Lookup::Broken(problem) => {
            return Err(CommandError::Broken {
                adapter: name,
                source: Arc::clone(problem),
            });
        }
        Lookup::Ready { adapter, .. } => adapter,
    };
    let Some(engine) = adapter.managed() else {
        return Err(CommandError::Unmanaged { adapter: name });
    };
    let target = command.model.target.as_str();
    if !adapter.targets().iter().any(|t| t == target) {
        return Err(CommandError::NotATarget {
            adapter: name,
            target: target.to_owned(),
        });
    }
    Ok((adapter, engine))
}

/// Asks the engine to begin, then follows it until the target has settled.
async fn carry_out(
    command: &ModelCommand,
    adapter: &OpenAiAdapter,
    engine: &ManagedEngine,
    board: &Board,
) -> ModelOutcome {
    let action = command.action;
    let id = adapter
        .settings()
        .upstream_model(command.model.target.as_str());
    let limit = adapter.settings().load_timeout;
    let deadline = Instant::now() + limit;
    // An engine doing the whole load in one call held open says nothing meanwhile: the
    // model is loading while the call is, and the edge hears so at once.
    let mark = engine.mark(action, id);
    if mark.is_some() {
        let _ = refresh(adapter, engine, board).await;
    }
    let begun = tokio::time::timeout_at(deadline, engine.begin(action, id)).await;
    drop(mark);
    let begun = match begun {
        Ok(begun) => begun.map_err(|source| CommandError::NotBegun {
            engine: engine.name(),
            action,
            id: id.to_owned(),
            source,
        }),
        Err(_) => Err(CommandError::BeginTimedOut {
            engine: engine.name(),
            action,
            id: id.to_owned(),
            limit,
        }),
    };
    if let Err(refusal) = begun {
        let seen = refresh(adapter, engine, board).await.ok();
        let state = seen.and_then(|seen| seen.catalogue.models.get(id).map(|m| m.state));
        return outcome(command, Err(refusal), state);
    }
    let (result, state) = follow(action, id, deadline, adapter, engine, board).await;
    outcome(command, result, state)
}

/// Polls the engine until model `id` has settled after `action`, or `deadline`; reports
/// every change of its state to `board` as it is seen. Returns the result and the state
/// seen last.
async fn follow(
    action: ModelAction,
    id: &str,
    deadline: Instant,
    adapter: &OpenAiAdapter,
    engine: &ManagedEngine,
    board: &Board,
) -> (Result<(), CommandError>, Option<LoadState>) {
    let limit = adapter.settings().load_timeout;
    // The state seen last: `None` before the first answer, `Some(None)` for "not listed".
    let mut last: Option<Option<LoadState>> = None;
    loop {
        let fault = match engine.states().await {
            Ok(models) => {
                let model = models.get(id);
                let state = model.map(|model| model.state);
                if last != Some(state) {
                    // Published before the outcome is sent: the edge hears it first.
                    let _ = refresh(adapter, engine, board).await;
                    last = Some(state);
                }
                if let Some(result) = settled(action, id, model) {
                    return (result, state);
                }
                None
            }
            Err(fault) => Some(fault),
        };
        if Instant::now() >= deadline {
            let timed_out = CommandError::TimedOut {
                action,
                limit,
                fault,
            };
            return (Err(timed_out), last.flatten());
        }
        tokio::time::sleep_until(deadline.min(Instant::now() + FOLLOW_INTERVAL)).await;
    }
}

/// Whether model `id`, as the engine lists it now, has settled after `action`: `Ok` when it
/// did what it was told, the reason when it cannot; `None` while it is on its way.
fn settled(
    action: ModelAction,
    id: &str,
    model: Option<&EngineModel>,
) -> Option<Result<(), CommandError>> {
    let Some(model) = model else {
        return Some(match action {
            ModelAction::Load => Err(CommandError::NoLongerListed { id: id.to_owned() }),
            ModelAction::Unload => Ok(()),
        });
    };
    match (action, model.state) {
        (ModelAction::Load, LoadState::Loaded | LoadState::Sleeping)
        | (ModelAction::Unload, LoadState::Unloaded | LoadState::Failed | LoadState::Asleep) => {
            Some(Ok(()))
        }
        (ModelAction::Load, LoadState::Loading)
        | (ModelAction::Unload, LoadState::Loaded | LoadState::Loading | LoadState::Sleeping) => {
            None
        }
        (ModelAction::Load, LoadState::Failed) => Some(Err(CommandError::LoadFailed {
            reason: model.failure.clone(),
        })),
        // The engine sets a model loading before it answers the load (or the node does, while
        // its call is open); back to unloaded (or asleep) without a failure, someone
        // unloaded it meanwhile.
        (ModelAction::Load, LoadState::Unloaded | LoadState::Asleep) => {
            Some(Err(CommandError::UnloadedWhileLoading {
                id: id.to_owned(),
            }))
        }
    }
}

/// What a timed-out action's message adds when the engine could not be asked at the last
/// look.
fn could_not_ask(fault: Option<&UpstreamFault>) -> String {
    fault.map_or_else(String::new, |fault| {
        format!("; the engine could not be asked: {fault}")
    })
}

fn outcome(
    command: &ModelCommand,
    result: Result<(), CommandError>,
    state: Option<LoadState>,
) -> ModelOutcome {
    ModelOutcome {
        command_id: command.command_id.clone(),
        ok: result.is_ok(),
        message: result
            .err()
            .map(|error| error.to_string())
            .unwrap_or_default(),
        state,
    }
}

/// The answer to a command the node cannot carry out.
fn refused(command: &ModelCommand, refusal: CommandError) -> ModelOutcome {
    outcome(command, Err(refusal), None)
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;
    use std::sync::Arc;

    use edge::client::ReceivedAdapter;
    use edge::domain::models::ModelName;

    use super::*;

    fn command(model: &str, action: ModelAction) -> ModelCommand {
        ModelCommand {
            command_id: "c-1".into(),
            model: ModelName::parse(model).expect("model"),
            action,
            reason: "test".into(),
        }
    }

    fn ready(settings: &[(&str, &str)]) -> Lookup {
        let mut settings: BTreeMap<String, String> = settings
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        settings.insert("base_url".into(), "http://127.0.0.1:1/v1".into());
        let config = ReceivedAdapter {
            name: "llama".into(),
            targets: vec!["alpha".into()],
            settings,
        };
        let adapter = OpenAiAdapter::new(&config).expect("adapter");
        Lookup::Ready {
            adapter: Arc::new(adapter),
            available: None,
        }
    }

    fn refusal(model: &str, lookup: &Lookup) -> String {
        managed(&command(model, ModelAction::Load), lookup)
            .expect_err("refused")
            .to_string()
    }

    #[test]
    fn commands_the_node_cannot_carry_out_say_why() {
        let unknown = refusal("ollama/alpha", &Lookup::Unknown);
        assert_eq!(unknown, "this node has no adapter ollama");
        let problem = Misconfigured::UnknownKind {
            kind: "vllm".into(),
        };
        let broken = refusal("llama/alpha", &Lookup::Broken(Arc::new(problem)));
        assert!(
            broken.starts_with("adapter llama cannot run: unknown adapter kind \"vllm\""),
            "{broken}"
        );
        let plain = refusal("llama/alpha", &ready(&[]));
        assert!(
            plain.contains("does not load or unload") && plain.contains("`lifecycle`"),
            "{plain}"
        );
        let managed_adapter = ready(&[("lifecycle", "llama-router")]);
        let stranger = refusal("llama/omega", &managed_adapter);
        assert_eq!(stranger, "omega is not a target of adapter llama");
        let command = command("llama/alpha", ModelAction::Unload);
        assert!(managed(&command, &managed_adapter).is_ok());
    }

    fn model(state: LoadState, failure: &str) -> EngineModel {
        EngineModel {
            state,
            failure: failure.into(),
            window: None,
            footprint: None,
        }
    }

    /// What [`settled`] says, its reason as the outcome's message.
    fn said(settled: Option<Result<(), CommandError>>) -> Option<Result<(), String>> {
        settled.map(|result| result.map_err(|error| error.to_string()))
    }

    #[test]
    fn a_load_settles_loaded_or_failed_with_the_engines_reason() {
        let load = |m: Option<&EngineModel>| said(settled(ModelAction::Load, "alpha", m));
        assert_eq!(load(Some(&model(LoadState::Loading, ""))), None);
        assert_eq!(load(Some(&model(LoadState::Loaded, ""))), Some(Ok(())));
        assert_eq!(load(Some(&model(LoadState::Sleeping, ""))), Some(Ok(())));
        assert_eq!(
            load(Some(&model(LoadState::Failed, "exited with code 1"))),
            Some(Err("exited with code 1".into()))
        );
        let unloaded = load(Some(&model(LoadState::Unloaded, "")));
        assert!(matches!(unloaded, Some(Err(m)) if m.contains("unloaded before")));
        // A wake answered and then asleep again: the load did not hold.
        let asleep = load(Some(&model(LoadState::Asleep, "")));
        assert!(matches!(asleep, Some(Err(m)) if m.contains("unloaded before")));
        assert!(matches!(load(None), Some(Err(m)) if m.contains("no longer lists alpha")));
    }

    #[test]
    fn an_unload_settles_once_the_model_holds_no_place() {
        let unload = |m: Option<&EngineModel>| said(settled(ModelAction::Unload, "alpha", m));
        for state in [LoadState::Loaded, LoadState::Loading, LoadState::Sleeping] {
            assert_eq!(unload(Some(&model(state, ""))), None, "{state:?}");
        }
        assert_eq!(unload(Some(&model(LoadState::Unloaded, ""))), Some(Ok(())));
        assert_eq!(unload(Some(&model(LoadState::Failed, "x"))), Some(Ok(())));
        // A vLLM server put to sleep holds no place.
        assert_eq!(unload(Some(&model(LoadState::Asleep, ""))), Some(Ok(())));
        assert_eq!(unload(None), Some(Ok(())));
    }

    #[test]
    fn outcomes_echo_the_command_and_say_why_not() {
        let command = command("llama/alpha", ModelAction::Load);
        let done = outcome(&command, Ok(()), Some(LoadState::Loaded));
        assert_eq!(
            done,
            ModelOutcome {
                command_id: "c-1".into(),
                ok: true,
                message: String::new(),
                state: Some(LoadState::Loaded),
            }
        );
        let late = CommandError::TimedOut {
            action: ModelAction::Load,
            limit: Duration::from_millis(1_500),
            fault: None,
        };
        assert_eq!(late.to_string(), "load timed out after 1500 ms");
        let down = CommandError::TimedOut {
            action: ModelAction::Unload,
            limit: Duration::from_secs(2),
            fault: Some(UpstreamFault::Unreachable("connection refused".into())),
        }
        .to_string();
        assert!(
            down.starts_with("unload timed out after 2000 ms;") && down.contains("refused"),
            "{down}"
        );
        let begun_late = CommandError::BeginTimedOut {
            engine: "llama-server",
            action: ModelAction::Load,
            id: "alpha".into(),
            limit: Duration::from_millis(1_500),
        };
        assert_eq!(
            begun_late.to_string(),
            "llama-server did not load alpha: load timed out after 1500 ms"
        );
        let no = refused(&command, CommandError::ShuttingDown);
        assert!(!no.ok && no.message == "the node is shutting down" && no.state.is_none());
    }
}
