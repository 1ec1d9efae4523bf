//! Members of one site (`[cluster]`) against a real `nats-server` with JetStream: exactly
//! one is ready, the other refuses API calls and management changes naming the active
//! member; a clean stop hands the lease over at once, a killed active member's lease is
//! taken over once it lapses, and a member with other node definitions never takes over
//! and says why. Leases are short (300 ms) and every wait is on a condition.

use std::net::SocketAddr;

use async_nats::jetstream;
use edge::ports::Role;
use reqwest::StatusCode;
use serde_json::Value;

use crate::admin_crash::{Edge, start_edge, text};
use crate::common::engines::NatsServer;
use crate::common::{NodeTable, TestApp, eventually, eventually_ok, http_client, spawn_app};
use crate::site_support::{self, ready, signal};

const ADMIN_KEY: &str = "adm-cluster-key";

/// A member `id` of site `s1` on `nats`, its one node definition serving `echo/<target>`.
fn member(nats: &NatsServer, id: &str, target: &str) -> String {
    let node = NodeTable::new("node-a", "gpu-a", "token-a").echo(&[target]);
    format!(
        "[edge]\nid = {id:?}\n[events]\nsinks = [\"null\"]\n[admin]\nkeys = [{ADMIN_KEY:?}]\n{}{node}",
        crate::site_support::cluster_section(nats)
    )
}

/// `GET /readyz`, which must answer: its status and body.
async fn readyz(http: SocketAddr) -> (StatusCode, String) {
    site_support::readyz(http).await.expect("/readyz answers")
}

/// Waits until `app` stands by behind edge `active`; the reason it gives.
pub(crate) async fn standing_by_behind(app: &TestApp, active: &str) -> String {
    let site = app.parts.site.clone();
    eventually(&format!("the member stands by behind {active}"), || {
        matches!(site.current(), Role::Standby { active: Some(member), .. } if member.edge_id == active)
    })
    .await;
    match app.parts.site.current() {
        Role::Standby { reason, .. } => reason,
        other => panic!("not standing by: {other:?}"),
    }
}

/// The site's lease as stored: the holder's id and the key's revision (`None`: absent).
async fn stored_lease(nats: &NatsServer) -> Option<(String, u64)> {
    let client = async_nats::connect(nats.url()).await.expect("connect");
    let kv = jetstream::new(client)
        .get_key_value("edge-s1")
        .await
        .expect("the site's bucket");
    let entry = kv.entry("lease").await.expect("read the lease")?;
    let lease: Value = serde_json::from_slice(&entry.value).ok()?;
    Some((lease["edge_id"].as_str()?.to_owned(), entry.revision))
}

#[crate::common::test]
async fn one_member_is_ready_the_other_refuses_naming_it_and_a_clean_stop_hands_over() {
    let nats = NatsServer::start_jetstream().await;
    let a = spawn_app(&member(&nats, "edge-a", "m1")).await;
    let body = ready(a.http_addr).await;
    assert!(body.starts_with("ready: the active member"), "{body}");
    let first_epoch = a.parts.site.epoch();
    assert!(first_epoch > 0);

    let b = spawn_app(&member(&nats, "edge-b", "m1")).await;
    standing_by_behind(&b, "edge-a").await;
    let (status, body) = readyz(b.http_addr).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    assert!(body.starts_with("standby: edge edge-a holds"), "{body}");
    assert!(body.contains(&format!("api {}", a.http_addr)), "{body}");
    assert_eq!(
        readyz(a.http_addr).await.0,
        StatusCode::OK,
        "still one ready"
    );

    // The standby refuses the APIs in their own shapes, naming the active member.
    let http = http_client();
    let chat = http
        .post(format!("http://{}/v1/chat/completions", b.http_addr))
        .json(&serde_json::json!({"model": "echo/m1", "messages": [{"role": "user", "content": "hi"}]}))
        .send()
        .await
        .expect("an answer");
    assert_eq!(chat.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert!(chat.headers().contains_key("retry-after"));
    // And closes the connection, so a balancer choosing per connection sends the retry to
    // the member that acts (the nemesis, issue 66).
    assert_eq!(chat.headers()["connection"], "close");
    let error: Value = chat.json().await.expect("a JSON error");
    assert_eq!(error["error"]["code"], "standby", "{error}");
    let message = error["error"]["message"].as_str().unwrap_or_default();
    assert!(message.contains(&a.http_addr.to_string()), "{message}");
    let messages = http
        .post(format!("http://{}/v1/messages", b.http_addr))
        .json(&serde_json::json!({"model": "echo/m1", "max_tokens": 5, "messages": []}))
        .send()
        .await
        .expect("an answer");
    assert_eq!(messages.status(), StatusCode::SERVICE_UNAVAILABLE);
    let error: Value = messages.json().await.expect("a JSON error");
    assert_eq!(error["type"], "error", "Anthropic's shape: {error}");

    // Health and metrics keep answering; management reads answer, changes are refused.
    let health = http.get(format!("http://{}/healthz", b.http_addr)).send();
    assert_eq!(health.await.expect("healthz").status(), StatusCode::OK);
    let metrics = text(b.http_addr, "/metrics").await;
    assert!(
        metrics.contains("edge_cluster_role{role=\"standby\"} 1"),
        "{metrics}"
    );
    let admin = |method: reqwest::Method, path: &str| {
        http.request(method, format!("http://{}{path}", b.admin_addr))
            .bearer_auth(ADMIN_KEY)
            .send()
    };
    let list = admin(reqwest::Method::GET, "/admin/v1/nodes").await;
    assert_eq!(list.expect("nodes").status(), StatusCode::OK);
    let drain = admin(reqwest::Method::POST, "/admin/v1/nodes/node-a/drain")
        .await
        .expect("drain");
    assert_eq!(drain.status(), StatusCode::SERVICE_UNAVAILABLE);
    let error: Value = drain.json().await.expect("a JSON error");
    assert_eq!(error["error"]["code"], "standby", "{error}");
    // A run the standby's copy of the journal does not hold may be in the site's stream and
    // not yet here: 503 naming the active member, not 404 (which the active one answers).
    let unknown = admin(reqwest::Method::GET, "/admin/v1/runs/run-nobody-knows")
        .await
        .expect("a run lookup");
    assert_eq!(unknown.status(), StatusCode::SERVICE_UNAVAILABLE);
    let error: Value = unknown.json().await.expect("a JSON error");
    assert_eq!(error["error"]["code"], "standby", "{error}");
    assert!(
        error["error"]["message"]
            .as_str()
            .is_some_and(|message| message.contains("edge edge-a")),
        "{error}"
    );
    let on_active = http
        .get(format!(
            "http://{}/admin/v1/runs/run-nobody-knows",
            a.admin_addr
        ))
        .bearer_auth(ADMIN_KEY)
        .send()
        .await
        .expect("a run lookup");
    assert_eq!(on_active.status(), StatusCode::NOT_FOUND);

    // A clean stop releases the lease: the standby takes it without waiting for a lapse.
    a.stop().await;
    let body = ready(b.http_addr).await;
    assert!(body.starts_with("ready: the active member"), "{body}");
    assert!(b.parts.site.epoch() > first_epoch);
    assert_eq!(
        stored_lease(&nats)
            .await
            .map(|(holder, _)| holder)
            .as_deref(),
        Some("edge-b")
    );
    b.stop().await;
}

/// A site of two: `edge-a`, a real `edge serve` process, active; `edge-b`, in process,
/// standing by behind it. The config's directory lives as long as the returned value.
async fn active_process_and_standby(nats: &NatsServer) -> (tempfile::TempDir, Edge, TestApp) {
    let dir = tempfile::tempdir().expect("tempdir");
    let config = crate::common::write_config(dir.path(), &member(nats, "edge-a", "m1"));
    let a = start_edge(&config).await;
    ready(a.http).await;
    let b = spawn_app(&member(nats, "edge-b", "m1")).await;
    standing_by_behind(&b, "edge-a").await;
    (dir, a, b)
}

#[crate::common::test]
async fn a_killed_active_member_is_taken_over_once_its_lease_lapses() {
    let nats = NatsServer::start_jetstream().await;
    let (_dir, mut a, b) = active_process_and_standby(&nats).await;

    a.child.kill().await.expect("SIGKILL the active member");
    let (holder, revision) = stored_lease(&nats).await.expect("a lease left behind");
    assert_eq!(holder, "edge-a", "a killed member releases nothing");

    let body = ready(b.http_addr).await;
    assert!(
        body.contains(&format!("epoch {}", b.parts.site.epoch())),
        "{body}"
    );
    let (holder, taken_at) = stored_lease(&nats).await.expect("the new lease");
    assert_eq!(holder, "edge-b");
    assert!(taken_at > revision);
    assert!(
        b.parts.site.epoch() > revision,
        "taken over by compare-and-set"
    );
    b.stop().await;
}

#[crate::common::test]
async fn a_paused_active_member_wakes_up_standing_by_and_admits_nothing() {
    let nats = NatsServer::start_jetstream().await;
    let (_dir, a, b) = active_process_and_standby(&nats).await;

    // Paused past its lease, the active member is taken over; woken, its first answers
    // already refuse — before its lease task has run — and it never takes the lease back.
    let pid = a.child.id().expect("the active member's pid");
    signal(pid, "-STOP");
    ready(b.http_addr).await;
    signal(pid, "-CONT");
    let (status, body) = readyz(a.http).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{body}");
    let chat = http_client()
        .post(format!("http://{}/v1/chat/completions", a.http))
        .json(&serde_json::json!({"model": "echo/m1", "messages": [{"role": "user", "content": "hi"}]}))
        .send()
        .await
        .expect("an answer");
    assert_eq!(chat.status(), StatusCode::SERVICE_UNAVAILABLE);
    let http = a.http;
    eventually_ok(
        "the woken member names the new active member",
        || async move {
            match readyz(http).await {
                (StatusCode::SERVICE_UNAVAILABLE, body) if body.contains("edge-b") => Ok(()),
                (status, body) => Err(format!("{status}: {body}")),
            }
        },
    )
    .await;
    assert_eq!(
        stored_lease(&nats)
            .await
            .map(|(holder, _)| holder)
            .as_deref(),
        Some("edge-b"),
        "the lease stays with the member that took it over"
    );
    assert_eq!(readyz(b.http_addr).await.0, StatusCode::OK);
    b.stop().await;
}

#[crate::common::test]
async fn a_member_with_other_node_definitions_never_takes_over_and_says_so() {
    let nats = NatsServer::start_jetstream().await;
    let dir = tempfile::tempdir().expect("tempdir");
    let config = crate::common::write_config(dir.path(), &member(&nats, "edge-a", "m1"));
    let mut a = start_edge(&config).await;
    ready(a.http).await;

    let other = spawn_app(&member(&nats, "edge-other", "m2")).await;
    let reason = standing_by_behind(&other, "edge-a").await;
    assert!(reason.contains("node definitions differ"), "{reason}");
    let (status, body) = readyz(other.http_addr).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    assert!(body.contains("node definitions differ"), "{body}");
    assert!(body.contains("sha256:"), "both digests shown: {body}");

    // The active member dies; a member with the same definitions takes the lapsed lease,
    // and the other one, which watched the same lease lapse, still stands by.
    a.child.kill().await.expect("SIGKILL the active member");
    let same = spawn_app(&member(&nats, "edge-c", "m1")).await;
    ready(same.http_addr).await;
    assert_eq!(
        stored_lease(&nats)
            .await
            .map(|(holder, _)| holder)
            .as_deref(),
        Some("edge-c")
    );
    let reason = standing_by_behind(&other, "edge-c").await;
    assert!(reason.contains("node definitions differ"), "{reason}");
    assert_eq!(
        readyz(other.http_addr).await.0,
        StatusCode::SERVICE_UNAVAILABLE
    );
    other.stop().await;
    same.stop().await;
}

/// A member whose config asks for more replicas than the site's bucket and journal stream
/// were made with says so at start, naming each and how to raise it (docs/operations.md,
/// "Durability"; issue 66), and acts all the same.
#[crate::common::test]
async fn a_member_asking_more_replicas_than_the_sites_streams_hold_warns_at_start() {
    let nats = NatsServer::start_jetstream().await;
    // The streams made by a member of one replica; it stops cleanly, releasing the lease.
    let first = spawn_app(&member(&nats, "edge-a", "m1")).await;
    ready(first.http_addr).await;
    first.stop().await;

    let dir = tempfile::tempdir().expect("tempdir");
    let config = member(&nats, "edge-b", "m1").replace("[cluster]\n", "[cluster]\nreplicas = 3\n");
    let b = start_edge(&crate::common::write_config(dir.path(), &config)).await;
    ready(b.http).await;
    eventually(
        "a warning for the bucket and one for the journal stream",
        || {
            let logs = b.logs();
            ["KV_edge-s1", "edge-s1-journal"].iter().all(|stream| {
                logs.iter().any(|line| {
                    line.contains(&format!(
                        "the site's stream {stream} holds 1 replica(s), fewer than"
                    )) && line.contains(&format!("nats stream edit {stream} --replicas 3"))
                })
            })
        },
    )
    .await;
}

#[crate::common::test]
async fn without_a_cluster_section_the_edge_is_the_whole_site() {
    let app = spawn_app("").await;
    assert_eq!(app.parts.site.current(), Role::Single);
    assert_eq!(
        readyz(app.http_addr).await,
        (StatusCode::OK, "ready\n".to_owned())
    );
    app.stop().await;
}

#[crate::common::test]
async fn an_active_member_that_cannot_reach_nats_stands_by_and_takes_the_lease_back_later() {
    let mut nats = NatsServer::start_jetstream().await;
    let a = spawn_app(&member(&nats, "edge-a", "m1")).await;
    ready(a.http_addr).await;
    let epoch = a.parts.site.epoch();

    nats.stop().await;
    let site = a.parts.site.clone();
    eventually("the member stands by once it cannot renew", || !site.acts()).await;
    let (status, body) = readyz(a.http_addr).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    assert!(body.starts_with("standby:"), "{body}");

    // NATS back: its own lapsed lease is taken over again, under a new epoch.
    nats.restart().await;
    ready(a.http_addr).await;
    assert!(a.parts.site.epoch() > epoch);
    a.stop().await;
}

#[crate::common::test]
async fn an_active_member_whose_renewal_meets_another_write_stands_by_behind_the_writer() {
    let nats = NatsServer::start_jetstream().await;
    let a = spawn_app(&member(&nats, "edge-a", "m1")).await;
    ready(a.http_addr).await;

    // Another writer takes the key between two renewals (as a member that took over a
    // lease it thought lapsed would): the next renewal finds another revision.
    let client = async_nats::connect(nats.url()).await.expect("connect");
    let kv = jetstream::new(client)
        .get_key_value("edge-s1")
        .await
        .expect("the site's bucket");
    let far = u64::MAX / 2;
    let lease = serde_json::json!({
        "edge_id": "edge-z", "node_address": "10.9.9.9:7100", "api_address": "10.9.9.9:8080",
        "expires_at_ms": far, "node_definitions_digest": "sha256:whatever",
    });
    kv.put("lease", lease.to_string().into())
        .await
        .expect("write the lease");

    standing_by_behind(&a, "edge-z").await;
    let (status, body) = readyz(a.http_addr).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    assert!(
        body.contains("active member: edge edge-z (api 10.9.9.9:8080"),
        "{body}"
    );
    let metrics = text(a.http_addr, "/metrics").await;
    let failures = metrics
        .lines()
        .find_map(|line| line.strip_prefix("edge_cluster_lease_renewal_failures_total "))
        .and_then(|value| value.trim().parse::<f64>().ok());
    assert!(failures.is_some_and(|n| n >= 1.0), "{metrics}");
    a.stop().await;
}
