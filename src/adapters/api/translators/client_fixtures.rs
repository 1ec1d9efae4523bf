//! The requests real clients sent, captured and checked in under `tests/fixtures/clients/`,
//! for the translators' tests: a new client version's shape is one fixture away.

use serde_json::Value;

/// The body of the captured request in `tests/fixtures/clients/<file>`.
pub(in crate::adapters::api) fn client_request(file: &str) -> Value {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/clients")
        .join(file);
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
    let mut fixture: Value = serde_json::from_str(&text)
        .unwrap_or_else(|e| panic!("{} is not JSON: {e}", path.display()));
    fixture["body"].take()
}
