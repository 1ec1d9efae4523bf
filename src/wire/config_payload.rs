//! The one mapper from a node's definition to the config it is sent on registration.
//!
//! This is the only place adapter and runtime config is converted (the seed's
//! `BuildConfigPayload`); the transport only hands a record to the codec.

use crate::domain::{AdapterParts, NodeRecord, NodeRecordParts, RuntimeParts};

use super::proto;

/// Builds the `NodeConfigPayload` for `record`.
pub(super) fn build_config_payload(record: &NodeRecord) -> proto::NodeConfigPayload {
    let NodeRecordParts {
        id: _,
        alias: _,
        token: _,
        adapters,
        runtime,
    } = record.parts();
    let RuntimeParts {
        max_concurrent_runs,
        heartbeat_interval_ms,
        settings,
    } = runtime.parts();
    proto::NodeConfigPayload {
        adapters: adapters
            .iter()
            .map(|adapter| adapter.parts())
            .map(
                |AdapterParts {
                     name,
                     targets,
                     settings,
                 }| proto::AdapterConfig {
                    name: name.to_string(),
                    targets: targets.iter().map(ToString::to_string).collect(),
                    settings: settings.clone().into_iter().collect(),
                },
            )
            .collect(),
        runtime: Some(proto::RuntimeConfig {
            max_concurrent_runs,
            heartbeat_interval_ms,
            settings: settings.clone().into_iter().collect(),
        }),
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::domain::{AdapterDefinition, NodeDefinition, Token, validate_definitions};

    #[test]
    fn carries_every_adapter_target_setting_and_runtime_value() {
        let record = validate_definitions(&[NodeDefinition {
            id: "n".into(),
            alias: "a".into(),
            token: Some(Token::new("secret")),
            adapters: vec![AdapterDefinition {
                name: "ollama".into(),
                targets: vec!["llama3.1:8b".into(), "qwen".into()],
                settings: BTreeMap::from([("url".into(), "http://127.0.0.1:11434".into())]),
            }],
            max_concurrent_runs: 3,
            heartbeat_interval_ms: 2500,
            runtime_settings: BTreeMap::from([("gpu".into(), "0".into())]),
            ..Default::default()
        }])
        .unwrap()
        .remove(0);
        let payload = build_config_payload(&record);
        assert_eq!(payload.adapters.len(), 1);
        assert_eq!(payload.adapters[0].name, "ollama");
        assert_eq!(payload.adapters[0].targets, ["llama3.1:8b", "qwen"]);
        assert_eq!(
            payload.adapters[0].settings["url"],
            "http://127.0.0.1:11434"
        );
        let runtime = payload.runtime.unwrap();
        assert_eq!(
            (runtime.max_concurrent_runs, runtime.heartbeat_interval_ms),
            (3, 2500)
        );
        assert_eq!(runtime.settings["gpu"], "0");
    }
}
