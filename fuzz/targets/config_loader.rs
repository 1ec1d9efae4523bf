//! Fuzz target `config_loader`: arbitrary bytes as the TOML config file, read by
//! `Settings::load` and then `FileNodeStore::load_from_config`.
//!
//! Invariants: nothing panics, and no error message repeats a `token = "..."` value of the
//! file. A token is found as a `token` key followed by a one-line basic or literal string of
//! at least three letters, digits, `-` or `_`; when the file is valid TOML, only values that
//! the parsed file holds under `token` keys exactly as often count (the text `token = 'x'`
//! inside another string is not a token). Whether a message shows a token is decided by
//! loading a twin file in which every token value is replaced by a different string of the
//! same shape (letters rotated by 13, digits by 5): a message that contains the value in one
//! load but not in the other got it from the token. (Comparing with a twin keeps a name that
//! merely equals a token, such as an id, from counting as a leak.)
//!
//! This file is shared by the libFuzzer binary and the root crate's corpus replay test, so it
//! must build on stable and stay clippy-clean.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use edge::Settings;
use edge::components::FileNodeStore;

/// Token values shorter than this are too likely to occur in any message.
const MIN_TOKEN_LEN: usize = 3;

/// Runs one input.
pub fn run(data: &[u8]) {
    let message = load(data);
    let tokens = tokens(data);
    let tokens = match parsed_tokens(data) {
        // Not TOML: a message quoting any of it would be the leak.
        None => tokens,
        Some(parsed) => {
            let count = |value: &[u8]| {
                let scanned = tokens
                    .iter()
                    .filter(|&&(s, e)| &data[s..e] == value)
                    .count();
                let held = parsed.iter().filter(|p| p.as_bytes() == value).count();
                scanned == held
            };
            tokens
                .iter()
                .copied()
                .filter(|&(s, e)| count(&data[s..e]))
                .collect()
        }
    };
    if tokens.is_empty() {
        return;
    }
    let Some(message) = message else {
        return;
    };
    let twin_data = twin(data, &tokens);
    let twin_message = load(&twin_data).unwrap_or_default();
    for &(start, end) in &tokens {
        let token = String::from_utf8_lossy(&data[start..end]);
        let other = String::from_utf8_lossy(&twin_data[start..end]);
        let leaked = (message.contains(&*token) && !twin_message.contains(&*token))
            || (twin_message.contains(&*other) && !message.contains(&*other));
        assert!(
            !leaked,
            "an error message shows the token {token:?}:\n{message}\n-- twin --\n{twin_message}"
        );
    }
}

/// Loads `data` as the config file; returns the error message, if loading failed, with the
/// file's path replaced by `<path>`.
fn load(data: &[u8]) -> Option<String> {
    let path = config_path();
    std::fs::write(path, data).expect("write the config file");
    let message = match Settings::load(Some(path)) {
        Ok(settings) => FileNodeStore::load_from_config(&settings.source)
            .err()?
            .to_string(),
        Err(error) => error.to_string(),
    };
    Some(message.replace(&path.display().to_string(), "<path>"))
}

/// Every string held under a `token` key when `data` is valid TOML.
fn parsed_tokens(data: &[u8]) -> Option<Vec<String>> {
    let text = std::str::from_utf8(data).ok()?;
    let root = config::Config::builder()
        .add_source(config::File::from_str(text, config::FileFormat::Toml))
        .build()
        .ok()?
        .try_deserialize::<config::Value>()
        .ok()?;
    let mut found = Vec::new();
    walk("", root, &mut found);
    Some(found)
}

fn walk(key: &str, value: config::Value, found: &mut Vec<String>) {
    match value.kind {
        config::ValueKind::String(text) if key == "token" => found.push(text),
        config::ValueKind::Table(table) => {
            for (key, value) in table {
                walk(&key, value, found);
            }
        }
        config::ValueKind::Array(values) => {
            for value in values {
                walk(key, value, found);
            }
        }
        _ => {}
    }
}

/// A file in a directory of this process's own, rewritten for every input.
fn config_path() -> &'static Path {
    static PATH: OnceLock<(tempfile::TempDir, PathBuf)> = OnceLock::new();
    let (_dir, path) = PATH.get_or_init(|| {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let path = dir.path().join("edge.toml");
        (dir, path)
    });
    path
}

/// The byte ranges of the values of `token = "..."` and `token = '...'` in `data`.
fn tokens(data: &[u8]) -> Vec<(usize, usize)> {
    let mut found = Vec::new();
    let mut at = 0;
    while let Some(offset) = find(&data[at..], b"token") {
        let key = at + offset;
        at = key + 1;
        let before_is_name = key > 0 && is_key_char(data[key - 1]);
        let after = key + b"token".len();
        if before_is_name || data.get(after).is_some_and(|b| is_key_char(*b)) {
            continue;
        }
        let mut i = skip_blanks(data, after);
        if data.get(i) != Some(&b'=') {
            continue;
        }
        i = skip_blanks(data, i + 1);
        let Some(&quote) = data.get(i).filter(|q| matches!(q, b'"' | b'\'')) else {
            continue;
        };
        let start = i + 1;
        let len = data[start..]
            .iter()
            .take_while(|b| is_token_char(**b))
            .count();
        if len >= MIN_TOKEN_LEN && data.get(start + len) == Some(&quote) {
            found.push((start, start + len));
        }
    }
    found
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

fn skip_blanks(data: &[u8], mut i: usize) -> usize {
    while data.get(i).is_some_and(|b| matches!(b, b' ' | b'\t')) {
        i += 1;
    }
    i
}

fn is_key_char(byte: u8) -> bool {
    byte.is_ascii_alphanumeric() || matches!(byte, b'_' | b'-')
}

fn is_token_char(byte: u8) -> bool {
    is_key_char(byte)
}

/// `data` with every token value replaced by its rotation.
fn twin(data: &[u8], tokens: &[(usize, usize)]) -> Vec<u8> {
    let mut twin = data.to_vec();
    for &(start, end) in tokens {
        for byte in &mut twin[start..end] {
            *byte = rotate(*byte);
        }
    }
    twin
}

/// A different character of the same class: letters by 13, digits by 5; `-` and `_` stay.
fn rotate(byte: u8) -> u8 {
    match byte {
        b'a'..=b'z' => b'a' + (byte - b'a' + 13) % 26,
        b'A'..=b'Z' => b'A' + (byte - b'A' + 13) % 26,
        b'0'..=b'9' => b'0' + (byte - b'0' + 5) % 10,
        other => other,
    }
}
