//! TLS on the node transport and the HTTP server, end to end: a real edge on port 0 with
//! certificates generated here (rcgen), and node clients speaking the real protocol inside
//! TLS. Covers plain TLS, mutual TLS, peers that are not TLS or never handshake, bad TLS
//! files at startup, and HTTPS.

use crate::common;
use crate::mock_node;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use common::pki::Ca;
use common::runs::echo_run;
use common::{TWO_NODES, TestApp, eventually, settings_on_free_ports, spawn_app};
use edge::App;
use edge::client::{
    ClientError, NodeClient, RegisterOutcome, Registration, ServerName, tls_client_config,
};
use edge::domain::RunEventKind;
use edge::ports::CloseReason;
use mock_node::{MockNode, MockOptions};
use rcgen::ExtendedKeyUsagePurpose;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// The longest any single asynchronous effect may take before a test gives up.
const PATIENCE: Duration = Duration::from_secs(10);

// ---------------------------------------------------------------------------------------
// Certificates
// ---------------------------------------------------------------------------------------

/// Certificate files in a temporary directory: a CA, the edge's certificate signed by it
/// (valid for `localhost` and `127.0.0.1`), a client certificate signed by it, and a client
/// certificate signed by another CA.
struct Pki {
    dir: tempfile::TempDir,
}

impl Pki {
    fn new() -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        let ca = Ca::new("edge test CA");
        let other = Ca::new("some other CA");
        let (server_cert, server_key) = ca.issue(
            &["localhost", "127.0.0.1"],
            ExtendedKeyUsagePurpose::ServerAuth,
        );
        let (client_cert, client_key) = ca.issue(&["node-a"], ExtendedKeyUsagePurpose::ClientAuth);
        let (stranger_cert, stranger_key) =
            other.issue(&["node-a"], ExtendedKeyUsagePurpose::ClientAuth);
        for (name, contents) in [
            ("ca.pem", &ca.pem),
            ("server.pem", &server_cert),
            ("server.key", &server_key),
            ("client.pem", &client_cert),
            ("client.key", &client_key),
            ("stranger.pem", &stranger_cert),
            ("stranger.key", &stranger_key),
        ] {
            std::fs::write(dir.path().join(name), contents).expect("write PEM");
        }
        Self { dir }
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// A `[<section>.tls]` table with the edge's certificate, plus `extra` lines.
    fn section(&self, section: &str, extra: &str) -> String {
        tls_table(
            section,
            &self.path("server.pem"),
            &self.path("server.key"),
            extra,
        )
    }

    /// `client_ca_path = "<ca.pem>"`, for mutual TLS.
    fn client_ca(&self) -> String {
        format!(
            "client_ca_path = {:?}",
            self.path("ca.pem").display().to_string()
        )
    }

    /// A client config trusting the CA, presenting `identity` (file stem: `client`,
    /// `stranger`) when given.
    fn client(&self, identity: Option<&str>) -> Arc<rustls::ClientConfig> {
        let files = identity.map(|stem| {
            (
                self.path(&format!("{stem}.pem")),
                self.path(&format!("{stem}.key")),
            )
        });
        tls_client_config(
            &self.path("ca.pem"),
            files
                .as_ref()
                .map(|(cert, key)| (cert.as_path(), key.as_path())),
        )
        .expect("client TLS config")
    }
}

/// A `[<section>.tls]` table naming `cert` and `key`, plus `extra` lines.
fn tls_table(section: &str, cert: &Path, key: &Path, extra: &str) -> String {
    format!(
        "\n[{section}.tls]\ncert_path = {:?}\nkey_path = {:?}\n{extra}\n",
        cert.display().to_string(),
        key.display().to_string(),
    )
}

fn localhost() -> ServerName<'static> {
    ServerName::try_from("localhost").expect("server name")
}

// ---------------------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------------------

async fn within<T>(future: impl Future<Output = T>) -> T {
    tokio::time::timeout(PATIENCE, future)
        .await
        .expect("timed out")
}

async fn connect_tls(app: &TestApp, config: Arc<rustls::ClientConfig>) -> NodeClient {
    within(NodeClient::connect_tls(app.node_addr, localhost(), config))
        .await
        .expect("TLS connect")
}

/// Connects over TLS and registers with `token`: the outcome, or why it failed (with mutual
/// TLS a refused certificate may surface only on the first read).
async fn try_register(
    app: &TestApp,
    config: Arc<rustls::ClientConfig>,
    token: &str,
) -> Result<(NodeClient, RegisterOutcome), ClientError> {
    let mut client = within(NodeClient::connect_tls(app.node_addr, localhost(), config)).await?;
    let outcome = within(client.register(Registration::with_token(token))).await?;
    Ok((client, outcome))
}

/// Waits until the transport has closed `count` connections for `reason`.
async fn wait_for_closed(app: &TestApp, reason: CloseReason, count: u64) {
    let stats = app.parts.transport.stats();
    eventually(&format!("{count} connections closed as {reason}"), || {
        stats.closed(reason) >= count
    })
    .await;
}

/// Builds an edge from `config` on port 0 and returns its error, which must happen.
async fn build_error(config: &str) -> String {
    let dir = tempfile::tempdir().expect("tempdir");
    match App::build(settings_on_free_ports(dir.path(), config)).await {
        Ok(_) => panic!("the edge started with bad TLS files"),
        Err(error) => format!("{error:#}"),
    }
}

// ---------------------------------------------------------------------------------------
// Node transport over TLS
// ---------------------------------------------------------------------------------------

#[crate::common::test]
async fn a_node_registers_over_tls_gets_its_config_and_serves_runs() {
    let pki = Pki::new();
    let app = spawn_app(&format!("{TWO_NODES}{}", pki.section("server", ""))).await;

    let client = connect_tls(&app, pki.client(None)).await;
    let node = within(MockNode::start_on(client, MockOptions::new("token-a")))
        .await
        .expect("registers over TLS");
    assert!(node.outcome.accepted);
    assert_eq!(node.outcome.node_id, "node-a");
    assert_eq!(node.outcome.alias, "gpu-a");
    let config = node.outcome.config.as_ref().expect("config");
    assert_eq!(config.adapters[0].name, "echo");
    assert_eq!(config.heartbeat_interval_ms, 1000);
    app.wait_for_nodes(1).await;

    let mut run = app
        .parts
        .runs
        .start(echo_run("hello over tls"))
        .expect("run accepted");
    let mut text = String::new();
    let terminal = within(async {
        loop {
            let event = run.events.recv().await.expect("run ended early");
            match &event.kind {
                RunEventKind::Output { text: chunk, .. } => text.push_str(chunk),
                kind if kind.is_terminal() => return kind.clone(),
                _ => {}
            }
        }
    })
    .await;
    assert!(
        matches!(terminal, RunEventKind::Completed { .. }),
        "{terminal:?}"
    );
    for word in ["hello", "over", "tls"] {
        assert!(text.contains(word), "{text:?}");
    }
    assert_eq!(
        app.parts
            .transport
            .stats()
            .closed(CloseReason::TlsHandshake),
        0
    );
    app.stop().await;
}

#[crate::common::test]
async fn a_plaintext_node_is_closed_and_tls_nodes_keep_working() {
    let pki = Pki::new();
    let app = spawn_app(&format!("{TWO_NODES}{}", pki.section("server", ""))).await;
    let (mut tls_node, outcome) = try_register(&app, pki.client(None), "token-a")
        .await
        .expect("TLS node registers");
    assert!(outcome.accepted);
    app.wait_for_nodes(1).await;

    let mut plain = within(NodeClient::connect(app.node_addr))
        .await
        .expect("TCP connect");
    let answer = within(plain.register(Registration::with_token("token-b"))).await;
    assert!(answer.is_err(), "a plaintext node got {answer:?}");
    wait_for_closed(&app, CloseReason::TlsHandshake, 1).await;
    assert_eq!(app.parts.registry.len(), 1);

    // The TLS node is still connected and heard, and another TLS node can join.
    within(tls_node.heartbeat(0)).await.expect("heartbeat");
    let (_other, outcome) = try_register(&app, pki.client(None), "token-b")
        .await
        .expect("second TLS node registers");
    assert!(outcome.accepted);
    app.wait_for_nodes(2).await;
    app.stop().await;
}

#[crate::common::test]
async fn a_peer_that_never_starts_the_handshake_is_closed_after_the_timeout() {
    let pki = Pki::new();
    let config = format!(
        "{TWO_NODES}\n[server]\nregister_timeout_ms = 60000\n{}",
        pki.section("server", "handshake_timeout_ms = 200")
    );
    let app = spawn_app(&config).await;

    let mut silent = TcpStream::connect(app.node_addr).await.expect("connect");
    let mut buf = [0_u8; 64];
    match within(silent.read(&mut buf)).await {
        Ok(0) | Err(_) => {}
        Ok(n) => panic!("expected the edge to close, got {n} bytes"),
    }
    wait_for_closed(&app, CloseReason::TlsHandshake, 1).await;
    assert_eq!(
        app.parts
            .transport
            .stats()
            .closed(CloseReason::RegisterTimeout),
        0
    );

    // The listener still serves TLS nodes.
    let (_node, outcome) = try_register(&app, pki.client(None), "token-a")
        .await
        .expect("registers");
    assert!(outcome.accepted);
    app.stop().await;
}

// ---------------------------------------------------------------------------------------
// Mutual TLS
// ---------------------------------------------------------------------------------------

async fn mutual_tls_app(pki: &Pki) -> TestApp {
    spawn_app(&format!(
        "{TWO_NODES}{}",
        pki.section("server", &pki.client_ca())
    ))
    .await
}

/// Checks that node-a presenting `identity` (see [`Pki::client`]; `None` for no
/// certificate) cannot register: the handshake is closed and no node is registered.
async fn assert_refused_by_mtls(app: &TestApp, pki: &Pki, identity: Option<&str>) {
    let attempt = try_register(app, pki.client(identity), "token-a").await;
    assert!(
        attempt.is_err(),
        "registered presenting certificate {identity:?}: {:?}",
        attempt.map(|(_, outcome)| outcome)
    );
    wait_for_closed(app, CloseReason::TlsHandshake, 1).await;
    assert_eq!(app.parts.registry.len(), 0);
}

#[crate::common::test]
async fn mtls_accepts_a_node_whose_certificate_the_ca_signed() {
    let pki = Pki::new();
    let app = mutual_tls_app(&pki).await;
    let (_node, outcome) = try_register(&app, pki.client(Some("client")), "token-a")
        .await
        .expect("registers with a client certificate");
    assert!(outcome.accepted);
    assert_eq!(outcome.node_id, "node-a");
    app.wait_for_nodes(1).await;
    app.stop().await;
}

#[crate::common::test]
async fn mtls_refuses_a_node_without_a_certificate() {
    let pki = Pki::new();
    let app = mutual_tls_app(&pki).await;
    assert_refused_by_mtls(&app, &pki, None).await;
    assert_eq!(
        app.parts
            .transport
            .stats()
            .registrations_accepted
            .load(std::sync::atomic::Ordering::Relaxed),
        0
    );
    app.stop().await;
}

#[crate::common::test]
async fn mtls_refuses_a_node_whose_certificate_another_ca_signed() {
    let pki = Pki::new();
    let app = mutual_tls_app(&pki).await;
    assert_refused_by_mtls(&app, &pki, Some("stranger")).await;

    // The right certificate still gets in.
    let (_node, outcome) = try_register(&app, pki.client(Some("client")), "token-a")
        .await
        .expect("registers");
    assert!(outcome.accepted);
    app.stop().await;
}

// ---------------------------------------------------------------------------------------
// Bad TLS files at startup
// ---------------------------------------------------------------------------------------

#[crate::common::test]
async fn a_missing_certificate_file_stops_startup_naming_the_file_and_key() {
    let pki = Pki::new();
    let missing = pki.path("no-such-cert.pem");
    let config = tls_table("server", &missing, &pki.path("server.key"), "");
    let message = build_error(&config).await;
    assert!(message.contains("server.tls.cert_path"), "{message}");
    assert!(
        message.contains(&missing.display().to_string()),
        "{message}"
    );
}

#[crate::common::test]
async fn garbage_pem_stops_startup_naming_the_file_and_key() {
    let pki = Pki::new();
    let garbage_path = pki.path("garbage.pem");
    std::fs::write(&garbage_path, "this is not PEM at all\n").expect("write");
    let garbage = garbage_path.display().to_string();

    let config = tls_table("server", &pki.path("server.pem"), &garbage_path, "");
    let message = build_error(&config).await;
    assert!(message.contains("server.tls.key_path"), "{message}");
    assert!(message.contains(&garbage), "{message}");

    let config = pki.section("server", &format!("client_ca_path = {garbage:?}"));
    let message = build_error(&config).await;
    assert!(message.contains("server.tls.client_ca_path"), "{message}");
    assert!(message.contains(&garbage), "{message}");

    let config = tls_table("http", &garbage_path, &pki.path("server.key"), "");
    let message = build_error(&config).await;
    assert!(message.contains("http.tls.cert_path"), "{message}");
    assert!(message.contains(&garbage), "{message}");
}

#[crate::common::test]
async fn a_key_that_does_not_match_the_certificate_stops_startup() {
    let pki = Pki::new();
    let config = tls_table(
        "server",
        &pki.path("server.pem"),
        &pki.path("client.key"),
        "",
    );
    let message = build_error(&config).await;
    assert!(message.contains("server.tls.cert_path"), "{message}");
    assert!(message.contains("server.tls.key_path"), "{message}");
}

// ---------------------------------------------------------------------------------------
// HTTPS
// ---------------------------------------------------------------------------------------

/// `GET <path>` over HTTPS with a raw HTTP/1.1 request; the whole response.
async fn https_get(addr: SocketAddr, config: Arc<rustls::ClientConfig>, path: &str) -> String {
    let stream = TcpStream::connect(addr).await.expect("connect");
    let mut stream = tokio_rustls::TlsConnector::from(config)
        .connect(localhost(), stream)
        .await
        .expect("HTTPS handshake");
    let request = format!("GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).await.expect("write");
    let mut response = Vec::new();
    // A peer may end the session without close_notify; what was read still counts.
    let _ = stream.read_to_end(&mut response).await;
    String::from_utf8_lossy(&response).into_owned()
}

#[crate::common::test]
async fn healthz_answers_over_https_even_while_a_peer_stalls_its_handshake() {
    let pki = Pki::new();
    let app = spawn_app(&format!("{TWO_NODES}{}", pki.section("http", ""))).await;

    // A peer that connects and never handshakes must not hold up anyone else.
    let _stalled = TcpStream::connect(app.http_addr).await.expect("connect");

    let response = within(https_get(app.http_addr, pki.client(None), "/healthz")).await;
    assert!(response.starts_with("HTTP/1.1 200"), "{response}");

    // Plain HTTP on the HTTPS port gets no HTTP answer.
    let mut plain = TcpStream::connect(app.http_addr).await.expect("connect");
    plain
        .write_all(b"GET /healthz HTTP/1.1\r\nHost: localhost\r\n\r\n")
        .await
        .expect("write");
    let mut answer = Vec::new();
    let _ = within(plain.read_to_end(&mut answer)).await;
    assert!(!answer.starts_with(b"HTTP/1.1"), "{answer:?}");
    app.stop().await;
}
