//! vLLM and its LoRAs (`VLLM_ALLOW_RUNTIME_LORA_UPDATING=True`, `--enable-lora`): a folder
//! of LoRA folders (`lora_dir`), one per name, each registered on the server with `POST
//! /v1/load_lora_adapter {"lora_name", "lora_path"}` before its first run and, past
//! `max_registered`, unregistered with `POST /v1/unload_lora_adapter {"lora_name"}`.
//!
//! From vllm-project/vllm (`vllm/entrypoints/serve/lora/api_router.py`,
//! `vllm/entrypoints/openai/models/serving.py`): `GET /v1/models` lists each registered
//! LoRA as a model of its own, its `parent` the base model and its `root` the path it was
//! registered from; registering a name already registered is a 400 ("has already been
//! loaded"), unregistering one that is not is a 404. A request names a LoRA by its `model`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use edge::domain::LoraName;
use serde_json::{Value, json};

use crate::fault::UpstreamFault;
use crate::openai::engine_models::{BeginError, refusal};
use crate::upstream::Upstream;

/// The most of an answer read (a registration's is one line).
const MAX_ANSWER: usize = 64 * 1024;

/// The LoRA folders in `dir`, by name (a folder whose name is not a valid name is left
/// out); none when it cannot be read.
pub fn folders(dir: &Path) -> BTreeMap<String, PathBuf> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return BTreeMap::new();
    };
    entries
        .filter_map(Result::ok)
        .filter(|entry| entry.file_type().is_ok_and(|kind| kind.is_dir()))
        .filter_map(|entry| {
            let name = entry.file_name().to_string_lossy().into_owned();
            LoraName::parse(&name).ok()?;
            Some((name, entry.path()))
        })
        .collect()
}

/// The LoRAs `GET /v1/models`' `body` lists as registered: each model with a `parent`, by
/// name, with the path it was registered from.
pub fn registered(body: &[u8]) -> BTreeMap<String, String> {
    let answer: Value = serde_json::from_slice(body).unwrap_or(Value::Null);
    answer["data"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|card| card["parent"].is_string())
        .filter_map(|card| {
            let name = card["id"].as_str()?.to_owned();
            let root = card["root"].as_str().unwrap_or_default().to_owned();
            Some((name, root))
        })
        .collect()
}

/// Registers `name` from `path` on `server`; one already registered counts as done.
///
/// # Errors
/// [`BeginError::Refused`] with the server's status and words, [`BeginError::Fault`] when it
/// cannot be asked.
pub async fn register(server: &Upstream, name: &str, path: &str) -> Result<(), BeginError> {
    let body = json!({"lora_name": name, "lora_path": path});
    match answer(server, "/load_lora_adapter", &body).await {
        Err(BeginError::Refused {
            status: 400,
            message,
        }) if message.contains("already been loaded") => Ok(()),
        other => other,
    }
}

/// Unregisters `name` from `server`; one not registered counts as done.
///
/// # Errors
/// As [`register`].
pub async fn unregister(server: &Upstream, name: &str) -> Result<(), BeginError> {
    match answer(server, "/unload_lora_adapter", &json!({"lora_name": name})).await {
        Err(BeginError::Refused { status: 404, .. }) => Ok(()),
        other => other,
    }
}

async fn answer(server: &Upstream, path: &str, body: &Value) -> Result<(), BeginError> {
    match server.post(path, body).await {
        Ok(mut response) => Ok(server
            .read_to_end(&mut response, MAX_ANSWER)
            .await
            .map(drop)?),
        Err(UpstreamFault::Status { status, body }) => Err(refusal(status, &body)),
        Err(fault) => Err(fault.into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn registered_loras_are_the_models_with_a_parent() {
        let body = br#"{"object":"list","data":[
            {"id":"qwen","object":"model","root":"/models/qwen","parent":null,"max_model_len":8192},
            {"id":"sql","object":"model","root":"/loras/sql","parent":"qwen","max_model_len":null}]}"#;
        let found = registered(body);
        assert_eq!(found.len(), 1);
        assert_eq!(found["sql"], "/loras/sql");
    }

    #[test]
    fn loras_are_the_folders_of_the_dir() {
        let dir = std::env::temp_dir().join(format!("edge-lora-dir-{}", std::process::id()));
        std::fs::create_dir_all(dir.join("sql")).expect("folder");
        std::fs::create_dir_all(dir.join("bad name")).expect("folder");
        std::fs::write(dir.join("notes.txt"), "a file, no LoRA").expect("file");
        let found = folders(&dir);
        assert_eq!(found.keys().collect::<Vec<_>>(), ["sql"]);
        assert!(folders(&dir.join("absent")).is_empty());
        std::fs::remove_dir_all(&dir).expect("clean up");
    }
}
