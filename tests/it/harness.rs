//! The harness's own rule, checked on the source: every integration test is marked
//! `#[crate::common::test]`, so each runs under a deadline of its own (decision 40). A test
//! marked `#[tokio::test]` or `#[test]` fails here, naming the file and line.

use std::path::Path;

#[crate::common::test]
fn every_integration_test_runs_under_a_deadline() {
    let files = crate::common::rust_files(&Path::new(env!("CARGO_MANIFEST_DIR")).join("tests"));
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
