//! Console mode: run commands read from standard input while the edge serves.
//!
//! `run`, `cancel`, `nodes`, `help` and `quit`. Answers go to the console's output; the
//! runs' events reach standard output through the stdout sink (the console router). An
//! inbound adapter like the HTTP APIs: it starts and cancels runs through [`Runs`] and
//! reads nodes through [`Manage`], and knows nothing of the services behind them.

use std::fmt::Write as _;
use std::sync::Arc;

use bytes::Bytes;
use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncWrite, AsyncWriteExt, BufReader};
use tokio_util::sync::CancellationToken;

use crate::domain::routing::{BreakerState, TenantKey};
use crate::domain::{AdapterName, NodeSelector, Operation, RunId, RunRouting, RunSpec, Target};
use crate::ports::{ConnectedNodeView, Manage, NodeStatus, Placed, Runs, waiting_for};

/// What the console works through: the edge's inbound ports and its stop signal.
#[derive(Clone)]
pub(crate) struct ConsolePorts {
    /// Starts and cancels runs.
    pub runs: Arc<dyn Runs>,
    /// Node status.
    pub manage: Arc<dyn Manage>,
    /// Cancelled by `quit` (and ends the console when the edge stops).
    pub stop: CancellationToken,
}

const HELP: &str = "\
commands:
  run [--node ID|ALIAS] ADAPTER TARGET INPUT...   start a run; events follow on stdout
  cancel RUN_ID                                  cancel an open run
  nodes                                          list connected nodes, their status and breakers
  help                                           show this help
  quit                                           stop the edge gracefully
";

/// A parsed console command.
#[derive(Debug, Clone, PartialEq, Eq)]
enum ConsoleCommand {
    Run {
        pin: Option<String>,
        adapter: AdapterName,
        target: Target,
        input: String,
    },
    Cancel(RunId),
    Nodes,
    Help,
    Quit,
    Nothing,
}

/// Parses one line; the error is a message for the operator.
fn parse(line: &str) -> Result<ConsoleCommand, String> {
    let mut words = line.split_whitespace();
    let Some(verb) = words.next() else {
        return Ok(ConsoleCommand::Nothing);
    };
    let rest: Vec<&str> = words.collect();
    match verb {
        "run" => parse_run(&rest),
        "cancel" => match rest.as_slice() {
            [run_id] => Ok(ConsoleCommand::Cancel(RunId::new(*run_id))),
            _ => Err("usage: cancel RUN_ID".into()),
        },
        "nodes" if rest.is_empty() => Ok(ConsoleCommand::Nodes),
        "help" if rest.is_empty() => Ok(ConsoleCommand::Help),
        "quit" | "exit" if rest.is_empty() => Ok(ConsoleCommand::Quit),
        "nodes" | "help" | "quit" | "exit" => Err(format!("`{verb}` takes no arguments")),
        other => Err(format!("unknown command `{other}`")),
    }
}

fn parse_run(words: &[&str]) -> Result<ConsoleCommand, String> {
    const USAGE: &str = "usage: run [--node ID|ALIAS] ADAPTER TARGET INPUT...";
    let (pin, words) = match words {
        ["--node", pin, rest @ ..] => (Some((*pin).to_owned()), rest),
        ["--node"] => return Err(format!("--node needs an id or alias; {USAGE}")),
        _ => (None, words),
    };
    let [adapter, target, input @ ..] = words else {
        return Err(USAGE.into());
    };
    if input.is_empty() {
        return Err(format!("missing INPUT; {USAGE}"));
    }
    Ok(ConsoleCommand::Run {
        pin,
        adapter: AdapterName::parse(adapter).map_err(|e| e.to_string())?,
        target: Target::parse(target).map_err(|e| e.to_string())?,
        input: input.join(" "),
    })
}

/// Reads commands from `input` until `quit` or end of input (both stop the edge), writing
/// answers to `output`.
pub(crate) async fn run<R, W>(parts: ConsolePorts, input: R, mut output: W)
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let mut lines = BufReader::new(input).lines();
    let _ = write_out(
        &mut output,
        "edge console ready; type `help` for commands\n",
    )
    .await;
    loop {
        let line = tokio::select! {
            () = parts.stop.cancelled() => return,
            line = lines.next_line() => line,
        };
        let Ok(Some(line)) = line else { break };
        let answer = match parse(&line) {
            Ok(ConsoleCommand::Quit) => break,
            Ok(command) => execute(&parts, command).await,
            Err(message) => format!("error: {message} (type `help` for commands)\n"),
        };
        if write_out(&mut output, &answer).await.is_err() {
            break;
        }
    }
    let _ = write_out(&mut output, "stopping the edge\n").await;
    parts.stop.cancel();
}

async fn write_out<W: AsyncWrite + Unpin>(output: &mut W, text: &str) -> std::io::Result<()> {
    output.write_all(text.as_bytes()).await?;
    output.flush().await
}

async fn execute(parts: &ConsolePorts, command: ConsoleCommand) -> String {
    match command {
        ConsoleCommand::Run {
            pin,
            adapter,
            target,
            input,
        } => {
            let spec = RunSpec {
                selector: NodeSelector {
                    adapter,
                    target,
                    pin,
                },
                input: Bytes::from(input),
                content_type: "text/plain; charset=utf-8".into(),
                params: Default::default(),
                deadline: None,
                operation: Operation::Unspecified,
                routing: RunRouting {
                    tenant: TenantKey::parse("console").unwrap_or_else(|_| TenantKey::anonymous()),
                    ..RunRouting::default()
                },
            };
            match parts.runs.start(spec) {
                // The events reach the console through the stdout sink.
                Ok(handle) => match handle.placed {
                    Placed::Sent(node) => {
                        format!("run {} accepted, sent to {node}\n", handle.run_id)
                    }
                    Placed::Waiting(cause) => format!(
                        "run {} accepted, waiting: {}\n",
                        handle.run_id,
                        waiting_for(cause)
                    ),
                },
                Err(error) => format!("error: {error}\n"),
            }
        }
        ConsoleCommand::Cancel(run_id) => {
            if parts
                .runs
                .cancel(&run_id, "cancelled from the console")
                .await
            {
                format!("cancelling run {run_id}\n")
            } else {
                format!("error: no open run {run_id}\n")
            }
        }
        ConsoleCommand::Nodes => nodes_table(parts.manage.as_ref()),
        ConsoleCommand::Help => HELP.to_owned(),
        ConsoleCommand::Quit | ConsoleCommand::Nothing => String::new(),
    }
}

fn nodes_table(manage: &dyn Manage) -> String {
    let nodes: Vec<(NodeStatus, ConnectedNodeView)> = manage
        .nodes()
        .into_iter()
        .filter_map(|node| Some((node.clone(), node.connection?)))
        .collect();
    if nodes.is_empty() {
        return "no nodes connected\n".into();
    }
    let mut out = format!(
        "{:<16} {:<16} {:<12} {:<22} {:<32} {:>6} {:<12} {:<14} {:>10}\n",
        "ID", "ALIAS", "STATE", "PEER", "ADAPTERS", "ACTIVE", "STATUS", "BREAKER", "LAST SEEN"
    );
    let now_ms = manage.now_ms();
    for (node, connection) in nodes {
        let seen_secs = now_ms.saturating_sub(connection.last_seen_ms) / 1_000;
        let _ = writeln!(
            out,
            "{:<16} {:<16} {:<12} {:<22} {:<32} {:>6} {:<12} {:<14} {:>9}s",
            node.record.id(),
            node.record.alias(),
            node.state.as_str(),
            connection.peer,
            adapters_text(&node),
            format!(
                "{}/{}",
                connection.active_runs,
                node.record.runtime().max_concurrent_runs()
            ),
            status_text(&connection),
            breaker_text(node.breaker),
            seen_secs,
        );
    }
    out
}

fn adapters_text(node: &NodeStatus) -> String {
    let adapters: Vec<String> = node
        .record
        .adapters()
        .iter()
        .map(|a| {
            let targets: Vec<String> = a
                .targets()
                .iter()
                .map(|t| {
                    let away = node.available(a.name(), t) == Some(false);
                    format!("{t}{}", if away { "!" } else { "" })
                })
                .collect();
            format!("{}/{}", a.name(), targets.join(","))
        })
        .collect();
    adapters.join(" ")
}

/// `unavailable` (it reported none of its targets), or `ready`.
fn status_text(connection: &ConnectedNodeView) -> &'static str {
    if connection
        .availability
        .as_ref()
        .is_some_and(|a| a.pairs().is_empty())
    {
        "unavailable"
    } else {
        "ready"
    }
}

/// The breaker's state as the operator reads it.
fn breaker_text(state: BreakerState) -> String {
    match state {
        BreakerState::Closed { failures: 0 } => "closed".to_owned(),
        BreakerState::Closed { failures } => format!("closed ({failures}x)"),
        BreakerState::Open { until } => {
            let left = until.saturating_duration_since(std::time::Instant::now());
            if left.is_zero() {
                "half-open".to_owned()
            } else {
                format!("open {}s", left.as_secs().max(1))
            }
        }
        BreakerState::HalfOpen { .. } => "half-open".to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_runs_with_and_without_a_pin() {
        assert_eq!(
            parse("run --node gpu-a echo default hello  world").unwrap(),
            ConsoleCommand::Run {
                pin: Some("gpu-a".into()),
                adapter: AdapterName::parse("echo").unwrap(),
                target: Target::parse("default").unwrap(),
                input: "hello world".into(),
            }
        );
        assert!(matches!(
            parse("run echo default hi").unwrap(),
            ConsoleCommand::Run { pin: None, .. }
        ));
    }

    #[test]
    fn malformed_commands_say_what_is_wrong() {
        assert!(parse("run echo").unwrap_err().starts_with("usage: run"));
        assert!(
            parse("run echo default")
                .unwrap_err()
                .starts_with("missing INPUT")
        );
        assert!(parse("run --node").unwrap_err().contains("--node needs"));
        assert!(
            parse("run ec!ho default x")
                .unwrap_err()
                .contains("adapter name")
        );
        assert_eq!(parse("cancel").unwrap_err(), "usage: cancel RUN_ID");
        assert_eq!(
            parse("frobnicate").unwrap_err(),
            "unknown command `frobnicate`"
        );
        assert_eq!(
            parse("nodes now").unwrap_err(),
            "`nodes` takes no arguments"
        );
        assert_eq!(parse("   ").unwrap(), ConsoleCommand::Nothing);
        assert_eq!(
            parse("cancel run-1").unwrap(),
            ConsoleCommand::Cancel(RunId::new("run-1"))
        );
    }
}
