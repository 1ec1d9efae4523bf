//! Issue 48 end to end on real engines: two `llama-server`s in router mode (no model at
//! start, `alpha`, `beta` and `gamma` — copies of the tiny model — in a `--models-dir`,
//! `--models-max 2`, `--no-models-autoload`), each behind a reference node (`edge-node`, in
//! process) with `lifecycle = "llama-router"`, and a real edge. Every check reads each
//! engine's own `GET /models`.

use crate::admin_support::{ADMIN_KEY, admin};
use crate::common;
use crate::node_support;

use std::collections::BTreeMap;

use bytes::Bytes;
use common::engines::{LlamaOptions, LlamaServer, TINY_REPLY};
use common::runs::{next_event, rest};
use common::{TestApp, eventually_ok, spawn_app};
use edge::domain::models::ModelName;
use edge::domain::{AdapterName, NodeSelector, Operation, RunEventKind, RunSpec, Target};
use edge::ports::ManageModels as _;
use node_support::{RunningNode, router_node_entry, spawn_nodes};
use reqwest::{Method, StatusCode};
use serde_json::{Value, json};

const MODELS: [&str; 3] = ["alpha", "beta", "gamma"];

/// The edge, its two engines (`node-a`'s and `node-b`'s) and their nodes.
struct Pool {
    app: TestApp,
    engines: Vec<LlamaServer>,
    _nodes: Vec<RunningNode>,
}

/// Two router engines behind two reference nodes, and an edge with `models` (its
/// `[[models]]` entries) reconciling every 100 ms.
async fn pool(models: &str) -> Pool {
    let mut engines = Vec::new();
    for _ in 0..2 {
        let options = LlamaOptions::default()
            .router(&MODELS, 2)
            .parallel(2)
            .context(8_192);
        engines.push(LlamaServer::start_with(options).await);
    }
    let mut config = format!(
        "[admin]\nkeys = [\"{ADMIN_KEY}\"]\n[lifecycle]\nreconcile_interval_ms = 100\n{models}\n"
    );
    for (id, engine) in ["node-a", "node-b"].iter().zip(&engines) {
        config.push_str(&router_node_entry(id, &MODELS, &engine.v1_url(), ""));
    }
    let app = spawn_app(&config).await;
    let nodes = spawn_nodes(&app, &["node-a", "node-b"]).await;
    Pool {
        app,
        engines,
        _nodes: nodes,
    }
}

impl Pool {
    /// Which of the models each engine says it has loaded, node-a's first.
    async fn loaded(&self) -> [Vec<&'static str>; 2] {
        [
            self.engines[0].router_loaded(&MODELS).await,
            self.engines[1].router_loaded(&MODELS).await,
        ]
    }

    /// Waits until the engines hold exactly `want` (node-a's, node-b's).
    async fn until_loaded(&self, want: [&[&str]; 2]) {
        eventually_ok(&format!("the engines hold {want:?}"), || async {
            let loaded = self.loaded().await;
            if loaded[0] == want[0] && loaded[1] == want[1] {
                Ok(())
            } else {
                Err(format!("they hold {loaded:?}"))
            }
        })
        .await;
    }

    /// A whole chat answer through the OpenAI API.
    async fn chat(&self, model: &str) -> Value {
        let body = json!({"model": model, "max_tokens": 8,
            "messages": [{"role": "user", "content": "Say hi"}]});
        let url = format!("http://{}/v1/chat/completions", self.app.http_addr);
        let response = common::http_client()
            .post(url)
            .json(&body)
            .send()
            .await
            .expect("an answer");
        assert_eq!(response.status(), 200, "{model}");
        response.json().await.expect("JSON")
    }
}

fn model(name: &str) -> ModelName {
    ModelName::parse(&format!("llama/{name}")).unwrap()
}

#[crate::common::test]
async fn the_desired_state_a_cold_request_and_idle_unloads_on_two_router_engines() {
    let models = r#"
[[models]]
model = "llama/alpha"
min_loaded = 2
[[models]]
model = "llama/beta"
pin = ["node-a"]
[[models]]
model = "llama/gamma"
idle_unload_ms = 1000
"#;
    let pool = pool(models).await;
    // With no request: alpha on both (min_loaded), beta on node-a (pinned).
    pool.until_loaded([&["alpha", "beta"], &["alpha"]]).await;

    // gamma is loaded nowhere and listed.
    let url = format!("http://{}/v1/models", pool.app.http_addr);
    let listed: Value = common::http_client()
        .get(url)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert!(
        listed["data"].to_string().contains("llama/gamma"),
        "{listed}"
    );

    // A request for it loads it on exactly one engine: node-b's, since node-a is full of a
    // model held by min_loaded and a pinned one, neither of which makes room.
    let answer = pool.chat("llama/gamma").await;
    let content = answer["choices"][0]["message"]["content"]
        .as_str()
        .unwrap_or_default();
    assert!(
        TINY_REPLY.starts_with(content) && !content.is_empty(),
        "{answer}"
    );
    assert_eq!(
        pool.loaded().await,
        [vec!["alpha", "beta"], vec!["alpha", "gamma"]]
    );

    // Unused for its idle_unload_ms, gamma leaves node-b's engine; the rest stays.
    pool.until_loaded([&["alpha", "beta"], &["alpha"]]).await;

    // The management API's feed says why each model was loaded and unloaded.
    eventually_ok("every reason's command is done on the feed", || async {
        let (_, feed) = admin(&pool.app, Method::GET, "/admin/v1/models/events", None).await;
        let feed = feed.as_str().unwrap_or_default().to_owned();
        let done = |reason: &str| {
            feed.lines().any(|l| {
                l.contains(&format!("\"reason\":\"{reason}\""))
                    && l.contains("\"outcome\":\"done\"")
            })
        };
        match ["min_loaded", "pin", "demand", "idle"]
            .iter()
            .find(|r| !done(r))
        {
            None => Ok(()),
            Some(missing) => Err(format!("no {missing} done in:\n{feed}")),
        }
    })
    .await;
    pool.app.stop().await;
}

/// A long chat run of `target` pinned to node-a, through the run service.
fn long_run_on_node_a(target: &str) -> RunSpec {
    let body = json!({"messages": [{"role": "user", "content": "Tell me a long story."}],
        "max_tokens": 1500, "ignore_eos": true});
    RunSpec {
        selector: NodeSelector {
            adapter: AdapterName::parse("llama").unwrap(),
            target: Target::parse(target).unwrap(),
            pin: Some("node-a".to_owned()),
        },
        input: Bytes::from(body.to_string()),
        content_type: "application/json".into(),
        params: BTreeMap::new(),
        deadline: None,
        operation: Operation::Chat,
        routing: Default::default(),
    }
}

#[crate::common::test]
async fn models_with_streams_in_flight_never_make_room_and_operators_load_and_unload() {
    let pool = pool("").await;
    let models = &pool.app.parts.models;
    common::eventually("both nodes reported their engines' catalogues", || {
        let views = models.models();
        views.len() == MODELS.len()
            && views
                .iter()
                .all(|v| v.nodes.len() == 2 && v.nodes.iter().all(|n| n.managed))
    })
    .await;
    // Both engines full, through the operators' port: alpha then beta on each.
    for node in ["node-a", "node-b"] {
        for name in ["alpha", "beta"] {
            models.load(&model(name), node).await.expect("loaded");
        }
    }
    pool.until_loaded([&["alpha", "beta"], &["alpha", "beta"]])
        .await;

    // Two long streams on node-a: both its models are in use.
    let mut streams = Vec::new();
    for name in ["alpha", "beta"] {
        let mut handle = pool
            .app
            .parts
            .runs
            .start(long_run_on_node_a(name))
            .expect("accepted");
        while !matches!(
            next_event(&mut handle).await.kind,
            RunEventKind::Output { .. }
        ) {}
        // Read on, as a client would: a caller that stops reading is cut off.
        streams.push(tokio::spawn(async move { rest(&mut handle).await }));
    }
    // A cold request: node-a has nothing that may make room; node-b's least recently used
    // idle model (alpha, loaded first) does.
    pool.chat("llama/gamma").await;
    assert_eq!(
        pool.loaded().await,
        [vec!["alpha", "beta"], vec!["beta", "gamma"]]
    );
    for stream in streams {
        let events = common::bounded("a long stream", stream)
            .await
            .expect("read");
        assert_eq!(events.last().unwrap().kind.name(), "completed");
    }

    // An operator unloads beta from node-b through the management API, which lists each
    // model by node and state.
    let unload = json!({"model": "llama/beta", "node": "node-b"});
    let (status, body) = admin(
        &pool.app,
        Method::POST,
        "/admin/v1/models/unload",
        Some(unload),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    pool.until_loaded([&["alpha", "beta"], &["gamma"]]).await;
    let (_, list) = admin(&pool.app, Method::GET, "/admin/v1/models", None).await;
    let state = |model: &str, node: &str| {
        let views = list["models"].as_array()?;
        let view = views.iter().find(|m| m["model"] == model)?;
        let on = view["nodes"]
            .as_array()?
            .iter()
            .find(|n| n["node"] == node)?;
        Some(format!(
            "{} {}",
            on["state"].as_str()?,
            on["reason"].as_str()?
        ))
    };
    assert_eq!(
        state("llama/gamma", "node-b").as_deref(),
        Some("loaded demand"),
        "{list}"
    );
    assert_eq!(
        state("llama/beta", "node-b").as_deref(),
        Some("unloaded operator"),
        "{list}"
    );
    assert_eq!(
        state("llama/alpha", "node-b").as_deref(),
        Some("unloaded make_room"),
        "{list}"
    );
    pool.app.assert_settled().await;
    pool.app.stop().await;
}
