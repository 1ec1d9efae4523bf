//! The harness's own rule, checked on the source: every integration test is marked
//! `#[crate::common::test]`, so each runs under a deadline of its own (decision 40). A test
//! marked `#[tokio::test]` or `#[test]` fails here, naming the file and line.

use std::path::{Path, PathBuf};

/// Every `.rs` file under `dir`, recursively.
fn rust_files(dir: &Path, files: &mut Vec<PathBuf>) {
    let entries = std::fs::read_dir(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
    for entry in entries {
        let path = entry.expect("a directory entry").path();
        if path.is_dir() {
            rust_files(&path, files);
        } else if path.extension().is_some_and(|ext| ext == "rs") {
            files.push(path);
        }
    }
}

#[crate::common::test]
fn every_integration_test_runs_under_a_deadline() {
    let mut files = Vec::new();
    rust_files(
        &Path::new(env!("CARGO_MANIFEST_DIR")).join("tests"),
        &mut files,
    );
    assert!(files.len() > 40, "the integration tests are under tests/");
    let mut undeadlined = Vec::new();
    for file in files {
        let text = std::fs::read_to_string(&file).expect("a source file");
        for (n, line) in text.lines().enumerate() {
            let code = line.trim_start();
            if code.starts_with("#[tokio::test") || code.starts_with("#[test]") {
                undeadlined.push(format!("{}:{}: {code}", file.display(), n + 1));
            }
        }
    }
    assert!(
        undeadlined.is_empty(),
        "mark these #[crate::common::test] (tests/common/deadline.rs):\n{}",
        undeadlined.join("\n")
    );
}
