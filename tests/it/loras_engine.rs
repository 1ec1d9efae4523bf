//! Issue 64 on real engines: LoRAs as models. `llama-server`s serving the tiny model with
//! tiny LoRAs the tests make with gguf-py (`tests/python/make_tiny_lora.py`: rank 1 on
//! `output.weight`, so greedy output starts elsewhere in the tiny model's sentence), each
//! behind a reference node (in process), and a real edge. Every answer through the edge is
//! compared with what the engine itself answers when asked directly with the same LoRA
//! scales.

use crate::admin_support::{ADMIN_KEY, get_ok};
use crate::common;
use crate::node_support;

use std::path::{Path, PathBuf};

use common::engines::{LlamaOptions, LlamaServer, tiny_lora};
use common::{TestApp, eventually, eventually_ok, spawn_app};
use node_support::{RunningNode, api_post, spawn_node};
use serde_json::{Value, json};

/// The `sql` LoRA: 75 on the reply's second token, 45 on its third: " from the tiny test
/// model." instead of " Hello from the tiny test model.".
const SQL: [(usize, u32); 2] = [(1, 75), (2, 45)];
/// The `support` LoRA: 75 on the fourth, 45 on the third: " tiny test model.". Both at once
/// add up to 90 on the third: " the tiny test model.".
const SUPPORT: [(usize, u32); 2] = [(3, 75), (2, 45)];

/// A copy of the tiny LoRA of `boosts` as `<dir>/<name>.gguf` (llama-server names a LoRA
/// by its file's stem).
fn lora_file(dir: &Path, name: &str, boosts: &[(usize, u32)]) -> PathBuf {
    let file = dir.join(format!("{name}.gguf"));
    std::fs::copy(tiny_lora(boosts), &file).expect("copy the LoRA");
    file
}

/// A llama-server with the tiny model and `loras` (each `(name, boosts)`), in that order.
async fn engine(dir: &Path, loras: &[(&str, &[(usize, u32)])]) -> LlamaServer {
    let options = loras
        .iter()
        .fold(LlamaOptions::default(), |options, (name, boosts)| {
            options.lora(lora_file(dir, name, boosts))
        });
    LlamaServer::start_with(options).await
}

/// One `[[nodes]]` entry whose `llama` adapter serves `tiny` from `engine`, probed every
/// 100 ms.
fn node_entry(id: &str, engine: &LlamaServer) -> String {
    let settings = [
        ("base_url", engine.v1_url()),
        ("availability", "reachable".to_owned()),
        ("probe_interval_ms", "100".to_owned()),
        ("probe_down_interval_ms", "100".to_owned()),
    ];
    node_support::node_entry(id, "llama", &["tiny"], &settings)
}

/// An edge for `engines` (node-a's, node-b's, …), keyless routing (so runs of the base
/// take turns between the nodes), no node yet.
async fn edge(engines: &[&LlamaServer], extra: &str) -> TestApp {
    let mut config =
        format!("[admin]\nkeys = [\"{ADMIN_KEY}\"]\n[routing]\nprefix_affinity = false\n{extra}\n");
    for (id, engine) in ["node-a", "node-b"].iter().zip(engines) {
        config.push_str(&node_entry(id, engine));
    }
    spawn_app(&config).await
}

fn node(app: &TestApp, id: &str) -> RunningNode {
    spawn_node(app.node_addr, &format!("token-{id}"), |_| {})
}

fn chat_body(model: &str) -> Value {
    json!({"model": model, "temperature": 0,
        "messages": [{"role": "user", "content": "Write the query."}]})
}

/// The text of a chat answer through the edge for `model`, and its node.
async fn chat(app: &TestApp, model: &str) -> (String, String) {
    let (status, node, body) = api_post(app, "/v1/chat/completions", &chat_body(model)).await;
    assert_eq!(status, 200, "{model}: {body}");
    let text = body["choices"][0]["message"]["content"].as_str();
    (text.unwrap_or_default().to_owned(), node)
}

/// Four chats for `model`, each answered `text` by `node`.
async fn only_from(app: &TestApp, model: &str, text: &str, node: &str) {
    for _ in 0..4 {
        assert_eq!(
            chat(app, model).await,
            (text.to_owned(), node.to_owned()),
            "{model}"
        );
    }
}

/// Six chats for `model` in turn (keyless runs take turns between the nodes): each answered
/// `text`, by both nodes.
async fn from_both(app: &TestApp, model: &str, text: &str) {
    let mut nodes = std::collections::BTreeSet::new();
    for _ in 0..6 {
        let (answer, node) = chat(app, model).await;
        assert_eq!(answer, text, "{model} on {node}");
        nodes.insert(node);
    }
    assert_eq!(nodes.len(), 2, "both nodes answered {model}: {nodes:?}");
}

/// What `engine` answers the same chat when asked directly with `lora` as its `lora` field
/// (absent with `None`).
async fn direct(engine: &LlamaServer, lora: Option<Value>) -> String {
    let mut body = chat_body("tiny");
    if let Some(lora) = lora {
        body["lora"] = lora;
    }
    let answer = engine.ask("chat/completions", &body).await;
    let text = answer["choices"][0]["message"]["content"].as_str();
    text.unwrap_or_else(|| panic!("the engine answers: {answer}"))
        .to_owned()
}

fn scales(sql: f64, support: f64) -> Value {
    json!([{"id": 0, "scale": sql}, {"id": 1, "scale": support}])
}

/// The models `/v1/models` lists, by id.
async fn listed(app: &TestApp) -> Value {
    let url = format!("http://{}/v1/models", app.http_addr);
    let list: Value = common::http_client()
        .get(url)
        .send()
        .await
        .expect("the edge answers")
        .json()
        .await
        .expect("a model list");
    let by_id: serde_json::Map<String, Value> = list["data"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|m| (m["id"].as_str().unwrap_or_default().to_owned(), m.clone()))
        .collect();
    Value::Object(by_id)
}

/// Waits until `/v1/models` lists `ids` (and maybe more).
async fn until_listed(app: &TestApp, ids: &[&str]) -> Value {
    eventually_ok(&format!("/v1/models lists {ids:?}"), || async {
        let models = listed(app).await;
        match ids.iter().find(|id| models.get(**id).is_none()) {
            None => Ok(models),
            Some(missing) => Err(format!("no {missing} in {models}")),
        }
    })
    .await
}

#[crate::common::test]
async fn the_pinned_llama_server_applies_every_lora_to_a_request_that_names_none() {
    let dir = tempfile::tempdir().expect("tempdir");
    let engine = engine(dir.path(), &[("sql", &SQL), ("support", &SUPPORT)]).await;
    // `--lora-init-without-apply` still lists each LoRA at scale 1 ...
    let adapters = engine.get("/lora-adapters").await;
    let listed: Vec<(&str, f64)> = adapters
        .as_array()
        .expect("a list")
        .iter()
        .map(|l| {
            (
                l["path"].as_str().unwrap_or(""),
                l["scale"].as_f64().unwrap_or(0.0),
            )
        })
        .collect();
    assert_eq!(listed.len(), 2, "{adapters}");
    assert!(
        listed
            .iter()
            .all(|(path, scale)| path.ends_with(".gguf") && *scale == 1.0)
    );
    // ... and a request without `lora`, or with an empty list, gets both applied.
    let both = direct(&engine, Some(scales(1.0, 1.0))).await;
    assert_eq!(direct(&engine, None).await, both);
    assert_eq!(direct(&engine, Some(json!([]))).await, both);
    // Every LoRA at 0 is the model alone; each LoRA alone changes its greedy answer.
    let base = direct(&engine, Some(scales(0.0, 0.0))).await;
    let sql = direct(&engine, Some(scales(1.0, 0.0))).await;
    let support = direct(&engine, Some(scales(0.0, 1.0))).await;
    assert_eq!(base, common::engines::TINY_REPLY);
    assert_eq!(
        [sql.as_str(), support.as_str(), both.as_str()],
        [
            " from the tiny test model.",
            " tiny test model.",
            " the tiny test model."
        ]
    );
}

#[crate::common::test]
async fn two_loras_are_models_that_answer_as_the_engine_does_and_only_their_node_serves_them() {
    let dir = tempfile::tempdir().expect("tempdir");
    let with_loras = engine(dir.path(), &[("sql", &SQL), ("support", &SUPPORT)]).await;
    let without = LlamaServer::start().await;
    let app = edge(&[&with_loras, &without], "").await;
    let _nodes = [node(&app, "node-a"), node(&app, "node-b")];
    app.wait_for_nodes(2).await;

    // Each LoRA is a model, its base its parent.
    let models = until_listed(&app, &["llama/tiny", "llama/sql", "llama/support"]).await;
    assert_eq!(models["llama/sql"]["parent"], "llama/tiny", "{models}");
    assert_eq!(models["llama/support"]["parent"], "llama/tiny", "{models}");
    assert_eq!(models["llama/sql"]["owned_by"], "llama", "{models}");
    assert!(models["llama/tiny"].get("parent").is_none(), "{models}");
    let one = common::http_client()
        .get(format!("http://{}/v1/models/llama/sql", app.http_addr))
        .send()
        .await
        .expect("the edge answers");
    assert_eq!(one.status(), 200);
    let one: Value = one.json().await.expect("a model");
    assert_eq!(
        (&one["id"], &one["parent"]),
        (&json!("llama/sql"), &json!("llama/tiny"))
    );

    // What the engine answers asked directly: each LoRA at 1 and the other at 0, or both at 0.
    let sql = direct(&with_loras, Some(scales(1.0, 0.0))).await;
    let support = direct(&with_loras, Some(scales(0.0, 1.0))).await;
    let base = direct(&with_loras, Some(scales(0.0, 0.0))).await;
    assert!(sql != base && support != base && sql != support);

    // Through the edge, every LoRA request goes to node-a and answers as the engine does.
    only_from(&app, "llama/sql", &sql, "node-a").await;
    only_from(&app, "llama/support", &support, "node-a").await;
    // The base, on either node, is the model alone: node-a names both LoRAs at 0.
    from_both(&app, "llama/tiny", &base).await;

    // Completions, Messages and Responses name LoRAs the same way.
    let prompt = json!({"model": "llama/sql", "prompt": "SELECT", "temperature": 0});
    let (status, node, answer) = api_post(&app, "/v1/completions", &prompt).await;
    let mut asked = prompt.clone();
    asked["model"] = json!("tiny");
    asked["lora"] = scales(1.0, 0.0);
    let engine_says = with_loras.ask("completions", &asked).await;
    assert_eq!((status, node.as_str()), (200, "node-a"), "{answer}");
    assert_eq!(
        answer["choices"][0]["text"],
        engine_says["choices"][0]["text"]
    );
    let messages = json!({"model": "llama/sql", "max_tokens": 32,
        "messages": [{"role": "user", "content": "Write the query."}]});
    let (status, node, answer) = api_post(&app, "/v1/messages", &messages).await;
    assert_eq!((status, node.as_str()), (200, "node-a"), "{answer}");
    assert_eq!(answer["content"][0]["text"], json!(sql), "{answer}");
    let responses = json!({"model": "llama/support", "input": "Answer the customer."});
    let (status, node, answer) = api_post(&app, "/v1/responses", &responses).await;
    assert_eq!((status, node.as_str()), (200, "node-a"), "{answer}");
    let text = &answer["output"][0]["content"][0]["text"];
    assert_eq!(text, &json!(support), "{answer}");

    // A LoRA no node ever reported is unknown in each API's own shape.
    let unknown = [
        ("/v1/chat/completions", chat_body("llama/nope")),
        (
            "/v1/completions",
            json!({"model": "llama/nope", "prompt": "x"}),
        ),
        (
            "/v1/responses",
            json!({"model": "llama/nope", "input": "x"}),
        ),
    ];
    for (path, body) in unknown {
        let (status, _, answer) = api_post(&app, path, &body).await;
        assert_eq!(status, 404, "{path}: {answer}");
        assert_eq!(
            answer["error"]["code"], "model_not_found",
            "{path}: {answer}"
        );
    }
    let nope = json!({"model": "llama/nope", "max_tokens": 8,
        "messages": [{"role": "user", "content": "x"}]});
    let (status, _, answer) = api_post(&app, "/v1/messages", &nope).await;
    assert_eq!(status, 404, "{answer}");
    assert_eq!(
        (&answer["type"], &answer["error"]["type"]),
        (&json!("error"), &json!("not_found_error")),
        "{answer}"
    );

    // The management API shows each LoRA on its node, and usage counts by the LoRA's name.
    let loras = get_ok(&app, "/admin/v1/loras").await;
    let names: Vec<&str> = loras["loras"]
        .as_array()
        .expect("loras")
        .iter()
        .map(|l| l["model"].as_str().unwrap_or_default())
        .collect();
    assert_eq!(names, ["llama/sql", "llama/support"], "{loras}");
    let sql_view = &loras["loras"][0];
    assert_eq!(sql_view["parent"], "llama/tiny");
    assert_eq!(
        sql_view["sha256"].as_str().map(str::len),
        Some(64),
        "{loras}"
    );
    assert_eq!(
        sql_view["nodes"],
        json!([{"node": "node-a", "state": "loaded", "agrees": true}])
    );
    assert_eq!(loras["conflicts"], json!([]));
    eventually_ok("usage counts the runs by the LoRA's name", || async {
        let usage = get_ok(&app, "/admin/v1/usage?group_by=model").await;
        let runs = |model: &str| {
            usage["rows"]
                .as_array()
                .and_then(|rows| rows.iter().find(|r| r["model"] == model))
                .and_then(|r| r["runs"].as_u64())
        };
        match (runs("llama/sql"), runs("llama/support")) {
            (Some(6), Some(5)) => Ok(()),
            other => Err(format!("{other:?} in {usage}")),
        }
    })
    .await;
    app.stop().await;
}

#[crate::common::test]
async fn a_lora_whose_only_node_is_reconnecting_waits_then_is_served() {
    let dir = tempfile::tempdir().expect("tempdir");
    let with_loras = engine(dir.path(), &[("sql", &SQL)]).await;
    let app = edge(&[&with_loras], "[runs]\nno_node_timeout_ms = 30000\n").await;
    let first = node(&app, "node-a");
    app.wait_for_nodes(1).await;
    until_listed(&app, &["llama/sql"]).await;
    let sql = direct(&with_loras, Some(json!([{"id": 0, "scale": 1.0}]))).await;

    // The node goes away: its LoRA leaves the list, but stays known.
    first.stop().await.expect("the node stops");
    app.wait_until_left("node-a").await;
    assert!(listed(&app).await.get("llama/sql").is_none());
    let waiting = tokio::spawn({
        let app_http = app.http_addr;
        async move {
            let response = common::http_client()
                .post(format!("http://{app_http}/v1/chat/completions"))
                .json(&chat_body("llama/sql"))
                .send()
                .await
                .expect("the edge answers");
            let status = response.status().as_u16();
            (
                status,
                response.json::<Value>().await.unwrap_or(Value::Null),
            )
        }
    });
    let runs = app.parts.runs.clone();
    eventually("the LoRA's run waits for a node", || {
        runs.queued_runs() == 1
    })
    .await;
    // A LoRA never reported is still unknown meanwhile.
    let (status, _, _) = api_post(&app, "/v1/chat/completions", &chat_body("llama/nope")).await;
    assert_eq!(status, 404);

    // The node is back: the waiting run is served, with the LoRA.
    let _back = node(&app, "node-a");
    let (status, answer) = common::bounded("the waiting run's answer", waiting)
        .await
        .expect("the request task");
    assert_eq!(status, 200, "{answer}");
    assert_eq!(answer["choices"][0]["message"]["content"], json!(sql));
    app.stop().await;
}

#[crate::common::test]
async fn a_lora_with_other_weights_or_named_like_a_target_is_a_conflict_and_not_served() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (first, second) = (dir.path().join("a"), dir.path().join("b"));
    std::fs::create_dir_all(&first).expect("dir");
    std::fs::create_dir_all(&second).expect("dir");
    let engine_a = engine(&first, &[("sql", &SQL)]).await;
    // node-b's `sql` has other weights; its `tiny` is named like the target.
    let engine_b = engine(&second, &[("sql", &SUPPORT), ("tiny", &SQL)]).await;
    let app = edge(&[&engine_a, &engine_b], "").await;
    let _a = node(&app, "node-a");
    app.wait_for_nodes(1).await;
    until_listed(&app, &["llama/sql"]).await;
    let _b = node(&app, "node-b");
    app.wait_for_nodes(2).await;

    let conflicts = eventually_ok("node-b's two conflicts are shown", || async {
        let loras = get_ok(&app, "/admin/v1/loras").await;
        match loras["conflicts"].as_array().map(Vec::len) {
            Some(2) => Ok(loras),
            _ => Err(loras.to_string()),
        }
    })
    .await;
    let kinds: Vec<(&str, &str, &str)> = conflicts["conflicts"]
        .as_array()
        .expect("conflicts")
        .iter()
        .map(|c| {
            let field = |k: &str| c[k].as_str().unwrap_or_default();
            (field("model"), field("node"), field("kind"))
        })
        .collect();
    assert!(
        kinds.contains(&("llama/sql", "node-b", "other_weights")),
        "{conflicts}"
    );
    assert!(
        kinds.contains(&("llama/tiny", "node-b", "named_like_a_target")),
        "{conflicts}"
    );
    assert_eq!(
        conflicts["loras"][0]["nodes"],
        json!([{"node": "node-a", "state": "loaded", "agrees": true},
               {"node": "node-b", "state": "loaded", "agrees": false}]),
        "{conflicts}"
    );

    // The LoRA is served only by the node that agrees with its first report; `llama/tiny`
    // stays the target, which both nodes answer with every LoRA at 0.
    let sql = direct(&engine_a, Some(json!([{"id": 0, "scale": 1.0}]))).await;
    only_from(&app, "llama/sql", &sql, "node-a").await;
    from_both(&app, "llama/tiny", common::engines::TINY_REPLY).await;
    let models = listed(&app).await;
    let ids: Vec<&String> = models.as_object().expect("models").keys().collect();
    assert_eq!(ids, ["llama/sql", "llama/tiny"], "{models}");
    app.stop().await;
}
