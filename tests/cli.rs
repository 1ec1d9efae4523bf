//! The `edge` command line: `check-config` and `token generate`, run as a real process.

use std::process::{Command, Output};

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

#[test]
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

#[test]
fn check_config_on_a_broken_file_fails_and_names_every_offending_entry() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("broken.toml");
    std::fs::write(
        &path,
        r#"
[[nodes]]
id = "node-a"
alias = "gpu-a"
token = "shared-secret-token"
[[nodes.adapters]]
name = "echo"
targets = ["default"]

[[nodes]]
id = "node-a"
alias = "gpu-b"
token = "shared-secret-token"
[[nodes.adapters]]
name = "echo"
targets = ["default"]

[[nodes]]
id = "node-c"
alias = "node-a"
token = ""
[[nodes.adapters]]
name = "echo"
targets = ["default"]
"#,
    )
    .expect("write config");
    let output = edge(&[
        "check-config",
        "--config",
        path.to_str().expect("utf-8 path"),
    ]);
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

#[test]
fn check_config_names_an_unknown_key() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("typo.toml");
    std::fs::write(&path, "[server]\nlistn = \"127.0.0.1:7100\"\n").expect("write config");
    let output = edge(&[
        "check-config",
        "--config",
        path.to_str().expect("utf-8 path"),
    ]);
    let stderr = text(&output.stderr);
    assert!(!output.status.success());
    assert!(
        stderr.contains("typo.toml") && stderr.contains("listn"),
        "{stderr}"
    );
}

#[test]
fn serve_refuses_to_start_on_a_broken_config() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("empty-token.toml");
    std::fs::write(
        &path,
        "[[nodes]]\nid = \"a\"\nalias = \"b\"\ntoken = \"\"\n",
    )
    .expect("write config");
    let output = edge(&[
        "serve",
        "--config",
        path.to_str().expect("utf-8 path"),
        "--listen",
        "127.0.0.1:0",
        "--http-listen",
        "127.0.0.1:0",
    ]);
    let stderr = text(&output.stderr);
    assert!(!output.status.success());
    assert!(
        stderr.contains("empty-token.toml") && stderr.contains("`token` is empty"),
        "{stderr}"
    );
    assert!(!stderr.contains("edge is serving"), "{stderr}");
}

#[test]
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
