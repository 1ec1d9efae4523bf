//! Usage, budgets and token metrics against a real edge: the usage API's totals equal the
//! sums of the `usage` objects the official SDKs received (chat, completions, Responses,
//! Messages, streamed and whole, a cancel and a failover) plus what a cancelled and a failed
//! stream produced (the output the client saw), split by affinity source too (each
//! source's cache hit rate the ratio of the Prometheus counters with its label), the
//! Prometheus token counters agree, a key's token budget refuses exactly the requests past it (in turn and at once),
//! and the rollups and the budget state survive `kill -9` of a real `edge serve`.

use crate::admin_crash::{CONFIG as CRASH_CONFIG, Edge as Process, get, start_edge};
use crate::admin_support;
use crate::api_support::{self, Edge};
use crate::common;
use crate::metrics::scrape;
use crate::mock_node;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::Duration;

use common::python::run_client_script;
use common::{PATIENCE, TestApp, eventually_ok, spawn_app, write_config};
use edge::ports::clock::now_ms;
use mock_node::{Behaviour, MockNode, MockOptions};
use reqwest::StatusCode;
use serde_json::{Value, json};

const KEY: &str = "sk-usage-team-a";

/// Two nodes serving `echo/default`, `echo/reasoning`, `echo/hang`, `echo/stall` and
/// `echo/fail`; one API key.
fn two_nodes() -> String {
    let node = |id: &str, token: &str| {
        format!(
            "[[nodes]]\nid = \"{id}\"\nalias = \"gpu-{id}\"\ntoken = \"{token}\"\n[nodes.runtime]\nmax_concurrent_runs = 16\nheartbeat_interval_ms = 60000\n[[nodes.adapters]]\nname = \"echo\"\ntargets = [\"default\", \"reasoning\", \"hang\", \"stall\", \"fail\"]\n"
        )
    };
    format!(
        "[[api.keys]]\nkey = \"{KEY}\"\nname = \"team-a\"\n{}\n{}",
        node("node-a", "token-a"),
        node("node-b", "token-b")
    )
}

/// The usage API's answer to `query`.
async fn usage(admin: SocketAddr, query: &str) -> Value {
    get(admin, &format!("/admin/v1/usage?{query}")).await
}

/// The one row of `report` whose `key` is `key`.
fn row_of<'a>(report: &'a Value, key: &str) -> &'a Value {
    report["rows"]
        .as_array()
        .and_then(|rows| rows.iter().find(|r| r["key"] == key))
        .unwrap_or_else(|| panic!("no row for {key}: {report}"))
}

#[crate::common::test(flavor = "multi_thread", worker_threads = 2)]
async fn usage_totals_equal_the_usage_the_official_sdks_received() {
    let app = spawn_app(&two_nodes()).await;
    let refusing = MockOptions {
        behaviour: Behaviour::Refused,
        ..MockOptions::new("token-a")
    };
    let node_a = MockNode::start(app.node_addr, refusing)
        .await
        .expect("node-a");
    let node_b = MockNode::start(app.node_addr, MockOptions::new("token-b"))
        .await
        .expect("node-b");
    app.wait_for_nodes(2).await;
    let base = format!("http://{}", app.http_addr);
    let stdout = run_client_script("usage_clients.py", &[&base, KEY]).await;
    let sdk: Value = stdout
        .lines()
        .nth(1)
        .and_then(|line| serde_json::from_str(line).ok())
        .unwrap_or_else(|| panic!("the script's totals: {stdout}"));
    assert!(sdk["cached"].as_u64() > Some(0), "{sdk}");

    // The cancelled run ends once its node answers the cancel: wait for every run.
    let report = eventually_ok("every run is counted", || async {
        let report = usage(app.admin_addr, "group_by=key").await;
        let row = row_of(&report, "team-a").clone();
        if row["runs"] == sdk["runs"] {
            Ok(report)
        } else {
            Err(format!("{report}"))
        }
    })
    .await;
    let row = row_of(&report, "team-a");
    for (api, sdk_name) in [
        ("input_tokens", "input"),
        ("cached_input_tokens", "cached"),
        ("output_tokens", "output"),
    ] {
        assert_eq!(row[api], sdk[sdk_name], "{api}: {report}");
    }
    let rate = row["cache_hit_rate"].as_f64().expect("a hit rate");
    let expected = sdk["cached"].as_f64().unwrap() / sdk["input"].as_f64().unwrap();
    assert!((rate - expected).abs() < 1e-9, "{rate} vs {expected}");
    assert_eq!(report["totals"]["runs"], sdk["runs"], "{report}");
    // The one failure is the run that failed after output; its output is in the sums.
    assert_eq!(row["errors"], 1, "{report}");

    // The failover: a run placed on node-a first, refused there, finished on node-b.
    let runs = get(app.admin_addr, "/admin/v1/runs?limit=100").await;
    let failed_over = runs["runs"]
        .as_array()
        .unwrap()
        .iter()
        .any(|r| r["attempts"].as_array().map(Vec::len) == Some(2) && r["node"] == "node-b");
    assert!(failed_over, "{runs}");
    let by_node = usage(app.admin_addr, "group_by=node,model&bucket=minute").await;
    let tokens_on_a: u64 = rows_where(&by_node, "node", "node-a")
        .map(|r| r["output_tokens"].as_u64().unwrap_or(0))
        .sum();
    let default_on_a = rows_where(&by_node, "node", "node-a").any(|r| r["model"] == "echo/default");
    assert!(
        !default_on_a,
        "node-a never finished echo/default: {by_node}"
    );
    assert!(tokens_on_a < sdk["output"].as_u64().unwrap(), "{by_node}");

    token_metrics_agree(&app, &sdk).await;
    let by_affinity = usage_by_affinity_agrees(&app, &sdk).await;
    cli_agrees(
        app.admin_addr,
        "affinity",
        &by_affinity,
        "prompt_cache_key ",
    )
    .await;
    node_a.kill();
    node_b.kill();
    app.stop().await;
}

fn rows_where<'a>(
    report: &'a Value,
    field: &'a str,
    value: &'a str,
) -> impl Iterator<Item = &'a Value> {
    report["rows"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(move |r| r[field] == value)
}

/// The Prometheus token counters, summed over their labels, equal the SDKs' sums; their
/// labels name the key, the model, the node and the affinity key's source.
async fn token_metrics_agree(app: &TestApp, sdk: &Value) {
    let scrape = scrape(&api_support::client(), app).await;
    for (metric, sdk_name) in [
        ("edge_input_tokens_total", "input"),
        ("edge_cached_input_tokens_total", "cached"),
        ("edge_output_tokens_total", "output"),
    ] {
        let samples = scrape.all(metric);
        let sum: f64 = samples.values().sum();
        assert_eq!(Some(sum), sdk[sdk_name].as_f64(), "{metric}: {samples:?}");
        let labels: BTreeMap<&str, Vec<&str>> = ["key", "node", "affinity"]
            .into_iter()
            .map(|name| {
                let values = samples
                    .keys()
                    .filter_map(|l| l.get(name))
                    .map(String::as_str);
                (name, values.collect())
            })
            .collect();
        assert!(labels["key"].iter().all(|k| *k == "team-a"), "{labels:?}");
        assert!(labels["node"].contains(&"node-b"), "{labels:?}");
        // Completions carry no key; chat is keyed by its prompt's prefix.
        assert!(labels["affinity"].contains(&"none"), "{labels:?}");
        assert!(labels["affinity"].contains(&"prefix"), "{labels:?}");
    }
}

/// The usage API split by affinity source has a row per source the SDK calls were keyed
/// from, with their sums; each row's cache hit rate is the ratio of the Prometheus
/// counters with the same `affinity` label. Returns the report.
async fn usage_by_affinity_agrees(app: &TestApp, sdk: &Value) -> Value {
    let report = usage(app.admin_addr, "group_by=affinity").await;
    assert_eq!(report["group_by"], json!(["affinity"]), "{report}");
    let rows: BTreeMap<&str, &Value> = report["rows"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|r| (r["affinity"].as_str().unwrap_or("(absent)"), r))
        .collect();
    let expected = sdk["by_affinity"].as_object().expect("sums by source");
    let mut sources: Vec<&str> = expected.keys().map(String::as_str).collect();
    sources.sort_unstable();
    assert_eq!(
        rows.keys().copied().collect::<Vec<_>>(),
        sources,
        "{report}"
    );
    assert_eq!(
        sources,
        ["none", "prefix", "prompt_cache_key", "session", "user"]
    );
    let scrape = scrape(&api_support::client(), app).await;
    let by_label = |metric: &str, source: &str| -> f64 {
        let samples = scrape.all(metric);
        samples
            .iter()
            .filter(|(labels, _)| labels.get("affinity").map(String::as_str) == Some(source))
            .map(|(_, value)| value)
            .sum()
    };
    for (source, sums) in expected {
        let row = rows[source.as_str()];
        for (api, sdk_name) in [
            ("runs", "runs"),
            ("input_tokens", "input"),
            ("cached_input_tokens", "cached"),
            ("output_tokens", "output"),
        ] {
            assert_eq!(row[api], sums[sdk_name], "{source} {api}: {report}");
        }
        let input = by_label("edge_input_tokens_total", source);
        let cached = by_label("edge_cached_input_tokens_total", source);
        assert_eq!(Some(input), sums["input"].as_f64(), "{source}");
        let rate = row["cache_hit_rate"].as_f64().expect("a hit rate");
        assert!(
            (rate - cached / input).abs() < 1e-9,
            "{source}: {rate} vs {cached}/{input}"
        );
    }
    assert!(
        rows["user"]["cache_hit_rate"].as_f64() > Some(0.0),
        "{report}"
    );
    assert_eq!(rows["none"]["cache_hit_rate"], 0.0, "{report}");
    // Each run's record names the same source as the row that counted it.
    let listed = get(app.admin_addr, "/admin/v1/runs?state=finished&limit=1000").await;
    let mut records_by_source = BTreeMap::<&str, u64>::new();
    for run in listed["runs"].as_array().into_iter().flatten() {
        let source = run["affinity"].as_str().unwrap_or("none");
        *records_by_source.entry(source).or_default() += 1;
    }
    for (source, row) in &rows {
        assert_eq!(
            records_by_source.get(source).copied(),
            row["runs"].as_u64(),
            "{source}: {listed}"
        );
    }
    // Combined with another dimension: the same sums, split further.
    let by_key = usage(app.admin_addr, "group_by=key,affinity").await;
    let session = rows_where(&by_key, "affinity", "session")
        .map(|r| (r["key"].clone(), r["runs"].clone()))
        .collect::<Vec<_>>();
    assert_eq!(session, [(json!("team-a"), json!(1))], "{by_key}");
    report
}

/// A key with a daily budget of 100 tokens, one with 100 tokens and the `echo/hang` runs.
const BUDGETS: &str = r#"
[[api.keys]]
key = "sk-metered"
name = "metered"
budget_tokens_per_day = 100

[[api.keys]]
key = "sk-burst"
name = "burst"
budget_tokens_per_day = 100
"#;

/// How near the turn of the UTC day a budget test may start. Budgets are per UTC day: a
/// test the day turns under finds its key's spend started again (a CI run across midnight
/// saw all 16 requests of the flood admitted).
const DAY_TURN_MARGIN: Duration = Duration::from_secs(300);

/// Waits for the UTC day to turn when that is less than [`DAY_TURN_MARGIN`] away, so a
/// budget test runs within one day.
async fn within_one_utc_day() {
    const DAY_MS: u64 = 86_400_000;
    let left = Duration::from_millis(DAY_MS - now_ms() % DAY_MS);
    if left < DAY_TURN_MARGIN {
        tokio::time::sleep(left + Duration::from_secs(1)).await;
    }
}

/// A completion of `echo/default` as `key`: four words in, four out (8 tokens).
async fn complete(edge: &Edge, key: &str) -> reqwest::Response {
    let body = json!({"model": "echo/default", "prompt": "a b c d", "max_tokens": 4});
    edge.post("/v1/completions", &body)
        .bearer_auth(key)
        .send()
        .await
        .expect("a response")
}

/// Checks a 429 for the budget: the code and a `Retry-After` within the day.
fn assert_budget_refusal(status: StatusCode, retry_after: Option<u64>, code: &Value) {
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(code, "token_budget_exceeded");
    assert!(
        retry_after.is_some_and(|s| (1..=86_400).contains(&s)),
        "{retry_after:?}"
    );
}

fn retry_after(response: &reqwest::Response) -> Option<u64> {
    response
        .headers()
        .get("retry-after")?
        .to_str()
        .ok()?
        .parse()
        .ok()
}

#[crate::common::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_budget_reached_mid_flood_refuses_exactly_the_requests_past_it() {
    within_one_utc_day().await;
    let edge = Edge::start(BUDGETS).await;
    // In turn: run k is admitted while 8 × (k - 1) < 100, so 13 pass and the rest do not.
    let mut statuses = Vec::new();
    for _ in 0..16 {
        let response = complete(&edge, "sk-metered").await;
        let status = response.status();
        let after = retry_after(&response);
        let body: Value = response.json().await.expect("JSON");
        if status == StatusCode::OK {
            assert_eq!(body["usage"]["total_tokens"], 8, "{body}");
        } else {
            assert_budget_refusal(status, after, &body["error"]["code"]);
        }
        statuses.push(status.as_u16());
    }
    assert_eq!(statuses, [[200; 13].as_slice(), &[429; 3]].concat());
    // Every API answers in its own shape.
    let messages = json!({"model": "echo/default", "max_tokens": 4,
        "messages": [{"role": "user", "content": "hi"}]});
    let response = edge
        .post("/v1/messages", &messages)
        .header("x-api-key", "sk-metered")
        .send()
        .await
        .expect("a response");
    let after = retry_after(&response);
    let status = response.status();
    let body: Value = response.json().await.expect("JSON");
    assert_eq!(body["type"], "error", "{body}");
    assert_eq!(body["error"]["type"], "rate_limit_error", "{body}");
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS);
    assert!(after.is_some(), "{body}");
    let response = edge
        .post(
            "/v1/responses",
            &json!({"model": "echo/default", "input": "hi"}),
        )
        .bearer_auth("sk-metered")
        .send()
        .await
        .expect("a response");
    let (status, after) = (response.status(), retry_after(&response));
    let body: Value = response.json().await.expect("JSON");
    assert_budget_refusal(status, after, &body["error"]["code"]);

    // At once: six hanging runs reserving 30 each; 0, 30, 60 and 90 are under 100.
    let hanging = json!({"model": "echo/hang", "max_tokens": 30,
        "messages": [{"role": "user", "content": "wait"}]});
    let mut calls = tokio::task::JoinSet::new();
    for _ in 0..6 {
        let request = edge
            .post("/v1/chat/completions", &hanging)
            .bearer_auth("sk-burst");
        calls.spawn(async move { request.send().await.map(|r| r.status()) });
    }
    let mut refused = 0;
    while refused < 2 {
        let what = format!("a refused call of the burst ({refused} of 2 so far)");
        let status = common::bounded(what, calls.join_next())
            .await
            .expect("a call")
            .expect("joined");
        assert_eq!(status.ok(), Some(StatusCode::TOO_MANY_REQUESTS));
        refused += 1;
    }
    let open = eventually_ok("four runs are open", || async {
        let list = get(edge.app.admin_addr, "/admin/v1/runs?state=open").await;
        match list["runs"].as_array().map(Vec::len) {
            Some(4) => Ok(list),
            _ => Err(format!("{list}")),
        }
    })
    .await;
    assert!(
        open["runs"]
            .as_array()
            .unwrap()
            .iter()
            .all(|r| r["api_key_name"] == "burst")
    );
    // Dropping the callers cancels their runs; the reservations are released.
    calls.abort_all();
    edge.stop().await;
}

/// The `load` key, and `metered` with a daily budget of 100 tokens, for the node of
/// `admin_crash.rs` (serving `echo/default` and `echo/hang`).
const CRASH_KEYS: &str = r#"
[[api.keys]]
key = "sk-load"
name = "load"

[[api.keys]]
key = "sk-metered"
name = "metered"
budget_tokens_per_day = 100
"#;

async fn post_completion(http: SocketAddr, key: &str, model: &str) -> StatusCode {
    let body = json!({"model": model, "prompt": "a b c d", "max_tokens": 4});
    admin_support::client()
        .post(format!("http://{http}/v1/completions"))
        .bearer_auth(key)
        .json(&body)
        .send()
        .await
        .map_or(StatusCode::INTERNAL_SERVER_ERROR, |r| r.status())
}

/// The runs of `key` that ended, and their input tokens, as the journal's run records hold
/// them (runs open at the crash are `unknown`: they never ended, and count nowhere).
async fn journal_sums(admin: SocketAddr, key: &str) -> (u64, u64) {
    let list = get(admin, "/admin/v1/runs?state=finished&limit=1000").await;
    let runs = list["runs"].as_array().cloned().unwrap_or_default();
    let mine = runs
        .iter()
        .filter(|r| r["api_key_name"] == key && r["outcome"] != "unknown");
    mine.fold((0, 0), |(runs, input), r| {
        let tokens = r["usage"]["input_tokens"].as_u64().unwrap_or(0);
        (runs + 1, input + tokens)
    })
}

#[crate::common::test(flavor = "multi_thread", worker_threads = 2)]
async fn rollups_and_budgets_survive_kill_9_of_edge_serve() {
    within_one_utc_day().await;
    let dir = tempfile::tempdir().expect("tempdir");
    let config = write_config(dir.path(), &format!("{CRASH_KEYS}{CRASH_CONFIG}"));
    let mut edge: Process = start_edge(&config).await;
    let node = MockNode::start(edge.node, MockOptions::new("token-a"))
        .await
        .expect("the mock node registers");
    for k in 1..=14 {
        let status = post_completion(edge.http, "sk-metered", "echo/default").await;
        let expected = if k <= 13 { 200 } else { 429 };
        assert_eq!(status.as_u16(), expected, "request {k}");
    }
    for _ in 0..20 {
        assert_eq!(
            post_completion(edge.http, "sk-load", "echo/default").await,
            StatusCode::OK
        );
    }
    // Load in flight, and runs that never end, as the edge dies.
    let http = edge.http;
    for model in [
        "echo/hang",
        "echo/hang",
        "echo/default",
        "echo/default",
        "echo/default",
    ] {
        tokio::spawn(async move { post_completion(http, "sk-load", model).await });
    }
    eventually_ok("the hanging runs are open", || async {
        let list = get(edge.admin, "/admin/v1/runs?state=open").await;
        match list["runs"].as_array().map(Vec::len) {
            Some(n) if n >= 2 => Ok(()),
            _ => Err(format!("{list}")),
        }
    })
    .await;
    edge.child.start_kill().expect("kill -9");
    common::bounded("the edge process to exit after kill -9", edge.child.wait())
        .await
        .expect("the edge is gone");
    node.kill();

    let edge = start_edge(&config).await;
    let report = usage(edge.admin, "group_by=key").await;
    let metered = row_of(&report, "metered");
    assert_eq!(metered["runs"], 13, "{report}");
    assert_eq!(metered["input_tokens"], 52, "{report}");
    assert_eq!(metered["output_tokens"], 52, "{report}");
    // Every completed run of `load` is in the rollups, and nothing else.
    let load = row_of(&report, "load");
    let (runs, input) = journal_sums(edge.admin, "load").await;
    assert!(runs >= 20, "{runs}");
    assert_eq!(load["input_tokens"].as_u64(), Some(input), "{report}");
    assert_eq!(load["runs"].as_u64(), Some(runs), "{report}");
    // The budget state came back with them: `metered` is still over its budget.
    let node = MockNode::start(edge.node, MockOptions::new("token-a"))
        .await
        .expect("the mock node registers again");
    let status = post_completion(edge.http, "sk-metered", "echo/default").await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS);
    cli_agrees(edge.admin, "key", &report, "metered ").await;
    node.kill();
    drop(edge);
}

/// `edge usage --group-by GROUP --json` prints what the API answers (`report`, grouped by
/// `group`); the table has a column of the group, a line starting with `line`, and the
/// totals.
async fn cli_agrees(admin: SocketAddr, group: &str, report: &Value, line: &str) {
    let run = |json: bool| {
        let mut command = tokio::process::Command::new(env!("CARGO_BIN_EXE_edge"));
        command.args([
            "usage",
            "--admin",
            &format!("http://{admin}"),
            "--group-by",
            group,
        ]);
        if json {
            command.arg("--json");
        }
        command.env_remove("EDGE_ADMIN_KEY").kill_on_drop(true);
        async move {
            let output = tokio::time::timeout(PATIENCE, command.output())
                .await
                .expect("the CLI finished in time")
                .expect("the CLI ran");
            assert!(output.status.success(), "{output:?}");
            String::from_utf8(output.stdout).expect("UTF-8")
        }
    };
    let printed: Value = serde_json::from_str(&run(true).await).expect("JSON");
    assert_eq!(printed["totals"], report["totals"]);
    assert_eq!(printed["rows"], report["rows"]);
    let table = run(false).await;
    let lines: Vec<&str> = table.lines().collect();
    assert!(lines[0].starts_with(&group.to_uppercase()), "{table}");
    assert!(lines.iter().any(|l| l.starts_with(line)), "{table}");
    assert!(
        lines.last().is_some_and(|l| l.starts_with("total")),
        "{table}"
    );
}
