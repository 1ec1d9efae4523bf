//! Issue 62 end to end: Ollama and vLLM managed like llama-server. A fake Ollama
//! (`OLLAMA_MAX_LOADED_MODELS` 2, three local models and a cloud one) behind a reference
//! node with `lifecycle = "ollama"`, `capacity = 2`; two fake vLLM servers on one fake GPU
//! with room for one awake (alpha awake, beta asleep) behind a node with `lifecycle =
//! "vllm"`, `capacity = 1`; a real edge; the official `openai` Python SDK as the client
//! (`tests/python/managed_engines.py`). The fakes are built from the engines' source
//! (`node_support/fake_ollama.rs`, `fake_vllm.rs`) and record everything done to them: every
//! check of what the engines did reads that record.

use std::time::Duration;

use serde_json::json;

use crate::admin_support::{ADMIN_KEY, admin};
use crate::common::python::run_client_script;
use crate::common::{TestApp, eventually, eventually_ok, spawn_app};
use crate::node_support::fake_ollama::{
    FakeOllama, KeepAlive, OllamaEvent, OllamaModel, OllamaOptions, UnloadCause,
};
use crate::node_support::fake_vllm::{FakeVllm, Gpu, VllmEvent, VllmOptions};
use crate::node_support::{RunningNode, spawn_node};
use reqwest::Method;

const API_KEY: &str = "sk-managed-engines";

/// The edge, its engines and their nodes.
struct Pool {
    app: TestApp,
    ollama: FakeOllama,
    gpu: std::sync::Arc<Gpu>,
    _vllm: Vec<FakeVllm>,
    _nodes: Vec<RunningNode>,
}

async fn pool() -> Pool {
    let ollama = FakeOllama::start(
        vec![
            OllamaModel::local("qwen2.5:0.5b").paced(5, Duration::from_millis(60)),
            OllamaModel::local("llama3.2:1b"),
            OllamaModel::local("slow:1b").load_time(Duration::from_secs(4)),
            OllamaModel::cloud("gpt-oss:120b-cloud"),
        ],
        OllamaOptions::default(),
    )
    .await;
    let gpu = Gpu::new(1);
    let alpha = FakeVllm::start(
        &gpu,
        VllmOptions::new("alpha").paced(20, Duration::from_millis(80)),
    )
    .await;
    let beta = FakeVllm::start(
        &gpu,
        VllmOptions {
            max_model_len: 16_384,
            wake_time: Duration::from_millis(300),
            ..VllmOptions::new("beta").asleep()
        },
    )
    .await;
    let config = format!(
        r#"
[api]
keys = ["{API_KEY}"]
[admin]
keys = ["{ADMIN_KEY}"]
[lifecycle]
reconcile_interval_ms = 100
[[models]]
model = "ollama/qwen2.5:0.5b"
pin = ["node-o"]
[[models]]
model = "ollama/slow:1b"
idle_unload_ms = 1500

[[nodes]]
id = "node-o"
alias = "ollama-box"
token = "token-o"
[nodes.runtime]
max_concurrent_runs = 8
heartbeat_interval_ms = 1000
[[nodes.adapters]]
name = "ollama"
targets = ["qwen2.5:0.5b", "llama3.2:1b", "slow:1b", "gpt-oss:120b-cloud"]
[nodes.adapters.settings]
base_url = "{ollama}"
lifecycle = "ollama"
capacity = 2
probe_interval_ms = "100"
"context_window.slow:1b" = "2048"

[[nodes]]
id = "node-v"
alias = "gpu-box"
token = "token-v"
[nodes.runtime]
max_concurrent_runs = 8
heartbeat_interval_ms = 1000
[[nodes.adapters]]
name = "vllm"
targets = ["alpha", "beta"]
[nodes.adapters.settings]
lifecycle = "vllm"
capacity = "1"
probe_interval_ms = "100"
"base_url.alpha" = "{alpha}"
"base_url.beta" = "{beta}"
"#,
        ollama = ollama.base_url(),
        alpha = alpha.base_url(),
        beta = beta.base_url(),
    );
    let app = spawn_app(&config).await;
    let nodes = ["o", "v"]
        .iter()
        .map(|n| spawn_node(app.node_addr, &format!("token-{n}"), |_| {}))
        .collect();
    app.wait_for_nodes(2).await;
    Pool {
        app,
        ollama,
        gpu,
        _vllm: vec![alpha, beta],
        _nodes: nodes,
    }
}

impl Pool {
    async fn script(&self, args: &[&str]) -> String {
        let base = format!("http://{}/v1", self.app.http_addr);
        let mut all = vec![args[0], base.as_str(), API_KEY];
        all.extend(&args[1..]);
        run_client_script("managed_engines.py", &all).await
    }

    fn ollama_did(&self, event: &OllamaEvent) -> bool {
        self.ollama.events().contains(event)
    }
}

fn model(name: &str) -> String {
    name.to_owned()
}

#[crate::common::test(flavor = "multi_thread", worker_threads = 2)]
async fn ollama_and_vllm_are_managed_through_the_edge_for_the_openai_sdk() {
    let pool = pool().await;
    let ollama = &pool.ollama;

    // The pinned model is loaded with no request, and kept (`keep_alive: -1`).
    eventually("the pinned model is loaded", || {
        pool.ollama_did(&OllamaEvent::Loaded {
            model: model("qwen2.5:0.5b"),
        })
    })
    .await;
    assert!(pool.ollama_did(&OllamaEvent::LoadAsked {
        model: model("qwen2.5:0.5b"),
        keep_alive: Some(KeepAlive::Forever),
    }));

    // The catalogue: every model either node serves or can load, with its window — the
    // pinned one's as Ollama allocated it (4,096, not /api/show's 131,072), slow's setting,
    // none yet for the one never loaded, each vLLM server's max_model_len (asleep too) —
    // and never the cloud model.
    let windows = json!({
        "ollama/qwen2.5:0.5b": 4096, "ollama/llama3.2:1b": null, "ollama/slow:1b": 2048,
        "vllm/alpha": 8192, "vllm/beta": 16384,
    });
    let said = pool.script(&["catalogue", &windows.to_string()]).await;
    assert!(said.starts_with("ok catalogue"), "{said}");

    // A cold request loads its model (held open, kept) and is answered.
    pool.script(&["chat", "ollama/llama3.2:1b"]).await;
    assert!(pool.ollama_did(&OllamaEvent::LoadAsked {
        model: model("llama3.2:1b"),
        keep_alive: Some(KeepAlive::Forever),
    }));
    assert_eq!(ollama.listed(), ["llama3.2:1b", "qwen2.5:0.5b"]);

    // A third model, whose load takes 4 s, on an Ollama full of two: the edge unloads the
    // idle, unpinned one itself (`keep_alive: 0`) before loading; the load is not aborted.
    pool.script(&["chat", "ollama/slow:1b"]).await;
    assert!(pool.ollama_did(&OllamaEvent::UnloadAsked {
        model: model("llama3.2:1b")
    }));
    assert!(pool.ollama_did(&OllamaEvent::Loaded {
        model: model("slow:1b")
    }));
    let events = ollama.events();
    let unloaded = events.iter().position(|e| {
        *e == OllamaEvent::Unloaded {
            model: model("llama3.2:1b"),
            cause: UnloadCause::Expired,
        }
    });
    let loading = events
        .iter()
        .position(|e| matches!(e, OllamaEvent::LoadStarted { model, .. } if model == "slow:1b"));
    assert!(
        unloaded.is_some() && unloaded < loading,
        "room made first: {events:?}"
    );

    // Two requests at once for a model Ollama serves one at a time (`parallel` 1): the
    // edge holds the second back, so Ollama never queues one.
    pool.script(&["two", "ollama/qwen2.5:0.5b"]).await;

    // slow:1b idle for its idle_unload_ms: unloaded through `keep_alive: 0`.
    eventually("the idle model is unloaded", || {
        pool.ollama_did(&OllamaEvent::Unloaded {
            model: model("slow:1b"),
            cause: UnloadCause::Expired,
        })
    })
    .await;
    assert!(pool.ollama_did(&OllamaEvent::UnloadAsked {
        model: model("slow:1b")
    }));

    // vLLM: a request for the asleep model while the awake one streams. The edge puts
    // alpha to sleep only once its stream has ended, then wakes beta, which is warmed with
    // one token before it is answered.
    let said = pool.script(&["wake", "vllm/alpha", "vllm/beta"]).await;
    eprintln!("{said}");

    // What each engine did, from its own record.
    let ollama_events = ollama.events();
    assert!(
        ollama.evictions().is_empty(),
        "Ollama made room on its own: {ollama_events:?}"
    );
    assert!(ollama.autoloads().is_empty(), "{ollama_events:?}");
    for event in &ollama_events {
        let left = matches!(event, OllamaEvent::Unloaded { model, .. } if model == "qwen2.5:0.5b");
        assert!(!left, "the pinned model left /api/ps: {ollama_events:?}");
        assert!(
            !matches!(
                event,
                OllamaEvent::LoadAborted { .. } | OllamaEvent::WaitedForSlot { .. }
            ),
            "{event:?} in {ollama_events:?}"
        );
        if let OllamaEvent::Request {
            keep_alive,
            num_ctx,
            ..
        } = event
        {
            assert!(keep_alive.is_none() && num_ctx.is_none(), "{event:?}");
        }
    }
    let gpu = pool.gpu.events();
    assert_eq!(pool.gpu.most_awake(), 1, "never two awake: {gpu:?}");
    for event in &gpu {
        assert!(
            !matches!(
                event,
                VllmEvent::OutOfMemory { .. }
                    | VllmEvent::AbortedAsleep { .. }
                    | VllmEvent::AbortedInFlight { .. }
            ),
            "{event:?} in {gpu:?}"
        );
    }
    let at = |wanted: &VllmEvent| {
        gpu.iter()
            .position(|e| e == wanted)
            .unwrap_or_else(|| panic!("no {wanted:?} in {gpu:?}"))
    };
    let alpha_done = at(&VllmEvent::Answered {
        server: "alpha".into(),
    });
    let slept = at(&VllmEvent::Sleep {
        server: "alpha".into(),
        level: "1".into(),
        mode: "wait".into(),
    });
    let asleep = at(&VllmEvent::Asleep {
        server: "alpha".into(),
    });
    let woke = at(&VllmEvent::WakeUp {
        server: "beta".into(),
    });
    let awake = at(&VllmEvent::Awake {
        server: "beta".into(),
    });
    let warm = at(&VllmEvent::Request {
        server: "beta".into(),
        model: "beta".into(),
        max_tokens: Some(1),
        path: "/v1/completions".into(),
    });
    let beta_answered = at(&VllmEvent::Answered {
        server: "beta".into(),
    });
    assert!(
        alpha_done < slept && slept < asleep && asleep < woke && woke < awake,
        "{gpu:?}"
    );
    assert!(awake < warm && warm < beta_answered, "{gpu:?}");
    let one_token = gpu
        .iter()
        .filter(|e| {
            matches!(
                e,
                VllmEvent::Request {
                    max_tokens: Some(1),
                    ..
                }
            )
        })
        .count();
    assert_eq!(one_token, 1, "one warm-up, after the one wake: {gpu:?}");

    // The management API tells both engines' states and why.
    eventually_ok("the management API shows the states", || async {
        let (_, list) = admin(&pool.app, Method::GET, "/admin/v1/models", None).await;
        let state = |m: &str| {
            list["models"]
                .as_array()?
                .iter()
                .find(|v| v["model"] == m)?["nodes"][0]["state"]
                .as_str()
                .map(str::to_owned)
        };
        let states = [
            state("vllm/alpha"),
            state("vllm/beta"),
            state("ollama/qwen2.5:0.5b"),
        ];
        let want = [Some("asleep"), Some("loaded"), Some("loaded")].map(|s| s.map(str::to_owned));
        if states == want {
            Ok(())
        } else {
            Err(format!("{states:?} in {list}"))
        }
    })
    .await;
    pool.app.stop().await;
}

/// An edge with one node whose `vllm` adapter has a server per target on `gpu`.
async fn vllm_pool(
    gpu: &std::sync::Arc<Gpu>,
    servers: &[(&str, VllmOptions)],
    extra: &str,
) -> (TestApp, Vec<FakeVllm>, RunningNode) {
    let mut fakes = Vec::new();
    let mut urls = String::new();
    for (target, options) in servers {
        let fake = FakeVllm::start(gpu, options.clone()).await;
        urls.push_str(&format!(
            "\"base_url.{target}\" = \"{}\"\n",
            fake.base_url()
        ));
        fakes.push(fake);
    }
    let targets: Vec<&str> = servers.iter().map(|(t, _)| *t).collect();
    let config = format!(
        r#"
[api]
keys = ["{API_KEY}"]
[lifecycle]
reconcile_interval_ms = 100
[[nodes]]
id = "node-v"
alias = "gpu-box"
token = "token-v"
[nodes.runtime]
max_concurrent_runs = 8
heartbeat_interval_ms = 1000
[[nodes.adapters]]
name = "vllm"
targets = {targets:?}
[nodes.adapters.settings]
lifecycle = "vllm"
probe_interval_ms = "100"
probe_down_interval_ms = "100"
{urls}{extra}
"#
    );
    let app = spawn_app(&config).await;
    let node = spawn_node(app.node_addr, "token-v", |_| {});
    app.wait_for_nodes(1).await;
    (app, fakes, node)
}

/// The model ids `GET /v1/models` lists.
async fn listed(app: &TestApp) -> Vec<String> {
    let url = format!("http://{}/v1/models", app.http_addr);
    let list: serde_json::Value = crate::common::http_client()
        .get(url)
        .bearer_auth(API_KEY)
        .send()
        .await
        .expect("an answer")
        .json()
        .await
        .expect("JSON");
    list["data"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|m| m["id"].as_str().map(str::to_owned))
        .collect()
}

#[crate::common::test]
async fn a_vllm_server_that_cannot_be_reached_makes_only_its_target_unavailable() {
    let gpu = Gpu::new(2);
    let servers = [
        ("alpha", VllmOptions::new("alpha")),
        ("beta", VllmOptions::new("beta")),
    ];
    let (app, mut fakes, _node) = vllm_pool(&gpu, &servers, "capacity = \"2\"").await;
    let both = ["vllm/alpha".to_owned(), "vllm/beta".to_owned()];
    eventually_ok("both are listed", || async {
        let now = listed(&app).await;
        if now == both {
            Ok(())
        } else {
            Err(format!("{now:?}"))
        }
    })
    .await;
    fakes[1].down().await;
    eventually_ok("beta alone leaves the list", || async {
        let now = listed(&app).await;
        if now == ["vllm/alpha"] {
            Ok(())
        } else {
            Err(format!("{now:?}"))
        }
    })
    .await;
    fakes[1].up().await;
    eventually_ok("beta is back", || async {
        let now = listed(&app).await;
        if now == both {
            Ok(())
        } else {
            Err(format!("{now:?}"))
        }
    })
    .await;
    app.stop().await;
}

#[crate::common::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_target_marked_never_to_sleep_is_never_put_to_sleep_to_make_room() {
    // Room for two awake: embed (never to sleep) and alpha; beta asleep.
    let gpu = Gpu::new(2);
    let servers = [
        ("alpha", VllmOptions::new("alpha")),
        ("beta", VllmOptions::new("beta").asleep()),
        ("embed", VllmOptions::new("embed")),
    ];
    let extra = "capacity = \"2\"\n\"never_sleep.embed\" = \"true\"";
    let (app, _fakes, _node) = vllm_pool(&gpu, &servers, extra).await;
    eventually_ok("the three are listed", || async {
        let now = listed(&app).await;
        if now.len() == 3 {
            Ok(())
        } else {
            Err(format!("{now:?}"))
        }
    })
    .await;
    // alpha used: embed is the least recently used. beta wanted: alpha goes to sleep all
    // the same, embed being marked never to sleep.
    let base = format!("http://{}/v1", app.http_addr);
    run_client_script(
        "managed_engines.py",
        &["chat", &base, API_KEY, "vllm/alpha"],
    )
    .await;
    run_client_script("managed_engines.py", &["chat", &base, API_KEY, "vllm/beta"]).await;
    let events = gpu.events();
    assert!(
        events.contains(&VllmEvent::Sleep {
            server: "alpha".into(),
            level: "1".into(),
            mode: "wait".into()
        }),
        "{events:?}"
    );
    assert!(
        !events
            .iter()
            .any(|e| matches!(e, VllmEvent::Sleep { server, .. } if server == "embed")),
        "{events:?}"
    );
    assert_eq!(gpu.awake(), ["beta", "embed"]);
    app.stop().await;
}

/// The time to the first piece of content of a streamed chat of `model` through the edge;
/// the stream is read to its end.
async fn first_content(app: &TestApp, model: &str) -> (std::time::Instant, Duration) {
    let body = json!({"model": model, "stream": true,
        "messages": [{"role": "user", "content": "Say hello"}]});
    let url = format!("http://{}/v1/chat/completions", app.http_addr);
    let started = std::time::Instant::now();
    let mut response = crate::common::http_client()
        .post(url)
        .bearer_auth(API_KEY)
        .json(&body)
        .send()
        .await
        .expect("an answer");
    assert_eq!(response.status(), 200, "{model}");
    let mut first = None;
    let mut seen = String::new();
    while let Some(chunk) = response.chunk().await.expect("the stream") {
        seen.push_str(&String::from_utf8_lossy(&chunk));
        if first.is_none() && seen.contains("\"content\":\"Hello") {
            first = Some(started.elapsed());
        }
    }
    (
        started,
        first.unwrap_or_else(|| panic!("no content from {model}: {seen}")),
    )
}

/// When the first event of `timeline` `matches` happened, after `start`.
fn at<E>(
    timeline: &[(std::time::Instant, E)],
    start: std::time::Instant,
    matches: impl Fn(&E) -> bool,
) -> Duration {
    let (when, _) = timeline
        .iter()
        .find(|(_, e)| matches(e))
        .expect("the event");
    when.duration_since(start)
}

/// The medians of each column of `rows`, in ms.
fn medians(rows: &[Vec<Duration>]) -> String {
    (0..rows[0].len())
        .map(|column| {
            let mut values: Vec<Duration> = rows.iter().map(|row| row[column]).collect();
            values.sort();
            format!("{:.1}", values[values.len() / 2].as_secs_f64() * 1e3)
        })
        .collect::<Vec<_>>()
        .join(" / ")
}

/// p50 and p90 of `values`, in ms.
fn percentiles(mut values: Vec<Duration>) -> String {
    values.sort();
    let at = |q: f64| {
        let index = ((values.len() as f64 - 1.0) * q).round() as usize;
        values[index].as_secs_f64() * 1e3
    };
    format!("p50 {:.1} ms, p90 {:.1} ms", at(0.5), at(0.9))
}

/// The time between the first event `from` matches and the first after it `to` matches.
fn span<E>(
    timeline: &[(std::time::Instant, E)],
    from: impl Fn(&E) -> bool,
    to: impl Fn(&E) -> bool,
) -> Duration {
    let start = timeline
        .iter()
        .position(|(_, e)| from(e))
        .expect("the first event");
    let began = timeline[start].0;
    let end = timeline[start..]
        .iter()
        .find(|(_, e)| to(e))
        .expect("the second event")
        .0;
    end.duration_since(began)
}

/// Not a test: the measurement of docs/benchmarks.md, "Ollama and vLLM: the edge's share of
/// a cold start and of a wake". Alternates two models on an Ollama fake holding one (each
/// request a cold start: unload the other, load this one) and two vLLM fakes with room for
/// one awake (each a wake: the other to sleep, wake, warm), on the shipped lifecycle
/// defaults, each followed by a warm request of the same model, and prints the time to the
/// first content through the edge, cold and warm, the engine's own time (the fake's record:
/// unload or sleep, load or wake, warm-up), the rest of the cold start beyond a warm request
/// — the edge's and the node's share of it — and where that goes, step by step.
#[crate::common::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a measurement: cargo test --test it measure_the_edges_share -- --ignored --nocapture"]
async fn measure_the_edges_share_of_a_cold_start_and_of_a_wake() {
    const ROUNDS: usize = 21;
    let ollama = FakeOllama::start(
        vec![
            OllamaModel::local("alpha:1b").load_time(Duration::from_millis(200)),
            OllamaModel::local("beta:1b").load_time(Duration::from_millis(200)),
        ],
        OllamaOptions {
            max_loaded: 1,
            ..OllamaOptions::default()
        },
    )
    .await;
    let gpu = Gpu::new(1);
    let wake = Duration::from_millis(200);
    let alpha = FakeVllm::start(
        &gpu,
        VllmOptions {
            wake_time: wake,
            ..VllmOptions::new("alpha")
        },
    )
    .await;
    let beta = FakeVllm::start(
        &gpu,
        VllmOptions {
            wake_time: wake,
            ..VllmOptions::new("beta").asleep()
        },
    )
    .await;
    let config = format!(
        r#"
[api]
keys = ["{API_KEY}"]
[[nodes]]
id = "node-o"
alias = "ollama-box"
token = "token-o"
[[nodes.adapters]]
name = "ollama"
targets = ["alpha:1b", "beta:1b"]
[nodes.adapters.settings]
base_url = "{}"
lifecycle = "ollama"
capacity = "1"
[[nodes]]
id = "node-v"
alias = "gpu-box"
token = "token-v"
[[nodes.adapters]]
name = "vllm"
targets = ["alpha", "beta"]
[nodes.adapters.settings]
lifecycle = "vllm"
capacity = "1"
"base_url.alpha" = "{}"
"base_url.beta" = "{}"
"#,
        ollama.base_url(),
        alpha.base_url(),
        beta.base_url()
    );
    let app = spawn_app(&config).await;
    let _nodes: Vec<RunningNode> = ["o", "v"]
        .iter()
        .map(|n| spawn_node(app.node_addr, &format!("token-{n}"), |_| {}))
        .collect();
    app.wait_for_nodes(2).await;
    eventually_ok("every model is listed", || async {
        let now = listed(&app).await;
        if now.len() == 4 {
            Ok(())
        } else {
            Err(format!("{now:?}"))
        }
    })
    .await;

    let (mut cold, mut cold_engine, mut cold_share) = (Vec::new(), Vec::new(), Vec::new());
    let mut cold_steps = Vec::new();
    let mut cold_warm = Vec::new();
    for round in 0..ROUNDS {
        let (this, other) = if round % 2 == 0 {
            ("alpha:1b", "beta:1b")
        } else {
            ("beta:1b", "alpha:1b")
        };
        let before = ollama.timeline().len();
        let (start, ttfb) = first_content(&app, &format!("ollama/{this}")).await;
        let (_, warm) = first_content(&app, &format!("ollama/{this}")).await;
        let timeline = ollama.timeline().split_off(before);
        let load = span(
            &timeline,
            |e| matches!(e, OllamaEvent::LoadStarted { model, .. } if model == this),
            |e| matches!(e, OllamaEvent::Loaded { model } if model == this),
        );
        let unload = if round == 0 {
            Duration::ZERO
        } else {
            span(
                &timeline,
                |e| matches!(e, OllamaEvent::UnloadAsked { model } if model == other),
                |e| matches!(e, OllamaEvent::Unloaded { model, .. } if model == other),
            )
        };
        if round > 0 {
            cold.push(ttfb);
            cold_warm.push(warm);
            cold_engine.push(load + unload);
            cold_share.push(ttfb.saturating_sub(load + unload + warm));
            let asked = at(&timeline, start, |e| {
                matches!(e, OllamaEvent::UnloadAsked { .. })
            });
            let gone = at(&timeline, start, |e| {
                matches!(e, OllamaEvent::Unloaded { .. })
            });
            let load_asked = at(&timeline, start, |e| {
                matches!(e, OllamaEvent::LoadAsked { .. })
            });
            let loaded = at(&timeline, start, |e| {
                matches!(e, OllamaEvent::Loaded { .. })
            });
            let chat = at(&timeline, start, |e| {
                matches!(e, OllamaEvent::Request { .. })
            });
            cold_steps.push(vec![
                asked,
                load_asked.saturating_sub(gone),
                chat.saturating_sub(loaded),
                ttfb.saturating_sub(chat),
            ]);
        }
    }
    let (mut woke, mut woke_engine, mut woke_share) = (Vec::new(), Vec::new(), Vec::new());
    let mut wake_steps = Vec::new();
    let mut woke_warm = Vec::new();
    for round in 0..ROUNDS {
        let (this, other) = if round % 2 == 0 {
            ("beta", "alpha")
        } else {
            ("alpha", "beta")
        };
        let before = pool_len(&gpu);
        let (start, ttfb) = first_content(&app, &format!("vllm/{this}")).await;
        let (_, warm_ttfb) = first_content(&app, &format!("vllm/{this}")).await;
        let timeline = gpu.timeline().split_off(before);
        let sleep = span(
            &timeline,
            |e| matches!(e, VllmEvent::Sleep { server, .. } if server == other),
            |e| matches!(e, VllmEvent::Asleep { server } if server == other),
        );
        let waking = span(
            &timeline,
            |e| matches!(e, VllmEvent::WakeUp { server } if server == this),
            |e| matches!(e, VllmEvent::Awake { server } if server == this),
        );
        let warm = span(
            &timeline,
            |e| matches!(e, VllmEvent::Request { server, max_tokens: Some(1), .. } if server == this),
            |e| matches!(e, VllmEvent::Answered { server } if server == this),
        );
        if round > 0 {
            let engine = sleep + waking + warm;
            woke.push(ttfb);
            woke_warm.push(warm_ttfb);
            woke_engine.push(engine);
            woke_share.push(ttfb.saturating_sub(engine + warm_ttfb));
            let slept_asked = at(&timeline, start, |e| matches!(e, VllmEvent::Sleep { .. }));
            let asleep = at(&timeline, start, |e| matches!(e, VllmEvent::Asleep { .. }));
            let wake_asked = at(&timeline, start, |e| matches!(e, VllmEvent::WakeUp { .. }));
            let awake = at(&timeline, start, |e| matches!(e, VllmEvent::Awake { .. }));
            let warm_asked = at(&timeline, start, |e| {
                matches!(
                    e,
                    VllmEvent::Request {
                        max_tokens: Some(1),
                        ..
                    }
                )
            });
            let chat = at(&timeline, start, |e| {
                matches!(
                    e,
                    VllmEvent::Request {
                        max_tokens: None,
                        ..
                    }
                )
            });
            wake_steps.push(vec![
                slept_asked,
                wake_asked.saturating_sub(asleep),
                warm_asked.saturating_sub(awake),
                chat.saturating_sub(warm_asked),
                ttfb.saturating_sub(chat),
            ]);
        }
    }
    eprintln!(
        "Ollama steps (median ms): request → keep_alive 0 / gone → load asked / loaded → the run reaches Ollama / → first content: {}",
        medians(&cold_steps)
    );
    eprintln!(
        "vLLM steps (median ms): request → sleep asked / asleep → wake asked / awake → warm-up asked / warm-up asked → the run reaches vLLM / → first content: {}",
        medians(&wake_steps)
    );
    eprintln!(
        "Ollama cold start ({} requests): first content {} (warm {}); the engine's own (unload + load) {}; the lifecycle's share (cold - warm - the engine's own) {}",
        cold.len(),
        percentiles(cold),
        percentiles(cold_warm),
        percentiles(cold_engine),
        percentiles(cold_share)
    );
    eprintln!(
        "vLLM wake ({} requests): first content {} (warm {}); the engine's own (sleep + wake + warm-up) {}; the lifecycle's share (cold - warm - the engine's own) {}",
        woke.len(),
        percentiles(woke),
        percentiles(woke_warm),
        percentiles(woke_engine),
        percentiles(woke_share)
    );
    app.stop().await;
}

fn pool_len(gpu: &Gpu) -> usize {
    gpu.timeline().len()
}
