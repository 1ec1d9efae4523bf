//! Issue 63 end to end on real engines: placement by fit. Two `llama-server`s in router mode
//! (this machine's memory as each node's one device), each behind a reference node with
//! `lifecycle = "llama-router"` and its own `memory` budget — node-a 100 MiB, node-b
//! 340 MiB — and a real edge. Each router's `--models-dir` holds two copies of the tiny model
//! (`alpha`, `beta`), the large model (`large`: the tiny model's construction at 1,024 wide,
//! a GGUF of 261 MiB) and `huge`, a GGUF header claiming 4 GiB of weights over a sparse file
//! (never loaded: only its header is read). The nodes derive every footprint from the
//! files' headers; every check of what is loaded reads each engine's own `GET /models`.

use crate::admin_support::{ADMIN_KEY, admin};
use crate::common;
use crate::node_support;

use std::io::Write as _;
use std::path::Path;

use crate::node::gguf::llama_header;
use common::engines::{LlamaOptions, LlamaServer, large_model};
use common::{TestApp, eventually_ok, spawn_app};
use node_support::{RunningNode, router_node_entry, spawn_nodes};
use reqwest::Method;
use serde_json::{Value, json};

const MODELS: [&str; 4] = ["alpha", "beta", "large", "huge"];

/// The edge, its two engines (node-a's, node-b's) and their nodes.
struct Pool {
    app: TestApp,
    engines: Vec<LlamaServer>,
    _nodes: Vec<RunningNode>,
    _files: tempfile::TempDir,
}

/// Writes a GGUF header of a llama model with one f16 tensor of 8,192 × 262,144 (4 GiB)
/// into `path`, and makes the file as long as its data would be (sparse: nothing is
/// written past the header).
fn huge_header(path: &Path) {
    let keys = [
        ("llama.block_count", 48),
        ("llama.embedding_length", 8_192),
        ("llama.feed_forward_length", 28_672),
        ("llama.attention.head_count", 64),
        ("llama.attention.head_count_kv", 8),
        ("llama.context_length", 8_192),
    ];
    let dims: &[u64] = &[8_192, 262_144];
    let header = llama_header(&keys, &[], &[("token_embd.weight", dims, 1)]);
    let mut file = std::fs::File::create(path).expect("the huge header");
    file.write_all(&header).expect("written");
    let data = 8_192u64 * 262_144 * 2;
    file.set_len(header.len().next_multiple_of(32) as u64 + data)
        .expect("sparse");
}

async fn pool() -> Pool {
    let files = tempfile::tempdir().expect("a directory");
    let huge = files.path().join("huge.gguf");
    huge_header(&huge);
    let large = large_model();
    let mut engines = Vec::new();
    for _ in 0..2 {
        let options = LlamaOptions::default()
            .router(&MODELS[..2], 4)
            .router_model("large", &large)
            .router_model("huge", &huge);
        engines.push(LlamaServer::start_with(options).await);
    }
    // The large model may not be pinned where it does not fit: said, not refused.
    let mut config = format!(
        "[admin]\nkeys = [\"{ADMIN_KEY}\"]\n[lifecycle]\nreconcile_interval_ms = 100\n\
         [[models]]\nmodel = \"llama/large\"\npin = [\"node-a\"]\n"
    );
    for ((id, memory), engine) in [("node-a", "100MiB"), ("node-b", "340MiB")]
        .iter()
        .zip(&engines)
    {
        let targets = ["alpha", "beta", "large", "huge"];
        let settings = format!("memory = \"{memory}\"");
        config.push_str(&router_node_entry(
            id,
            &targets,
            &engine.v1_url(),
            &settings,
        ));
    }
    let app = spawn_app(&config).await;
    let nodes = spawn_nodes(&app, &["node-a", "node-b"]).await;
    Pool {
        app,
        engines,
        _nodes: nodes,
        _files: files,
    }
}

impl Pool {
    /// Which models each engine says it has loaded, node-a's first.
    async fn loaded(&self) -> [Vec<&'static str>; 2] {
        [
            self.engines[0].router_loaded(&MODELS).await,
            self.engines[1].router_loaded(&MODELS).await,
        ]
    }

    /// `POST path` on the client API with `body`: the status and the JSON answer.
    async fn post(&self, path: &str, body: Value) -> (u16, Value) {
        let url = format!("http://{}{path}", self.app.http_addr);
        let response = common::http_client()
            .post(url)
            .header("anthropic-version", "2023-06-01")
            .json(&body)
            .send()
            .await
            .expect("an answer");
        let status = response.status().as_u16();
        (status, response.json().await.expect("JSON"))
    }

    async fn chat(&self, model: &str) -> (u16, Value) {
        let body = json!({"model": model, "max_tokens": 8,
            "messages": [{"role": "user", "content": "Say hi"}]});
        self.post("/v1/chat/completions", body).await
    }

    /// `llama/<name>` on `node` in `GET /admin/v1/models`.
    async fn on_node(&self, name: &str, node: &str) -> Value {
        let (_, list) = admin(&self.app, Method::GET, "/admin/v1/models", None).await;
        let model = list["models"]
            .as_array()
            .and_then(|m| m.iter().find(|m| m["model"] == format!("llama/{name}")))
            .cloned()
            .unwrap_or(Value::Null);
        model["nodes"]
            .as_array()
            .and_then(|n| n.iter().find(|n| n["node"] == node))
            .cloned()
            .unwrap_or(Value::Null)
    }

    /// Waits until both nodes report every model's footprint.
    async fn until_footprints_known(&self) {
        eventually_ok("every model's footprint is known on both nodes", || async {
            for name in MODELS {
                for node in ["node-a", "node-b"] {
                    let on = self.on_node(name, node).await;
                    if on["footprint"]["bytes"].as_u64().is_none() {
                        return Err(format!("{name} on {node}: {on}"));
                    }
                }
            }
            Ok(())
        })
        .await;
    }
}

#[crate::common::test]
async fn models_go_where_they_fit_and_one_that_fits_nowhere_is_refused_at_once() {
    let pool = pool().await;
    pool.until_footprints_known().await;
    let large = pool.on_node("large", "node-b").await;
    assert_eq!(large["footprint"]["source"], "gguf", "{large}");
    assert_eq!(large["budget_bytes"], 340u64 << 20, "{large}");

    // Larger than both budgets: refused at once with its footprint and the largest budget,
    // in OpenAI's shape and in Anthropic's; nothing is loaded anywhere.
    let (status, refused) = pool.chat("llama/huge").await;
    assert_eq!(status, 400, "{refused}");
    assert_eq!(refused["error"]["code"], "model_too_large", "{refused}");
    let message = refused["error"]["message"].as_str().unwrap_or_default();
    assert!(
        message.contains("GiB") && message.contains("340.0 MiB"),
        "{message}"
    );
    let body = json!({"model": "llama/huge", "max_tokens": 8,
        "messages": [{"role": "user", "content": "Say hi"}]});
    let (status, refused) = pool.post("/v1/messages", body).await;
    assert_eq!(status, 400, "{refused}");
    assert_eq!(
        refused["error"]["type"], "invalid_request_error",
        "{refused}"
    );
    assert_eq!(pool.loaded().await, [Vec::<&str>::new(), Vec::new()]);

    // The large model goes to node-b, the only node it fits.
    let (status, answer) = pool.chat("llama/large").await;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(pool.loaded().await, [vec![], vec!["large"]]);

    // The two small ones do not fit beside it on node-b (16 MiB left): they share node-a,
    // where the large one would not fit beside them, and node-b keeps the large one.
    for small in ["llama/alpha", "llama/beta"] {
        let (status, answer) = pool.chat(small).await;
        assert_eq!(status, 200, "{small}: {answer}");
    }
    assert_eq!(pool.loaded().await, [vec!["alpha", "beta"], vec!["large"]]);

    // Each decision said the footprint and the room it found.
    let decided = pool.on_node("alpha", "node-a").await;
    assert_eq!(
        decided["decided"]["budget_bytes"],
        100u64 << 20,
        "{decided}"
    );
    let (_, feed) = admin(&pool.app, Method::GET, "/admin/v1/models/events", None).await;
    let feed = feed.as_str().unwrap_or_default().to_owned();
    assert!(
        feed.lines().any(|l| l.contains("\"model\":\"llama/large\"")
            && l.contains("\"footprint_bytes\"")
            && l.contains("\"room_bytes\"")),
        "{feed}"
    );
    // The pin of the large model on node-a cannot be met: the feed and the model say why.
    assert!(
        feed.lines()
            .any(|l| l.contains("\"action\":\"warning\"") && l.contains("pinned on node-a")),
        "{feed}"
    );
    let (_, list) = admin(&pool.app, Method::GET, "/admin/v1/models", None).await;
    assert!(
        list.to_string()
            .contains("is pinned on node-a, where it does not fit"),
        "{list}"
    );

    footprint_against_the_engines_memory(&pool, &large).await;
    pool.app.stop().await;
}

/// The large model's footprint, as node-b derived it from the header, against the resident
/// memory of the process its router runs it in, after the answered request above.
async fn footprint_against_the_engines_memory(pool: &Pool, large: &Value) {
    let footprint = large["footprint"]["bytes"].as_u64().expect("a footprint");
    let rss = pool.engines[1]
        .router_child_rss("large")
        .expect("node-b's router runs the large model");
    let off = footprint.abs_diff(rss) as f64 / rss as f64;
    eprintln!(
        "the large model: footprint {footprint} bytes ({}), its process's VmRSS {rss} bytes: {:+.1} %",
        large["footprint"],
        (footprint as f64 / rss as f64 - 1.0) * 100.0
    );
    assert!(off <= 0.25, "footprint {footprint} against VmRSS {rss}");
}
