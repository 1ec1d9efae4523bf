//! LoRA adapters as models: a fine-tune a node's engine applies on top of one of its
//! targets (its base), named by the node and addressed by clients as `<adapter>/<lora>`.
//!
//! The values here are what a node reports of one LoRA ([`NodeLora`]: its name, its base,
//! its file and whether the engine has it registered now) and what a run asks for
//! ([`LoraChoice`]: the name and the file the edge first heard of under it). Which LoRAs
//! the edge knows, and which reports agree with it, is [`super::lora_book`]'s. ("Adapter"
//! keeps meaning the node's engine adapter everywhere; a LoRA is always called a LoRA.)

use std::fmt;

use super::names::{NameError, Target};

/// A LoRA's name: valid wherever a target is (it takes a target's place in a model id),
/// and never confused with one.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct LoraName(Target);

impl LoraName {
    /// Validates `name` by the rules of a target.
    ///
    /// # Errors
    /// [`NameError`] when it is not a valid target name.
    pub fn parse(name: &str) -> Result<Self, NameError> {
        Target::parse(name).map(Self)
    }

    /// The name as the target it stands for in a model id (`llama/sql`).
    pub fn as_target(&self) -> &Target {
        &self.0
    }

    /// The name.
    pub fn as_str(&self) -> &str {
        self.0.as_str()
    }
}

impl From<Target> for LoraName {
    fn from(target: Target) -> Self {
        Self(target)
    }
}

impl fmt::Display for LoraName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

/// Where a LoRA's weights are, as its node says: the path its engine loaded (or will
/// load) and, where the node could read the file, its SHA-256 (lowercase hex).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct LoraFile {
    /// The path on the node's machine.
    pub path: String,
    /// The SHA-256 of its bytes (of a folder's files, for a folder), when the node read it.
    pub sha256: Option<String>,
}

impl LoraFile {
    /// Whether `other` is the same weights: equal digests when both have one, else equal
    /// paths (two nodes whose files cannot be read are taken at their word).
    pub fn same(&self, other: &Self) -> bool {
        match (&self.sha256, &other.sha256) {
            (Some(mine), Some(theirs)) => mine == theirs,
            _ => self.path == other.path,
        }
    }
}

/// Whether a node's engine has a LoRA ready now.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum LoraState {
    /// Loaded or registered: a run applies it at once (llama-server's `--lora`, a LoRA
    /// registered on vLLM).
    Loaded,
    /// On the node's disk: the node registers it with its engine before the run that needs
    /// it (vLLM's `lora_dir`).
    Loadable,
}

impl LoraState {
    /// The state's name in the management API.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Loaded => "loaded",
            Self::Loadable => "loadable",
        }
    }
}

/// One LoRA as a node reports it for one of its adapters.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct NodeLora {
    /// Its name (llama-server: the file's stem; vLLM: its folder's name).
    pub name: LoraName,
    /// The adapter's target it is a fine-tune of.
    pub base: Target,
    /// Its weights.
    pub file: LoraFile,
    /// Whether the engine has it ready.
    pub state: LoraState,
}

/// The LoRA a run asks for: its name and the weights the edge first heard of under that
/// name, so only nodes with the same weights take the run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LoraChoice {
    /// The LoRA's name.
    pub name: LoraName,
    /// The weights of the first report of it.
    pub file: LoraFile,
}

impl NodeLora {
    /// Whether this report can serve a run of `base` asking for `choice`: same name, same
    /// base, same weights.
    pub fn serves(&self, base: &Target, choice: &LoraChoice) -> bool {
        self.name == choice.name && &self.base == base && self.file.same(&choice.file)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(path: &str, sha256: Option<&str>) -> LoraFile {
        LoraFile {
            path: path.to_owned(),
            sha256: sha256.map(str::to_owned),
        }
    }

    #[test]
    fn the_same_weights_are_told_by_their_digest_else_by_their_path() {
        let a = file("/loras/sql.gguf", Some("aa"));
        assert!(a.same(&file("/other/place.gguf", Some("aa"))));
        assert!(!a.same(&file("/loras/sql.gguf", Some("bb"))));
        assert!(a.same(&file("/loras/sql.gguf", None)));
        assert!(!a.same(&file("/loras/other.gguf", None)));
    }

    #[test]
    fn a_report_serves_a_choice_of_its_name_base_and_weights() {
        let base = Target::parse("qwen").unwrap();
        let sql = NodeLora {
            name: LoraName::parse("sql").unwrap(),
            base: base.clone(),
            file: file("/l/sql.gguf", Some("aa")),
            state: LoraState::Loadable,
        };
        let choice = LoraChoice {
            name: LoraName::parse("sql").unwrap(),
            file: file("/elsewhere/sql.gguf", Some("aa")),
        };
        assert!(sql.serves(&base, &choice));
        assert!(!sql.serves(&Target::parse("llama").unwrap(), &choice));
        let other = LoraChoice {
            file: file("/l/sql.gguf", Some("bb")),
            ..choice.clone()
        };
        assert!(!sql.serves(&base, &other));
        assert!(LoraName::parse("bad name!").is_err());
    }
}
