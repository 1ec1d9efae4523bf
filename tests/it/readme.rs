//! The map is true: every path the edge's HTTP listeners mount (the APIs, the operations
//! endpoints, the management API, the console) is in README.md's endpoint tables, and every
//! path the tables name is mounted (read from the source, where the routes are declared);
//! every command `edge --help` lists is in README's shell examples, and every `edge …` they
//! run is a command; every path docs/architecture.md and README's layout name exists, and
//! every folder of `src/` (and of its adapters and application) is named there and in
//! `src/lib.rs`'s module map. A new route, command or folder, or a stale line, fails here
//! naming it.

use std::collections::BTreeSet;
use std::path::Path;

fn read(relative: &str) -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(relative);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// Every string literal in `text` that looks like a route: it starts with `/` and is
/// followed (on its line) by nothing but the rest of a route declaration.
fn route_literals(text: &str, starts: &[&str]) -> Vec<String> {
    text.split('"')
        .skip(1)
        .step_by(2)
        .filter(|literal| starts.iter().any(|start| literal.starts_with(start)))
        .map(str::to_owned)
        .collect()
}

/// The paths the source mounts, in README's spelling (`{*model}` is `{model}`).
fn mounted() -> BTreeSet<String> {
    let mut paths = Vec::new();
    paths.extend(route_literals(
        &read("src/adapters/api/mod.rs"),
        &["/v1/", "/tokenize", "/detokenize"],
    ));
    paths.extend(route_literals(
        &read("src/adapters/api/anthropic/count_tokens.rs"),
        &["/v1/messages/"],
    ));
    paths.extend(route_literals(&read("src/adapters/http/server.rs"), &["/"]));
    for entry in std::fs::read_dir(Path::new(env!("CARGO_MANIFEST_DIR")).join("src/adapters/admin"))
        .expect("the admin adapter")
    {
        let path = entry.expect("an entry").path();
        if path.extension().is_some_and(|ext| ext == "rs") {
            let text = std::fs::read_to_string(&path).expect("a source file");
            paths.extend(
                text.lines()
                    .filter_map(|line| line.trim().strip_prefix("path = "))
                    .flat_map(|literal| route_literals(literal, &["/admin/"])),
            );
        }
    }
    // The console's page (its files are served below it).
    paths.extend(
        route_literals(&read("src/adapters/web_console/mod.rs"), &["/console/"])
            .into_iter()
            .filter(|path| !path.contains('{')),
    );
    paths
        .into_iter()
        .map(|path| path.replace("{*", "{"))
        .collect()
}

/// The paths README.md's endpoint tables name (`` `GET /v1/models` ``).
fn documented() -> BTreeSet<String> {
    let readme = read("README.md");
    let start = readme
        .find("## Endpoints")
        .expect("README has an Endpoints section");
    let section = &readme[start
        ..readme[start..]
            .find("\n## Documentation")
            .map_or(readme.len(), |end| start + end)];
    section
        .split('`')
        .skip(1)
        .step_by(2)
        .filter_map(|code| code.split_once(' '))
        .filter(|(method, _)| ["GET", "POST", "DELETE"].contains(method))
        .map(|(_, path)| path.to_owned())
        .collect()
}

/// Fails naming what README.md's `what` lacks of `real`, and what it names that is not.
fn assert_readme_matches(what: &str, real: &BTreeSet<String>, readme: &BTreeSet<String>) {
    let missing: Vec<_> = real.difference(readme).collect();
    let stale: Vec<_> = readme.difference(real).collect();
    assert!(
        missing.is_empty() && stale.is_empty(),
        "README.md's {what}: missing {missing:?}, not real {stale:?}"
    );
}

#[crate::common::test]
fn the_readme_lists_every_endpoint_the_edge_mounts_and_no_other() {
    let mounted = mounted();
    assert!(mounted.len() > 20, "the routes are read: {mounted:?}");
    assert_readme_matches("endpoint tables", &mounted, &documented());
}

/// The subcommands `edge --help` lists (`help` aside).
fn commands() -> BTreeSet<String> {
    let help = std::process::Command::new(env!("CARGO_BIN_EXE_edge"))
        .arg("--help")
        .output()
        .expect("run edge --help");
    let help = String::from_utf8_lossy(&help.stdout).into_owned();
    let listed = help
        .split("Commands:")
        .nth(1)
        .and_then(|rest| rest.split("Options:").next())
        .expect("edge --help lists its commands");
    listed
        .lines()
        .filter_map(|line| line.split_whitespace().next())
        .filter(|command| *command != "help")
        .map(str::to_owned)
        .collect()
}

/// The subcommands README.md's shell examples (its `sh` blocks) run: `edge nodes` is
/// `nodes`.
fn shown() -> BTreeSet<String> {
    let (mut in_shell, mut shown) = (false, BTreeSet::new());
    for line in read("README.md").lines() {
        if line.starts_with("```") {
            in_shell = line == "```sh";
        } else if in_shell
            && let Some(command) = line
                .strip_prefix("edge ")
                .and_then(|rest| rest.split_whitespace().next())
        {
            shown.insert(command.to_owned());
        }
    }
    shown
}

#[crate::common::test]
fn the_readme_shows_every_command_of_the_edge_binary_and_no_other() {
    let commands = commands();
    assert!(commands.len() > 5, "the commands are read: {commands:?}");
    assert_readme_matches("shell examples", &commands, &shown());
}

/// Every file and folder of the workspace's crates and docs, relative to its root
/// (`src/app/compose/mod.rs`, `src/app/compose`), build output and git aside.
fn workspace_paths() -> BTreeSet<String> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut found = BTreeSet::new();
    let mut folders = vec![root.to_path_buf()];
    while let Some(folder) = folders.pop() {
        let Ok(entries) = std::fs::read_dir(&folder) else {
            continue;
        };
        for entry in entries.flatten() {
            let path = entry.path();
            let name = entry.file_name().to_string_lossy().into_owned();
            if ["target", ".git", "node_modules"].contains(&name.as_str()) {
                continue;
            }
            let relative = path.strip_prefix(root).unwrap_or(&path);
            found.insert(relative.display().to_string());
            if path.is_dir() {
                folders.push(path);
            }
        }
    }
    found
}

/// The paths `text` names in backticks outside its code blocks: a word with a `/` or ending
/// in `.rs`, not a URL or a route (`app/compose/mod.rs`, `adapters/tcp`, `node/`).
fn paths_named(text: &str) -> BTreeSet<String> {
    let is_path = |word: &str| {
        let word = word.trim_end_matches(['.', ',', ':', ';']);
        let shaped = word
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '/' | '.'));
        let looks = (word.contains('/') || word.ends_with(".rs")) && !word.starts_with('/');
        let not_a_file = word.contains("//") || word.starts_with("..") || word.contains("/v1");
        (shaped && looks && !not_a_file).then(|| word.trim_end_matches('/').to_owned())
    };
    let mut found = BTreeSet::new();
    // Outside code blocks (the diagrams draw words such as `I/O` and `log/null`).
    for prose in text.split("```").step_by(2) {
        for (at, span) in prose.split('`').enumerate() {
            if at % 2 == 1 {
                found.extend(span.split_whitespace().filter_map(is_path));
            }
        }
    }
    found
}

/// Whether `named` is a path of the workspace, whole or as its tail (the docs name files
/// from the folder they speak of: `translators/error.rs` under `adapters/api`).
fn exists(named: &str, paths: &BTreeSet<String>) -> bool {
    paths
        .iter()
        .any(|path| path == named || path.ends_with(&format!("/{named}")))
}

#[crate::common::test]
fn every_path_the_architecture_names_exists() {
    let paths = workspace_paths();
    let text = read("docs/architecture.md");
    let named = paths_named(&text);
    assert!(named.len() > 50, "the paths were read: {named:?}");
    let stale: Vec<&String> = named.iter().filter(|n| !exists(n, &paths)).collect();
    assert!(
        stale.is_empty(),
        "docs/architecture.md names paths that do not exist: {stale:?}"
    );
}

/// The first column of README's `## Layout` block: the paths it describes.
fn readme_layout() -> Vec<String> {
    let readme = read("README.md");
    let layout = readme
        .split("## Layout")
        .nth(1)
        .and_then(|rest| rest.split("```").nth(1))
        .expect("README has a `## Layout` code block");
    layout
        .lines()
        .filter(|line| !line.starts_with(' '))
        .filter_map(|line| line.split_whitespace().next())
        .flat_map(|first| first.split(','))
        .filter(|path| !path.is_empty())
        .map(|path| path.trim_end_matches('/').to_owned())
        .collect()
}

#[crate::common::test]
fn the_layouts_name_every_folder_of_src_and_only_what_exists() {
    let paths = workspace_paths();
    let layout = readme_layout();
    let stale: Vec<&String> = layout.iter().filter(|p| !exists(p, &paths)).collect();
    assert!(
        stale.is_empty(),
        "README's layout names {stale:?}, which do not exist"
    );
    let architecture = read("docs/architecture.md");
    let lib = read("src/lib.rs");
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let names = |dir: &Path| -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(dir)
            .expect("a folder of src/")
            .flatten()
            .map(|entry| entry.file_name().to_string_lossy().into_owned())
            .filter(|name| !["lib.rs", "main.rs", "mod.rs"].contains(&name.as_str()))
            .map(|name| name.trim_end_matches(".rs").to_owned())
            .collect();
        names.sort();
        names.dedup();
        names
    };
    let mut missing = Vec::new();
    for module in names(&src) {
        let path = format!("src/{module}");
        if !layout
            .iter()
            .any(|named| named.trim_end_matches(".rs") == path)
        {
            missing.push(format!("README's layout does not name {path}"));
        }
        if !architecture.contains(&path) {
            missing.push(format!("docs/architecture.md does not name {path}"));
        }
        if !lib.contains(&format!("`{module}`")) {
            missing.push(format!("src/lib.rs's module map does not name {module}"));
        }
    }
    // Each part of the adapters and of the application is named where the layers are told.
    for layer in ["adapters", "app"] {
        for module in names(&src.join(layer)) {
            if !architecture.contains(&format!("`{module}"))
                && !architecture.contains(&format!("{layer}/{module}"))
            {
                missing.push(format!(
                    "docs/architecture.md does not name {layer}/{module}"
                ));
            }
            if !lib.contains(&format!("`{module}")) {
                missing.push(format!(
                    "src/lib.rs's module map does not name {layer}/{module}"
                ));
            }
        }
    }
    assert!(missing.is_empty(), "{}", missing.join("\n"));
}
