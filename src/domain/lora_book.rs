//! Which LoRAs the edge knows: every LoRA some node has reported since the edge started,
//! with the weights of its first report, and the conflicts found on the way.
//!
//! LoRAs are known from nodes' reports, never from the config. A LoRA once reported is
//! treated as a configured model is (a request for it waits while its nodes are away,
//! never a 404), so the book only grows while the edge runs. Two conflicts keep a report
//! out of it: a LoRA named like a configured target of the same adapter (`llama/sql` is
//! then the target, never the LoRA), and a LoRA whose name the book already holds with
//! other weights or another base (that node's LoRA is not served; the nodes that agree
//! with the first report are). The book decides nothing about time or I/O: callers pass
//! each node's report in and act on what it found ([`LoraBook::observe`],
//! [`LoraBook::learn`]).

use std::collections::BTreeMap;

use super::lora::{LoraChoice, LoraFile, LoraName, NodeLora};
use super::names::{AdapterName, NodeId, Target};
use super::node::Availability;

/// A LoRA the edge knows, as first reported.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KnownLora {
    /// The target it is a fine-tune of.
    pub base: Target,
    /// Its weights.
    pub file: LoraFile,
    /// The node that reported it first.
    pub first_node: NodeId,
}

/// Why a node's LoRA is not served.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ConflictKind {
    /// A configured target of the same adapter has its name: the name is the target's.
    NamedLikeTarget,
    /// The edge knows the name with other weights or another base (those of the first
    /// report): the node reported these instead.
    OtherWeights {
        /// The node's base.
        base: Target,
        /// The node's weights.
        file: LoraFile,
    },
}

impl ConflictKind {
    /// The kind's name in the management API.
    pub fn as_str(&self) -> &'static str {
        match self {
            Self::NamedLikeTarget => "named_like_a_target",
            Self::OtherWeights { .. } => "other_weights",
        }
    }
}

/// A LoRA a node reported that the edge does not serve from that node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LoraConflict {
    /// The node's adapter.
    pub adapter: AdapterName,
    /// The LoRA's name.
    pub lora: LoraName,
    /// The node that reported it.
    pub node: NodeId,
    /// What is wrong with it.
    pub kind: ConflictKind,
}

/// What one report taught the book: LoRAs heard of for the first time, and conflicts not
/// seen before. Empty for a report that changes nothing (every report of a pool without
/// LoRAs).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Lessons {
    /// New LoRAs, by adapter and name.
    pub learned: Vec<(AdapterName, LoraName, KnownLora)>,
    /// New conflicts.
    pub conflicts: Vec<LoraConflict>,
}

impl Lessons {
    /// Whether the report taught nothing.
    pub fn is_empty(&self) -> bool {
        self.learned.is_empty() && self.conflicts.is_empty()
    }
}

/// What a model name from the config (an alias's model, a `[[models]]` entry) turned out
/// to be, as far as the nodes' reports tell.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NamedModel {
    /// A configured target.
    Target,
    /// A LoRA the edge knows.
    Lora(KnownLora),
    /// Nothing any node reported (yet).
    Unknown,
}

/// The LoRAs the edge knows and the conflicts it found, since it started.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LoraBook {
    known: BTreeMap<(AdapterName, LoraName), KnownLora>,
    conflicts: Vec<LoraConflict>,
}

impl LoraBook {
    /// What `node`'s report `availability` would teach the book: every LoRA it names that
    /// the book does not hold yet (the first report of a name wins; a name reported twice
    /// in one report by two adapters is two LoRAs), and every conflict not recorded yet.
    /// `is_target` says whether a node definition serves an adapter's target.
    pub fn observe(
        &self,
        node: &NodeId,
        availability: &Availability,
        is_target: impl Fn(&AdapterName, &Target) -> bool,
    ) -> Lessons {
        let mut lessons = Lessons::default();
        for (adapter, loras) in availability.lora_adapters() {
            for lora in loras {
                let kind = if is_target(adapter, lora.name.as_target()) {
                    ConflictKind::NamedLikeTarget
                } else {
                    match self.known.get(&(adapter.clone(), lora.name.clone())) {
                        None => {
                            let first = KnownLora {
                                base: lora.base.clone(),
                                file: lora.file.clone(),
                                first_node: node.clone(),
                            };
                            lessons
                                .learned
                                .push((adapter.clone(), lora.name.clone(), first));
                            continue;
                        }
                        Some(known) if agree(known, lora) => continue,
                        Some(_) => ConflictKind::OtherWeights {
                            base: lora.base.clone(),
                            file: lora.file.clone(),
                        },
                    }
                };
                let conflict = LoraConflict {
                    adapter: adapter.clone(),
                    lora: lora.name.clone(),
                    node: node.clone(),
                    kind,
                };
                if !self.conflicts.contains(&conflict) {
                    lessons.conflicts.push(conflict);
                }
            }
        }
        lessons
    }

    /// Takes `lessons` in.
    pub fn learn(&mut self, lessons: Lessons) {
        let Lessons { learned, conflicts } = lessons;
        for (adapter, name, known) in learned {
            self.known.entry((adapter, name)).or_insert(known);
        }
        for conflict in conflicts {
            if !self.conflicts.contains(&conflict) {
                self.conflicts.push(conflict);
            }
        }
    }

    /// `adapter`'s LoRA named `name`, when the edge knows one.
    pub fn get(&self, adapter: &AdapterName, name: &Target) -> Option<&KnownLora> {
        self.known
            .get(&(adapter.clone(), LoraName::from(name.clone())))
    }

    /// What a run of `adapter`'s LoRA `name` asks for, when the edge knows one.
    pub fn choice(&self, adapter: &AdapterName, name: &Target) -> Option<(Target, LoraChoice)> {
        let known = self.get(adapter, name)?;
        let choice = LoraChoice {
            name: LoraName::from(name.clone()),
            file: known.file.clone(),
        };
        Some((known.base.clone(), choice))
    }

    /// Whether a node's report of `lora` (of `adapter`) is the LoRA the edge knows by its
    /// name: same base, same weights. A LoRA the book does not hold (named like a target)
    /// never agrees.
    pub fn agrees(&self, adapter: &AdapterName, lora: &NodeLora) -> bool {
        self.known
            .get(&(adapter.clone(), lora.name.clone()))
            .is_some_and(|known| agree(known, lora))
    }

    /// Every LoRA the edge knows, ordered by adapter and name.
    pub fn known(&self) -> impl Iterator<Item = (&AdapterName, &LoraName, &KnownLora)> {
        self.known.iter().map(|((a, n), k)| (a, n, k))
    }

    /// Every conflict found, in the order found.
    pub fn conflicts(&self) -> &[LoraConflict] {
        &self.conflicts
    }

    /// What `adapter/name`, named in the config, is by now.
    pub fn named(
        &self,
        adapter: &AdapterName,
        name: &Target,
        is_target: impl Fn(&AdapterName, &Target) -> bool,
    ) -> NamedModel {
        if is_target(adapter, name) {
            return NamedModel::Target;
        }
        match self.get(adapter, name) {
            Some(known) => NamedModel::Lora(known.clone()),
            None => NamedModel::Unknown,
        }
    }
}

fn agree(known: &KnownLora, lora: &NodeLora) -> bool {
    known.base == lora.base && known.file.same(&lora.file)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::lora::LoraState;

    fn name(s: &str) -> Target {
        Target::parse(s).unwrap()
    }

    fn lora(lora: &str, base: &str, sha: &str) -> NodeLora {
        NodeLora {
            name: LoraName::parse(lora).unwrap(),
            base: name(base),
            file: LoraFile {
                path: format!("/loras/{lora}.gguf"),
                sha256: Some(sha.to_owned()),
            },
            state: LoraState::Loaded,
        }
    }

    fn report(loras: Vec<NodeLora>) -> Availability {
        let llama = AdapterName::parse("llama").unwrap();
        Availability::new([(llama.clone(), name("qwen"))]).with_loras(llama, loras)
    }

    fn node(id: &str) -> NodeId {
        NodeId::parse(id).unwrap()
    }

    #[test]
    fn the_first_report_of_a_name_is_known_and_a_later_one_with_other_weights_conflicts() {
        let llama = AdapterName::parse("llama").unwrap();
        let no_targets = |_: &AdapterName, _: &Target| false;
        let mut book = LoraBook::default();
        let first = report(vec![lora("sql", "qwen", "aa"), lora("tone", "qwen", "cc")]);
        let lessons = book.observe(&node("a"), &first, no_targets);
        assert_eq!(lessons.learned.len(), 2);
        book.learn(lessons);
        assert!(book.observe(&node("a"), &first, no_targets).is_empty());
        let (base, choice) = book.choice(&llama, &name("sql")).unwrap();
        assert_eq!(
            (base, choice.file.sha256.as_deref()),
            (name("qwen"), Some("aa"))
        );

        // Node b: the same sql, another tone.
        let second = report(vec![lora("sql", "qwen", "aa"), lora("tone", "qwen", "dd")]);
        let lessons = book.observe(&node("b"), &second, no_targets);
        assert!(lessons.learned.is_empty());
        assert_eq!(lessons.conflicts.len(), 1);
        let conflict = &lessons.conflicts[0];
        assert_eq!(
            (conflict.node.as_str(), conflict.lora.as_str()),
            ("b", "tone")
        );
        assert_eq!(conflict.kind.as_str(), "other_weights");
        book.learn(lessons);
        // Found once.
        assert!(book.observe(&node("b"), &second, no_targets).is_empty());
        assert_eq!(book.conflicts().len(), 1);
        // The first report still serves: a's tone agrees, b's does not.
        assert!(book.agrees(&llama, &lora("tone", "qwen", "cc")));
        assert!(!book.agrees(&llama, &lora("tone", "qwen", "dd")));
        assert!(!book.agrees(&llama, &lora("tone", "other", "cc")));
    }

    #[test]
    fn a_lora_named_like_a_target_of_its_adapter_is_a_conflict_and_never_known() {
        let llama = AdapterName::parse("llama").unwrap();
        let qwen_is_a_target = |_: &AdapterName, t: &Target| t.as_str() == "qwen";
        let mut book = LoraBook::default();
        let lessons = book.observe(
            &node("a"),
            &report(vec![lora("qwen", "qwen", "aa")]),
            qwen_is_a_target,
        );
        assert!(lessons.learned.is_empty());
        assert_eq!(lessons.conflicts[0].kind, ConflictKind::NamedLikeTarget);
        book.learn(lessons);
        assert!(book.get(&llama, &name("qwen")).is_none());
        assert_eq!(
            book.named(&llama, &name("qwen"), qwen_is_a_target),
            NamedModel::Target
        );
        assert_eq!(
            book.named(&llama, &name("sql"), qwen_is_a_target),
            NamedModel::Unknown
        );
    }
}
