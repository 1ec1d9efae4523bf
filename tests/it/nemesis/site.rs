//! The site the nemesis runs against, as processes: three `nats-server`s clustered with
//! JetStream, the members (`edge serve`), the reference nodes (this test binary run again as
//! [`super::node_process`]), each in the namespace [`Net`] gives it; the `llama-server`s the
//! nodes' engines are, in the root namespace behind their taps; and the balancer clients go
//! through. Each process is killed (`SIGKILL`), paused and resumed by its pid, and started
//! again with the same command line (a member's data directory deleted on request).

use std::ffi::OsString;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use tokio::process::Child;

use super::net::Net;
use crate::common::engines::{nats_info, nats_server_binary, nats_server_release_binary};

/// Where a member's nodes dial, its API and its management API answer (on its address).
pub(crate) const NODE_PORT: u16 = 7000;
pub(crate) const HTTP_PORT: u16 = 8080;
pub(crate) const ADMIN_PORT: u16 = 9090;
/// The NATS servers' client and route ports (on their addresses).
const NATS_PORT: u16 = 4222;
const ROUTE_PORT: u16 = 6222;

/// The environment of a [`super::node_process`]: the members' node addresses, the token.
pub(crate) const NODE_EDGES_ENV: &str = "EDGE_NEMESIS_NODE_EDGES";
pub(crate) const NODE_TOKEN_ENV: &str = "EDGE_NEMESIS_NODE_TOKEN";

/// One process of the site: its command line and log, and its child while it runs.
pub(crate) struct Process {
    pub(crate) name: String,
    program: PathBuf,
    args: Vec<OsString>,
    env: Vec<(String, OsString)>,
    log: PathBuf,
    child: Option<Child>,
}

impl Process {
    fn new(name: &str, program: PathBuf, args: Vec<OsString>, log: PathBuf) -> Self {
        Self {
            name: name.to_owned(),
            program,
            args,
            env: Vec::new(),
            log,
            child: None,
        }
    }

    /// Starts it (in its namespace), its output appended to its log.
    pub(crate) fn spawn(&mut self, net: &Net) {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .unwrap_or_else(|e| panic!("cannot open {}: {e}", self.log.display()));
        let stderr = log.try_clone().expect("the log again");
        let mut command = net.command(&self.name, &self.program);
        command
            .args(&self.args)
            .env_remove("RUST_LOG")
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(stderr)
            .kill_on_drop(true);
        for (key, value) in &self.env {
            command.env(key, value);
        }
        let child = command
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {}: {e}", self.name));
        self.child = Some(child);
    }

    /// Whether it runs (started, not killed).
    pub(crate) fn runs(&self) -> bool {
        self.child.is_some()
    }

    /// How it exited, when it did without being killed: a finding, not a fault.
    pub(crate) fn exited(&self) -> Option<String> {
        let pid = self.child.as_ref()?.id()?;
        let alive = std::path::Path::new(&format!("/proc/{pid}")).exists()
            && !std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| {
                stat.split(") ")
                    .nth(1)
                    .is_some_and(|rest| rest.starts_with('Z'))
            });
        (!alive).then(|| format!("{} (pid {pid}) exited on its own: see its log", self.name))
    }

    /// `SIGKILL`, and waits for it to be gone.
    pub(crate) async fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.start_kill();
            let _ = tokio::time::timeout(Duration::from_secs(10), child.wait()).await;
        }
    }

    /// Sends `signal` (`-STOP`, `-CONT`) to it.
    pub(crate) fn signal(&self, signal: &str) {
        if let Some(pid) = self.child.as_ref().and_then(Child::id) {
            let _ = std::process::Command::new("kill")
                .args([signal, &pid.to_string()])
                .status();
        }
    }
}

/// Names the `nats-server` the site runs on: `EDGE_NEMESIS_NATS=debian` for Debian's 2.9.10.
pub(crate) const NATS_ENV: &str = "EDGE_NEMESIS_NATS";

/// The `nats-server` the site runs: NATS's release build at the pinned version
/// (`.ci/engines/nats-server-release.sh`, decision 58), or Debian's 2.9.10 when [`NATS_ENV`]
/// says `debian` — the version the first three 30-minute runs saw lose acknowledged batches.
pub(crate) fn nats_binary() -> PathBuf {
    match std::env::var(NATS_ENV).as_deref() {
        Ok("debian") => nats_server_binary(),
        Ok("") | Err(_) => nats_server_release_binary(),
        Ok(other) => panic!("{NATS_ENV}={other}: say `debian` or leave it unset"),
    }
}

/// The version [`nats_binary`] says it is (`v2.12.8`).
pub(crate) fn nats_version() -> String {
    let output = std::process::Command::new(nats_binary())
        .arg("--version")
        .output()
        .expect("nats-server --version");
    let said = String::from_utf8_lossy(&output.stdout);
    said.split_whitespace()
        .last()
        .unwrap_or_default()
        .to_owned()
}

/// The three NATS servers' config files in `dir`: one cluster, JetStream on each.
pub(crate) fn nats_servers(net: &Net, dir: &Path) -> Vec<Process> {
    let binary = nats_binary();
    let names = ["n1", "n2", "n3"];
    names
        .iter()
        .map(|name| {
            let ip = net.ip(name);
            let routes: Vec<String> = names
                .iter()
                .filter(|other| *other != name)
                .map(|other| format!("nats-route://{}:{ROUTE_PORT}", net.ip(other)))
                .collect();
            let store = dir.join(format!("{name}-jetstream"));
            let config = format!(
                "server_name: {name}\nlisten: {ip}:{NATS_PORT}\n\
                 jetstream {{ store_dir: {store:?}, max_memory_store: 64MB, max_file_store: 2GB }}\n\
                 cluster {{ name: nemesis, listen: {ip}:{ROUTE_PORT}, routes: [{}] }}\n",
                routes.join(", ")
            );
            let path = dir.join(format!("{name}.conf"));
            std::fs::write(&path, config).expect("a NATS config");
            Process::new(
                name,
                binary.clone(),
                vec!["-c".into(), path.into()],
                dir.join(format!("{name}.log")),
            )
        })
        .collect()
}

/// The site's NATS URL list, as members' `[cluster] nats` takes it.
pub(crate) fn nats_urls(net: &Net) -> String {
    ["n1", "n2", "n3"]
        .iter()
        .map(|name| format!("nats://{}:{NATS_PORT}", net.ip(name)))
        .collect::<Vec<_>>()
        .join(",")
}

/// Waits until NATS server `name` greets clients (bounded).
pub(crate) async fn nats_ready(net: &Net, name: &str) {
    let addr = SocketAddr::from((net.ip(name), NATS_PORT));
    crate::common::eventually_ok(&format!("{name} greets clients"), || async move {
        nats_info(addr).await.map(|_| ()).ok_or("no greeting")
    })
    .await;
}

/// A member: `edge serve` on its address, its config and journal in `dir`.
pub(crate) fn member(net: &Net, name: &str, dir: &Path, config: &str) -> Process {
    std::fs::create_dir_all(dir).expect("the member's directory");
    let path = dir.join("edge.toml");
    std::fs::write(&path, format!("[edge]\nid = {name:?}\n{config}")).expect("its config");
    let ip = net.ip(name);
    let args: Vec<OsString> = vec![
        "serve".into(),
        "--config".into(),
        path.into(),
        "--listen".into(),
        format!("{ip}:{NODE_PORT}").into(),
        "--http-listen".into(),
        format!("{ip}:{HTTP_PORT}").into(),
        "--admin-listen".into(),
        format!("{ip}:{ADMIN_PORT}").into(),
        "--log-format".into(),
        "json".into(),
    ];
    // A long run may be given a copy (`EDGE_NEMESIS_EDGE_BIN`), so rebuilding meanwhile
    // changes nothing it runs.
    let binary = std::env::var_os("EDGE_NEMESIS_EDGE_BIN")
        .map_or_else(|| PathBuf::from(env!("CARGO_BIN_EXE_edge")), PathBuf::from);
    let mut process = Process::new(name, binary, args, dir.with_extension("log"));
    process.env.push((
        "EDGE__JOURNAL__PATH".to_owned(),
        dir.join("journal.sqlite3").into(),
    ));
    process
}

/// Deletes member `name`'s journal (its data directory's files but the config), as when its
/// machine's disk is lost.
pub(crate) fn wipe(dir: &Path) {
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        if entry.file_name() != "edge.toml" {
            let _ = std::fs::remove_file(entry.path());
        }
    }
}

/// A reference node: this test binary run again as [`super::node_process`], dialling
/// `edges` with `token`.
pub(crate) fn node(name: &str, dir: &Path, edges: &str, token: &str) -> Process {
    let args: Vec<OsString> = [
        "nemesis::node_process",
        "--exact",
        "--ignored",
        "--nocapture",
    ]
    .map(OsString::from)
    .to_vec();
    let mut process = Process::new(
        name,
        std::env::current_exe().expect("the test binary"),
        args,
        dir.join(format!("{name}.log")),
    );
    process
        .env
        .push((NODE_EDGES_ENV.to_owned(), edges.to_owned().into()));
    process
        .env
        .push((NODE_TOKEN_ENV.to_owned(), token.to_owned().into()));
    process
}
