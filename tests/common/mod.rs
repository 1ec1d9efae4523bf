//! The integration-test harness: a real edge on port 0 and real protocol clients.
#![allow(dead_code)]

pub mod deadline;
pub mod engines;
pub mod pki;
pub mod python;
pub mod runs;

/// `#[common::test]`: every integration test runs under a deadline of its own
/// ([`deadline`]).
pub use edge_test_deadline::test;

/// A `reqwest` client builder for the tests' HTTP calls. The reference node (a
/// dev-dependency) turns on reqwest's rustls without a process-wide crypto provider, so a
/// bare `reqwest::Client::new()` would panic in this process: every client starts from the
/// node's builder, which passes the `ring` provider in (decision 15). No request waits
/// forever: a connection is made within [`PATIENCE`], and a response's head and each read
/// of its body come within [`READ_PATIENCE`] (or the request fails with a timeout error
/// naming its URL).
pub fn http() -> reqwest::ClientBuilder {
    edge_node::upstream::client_builder(None)
        .expect("the system's CA certificates load")
        .connect_timeout(PATIENCE)
        .read_timeout(READ_PATIENCE)
}

/// The longest a test's HTTP client waits for the next bytes of a response: longer than
/// [`PATIENCE`], since a real engine under a loaded machine may pause mid-answer.
pub const READ_PATIENCE: Duration = Duration::from_secs(60);

/// A client from [`http`].
pub fn http_client() -> reqwest::Client {
    http().build().expect("an HTTP client")
}

/// `GET url` with a client from [`http_client`] (what `reqwest::get` does).
pub async fn http_get(url: impl reqwest::IntoUrl) -> reqwest::Result<reqwest::Response> {
    http_client().get(url).send().await
}

use std::fmt;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use edge::client::{NodeClient, RegisterOutcome, Registration};
use edge::{App, AppParts, Settings};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, ChildStderr, Command};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

/// Two nodes: `node-a`/`gpu-a` (echo: default, 2 slots) and `node-b`/`gpu-b`
/// (echo: default and fast, 2 slots), heartbeat every second.
pub const TWO_NODES: &str = r#"
[[nodes]]
id = "node-a"
alias = "gpu-a"
token = "token-a"
[nodes.runtime]
max_concurrent_runs = 2
heartbeat_interval_ms = 1000
[[nodes.adapters]]
name = "echo"
targets = ["default"]
[nodes.adapters.settings]
mode = "words"

[[nodes]]
id = "node-b"
alias = "gpu-b"
token = "token-b"
[nodes.runtime]
max_concurrent_runs = 2
heartbeat_interval_ms = 1000
[[nodes.adapters]]
name = "echo"
targets = ["default", "fast"]
"#;

/// [`TWO_NODES`] with both nodes heartbeating every `interval_ms`.
pub fn two_nodes_with_heartbeat(interval_ms: u64) -> String {
    TWO_NODES.replace(
        "heartbeat_interval_ms = 1000",
        &format!("heartbeat_interval_ms = {interval_ms}"),
    )
}

/// [`TWO_NODES`] with node-a heartbeating every `interval_ms`; node-b keeps 1 s.
pub fn two_nodes_with_node_a_heartbeat(interval_ms: u64) -> String {
    TWO_NODES.replacen(
        "heartbeat_interval_ms = 1000",
        &format!("heartbeat_interval_ms = {interval_ms}"),
        1,
    )
}

/// One `[[nodes]]` table of a config fixture, built up key by key; `Display` gives the TOML.
pub struct NodeTable(String);

impl NodeTable {
    /// `[[nodes]]` with `id`, `alias` and `token`, and nothing else yet.
    pub fn new(id: &str, alias: &str, token: &str) -> Self {
        Self(format!(
            "[[nodes]]\nid = {id:?}\nalias = {alias:?}\ntoken = {token:?}\n"
        ))
    }

    /// Adds `[nodes.runtime]` with `max_concurrent_runs` and `heartbeat_interval_ms`.
    pub fn runtime(mut self, max_concurrent_runs: u32, heartbeat_interval_ms: u64) -> Self {
        self.0.push_str(&format!(
            "[nodes.runtime]\nmax_concurrent_runs = {max_concurrent_runs}\n\
             heartbeat_interval_ms = {heartbeat_interval_ms}\n"
        ));
        self
    }

    /// Adds the `echo` adapter, serving `targets`.
    pub fn echo(mut self, targets: &[&str]) -> Self {
        self.0.push_str(&format!(
            "[[nodes.adapters]]\nname = \"echo\"\ntargets = {targets:?}\n"
        ));
        self
    }
}

impl fmt::Display for NodeTable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// `count` nodes `node-{i}` (alias `{alias_prefix}-{i}`, token `token-{i}`), each serving
/// `echo/default` with the given runtime limits.
pub fn numbered_nodes(
    count: usize,
    alias_prefix: &str,
    max_concurrent_runs: u32,
    heartbeat_interval_ms: u64,
) -> String {
    (0..count)
        .map(|i| {
            NodeTable::new(
                &format!("node-{i}"),
                &format!("{alias_prefix}-{i}"),
                &format!("token-{i}"),
            )
            .runtime(max_concurrent_runs, heartbeat_interval_ms)
            .echo(&["default"])
            .to_string()
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// `[events]` with only the file sink, writing to `path`, flushed often.
pub fn file_sink(path: &Path) -> String {
    format!(
        "[events]\nsinks = [\"file\"]\n[events.file]\npath = {:?}\nflush_interval_ms = 20\n",
        path.display().to_string()
    )
}

/// The events the file sink wrote to `path`, one JSON object per line.
pub fn json_lines(path: &Path) -> Vec<serde_json::Value> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .map(|line| serde_json::from_str(line).expect("a JSON line"))
        .collect()
}

/// Every `.rs` file under `dir`, recursively: for the tests that check rules on the source.
pub fn rust_files(dir: &Path) -> Vec<PathBuf> {
    files_with(dir, "rs")
}

/// Every file under `dir`, at any depth, whose extension is `extension`.
pub fn files_with(dir: &Path, extension: &str) -> Vec<PathBuf> {
    fn walk(dir: &Path, extension: &str, files: &mut Vec<PathBuf>) {
        let entries = std::fs::read_dir(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
        for entry in entries {
            let path = entry.expect("a directory entry").path();
            if path.is_dir() {
                walk(&path, extension, files);
            } else if path.extension().is_some_and(|ext| ext == extension) {
                files.push(path);
            }
        }
    }
    let mut files = Vec::new();
    walk(dir, extension, &mut files);
    files
}

/// Writes `config` to `edge.toml` in `dir` and returns its path.
pub fn write_config(dir: &Path, config: &str) -> PathBuf {
    let path = dir.join("edge.toml");
    std::fs::write(&path, config).expect("write config");
    path
}

/// Writes `config` into `dir` and loads it with the node and HTTP listeners on port 0.
pub fn settings_on_free_ports(dir: &Path, config: &str) -> Settings {
    let mut settings = Settings::load(Some(&write_config(dir, config))).expect("settings");
    settings.server.listen = SocketAddr::from(([127, 0, 0, 1], 0));
    settings.http.listen = SocketAddr::from(([127, 0, 0, 1], 0));
    settings.admin.listen = SocketAddr::from(([127, 0, 0, 1], 0));
    if !config.contains("[journal]") {
        settings.journal.path = Some(dir.join("journal.sqlite3"));
    }
    settings
}

/// A running edge.
pub struct TestApp {
    /// Where nodes connect.
    pub node_addr: SocketAddr,
    /// Where HTTP clients connect (`/metrics`, health, the API).
    pub http_addr: SocketAddr,
    /// Where the management API answers.
    pub admin_addr: SocketAddr,
    /// The edge's parts (registry, run service, stop token).
    pub parts: AppParts,
    /// The serving task; ends after a stop.
    pub serving: JoinHandle<anyhow::Result<()>>,
    /// Holds the config file (and anything else written) alive.
    pub dir: tempfile::TempDir,
}

impl TestApp {
    /// A path inside the app's temporary directory.
    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// Connects a client and registers with `token`.
    pub async fn register(&self, token: &str) -> (NodeClient, RegisterOutcome) {
        let registered = async {
            let mut client = NodeClient::connect(self.node_addr).await.expect("connect");
            let outcome = client
                .register(Registration::with_token(token))
                .await
                .expect("register");
            (client, outcome)
        };
        bounded("the edge to answer a registration", registered).await
    }

    /// Stops the edge gracefully and waits for it.
    pub async fn stop(self) {
        self.parts.stop.cancel();
        bounded("the edge to stop", self.serving)
            .await
            .expect("serving task")
            .expect("clean stop");
    }

    /// Waits until `count` nodes are registered.
    pub async fn wait_for_nodes(&self, count: usize) {
        let registry = &self.parts.registry;
        eventually(&format!("{count} nodes are registered"), || {
            registry.len() == count
        })
        .await;
    }

    /// Waits until node `id` (or alias) has left the registry.
    pub async fn wait_until_left(&self, id: &str) {
        let registry = &self.parts.registry;
        eventually(&format!("{id} has left the registry"), || {
            registry.get(id).is_none()
        })
        .await;
    }

    /// Waits until the edge has no open or queued run and no connected node counts an
    /// active one.
    pub async fn assert_settled(&self) {
        let runs = &self.parts.runs;
        let registry = &self.parts.registry;
        eventually("every run is closed and every node idle", || {
            runs.open_runs() == 0
                && runs.queued_runs() == 0
                && registry.snapshot().iter().all(|n| n.active_runs == 0)
        })
        .await;
    }
}

/// The longest the harness waits for an asynchronous effect before failing the test. A
/// bound against hangs, never a timing assertion.
pub const PATIENCE: Duration = Duration::from_secs(15);

/// Polls `condition` with short waits until it holds; panics naming `what` if it still
/// does not after [`PATIENCE`]. For effects the edge applies asynchronously (a node
/// leaving the registry, a run being retired).
pub async fn eventually(what: &str, mut condition: impl FnMut() -> bool) {
    eventually_ok(what, || {
        std::future::ready(condition().then_some(()).ok_or("it did not"))
    })
    .await;
}

/// Polls the asynchronous `probe` with short waits until it returns `Ok`, and returns the
/// value; panics naming `what` and the last error if it has not after [`PATIENCE`] — also
/// when a probe itself never returns. For effects observed through I/O (a metric scraped, a
/// health check, a retried start).
pub async fn eventually_ok<T, E: fmt::Display, F: std::future::Future<Output = Result<T, E>>>(
    what: &str,
    mut probe: impl FnMut() -> F,
) -> T {
    let deadline = tokio::time::Instant::now() + PATIENCE;
    let mut last = String::from("no probe answered yet");
    loop {
        match tokio::time::timeout_at(deadline, probe()).await {
            Ok(Ok(value)) => return value,
            Ok(Err(error)) => last = error.to_string(),
            Err(_) => panic!(
                "timed out waiting until {what}: a probe did not return within {PATIENCE:?}; \
                 the one before said: {last}"
            ),
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting until {what}: {last}"
        );
        tokio::time::sleep(POLL).await;
    }
}

/// Awaits `future` for at most [`PATIENCE`]; panics naming `what` it waited for if it has
/// not ended by then. For every wait of a test on the edge, a node, a client task, a child
/// process or a response body that has no bound of its own.
pub async fn bounded<T>(
    what: impl fmt::Display,
    future: impl std::future::Future<Output = T>,
) -> T {
    bounded_for(PATIENCE, what, future).await
}

/// [`bounded`] with a bound of `patience` (a wait that is long by design: a whole soak).
pub async fn bounded_for<T>(
    patience: Duration,
    what: impl fmt::Display,
    future: impl std::future::Future<Output = T>,
) -> T {
    tokio::time::timeout(patience, future)
        .await
        .unwrap_or_else(|_| panic!("timed out after {patience:?} waiting for {what}"))
}

/// How long [`eventually`] and [`eventually_ok`] wait between two looks.
const POLL: Duration = Duration::from_millis(5);

/// Starts an edge on port 0 with `config` (TOML; `server.listen` and `http.listen` are
/// replaced by port 0, and events go to the `null` sink unless the config says otherwise).
pub async fn spawn_app(config: &str) -> TestApp {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut settings = settings_on_free_ports(dir.path(), config);
    settings.server.shutdown_grace_ms = 2_000;
    if !config.contains("[events]") {
        settings.events.sinks = vec![edge::settings::SinkKind::Null];
    }
    serve(settings, dir).await
}

/// Builds an edge with `settings` (whose files live in `dir`, kept as long as the edge) and
/// serves it on a task of its own.
pub async fn serve(settings: Settings, dir: tempfile::TempDir) -> TestApp {
    // A member of a site (`[cluster]`) is given its role by its lease, nothing else.
    let role = settings
        .cluster
        .is_none()
        .then_some(edge::ports::Role::Single);
    serve_in(settings, dir, role).await
}

/// [`serve`], the edge acting as `role` in its site from the first connection it accepts.
pub async fn serve_as(
    settings: Settings,
    dir: tempfile::TempDir,
    role: edge::ports::Role,
) -> TestApp {
    serve_in(settings, dir, Some(role)).await
}

/// [`serve`], the edge acting as `role` when given.
async fn serve_in(
    settings: Settings,
    dir: tempfile::TempDir,
    role: Option<edge::ports::Role>,
) -> TestApp {
    let app = App::build(settings).await.expect("build the edge");
    if let Some(role) = role {
        app.parts().site.set(role);
    }
    let node_addr = app.node_addr().expect("node addr");
    let http_addr = app.http_addr().expect("http addr");
    let admin_addr = app.admin_addr().expect("admin addr");
    let parts = app.parts();
    let serving = tokio::spawn(app.run_until_stopped());
    TestApp {
        node_addr,
        http_addr,
        admin_addr,
        parts,
        serving,
        dir,
    }
}

/// What the real `edge` binary has written to stderr (its JSON logs), line by line.
pub type Logs = Arc<Mutex<Vec<String>>>;

/// `edge serve` on `config` with both listeners on free ports and JSON logs on a piped
/// stderr; the process is killed if dropped. The caller adds flags and stdio, then spawns.
pub fn edge_serve(config: &Path) -> Command {
    edge_serve_on(config, "127.0.0.1:0")
}

/// [`edge_serve`] with the node listener on `listen` (an edge restarted where its nodes
/// dial).
pub fn edge_serve_on(config: &Path, listen: &str) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_edge"));
    command
        .arg("serve")
        .arg("--config")
        .arg(config)
        .args(["--listen", listen, "--http-listen", "127.0.0.1:0"])
        .args(["--admin-listen", "127.0.0.1:0"])
        .args(["--log-format", "json"])
        .env_remove("RUST_LOG")
        .env(
            "EDGE__JOURNAL__PATH",
            config.with_file_name("journal.sqlite3"),
        )
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    command
}

/// Reads the binary's `stderr` in the background, keeping every line (and so never letting
/// the pipe fill); the receiver gets the node and HTTP addresses once it logs that it serves.
pub fn watch_stderr(stderr: ChildStderr) -> (Logs, oneshot::Receiver<(SocketAddr, SocketAddr)>) {
    let logs = Arc::new(Mutex::new(Vec::new()));
    let (serving, bound) = oneshot::channel();
    let kept = Arc::clone(&logs);
    tokio::spawn(async move {
        let mut serving = Some(serving);
        let mut reader = BufReader::new(stderr);
        let mut line = Vec::new();
        // Bytes, not `lines()`: a line that is not UTF-8 must not end the reading (the
        // pipe would fill and block the edge, and its serving line would go unseen).
        while reader
            .read_until(b'\n', &mut line)
            .await
            .is_ok_and(|read| read > 0)
        {
            let text = String::from_utf8_lossy(&line).trim_end().to_owned();
            line.clear();
            if let Some(addrs) = serving_addresses(&text)
                && let Some(serving) = serving.take()
            {
                let _ = serving.send(addrs);
            }
            kept.lock().expect("log lines").push(text);
        }
    });
    (logs, bound)
}

/// The lines in `logs` so far.
pub fn logged(logs: &Logs) -> Vec<String> {
    logs.lock().map(|l| l.clone()).unwrap_or_default()
}

/// The node and HTTP addresses of a JSON log line saying `edge is serving`.
fn serving_addresses(line: &str) -> Option<(SocketAddr, SocketAddr)> {
    let record: serde_json::Value = serde_json::from_str(line).ok()?;
    let field = |name: &str| {
        record
            .get(name)
            .or_else(|| record.pointer(&format!("/fields/{name}")))
            .cloned()
    };
    if field("message")? != "edge is serving" {
        return None;
    }
    let listen = field("listen")?.as_str()?.parse().ok()?;
    let http = field("http")?.as_str()?.parse().ok()?;
    Some((listen, http))
}

/// Sends SIGTERM to the running `child`.
pub fn terminate(child: &Child) {
    let pid = child.id().expect("the edge is running").to_string();
    let signalled = std::process::Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .expect("run kill");
    assert!(signalled.success(), "kill -TERM {pid} failed");
}
