//! The `edge-node` binary's command line, run as a process: what a service manager or a
//! Kubernetes pod gives it (docs/node.md, docs/install.md). Having an integration test also
//! makes `cargo test --workspace` build the binary itself (`target/<profile>/edge-node`),
//! which the edge's packaging tests (`tests/it/packaging.rs`) package and run.

use std::process::{Command, Output};

fn edge_node(args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut command = Command::new(env!("CARGO_BIN_EXE_edge-node"));
    command.args(args).env_remove("EDGE_NODE_TOKEN");
    for key in [
        "EDGE_NODE_TOKEN_FILE",
        "EDGE_NODE_ID",
        "EDGE_NODE_EDGE",
        "RUST_LOG",
    ] {
        command.env_remove(key);
    }
    command
        .envs(env.iter().copied())
        .output()
        .expect("run edge-node")
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

#[test]
fn it_says_its_version_and_the_variables_a_pod_sets() {
    let version = edge_node(&["--version"], &[]);
    assert!(version.status.success());
    assert_eq!(
        text(&version.stdout).trim(),
        format!("edge-node {}", env!("CARGO_PKG_VERSION"))
    );
    let help = text(&edge_node(&["--help"], &[]).stdout);
    for shown in [
        "--token-file",
        "EDGE_NODE_TOKEN_FILE",
        "--node-id",
        "EDGE_NODE_ID",
    ] {
        assert!(help.contains(shown), "--help shows {shown}: {help}");
    }
}

#[test]
fn a_token_file_it_cannot_read_stops_it_at_once_naming_the_file() {
    // As in a pod whose machine has no key in the tokens' Secret: the path is built from the
    // Kubernetes node's name (deploy/kubernetes/edge-node.yaml).
    let output = edge_node(
        &["--edge", "127.0.0.1:9"],
        &[
            ("EDGE_NODE_ID", "gpu-box-9"),
            ("EDGE_NODE_TOKEN_FILE", "/nonexistent/tokens/gpu-box-9"),
        ],
    );
    assert_eq!(output.status.code(), Some(2), "invalid options exit 2");
    let logs = text(&output.stderr);
    assert!(
        logs.contains("cannot read the token file /nonexistent/tokens/gpu-box-9"),
        "{logs}"
    );
}

#[test]
fn it_wants_a_token_and_not_two() {
    let none = edge_node(&[], &[]);
    assert!(!none.status.success());
    assert!(
        text(&none.stderr).contains("--token"),
        "{}",
        text(&none.stderr)
    );
    let both = edge_node(&["--token", "a", "--token-file", "/tmp/b"], &[]);
    assert!(!both.status.success());
    assert!(
        text(&both.stderr).contains("cannot be used with"),
        "{}",
        text(&both.stderr)
    );
}
