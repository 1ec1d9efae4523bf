//! The operator console (`/console/`) in a real browser: Debian's chromium, driven through
//! Selenium and `/usr/bin/chromedriver` by `tests/python/browser.py`, against an edge on
//! port 0 with nodes over real TCP. The test acts on the edge (a node connects, a run is
//! started through the model API, the node sends events) between browser steps and checks
//! what the page shows against what happened.
//!
//! With `EDGE_CONSOLE_SCREENSHOTS=1` each page is also saved to `docs/console/*.png`.
//! Every browser wait is bounded (`browser.py`'s patience), so a hang fails the test.

use crate::admin_support;
use crate::common;

use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use admin_support::{ADMIN_KEY, API_KEY, HandNode, get_ok, nodes_config};
use common::python::client_script;
use common::{TestApp, spawn_app};
use edge::domain::{RunEventKind, Usage};
use edge::ports::NodeCommand;
use edge::ports::clock::now_ms;
use reqwest::StatusCode;
use reqwest::header::CONTENT_TYPE;
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader, Lines};
use tokio::process::{Child, ChildStdin, ChildStdout};

/// How long one browser command may take (its own waits are shorter).
const STEP: Duration = Duration::from_secs(60);

/// A headless chromium, one command at a time.
struct Browser {
    child: Child,
    stdin: ChildStdin,
    stdout: Lines<BufReader<ChildStdout>>,
    base: String,
}

impl Browser {
    /// Starts the browser for the console of `app`.
    async fn start(app: &TestApp) -> Self {
        let browser_script =
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(".ci/clients/browser.sh");
        let installed = tokio::process::Command::new("bash")
            .arg(&browser_script)
            .stdout(Stdio::null())
            .status()
            .await
            .expect("run .ci/clients/browser.sh");
        assert!(
            installed.success(),
            "chromium and chromedriver are installed"
        );
        // Not killed when dropped: a test that fails drops its `Browser`, and the script then
        // reads the end of its input and quits chromium (killed, it would leave chromium and
        // chromedriver running).
        let mut child = client_script("browser.py", &[])
            .await
            .kill_on_drop(false)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("start browser.py");
        let stdin = child.stdin.take().expect("stdin");
        let stdout = BufReader::new(child.stdout.take().expect("stdout")).lines();
        let mut browser = Self {
            child,
            stdin,
            stdout,
            base: format!("http://{}", app.admin_addr),
        };
        assert_eq!(browser.answer().await, "ready");
        browser
    }

    async fn answer(&mut self) -> Value {
        let line = tokio::time::timeout(STEP, self.stdout.next_line())
            .await
            .expect("the browser answered in time")
            .expect("read the browser's answer")
            .expect("the browser is still running");
        let answer: Value = serde_json::from_str(&line).expect("a JSON answer");
        assert_eq!(answer["ok"], true, "browser: {}", answer["error"]);
        answer["value"].clone()
    }

    async fn call(&mut self, command: Value) -> Value {
        let line = format!("{command}\n");
        self.stdin
            .write_all(line.as_bytes())
            .await
            .expect("send a browser command");
        self.answer().await
    }

    /// Opens `path` on the management listener.
    async fn open(&mut self, path: &str) {
        let url = format!("{}{path}", self.base);
        self.call(json!({"op": "open", "url": url})).await;
    }

    /// Waits until an element matching `css` shows `text`; returns its whole text.
    async fn wait_text(&mut self, css: &str, text: &str) -> String {
        let value = self
            .call(json!({"op": "wait_text", "css": css, "text": text}))
            .await;
        value.as_str().unwrap_or_default().to_owned()
    }

    async fn click(&mut self, css: &str) {
        self.call(json!({"op": "click", "css": css})).await;
    }

    async fn type_into(&mut self, css: &str, text: &str) {
        self.call(json!({"op": "type", "css": css, "text": text}))
            .await;
    }

    async fn count(&mut self, css: &str) -> u64 {
        let value = self.call(json!({"op": "count", "css": css})).await;
        value.as_u64().unwrap_or_default()
    }

    /// Signs in with `key`.
    async fn sign_in(&mut self, key: &str) {
        self.type_into("#key", key).await;
        self.click("#sign-in-button").await;
    }

    /// Saves the page to `docs/console/<name>.png` when `EDGE_CONSOLE_SCREENSHOTS=1`.
    async fn screenshot(&mut self, name: &str) {
        if std::env::var("EDGE_CONSOLE_SCREENSHOTS").as_deref() != Ok("1") {
            return;
        }
        let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("docs/console");
        std::fs::create_dir_all(&dir).expect("create docs/console");
        let path = dir.join(format!("{name}.png"));
        self.call(json!({"op": "screenshot", "path": path})).await;
    }

    async fn size(&mut self, width: u32, height: u32) {
        self.call(json!({"op": "size", "width": width, "height": height}))
            .await;
    }

    async fn quit(mut self) {
        let _ = self.stdin.write_all(b"{\"op\": \"quit\"}\n").await;
        let _ = tokio::time::timeout(STEP, self.child.wait()).await;
    }
}

/// The hour since the epoch, UTC: the usage chart's default bucket.
fn utc_hour() -> u64 {
    now_ms() / 3_600_000
}

/// A streamed chat completion of `echo/default` through the model API, left running.
fn chat(app: &TestApp, text: &str) -> tokio::task::JoinHandle<()> {
    let url = format!("http://{}/v1/chat/completions", app.http_addr);
    let body = json!({
        "model": "echo/default",
        "stream": true,
        "messages": [{"role": "user", "content": text}],
    });
    tokio::spawn(async move {
        let response = admin_support::client()
            .post(url)
            .bearer_auth(API_KEY)
            .json(&body)
            .send()
            .await
            .expect("the model API answers");
        let _ = response.bytes().await;
    })
}

const NODE_A: &str = "[data-node=\"node-a\"]";

#[crate::common::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_fleet_page_signs_in_shows_a_node_connecting_and_drains_and_resumes_it() {
    let app = spawn_app(&nodes_config("")).await;
    let mut browser = Browser::start(&app).await;
    browser.open("/console/").await;
    browser.wait_text("#sign-in h1", "Sign in").await;

    // A wrong key (an API key is one) is refused, visibly, and opens nothing.
    browser.sign_in(API_KEY).await;
    browser
        .wait_text("#sign-in-error", "This admin key was refused")
        .await;
    assert_eq!(browser.count("#nav:not([hidden])").await, 0);
    assert_eq!(browser.count("[data-node]").await, 0);
    browser.screenshot("sign-in-refused").await;

    browser.sign_in(ADMIN_KEY).await;
    browser
        .wait_text(&format!("{NODE_A} .state"), "disconnected")
        .await;
    browser
        .wait_text("[data-node=\"node-b\"] .state", "disconnected")
        .await;

    // The node connects: the page shows it serving, its version and what it serves.
    let mut node = HandNode::register(&app, "token-a").await;
    app.wait_for_nodes(1).await;
    node.report_available(&[("echo", "default")]).await;
    browser
        .wait_text(&format!("{NODE_A} .state"), "serving")
        .await;
    browser
        .wait_text(&format!("{NODE_A} .targets"), "available")
        .await;
    browser.wait_text(NODE_A, "0 / 2 runs").await;
    browser
        .wait_text(&format!("{NODE_A} [data-f=\"breaker\"]"), "closed")
        .await;
    browser.screenshot("fleet").await;

    // Drain with a deadline from the page: the edge has it, and the page shows it.
    browser
        .type_into(&format!("{NODE_A} input[data-f=\"deadline\"]"), "300")
        .await;
    browser
        .click(&format!("{NODE_A} button[data-action=\"drain\"]"))
        .await;
    browser
        .wait_text(&format!("{NODE_A} .state"), "drained")
        .await;
    browser
        .wait_text(&format!("{NODE_A} [data-f=\"drain\"]"), "deadline")
        .await;
    let drained = get_ok(&app, "/admin/v1/nodes/node-a").await;
    assert_eq!(drained["state"], "drained");
    let drain = &drained["drain"];
    let deadline = drain["deadline_ms"].as_u64().expect("a deadline");
    let since = drain["since_ms"].as_u64().expect("a start");
    assert_eq!(deadline - since, 300_000, "{drain}");
    browser.screenshot("fleet-drained").await;

    browser
        .click(&format!("{NODE_A} button[data-action=\"resume\"]"))
        .await;
    browser
        .wait_text(&format!("{NODE_A} .state"), "serving")
        .await;
    assert_eq!(
        get_ok(&app, "/admin/v1/nodes/node-a").await["state"],
        "serving"
    );

    // The same page on a phone's screen.
    browser.size(390, 844).await;
    browser
        .wait_text(&format!("{NODE_A} .state"), "serving")
        .await;
    browser.screenshot("fleet-phone").await;

    browser.quit().await;
    app.stop().await;
}

#[crate::common::test(flavor = "multi_thread", worker_threads = 2)]
async fn runs_appear_live_their_events_follow_and_cancel_reaches_the_node() {
    let app = spawn_app(&nodes_config("")).await;
    let mut node = HandNode::register(&app, "token-a").await;
    app.wait_for_nodes(1).await;
    let mut browser = Browser::start(&app).await;
    browser.open("/console/#/runs").await;
    browser.sign_in(ADMIN_KEY).await;
    browser.wait_text("h1", "Runs").await;

    // A run that completes, for the list and the charts.
    let first = chat(&app, "one");
    let done = node.next_run().await;
    node.complete(&done.run_id, "one").await;
    common::bounded("the first chat to end", first)
        .await
        .expect("the first chat ends");
    let done_row = format!("#runs tr[data-run=\"{}\"]", done.run_id);
    browser.wait_text(&done_row, "completed").await;

    // A run started through the API appears, open, without reloading the page.
    let second = chat(&app, "two");
    let open = node.next_run().await;
    let id = open.run_id.clone();
    let open_row = format!("#runs tr[data-run=\"{id}\"]");
    browser.wait_text(&open_row, "open").await;
    browser.wait_text("#runs tr:first-child", id.as_str()).await;
    browser.screenshot("runs").await;
    browser.size(390, 844).await;
    browser.wait_text(&open_row, "open").await;
    browser.screenshot("runs-phone").await;
    browser.size(1280, 900).await;

    // Its page replays what happened and follows what happens next.
    browser.click(&format!("{open_row} a")).await;
    browser.wait_text("#run-outcome", "open").await;
    node.send(&id, RunEventKind::Started).await;
    browser.wait_text("#events", "started").await;
    node.send(&id, RunEventKind::text("hello from node-a"))
        .await;
    browser.wait_text("#events", "hello from node-a").await;
    browser.wait_text("#attempts", "node-a").await;
    browser.screenshot("run").await;

    // Cancel from the page: the node is told, and its answer ends the run.
    browser.click("#cancel").await;
    browser.wait_text("#run-notice", "Cancel sent").await;
    match node.next_command().await {
        NodeCommand::Cancel { run_id, .. } => assert_eq!(run_id, id),
        other => panic!("expected a cancel, got {other:?}"),
    }
    node.send(&id, RunEventKind::cancelled("cancelled by the operator"))
        .await;
    browser.wait_text("#events", "cancelled").await;
    browser.wait_text("#run-outcome", "cancelled").await;
    browser.wait_text("#feed-state", "complete").await;
    assert_eq!(browser.count("#cancel:not([hidden])").await, 0);
    common::bounded("the second chat to end", second)
        .await
        .expect("the second chat ends");

    // The list shows both ends; a filter narrows it.
    browser.open("/console/#/runs?outcome=cancelled").await;
    browser.wait_text(&open_row, "cancelled").await;
    assert_eq!(browser.count(&done_row).await, 0);

    // The API key filter the page offers: both runs came with the first API key.
    let by_key = get_ok(&app, "/admin/v1/runs?key=key-1").await;
    assert_eq!(by_key["runs"].as_array().map(Vec::len), Some(2), "{by_key}");
    let other = get_ok(&app, "/admin/v1/runs?key=key-2").await;
    assert_eq!(other["runs"].as_array().map(Vec::len), Some(0), "{other}");

    // The charts draw what /admin/v1/stats holds: two runs started, one completed, one
    // cancelled.
    let stats = get_ok(&app, "/admin/v1/stats").await;
    let sum = |field: &str| -> u64 {
        stats["edge"]
            .as_array()
            .expect("edge points")
            .iter()
            .map(|p| p[field].as_u64().unwrap_or_default())
            .sum()
    };
    assert_eq!(
        (sum("started"), sum("completed"), sum("cancelled")),
        (2, 1, 1)
    );
    assert_eq!(stats["nodes"][0]["node"], "node-a");
    browser.open("/console/#/charts").await;
    browser
        .wait_text("figure[data-chart=\"requests\"]", "Requests")
        .await;
    assert!(browser.count("figure.chart svg path").await >= 3);
    browser.screenshot("charts").await;

    browser.quit().await;
    app.stop().await;
}

#[crate::common::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_admin_keys_on_loopback_the_console_opens_as_the_api_does() {
    let open = nodes_config("").replace(&format!("keys = [\"{ADMIN_KEY}\"]\n"), "");
    let app = spawn_app(&open).await;
    let mut browser = Browser::start(&app).await;
    browser.open("/console/").await;
    browser.wait_text("#access", "needs no admin key").await;
    browser
        .wait_text(&format!("{NODE_A} .state"), "disconnected")
        .await;
    assert_eq!(browser.count("#sign-in:not([hidden])").await, 0);
    browser.quit().await;
    app.stop().await;
}

#[crate::common::test]
async fn the_console_is_served_beside_the_management_api_only() {
    let app = spawn_app(&nodes_config("")).await;
    let get = |url: String| async move {
        let response = admin_support::client()
            .get(url)
            .send()
            .await
            .expect("an answer");
        let headers = response.headers().clone();
        (
            response.status(),
            headers,
            response.text().await.expect("a body"),
        )
    };
    // Assets need no key (they hold none); everything they show comes from /admin/v1.
    let (status, headers, page) = get(format!("http://{}/console/", app.admin_addr)).await;
    assert_eq!(status, StatusCode::OK);
    assert!(
        page.contains("<script type=\"module\" src=\"app.js\">"),
        "{page}"
    );
    let policy = headers["content-security-policy"].to_str().expect("ASCII");
    assert!(policy.contains("default-src 'none'") && policy.contains("connect-src 'self'"));
    let (status, headers, _) = get(format!("http://{}/console/app.js", app.admin_addr)).await;
    assert_eq!(status, StatusCode::OK);
    assert!(
        headers[CONTENT_TYPE]
            .to_str()
            .is_ok_and(|t| t.starts_with("text/javascript"))
    );
    let (status, _, _) = get(format!("http://{}/console/nope.js", app.admin_addr)).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    let redirect = admin_support::client()
        .get(format!("http://{}/console", app.admin_addr))
        .send()
        .await
        .expect("an answer");
    assert_eq!(redirect.url().path(), "/console/", "followed the redirect");
    // Not on the model API's listener unless the management API is.
    let (status, _, _) = get(format!("http://{}/console/", app.http_addr)).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    app.stop().await;

    let shared = nodes_config("").replace("[admin]\n", "[admin]\non_http_listener = true\n");
    let app = spawn_app(&shared).await;
    let (status, _, page) = get(format!("http://{}/console/", app.http_addr)).await;
    assert_eq!(status, StatusCode::OK);
    assert!(page.contains("edge console"));
    app.stop().await;
}

/// Runs `text` through the model API on `node` and ends it with `end`.
async fn run_to_end(app: &TestApp, node: &mut HandNode, text: &str, end: RunEventKind) {
    let chat = chat(app, text);
    let run = node.next_run().await;
    node.send(&run.run_id, RunEventKind::Started).await;
    node.send(&run.run_id, end).await;
    common::bounded(format!("the chat `{text}` to end"), chat)
        .await
        .expect("the chat ends");
}

#[crate::common::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_usage_page_shows_the_tokens_runs_used_by_key_and_model() {
    let app = spawn_app(&nodes_config("")).await;
    let mut node = HandNode::register(&app, "token-a").await;
    app.wait_for_nodes(1).await;
    // Two runs with known token counts, and one that fails (an error, no tokens).
    let usage = |input, cached, output, reasoning| RunEventKind::Completed {
        finish_reason: "stop".into(),
        usage: Some(Usage {
            input_tokens: input,
            output_tokens: output,
            cached_input_tokens: cached,
            reasoning_tokens: reasoning,
        }),
    };
    let hour_before = utc_hour();
    run_to_end(&app, &mut node, "one", usage(120, 90, 30, 7)).await;
    run_to_end(&app, &mut node, "two", usage(80, 10, 25, 0)).await;
    run_to_end(
        &app,
        &mut node,
        "three",
        RunEventKind::failed("boom", "it broke"),
    )
    .await;
    let crossed_an_hour = utc_hour() != hour_before;
    let report = get_ok(&app, "/admin/v1/usage?group_by=key,model&since=24h").await;
    assert_eq!(report["totals"]["input_tokens"], 200, "{report}");

    let mut browser = Browser::start(&app).await;
    browser.open("/console/#/usage").await;
    browser.sign_in(ADMIN_KEY).await;
    browser.wait_text("h1", "Usage").await;
    let row = "#usage tbody tr[data-key=\"key-1\"][data-model=\"echo/default\"]";
    browser
        .wait_text(&format!("{row} td[data-f=\"runs\"]"), "3")
        .await;
    let expected = [
        ("runs", "3"),
        ("input_tokens", "200"),
        ("cached_input_tokens", "100"),
        ("output_tokens", "55"),
        ("reasoning_tokens", "7"),
        ("errors", "1"),
        ("cache_hit_rate", "50.0 %"),
    ];
    for scope in [row, "#usage tfoot tr"] {
        for (field, value) in expected {
            let css = format!("{scope} td[data-f=\"{field}\"]");
            let shown = browser.call(json!({"op": "text", "css": css})).await;
            assert_eq!(shown, value, "{css}");
        }
    }
    assert_eq!(browser.count("#usage tbody tr").await, 1);
    // The chart has a bar of input and one of output in the current bucket (in two
    // buckets, when the runs straddled the turn of an hour).
    let bars = browser
        .count("figure[data-chart=\"usage-tokens\"] rect")
        .await;
    assert!(bars == 2 || crossed_an_hour && bars == 4, "{bars} bars");
    browser.screenshot("usage").await;

    // Split by node instead: the same totals, on node-a.
    browser.click("#usage-filters input[value=\"key\"]").await;
    browser.click("#usage-filters input[value=\"model\"]").await;
    browser.click("#usage-filters input[value=\"node\"]").await;
    browser
        .wait_text(
            "#usage tbody tr[data-node=\"node-a\"] td[data-f=\"input_tokens\"]",
            "200",
        )
        .await;
    // And by affinity source: the chats are keyed by their prompts' prefixes.
    browser
        .click("#usage-filters input[value=\"affinity\"]")
        .await;
    browser
        .wait_text(
            "#usage tbody tr[data-node=\"node-a\"][data-affinity=\"prefix\"] td[data-f=\"input_tokens\"]",
            "200",
        )
        .await;
    browser.size(390, 844).await;
    browser.wait_text("#usage tfoot", "Total").await;
    browser.screenshot("usage-phone").await;

    browser.quit().await;
    app.stop().await;
}

#[crate::common::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_models_page_lists_each_model_by_node_and_state() {
    let app = spawn_app(&nodes_config("")).await;
    let mut node = HandNode::register(&app, "token-a").await;
    app.wait_for_nodes(1).await;
    node.report_available(&[("echo", "default")]).await;
    admin_support::admin_until(&app, "/admin/v1/models", "echo/default is listed", |list| {
        list["models"][0]["nodes"][0]["node"] == "node-a"
    })
    .await;

    let mut browser = Browser::start(&app).await;
    browser.open("/console/").await;
    browser.sign_in(ADMIN_KEY).await;
    browser.click("#nav a[data-page=\"models\"]").await;
    browser.wait_text("h1", "Models").await;
    // What /admin/v1/models says: echo/default, loaded on node-a, whose engine the edge does
    // not manage (so no load or unload is offered).
    let row = "#models tr[data-model=\"echo/default\"][data-node=\"node-a\"]";
    browser
        .wait_text(&format!("{row} [data-f=\"state\"]"), "loaded")
        .await;
    browser
        .wait_text(&format!("{row} [data-f=\"managed\"]"), "no")
        .await;
    browser
        .wait_text(&format!("{row} [data-f=\"in_flight\"]"), "0")
        .await;
    assert_eq!(browser.count("#models tbody tr").await, 1);
    assert_eq!(browser.count(&format!("{row} button")).await, 0);
    browser
        .wait_text("#model-events", "No load or unload since the edge started")
        .await;
    browser.screenshot("models").await;

    browser.quit().await;
    app.stop().await;
}
