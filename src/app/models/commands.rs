//! Carrying out a plan's steps: each load (after the unload that makes room for it) and
//! each unload is sent to its node as a model command and awaited up to
//! `lifecycle.command_timeout_ms`; what happened goes to the book, the log, the feed and
//! the metrics, and the lifecycle reconciles again.

use tokio::sync::oneshot;
use tokio::time::Instant;
use tracing::{info, warn};

use super::{ModelService, lock};
use crate::domain::NodeId;
use crate::domain::models::{
    FitNote, LoadReason, LoadState, ModelAction, ModelName, Step, UnloadReason,
};
use crate::ports::clock::now_ms;
use crate::ports::{ModelCommand, ModelEvent, NodeCommand, TransportError};

/// Why a load or an unload did not happen. Its text is what the feed, the log, a cold
/// request's failure and the operator's answer say.
#[derive(Debug, thiserror::Error)]
pub(super) enum CommandError {
    /// The command could not be sent to the node.
    #[error("the node could not be told: {0}")]
    NotTold(#[source] TransportError),
    /// The node's engine answered that it did not do it, with its reason.
    #[error("{reason}")]
    Refused {
        /// The engine's reason, as the node reported it.
        reason: String,
    },
    /// The node's connection ended before it answered.
    #[error("the node left before answering")]
    NodeLeft,
    /// No answer came within `lifecycle.command_timeout_ms`.
    #[error("no answer within {timeout_ms} ms")]
    NoAnswer {
        /// The timeout waited, in milliseconds.
        timeout_ms: u128,
    },
    /// Runs of the model started on the node between the decision to unload it and now:
    /// it stays loaded, and serves again.
    #[error("{runs} run(s) of it started there meanwhile")]
    StartedMeanwhile {
        /// How many are in flight there.
        runs: u32,
    },
    /// The unload that was to make room for a load failed, so the load was not tried.
    #[error("could not unload {victim} to make room: {source}")]
    NoRoom {
        /// The model that was to be unloaded.
        victim: ModelName,
        /// Why it was not.
        #[source]
        source: Box<CommandError>,
    },
}

impl ModelService {
    /// Marks `step`'s node and models busy and carries it out on a task of its own.
    pub(super) fn start(&self, step: Step) {
        {
            let mut book = lock(&self.inner.book);
            match &step {
                Step::Load {
                    node, model, evict, ..
                } => {
                    book.busy
                        .insert((node.clone(), model.clone()), ModelAction::Load);
                    for victim in evict {
                        let victim = ModelName::new(model.adapter.clone(), victim.clone());
                        book.busy
                            .insert((node.clone(), victim), ModelAction::Unload);
                    }
                }
                Step::Unload { node, model, .. } => {
                    book.busy
                        .insert((node.clone(), model.clone()), ModelAction::Unload);
                }
            }
        }
        let service = self.clone();
        self.inner.tasks.spawn(async move {
            match step {
                Step::Load {
                    node,
                    model,
                    evict,
                    reason,
                    fit,
                } => {
                    let evict: Vec<ModelName> = evict
                        .into_iter()
                        .map(|t| ModelName::new(model.adapter.clone(), t))
                        .collect();
                    let load = Load { reason, fit };
                    let _ = service.load(&node, &model, &evict, load).await;
                }
                Step::Unload {
                    node,
                    model,
                    reason,
                } => {
                    let _ = service.unload(&node, &model, reason.as_str()).await;
                }
            }
            service.inner.wake.notify_one();
        });
    }

    /// Loads `model` on `node`, unloading each of `evict` there first, in order; the book
    /// already marks them all busy. A failure is the cold request's, which then tries
    /// another node.
    ///
    /// # Errors
    /// [`CommandError::NoRoom`] when an unload of `evict` failed (the rest are not tried);
    /// otherwise why the load command failed ([`command`](Self::command)).
    pub(super) async fn load(
        &self,
        node: &NodeId,
        model: &ModelName,
        evict: &[ModelName],
        load: Load,
    ) -> Result<(), CommandError> {
        for (at, victim) in evict.iter().enumerate() {
            let made_room = self
                .unload(node, victim, UnloadReason::MakeRoom.as_str())
                .await;
            if let Err(error) = made_room {
                let mut book = lock(&self.inner.book);
                for untried in &evict[at + 1..] {
                    book.busy.remove(&(node.clone(), untried.clone()));
                }
                drop(book);
                let error = CommandError::NoRoom {
                    victim: victim.clone(),
                    source: Box::new(error),
                };
                self.load_ended(node, model, load, Err(&error), None);
                return Err(error);
            }
        }
        let started = Instant::now();
        let done = self
            .command(
                node,
                model,
                ModelAction::Load,
                load.reason.as_str(),
                load.fit,
            )
            .await;
        self.load_ended(node, model, load, done.as_ref().copied(), Some(started));
        done
    }

    /// Records how a load ended: the book (the cold request served, or the node tried),
    /// the metrics.
    fn load_ended(
        &self,
        node: &NodeId,
        model: &ModelName,
        load: Load,
        done: Result<(), &CommandError>,
        started: Option<Instant>,
    ) {
        let Load { reason, fit } = load;
        let mut book = lock(&self.inner.book);
        book.busy.remove(&(node.clone(), model.clone()));
        book.decided(node, model, fit);
        let metrics = &self.inner.metrics;
        match done {
            Ok(()) => {
                book.see(node, model, LoadState::Loaded, Some(reason.as_str()));
                if let Some(cold) = book.cold.remove(model) {
                    metrics.cold_start(model, cold.since.elapsed());
                }
                if let Some(started) = started {
                    metrics.load_time(model, node, started.elapsed());
                }
            }
            Err(error) => {
                book.see(node, model, LoadState::Failed, Some(reason.as_str()));
                if let Some(cold) = book.cold.get_mut(model) {
                    cold.tried.push(node.clone());
                    cold.last_failure = Some(error.to_string());
                }
            }
        }
        metrics.command(
            ModelAction::Load,
            model,
            node,
            reason.as_str(),
            done.is_ok(),
        );
    }

    /// Unloads `model` from `node` for `reason`; the book already marks it busy.
    ///
    /// # Errors
    /// [`CommandError::StartedMeanwhile`] when runs of it started there since the decision;
    /// otherwise why the unload command failed ([`command`](Self::command)).
    pub(super) async fn unload(
        &self,
        node: &NodeId,
        model: &ModelName,
        reason: &str,
    ) -> Result<(), CommandError> {
        let done = match self.quiet(node, model) {
            Ok(()) => {
                let unload = ModelAction::Unload;
                self.command(node, model, unload, reason, None).await
            }
            Err(runs) => Err(CommandError::StartedMeanwhile { runs }),
        };
        if done.is_err() {
            // Still loaded there: it serves again.
            let registry = &self.inner.registry;
            registry.set_withheld(node, &model.adapter, &model.target, false);
        }
        let mut book = lock(&self.inner.book);
        book.busy.remove(&(node.clone(), model.clone()));
        if done.is_ok() {
            book.see(node, model, LoadState::Unloaded, Some(reason));
        }
        drop(book);
        let metrics = &self.inner.metrics;
        metrics.command(ModelAction::Unload, model, node, reason, done.is_ok());
        done
    }

    /// Keeps new runs of `model` off `node` (until the node's next report) and makes sure
    /// none is in flight there, so its unload may go ahead; `Err` with the runs that
    /// started there between the decision and now (it then serves again).
    pub(super) fn quiet(&self, node: &NodeId, model: &ModelName) -> Result<(), u32> {
        let registry = &self.inner.registry;
        registry.set_withheld(node, &model.adapter, &model.target, true);
        if let Some(runs) = self.inner.runs.get() {
            runs.placements_settled();
        }
        let in_flight = lock(&self.inner.book)
            .use_of(node, model)
            .map_or(0, |u| u.in_flight);
        if in_flight == 0 {
            return Ok(());
        }
        registry.set_withheld(node, &model.adapter, &model.target, false);
        Err(in_flight)
    }

    /// Sends one command and waits for its outcome; `fit`, said with it, is what a load
    /// found there.
    ///
    /// # Errors
    /// [`CommandError::Refused`] with the engine's reason, or why no outcome came:
    /// [`CommandError::NotTold`], [`CommandError::NodeLeft`], [`CommandError::NoAnswer`].
    async fn command(
        &self,
        node: &NodeId,
        model: &ModelName,
        action: ModelAction,
        reason: &str,
        fit: Option<FitNote>,
    ) -> Result<(), CommandError> {
        let (sender, outcome) = oneshot::channel();
        let command_id = {
            let mut book = lock(&self.inner.book);
            let id = book.command_id();
            book.pending.insert(id.clone(), (node.clone(), sender));
            id
        };
        let command = ModelCommand {
            command_id: command_id.clone(),
            model: model.clone(),
            action,
            reason: reason.to_owned(),
        };
        let event = ModelEvent {
            at_ms: now_ms(),
            model: model.clone(),
            node: Some(node.clone()),
            action: action.into(),
            reason: reason.to_owned(),
            outcome: "started",
            message: String::new(),
            took_ms: None,
            fit,
        };
        self.tell(event.clone());
        let started = Instant::now();
        let timeout = self.inner.config.command_timeout();
        let answered = match self.inner.transport.send(node, NodeCommand::Model(command)) {
            Err(error) => Err(CommandError::NotTold(error)),
            Ok(()) => match tokio::time::timeout(timeout, outcome).await {
                Ok(Ok(outcome)) if outcome.ok => Ok(()),
                Ok(Ok(outcome)) => Err(CommandError::Refused {
                    reason: outcome.message,
                }),
                Ok(Err(_)) => Err(CommandError::NodeLeft),
                Err(_) => Err(CommandError::NoAnswer {
                    timeout_ms: timeout.as_millis(),
                }),
            },
        };
        lock(&self.inner.book).pending.remove(&command_id);
        let took_ms = Some(u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX));
        let (outcome, message) = match &answered {
            Ok(()) => ("done", String::new()),
            Err(error) => ("failed", error.to_string()),
        };
        self.tell(ModelEvent {
            at_ms: now_ms(),
            outcome,
            message,
            took_ms,
            ..event
        });
        answered
    }

    /// Says what a command did (or a `[[models]]` entry that cannot be met): the log, the
    /// feed and its history. A load says the model's footprint and the room it found.
    pub(super) fn tell(&self, event: ModelEvent) {
        let ModelEvent {
            model,
            node,
            reason,
            outcome,
            message,
            took_ms,
            fit,
            ..
        } = &event;
        let verb = event.action.as_str();
        let node = node.as_ref().map(tracing::field::display);
        let fit = fit.as_ref().map(tracing::field::display);
        match *outcome {
            "failed" => warn!(%model, node, reason, error = message, fit, "model {verb} failed"),
            "unmet" => warn!(%model, node, reason, "a [[models]] entry cannot be met: {message}"),
            _ => info!(%model, node, reason, outcome, took_ms, fit, "model {verb}"),
        }
        lock(&self.inner.book).remember(event.clone());
        if let Some(feed) = super::feed(&self.inner.feed).as_ref() {
            let _ = feed.send(event);
        }
    }
}

/// A load's reason, and what it found on its engine.
#[derive(Debug, Clone, Copy)]
pub(super) struct Load {
    /// Why.
    pub reason: LoadReason,
    /// The footprint and the room, where known.
    pub fit: Option<FitNote>,
}
