//! The official `openai` and `anthropic` Python packages drive a real edge, unchanged: the
//! edge runs in-process on port 0 with a mock node over real TCP whose targets are named
//! after its scripted behaviours, and `tests/python/sdk_clients.py` (run by the venv of
//! `tests/common/python.rs`) calls embeddings, Responses, chat with tools and reasoning,
//! and Anthropic Messages, and checks both SDKs' exception types. It asserts everything
//! itself and exits non-zero on the first failure.

use crate::api_support;
use crate::common;

use std::path::Path;
use std::time::Duration;

use api_support::Edge;
use common::python::python;

/// How long the script may take (the venv is installed before it starts).
const SCRIPT_PATIENCE: Duration = Duration::from_secs(120);

const API_KEY: &str = "sk-edge-sdk-test";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_official_openai_and_anthropic_sdks_work_unchanged() {
    // Installing the venv may take a while the first time; keep it off the runtime.
    let python = tokio::task::spawn_blocking(python).await.expect("venv");
    let edge = Edge::start(&format!("[api]\nkeys = [\"{API_KEY}\"]\n")).await;
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/python/sdk_clients.py");
    let run = tokio::process::Command::new(&python)
        .arg(&script)
        .arg(format!("http://{}", edge.app.http_addr))
        .arg(API_KEY)
        // The SDKs must talk to the edge only: no proxies, no ambient settings.
        .env_remove("OPENAI_BASE_URL")
        .env_remove("OPENAI_API_KEY")
        .env_remove("ANTHROPIC_BASE_URL")
        .env_remove("ANTHROPIC_API_KEY")
        .env_remove("ANTHROPIC_AUTH_TOKEN")
        .env("NO_PROXY", "*")
        .kill_on_drop(true)
        .output();
    let output = tokio::time::timeout(SCRIPT_PATIENCE, run)
        .await
        .expect("the script finished in time")
        .expect("the script ran");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "{} failed ({}):\nstdout:\n{stdout}\nstderr:\n{stderr}",
        script.display(),
        output.status
    );
    assert!(
        stdout.starts_with("ok"),
        "stdout:\n{stdout}\nstderr:\n{stderr}"
    );
    edge.stop().await;
}
