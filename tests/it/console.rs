//! Console mode end to end: the real `edge` binary (`serve --console`) driven through its
//! standard input, with mock nodes connected over real TCP, asserting on what an operator
//! sees on standard output and on the exit status.
//!
//! Every wait is bounded by one overall deadline, so a hang fails the test instead of
//! blocking it.

use crate::common;
use crate::mock_node;

use std::net::SocketAddr;
use std::process::Stdio;
use std::time::Duration;

use common::{Logs, TWO_NODES, edge_serve, logged, watch_stderr, write_config};
use mock_node::{Behaviour, Ended, MockNode, MockOptions};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::process::{Child, ChildStdin};
use tokio::sync::mpsc;
use tokio::time::{Instant, timeout_at};

/// The whole conversation must finish within this.
const OVERALL: Duration = Duration::from_secs(30);

/// A running `edge serve --console` and what it printed so far.
struct Console {
    child: Child,
    stdin: Option<ChildStdin>,
    stdout: mpsc::UnboundedReceiver<String>,
    /// Every stdout line so far, in order.
    seen: Vec<String>,
    /// Every stderr line so far (the edge's JSON logs), for failure messages.
    logs: Logs,
    deadline: Instant,
    /// Holds the config file alive.
    _dir: tempfile::TempDir,
}

impl Console {
    /// Starts the edge with `config` (TOML) on a free port, waits for the console's
    /// greeting, and returns it with its node address.
    async fn start(config: &str) -> (Console, SocketAddr) {
        let deadline = Instant::now() + OVERALL;
        let dir = tempfile::tempdir().expect("tempdir");
        let mut child = edge_serve(&write_config(dir.path(), config))
            .arg("--console")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("spawn the edge binary");
        let stdin = child.stdin.take().expect("piped stdin");
        let stdout = child.stdout.take().expect("piped stdout");
        let stderr = child.stderr.take().expect("piped stderr");

        let (lines, stdout_lines) = mpsc::unbounded_channel();
        tokio::spawn(async move {
            let mut reader = BufReader::new(stdout).lines();
            while let Ok(Some(line)) = reader.next_line().await {
                if lines.send(line).is_err() {
                    return;
                }
            }
        });

        // The edge logs `edge is serving` with its addresses once it is bound; the rest of
        // stderr is kept for failure messages.
        let (logs, bound) = watch_stderr(stderr);

        let mut console = Console {
            child,
            stdin: Some(stdin),
            stdout: stdout_lines,
            seen: Vec::new(),
            logs,
            deadline,
            _dir: dir,
        };
        let addr = match timeout_at(deadline, bound).await {
            Ok(Ok((node_addr, _http_addr))) => node_addr,
            _ => panic!(
                "the edge never logged `edge is serving`; stderr: {:#?}",
                console.logs()
            ),
        };
        console
            .wait_for(0, "the console greeting", |l| {
                l.starts_with("edge console ready")
            })
            .await;
        (console, addr)
    }

    /// Its stderr lines so far.
    fn logs(&self) -> Vec<String> {
        logged(&self.logs)
    }

    /// Where the next stdout line will be in `seen`: waits that start here see only what
    /// comes after.
    fn mark(&self) -> usize {
        self.seen.len()
    }

    /// Writes one command line to the console.
    async fn send(&mut self, line: &str) {
        let stdin = self.stdin.as_mut().expect("stdin still open");
        stdin
            .write_all(format!("{line}\n").as_bytes())
            .await
            .expect("write to the console");
        stdin.flush().await.expect("flush the console's stdin");
    }

    /// The first stdout line at or after `from` for which `wanted` holds, waiting for it.
    async fn wait_for(&mut self, from: usize, what: &str, wanted: impl Fn(&str) -> bool) -> String {
        let mut checked = from;
        loop {
            if let Some(line) = self.seen[checked..].iter().find(|l| wanted(l)) {
                return line.clone();
            }
            checked = self.seen.len();
            match timeout_at(self.deadline, self.stdout.recv()).await {
                Ok(Some(line)) => self.seen.push(line),
                Ok(None) => panic!(
                    "stdout closed before {what}; stdout: {:#?}\nstderr: {:#?}",
                    self.seen,
                    self.logs()
                ),
                Err(_) => panic!(
                    "timed out waiting for {what}; stdout: {:#?}\nstderr: {:#?}",
                    self.seen,
                    self.logs()
                ),
            }
        }
    }

    /// Waits for the edge to exit, which it must do with success; `after` names what should
    /// have made it exit.
    async fn assert_exits_cleanly(&mut self, after: &str) {
        let status = match timeout_at(self.deadline, self.child.wait()).await {
            Ok(status) => status.expect("wait for the edge"),
            Err(_) => panic!(
                "the edge did not exit after {after}; stderr: {:#?}",
                self.logs()
            ),
        };
        assert!(
            status.success(),
            "exit status {status}; stderr: {:#?}",
            self.logs()
        );
    }

    /// Waits for `node` to stop, which it must do because the edge told it to shut down.
    async fn assert_told_of_shutdown(&self, node: MockNode) {
        let ended = timeout_at(self.deadline, node.ended())
            .await
            .expect("the node stops");
        assert!(matches!(ended, Ended::Shutdown(_)), "{ended:?}");
    }

    /// Sends `command` and waits for the first line after it for which `wanted` holds.
    async fn ask(&mut self, command: &str, what: &str, wanted: impl Fn(&str) -> bool) -> String {
        let mark = self.mark();
        self.send(command).await;
        self.wait_for(mark, what, wanted).await
    }

    /// Sends `command` and returns the run id from its `run <id> accepted` answer.
    async fn start_run(&mut self, command: &str) -> String {
        let accepted = self
            .ask(command, &format!("`{command}` to be accepted"), |l| {
                (l.starts_with("run ") && l.contains(" accepted")) || l.starts_with("error:")
            })
            .await;
        let id = accepted
            .strip_prefix("run ")
            .and_then(|rest| rest.split_once(" accepted").map(|(id, _)| id))
            .unwrap_or_else(|| panic!("`{command}` was refused: {accepted}"));
        id.to_owned()
    }
}

/// A mock node with `token` whose runs pause `delay` between words.
async fn mock(addr: SocketAddr, token: &str, delay: Duration) -> MockNode {
    let options = MockOptions {
        delay,
        behaviour: Behaviour::Echo,
        ..MockOptions::new(token)
    };
    MockNode::start(addr, options)
        .await
        .expect("mock node registers")
}

#[crate::common::test]
async fn console_mode_runs_cancels_and_quits_through_stdin() {
    let (mut console, addr) = Console::start(TWO_NODES).await;

    // node-a alone first, so an unpinned run has only one place to go.
    let node_a = mock(addr, "token-a", Duration::ZERO).await;

    let mark = console.mark();
    console
        .ask("nodes", "the node table header", |l| {
            l.starts_with("ID ") && l.contains("ALIAS")
        })
        .await;
    let row = console
        .wait_for(mark, "node-a's row", |l| l.starts_with("node-a "))
        .await;
    let columns: Vec<&str> = row.split_whitespace().collect();
    assert_eq!(columns[1], "gpu-a", "{row}");
    assert_eq!(columns[2], "serving", "{row}");
    assert!(columns.contains(&"echo/default"), "{row}");
    assert!(columns.contains(&"0/2"), "{row}");

    // An unpinned run streams its words and completes.
    let id = console.start_run("run echo default hello world").await;
    let hello = format!("{id} node-a echo/default output hello ");
    console
        .wait_for(0, "the first output", |l| l == hello)
        .await;
    let world = format!("{id} node-a echo/default output world");
    console
        .wait_for(0, "the second output", |l| l == world)
        .await;
    let completed = format!("{id} node-a echo/default completed");
    let done = console
        .wait_for(0, "the completion", |l| l.starts_with(&completed))
        .await;
    assert!(done.contains("finish_reason=stop"), "{done}");

    // A run pinned to a slow gpu-b, cancelled while it streams.
    let node_b = mock(addr, "token-b", Duration::from_millis(50)).await;
    let words: Vec<String> = (0..200).map(|i| format!("w{i}")).collect();
    let slow = console
        .start_run(&format!(
            "run --node gpu-b echo default {}",
            words.join(" ")
        ))
        .await;
    let streaming = format!("{slow} node-b echo/default output ");
    console
        .wait_for(0, "the pinned run to stream on node-b", |l| {
            l.starts_with(&streaming)
        })
        .await;
    let cancelling = format!("cancelling run {slow}");
    console
        .ask(&format!("cancel {slow}"), "the cancel answer", |l| {
            l == cancelling
        })
        .await;
    let cancelled = format!("{slow} node-b echo/default cancelled");
    console
        .wait_for(0, "the cancelled event", |l| l.starts_with(&cancelled))
        .await;
    let after_cancel = format!("{slow} node-b echo/default completed");
    assert!(
        !console.seen.iter().any(|l| l.starts_with(&after_cancel)),
        "{:#?}",
        console.seen
    );

    // Mistakes are answered, not fatal.
    console
        .ask("cancel nope", "the answer to `cancel nope`", |l| {
            l == "error: no open run nope"
        })
        .await;
    console
        .ask("run echo", "the usage error", |l| {
            l.starts_with("error: usage: run ")
        })
        .await;

    let mark = console.mark();
    console
        .ask("help", "the help text", |l| l == "commands:")
        .await;
    console
        .wait_for(mark, "help for cancel", |l| {
            l.trim_start().starts_with("cancel RUN_ID")
        })
        .await;

    console
        .ask("quit", "the goodbye", |l| l == "stopping the edge")
        .await;
    drop(console.stdin.take());
    console.assert_exits_cleanly("`quit`").await;

    // The nodes were told the edge is going away.
    for node in [node_a, node_b] {
        console.assert_told_of_shutdown(node).await;
    }
}

#[crate::common::test]
async fn console_mode_exits_on_sigterm_while_waiting_for_input() {
    let (mut console, addr) = Console::start(TWO_NODES).await;
    let node_a = mock(addr, "token-a", Duration::ZERO).await;

    // The console is blocked reading a line that never comes; stdin stays open.
    common::terminate(&console.child);

    console.assert_exits_cleanly("SIGTERM").await;
    console.assert_told_of_shutdown(node_a).await;
}
