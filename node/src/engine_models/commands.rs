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

use std::time::Duration;

use edge::client::{ModelCommand, ModelOutcome};
use edge::domain::models::{LoadState, ModelAction};
use tokio::sync::mpsc;
use tokio::time::Instant;

use super::{EngineModel, ManagedEngine, refresh};
use crate::adapters::{AdapterSet, Lookup};
use crate::lifecycle::Core;
use crate::openai::OpenAiAdapter;
use crate::openai::errors::UpstreamFault;

/// How often a command in progress asks the engine for the target's state.
const FOLLOW_INTERVAL: Duration = Duration::from_millis(10);

/// Starts carrying out `command` as a task of `core`; its outcome goes to `outcomes`.
pub fn start(command: ModelCommand, core: &Core, outcomes: &mpsc::Sender<ModelOutcome>) {
    tracing::info!(
        command_id = %command.command_id, model = %command.model, action = command.action.as_str(),
        reason = %command.reason, "the edge sent a model command"
    );
    let board = core.adapters.clone();
    let (draining, exit) = (core.draining.clone(), core.exit.clone());
    let outcomes = outcomes.clone();
    core.tasks.spawn(async move {
        let started = Instant::now();
        let outcome = tokio::select! {
            biased;
            () = exit.cancelled() => return,
            () = draining.cancelled() => refused(&command, "the node is shutting down".into()),
            outcome = answer(&command, &board) => outcome,
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
async fn answer(command: &ModelCommand, board: &AdapterSet) -> ModelOutcome {
    let lookup = board.lookup(
        command.model.adapter.as_str(),
        command.model.target.as_str(),
    );
    match managed(command, &lookup) {
        Ok((adapter, engine)) => carry_out(command, adapter, engine, board).await,
        Err(refusal) => refused(command, refusal),
    }
}

/// The adapter and engine that can carry out `command`, or why there is none.
fn managed<'a>(
    command: &ModelCommand,
    lookup: &'a Lookup,
) -> Result<(&'a OpenAiAdapter, &'a ManagedEngine), String> {
    let name = &command.model.adapter;
    let adapter = match lookup {
        Lookup::Unknown => return Err(format!("this node has no adapter {name}")),
        Lookup::Broken(problem) => return Err(format!("adapter {name} cannot run: {problem}")),
        Lookup::Ready { adapter, .. } => adapter,
    };
    let Some(engine) = adapter.managed() else {
        return Err(format!(
            "adapter {name} does not load or unload models: its settings set no `lifecycle`"
        ));
    };
    let target = command.model.target.as_str();
    if !adapter.targets().iter().any(|t| t == target) {
        return Err(format!("{target} is not a target of adapter {name}"));
    }
    Ok((adapter, engine))
}

/// Asks the engine to begin, then follows it until the target has settled.
async fn carry_out(
    command: &ModelCommand,
    adapter: &OpenAiAdapter,
    engine: &ManagedEngine,
    board: &AdapterSet,
) -> ModelOutcome {
    let action = command.action;
    let id = adapter
        .settings()
        .upstream_model(command.model.target.as_str());
    let limit = adapter.settings().load_timeout;
    let deadline = Instant::now() + limit;
    let begun = tokio::time::timeout_at(deadline, engine.begin(action, id))
        .await
        .unwrap_or_else(|_| Err(timed_out(action, limit, None)));
    if let Err(refusal) = begun {
        let seen = refresh(adapter, engine, board).await.ok();
        let state = seen.and_then(|seen| seen.catalogue.models.get(id).map(|m| m.state));
        let message = format!(
            "{} did not {} {id}: {refusal}",
            engine.name(),
            action.as_str()
        );
        return outcome(command, Err(message), state);
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
    board: &AdapterSet,
) -> (Result<(), String>, Option<LoadState>) {
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
            return (
                Err(timed_out(action, limit, fault.as_ref())),
                last.flatten(),
            );
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
) -> Option<Result<(), String>> {
    let Some(model) = model else {
        return Some(match action {
            ModelAction::Load => Err(format!("the engine no longer lists {id}")),
            ModelAction::Unload => Ok(()),
        });
    };
    match (action, model.state) {
        (ModelAction::Load, LoadState::Loaded | LoadState::Sleeping)
        | (ModelAction::Unload, LoadState::Unloaded | LoadState::Failed) => Some(Ok(())),
        (ModelAction::Load, LoadState::Loading)
        | (ModelAction::Unload, LoadState::Loaded | LoadState::Loading | LoadState::Sleeping) => {
            None
        }
        (ModelAction::Load, LoadState::Failed) => Some(Err(model.failure.clone())),
        // The engine sets a model loading before it answers the load; back to unloaded
        // without a failure, someone unloaded it meanwhile.
        (ModelAction::Load, LoadState::Unloaded) => {
            Some(Err(format!("{id} was unloaded before it finished loading")))
        }
    }
}

/// The message of an action that did not settle within `limit`.
fn timed_out(action: ModelAction, limit: Duration, fault: Option<&UpstreamFault>) -> String {
    let mut message = format!(
        "{} timed out after {} ms",
        action.as_str(),
        limit.as_millis()
    );
    if let Some(fault) = fault {
        message.push_str(&format!("; the engine could not be asked: {fault}"));
    }
    message
}

fn outcome(
    command: &ModelCommand,
    result: Result<(), String>,
    state: Option<LoadState>,
) -> ModelOutcome {
    ModelOutcome {
        command_id: command.command_id.clone(),
        ok: result.is_ok(),
        message: result.err().unwrap_or_default(),
        state,
    }
}

/// The answer to a command the node cannot carry out.
fn refused(command: &ModelCommand, message: String) -> ModelOutcome {
    outcome(command, Err(message), None)
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
        managed(&command(model, ModelAction::Load), lookup).expect_err("refused")
    }

    #[test]
    fn commands_the_node_cannot_carry_out_say_why() {
        let unknown = refusal("ollama/alpha", &Lookup::Unknown);
        assert_eq!(unknown, "this node has no adapter ollama");
        let broken = refusal("llama/alpha", &Lookup::Broken("bad `base_url`".into()));
        assert!(broken.contains("bad `base_url`"), "{broken}");
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
        }
    }

    #[test]
    fn a_load_settles_loaded_or_failed_with_the_engines_reason() {
        let load = |m: Option<&EngineModel>| settled(ModelAction::Load, "alpha", m);
        assert_eq!(load(Some(&model(LoadState::Loading, ""))), None);
        assert_eq!(load(Some(&model(LoadState::Loaded, ""))), Some(Ok(())));
        assert_eq!(load(Some(&model(LoadState::Sleeping, ""))), Some(Ok(())));
        assert_eq!(
            load(Some(&model(LoadState::Failed, "exited with code 1"))),
            Some(Err("exited with code 1".into()))
        );
        let unloaded = load(Some(&model(LoadState::Unloaded, "")));
        assert!(matches!(unloaded, Some(Err(m)) if m.contains("unloaded before")));
        assert!(matches!(load(None), Some(Err(m)) if m.contains("no longer lists alpha")));
    }

    #[test]
    fn an_unload_settles_once_the_model_holds_no_place() {
        let unload = |m: Option<&EngineModel>| settled(ModelAction::Unload, "alpha", m);
        for state in [LoadState::Loaded, LoadState::Loading, LoadState::Sleeping] {
            assert_eq!(unload(Some(&model(state, ""))), None, "{state:?}");
        }
        assert_eq!(unload(Some(&model(LoadState::Unloaded, ""))), Some(Ok(())));
        assert_eq!(unload(Some(&model(LoadState::Failed, "x"))), Some(Ok(())));
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
        let late = timed_out(ModelAction::Load, Duration::from_millis(1_500), None);
        assert_eq!(late, "load timed out after 1500 ms");
        let fault = UpstreamFault::Unreachable("connection refused".into());
        let down = timed_out(ModelAction::Unload, Duration::from_secs(2), Some(&fault));
        assert!(
            down.starts_with("unload timed out after 2000 ms;") && down.contains("refused"),
            "{down}"
        );
        let no = refused(&command, "no".into());
        assert!(!no.ok && no.message == "no" && no.state.is_none());
    }
}
