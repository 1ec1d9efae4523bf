//! llama.cpp's `llama-server` and its LoRAs: started with `--lora a.gguf --lora b.gguf
//! --lora-init-without-apply`, it lists them at `GET /lora-adapters` (`[{"id", "path",
//! "scale", …}]`) and applies them per request (`"lora": [{"id", "scale"}]`).
//!
//! Checked against the llama-server the tests pin: `--lora-init-without-apply` still lists
//! every LoRA at scale 1.0, and a request **without** a `lora` field gets every LoRA at that
//! scale; an empty list changes nothing (`server-context.cpp`: `if
//! (!task.params.lora.empty())`, else the server's own scales). So every request names
//! every LoRA's scale: the run's LoRA at 1, every other at 0, all at 0 for the base
//! ([`scales`]). Pure.

use std::path::Path;

use serde_json::{Value, json};

use edge::domain::LoraName;

/// One LoRA `GET /lora-adapters` lists.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Listed {
    /// Its name: its file's stem.
    pub name: String,
    /// Its id in the server's list.
    pub id: u64,
    /// Its path, as the server was given it.
    pub path: String,
}

/// The LoRAs of `GET /lora-adapters`' `body`, each named by its file's stem; one whose
/// stem is not a valid name, or repeats an earlier one's, is left out (and said why).
pub fn listed(body: &[u8]) -> (Vec<Listed>, Vec<String>) {
    let answer: Value = serde_json::from_slice(body).unwrap_or(Value::Null);
    let mut found: Vec<Listed> = Vec::new();
    let mut left_out = Vec::new();
    for entry in answer.as_array().into_iter().flatten() {
        let (Some(id), Some(path)) = (entry["id"].as_u64(), entry["path"].as_str()) else {
            continue;
        };
        let stem = Path::new(path)
            .file_stem()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_default();
        if LoraName::parse(&stem).is_err() {
            left_out.push(format!(
                "{path}: its file's stem {stem:?} is not a valid name"
            ));
        } else if found.iter().any(|l| l.name == stem) {
            left_out.push(format!("{path}: another LoRA's file has the stem {stem:?}"));
        } else {
            found.push(Listed {
                name: stem,
                id,
                path: path.to_owned(),
            });
        }
    }
    (found, left_out)
}

/// The `lora` field of a request: every one of `ids` at 0 but `chosen`'s at 1.
pub fn scales(ids: impl IntoIterator<Item = u64>, chosen: Option<u64>) -> Value {
    let scales: Vec<Value> = ids
        .into_iter()
        .map(|id| {
            let scale = if Some(id) == chosen { 1.0 } else { 0.0 };
            json!({"id": id, "scale": scale})
        })
        .collect();
    Value::Array(scales)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loras_are_named_by_their_files_stem() {
        let body =
            br#"[{"id":0,"path":"/loras/sql.gguf","scale":1.0,"task_name":"","prompt_prefix":""},
            {"id":1,"path":"tone.gguf","scale":1.0},
            {"id":2,"path":"/other/sql.gguf","scale":1.0},
            {"id":3,"path":"/loras/bad name.gguf","scale":1.0}]"#;
        let (found, left_out) = listed(body);
        let names: Vec<(&str, u64)> = found.iter().map(|l| (l.name.as_str(), l.id)).collect();
        assert_eq!(names, [("sql", 0), ("tone", 1)]);
        assert_eq!(left_out.len(), 2, "{left_out:?}");
        assert!(listed(b"not json").0.is_empty());
    }

    #[test]
    fn every_lora_is_named_at_0_but_the_runs() {
        assert_eq!(
            scales([0, 1], Some(1)),
            json!([{"id": 0, "scale": 0.0}, {"id": 1, "scale": 1.0}])
        );
        assert_eq!(
            scales([0, 1], None),
            json!([{"id": 0, "scale": 0.0}, {"id": 1, "scale": 0.0}])
        );
    }
}
