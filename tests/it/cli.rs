//! The `edge` command line: `check-config`, `token generate` and what `serve` asks of the
//! kernel for its threads, run as a real process.

use crate::common;

use std::process::{Command, Output};

use common::NodeTable;

fn edge(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_edge"))
        .args(args)
        .env_remove("RUST_LOG")
        .output()
        .expect("run edge")
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// Writes `contents` to a temporary file `file_name` and runs
/// `edge <command> --config <that file> <extra_args>`.
fn edge_on_config(command: &str, file_name: &str, contents: &str, extra_args: &[&str]) -> Output {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join(file_name);
    std::fs::write(&path, contents).expect("write config");
    let config = path.to_str().expect("utf-8 path");
    edge(&[&[command, "--config", config], extra_args].concat())
}

#[crate::common::test]
fn check_config_summarises_the_shipped_config_without_tokens() {
    let shipped = concat!(env!("CARGO_MANIFEST_DIR"), "/config/edge.toml");
    let output = edge(&["check-config", "--config", shipped]);
    let stdout = text(&output.stdout);
    assert!(output.status.success(), "stderr: {}", text(&output.stderr));
    assert!(stdout.contains("(valid)"), "{stdout}");
    assert!(stdout.contains("nodes: 2"), "{stdout}");
    assert!(stdout.contains("node-a (alias gpu-a)"), "{stdout}");
    assert!(stdout.contains("token <redacted>"), "{stdout}");
    assert!(!stdout.contains("CHANGE-ME"), "a token leaked: {stdout}");
}

#[crate::common::test]
fn check_config_on_a_broken_file_fails_and_names_every_offending_entry() {
    let broken = [
        NodeTable::new("node-a", "gpu-a", "shared-secret-token"),
        // nodes[1]: node-a's id again, and its token.
        NodeTable::new("node-a", "gpu-b", "shared-secret-token"),
        // nodes[2]: an empty token, and an alias that is node-a's id.
        NodeTable::new("node-c", "node-a", ""),
    ]
    .map(|node| node.echo(&["default"]).to_string())
    .join("\n");
    let output = edge_on_config("check-config", "broken.toml", &broken, &[]);
    let stderr = text(&output.stderr);
    assert!(!output.status.success());
    assert!(output.stdout.is_empty(), "nothing is printed as valid");
    assert!(stderr.contains("broken.toml"), "names the file: {stderr}");
    assert!(
        stderr.contains("nodes[1] (id \"node-a\")"),
        "names the duplicate: {stderr}"
    );
    assert!(stderr.contains("duplicate id"), "{stderr}");
    assert!(stderr.contains("same token"), "{stderr}");
    assert!(
        stderr.contains("nodes[2] (id \"node-c\")"),
        "names the third entry: {stderr}"
    );
    assert!(stderr.contains("`token` is empty"), "{stderr}");
    assert!(stderr.contains("is the id of"), "{stderr}");
    assert!(
        !stderr.contains("shared-secret-token"),
        "a token leaked: {stderr}"
    );
}

#[crate::common::test]
fn check_config_names_an_unknown_key() {
    let typo = "[server]\nlistn = \"127.0.0.1:7100\"\n";
    let output = edge_on_config("check-config", "typo.toml", typo, &[]);
    let stderr = text(&output.stderr);
    assert!(!output.status.success());
    assert!(
        stderr.contains("typo.toml") && stderr.contains("listn"),
        "{stderr}"
    );
}

#[crate::common::test]
fn check_config_checks_a_cluster_section_and_names_its_keys() {
    let good = "[cluster]\nsite = \"west-1\"\nnats = \"nats://10.0.0.1:4222\"\n";
    let output = edge_on_config("check-config", "member.toml", good, &[]);
    let stdout = text(&output.stdout);
    assert!(output.status.success(), "stderr: {}", text(&output.stderr));
    assert!(
        stdout.contains("cluster: site west-1 (KV bucket edge-west-1) on nats://10.0.0.1:4222"),
        "{stdout}"
    );
    let bad = "[server]\nlisten = \"0.0.0.0:7100\"\n[cluster]\nsite = \"west 1\"\n\
               nats = \"nats://10.0.0.1:4222\"\nrenew_ms = 3000\ntoken = \"tok-SECRET\"\n";
    let output = edge_on_config("check-config", "member.toml", bad, &[]);
    let stderr = text(&output.stderr);
    assert!(!output.status.success());
    for fragment in [
        "member.toml",
        "`cluster.site` \"west 1\"",
        "`cluster.renew_ms` (3000)",
        "`cluster.advertise_nodes`: not set, and the listener 0.0.0.0:7100",
    ] {
        assert!(stderr.contains(fragment), "{fragment}: {stderr}");
    }
    assert!(!stderr.contains("SECRET"), "a token leaked: {stderr}");
}

#[crate::common::test]
fn serve_refuses_to_start_on_a_broken_config() {
    let output = edge_on_config(
        "serve",
        "empty-token.toml",
        &NodeTable::new("a", "b", "").to_string(),
        &["--listen", "127.0.0.1:0", "--http-listen", "127.0.0.1:0"],
    );
    let stderr = text(&output.stderr);
    assert!(!output.status.success());
    assert!(
        stderr.contains("empty-token.toml") && stderr.contains("`token` is empty"),
        "{stderr}"
    );
    assert!(!stderr.contains("edge is serving"), "{stderr}");
}

#[crate::common::test]
fn token_generate_prints_a_fresh_token_and_its_digest() {
    let first = text(&edge(&["token", "generate"]).stdout);
    let second = text(&edge(&["token", "generate"]).stdout);
    assert_ne!(first, second);
    let token_line = first
        .lines()
        .find(|l| l.starts_with("token = "))
        .expect("token line");
    let digest_line = first
        .lines()
        .find(|l| l.starts_with("token_sha256 = "))
        .expect("digest line");
    assert_eq!(
        token_line.len(),
        "token = \"\"".len() + 64,
        "256 bits as hex"
    );
    assert_eq!(digest_line.len(), "token_sha256 = \"\"".len() + 64);
}

/// A thread's `se.slice` in ns, when the kernel shows it (Linux 6.12+ with
/// `CONFIG_SCHED_DEBUG`).
fn sched_slice(sched: &std::path::Path) -> Option<u64> {
    let text = std::fs::read_to_string(sched).ok()?;
    let line = text.lines().find(|l| l.starts_with("se.slice "))?;
    line.rsplit(':').next()?.trim().parse().ok()
}

/// Every thread `edge serve` starts asks for `[edge] thread_slice_us`, the kernel's
/// shortest slice by default; with 0 they keep the slice the process started with.
#[crate::common::test]
async fn serve_gives_its_threads_the_configured_scheduling_slice() {
    let own = std::path::Path::new("/proc/thread-self/sched");
    let Some(started_with) = sched_slice(own) else {
        eprintln!("this kernel does not show a thread's slice: nothing to check");
        return;
    };
    for (setting, expected) in [(None, 100_000), (Some("0"), started_with)] {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut command = common::edge_serve(&common::write_config(dir.path(), ""));
        if let Some(us) = setting {
            command.env("EDGE__EDGE__THREAD_SLICE_US", us);
        }
        let mut child = command.spawn().expect("spawn the edge binary");
        let (logs, bound) = common::watch_stderr(child.stderr.take().expect("stderr"));
        tokio::time::timeout(std::time::Duration::from_secs(30), bound)
            .await
            .expect("the edge serves in time")
            .expect("the edge serves");
        let pid = child.id().expect("running");
        let mut slices: Vec<(String, u64)> = Vec::new();
        for task in std::fs::read_dir(format!("/proc/{pid}/task")).expect("tasks") {
            let task = task.expect("task").path();
            let name = std::fs::read_to_string(task.join("comm")).expect("comm");
            let slice = sched_slice(&task.join("sched")).expect("se.slice");
            slices.push((name.trim().to_owned(), slice));
        }
        for name in ["tokio-rt-worker", "edge-journal", "edge-sink-stdou"] {
            assert!(slices.iter().any(|(n, _)| n == name), "{name}: {slices:?}");
        }
        assert!(
            slices.iter().all(|(_, slice)| *slice == expected),
            "{setting:?}: {slices:?}"
        );
        let asked = common::logged(&logs)
            .iter()
            .any(|line| line.contains("threads ask for their own scheduling slice"));
        assert_eq!(asked, setting.is_none(), "{:?}", common::logged(&logs));
        common::bounded("the edge process to exit after SIGKILL", child.kill())
            .await
            .expect("kill");
    }
}

#[crate::common::test]
fn check_config_refuses_a_slice_the_kernel_does_not_grant() {
    let output = edge_on_config(
        "check-config",
        "edge.toml",
        "[edge]\nthread_slice_us = 50\n",
        &[],
    );
    assert!(!output.status.success());
    let stderr = text(&output.stderr);
    assert!(stderr.contains("edge.toml"), "{stderr}");
    assert!(stderr.contains("`edge.thread_slice_us` is 50"), "{stderr}");
}
