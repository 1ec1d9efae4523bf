//! Issue 64 on vLLM: LoRAs registered at run time (`VLLM_ALLOW_RUNTIME_LORA_UPDATING=True`),
//! through the fake built from vLLM's source (`node_support/fake_vllm.rs`: its LoRA routes
//! and `/v1/models`), behind reference nodes with `lora_dir` (a folder of LoRA folders) and
//! a real edge. Every check of what the engine did reads the fake's record.

use std::path::Path;
use std::time::Duration;

use serde_json::{Value, json};

use crate::admin_support::{ADMIN_KEY, get_ok};
use crate::common::{self, TestApp, eventually, eventually_ok, spawn_app};
use crate::node_support::fake_vllm::{FakeVllm, Gpu, VllmEvent, VllmOptions};
use crate::node_support::{RunningNode, api_post, node_entry, spawn_node};

/// A folder of LoRA folders (`sql`, `support`, `tone`), each as vLLM's PEFT layout has it.
fn lora_dir(dir: &Path) {
    for name in ["sql", "support", "tone"] {
        let lora = dir.join(name);
        std::fs::create_dir_all(&lora).expect("a LoRA folder");
        let config = json!({"peft_type": "LORA", "r": 8, "lora_alpha": 16,
            "base_model_name_or_path": "Qwen/Qwen2.5-0.5B-Instruct"});
        std::fs::write(lora.join("adapter_config.json"), config.to_string()).expect("config");
        std::fs::write(lora.join("adapter_model.safetensors"), name.repeat(64)).expect("weights");
    }
}

/// An edge whose nodes (`node-a`, …) each serve `vllm/qwen` from one of `servers`, with
/// `lora_dir` = `loras` and `max_registered` = 2.
async fn edge(servers: &[&FakeVllm], loras: &Path) -> (TestApp, Vec<RunningNode>) {
    let mut config = format!("[admin]\nkeys = [\"{ADMIN_KEY}\"]\n");
    let ids = ["node-a", "node-b"];
    for (id, server) in ids.iter().zip(servers) {
        let settings = [
            ("base_url", server.base_url()),
            ("lora_dir", loras.display().to_string()),
            ("max_registered", "2".to_owned()),
            ("probe_interval_ms", "100".to_owned()),
            ("probe_down_interval_ms", "100".to_owned()),
        ];
        config.push_str(&node_entry(id, "vllm", &["qwen"], &settings));
    }
    let app = spawn_app(&config).await;
    let nodes = ids[..servers.len()]
        .iter()
        .map(|id| spawn_node(app.node_addr, &format!("token-{id}"), |_| {}))
        .collect();
    app.wait_for_nodes(servers.len()).await;
    (app, nodes)
}

/// A server of `qwen` with LoRAs registered at run time.
fn lora_server() -> VllmOptions {
    VllmOptions::new("qwen").runtime_loras()
}

/// A whole chat answer through the edge: its text and the node that answered.
async fn chat(app: &TestApp, model: &str) -> (String, String) {
    let body = json!({"model": model, "messages": [{"role": "user", "content": "hi"}]});
    let (status, node, answer) = api_post(app, "/v1/chat/completions", &body).await;
    assert_eq!(status, 200, "{model}: {answer}");
    let text = answer["choices"][0]["message"]["content"].as_str();
    (text.unwrap_or_default().to_owned(), node)
}

/// A folder of LoRA folders and one fake server of `qwen` (`options`) on a GPU of its own.
async fn one_server(options: VllmOptions) -> (tempfile::TempDir, std::sync::Arc<Gpu>, FakeVllm) {
    let dir = tempfile::tempdir().expect("tempdir");
    lora_dir(dir.path());
    let gpu = Gpu::new(1);
    let server = FakeVllm::start(&gpu, options).await;
    (dir, gpu, server)
}

/// Waits until `/v1/models` lists `id`, and returns its entry.
async fn until_listed(app: &TestApp, id: &str) -> Value {
    eventually_ok(&format!("/v1/models lists {id}"), || async {
        let url = format!("http://{}/v1/models", app.http_addr);
        let list: Value = common::http_client()
            .get(url)
            .send()
            .await
            .map_err(|e| e.to_string())?
            .json()
            .await
            .map_err(|e| e.to_string())?;
        let found = list["data"]
            .as_array()
            .and_then(|d| d.iter().find(|m| m["id"] == id));
        found.cloned().ok_or_else(|| list.to_string())
    })
    .await
}

/// The LoRA events of `gpu`'s record, in order.
fn lora_events(gpu: &Gpu) -> Vec<VllmEvent> {
    gpu.events()
        .into_iter()
        .filter(|e| {
            matches!(
                e,
                VllmEvent::LoraLoaded { .. } | VllmEvent::LoraUnloaded { .. }
            ) || matches!(e, VllmEvent::Request { model, .. } if model != "qwen")
        })
        .collect()
}

fn loaded(lora: &str, path: &Path) -> VllmEvent {
    VllmEvent::LoraLoaded {
        server: "qwen".into(),
        lora: lora.into(),
        path: path.join(lora).display().to_string(),
    }
}

fn request(lora: &str) -> VllmEvent {
    VllmEvent::Request {
        server: "qwen".into(),
        model: lora.into(),
        max_tokens: None,
        path: "/v1/chat/completions".into(),
    }
}

#[crate::common::test]
async fn the_fakes_lora_routes_answer_as_vllms_do() {
    let (dir, _gpu, server) = one_server(lora_server()).await;
    let http = common::http_client();
    let post = |path: &'static str, body: Value| {
        let http = http.clone();
        let url = format!("{}{path}", server.base_url());
        async move {
            let response = http.post(url).json(&body).send().await.expect("an answer");
            (
                response.status().as_u16(),
                response.text().await.unwrap_or_default(),
            )
        }
    };
    let sql = dir.path().join("sql").display().to_string();
    let chat = json!({"model": "sql", "messages": [{"role": "user", "content": "hi"}]});
    // Not registered: the model does not exist.
    assert_eq!(post("/chat/completions", chat.clone()).await.0, 404);
    let (status, text) = post(
        "/load_lora_adapter",
        json!({"lora_name": "sql", "lora_path": sql}),
    )
    .await;
    assert_eq!(
        (status, text.as_str()),
        (200, "Success: LoRA adapter 'sql' added successfully.")
    );
    let (status, text) = post(
        "/load_lora_adapter",
        json!({"lora_name": "sql", "lora_path": sql}),
    )
    .await;
    assert_eq!(status, 400);
    assert!(text.contains("has already been loaded"), "{text}");
    let missing = json!({"lora_name": "x", "lora_path": "/nowhere"});
    assert_eq!(post("/load_lora_adapter", missing).await.0, 404);
    assert_eq!(
        post("/load_lora_adapter", json!({"lora_name": "x"}))
            .await
            .0,
        400
    );
    // Listed with its parent; answered through it.
    let list: Value = http
        .get(format!("{}/models", server.base_url()))
        .send()
        .await
        .expect("models")
        .json()
        .await
        .expect("JSON");
    assert_eq!(list["data"][1]["id"], "sql");
    assert_eq!(
        (&list["data"][1]["parent"], &list["data"][1]["root"]),
        (&json!("qwen"), &json!(sql))
    );
    assert_eq!(list["data"][0]["parent"], Value::Null);
    let (status, text) = post("/chat/completions", chat).await;
    assert_eq!(status, 200);
    assert!(text.contains("(sql)"), "{text}");
    assert_eq!(
        post("/unload_lora_adapter", json!({"lora_name": "sql"}))
            .await
            .0,
        200
    );
    assert_eq!(
        post("/unload_lora_adapter", json!({"lora_name": "sql"}))
            .await
            .0,
        404
    );
    // Without VLLM_ALLOW_RUNTIME_LORA_UPDATING the routes do not exist.
    let plain = FakeVllm::start(&Gpu::new(1), VllmOptions::new("plain")).await;
    let url = format!("{}/load_lora_adapter", plain.base_url());
    let response = http
        .post(url)
        .json(&json!({}))
        .send()
        .await
        .expect("an answer");
    assert_eq!(response.status(), 404);
}

#[crate::common::test]
async fn a_lora_is_registered_before_its_first_run_and_listed_with_its_parent() {
    let (dir, gpu, server) = one_server(lora_server()).await;
    let (app, _nodes) = edge(&[&server], dir.path()).await;

    // Every folder is a model, loadable, before anything is registered.
    for lora in ["sql", "support", "tone"] {
        let listed = until_listed(&app, &format!("vllm/{lora}")).await;
        assert_eq!(listed["parent"], "vllm/qwen", "{listed}");
    }
    let loras = get_ok(&app, "/admin/v1/loras").await;
    assert_eq!(
        loras["loras"][0]["nodes"][0]["state"], "loadable",
        "{loras}"
    );
    assert!(server.loras().is_empty());

    let (text, _) = chat(&app, "vllm/sql").await;
    assert_eq!(text, "Hello from qwen. (sql)");
    let (again, _) = chat(&app, "vllm/sql").await;
    assert_eq!(again, text);
    // Registered once, before its first run; the base needs none.
    let (base, _) = chat(&app, "vllm/qwen").await;
    assert_eq!(base, "Hello from qwen.");
    assert_eq!(
        lora_events(&gpu),
        [loaded("sql", dir.path()), request("sql"), request("sql")]
    );
    assert_eq!(
        server.loras(),
        [(
            "sql".to_owned(),
            dir.path().join("sql").display().to_string()
        )]
    );
    // The edge is told at once: registered now.
    eventually_ok("the edge shows sql loaded", || async {
        let loras = get_ok(&app, "/admin/v1/loras").await;
        let sql = &loras["loras"][0];
        match (&sql["model"], &sql["nodes"][0]["state"]) {
            (model, state) if model == "vllm/sql" && state == "loaded" => Ok(()),
            _ => Err(loras.to_string()),
        }
    })
    .await;
    app.stop().await;
}

#[crate::common::test]
async fn max_registered_unregisters_the_least_recently_used_idle_lora_never_one_in_flight() {
    let options = lora_server().paced(25, Duration::from_millis(40));
    let (dir, gpu, server) = one_server(options).await;
    let (app, _nodes) = edge(&[&server], dir.path()).await;
    until_listed(&app, "vllm/tone").await;

    // sql, then support: two registered, the most allowed.
    chat(&app, "vllm/sql").await;
    chat(&app, "vllm/support").await;
    // sql streams (its LoRA in flight) while tone comes: support, the one idle, makes room,
    // though sql was used less recently.
    let streaming = tokio::spawn({
        let addr = app.http_addr;
        async move {
            let body = json!({"model": "vllm/sql", "stream": true,
                "messages": [{"role": "user", "content": "hi"}]});
            let response = common::http_client()
                .post(format!("http://{addr}/v1/chat/completions"))
                .json(&body)
                .send()
                .await
                .expect("the edge answers");
            response.text().await.unwrap_or_default()
        }
    });
    eventually("sql's stream is running", || {
        gpu.events()
            .iter()
            .filter(|e| **e == request("sql"))
            .count()
            == 2
    })
    .await;
    let (tone, _) = chat(&app, "vllm/tone").await;
    assert!(tone.ends_with("(tone)"), "{tone}");
    let stream = common::bounded("sql's stream", streaming)
        .await
        .expect("the stream task");
    assert!(
        stream.contains("(sql)") && stream.contains("[DONE]"),
        "{stream}"
    );
    // sql once more, then support again: the least recently used idle one is now tone.
    chat(&app, "vllm/sql").await;
    chat(&app, "vllm/support").await;

    let unloaded: Vec<(String, u32)> = lora_events(&gpu)
        .into_iter()
        .filter_map(|e| match e {
            VllmEvent::LoraUnloaded {
                lora, in_flight, ..
            } => Some((lora, in_flight)),
            _ => None,
        })
        .collect();
    assert_eq!(
        unloaded,
        [("support".to_owned(), 0), ("tone".to_owned(), 0)],
        "{:?}",
        lora_events(&gpu)
    );
    assert_eq!(server.most_loras(), 2, "never more than max_registered");
    let mut now: Vec<String> = server.loras().into_iter().map(|(name, _)| name).collect();
    now.sort();
    assert_eq!(now, ["sql", "support"]);
    app.stop().await;
}

#[crate::common::test]
async fn a_lora_registered_on_one_node_draws_its_runs_there() {
    let dir = tempfile::tempdir().expect("tempdir");
    lora_dir(dir.path());
    let (gpu_a, gpu_b) = (Gpu::new(1), Gpu::new(1));
    let server_a = FakeVllm::start(&gpu_a, lora_server()).await;
    let server_b = FakeVllm::start(&gpu_b, lora_server()).await;
    let (app, _nodes) = edge(&[&server_a, &server_b], dir.path()).await;
    until_listed(&app, "vllm/sql").await;
    eventually_ok("both nodes report the LoRAs", || async {
        let loras = get_ok(&app, "/admin/v1/loras").await;
        match loras["loras"][0]["nodes"].as_array().map(Vec::len) {
            Some(2) => Ok(()),
            _ => Err(loras.to_string()),
        }
    })
    .await;
    // The first run registers it where it goes; every later one goes there too.
    let (_, first) = chat(&app, "vllm/sql").await;
    for _ in 0..6 {
        assert_eq!(chat(&app, "vllm/sql").await.1, first);
    }
    let registered = |gpu: &Gpu| {
        gpu.events()
            .iter()
            .filter(|e| matches!(e, VllmEvent::LoraLoaded { .. }))
            .count()
    };
    let (on_a, on_b) = (registered(&gpu_a), registered(&gpu_b));
    assert_eq!(on_a + on_b, 1, "registered once, on {first}");
    app.stop().await;
}
