//! The hexagon's arrows, checked on the source (docs/architecture.md): adapters reach the
//! application only through the inbound ports, the domain and the ports name neither
//! adapters nor the application, the HTTP server names nothing of the APIs it serves, and
//! the services (`app/runs`, `app/management`, `app/models`, `app/node_events.rs`,
//! `app/drains.rs`) build on the domain and the ports, never on an adapter. A path that
//! breaks a rule fails here, naming the file and line, before review has to find it.
//!
//! Paths are resolved, not matched as text: `super::`, `self::` and a child module's own
//! name are read against the module the line is in (inline modules included), a `use`
//! group (`crate::{adapters::x, domain}`) is expanded, and a path through a re-export
//! (`pub use`) is followed to what it names, so a relative or re-exported import is held to
//! the same rules as a `crate::` one. Comments and string literals are left out.
//!
//! The run service's files are also checked for an import circle: each part's files may
//! reach their own part's root (the state it declares), and no file may reach, through the
//! others, back to itself.

use std::path::{Path, PathBuf};

/// The workspace's root, where the edge's `Cargo.toml` is.
fn workspace() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// The `src/` folder of the crate `file` is in: the nearest folder above it named `src`.
fn src_of(file: &Path) -> &Path {
    file.ancestors()
        .find(|dir| dir.file_name().is_some_and(|name| name == "src"))
        .expect("a file under a crate's src/")
}

/// The edge's own `src/`.
fn edge_src() -> PathBuf {
    workspace().join("src")
}

/// Every `.rs` file under `src/<dir>` (a folder, or a file without its `.rs`), recursively.
fn sources(dir: &str) -> Vec<PathBuf> {
    sources_in(&edge_src(), dir)
}

/// Every `.rs` file under `<src>/<dir>` (a folder, or a file without its `.rs`; `""`: all of
/// `src`), recursively.
fn sources_in(src: &Path, dir: &str) -> Vec<PathBuf> {
    let file = src.join(format!("{dir}.rs"));
    let files = if !dir.is_empty() && file.is_file() {
        vec![file]
    } else {
        crate::common::rust_files(&src.join(dir))
    };
    assert!(
        !files.is_empty(),
        "no sources under {}/{dir}",
        src.display()
    );
    files
}

/// The module a file is: `src/app/runs/mod.rs` is `crate::app::runs`.
fn module_of(file: &Path) -> Vec<String> {
    let relative = file.strip_prefix(src_of(file)).expect("a file under src/");
    let mut module = vec!["crate".to_owned()];
    for part in relative.with_extension("").components() {
        let part = part.as_os_str().to_string_lossy().into_owned();
        if part != "mod" && part != "lib" && part != "main" {
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
/// item inside one) itself or through a re-export, test code aside when `skip_tests`.
fn naming(dir: &str, modules: &[&str], skip_tests: bool) -> Vec<String> {
    let reexports = reexports(&edge_src());
    let mut found = Vec::new();
    for file in sources(dir) {
        let relative = file
            .strip_prefix(env!("CARGO_MANIFEST_DIR"))
            .unwrap_or(&file)
            .to_path_buf();
        if skip_tests && is_test_file(&file) {
            continue;
        }
        for (line, path, in_test) in named_paths(&file) {
            let through = through_reexports(&path, &reexports);
            let breaking = through.iter().find(|path| {
                modules
                    .iter()
                    .any(|m| *path == m || path.starts_with(&format!("{m}::")))
            });
            if let Some(breaking) = breaking.filter(|_| !(skip_tests && in_test)) {
                let via = if *breaking == path {
                    String::new()
                } else {
                    format!(" (re-exported as {path})")
                };
                found.push(format!("{}:{line}: {breaking}{via}", relative.display()));
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
        "app/takeover",
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
    let reexports = reexports(&edge_src());
    assert!(
        through_reexports("crate::app::runs::RunService::start", &reexports)
            .contains(&"crate::app::runs::service::RunService::start".to_owned()),
        "a re-export is followed to the item it names"
    );
    assert!(
        through_reexports("crate::components::SqliteJournal", &reexports)
            .contains(&"crate::adapters::journal::SqliteJournal".to_owned()),
        "a re-export inside an inline module is followed too"
    );
}

/// Every re-export in the crate whose sources are `src` (`pub use …`, any visibility): the path it makes
/// (`crate::app::runs::RunService`) and the path it names
/// (`crate::app::runs::service::RunService`). A rename (`as`) is read as the name it
/// renames.
fn reexports(src: &Path) -> Vec<(String, String)> {
    let mut found = Vec::new();
    for file in crate::common::rust_files(src) {
        let text = std::fs::read_to_string(&file).expect("a source file");
        let lines = code_lines(&text);
        let here = module_of(&file);
        let children: Vec<String> = lines
            .iter()
            .filter_map(|line| {
                let words: Vec<&str> = line.split_whitespace().collect();
                let at = words.iter().position(|w| *w == "mod")?;
                Some(words.get(at + 1)?.trim_end_matches([';', '{']).to_owned())
            })
            .collect();
        let mut statement = String::new();
        // Inline modules open, with the brace depth inside each.
        let (mut open, mut depth): (Vec<(String, i32)>, i32) = (Vec::new(), 0);
        for line in &lines {
            let trimmed = line.trim();
            let mut module = here.clone();
            module.extend(open.iter().map(|(name, _)| name.clone()));
            let words: Vec<&str> = trimmed.split_whitespace().collect();
            if let Some(at) = words.iter().position(|w| *w == "mod")
                && let Some(name) = words.get(at + 1).filter(|name| !name.ends_with(';'))
            {
                open.push((name.trim_end_matches('{').to_owned(), depth + 1));
            }
            for c in trimmed.chars() {
                match c {
                    '{' => depth += 1,
                    '}' => {
                        depth -= 1;
                        if open.last().is_some_and(|(_, inside)| depth < *inside) {
                            open.pop();
                        }
                    }
                    _ => {}
                }
            }
            if statement.is_empty() && !(trimmed.starts_with("pub") && trimmed.contains(" use ")) {
                continue;
            }
            statement.push_str(trimmed);
            let Some(end) = statement.find(';') else {
                continue;
            };
            let tree = &statement[statement.find(" use ").map_or(0, |at| at + 5)..end];
            for path in expand_use(tree) {
                let Some(target) = resolve(&path, &module, &children) else {
                    continue;
                };
                let name = target.rsplit("::").next().unwrap_or_default().to_owned();
                found.push((format!("{}::{name}", module.join("::")), target));
            }
            statement.clear();
        }
    }
    found
}

/// `path` and every path it stands for through re-exports, followed to their ends.
fn through_reexports(path: &str, reexports: &[(String, String)]) -> Vec<String> {
    let mut paths = vec![path.to_owned()];
    let mut at = 0;
    while let Some(current) = paths.get(at).cloned() {
        at += 1;
        for (made, named) in reexports {
            let rest = current.strip_prefix(made.as_str());
            if let Some(rest) = rest.filter(|rest| rest.is_empty() || rest.starts_with("::")) {
                let expanded = format!("{named}{rest}");
                if !paths.contains(&expanded) && paths.len() < 16 {
                    paths.push(expanded);
                }
            }
        }
    }
    paths
}

/// The source file that defines module path `path` or the item it names: the longest
/// prefix of its segments that is a file (`x.rs` or `x/mod.rs`) under `src`.
fn file_of(src: &Path, path: &str) -> Option<PathBuf> {
    let segments: Vec<&str> = path.split("::").skip(1).collect();
    (1..=segments.len()).rev().find_map(|len| {
        let module = segments[..len].join("/");
        [
            src.join(format!("{module}.rs")),
            src.join(&module).join("mod.rs"),
        ]
        .into_iter()
        .find(|file| file.is_file())
    })
}

/// Whether `file` is test code: a `tests.rs`, a file under a `tests/` folder, or a module
/// its parent declares under `#[cfg(test)]`.
fn is_test_file(file: &Path) -> bool {
    if file.file_name().is_some_and(|name| name == "tests.rs")
        || file.components().any(|c| c.as_os_str() == "tests")
    {
        return true;
    }
    let Some(stem) = file.file_stem().and_then(|s| s.to_str()) else {
        return false;
    };
    let parent = match stem {
        "mod" => file.parent().and_then(Path::parent),
        _ => file.parent(),
    };
    let name = match stem {
        "mod" => file
            .parent()
            .and_then(Path::file_name)
            .and_then(|n| n.to_str())
            .unwrap_or_default(),
        name => name,
    };
    let Some(parent) = parent else {
        return false;
    };
    let declaring = [parent.join("mod.rs"), parent.with_extension("rs")];
    declaring.iter().filter(|f| f.is_file()).any(|declarer| {
        let text = std::fs::read_to_string(declarer).expect("a source file");
        let lines = code_lines(&text);
        lines.iter().enumerate().any(|(n, line)| {
            let words: Vec<&str> = line.split_whitespace().collect();
            let declares = words
                .iter()
                .position(|w| *w == "mod")
                .is_some_and(|at| words.get(at + 1) == Some(&format!("{name};").as_str()));
            declares && n > 0 && lines[n - 1].contains("cfg(test)")
        })
    })
}

/// The imports among the files under `<src>/<dir>`, test code aside, as `file → files it
/// names` (where what it names is defined, through any re-export) and the files of the
/// modules it declares (a module holds its children). A file naming the root of a module
/// it is inside (`super::Placer` from `placer/admission.rs`, or `x.rs` from `x/y.rs`) is a
/// part reaching its own root, which holds it anyway: that edge is left out, so a circle is
/// one that leaves the part and comes back.
fn imports_among(src: &Path, dir: &str) -> std::collections::BTreeMap<PathBuf, Vec<PathBuf>> {
    let reexports = reexports(src);
    let mut graph = std::collections::BTreeMap::new();
    for file in sources_in(src, dir)
        .into_iter()
        .filter(|f| !is_test_file(f))
    {
        let mut names: Vec<PathBuf> = named_paths(&file)
            .into_iter()
            .filter(|(_, _, in_test)| !in_test)
            .filter_map(|(_, path, _)| file_of(src, through_reexports(&path, &reexports).last()?))
            .filter(|named| *named != file)
            .filter(|named| !file.starts_with(part_of(named)))
            .filter(|named| !is_test_file(named))
            .collect();
        names.extend(children_of(&file).into_iter().filter(|f| !is_test_file(f)));
        names.sort();
        names.dedup();
        graph.insert(file, names);
    }
    graph
}

/// The folder of the part whose root is `file`: its own folder for a `mod.rs`, `lib.rs` or
/// `main.rs`, the folder of its children for any other (`x/` for `x.rs`).
fn part_of(file: &Path) -> PathBuf {
    let is_root = ["mod.rs", "lib.rs", "main.rs"]
        .iter()
        .any(|root| file.ends_with(root));
    match file.parent() {
        Some(parent) if is_root => parent.to_path_buf(),
        _ => file.with_extension(""),
    }
}

/// The files of the modules `file` declares (`mod x;`).
fn children_of(file: &Path) -> Vec<PathBuf> {
    let text = std::fs::read_to_string(file).expect("a source file");
    let dir = match file.file_stem().and_then(|s| s.to_str()) {
        Some("mod" | "lib" | "main") => file.parent().map(Path::to_path_buf),
        Some(stem) => file.parent().map(|parent| parent.join(stem)),
        None => None,
    };
    let Some(dir) = dir else {
        return Vec::new();
    };
    code_lines(&text)
        .iter()
        .filter_map(|line| {
            let words: Vec<&str> = line.split_whitespace().collect();
            let at = words.iter().position(|w| *w == "mod")?;
            let name = words.get(at + 1)?.strip_suffix(';')?;
            [
                dir.join(format!("{name}.rs")),
                dir.join(name).join("mod.rs"),
            ]
            .into_iter()
            .find(|child| child.is_file())
        })
        .collect()
}

/// A circle of imports in `graph`, as its files in order, if there is one.
fn a_circle(graph: &std::collections::BTreeMap<PathBuf, Vec<PathBuf>>) -> Option<Vec<PathBuf>> {
    /// Depth-first, with the files on the current path in `path`.
    fn visit(
        file: &PathBuf,
        graph: &std::collections::BTreeMap<PathBuf, Vec<PathBuf>>,
        path: &mut Vec<PathBuf>,
        done: &mut std::collections::BTreeSet<PathBuf>,
    ) -> Option<Vec<PathBuf>> {
        if let Some(at) = path.iter().position(|f| f == file) {
            let mut circle = path[at..].to_vec();
            circle.push(file.clone());
            return Some(circle);
        }
        if !done.insert(file.clone()) {
            return None;
        }
        path.push(file.clone());
        for next in graph.get(file).into_iter().flatten() {
            if let Some(circle) = visit(next, graph, path, done) {
                return Some(circle);
            }
        }
        path.pop();
        None
    }
    let mut done = std::collections::BTreeSet::new();
    graph
        .keys()
        .find_map(|file| visit(file, graph, &mut Vec::new(), &mut done))
}

/// Every circle of imports in `graph`: its strongly connected parts of more than one file
/// (Tarjan's algorithm), each sorted, in the order of their first file.
fn circles(graph: &std::collections::BTreeMap<PathBuf, Vec<PathBuf>>) -> Vec<Vec<PathBuf>> {
    use std::collections::BTreeMap;
    /// The walk's state: each file's visit number and lowest reachable number, the stack.
    #[derive(Default)]
    struct Walk<'a> {
        number: BTreeMap<&'a PathBuf, usize>,
        low: BTreeMap<&'a PathBuf, usize>,
        stack: Vec<&'a PathBuf>,
        found: Vec<Vec<PathBuf>>,
    }
    fn visit<'a>(
        file: &'a PathBuf,
        graph: &'a BTreeMap<PathBuf, Vec<PathBuf>>,
        walk: &mut Walk<'a>,
    ) {
        let number = walk.number.len();
        walk.number.insert(file, number);
        walk.low.insert(file, number);
        walk.stack.push(file);
        for next in graph.get(file).into_iter().flatten() {
            let Some(next) = graph.get_key_value(next).map(|(key, _)| key) else {
                continue;
            };
            if !walk.number.contains_key(next) {
                visit(next, graph, walk);
                let low = walk.low[file].min(walk.low[next]);
                walk.low.insert(file, low);
            } else if walk.stack.contains(&next) {
                let low = walk.low[file].min(walk.number[next]);
                walk.low.insert(file, low);
            }
        }
        if walk.low[file] == walk.number[file] {
            let at = walk.stack.iter().rposition(|f| *f == file).unwrap_or(0);
            let mut part: Vec<PathBuf> = walk.stack.drain(at..).cloned().collect();
            if part.len() > 1 {
                part.sort();
                walk.found.push(part);
            }
        }
    }
    let mut walk = Walk::default();
    for file in graph.keys() {
        if !walk.number.contains_key(file) {
            visit(file, graph, &mut walk);
        }
    }
    walk.found.sort();
    walk.found
}

/// The crates whose files may import each other only without a circle: the edge, the
/// reference node and the mock node. The load generator (`loadgen/`) is exempt: a
/// benchmark driver installed nowhere, whose rigs and their shared driver call each other
/// by design (`api` runs the shared-core rig, which drives `api`'s load).
const CRATES_WITHOUT_CIRCLES: [&str; 3] = ["src", "node/src", "mock_node/src"];

/// The imports among the parts of `folder`, from the crate's file graph `files`: a part is
/// a file directly in it, or one of its subfolders together with the file that declares it
/// (`x.rs` and `x/`, named `x`); part A imports part B when a file of A imports a file of B.
fn parts_of(
    folder: &Path,
    files: &std::collections::BTreeMap<PathBuf, Vec<PathBuf>>,
) -> std::collections::BTreeMap<PathBuf, Vec<PathBuf>> {
    let part = |file: &Path| -> Option<PathBuf> {
        let first = file.strip_prefix(folder).ok()?.components().next()?;
        Some(folder.join(Path::new(first.as_os_str()).with_extension("")))
    };
    let mut parts: std::collections::BTreeMap<PathBuf, Vec<PathBuf>> = Default::default();
    for (from, to) in files {
        let Some(from) = part(from) else { continue };
        let imports = parts.entry(from.clone()).or_default();
        imports.extend(to.iter().filter_map(|to| part(to)).filter(|to| *to != from));
        imports.sort();
        imports.dedup();
    }
    parts
}

/// The folders of a crate's `src`, itself included, that hold its files.
fn folders(files: &std::collections::BTreeMap<PathBuf, Vec<PathBuf>>) -> Vec<PathBuf> {
    let mut folders: Vec<PathBuf> = files
        .keys()
        .filter_map(|file| file.parent().map(Path::to_path_buf))
        .collect();
    folders.sort();
    folders.dedup();
    folders
}

/// `path` relative to the workspace, for messages.
fn shown(path: &Path) -> String {
    path.strip_prefix(workspace())
        .unwrap_or(path)
        .display()
        .to_string()
}

#[crate::common::test]
fn no_folder_of_the_edge_the_node_or_the_mock_node_has_an_import_circle() {
    let mut found = Vec::new();
    for src in CRATES_WITHOUT_CIRCLES {
        let files = imports_among(&workspace().join(src), "");
        let edges: usize = files.values().map(Vec::len).sum();
        assert!(edges > 2, "{src}: the imports were read ({edges} edges)");
        for folder in folders(&files) {
            let parts = parts_of(&folder, &files);
            for circle in circles(&parts) {
                let ties: Vec<String> = circle
                    .iter()
                    .flat_map(|from| {
                        let to = parts[from].iter().filter(|to| circle.contains(to));
                        to.map(move |to| format!("    {} → {}", shown(from), shown(to)))
                    })
                    .collect();
                let names: Vec<String> = circle.iter().map(|part| shown(part)).collect();
                found.push(format!(
                    "in {}/: {}\n{}",
                    shown(&folder),
                    names.join(", "),
                    ties.join("\n")
                ));
            }
        }
    }
    assert!(
        found.is_empty(),
        "{} import circles (parts of a folder that import each other, through any others; \
         a part is a file, or a subfolder with the file that declares it):\n{}",
        found.len(),
        found.join("\n")
    );
}

#[crate::common::test]
fn the_circle_finder_finds_every_circle_and_only_circles() {
    let graph: std::collections::BTreeMap<PathBuf, Vec<PathBuf>> = [
        ("a", vec!["b"]),
        ("b", vec!["c"]),
        ("c", vec!["a", "d"]),
        ("d", vec![]),
        ("e", vec!["f"]),
        ("f", vec!["e"]),
    ]
    .into_iter()
    .map(|(file, to)| {
        (
            PathBuf::from(file),
            to.into_iter().map(PathBuf::from).collect(),
        )
    })
    .collect();
    let found: Vec<Vec<String>> = circles(&graph)
        .into_iter()
        .map(|c| c.iter().map(|f| f.display().to_string()).collect())
        .collect();
    assert_eq!(found, [vec!["a", "b", "c"], vec!["e", "f"]]);
}

#[crate::common::test]
fn the_run_services_files_import_each_other_without_a_circle() {
    let graph = imports_among(&edge_src(), "app/runs");
    let edges: usize = graph.values().map(Vec::len).sum();
    assert!(edges > 20, "the imports were read: {edges} edges");
    let base = Path::new(env!("CARGO_MANIFEST_DIR"));
    if let Some(circle) = a_circle(&graph) {
        let files: Vec<String> = circle
            .iter()
            .map(|f| f.strip_prefix(base).unwrap_or(f).display().to_string())
            .collect();
        panic!(
            "an import circle among the run service's files:\n{}",
            files.join("\n → ")
        );
    }
}

/// The error type of each `Result<…, E>` in `code`, as written (`String`, `anyhow::Error`).
fn result_errors(code: &str) -> Vec<String> {
    let mut found = Vec::new();
    for (at, _) in code.match_indices("Result<") {
        let before = code[..at].chars().next_back();
        if before.is_some_and(|c| c.is_alphanumeric() || c == '_') {
            continue;
        }
        let inner = &code[at + "Result<".len()..];
        let (mut depth, mut last_comma, mut end) = (0, None, None);
        for (i, c) in inner.char_indices() {
            match c {
                '<' | '(' | '[' => depth += 1,
                '>' if depth == 0 => {
                    end = Some(i);
                    break;
                }
                '>' | ')' | ']' => depth -= 1,
                ',' if depth == 0 => last_comma = Some(i),
                _ => {}
            }
        }
        if let (Some(comma), Some(end)) = (last_comma, end) {
            found.push(inner[comma + 1..end].trim().to_owned());
        }
    }
    found
}

/// Why `code` (one signature or line) does not give a typed error, if it does not.
fn untyped_error(code: &str) -> Option<String> {
    let untyped = |error: &str| {
        error == "String"
            || error.starts_with("Box<dyn")
            || error.starts_with("anyhow::")
            || error == "&'static str"
    };
    if let Some(error) = result_errors(code).into_iter().find(|e| untyped(e)) {
        return Some(format!("an error of type `{error}`"));
    }
    if code.contains("anyhow::") || code.trim_start().starts_with("use anyhow") {
        return Some("anyhow".to_owned());
    }
    let words: Vec<&str> = code.split_whitespace().collect();
    let alias = words.iter().position(|w| *w == "type");
    if alias
        .is_some_and(|at| words.get(at + 2) == Some(&"=") && words.get(at + 3) == Some(&"String;"))
    {
        return Some("a `type … = String`".to_owned());
    }
    None
}

/// Which of `lines` (code only) are test code: the item after each `#[cfg(test)]`, from
/// that attribute to the brace that closes the item (or its `;`).
fn test_lines(lines: &[String]) -> Vec<bool> {
    let mut in_test = vec![false; lines.len()];
    let mut n = 0;
    while n < lines.len() {
        if !lines[n].contains("cfg(test)") {
            n += 1;
            continue;
        }
        let (mut depth, mut opened, start) = (0_i32, false, n);
        while n < lines.len() {
            for c in lines[n].chars() {
                match c {
                    '{' => {
                        depth += 1;
                        opened = true;
                    }
                    '}' => depth -= 1,
                    _ => {}
                }
            }
            let ended = (opened && depth <= 0) || (!opened && lines[n].contains(';') && n > start);
            n += 1;
            if ended {
                break;
            }
        }
        in_test[start..n].fill(true);
    }
    in_test
}

/// `file:line: why` for each untyped error in the code of `files`, test code aside; with
/// `public_only`, only in the signatures of `pub` and `pub(crate)` functions.
fn untyped_errors(files: &[PathBuf], public_only: bool) -> Vec<String> {
    let mut found = Vec::new();
    for file in files.iter().filter(|f| !is_test_file(f)) {
        let text = std::fs::read_to_string(file).expect("a source file");
        let lines = code_lines(&text);
        let in_test = test_lines(&lines);
        let mut n = 0;
        while n < lines.len() {
            if in_test[n] {
                n += 1;
                continue;
            }
            let line = lines[n].trim_start();
            let public_fn = (line.starts_with("pub fn")
                || line.starts_with("pub async fn")
                || line.starts_with("pub(crate) fn")
                || line.starts_with("pub(crate) async fn"))
                && !line.contains("pub(super)");
            let (code, lines_taken) = if public_fn {
                let end = (n..lines.len())
                    .find(|&at| lines[at].contains('{') || lines[at].trim_end().ends_with(';'))
                    .unwrap_or(n);
                (lines[n..=end].join(" "), end - n + 1)
            } else {
                (lines[n].clone(), 1)
            };
            if (public_fn || !public_only)
                && let Some(why) = untyped_error(&code)
            {
                found.push(format!("{}:{}: {why}", shown(file), n + 1));
            }
            n += lines_taken;
        }
    }
    found
}

#[crate::common::test]
fn errors_at_the_seams_are_typed() {
    let src = edge_src();
    let mut found = Vec::new();
    for dir in ["ports", "app", "domain"] {
        found.extend(untyped_errors(&sources_in(&src, dir), false));
    }
    // The composition root is wiring: it may gather its start-up failures with `anyhow`
    // (style.md: "`anyhow` belongs in `main`, `app` wiring and tests"), never with a
    // `String`. Decision 54.
    found.retain(|line| !(line.starts_with("src/app/compose/") && line.ends_with(": anyhow")));
    found.extend(untyped_errors(&sources_in(&src, "adapters"), true));
    let node: Vec<PathBuf> = sources_in(&workspace().join("node/src"), "")
        .into_iter()
        .filter(|file| !file.ends_with("main.rs"))
        .collect();
    found.extend(untyped_errors(&node, false));
    assert!(
        found.is_empty(),
        "{} errors that are not an enum deriving `Error` (in src/ports, src/app, src/domain, \
         the public functions of src/adapters and the node's library):\n{}",
        found.len(),
        found.join("\n")
    );
}

#[crate::common::test]
fn an_untyped_error_is_found_however_it_is_written() {
    for (code, why) in [
        (
            "fn f() -> Result<u32, String> {",
            Some("an error of type `String`"),
        ),
        (
            "fn f() -> Result<Vec<(u8, u8)>, Box<dyn std::error::Error>> {",
            Some("an error of type `Box<dyn std::error::Error>`"),
        ),
        ("fn f() -> anyhow::Result<()> {", Some("anyhow")),
        ("type Problem = String;", Some("a `type … = String`")),
        ("fn f() -> Result<String, ConfigError> {", None),
        ("fn f() -> io::Result<String> {", None),
    ] {
        assert_eq!(untyped_error(code).as_deref(), why, "{code}");
    }
}
