//! The map is true: every path the edge's HTTP listeners mount (the APIs, the operations
//! endpoints, the management API, the console) is in README.md's endpoint tables, and every
//! path the tables name is mounted (read from the source, where the routes are declared);
//! every command `edge --help` lists is in README's shell examples, and every `edge …` they
//! run is a command. A new route or command, or a stale line, fails here naming it.

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
