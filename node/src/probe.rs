//! Target availability: which configured targets an engine can serve now, judged from its
//! public `GET /models` (never from an engine's private slot or status endpoints, which move
//! between versions and may expose prompts).
//!
//! The mapping is pure ([`available_targets`], and [`unmatched_fix`] for a target the
//! engine's list does not name); the loop probes at start and every `probe_interval_ms`
//! (every `probe_down_interval_ms` while the engine is down), reports each result to the
//! availability board ([`crate::board`]), which tells the edge when the set changes, and
//! warns, naming the setting that fixes it, when an answering engine lists nothing a
//! configured target maps to.
//! A managed adapter's engine is observed by [`engine_models`] instead, which reads its
//! catalogue (every model's load state), not only what it lists.

use std::collections::BTreeMap;
use std::sync::Arc;

use tokio_util::sync::CancellationToken;

use crate::board::{Board, Finding};
use crate::engine_health::EngineHealth;
use crate::openai::OpenAiAdapter;
use crate::openai::engine_models;
use crate::openai::settings::{AvailabilityMode, OpenAiSettings};
use crate::upstream::same_model;

/// The targets available given the engine's model list (`None`: the engine could not be
/// asked, so none is).
pub fn available_targets(
    targets: &[String],
    settings: &OpenAiSettings,
    listed: Option<&[String]>,
) -> Vec<String> {
    let Some(listed) = listed else {
        return Vec::new();
    };
    targets
        .iter()
        .filter(|target| match settings.availability {
            AvailabilityMode::Reachable => true,
            AvailabilityMode::Listed => {
                let wanted = settings.upstream_model(target);
                listed.iter().any(|name| same_model(name, wanted))
            }
        })
        .cloned()
        .collect()
}

/// What to set so `target` (mapped to the `wanted` upstream name) matches the engine's
/// `listed` models, for the warning about a target that matches nothing listed.
pub fn unmatched_fix(target: &str, wanted: &str, listed: &[String]) -> String {
    let reachable = "or set `availability = \"reachable\"` to serve it whenever the engine answers";
    match listed {
        [] => format!("the engine lists no models: {reachable}"),
        [only] => format!(
            "the engine lists only {only:?} (llama-server lists its model by file path): \
             set `model.{target} = {only:?}` in the adapter's settings, {reachable}"
        ),
        _ => format!(
            "no listed id is {wanted:?}: set `model.{target}` to the id the engine lists \
             for it, {reachable}"
        ),
    }
}

/// Warns once per change of the set: each configured target an answering engine's
/// `listed` models do not name, with the setting that fixes it.
fn warn_unmatched(
    adapter: &OpenAiAdapter,
    listed: &[String],
    available: &[String],
    warned: &mut Vec<String>,
) {
    let unmatched: Vec<String> = adapter
        .targets()
        .iter()
        .filter(|target| !available.contains(target))
        .cloned()
        .collect();
    if unmatched == *warned {
        return;
    }
    for target in &unmatched {
        let wanted = adapter.settings().upstream_model(target);
        tracing::warn!(
            adapter = adapter.name(),
            target = %target,
            ?listed,
            fix = %unmatched_fix(target, wanted, listed),
            "a configured target matches nothing the engine lists, so the edge gets no node for it"
        );
    }
    *warned = unmatched;
}

/// The context windows of the `available` targets: each one's setting, else the window the
/// engine's model list gives its upstream model (vLLM), else `served` (llama-server's own,
/// asked only when some target needs it); targets with none are left out.
pub fn target_windows(
    available: &[String],
    settings: &OpenAiSettings,
    listed: &BTreeMap<String, u32>,
    served: Option<u32>,
) -> BTreeMap<String, u32> {
    available
        .iter()
        .filter_map(|target| {
            let window = settings
                .window_of(target)
                .or_else(|| listed.get(settings.upstream_model(target)).copied())
                .or(served)?;
            Some((target.clone(), window))
        })
        .collect()
}

/// The context windows of `adapter`'s `available` targets, asking the engine's `/props` only
/// when neither a setting nor the model list gives one.
async fn windows_of(
    adapter: &OpenAiAdapter,
    available: &[String],
    listed: &BTreeMap<String, u32>,
) -> BTreeMap<String, u32> {
    let settings = adapter.settings();
    let known = target_windows(available, settings, listed, None);
    if known.len() == available.len() && !adapter.wants_engine_kind() {
        return known;
    }
    target_windows(available, settings, listed, adapter.served_window().await)
}

/// Probes `adapter`'s engine until `stop`, reporting each result to `board` (a managed
/// engine's catalogue, by [`engine_models::probe_loop`]).
pub async fn probe_loop(adapter: Arc<OpenAiAdapter>, board: Board, stop: CancellationToken) {
    if let Some(engine) = adapter.managed() {
        return engine_models::probe_loop(&adapter, engine, &board, &stop).await;
    }
    let mut health = EngineHealth::new(adapter.name(), "engine");
    let mut warned = Vec::new();
    loop {
        let listed = adapter.list_models().await;
        let available = available_targets(
            adapter.targets(),
            adapter.settings(),
            listed.as_ref().ok().map(|list| list.ids.as_slice()),
        );
        match &listed {
            Ok(models) => {
                if health.up() {
                    tracing::info!(
                        adapter = adapter.name(),
                        ?models,
                        ?available,
                        "engine is up"
                    );
                }
            }
            Err(fault) => health.down(fault),
        }
        let windows = match &listed {
            Ok(models) => {
                warn_unmatched(&adapter, &models.ids, &available, &mut warned);
                windows_of(&adapter, &available, &models.windows).await
            }
            Err(_) => BTreeMap::new(),
        };
        let finding = Finding {
            targets: available,
            windows,
            managed: None,
        };
        board.report(adapter.name(), finding);
        if listed.is_ok() {
            adapter.loras().refresh().await;
        }
        let settings = adapter.settings();
        let (up_every, down_every) = (settings.probe_interval, settings.probe_down_interval);
        if !health.until_next_probe(up_every, down_every, &stop).await {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;

    fn settings(pairs: &[(&str, &str)]) -> OpenAiSettings {
        crate::openai::settings::for_tests(pairs)
    }

    fn names(list: &[&str]) -> Vec<String> {
        list.iter().map(|s| (*s).to_owned()).collect()
    }

    #[test]
    fn listed_models_through_the_model_map() {
        let settings = settings(&[("model.qwen", "Qwen/Qwen2.5-0.5B-Instruct")]);
        let targets = names(&["qwen", "llama3.1", "phi"]);
        let listed = names(&["Qwen/Qwen2.5-0.5B-Instruct", "llama3.1:latest", "mistral"]);
        assert_eq!(
            available_targets(&targets, &settings, Some(&listed)),
            ["qwen", "llama3.1"]
        );
    }

    #[test]
    fn an_unmatched_target_is_told_the_setting_that_fixes_it() {
        // llama-server lists the file it loaded, not the target the edge routes.
        let one = unmatched_fix("tiny", "tiny", &names(&["/models/tiny.gguf"]));
        assert!(
            one.contains(r#"`model.tiny = "/models/tiny.gguf"`"#),
            "{one}"
        );
        assert!(one.contains(r#"`availability = "reachable"`"#), "{one}");
        let many = unmatched_fix("qwen", "Qwen/Qwen2.5", &names(&["a", "b"]));
        assert!(
            many.contains("`model.qwen`") && many.contains("\"Qwen/Qwen2.5\""),
            "{many}"
        );
        assert!(many.contains(r#"`availability = "reachable"`"#), "{many}");
        let none = unmatched_fix("tiny", "tiny", &[]);
        assert!(none.contains("lists no models"), "{none}");
        assert!(none.contains(r#"`availability = "reachable"`"#), "{none}");
    }

    #[test]
    fn a_down_engine_serves_nothing() {
        let settings = settings(&[("availability", "reachable")]);
        assert!(available_targets(&names(&["a"]), &settings, None).is_empty());
    }

    #[test]
    fn reachable_mode_serves_every_target_whatever_is_listed() {
        let settings = settings(&[("availability", "reachable")]);
        let targets = names(&["a", "b"]);
        assert_eq!(
            available_targets(&targets, &settings, Some(&names(&["model.gguf"]))),
            targets
        );
        assert_eq!(available_targets(&targets, &settings, Some(&[])), targets);
    }

    #[test]
    fn a_targets_window_is_its_setting_else_the_model_lists_else_the_engines_own() {
        let mapped = settings(&[
            ("model.qwen", "Qwen/Qwen2.5"),
            ("context_window.pinned", "4096"),
        ]);
        let available = names(&["qwen", "pinned", "tiny"]);
        let listed = BTreeMap::from([("Qwen/Qwen2.5".to_owned(), 32_768)]);
        assert_eq!(
            target_windows(&available, &mapped, &listed, Some(2_048)),
            BTreeMap::from([
                ("pinned".to_owned(), 4_096),
                ("qwen".to_owned(), 32_768),
                ("tiny".to_owned(), 2_048),
            ])
        );
        // Without the engine's own, a target with neither has none.
        let known = target_windows(&available, &mapped, &listed, None);
        assert_eq!(known.len(), 2);
        // `context_window` is every other target's.
        let every = settings(&[("context_window", "8192")]);
        let windows = target_windows(&names(&["a"]), &every, &BTreeMap::new(), Some(1));
        assert_eq!(windows, BTreeMap::from([("a".to_owned(), 8_192)]));
    }

    #[test]
    fn a_window_setting_must_be_a_number() {
        let mut map = BTreeMap::from([("base_url".to_owned(), "http://h:1/v1".to_owned())]);
        map.insert("context_window.qwen".into(), "big".into());
        let problem = OpenAiSettings::parse(&map).unwrap_err().to_string();
        assert!(problem.contains("`context_window.qwen`"), "{problem}");
    }
}
