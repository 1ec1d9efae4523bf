//! `edge models`: where each model is loaded (`GET /admin/v1/models`) as a table, a load or
//! an unload on one node (`POST /admin/v1/models/load`, `/unload`), and the feed of loads
//! and unloads (`GET /admin/v1/models/events`).

use clap::{Args, Subcommand};
use hyper::Method;

use super::render::{age, span, table};
use super::{AdminCommandError, Connection, client, emit, emit_json, json_body};
use crate::adapters::admin::views::{
    ModelEventView, ModelList, ModelLoadRequest, ModelOnNodeView, ModelStateView,
    ModelUnloadRequest,
};
use crate::adapters::journal::HumanDuration;
use crate::domain::Bytes;
use crate::ports::clock::now_ms;

/// `edge models`.
#[derive(Debug, Args)]
pub struct ModelsArgs {
    /// Load, unload, or the feed of loads and unloads; without one, list the models.
    #[command(subcommand)]
    command: Option<ModelsCommand>,
    /// Print the API's JSON instead of a table.
    #[arg(long)]
    json: bool,
    /// Where the management API is.
    #[command(flatten)]
    connection: Connection,
}

/// `edge models ...`.
#[derive(Debug, Subcommand)]
enum ModelsCommand {
    /// Load a model on a node whose engine the edge manages; returns once it is loaded.
    Load {
        /// The model, `adapter/target`.
        model: String,
        /// The node's id or alias.
        #[arg(long)]
        node: String,
        /// Where the management API is.
        #[command(flatten)]
        connection: Connection,
    },
    /// Unload a model from a node (refused while runs of it are in flight there, unless
    /// --drain-deadline lets them end first).
    Unload {
        /// The model, `adapter/target`.
        model: String,
        /// The node's id or alias.
        #[arg(long)]
        node: String,
        /// Wait up to this long for its runs there to end (seconds, or `90s`, `10m`).
        #[arg(long, value_name = "SECONDS")]
        drain_deadline: Option<String>,
        /// Where the management API is.
        #[command(flatten)]
        connection: Connection,
    },
    /// The last loads and unloads, oldest first.
    Events {
        /// Keep printing loads and unloads as they happen (Ctrl-C stops).
        #[arg(long, short = 'f')]
        follow: bool,
        /// Print the API's JSON lines instead of a table.
        #[arg(long)]
        json: bool,
        /// Where the management API is.
        #[command(flatten)]
        connection: Connection,
    },
}

/// Runs `edge models`.
///
/// # Errors
/// [`AdminCommandError::Client`] when the API cannot be reached or refused (the message
/// says why), [`AdminCommandError::DrainDeadline`] for a `--drain-deadline` that is not
/// one, [`AdminCommandError::Feed`] for a feed line that is not an event,
/// [`AdminCommandError::Output`] when standard output is closed.
pub(super) async fn models(args: ModelsArgs) -> Result<(), AdminCommandError> {
    match args.command {
        None => list(&args.connection, args.json).await,
        Some(ModelsCommand::Load {
            model,
            node,
            connection,
        }) => {
            let body = json_body(&ModelLoadRequest {
                model,
                node: node.clone(),
            })?;
            command(&connection, "load", body, &node).await
        }
        Some(ModelsCommand::Unload {
            model,
            node,
            drain_deadline,
            connection,
        }) => {
            let drain_deadline_seconds = drain_deadline
                .map(|value| {
                    HumanDuration::parse(&value)
                        .map(|d| d.0.as_secs())
                        .ok_or(AdminCommandError::DrainDeadline { value })
                })
                .transpose()?;
            let request = ModelUnloadRequest {
                model,
                node: node.clone(),
                drain_deadline_seconds,
            };
            command(&connection, "unload", json_body(&request)?, &node).await
        }
        Some(ModelsCommand::Events {
            follow,
            json,
            connection,
        }) => events(&connection, follow, json).await,
    }
}

async fn list(connection: &Connection, json: bool) -> Result<(), AdminCommandError> {
    let list: ModelList = client(connection)?.get("/admin/v1/models").await?;
    if json {
        emit_json(&list)
    } else {
        emit(render(&list.models, now_ms()).trim_end())
    }
}

/// `POST /admin/v1/models/{action}` with `body`; prints where the model is on `node` now.
async fn command(
    connection: &Connection,
    action: &str,
    body: Vec<u8>,
    node: &str,
) -> Result<(), AdminCommandError> {
    let path = format!("/admin/v1/models/{action}");
    let view: ModelStateView = client(connection)?
        .call(Method::POST, &path, Some(body))
        .await?;
    emit(&outcome(&view, node))
}

/// One line: the model's state on `node` (as the operator named it: an id or an alias),
/// or on every node when none has that id.
fn outcome(view: &ModelStateView, node: &str) -> String {
    if let Some(on) = view.nodes.iter().find(|on| on.node == node) {
        return format!("{} is {} on {}", view.model, on.state, on.node);
    }
    let states: Vec<String> = view
        .nodes
        .iter()
        .map(|on| format!("{} on {}", on.state, on.node))
        .collect();
    if states.is_empty() {
        format!("{}: done on {node}; no node lists it now", view.model)
    } else {
        format!("{}: {}", view.model, states.join(", "))
    }
}

/// Prints the feed: its history as a table, or, followed, a row per event as it comes.
async fn events(
    connection: &Connection,
    follow: bool,
    json: bool,
) -> Result<(), AdminCommandError> {
    let path = format!("/admin/v1/models/events?format=jsonl&follow={follow}");
    let mut rows: Vec<Vec<String>> = Vec::new();
    let mut failed = None;
    let mut take = |line: &str| {
        if failed.is_some() || line.trim().is_empty() {
            return;
        }
        failed = event_line(line, json, follow, &mut rows).err();
    };
    if follow && !json {
        emit(&EVENT_HEADER.join("  "))?;
    }
    client(connection)?.lines(&path, &mut take).await?;
    if let Some(error) = failed {
        return Err(error);
    }
    if json || follow {
        return Ok(());
    }
    emit(table(&EVENT_HEADER, &rows).trim_end())
}

/// One line of the feed: printed as it is (`json`), as a row (`follow`), or kept in `rows`.
fn event_line(
    line: &str,
    json: bool,
    follow: bool,
    rows: &mut Vec<Vec<String>>,
) -> Result<(), AdminCommandError> {
    if json {
        return emit(line);
    }
    let event: ModelEventView = serde_json::from_str(line).map_err(AdminCommandError::Feed)?;
    let row = event_row(&event, now_ms());
    if follow {
        emit(&row.join("  "))
    } else {
        rows.push(row);
        Ok(())
    }
}

/// The header of the feed's table.
const EVENT_HEADER: [&str; 8] = [
    "AGE", "ACTION", "MODEL", "NODE", "REASON", "OUTCOME", "TOOK", "MESSAGE",
];

/// One load, unload or warning, as a row; a load's message says the footprint and the room
/// it found.
fn event_row(event: &ModelEventView, now_ms: u64) -> Vec<String> {
    let fit = event.fit.map(|fit| {
        format!(
            "footprint {}, room {} of {}",
            Bytes(fit.footprint_bytes),
            Bytes(fit.room_bytes),
            Bytes(fit.budget_bytes)
        )
    });
    let message = [fit, Some(event.message.clone()).filter(|m| !m.is_empty())]
        .into_iter()
        .flatten()
        .collect::<Vec<_>>()
        .join("; ");
    vec![
        age(now_ms, event.at_ms),
        event.action.clone(),
        event.model.clone(),
        event.node.clone().unwrap_or_else(|| "-".to_owned()),
        event.reason.clone(),
        event.outcome.clone(),
        event.took_ms.map_or_else(|| "-".to_owned(), span),
        message,
    ]
}

/// The header of the `edge models` table.
const HEADER: [&str; 10] = [
    "MODEL",
    "NODE",
    "STATE",
    "FOOTPRINT",
    "ROOM",
    "MANAGED",
    "IN_FLIGHT",
    "LAST_USE",
    "REASON",
    "COMMAND",
];

/// The `edge models` table: a row per model and node (a model on no node: one row of
/// dashes, for its `[[models]]` entry), then each entry the pool cannot meet.
fn render(models: &[ModelStateView], now_ms: u64) -> String {
    let mut rows: Vec<Vec<String>> = Vec::new();
    for model in models {
        if model.nodes.is_empty() {
            let mut row = vec![model.model.clone()];
            row.extend(std::iter::repeat_n("-".to_owned(), HEADER.len() - 1));
            rows.push(row);
        }
        rows.extend(model.nodes.iter().map(|on| row(&model.model, on, now_ms)));
    }
    let mut text = table(&HEADER, &rows);
    for warning in models.iter().flat_map(|m| &m.warnings) {
        text.push_str(&format!("warning: {warning}\n"));
    }
    text
}

/// One model on one node, as a row: its footprint there, and its adapter's room of its
/// budget there (`90.0 MiB/1.00 GiB`).
fn row(model: &str, on: &ModelOnNodeView, now_ms: u64) -> Vec<String> {
    let dash = || "-".to_owned();
    let state = match on.state.as_str() {
        "loading" if on.progress_percent > 0 => format!("loading {}%", on.progress_percent),
        "failed" if !on.failure.is_empty() => format!("failed: {}", on.failure),
        other => other.to_owned(),
    };
    let room = match (on.room_bytes, on.budget_bytes) {
        (Some(room), Some(budget)) => format!("{}/{}", Bytes(room), Bytes(budget)),
        _ => dash(),
    };
    vec![
        model.to_owned(),
        on.node.clone(),
        state,
        on.footprint
            .as_ref()
            .map_or_else(dash, |f| Bytes(f.bytes).to_string()),
        room,
        if on.managed { "yes" } else { "no" }.to_owned(),
        on.in_flight.to_string(),
        on.last_used_ms.map_or_else(dash, |t| age(now_ms, t)),
        if on.reason.is_empty() {
            dash()
        } else {
            on.reason.clone()
        },
        on.command.clone().unwrap_or_else(dash),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::adapters::admin::fit_views::{FitView, FootprintView};
    use crate::adapters::admin::views::ModelPolicyView;

    fn on(node: &str, state: &str) -> ModelOnNodeView {
        ModelOnNodeView {
            node: node.into(),
            state: state.into(),
            managed: true,
            progress_percent: 0,
            failure: String::new(),
            since_ms: 0,
            in_flight: 0,
            last_used_ms: None,
            reason: String::new(),
            command: None,
            footprint: None,
            budget_bytes: None,
            room_bytes: None,
            decided: None,
        }
    }

    #[test]
    fn the_table_has_a_row_per_model_and_node() {
        let loading = ModelOnNodeView {
            progress_percent: 40,
            command: Some("load".into()),
            reason: "demand".into(),
            ..on("node-b", "loading")
        };
        let used = ModelOnNodeView {
            in_flight: 2,
            last_used_ms: Some(40_000),
            reason: "operator".into(),
            footprint: Some(FootprintView {
                bytes: 90 << 20,
                weights_bytes: 0,
                kv_cache_bytes: 0,
                overhead_bytes: 0,
                context: 0,
                source: "setting".into(),
            }),
            budget_bytes: Some(1 << 30),
            room_bytes: Some(934 << 20),
            ..on("node-a", "loaded")
        };
        let models = [
            ModelStateView {
                model: "llama/alpha".into(),
                policy: None,
                nodes: vec![used, loading],
                warnings: Vec::new(),
            },
            ModelStateView {
                model: "llama/beta".into(),
                policy: Some(ModelPolicyView {
                    min_loaded: 1,
                    pin: Vec::new(),
                    idle_unload_ms: None,
                }),
                nodes: Vec::new(),
                warnings: vec!["llama/beta is pinned on node-a, where it does not fit".into()],
            },
        ];
        let text = render(&models, 100_000);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(
            lines,
            [
                "MODEL        NODE    STATE        FOOTPRINT  ROOM                MANAGED  IN_FLIGHT  LAST_USE  REASON    COMMAND",
                "llama/alpha  node-a  loaded       90.0 MiB   934.0 MiB/1.00 GiB  yes      2          1m        operator  -",
                "llama/alpha  node-b  loading 40%  -          -                   yes      0          -         demand    load",
                "llama/beta   -       -            -          -                   -        -          -         -         -",
                "warning: llama/beta is pinned on node-a, where it does not fit",
            ]
        );
    }

    #[test]
    fn an_event_row_says_what_why_and_how_long() {
        let event = ModelEventView {
            at_ms: 1_000,
            model: "llama/alpha".into(),
            node: Some("node-a".into()),
            action: "unload".into(),
            reason: "idle".into(),
            outcome: "failed".into(),
            message: "busy".into(),
            took_ms: Some(2_500),
            fit: None,
        };
        assert_eq!(
            event_row(&event, 6_000),
            [
                "5s",
                "unload",
                "llama/alpha",
                "node-a",
                "idle",
                "failed",
                "2s",
                "busy"
            ]
        );
        let load = ModelEventView {
            action: "load".into(),
            reason: "demand".into(),
            outcome: "started".into(),
            message: String::new(),
            took_ms: None,
            fit: Some(FitView {
                footprint_bytes: 300 << 20,
                budget_bytes: 1 << 30,
                room_bytes: 1 << 30,
            }),
            ..event
        };
        assert_eq!(
            event_row(&load, 6_000)[7],
            "footprint 300.0 MiB, room 1.00 GiB of 1.00 GiB"
        );
    }

    #[test]
    fn a_command_s_outcome_names_the_node_s_state() {
        let view = ModelStateView {
            model: "llama/alpha".into(),
            policy: None,
            nodes: vec![on("node-a", "loaded"), on("node-b", "unloaded")],
            warnings: Vec::new(),
        };
        assert_eq!(
            outcome(&view, "node-b"),
            "llama/alpha is unloaded on node-b"
        );
        assert_eq!(
            outcome(&view, "gpu-a"),
            "llama/alpha: loaded on node-a, unloaded on node-b"
        );
        let gone = ModelStateView {
            nodes: Vec::new(),
            ..view
        };
        assert_eq!(
            outcome(&gone, "gpu-a"),
            "llama/alpha: done on gpu-a; no node lists it now"
        );
    }
}
