//! Validation of the node definitions an operator writes in the config file.
//!
//! [`validate_definitions`] turns raw definitions into [`NodeRecord`]s or reports every
//! problem at once, each naming the offending entry, so an operator fixes a file in one pass.

use std::collections::{BTreeMap, HashMap};
use std::fmt;

use super::names::{AdapterName, Alias, NodeId, Target};
use super::node::{AdapterConfig, NodeRecord, RuntimeConfig};
use super::token::{Token, TokenDigest};

/// One node definition as written in the config, before validation.
#[derive(Debug, Clone, Default)]
pub struct NodeDefinition {
    /// `id`.
    pub id: String,
    /// `alias`.
    pub alias: String,
    /// `token`: the pre-shared token in plaintext.
    pub token: Option<Token>,
    /// `token_sha256`: the token's SHA-256 digest in hex, instead of `token`.
    pub token_sha256: Option<String>,
    /// `adapters`.
    pub adapters: Vec<AdapterDefinition>,
    /// `runtime.max_concurrent_runs`.
    pub max_concurrent_runs: u32,
    /// `runtime.heartbeat_interval_ms`.
    pub heartbeat_interval_ms: u32,
    /// `runtime.settings`.
    pub runtime_settings: BTreeMap<String, String>,
}

/// One `[[nodes.adapters]]` entry before validation.
#[derive(Debug, Clone, Default)]
pub struct AdapterDefinition {
    /// `name`.
    pub name: String,
    /// `targets`.
    pub targets: Vec<String>,
    /// `settings`.
    pub settings: BTreeMap<String, String>,
}

/// Which definition a problem is about: its position in the list and the id written there.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EntryRef {
    /// Zero-based position in `nodes`.
    pub index: usize,
    /// The `id` as written (possibly invalid or empty).
    pub id: String,
}

impl fmt::Display for EntryRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "nodes[{}] (id {:?})", self.index, self.id)
    }
}

/// One thing wrong with the node definitions.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DefinitionProblem {
    /// A field does not hold a valid value.
    #[error("{at}: `{key}` {reason}")]
    InvalidField {
        /// The entry.
        at: EntryRef,
        /// The key within the entry, such as `alias` or `adapters[0].targets[1]`.
        key: String,
        /// What is wrong with it.
        reason: String,
    },
    /// Neither `token` nor `token_sha256` is given.
    #[error("{at}: needs `token` or `token_sha256`")]
    MissingToken {
        /// The entry.
        at: EntryRef,
    },
    /// Both `token` and `token_sha256` are given.
    #[error("{at}: give `token` or `token_sha256`, not both")]
    ConflictingToken {
        /// The entry.
        at: EntryRef,
    },
    /// `token` is the empty string.
    #[error("{at}: `token` is empty")]
    EmptyToken {
        /// The entry.
        at: EntryRef,
    },
    /// Two entries share a token (or token digest).
    #[error("{at}: uses the same token as {first}")]
    DuplicateToken {
        /// The later entry.
        at: EntryRef,
        /// The earlier entry with that token.
        first: EntryRef,
    },
    /// Two entries share an id.
    #[error("{at}: duplicate id, already used by {first}")]
    DuplicateId {
        /// The later entry.
        at: EntryRef,
        /// The earlier entry with that id.
        first: EntryRef,
    },
    /// Two entries share an alias.
    #[error("{at}: duplicate alias {alias:?}, already used by {first}")]
    DuplicateAlias {
        /// The later entry.
        at: EntryRef,
        /// The alias.
        alias: String,
        /// The earlier entry with that alias.
        first: EntryRef,
    },
    /// An alias equals the id of another node, so a name would point at two nodes.
    #[error("{at}: alias {alias:?} is the id of {other}")]
    AliasIsAnotherId {
        /// The entry whose alias collides.
        at: EntryRef,
        /// The alias.
        alias: String,
        /// The entry with that id.
        other: EntryRef,
    },
}

/// Every problem found in the node definitions.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{} problem(s) in node definitions:\n{}", problems.len(), render(problems))]
pub struct DefinitionsError {
    /// The problems, in the order of the entries.
    pub problems: Vec<DefinitionProblem>,
}

fn render(problems: &[DefinitionProblem]) -> String {
    problems
        .iter()
        .map(|p| format!("  - {p}"))
        .collect::<Vec<_>>()
        .join("\n")
}

/// Validates node definitions and builds their records.
///
/// # Errors
/// [`DefinitionsError`] listing every problem: invalid fields, missing, conflicting or empty
/// tokens, duplicate tokens, ids and aliases, and aliases equal to another node's id.
pub fn validate_definitions(
    definitions: &[NodeDefinition],
) -> Result<Vec<NodeRecord>, DefinitionsError> {
    let mut problems = Vec::new();
    let mut records = Vec::new();
    let mut firsts = Firsts::default();

    for (index, definition) in definitions.iter().enumerate() {
        let at = EntryRef {
            index,
            id: definition.id.clone(),
        };
        let mut fields = FieldCheck {
            at: &at,
            problems: &mut problems,
        };
        let id = fields.parse("id", &definition.id, NodeId::parse);
        let alias = fields.parse("alias", &definition.alias, Alias::parse);
        let adapters = fields.adapters(&definition.adapters);
        fields.positive(
            "runtime.max_concurrent_runs",
            definition.max_concurrent_runs,
        );
        fields.positive(
            "runtime.heartbeat_interval_ms",
            definition.heartbeat_interval_ms,
        );
        let token = token_digest(definition, &at, &mut problems);
        firsts.check(definition, token, &at, &mut problems);

        // A zero limit was reported above; the constructor refuses it again.
        if let (Some(id), Some(alias), Some(adapters), Some(token)) = (id, alias, adapters, token)
            && let Ok(runtime) = RuntimeConfig::new(
                definition.max_concurrent_runs,
                definition.heartbeat_interval_ms,
                definition.runtime_settings.clone(),
            )
        {
            records.push(NodeRecord::new(id, alias, token, adapters, runtime));
        }
    }
    firsts.check_aliases(definitions, &mut problems);

    if problems.is_empty() {
        Ok(records)
    } else {
        problems.sort_by_key(problem_index);
        Err(DefinitionsError { problems })
    }
}

/// The first entry seen with each token, id and alias, for telling duplicates.
#[derive(Default)]
struct Firsts<'a> {
    by_token: HashMap<TokenDigest, EntryRef>,
    by_id: HashMap<&'a str, EntryRef>,
    by_alias: HashMap<&'a str, EntryRef>,
}

impl<'a> Firsts<'a> {
    /// Reports `definition`'s id, alias and token if an earlier entry had them; remembers
    /// them otherwise.
    fn check(
        &mut self,
        definition: &'a NodeDefinition,
        token: Option<TokenDigest>,
        at: &EntryRef,
        problems: &mut Vec<DefinitionProblem>,
    ) {
        if let Some(first) = self.by_id.get(definition.id.as_str()) {
            problems.push(DefinitionProblem::DuplicateId {
                at: at.clone(),
                first: first.clone(),
            });
        } else {
            self.by_id.insert(&definition.id, at.clone());
        }
        if let Some(first) = self.by_alias.get(definition.alias.as_str()) {
            problems.push(DefinitionProblem::DuplicateAlias {
                at: at.clone(),
                alias: definition.alias.clone(),
                first: first.clone(),
            });
        } else {
            self.by_alias.insert(&definition.alias, at.clone());
        }
        if let Some(token) = token {
            if let Some(first) = self.by_token.get(&token) {
                problems.push(DefinitionProblem::DuplicateToken {
                    at: at.clone(),
                    first: first.clone(),
                });
            } else {
                self.by_token.insert(token, at.clone());
            }
        }
    }

    /// Reports every alias equal to another node's id (an alias may equal its own id).
    fn check_aliases(&self, definitions: &[NodeDefinition], problems: &mut Vec<DefinitionProblem>) {
        for (index, definition) in definitions.iter().enumerate() {
            if let Some(other) = self.by_id.get(definition.alias.as_str())
                && other.index != index
            {
                problems.push(DefinitionProblem::AliasIsAnotherId {
                    at: EntryRef {
                        index,
                        id: definition.id.clone(),
                    },
                    alias: definition.alias.clone(),
                    other: other.clone(),
                });
            }
        }
    }
}

fn problem_index(problem: &DefinitionProblem) -> usize {
    match problem {
        DefinitionProblem::InvalidField { at, .. }
        | DefinitionProblem::MissingToken { at }
        | DefinitionProblem::ConflictingToken { at }
        | DefinitionProblem::EmptyToken { at }
        | DefinitionProblem::DuplicateToken { at, .. }
        | DefinitionProblem::DuplicateId { at, .. }
        | DefinitionProblem::DuplicateAlias { at, .. }
        | DefinitionProblem::AliasIsAnotherId { at, .. } => at.index,
    }
}

fn token_digest(
    definition: &NodeDefinition,
    at: &EntryRef,
    problems: &mut Vec<DefinitionProblem>,
) -> Option<TokenDigest> {
    match (&definition.token, &definition.token_sha256) {
        (None, None) => {
            problems.push(DefinitionProblem::MissingToken { at: at.clone() });
            None
        }
        (Some(_), Some(_)) => {
            problems.push(DefinitionProblem::ConflictingToken { at: at.clone() });
            None
        }
        (Some(token), None) if token.is_empty() => {
            problems.push(DefinitionProblem::EmptyToken { at: at.clone() });
            None
        }
        (Some(token), None) => Some(token.digest()),
        (None, Some(hex)) => match TokenDigest::from_hex(hex) {
            Ok(digest) => Some(digest),
            Err(reason) => {
                problems.push(DefinitionProblem::InvalidField {
                    at: at.clone(),
                    key: "token_sha256".into(),
                    reason: reason.to_string(),
                });
                None
            }
        },
    }
}

/// Collects field-level problems for one entry.
struct FieldCheck<'a> {
    at: &'a EntryRef,
    problems: &'a mut Vec<DefinitionProblem>,
}

impl FieldCheck<'_> {
    fn parse<T, E: fmt::Display>(
        &mut self,
        key: &str,
        value: &str,
        parse: impl Fn(&str) -> Result<T, E>,
    ) -> Option<T> {
        parse(value)
            .map_err(|e| self.invalid(key, e.to_string()))
            .ok()
    }

    fn invalid(&mut self, key: &str, reason: String) {
        self.problems.push(DefinitionProblem::InvalidField {
            at: self.at.clone(),
            key: key.to_owned(),
            reason,
        });
    }

    fn positive(&mut self, key: &str, value: u32) {
        if value == 0 {
            self.invalid(key, "must be at least 1".into());
        }
    }

    fn adapters(&mut self, definitions: &[AdapterDefinition]) -> Option<Vec<AdapterConfig>> {
        let mut adapters = Vec::with_capacity(definitions.len());
        let mut valid = true;
        for (i, definition) in definitions.iter().enumerate() {
            let name = self.parse(
                &format!("adapters[{i}].name"),
                &definition.name,
                AdapterName::parse,
            );
            if definitions[..i]
                .iter()
                .any(|earlier| earlier.name == definition.name)
            {
                self.invalid(
                    &format!("adapters[{i}].name"),
                    format!("{:?} is listed twice", definition.name),
                );
                valid = false;
            }
            if definition.targets.is_empty() {
                self.invalid(
                    &format!("adapters[{i}].targets"),
                    "must list at least one target".into(),
                );
                valid = false;
            }
            let targets: Vec<Option<Target>> = definition
                .targets
                .iter()
                .enumerate()
                .map(|(j, t)| self.parse(&format!("adapters[{i}].targets[{j}]"), t, Target::parse))
                .collect();
            match (name, targets.into_iter().collect::<Option<Vec<_>>>()) {
                // No target was reported above; the constructor refuses it again.
                (Some(name), Some(targets)) => {
                    match AdapterConfig::new(name, targets, definition.settings.clone()) {
                        Ok(adapter) => adapters.push(adapter),
                        Err(_) => valid = false,
                    }
                }
                _ => valid = false,
            }
        }
        valid.then_some(adapters)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(id: &str, alias: &str, token: &str) -> NodeDefinition {
        NodeDefinition {
            id: id.into(),
            alias: alias.into(),
            token: Some(Token::new(token)),
            token_sha256: None,
            adapters: vec![AdapterDefinition {
                name: "echo".into(),
                targets: vec!["default".into()],
                settings: BTreeMap::new(),
            }],
            max_concurrent_runs: 4,
            heartbeat_interval_ms: 5000,
            runtime_settings: BTreeMap::new(),
        }
    }

    fn problems(definitions: &[NodeDefinition]) -> Vec<DefinitionProblem> {
        validate_definitions(definitions).unwrap_err().problems
    }

    fn at(index: usize, id: &str) -> EntryRef {
        EntryRef {
            index,
            id: id.into(),
        }
    }

    #[test]
    fn valid_definitions_become_records() {
        let records =
            validate_definitions(&[node("a", "gpu-a", "ta"), node("b", "b", "tb")]).unwrap();
        assert_eq!(records.len(), 2);
        assert_eq!(records[0].alias().as_str(), "gpu-a");
        assert!(records[0].token().matches(&Token::new("ta").digest()));
        assert!(records[0].serves(
            &AdapterName::parse("echo").unwrap(),
            &Target::parse("default").unwrap()
        ));
    }

    #[test]
    fn empty_token_is_rejected() {
        assert_eq!(
            problems(&[node("a", "x", "")]),
            vec![DefinitionProblem::EmptyToken { at: at(0, "a") }]
        );
    }

    #[test]
    fn missing_and_conflicting_tokens_are_rejected() {
        let mut missing = node("a", "x", "t");
        missing.token = None;
        let mut both = node("b", "y", "u");
        both.token_sha256 = Some(Token::new("u").digest().to_hex());
        assert_eq!(
            problems(&[missing, both]),
            vec![
                DefinitionProblem::MissingToken { at: at(0, "a") },
                DefinitionProblem::ConflictingToken { at: at(1, "b") },
            ]
        );
    }

    #[test]
    fn token_sha256_is_accepted_and_collides_with_the_same_plaintext() {
        let mut hashed = node("b", "y", "t");
        hashed.token = None;
        hashed.token_sha256 = Some(Token::new("t").digest().to_hex());
        assert_eq!(
            problems(&[node("a", "x", "t"), hashed]),
            vec![DefinitionProblem::DuplicateToken {
                at: at(1, "b"),
                first: at(0, "a")
            }]
        );
    }

    #[test]
    fn duplicate_token_id_and_alias_are_all_named_in_one_error() {
        let found = problems(&[
            node("a", "x", "t1"),
            node("a", "y", "t2"),
            node("c", "x", "t1"),
            node("d", "a", "t4"),
        ]);
        assert_eq!(
            found,
            vec![
                DefinitionProblem::DuplicateId {
                    at: at(1, "a"),
                    first: at(0, "a")
                },
                DefinitionProblem::DuplicateAlias {
                    at: at(2, "c"),
                    alias: "x".into(),
                    first: at(0, "a")
                },
                DefinitionProblem::DuplicateToken {
                    at: at(2, "c"),
                    first: at(0, "a")
                },
                DefinitionProblem::AliasIsAnotherId {
                    at: at(3, "d"),
                    alias: "a".into(),
                    other: at(0, "a")
                },
            ]
        );
        let message = validate_definitions(&[node("a", "x", "t1"), node("a", "y", "t1")])
            .unwrap_err()
            .to_string();
        assert!(message.contains("nodes[1] (id \"a\")"), "{message}");
        assert!(!message.contains("t1\""), "a token leaked into: {message}");
    }

    #[test]
    fn invalid_fields_are_named_by_key() {
        let mut bad = node("bad id", "", "t");
        bad.adapters[0].targets = vec!["ok".into(), "has space".into()];
        bad.max_concurrent_runs = 0;
        let keys: Vec<String> = problems(&[bad])
            .into_iter()
            .map(|p| match p {
                DefinitionProblem::InvalidField { key, .. } => key,
                other => panic!("unexpected {other:?}"),
            })
            .collect();
        assert_eq!(
            keys,
            [
                "id",
                "alias",
                "adapters[0].targets[1]",
                "runtime.max_concurrent_runs"
            ]
        );
    }

    #[test]
    fn adapters_without_targets_or_listed_twice_are_rejected() {
        let mut bad = node("a", "x", "t");
        bad.adapters.push(bad.adapters[0].clone());
        bad.adapters.push(AdapterDefinition {
            name: "other".into(),
            ..Default::default()
        });
        let keys: Vec<String> = problems(&[bad])
            .into_iter()
            .filter_map(|p| match p {
                DefinitionProblem::InvalidField { key, .. } => Some(key),
                _ => None,
            })
            .collect();
        assert_eq!(keys, ["adapters[1].name", "adapters[2].targets"]);
    }

    #[test]
    fn an_alias_may_equal_its_own_id() {
        assert!(validate_definitions(&[node("a", "a", "t")]).is_ok());
    }
}
