//! The hexagon's arrows, checked on the source (docs/architecture.md): adapters reach the
//! application only through the inbound ports, the domain and the ports name neither
//! adapters nor the application, the HTTP server names nothing of the APIs it serves, and
//! the services (`app/runs`, `app/management`, `app/models`, `app/node_events.rs`,
//! `app/drains.rs`) build on the domain and the ports, never on an adapter. A path that
//! breaks a rule fails here, naming the file and line, before review has to find it.
//!
//! Paths are resolved, not matched as text: `super::`, `self::` and a child module's own
//! name are read against the module the line is in (inline modules included), and a `use`
//! group (`crate::{adapters::x, domain}`) is expanded, so a relative import is held to the
//! same rules as a `crate::` one. Comments and string literals are left out.

use std::path::{Path, PathBuf};

/// Every `.rs` file under `src/<dir>` (a folder, or a file without its `.rs`), recursively.
fn sources(dir: &str) -> Vec<PathBuf> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let file = src.join(format!("{dir}.rs"));
    let files = if file.is_file() {
        vec![file]
    } else {
        crate::common::rust_files(&src.join(dir))
    };
    assert!(!files.is_empty(), "no sources under src/{dir}");
    files
}

/// The module a file is: `src/app/runs/mod.rs` is `crate::app::runs`.
fn module_of(file: &Path) -> Vec<String> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let relative = file.strip_prefix(&src).expect("a file under src/");
    let mut module = vec!["crate".to_owned()];
    for part in relative.with_extension("").components() {
        let part = part.as_os_str().to_string_lossy().into_owned();
        if part != "mod" && part != "lib" {
            module.push(part);
        }
    }
    module
}

/// Each line of `text` with comments and the insides of string and char literals (raw
/// strings included) blanked out, so only code is left to read.
fn code_lines(text: &str) -> Vec<String> {
    /// Inside what a line starts: code, a block comment, a string, or a raw string closed
    /// by `"` and this many `#`.
    enum Inside {
        Code,
        BlockComment,
        Str,
        RawStr(usize),
    }
    let mut lines = Vec::new();
    let mut inside = Inside::Code;
    for line in text.lines() {
        let mut code = String::with_capacity(line.len());
        let chars: Vec<char> = line.chars().collect();
        let mut i = 0;
        while i < chars.len() {
            let (c, next) = (chars[i], chars.get(i + 1).copied());
            i += 1;
            match inside {
                Inside::BlockComment if c == '*' && next == Some('/') => {
                    i += 1;
                    inside = Inside::Code;
                }
                Inside::Str if c == '\\' => i += 1,
                Inside::Str if c == '"' => inside = Inside::Code,
                Inside::RawStr(hashes)
                    if c == '"'
                        && chars[i..].iter().take_while(|c| **c == '#').count() >= hashes =>
                {
                    i += hashes;
                    inside = Inside::Code;
                }
                Inside::BlockComment | Inside::Str | Inside::RawStr(_) => {}
                Inside::Code if c == '/' && next == Some('/') => break,
                Inside::Code if c == '/' && next == Some('*') => {
                    i += 1;
                    inside = Inside::BlockComment;
                }
                Inside::Code if c == '"' => inside = Inside::Str,
                Inside::Code if c == 'r' && matches!(next, Some('#' | '"')) => {
                    let hashes = chars[i..].iter().take_while(|c| **c == '#').count();
                    if chars.get(i + hashes) == Some(&'"') {
                        i += hashes + 1;
                        inside = Inside::RawStr(hashes);
                    } else {
                        code.push(c);
                    }
                }
                // A char literal such as '{' is skipped whole; a lifetime is kept.
                Inside::Code if c == '\'' && chars.get(i + 1) == Some(&'\'') => i += 2,
                Inside::Code if c == '\'' && next == Some('\\') => {
                    i += chars[i..]
                        .iter()
                        .position(|c| *c == '\'')
                        .map_or(0, |at| at + 1);
                }
                Inside::Code => code.push(c),
            }
        }
        lines.push(code);
    }
    lines
}

/// `tree`, the part of a `use` after `use` (`a::{b, c::{d, e}}`), as whole paths.
fn expand_use(tree: &str) -> Vec<String> {
    // Renames (`x as y`) dropped, spaces gone: `a::{b,c::{d,e}}`.
    let mut words = tree.split_whitespace();
    let mut compact = String::new();
    while let Some(word) = words.next() {
        if word == "as" {
            let alias = words.next().unwrap_or_default();
            compact.extend(alias.chars().filter(|c| matches!(c, ',' | '{' | '}')));
        } else {
            compact.push_str(word);
        }
    }
    let tree = compact;
    let Some(open) = tree.find('{') else {
        return vec![tree];
    };
    let prefix = tree[..open].trim_end_matches("::");
    let inner = &tree[open + 1..tree.rfind('}').unwrap_or(tree.len())];
    let (mut items, mut depth, mut start) = (Vec::new(), 0, 0);
    for (i, c) in inner.char_indices() {
        match c {
            '{' => depth += 1,
            '}' => depth -= 1,
            ',' if depth == 0 => {
                items.push(&inner[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    items.push(&inner[start..]);
    items
        .into_iter()
        .filter(|item| !item.is_empty())
        .flat_map(|item| match item {
            "self" => vec![prefix.to_owned()],
            item if prefix.is_empty() => expand_use(item),
            item => expand_use(&format!("{prefix}::{item}")),
        })
        .collect()
}

/// `path` made absolute from module `here`, whose child modules are `children`: `crate::…`
/// as it is, `self::`/`super::` and a child's name resolved; `None` for a path that does not
/// start in this crate (`std::…`, `tokio::…`).
fn resolve(path: &str, here: &[String], children: &[String]) -> Option<String> {
    let mut segments = path.split("::").filter(|s| !s.is_empty()).peekable();
    let mut module: Vec<String> = match *segments.peek()? {
        "crate" => {
            segments.next();
            vec!["crate".to_owned()]
        }
        "self" | "super" => here.to_vec(),
        first if children.iter().any(|child| child == first) => here.to_vec(),
        _ => return None,
    };
    while let Some(&segment) = segments.peek() {
        match segment {
            "self" => {}
            "super" => {
                module.pop();
            }
            _ => break,
        }
        segments.next();
    }
    module.extend(segments.map(str::to_owned));
    Some(module.join("::"))
}

/// Every path in this crate that `file` names, as `(line, absolute path, in test code)`:
/// its `use` statements (groups expanded) and the `crate::`/`super::`/`self::` paths of
/// its code, resolved against the module each line is in.
fn named_paths(file: &Path) -> Vec<(usize, String, bool)> {
    let text = std::fs::read_to_string(file).expect("a source file");
    let lines = code_lines(&text);
    let file_module = module_of(file);
    let declared = |module_lines: &[String]| -> Vec<String> {
        module_lines
            .iter()
            .filter_map(|line| {
                let words: Vec<&str> = line.split_whitespace().collect();
                let at = words.iter().position(|w| *w == "mod")?;
                let name = words.get(at + 1)?;
                Some(name.trim_end_matches([';', '{']).to_owned())
            })
            .collect()
    };
    let children = declared(&lines);
    // Inline modules open: (name, the brace depth inside them, whether it is test code).
    let mut open: Vec<(String, i32, bool)> = Vec::new();
    let (mut depth, mut pending_use, mut use_start) = (0, String::new(), 0);
    let mut found = Vec::new();
    for (n, code) in lines.iter().enumerate() {
        let trimmed = code.trim_start();
        let words: Vec<&str> = trimmed.split_whitespace().collect();
        let mut here = file_module.clone();
        here.extend(open.iter().map(|(name, _, _)| name.clone()));
        let in_test = open.iter().any(|(_, _, test)| *test);
        let statement_use = words
            .iter()
            .position(|w| *w == "use")
            .filter(|&at| words[..at].iter().all(|w| w.starts_with("pub")));
        if !pending_use.is_empty() || statement_use.is_some() {
            if pending_use.is_empty() {
                use_start = n;
            }
            pending_use.push_str(trimmed);
            if let Some(end) = pending_use.find(';') {
                let statement = &pending_use[..end];
                let tree = &statement[statement.find("use ").map_or(0, |at| at + 4)..];
                for path in expand_use(tree) {
                    if let Some(path) = resolve(&path, &here, &children) {
                        found.push((use_start + 1, path, in_test));
                    }
                }
                pending_use.clear();
            }
        } else {
            let mut seen = Vec::new();
            for (at, _) in trimmed.match_indices("::") {
                let start = trimmed[..at]
                    .rfind(|c: char| !(c.is_alphanumeric() || c == '_' || c == ':'))
                    .map_or(0, |i| i + 1);
                let path_end = trimmed[at + 2..]
                    .find(|c: char| !(c.is_alphanumeric() || c == '_' || c == ':'))
                    .map_or(trimmed.len(), |i| at + 2 + i);
                // A visibility, `pub(in crate::x)`, names no item.
                if seen.contains(&start) || trimmed[..start].ends_with("(in ") {
                    continue;
                }
                seen.push(start);
                let path = &trimmed[start..path_end];
                if ["crate::", "super::", "self::"]
                    .iter()
                    .any(|p| path.starts_with(p))
                    && let Some(path) = resolve(path, &here, &children)
                {
                    found.push((n + 1, path, in_test));
                }
            }
        }
        let opens_module = words
            .iter()
            .position(|w| *w == "mod")
            .filter(|&at| words.get(at + 1).is_some_and(|name| !name.ends_with(';')));
        if let Some(at) = opens_module {
            let name = words[at + 1].trim_end_matches('{').to_owned();
            let test = name == "tests" || n > 0 && lines[n - 1].contains("cfg(test)");
            open.push((name, depth + 1, test || in_test));
        }
        for c in code.chars() {
            match c {
                '{' => depth += 1,
                '}' => {
                    depth -= 1;
                    if open.last().is_some_and(|(_, inside, _)| depth < *inside) {
                        open.pop();
                    }
                }
                _ => {}
            }
        }
    }
    found
}

/// `file:line: path` for each path under `src/<dir>` that names one of `modules` (or an
/// item inside one), test code aside when `skip_tests`.
fn naming(dir: &str, modules: &[&str], skip_tests: bool) -> Vec<String> {
    let mut found = Vec::new();
    for file in sources(dir) {
        let relative = file
            .strip_prefix(env!("CARGO_MANIFEST_DIR"))
            .unwrap_or(&file)
            .to_path_buf();
        let test_file = relative.components().any(|c| c.as_os_str() == "tests")
            || relative.file_name().is_some_and(|name| name == "tests.rs");
        if skip_tests && test_file {
            continue;
        }
        for (line, path, in_test) in named_paths(&file) {
            let breaks = modules
                .iter()
                .any(|m| path == *m || path.starts_with(&format!("{m}::")));
            if breaks && !(skip_tests && in_test) {
                found.push(format!("{}:{line}: {path}", relative.display()));
            }
        }
    }
    found
}

#[crate::common::test]
fn adapters_reach_the_application_only_through_the_ports() {
    let found = naming("adapters", &["crate::app"], false);
    assert!(
        found.is_empty(),
        "adapters importing the app:\n{}",
        found.join("\n")
    );
}

#[crate::common::test]
fn the_domain_and_the_ports_name_no_adapter_and_no_application() {
    for dir in ["domain", "ports"] {
        let found = naming(dir, &["crate::app", "crate::adapters"], false);
        assert!(
            found.is_empty(),
            "src/{dir} pointing outward:\n{}",
            found.join("\n")
        );
    }
}

#[crate::common::test]
fn the_services_build_on_the_domain_and_the_ports_not_on_adapters() {
    // Their tests (`tests.rs`, `tests/`, `mod tests`) may wire real adapters in.
    for service in [
        "app/runs",
        "app/management",
        "app/drains",
        "app/models",
        "app/node_events",
    ] {
        // The paths are read at all: each service names the domain or the ports.
        assert!(
            !naming(service, &["crate::domain", "crate::ports"], true).is_empty(),
            "src/{service}: no path to the domain or the ports was read"
        );
        let found = naming(service, &["crate::adapters", "crate::app::compose"], true);
        assert!(
            found.is_empty(),
            "src/{service} importing adapters or the composition root:\n{}",
            found.join("\n")
        );
    }
}

#[crate::common::test]
fn the_http_server_imports_nothing_from_the_apis_it_serves() {
    // The client APIs hand the server their routes; the server knows none of theirs.
    let found = naming("adapters/http", &["crate::adapters::api"], false);
    assert!(
        found.is_empty(),
        "src/adapters/http importing the APIs:\n{}",
        found.join("\n")
    );
}

/// `file:line: word` for each line of code under `src/<dir>` that names one of `crates`
/// (`axum::…`, `use tokio;`) or reads a clock.
fn external_names(dir: &str, crates: &[&str]) -> Vec<String> {
    let mut found = Vec::new();
    for file in sources(dir) {
        let text = std::fs::read_to_string(&file).expect("a source file");
        let relative = file
            .strip_prefix(env!("CARGO_MANIFEST_DIR"))
            .unwrap_or(&file);
        for (n, code) in code_lines(&text).iter().enumerate() {
            let words = code.split(|c: char| !(c.is_alphanumeric() || c == '_' || c == ':'));
            for word in words {
                let first = word.split("::").next().unwrap_or_default();
                let clock = word.ends_with("Instant::now") || word.ends_with("SystemTime::now");
                if crates.contains(&first) || clock {
                    found.push(format!("{}:{}: {word}", relative.display(), n + 1));
                }
            }
        }
    }
    found
}

#[crate::common::test]
fn the_translators_import_no_http_no_runtime_and_no_handler() {
    const TRANSLATORS: &str = "adapters/api/translators";
    // What they may name of the crate: the domain, the ports' errors, the events' JSON
    // format, and each other.
    let allowed = [
        "crate::domain",
        "crate::ports",
        "crate::adapters::event_format",
        "crate::adapters::api::translators",
    ];
    let mut found: Vec<String> = naming(TRANSLATORS, &["crate::adapters", "crate::app"], false)
        .into_iter()
        .filter(|line| {
            let path = line.rsplit(": ").next().unwrap_or_default();
            !allowed
                .iter()
                .any(|m| path == *m || path.starts_with(&format!("{m}::")))
        })
        .collect();
    found.extend(external_names(
        TRANSLATORS,
        &[
            "axum",
            "tokio",
            "hyper",
            "http",
            "http_body",
            "tower",
            "tower_http",
        ],
    ));
    assert!(
        !naming(TRANSLATORS, &["crate::domain"], false).is_empty(),
        "src/{TRANSLATORS}: no path to the domain was read"
    );
    assert!(
        found.is_empty(),
        "src/{TRANSLATORS} importing HTTP, the runtime, a handler or a clock:\n{}",
        found.join("\n")
    );
}

#[crate::common::test]
fn relative_paths_are_resolved_against_the_module_they_are_in() {
    let here: Vec<String> = ["crate", "app", "management", "feed"]
        .map(str::to_owned)
        .to_vec();
    let children = vec!["stored".to_owned()];
    for (path, absolute) in [
        ("super::super::adapters::x", Some("crate::app::adapters::x")),
        ("super::super::super::adapters", Some("crate::adapters")),
        (
            "self::stored::Row",
            Some("crate::app::management::feed::stored::Row"),
        ),
        (
            "stored::Row",
            Some("crate::app::management::feed::stored::Row"),
        ),
        ("tokio::sync", None),
    ] {
        assert_eq!(
            resolve(path, &here, &children).as_deref(),
            absolute,
            "{path}"
        );
    }
    assert_eq!(
        expand_use("crate::{adapters::{tls::X, tcp}, domain as d}"),
        [
            "crate::adapters::tls::X",
            "crate::adapters::tcp",
            "crate::domain"
        ]
    );
    assert_eq!(
        expand_use("super::{self, Follow}"),
        ["super", "super::Follow"]
    );
}
