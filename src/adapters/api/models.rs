//! The `model` notion, which exists only here: an external model id maps to the
//! `adapter + target` every run inside the edge is addressed by, and back for
//! `GET /v1/models`.
//!
//! A model id is an alias from `[api.models]`, or else `ADAPTER/TARGET`, split at the first
//! `/` (adapter names never contain one; targets may, as in `vllm/Qwen/Qwen2.5-7B`). Nothing
//! past this module sees a model id. A LoRA some node reported is a model too,
//! `ADAPTER/LORA`: its runs are its base's, with the LoRA in their routing ([`with_lora`]),
//! and `/v1/models` lists it with its base as `parent`.

use std::collections::BTreeMap;
use std::time::{SystemTime, UNIX_EPOCH};

use axum::Json;
use axum::extract::{Path, State};
use axum::response::{IntoResponse, Response};
use serde::ser::SerializeMap as _;
use serde::{Serialize, Serializer};

use super::ApiError;
use crate::adapters::api::ApiState;
use crate::domain::{AdapterName, LoraBook, NameError, NodeLora, RunSpec, Target};
use crate::ports::ConnectedNode;

/// Where a model id leads: the adapter and target of its runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModelRoute {
    /// The adapter that runs it.
    pub adapter: AdapterName,
    /// The adapter's target.
    pub target: Target,
}

/// Why a string is not an `ADAPTER/TARGET` model id.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ModelIdError {
    /// There is no `/`.
    #[error("model id {0:?} is not of the form ADAPTER/TARGET")]
    NoSlash(String),
    /// The adapter or the target is not a valid name.
    #[error("model id {id:?} is not of the form ADAPTER/TARGET: {reason}")]
    BadName {
        /// The model id.
        id: String,
        /// What is wrong with the adapter or target.
        reason: NameError,
    },
}

impl ModelRoute {
    /// Parses `ADAPTER/TARGET`, split at the first `/`.
    ///
    /// # Errors
    /// [`ModelIdError`] when there is no `/` or either half is not a valid name.
    pub fn parse(id: &str) -> Result<Self, ModelIdError> {
        let (adapter, target) = id
            .split_once('/')
            .ok_or_else(|| ModelIdError::NoSlash(id.to_owned()))?;
        let bad = |reason| ModelIdError::BadName {
            id: id.to_owned(),
            reason,
        };
        Ok(Self {
            adapter: AdapterName::parse(adapter).map_err(bad)?,
            target: Target::parse(target).map_err(bad)?,
        })
    }

    /// The canonical model id, `ADAPTER/TARGET`.
    pub fn id(&self) -> String {
        format!("{}/{}", self.adapter, self.target)
    }
}

/// The aliases of `[api.models]`, validated, and the rule for every other model id.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ModelMap {
    aliases: BTreeMap<String, ModelRoute>,
}

impl ModelMap {
    /// Builds the map from `[api.models]`.
    ///
    /// # Errors
    /// Every invalid alias, one message each, naming the key and the alias.
    pub fn new(aliases: &BTreeMap<String, String>) -> Result<Self, Vec<String>> {
        let problems = Self::problems(aliases);
        if !problems.is_empty() {
            return Err(problems);
        }
        let aliases = aliases
            .iter()
            .filter_map(|(alias, id)| Some((alias.clone(), ModelRoute::parse(id).ok()?)))
            .collect();
        Ok(Self { aliases })
    }

    /// What is wrong with `[api.models]`: an empty alias, or a value that is not
    /// `ADAPTER/TARGET` with valid names.
    ///
    /// A message names the alias but never repeats its value: a node's `token = "..."` whose
    /// `[[nodes]]` header is missing lands in this table when it is the one above.
    pub fn problems(aliases: &BTreeMap<String, String>) -> Vec<String> {
        aliases
            .iter()
            .filter_map(|(alias, id)| {
                if alias.trim().is_empty() {
                    return Some(format!("`api.models` has an empty alias (for {id:?})"));
                }
                ModelRoute::parse(id).err().map(|error| {
                    format!(
                        "`api.models.{alias:?}` (alias {alias:?}): the value is not a model id \
                         of the form ADAPTER/TARGET: {} (the value is not repeated here)",
                        without_value(&error)
                    )
                })
            })
            .collect()
    }

    /// Where `model` leads: its alias, or else its own `ADAPTER/TARGET`.
    ///
    /// # Errors
    /// [`ModelIdError`] when `model` is neither an alias nor `ADAPTER/TARGET`.
    pub fn resolve(&self, model: &str) -> Result<ModelRoute, ModelIdError> {
        match self.aliases.get(model) {
            Some(route) => Ok(route.clone()),
            None => ModelRoute::parse(model),
        }
    }

    /// The models `nodes` can serve: every `ADAPTER/TARGET` some node's config lists, its
    /// last availability report too (if it sent one) or its engine can load on command,
    /// and that is not drained; every LoRA of such a target a node reported as `loras`
    /// knows it (`ADAPTER/LORA`, with its base as `parent`); and every alias leading to
    /// one of those; sorted by id. A model's context window is the smallest its serving
    /// nodes reported, so a request that fits it fits any of them (a LoRA's, its base's).
    pub fn served(&self, nodes: &[ConnectedNode], loras: &LoraBook) -> Vec<ListedModel> {
        let mut served: BTreeMap<String, ListedModel> = BTreeMap::new();
        for node in nodes {
            let created = unix_seconds(node.connected_since);
            for adapter in node.record.adapters() {
                for target in adapter.targets() {
                    let (name, serving) = (adapter.name(), node.serves_now(adapter.name(), target));
                    if !serving && !node.can_load(name, target) {
                        continue;
                    }
                    let window = node
                        .availability
                        .as_ref()
                        .and_then(|a| a.context_window(adapter.name(), target));
                    let base = ModelRoute {
                        adapter: name.clone(),
                        target: target.clone(),
                    };
                    self.add(&mut served, &base, created, window, None);
                    for lora in loras_of(node, name, target, loras) {
                        let route = ModelRoute {
                            adapter: name.clone(),
                            target: lora.name.as_target().clone(),
                        };
                        self.add(&mut served, &route, created, window, Some(&base));
                    }
                }
            }
        }
        served.into_values().collect()
    }

    /// Adds `route` (and every alias of it) as served since `created` with `window`; a
    /// LoRA's `parent` is its base.
    fn add(
        &self,
        served: &mut BTreeMap<String, ListedModel>,
        route: &ModelRoute,
        created: u64,
        window: Option<u32>,
        parent: Option<&ModelRoute>,
    ) {
        let found = Served {
            created,
            window,
            route,
            parent: parent.map(ModelRoute::id),
        };
        add(served, route.id(), &found);
        for (alias, aliased) in &self.aliases {
            if aliased == route {
                add(served, alias.clone(), &found);
            }
        }
    }
}

/// The LoRAs of `adapter + target` that `node` reported and `loras` knows by the same
/// weights.
fn loras_of<'a>(
    node: &'a ConnectedNode,
    adapter: &'a AdapterName,
    target: &'a Target,
    loras: &'a LoraBook,
) -> impl Iterator<Item = &'a NodeLora> {
    node.availability
        .iter()
        .flat_map(move |a| a.loras(adapter))
        .filter(move |lora| &lora.base == target && loras.agrees(adapter, lora))
}

/// `spec`, asked for by a model id naming a LoRA some node reported (`llama/sql`): the run
/// of its base with the LoRA in its routing, so only nodes with the LoRA's weights take it.
/// Any other spec as it is (a model no node definition serves and no node reported stays
/// unknown: 404).
pub fn with_lora(mut spec: RunSpec, loras: &LoraBook) -> RunSpec {
    if spec.routing.lora.is_none()
        && let Some((base, choice)) = loras.choice(&spec.selector.adapter, &spec.selector.target)
    {
        spec.selector.target = base;
        spec.routing.lora = Some(choice);
    }
    spec
}

/// The smallest context window the nodes among `nodes` serving `adapter + target` now
/// reported; `None` when none did.
pub fn smallest_window(
    nodes: &[ConnectedNode],
    adapter: &AdapterName,
    target: &Target,
) -> Option<u32> {
    nodes
        .iter()
        .filter(|node| node.serves_now(adapter, target))
        .filter_map(|node| node.availability.as_ref()?.context_window(adapter, target))
        .min()
}

/// What is wrong with a model id, without quoting any of it.
fn without_value(error: &ModelIdError) -> String {
    match error {
        ModelIdError::NoSlash(_) => "it has no `/`".to_owned(),
        ModelIdError::BadName { reason, .. } => match reason {
            NameError::Empty { kind } => format!("the {kind} is empty"),
            NameError::TooLong { kind, max, .. } => {
                format!("the {kind} is longer than {max} bytes")
            }
            NameError::BadCharacter { kind, allowed, .. } => {
                format!("the {kind} holds a character outside {allowed}")
            }
        },
    }
}

/// One node's serving of a model, as the model list gathers it.
struct Served<'a> {
    /// When the node connected (Unix seconds).
    created: u64,
    /// The context window the node reported for it.
    window: Option<u32>,
    route: &'a ModelRoute,
    /// For a LoRA, its base's model id.
    parent: Option<String>,
}

fn add(served: &mut BTreeMap<String, ListedModel>, id: String, found: &Served<'_>) {
    let entry = served.entry(id.clone()).or_insert_with(|| ListedModel {
        id,
        object: "model",
        created: found.created,
        owned_by: found.route.adapter.to_string(),
        parent: found.parent.clone(),
        window: None,
    });
    entry.created = entry.created.min(found.created);
    if let Some(window) = found.window {
        let smallest = entry
            .window
            .map_or(window, |Window(known)| known.min(window));
        entry.window = Some(Window(smallest));
    }
}

/// A model's context window in tokens, written as the three fields clients read it under:
/// `context_window`; `max_input_tokens`, the longest prompt (Anthropic's models API names it
/// so); `max_tokens`, the most an answer may hold, prompt included.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Window(pub u32);

impl Serialize for Window {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut map = serializer.serialize_map(Some(3))?;
        for key in ["context_window", "max_input_tokens", "max_tokens"] {
            map.serialize_entry(key, &self.0)?;
        }
        map.end()
    }
}

fn unix_seconds(at: SystemTime) -> u64 {
    at.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

/// One entry of `GET /v1/models`, in OpenAI's `model` object shape.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ListedModel {
    /// The model id clients send.
    pub id: String,
    /// Always `model`.
    pub object: &'static str,
    /// When the earliest node serving it connected (Unix seconds).
    pub created: u64,
    /// The adapter that runs it.
    pub owned_by: String,
    /// For a LoRA, the model it is a fine-tune of (as vLLM lists its LoRAs); absent for
    /// any other model.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub parent: Option<String>,
    /// Its context window: the smallest its serving nodes reported (no fields when none
    /// did). Agents size their compaction by it.
    #[serde(flatten, skip_serializing_if = "Option::is_none")]
    pub window: Option<Window>,
}

/// OpenAI's list shape.
#[derive(Serialize)]
struct ModelList {
    object: &'static str,
    data: Vec<ListedModel>,
}

/// `GET /v1/models`: the models the connected nodes can serve right now.
pub(super) async fn list(State(state): State<ApiState>) -> Response {
    let nodes = state.registry.snapshot();
    let data = state.api.models().served(&nodes, &state.loras.book());
    Json(ModelList {
        object: "list",
        data,
    })
    .into_response()
}

/// `GET /v1/models/{model}`: one served model, or 404.
pub(super) async fn retrieve(State(state): State<ApiState>, Path(model): Path<String>) -> Response {
    let nodes = state.registry.snapshot();
    let served = state.api.models().served(&nodes, &state.loras.book());
    match served.into_iter().find(|m| m.id == model) {
        Some(found) => Json(found).into_response(),
        None => ApiError::model_not_found(&model).into_response(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_window_is_written_under_each_name_clients_read_and_none_is_left_out() {
        let mut model = ListedModel {
            id: "llama/qwen".into(),
            object: "model",
            created: 1,
            owned_by: "llama".into(),
            parent: None,
            window: None,
        };
        let json = serde_json::to_value(&model).unwrap();
        assert_eq!(json.as_object().map(|o| o.len()), Some(4), "{json}");
        model.window = Some(Window(32_768));
        let json = serde_json::to_value(&model).unwrap();
        for key in ["context_window", "max_input_tokens", "max_tokens"] {
            assert_eq!(json[key], 32_768, "{json}");
        }
    }

    #[test]
    fn a_model_naming_a_known_lora_runs_its_base_with_it() {
        use crate::domain::{
            Availability, LoraFile, LoraName, LoraState, NodeId, NodeLora, NodeSelector, Operation,
        };
        let llama = AdapterName::parse("llama").unwrap();
        let report = Availability::new([]).with_loras(
            llama.clone(),
            vec![NodeLora {
                name: LoraName::parse("sql").unwrap(),
                base: Target::parse("qwen").unwrap(),
                file: LoraFile {
                    path: "/loras/sql.gguf".into(),
                    sha256: None,
                },
                state: LoraState::Loaded,
            }],
        );
        let mut book = LoraBook::default();
        let node = NodeId::parse("a").unwrap();
        book.learn(book.observe(&node, &report, |_, _| false));
        let spec = |target: &str| RunSpec {
            selector: NodeSelector {
                adapter: llama.clone(),
                target: Target::parse(target).unwrap(),
                pin: None,
            },
            input: bytes::Bytes::new(),
            content_type: String::new(),
            params: BTreeMap::new(),
            deadline: None,
            operation: Operation::Chat,
            routing: crate::domain::RunRouting::default(),
        };
        let lora = with_lora(spec("sql"), &book);
        assert_eq!(lora.selector.target.as_str(), "qwen");
        assert_eq!(lora.model_target().as_str(), "sql");
        assert_eq!(
            lora.routing.lora.map(|l| l.file.path),
            Some("/loras/sql.gguf".into())
        );
        let other = with_lora(spec("nope"), &book);
        assert_eq!(
            (other.selector.target.as_str(), other.routing.lora),
            ("nope", None)
        );
    }

    #[test]
    fn config_problems_do_not_repeat_the_value() {
        // Found by the `config_loader` fuzz target: a node token under a lost `[[nodes]]`.
        for value in ["secret-token", "secret token/x", "echo/secret token"] {
            let problems =
                ModelMap::problems(&BTreeMap::from([("token".to_owned(), value.to_owned())]));
            assert_eq!(problems.len(), 1);
            assert!(
                problems[0].contains("`api.models.\"token\"`"),
                "{problems:?}"
            );
            assert!(!problems[0].contains("secret"), "{problems:?}");
        }
    }

    #[test]
    fn splits_at_the_first_slash() {
        let route = ModelRoute::parse("vllm/Qwen/Qwen2.5-7B").unwrap();
        assert_eq!(route.adapter.as_str(), "vllm");
        assert_eq!(route.target.as_str(), "Qwen/Qwen2.5-7B");
        assert_eq!(route.id(), "vllm/Qwen/Qwen2.5-7B");
        assert!(matches!(
            ModelRoute::parse("gpt-4o"),
            Err(ModelIdError::NoSlash(_))
        ));
        assert!(matches!(
            ModelRoute::parse("/x"),
            Err(ModelIdError::BadName { .. })
        ));
        assert!(matches!(
            ModelRoute::parse("echo/"),
            Err(ModelIdError::BadName { .. })
        ));
        assert!(matches!(
            ModelRoute::parse("bad name/x"),
            Err(ModelIdError::BadName { .. })
        ));
    }

    #[test]
    fn aliases_win_over_the_split() {
        let map = ModelMap::new(&BTreeMap::from([
            ("gpt-4o-mini".to_owned(), "ollama/llama3.1:8b".to_owned()),
            ("echo/default".to_owned(), "echo/fast".to_owned()),
        ]))
        .unwrap();
        assert_eq!(
            map.resolve("gpt-4o-mini").unwrap().id(),
            "ollama/llama3.1:8b"
        );
        assert_eq!(map.resolve("echo/default").unwrap().id(), "echo/fast");
        assert_eq!(map.resolve("echo/other").unwrap().id(), "echo/other");
        assert!(map.resolve("gpt-4o").is_err());
    }

    #[test]
    fn invalid_aliases_are_all_reported() {
        let problems = ModelMap::new(&BTreeMap::from([
            ("a".to_owned(), "nothing".to_owned()),
            ("b".to_owned(), "ok/fine".to_owned()),
            ("c".to_owned(), "bad adapter/x".to_owned()),
        ]))
        .unwrap_err();
        assert_eq!(problems.len(), 2, "{problems:?}");
        assert!(problems[0].contains("\"a\""));
        assert!(problems[1].contains("\"c\""));
    }
}
