//! The engine fakes of issue 62 against their own record: each trap of Ollama and of vLLM's
//! sleep mode that the node and the edge must avoid is shown here on the fake alone, driven
//! over HTTP as an engine's client would, so the end-to-end tests can take the record as
//! ground truth (`tests/it/node_support/fake_ollama.rs`, `fake_vllm.rs`: where each
//! behaviour comes from in the engines' source).

use std::time::Duration;

use serde_json::{Value, json};

use crate::common::{self, eventually};
use crate::node_support::fake_ollama::{
    FakeOllama, KeepAlive, OllamaEvent, OllamaModel, OllamaOptions, UnloadCause,
};
use crate::node_support::fake_vllm::{FakeVllm, Gpu, VllmEvent, VllmOptions};

async fn post(url: &str, body: Value) -> Value {
    let response = common::http_client()
        .post(url)
        .json(&body)
        .send()
        .await
        .expect("an answer");
    response.json().await.expect("JSON")
}

async fn get(url: &str) -> Value {
    common::http_get(url)
        .await
        .expect("an answer")
        .json()
        .await
        .expect("JSON")
}

fn ollama_models() -> Vec<OllamaModel> {
    vec![
        OllamaModel::local("alpha:1b"),
        OllamaModel::local("beta:1b"),
        OllamaModel::local("gamma:1b").paced(8, Duration::from_millis(40)),
        OllamaModel::cloud("gpt-oss:120b-cloud"),
    ]
}

async fn load(ollama: &FakeOllama, model: &str, keep_alive: i64) -> Value {
    let body = json!({"model": model, "keep_alive": keep_alive});
    post(&format!("{}/api/generate", ollama.root()), body).await
}

#[crate::common::test]
async fn ollama_lists_a_cloud_model_and_allocates_less_than_show_says() {
    let ollama = FakeOllama::start(ollama_models(), OllamaOptions::default()).await;
    let tags = get(&format!("{}/api/tags", ollama.root())).await;
    let cloud: Vec<&Value> = tags["models"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| m.get("remote_host").is_some())
        .collect();
    assert_eq!(cloud.len(), 1, "{tags}");
    assert_eq!(cloud[0]["name"], "gpt-oss:120b-cloud");
    assert_eq!(cloud[0]["remote_model"], "gpt-oss:120b");

    let show = post(
        &format!("{}/api/show", ollama.root()),
        json!({"model": "alpha:1b"}),
    )
    .await;
    assert_eq!(show["model_info"]["qwen2.context_length"], 131_072);
    let loaded = load(&ollama, "alpha:1b", -1).await;
    assert_eq!(loaded["done_reason"], "load", "{loaded}");
    let ps = get(&format!("{}/api/ps", ollama.root())).await;
    assert_eq!(ps["models"][0]["context_length"], 4_096, "{ps}");
    assert!(
        ps["models"][0]["expires_at"]
            .as_str()
            .unwrap()
            .starts_with("23"),
        "kept forever: {ps}"
    );
    assert_eq!(
        ollama.events()[..3],
        [
            OllamaEvent::LoadAsked {
                model: "alpha:1b".into(),
                keep_alive: Some(KeepAlive::Forever)
            },
            OllamaEvent::LoadStarted {
                model: "alpha:1b".into(),
                autoload: false
            },
            OllamaEvent::Loaded {
                model: "alpha:1b".into()
            },
        ]
    );
}

#[crate::common::test]
async fn ollama_autoloads_on_any_request_and_evicts_an_idle_pinned_runner_at_its_limit() {
    let ollama = FakeOllama::start(ollama_models(), OllamaOptions::default()).await;
    load(&ollama, "alpha:1b", -1).await;
    load(&ollama, "beta:1b", -1).await;
    assert_eq!(ollama.listed(), ["alpha:1b", "beta:1b"]);
    // A chat for a third model: Ollama loads it itself, and makes room by expiring one of
    // the two runners kept forever (the first by name: both have the same duration).
    let body = json!({"model": "gamma:1b", "messages": [{"role": "user", "content": "hi"}],
        "keep_alive": -1, "options": {"num_ctx": 32768}});
    let answer = post(&format!("{}/chat/completions", ollama.base_url()), body).await;
    assert_eq!(answer["choices"][0]["finish_reason"], "stop", "{answer}");
    assert_eq!(ollama.autoloads(), ["gamma:1b"]);
    assert_eq!(
        ollama.evictions(),
        [("alpha:1b".to_owned(), "gamma:1b".to_owned())]
    );
    assert_eq!(ollama.listed(), ["beta:1b", "gamma:1b"]);
    // What the client sent of Ollama's own knobs is on the record.
    assert!(ollama.events().contains(&OllamaEvent::Request {
        model: "gamma:1b".into(),
        keep_alive: Some(json!(-1)),
        num_ctx: Some(json!(32768)),
    }));
    assert!(ollama.events().contains(&OllamaEvent::Unloaded {
        model: "alpha:1b".into(),
        cause: UnloadCause::Evicted {
            for_model: "gamma:1b".into()
        },
    }));
}

#[crate::common::test]
async fn an_ollama_load_whose_client_goes_away_is_abandoned() {
    let models = vec![OllamaModel::local("slow:1b").load_time(Duration::from_secs(3))];
    let ollama = FakeOllama::start(models, OllamaOptions::default()).await;
    let impatient = common::http()
        .timeout(Duration::from_millis(300))
        .build()
        .unwrap();
    let gave_up = impatient
        .post(format!("{}/api/generate", ollama.root()))
        .json(&json!({"model": "slow:1b", "keep_alive": -1}))
        .send()
        .await;
    assert!(gave_up.is_err(), "the client timed out");
    // While loading, /api/ps listed it like a loaded model; once abandoned, it is gone.
    eventually("the load is abandoned", || {
        ollama.events().contains(&OllamaEvent::LoadAborted {
            model: "slow:1b".into(),
        })
    })
    .await;
    assert!(ollama.listed().is_empty());
    assert!(!ollama.events().contains(&OllamaEvent::Loaded {
        model: "slow:1b".into()
    }));
}

#[crate::common::test]
async fn an_ollama_runner_lists_while_loading_and_an_unload_waits_for_its_requests() {
    let models = vec![
        OllamaModel::local("slow:1b")
            .load_time(Duration::from_millis(600))
            .paced(10, Duration::from_millis(60)),
    ];
    let ollama = FakeOllama::start(models, OllamaOptions::default()).await;
    let root = ollama.root();
    let loading = tokio::spawn(async move {
        post(
            &format!("{root}/api/generate"),
            json!({"model": "slow:1b", "keep_alive": -1}),
        )
        .await
    });
    eventually("a loading model is listed", || {
        ollama.listed() == ["slow:1b"]
    })
    .await;
    assert!(
        !ollama.events().contains(&OllamaEvent::Loaded {
            model: "slow:1b".into()
        }),
        "listed before it is loaded: /api/ps has no loading state"
    );
    common::bounded("the load", loading).await.unwrap();

    // A stream in flight, then an unload: answered at once, the runner goes only after.
    let body = json!({"model": "slow:1b", "stream": true,
        "messages": [{"role": "user", "content": "hi"}]});
    let mut stream = common::http_client()
        .post(format!("{}/chat/completions", ollama.base_url()))
        .json(&body)
        .send()
        .await
        .unwrap();
    let first = stream.chunk().await.unwrap().unwrap();
    assert!(String::from_utf8_lossy(&first).contains("w0"));
    let unload = post(
        &format!("{}/api/generate", ollama.root()),
        json!({"model": "slow:1b", "keep_alive": 0}),
    )
    .await;
    assert_eq!(unload["done_reason"], "unload");
    assert_eq!(
        ollama.listed(),
        ["slow:1b"],
        "still there while its request runs"
    );
    let mut rest = Vec::new();
    while let Some(chunk) = stream.chunk().await.unwrap() {
        rest.extend_from_slice(&chunk);
    }
    let rest = String::from_utf8_lossy(&rest);
    assert!(rest.contains("w9") && rest.contains("[DONE]"), "{rest}");
    eventually("the runner goes once idle", || ollama.listed().is_empty()).await;
    let events = ollama.events();
    let answered = events
        .iter()
        .position(|e| matches!(e, OllamaEvent::Answered { .. }));
    let unloaded = events
        .iter()
        .position(|e| matches!(e, OllamaEvent::Unloaded { .. }));
    assert!(answered < unloaded, "{events:?}");
}

#[crate::common::test]
async fn ollama_serves_num_parallel_requests_of_a_model_at_once_and_queues_the_rest() {
    let models = vec![OllamaModel::local("alpha:1b").paced(5, Duration::from_millis(40))];
    let ollama = FakeOllama::start(models, OllamaOptions::default()).await;
    load(&ollama, "alpha:1b", -1).await;
    let url = format!("{}/chat/completions", ollama.base_url());
    let body = json!({"model": "alpha:1b", "messages": [{"role": "user", "content": "hi"}]});
    let (a, b) = tokio::join!(post(&url, body.clone()), post(&url, body));
    assert_eq!(a["choices"][0]["finish_reason"], "stop");
    assert_eq!(b["choices"][0]["finish_reason"], "stop");
    assert!(ollama.events().contains(&OllamaEvent::WaitedForSlot {
        model: "alpha:1b".into()
    }));
}

async fn stream_text(response: reqwest::Response) -> (String, Vec<String>) {
    let text = response.text().await.unwrap();
    let mut content = String::new();
    let mut finishes = Vec::new();
    for line in text.lines() {
        let Some(data) = line.strip_prefix("data: ") else {
            continue;
        };
        let Ok(chunk) = serde_json::from_str::<Value>(data) else {
            continue;
        };
        if let Some(piece) = chunk
            .pointer("/choices/0/delta/content")
            .and_then(Value::as_str)
        {
            content.push_str(piece);
        }
        if let Some(finish) = chunk
            .pointer("/choices/0/finish_reason")
            .and_then(Value::as_str)
        {
            finishes.push(finish.to_owned());
        }
    }
    (content, finishes)
}

async fn chat_stream(vllm: &FakeVllm, model: &str) -> reqwest::Response {
    let body = json!({"model": model, "stream": true,
        "messages": [{"role": "user", "content": "hi"}]});
    common::http_client()
        .post(format!("{}/chat/completions", vllm.base_url()))
        .json(&body)
        .send()
        .await
        .unwrap()
}

#[crate::common::test]
async fn vllm_sleeps_in_mode_abort_unless_told_to_wait() {
    let gpu = Gpu::new(2);
    let paced = |name: &str| VllmOptions::new(name).paced(10, Duration::from_millis(40));
    let a = FakeVllm::start(&gpu, paced("alpha")).await;
    let b = FakeVllm::start(&gpu, paced("beta")).await;

    // No mode: the stream in flight is cut with `abort`.
    let streaming = chat_stream(&a, "alpha").await;
    let reading = tokio::spawn(stream_text(streaming));
    tokio::time::sleep(Duration::from_millis(100)).await;
    let slept = common::http_client()
        .post(format!("{}/sleep", a.root()))
        .send()
        .await
        .unwrap();
    assert_eq!(slept.status(), 200);
    let (content, finishes) = reading.await.unwrap();
    assert_eq!(finishes, ["abort"]);
    assert!(!content.contains("w9"), "{content}");
    assert!(a.is_sleeping());

    // mode=wait: the stream completes whole, then the server sleeps.
    let streaming = chat_stream(&b, "beta").await;
    let reading = tokio::spawn(stream_text(streaming));
    tokio::time::sleep(Duration::from_millis(100)).await;
    common::http_client()
        .post(format!("{}/sleep?level=1&mode=wait", b.root()))
        .send()
        .await
        .unwrap();
    let (content, finishes) = reading.await.unwrap();
    assert_eq!(finishes, ["stop"]);
    assert!(content.ends_with(" w9"), "{content}");
    let events = gpu.events();
    let sleeps: Vec<&VllmEvent> = events
        .iter()
        .filter(|e| matches!(e, VllmEvent::Sleep { .. }))
        .collect();
    assert_eq!(
        sleeps,
        [
            &VllmEvent::Sleep {
                server: "alpha".into(),
                level: "1".into(),
                mode: "abort".into()
            },
            &VllmEvent::Sleep {
                server: "beta".into(),
                level: "1".into(),
                mode: "wait".into()
            },
        ]
    );
    assert!(events.contains(&VllmEvent::AbortedInFlight {
        server: "alpha".into()
    }));
    assert!(!events.contains(&VllmEvent::AbortedInFlight {
        server: "beta".into()
    }));
    assert!(gpu.awake().is_empty());
}

#[crate::common::test]
async fn vllm_answers_wake_up_before_it_is_awake_and_aborts_requests_meanwhile() {
    let gpu = Gpu::new(1);
    let options = VllmOptions {
        wake_time: Duration::from_millis(500),
        ..VllmOptions::new("alpha").asleep()
    };
    let a = FakeVllm::start(&gpu, options).await;
    // Asleep, it still lists its model and window.
    let models = get(&format!("{}/models", a.base_url())).await;
    assert_eq!(models["data"][0]["id"], "alpha");
    assert_eq!(models["data"][0]["max_model_len"], 8_192);
    // A request to it is "answered": no text, finish_reason abort, status 200.
    let response = chat_stream(&a, "alpha").await;
    assert_eq!(response.status(), 200);
    assert_eq!(
        stream_text(response).await,
        (String::new(), vec!["abort".to_owned()])
    );

    let woke = common::http_client()
        .post(format!("{}/wake_up", a.root()))
        .send()
        .await
        .unwrap();
    assert_eq!(woke.status(), 200);
    let sleeping = get(&format!("{}/is_sleeping", a.root())).await;
    assert_eq!(
        sleeping,
        json!({"is_sleeping": true}),
        "answered before ready"
    );
    let whole = post(
        &format!("{}/chat/completions", a.base_url()),
        json!({"model": "alpha", "messages": [{"role": "user", "content": "hi"}]}),
    )
    .await;
    assert_eq!(whole["choices"][0]["finish_reason"], "abort");
    assert_eq!(whole["choices"][0]["message"]["content"], "");
    eventually("the wake finishes", || !a.is_sleeping()).await;
    let response = chat_stream(&a, "alpha").await;
    let (content, finishes) = stream_text(response).await;
    assert_eq!(content, "Hello from alpha.");
    assert_eq!(finishes, ["stop"]);
    let aborted = gpu
        .events()
        .iter()
        .filter(|e| matches!(e, VllmEvent::AbortedAsleep { .. }))
        .count();
    assert_eq!(aborted, 2);
}

#[crate::common::test]
async fn waking_more_vllm_servers_than_the_gpu_holds_is_an_out_of_memory_failure() {
    let gpu = Gpu::new(1);
    let _a = FakeVllm::start(&gpu, VllmOptions::new("alpha")).await;
    let b = FakeVllm::start(&gpu, VllmOptions::new("beta").asleep()).await;
    let woke = common::http_client()
        .post(format!("{}/wake_up", b.root()))
        .send()
        .await
        .unwrap();
    assert_eq!(woke.status(), 200, "the answer comes before the failure");
    eventually("the wake fails", || !gpu.out_of_memory().is_empty()).await;
    assert_eq!(
        gpu.out_of_memory(),
        [VllmEvent::OutOfMemory {
            server: "beta".into(),
            awake: vec!["alpha".into()]
        }]
    );
    assert!(b.is_sleeping());
    assert_eq!(gpu.most_awake(), 1);
}
