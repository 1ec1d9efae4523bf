//! The integration-test harness: a real edge on port 0 and real protocol clients.
#![allow(dead_code)]

pub mod python;
pub mod runs;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use edge::app::{App, AppParts, Settings};
use edge::client::{NodeClient, RegisterOutcome, Registration};
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

/// A running edge.
pub struct TestApp {
    /// Where nodes connect.
    pub node_addr: SocketAddr,
    /// Where HTTP clients connect (`/metrics`, health, the API).
    pub http_addr: SocketAddr,
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
        let mut client = NodeClient::connect(self.node_addr).await.expect("connect");
        let outcome = client
            .register(Registration::with_token(token))
            .await
            .expect("register");
        (client, outcome)
    }

    /// Stops the edge gracefully and waits for it.
    pub async fn stop(self) {
        self.parts.stop.cancel();
        self.serving
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
    let deadline = tokio::time::Instant::now() + PATIENCE;
    while !condition() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting until {what}"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// Starts an edge on port 0 with `config` (TOML; `server.listen` and `http.listen` are
/// replaced by port 0, and events go to the `null` sink unless the config says otherwise).
pub async fn spawn_app(config: &str) -> TestApp {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("edge.toml");
    std::fs::write(&path, config).expect("write config");
    let mut settings = Settings::load(Some(&path)).expect("settings");
    settings.server.listen = SocketAddr::from(([127, 0, 0, 1], 0));
    settings.http.listen = SocketAddr::from(([127, 0, 0, 1], 0));
    settings.server.shutdown_grace_ms = 2_000;
    if !config.contains("[events]") {
        settings.events.sinks = vec![edge::adapters::sinks::config::SinkKind::Null];
    }
    let app = App::build(settings).await.expect("build");
    let node_addr = app.node_addr().expect("addr");
    let http_addr = app.http_addr().expect("http addr");
    let parts = app.parts();
    let serving = tokio::spawn(app.run_until_stopped());
    TestApp {
        node_addr,
        http_addr,
        parts,
        serving,
        dir,
    }
}
