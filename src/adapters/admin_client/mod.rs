//! The `edge` operator commands that talk to a running edge's management API, as
//! operators know them from `kubectl` and `nomad`: `edge nodes`, `edge runs [--follow]`,
//! `edge run show ID`, `edge run events ID`, `edge drain NODE`, `edge resume NODE`,
//! `edge cancel RUN`, `edge usage`, `edge models [load|unload|events]`. The address and key come from flags or `EDGE_ADMIN_URL`,
//! `EDGE_ADMIN_KEY` (and `EDGE_ADMIN_CACERT` for HTTPS). Beside them `edge agent-setup`
//! reads the client API's model list (`EDGE_API_URL`, `EDGE_API_KEY`). A command fails with
//! an [`AdminCommandError`] (the client's own failures are [`AdminClientError`]); what the
//! process prints and how it exits is the composition root's (`app::compose::cli`).

mod agents;
mod health;
mod http;
mod models;
mod render;
mod usage;

use std::collections::HashMap;
use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Subcommand};
use hyper::Method;
use serde::Serialize;

pub use health::healthcheck;
pub use http::{AdminClient, AdminClientError};

use crate::adapters::admin::views::{
    CancelView, DrainRequest, NodeList, NodeView, RunList, RunView,
};
use crate::adapters::journal::HumanDuration;
use crate::ports::clock::now_ms;

/// Why an operator command failed.
#[derive(Debug, thiserror::Error)]
pub enum AdminCommandError {
    /// The API could not be reached, refused, or answered something else than it promises.
    #[error(transparent)]
    Client(#[from] AdminClientError),
    /// `edge drain --deadline` is not a duration.
    #[error("--deadline {value:?} is not a duration such as 10m")]
    Deadline {
        /// The flag's value.
        value: String,
    },
    /// `edge models unload --drain-deadline` is neither seconds nor a duration.
    #[error("--drain-deadline {value:?} is not a number of seconds or a duration such as 10m")]
    DrainDeadline {
        /// The flag's value.
        value: String,
    },
    /// `edge agent-setup`: the API's model list does not have the model.
    #[error(
        "no connected node serves {model:?} now (GET /v1/models lists the models that can be used)"
    )]
    NotServed {
        /// The model as asked for.
        model: String,
    },
    /// `edge agent-setup`: no node reported the model's context window and none was given.
    #[error(
        "no node serving {model:?} reported its context window: give it with --context-window \
         (or set the adapter's `context_window` setting, docs/node.md)"
    )]
    NoWindow {
        /// The model.
        model: String,
    },
    /// A line of a feed (`edge models events`) is not the event the API promises.
    #[error("the edge's feed is not the expected JSON")]
    Feed(#[source] serde_json::Error),
    /// A request body or the `--json` output cannot be written as JSON.
    #[error("cannot write JSON")]
    Json(#[source] serde_json::Error),
    /// Standard output is closed or full.
    #[error("cannot write to standard output")]
    Output(#[source] std::io::Error),
}

/// Where the management API is and how to open it.
#[derive(Debug, Clone, Args)]
pub struct Connection {
    /// The management API's URL.
    #[arg(
        long = "admin",
        env = "EDGE_ADMIN_URL",
        default_value = "http://127.0.0.1:8081"
    )]
    pub url: String,
    /// An `[admin]` key (prefer the environment: a flag shows in the process list).
    #[arg(long = "admin-key", env = "EDGE_ADMIN_KEY", hide_env_values = true)]
    pub key: Option<String>,
    /// The CA certificate (PEM) that signed an HTTPS admin listener's certificate.
    #[arg(long, env = "EDGE_ADMIN_CACERT")]
    pub cacert: Option<PathBuf>,
}

/// The operator commands.
#[derive(Debug, Subcommand)]
pub enum AdminCommand {
    /// List the configured nodes and their state (through the management API).
    Nodes {
        /// Where the management API is.
        #[command(flatten)]
        connection: Connection,
        /// Print the API's JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// List runs, newest first (through the management API).
    Runs(RunsArgs),
    /// One run (through the management API).
    Run {
        /// What to do with it.
        #[command(subcommand)]
        command: RunCommand,
    },
    /// Drain a node: no new runs; running ones finish (or move to other nodes at --deadline).
    Drain {
        /// The node's id or alias.
        node: String,
        /// Move the runs still on it to other nodes (or cancel them) after this long (`90s`, `10m`, `1h`).
        #[arg(long)]
        deadline: Option<String>,
        /// Where the management API is.
        #[command(flatten)]
        connection: Connection,
    },
    /// Resume a drained node.
    Resume {
        /// The node's id or alias.
        node: String,
        /// Where the management API is.
        #[command(flatten)]
        connection: Connection,
    },
    /// What runs consumed, by key, model, node and affinity source, with the prompt-cache hit rate.
    Usage(usage::UsageArgs),
    /// Models on the nodes' engines: where each is loaded; load, unload, and the feed of
    /// loads and unloads.
    Models(models::ModelsArgs),
    /// Print the settings that point Claude Code or Codex at a model, with its context window
    /// (through the client API's model list).
    AgentSetup(agents::AgentSetupArgs),
    /// Cancel an open run.
    Cancel {
        /// The run's id.
        run: String,
        /// Where the management API is.
        #[command(flatten)]
        connection: Connection,
    },
}

/// `edge runs`.
#[derive(Debug, Args)]
pub struct RunsArgs {
    /// `open`, `finished` or `all`.
    #[arg(long, default_value = "all")]
    state: String,
    /// Only runs on this node (id or alias).
    #[arg(long)]
    node: Option<String>,
    /// Only runs for this adapter.
    #[arg(long)]
    adapter: Option<String>,
    /// Only runs for this target.
    #[arg(long)]
    target: Option<String>,
    /// Only runs that ended this way.
    #[arg(long)]
    outcome: Option<String>,
    /// Only runs accepted in this last while (`15m`, `2h`, `7d`).
    #[arg(long)]
    since: Option<String>,
    /// At most this many runs.
    #[arg(long, default_value_t = 50)]
    limit: u32,
    /// Keep watching: print runs as they start and again as they end (Ctrl-C stops).
    #[arg(long, short = 'f')]
    follow: bool,
    /// Print the API's JSON instead of a table.
    #[arg(long)]
    json: bool,
    /// Where the management API is.
    #[command(flatten)]
    connection: Connection,
}

/// `edge run ...`.
#[derive(Debug, Subcommand)]
pub enum RunCommand {
    /// A run's record.
    Show {
        /// The run's id.
        id: String,
        /// Print the API's JSON.
        #[arg(long)]
        json: bool,
        /// Where the management API is.
        #[command(flatten)]
        connection: Connection,
    },
    /// A run's events as JSON lines (the `file` sink's format).
    Events {
        /// The run's id.
        id: String,
        /// Keep printing events until the run ends.
        #[arg(long, short = 'f')]
        follow: bool,
        /// Where the management API is.
        #[command(flatten)]
        connection: Connection,
    },
}

fn client(connection: &Connection) -> Result<AdminClient, AdminClientError> {
    AdminClient::new(
        &connection.url,
        connection.key.clone(),
        connection.cacert.as_deref(),
    )
}

/// Runs an operator command, printing to standard output.
///
/// # Errors
/// [`AdminCommandError::Client`] when the API cannot be reached or refused (the message
/// says why); [`AdminCommandError::Deadline`] for a `--deadline` that is not a duration;
/// from `edge models`, [`AdminCommandError::DrainDeadline`] and [`AdminCommandError::Feed`];
/// from `edge agent-setup`, [`AdminCommandError::NotServed`] and
/// [`AdminCommandError::NoWindow`]; [`AdminCommandError::Output`] when standard output is
/// closed; [`AdminCommandError::Json`] should a view not serialize.
pub async fn run(command: AdminCommand) -> Result<(), AdminCommandError> {
    match command {
        AdminCommand::Nodes { connection, json } => {
            let list: NodeList = client(&connection)?.get("/admin/v1/nodes").await?;
            if json {
                emit_json(&list)?;
            } else {
                emit(render::nodes(&list.nodes, now_ms()).trim_end())?;
            }
        }
        AdminCommand::Runs(args) => runs(args).await?,
        AdminCommand::Usage(args) => usage::usage(args).await?,
        AdminCommand::Models(args) => models::models(args).await?,
        AdminCommand::AgentSetup(args) => agents::agent_setup(args).await?,
        AdminCommand::Run { command } => run_command(command).await?,
        AdminCommand::Drain {
            node,
            deadline,
            connection,
        } => {
            let deadline_seconds = deadline
                .map(|value| {
                    HumanDuration::parse(&value)
                        .map(|d| d.0.as_secs())
                        .ok_or(AdminCommandError::Deadline { value })
                })
                .transpose()?;
            let body = json_body(&DrainRequest { deadline_seconds })?;
            let path = format!("/admin/v1/nodes/{}/drain", segment(&node));
            let view: NodeView = client(&connection)?
                .call(Method::POST, &path, Some(body))
                .await?;
            emit(&format!("node {} is {}", view.id, view.state))?;
        }
        AdminCommand::Resume { node, connection } => {
            let path = format!("/admin/v1/nodes/{}/resume", segment(&node));
            let view: NodeView = client(&connection)?.call(Method::POST, &path, None).await?;
            emit(&format!("node {} is {}", view.id, view.state))?;
        }
        AdminCommand::Cancel { run, connection } => {
            let path = format!("/admin/v1/runs/{}", segment(&run));
            let view: CancelView = client(&connection)?
                .call(Method::DELETE, &path, None)
                .await?;
            emit(&format!("run {} is being cancelled", view.id))?;
        }
    }
    Ok(())
}

async fn run_command(command: RunCommand) -> Result<(), AdminCommandError> {
    match command {
        RunCommand::Show {
            id,
            json,
            connection,
        } => {
            let path = format!("/admin/v1/runs/{}", segment(&id));
            let run: RunView = client(&connection)?.get(&path).await?;
            if json {
                emit_json(&run)?;
            } else {
                emit(render::run_details(&run, now_ms()).trim_end())?;
            }
        }
        RunCommand::Events {
            id,
            follow,
            connection,
        } => {
            let path = format!(
                "/admin/v1/runs/{}/events?format=jsonl&follow={follow}",
                segment(&id)
            );
            let mut failed = None;
            client(&connection)?
                .lines(&path, |line| {
                    if failed.is_none() {
                        failed = emit(line).err();
                    }
                })
                .await?;
            if let Some(error) = failed {
                return Err(error);
            }
        }
    }
    Ok(())
}

/// How often `edge runs --follow` asks for changes.
const FOLLOW_INTERVAL: Duration = Duration::from_secs(1);

async fn runs(args: RunsArgs) -> Result<(), AdminCommandError> {
    let client = client(&args.connection)?;
    let mut query = format!(
        "/admin/v1/runs?state={}&limit={}",
        segment(&args.state),
        args.limit
    );
    for (name, value) in [
        ("node", &args.node),
        ("adapter", &args.adapter),
        ("target", &args.target),
        ("outcome", &args.outcome),
        ("since", &args.since),
    ] {
        if let Some(value) = value {
            query.push_str(&format!("&{name}={}", segment(value)));
        }
    }
    let list: RunList = client.get(&query).await?;
    if args.json && !args.follow {
        emit_json(&list)?;
        return Ok(());
    }
    let rows: Vec<Vec<String>> = list
        .runs
        .iter()
        .map(|r| render::run_row(r, now_ms()))
        .collect();
    emit(render::table(&render::RUN_HEADER, &rows).trim_end())?;
    if !args.follow {
        return Ok(());
    }
    // Watch: print a run again whenever its outcome changes.
    let mut shown: HashMap<String, String> =
        list.runs.into_iter().map(|r| (r.id, r.outcome)).collect();
    loop {
        tokio::time::sleep(FOLLOW_INTERVAL).await;
        let list: RunList = client.get(&query).await?;
        for run in list.runs.iter().rev() {
            if shown.get(&run.id) != Some(&run.outcome) {
                emit(&render::run_row(run, now_ms()).join("  "))?;
                shown.insert(run.id.clone(), run.outcome.clone());
            }
        }
        if shown.len() > 100_000 {
            shown = list.runs.into_iter().map(|r| (r.id, r.outcome)).collect();
        }
    }
}

/// Writes `text` and a newline to standard output; a closed output is an error, never a
/// panic.
fn emit(text: &str) -> Result<(), AdminCommandError> {
    use std::io::Write as _;
    let mut out = std::io::stdout().lock();
    writeln!(out, "{text}")
        .and_then(|()| out.flush())
        .map_err(AdminCommandError::Output)
}

/// Writes `value` as pretty JSON (the `--json` output).
fn emit_json(value: &impl Serialize) -> Result<(), AdminCommandError> {
    emit(&serde_json::to_string_pretty(value).map_err(AdminCommandError::Json)?)
}

/// `value` as a JSON request body.
fn json_body(value: &impl Serialize) -> Result<Vec<u8>, AdminCommandError> {
    serde_json::to_vec(value).map_err(AdminCommandError::Json)
}

/// `text` made safe as one URL path segment or query value (percent-encoded).
fn segment(text: &str) -> String {
    text.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}
