//! What the site tests of issue 49 share: the `[cluster]` section of a member's config, a
//! member as a real `edge serve` process (killed with SIGKILL, its data directory deleted,
//! started again where its nodes dial), and a load balancer as a site runs behind one — a
//! TCP proxy that sends each new client connection to the member whose `/readyz` says 200,
//! asking on every accept. It decides nothing a test asserts.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, OnceLock};

use reqwest::StatusCode;
use serde_json::Value;
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;

use crate::admin_crash::{Edge, get, start_edge_with};
use crate::common::engines::NatsServer;
use crate::common::{self, edge_serve_on, eventually_ok, http_client, write_config};

/// The `[cluster]` section of a member of site `s1` on `nats`: a 300 ms lease renewed every
/// 100 ms, so a killed or paused member is taken over within a second.
pub(crate) fn cluster_section(nats: &NatsServer) -> String {
    cluster_section_with(nats, 300)
}

/// [`cluster_section`] with a lease of `lease_ms`, renewed every third of it.
pub(crate) fn cluster_section_with(nats: &NatsServer, lease_ms: u64) -> String {
    format!(
        "[cluster]\nsite = \"s1\"\nnats = {:?}\nlease_ms = {lease_ms}\nrenew_ms = {}\n",
        nats.url(),
        lease_ms / 3
    )
}

/// A free loopback address: a member's node listener, the same across its restarts (the
/// nodes know it).
pub(crate) fn free_address() -> SocketAddr {
    let socket = std::net::TcpListener::bind("127.0.0.1:0").expect("a free port");
    socket.local_addr().expect("its address")
}

/// Sends `signal` (`-STOP`, `-CONT`) to process `pid`.
pub(crate) fn signal(pid: u32, signal: &str) {
    let status = std::process::Command::new("kill")
        .args([signal, &pid.to_string()])
        .status()
        .expect("run kill");
    assert!(status.success(), "kill {signal} {pid}");
}

/// `GET /readyz` at `http`: its status and body (`None` when nothing answers there).
pub(crate) async fn readyz(http: SocketAddr) -> Option<(StatusCode, String)> {
    static CLIENT: OnceLock<reqwest::Client> = OnceLock::new();
    let client = CLIENT.get_or_init(http_client);
    let response = client
        .get(format!("http://{http}/readyz"))
        .timeout(std::time::Duration::from_secs(2))
        .send()
        .await
        .ok()?;
    let status = response.status();
    Some((status, response.text().await.unwrap_or_default()))
}

/// Waits until `/readyz` at `http` is 200; its body.
pub(crate) async fn ready(http: SocketAddr) -> String {
    eventually_ok(&format!("{http} is ready"), || async {
        match readyz(http).await {
            Some((StatusCode::OK, body)) => Ok(body),
            other => Err(format!("{other:?}")),
        }
    })
    .await
}

/// Waits until `/readyz` at `http` answers, and not 200 (the member stands by); its body.
pub(crate) async fn standing_by(http: SocketAddr) -> String {
    eventually_ok(&format!("{http} stands by"), || async {
        match readyz(http).await {
            Some((StatusCode::SERVICE_UNAVAILABLE, body)) => Ok(body),
            other => Err(format!("{other:?}")),
        }
    })
    .await
}

/// Waits until node `id` is connected to the member whose management API is `admin`.
pub(crate) async fn node_connected(admin: SocketAddr, id: &str) {
    eventually_ok(&format!("{id} is connected to {admin}"), || async {
        let list = get(admin, "/admin/v1/nodes").await;
        let nodes = list["nodes"].as_array().cloned().unwrap_or_default();
        let connected = nodes.iter().any(|n| n["id"] == id && !n["peer"].is_null());
        if connected { Ok(()) } else { Err(list) }
    })
    .await;
}

/// A member of a site: a real `edge serve` process on a fixed node address, its config and
/// journal in a data directory of its own.
pub(crate) struct Member {
    config: String,
    listen: SocketAddr,
    dir: Option<tempfile::TempDir>,
    /// The running process; `None` while the member is down.
    pub(crate) edge: Option<Edge>,
}

impl Member {
    /// Starts member `id` (its `[edge] id`) with `config` (the rest of its TOML, `[cluster]`
    /// included, no `[edge]` table).
    pub(crate) async fn start(id: &str, config: &str) -> Self {
        let mut member = Self {
            config: format!("[edge]\nid = {id:?}\n{config}"),
            listen: free_address(),
            dir: None,
            edge: None,
        };
        member.restart().await;
        member
    }

    /// Starts it again (after a [`Member::kill`]) on the same node address; its data
    /// directory is the one it had, or a new empty one when the kill deleted it.
    pub(crate) async fn restart(&mut self) {
        let dir = self
            .dir
            .get_or_insert_with(|| tempfile::tempdir().expect("tempdir"));
        let path: PathBuf = write_config(dir.path(), &self.config);
        let command = edge_serve_on(&path, &self.listen.to_string());
        self.edge = Some(start_edge_with(command).await);
    }

    /// The running process.
    pub(crate) fn edge(&self) -> &Edge {
        self.edge.as_ref().expect("the member runs")
    }

    /// Where its nodes dial (across restarts).
    pub(crate) fn node_addr(&self) -> SocketAddr {
        self.listen
    }

    /// Its HTTP address now.
    pub(crate) fn http(&self) -> SocketAddr {
        self.edge().http
    }

    /// Its management API now.
    pub(crate) fn admin(&self) -> SocketAddr {
        self.edge().admin
    }

    /// Its process id now (for `SIGSTOP` and `SIGCONT`).
    pub(crate) fn pid(&self) -> u32 {
        self.edge().child.id().expect("the member's pid")
    }

    /// SIGKILL, and waits for the process to be gone; with `wipe`, its data directory
    /// (journal included) is deleted too, as when its machine is lost.
    pub(crate) async fn kill(&mut self, wipe: bool) {
        let mut edge = self.edge.take().expect("the member runs");
        edge.child.start_kill().expect("kill -9");
        common::bounded("the killed member to exit", edge.child.wait())
            .await
            .expect("the member is gone");
        if wipe {
            self.dir = None;
        }
    }
}

/// The records of the runs of the member at `admin` in `state` (`open`, `finished`).
pub(crate) async fn runs_in(admin: SocketAddr, state: &str) -> Vec<Value> {
    let list = get(admin, &format!("/admin/v1/runs?state={state}&limit=1000")).await;
    list["runs"].as_array().cloned().unwrap_or_default()
}

/// A load balancer in front of a site's members: each new client connection goes to the
/// first member whose `/readyz` answers 200 when it is accepted, and is closed when none
/// does. The members' HTTP addresses can change (a member started again).
pub(crate) struct Balancer {
    /// Where clients connect.
    pub(crate) addr: SocketAddr,
    members: Arc<Mutex<Vec<SocketAddr>>>,
    accepting: JoinHandle<()>,
}

impl Balancer {
    /// A balancer in front of the members at `members` (their HTTP addresses).
    pub(crate) async fn start(members: Vec<SocketAddr>) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("local addr");
        let members = Arc::new(Mutex::new(members));
        let probed = Arc::clone(&members);
        let accepting = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let members = probed.lock().expect("members").clone();
                tokio::spawn(forward(client, members));
            }
        });
        Self {
            addr,
            members,
            accepting,
        }
    }

    /// Member `index` now answers at `http`.
    pub(crate) fn set(&self, index: usize, http: SocketAddr) {
        self.members.lock().expect("members")[index] = http;
    }

    /// `http://ADDR/v1`: the site's API, as clients know it.
    pub(crate) fn v1_url(&self) -> String {
        format!("http://{}/v1", self.addr)
    }
}

impl Drop for Balancer {
    fn drop(&mut self) {
        self.accepting.abort();
    }
}

/// Sends `client` to the first of `members` that is ready, byte for byte until either side
/// closes; closes it when none is.
async fn forward(mut client: TcpStream, members: Vec<SocketAddr>) {
    for member in members {
        if !matches!(readyz(member).await, Some((StatusCode::OK, _))) {
            continue;
        }
        if let Ok(mut upstream) = TcpStream::connect(member).await {
            let _ = tokio::io::copy_bidirectional(&mut client, &mut upstream).await;
        }
        return;
    }
}
