//! The hexagon's arrows, checked on the source (docs/architecture.md): adapters reach the
//! application only through the inbound ports, and the domain and the ports name neither
//! adapters nor the application. A `use` that breaks a rule fails here, naming the file
//! and line, before review has to find it.

use std::path::{Path, PathBuf};

/// Every `.rs` file under `src/<dir>`, recursively.
fn sources(dir: &str) -> Vec<PathBuf> {
    let files =
        crate::common::rust_files(&Path::new(env!("CARGO_MANIFEST_DIR")).join("src").join(dir));
    assert!(!files.is_empty(), "no sources under src/{dir}");
    files
}

/// `file:line: text` for each line of code (comments aside) under `src/<dir>` naming one
/// of `paths`, in files `skip` does not pass over.
fn naming(dir: &str, paths: &[&str], skip: impl Fn(&Path) -> bool) -> Vec<String> {
    let mut found = Vec::new();
    for file in sources(dir).into_iter().filter(|f| !skip(f)) {
        let text = std::fs::read_to_string(&file).expect("a source file");
        for (n, line) in text.lines().enumerate() {
            let code = line.trim_start();
            if code.starts_with("//") {
                continue;
            }
            if paths.iter().any(|path| code.contains(path)) {
                found.push(format!("{}:{}: {code}", file.display(), n + 1));
            }
        }
    }
    found
}

#[crate::common::test]
fn adapters_reach_the_application_only_through_the_ports() {
    let found = naming("adapters", &["crate::app"], |_| false);
    assert!(
        found.is_empty(),
        "adapters importing the app:\n{}",
        found.join("\n")
    );
}

#[crate::common::test]
fn the_domain_and_the_ports_name_no_adapter_and_no_application() {
    for dir in ["domain", "ports"] {
        let found = naming(dir, &["crate::app", "crate::adapters"], |_| false);
        assert!(
            found.is_empty(),
            "src/{dir} pointing outward:\n{}",
            found.join("\n")
        );
    }
}

#[crate::common::test]
fn the_run_service_builds_on_ports_not_adapters() {
    // Its unit tests (`tests.rs`, `tests/`) may wire real adapters in.
    let is_test = |file: &Path| {
        let file = file
            .strip_prefix(env!("CARGO_MANIFEST_DIR"))
            .unwrap_or(file);
        file.components().any(|c| c.as_os_str() == "tests")
            || file.file_name().is_some_and(|name| name == "tests.rs")
    };
    let found = naming("app/runs", &["crate::adapters"], is_test);
    assert!(
        found.is_empty(),
        "the run service importing adapters:\n{}",
        found.join("\n")
    );
}
