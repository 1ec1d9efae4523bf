//! What kind of work a run's input asks for, and which of those kinds a node declared it
//! serves: vocabulary shared by routing, registration, the run state and its record.

/// What kind of work a run's input asks for, so a node keeps one input form per kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Operation {
    /// Not said: `text/plain` input is a prompt, `application/json` input a chat request.
    #[default]
    Unspecified,
    /// An OpenAI chat-completions body without `model` and `stream`.
    Chat,
    /// An OpenAI completions body without `model` and `stream`.
    Completion,
    /// An OpenAI embeddings body without `model`.
    Embeddings,
    /// Text (`{"content", "add_special"}`) or a chat body to turn into the engine's token
    /// ids. Only for a node that declared it.
    Tokenize,
    /// Token ids (`{"tokens"}`) to turn back into text. Only for a node that declared it.
    Detokenize,
}

impl Operation {
    /// A stable snake_case name for logs and metric labels.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Unspecified => "unspecified",
            Self::Chat => "chat",
            Self::Completion => "completion",
            Self::Embeddings => "embeddings",
            Self::Tokenize => "tokenize",
            Self::Detokenize => "detokenize",
        }
    }

    /// Whether only a node that declared this operation at registration may get it (a node
    /// written before it existed would not know what to do with it).
    pub fn needs_declaration(self) -> bool {
        matches!(self, Self::Tokenize | Self::Detokenize)
    }
}

/// The operations a node declared it serves among those that need a declaration
/// ([`Operation::needs_declaration`]). Copy-cheap, for routing's per-placement node copies.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct DeclaredOperations {
    tokenize: bool,
    detokenize: bool,
}

impl DeclaredOperations {
    /// The set of `operations` (those that need no declaration are left out).
    pub fn new(operations: impl IntoIterator<Item = Operation>) -> Self {
        let mut declared = Self::default();
        for operation in operations {
            match operation {
                Operation::Tokenize => declared.tokenize = true,
                Operation::Detokenize => declared.detokenize = true,
                Operation::Unspecified
                | Operation::Chat
                | Operation::Completion
                | Operation::Embeddings => {}
            }
        }
        declared
    }

    /// Whether a node with this set may get runs of `operation`.
    pub fn serves(self, operation: Operation) -> bool {
        match operation {
            Operation::Tokenize => self.tokenize,
            Operation::Detokenize => self.detokenize,
            Operation::Unspecified
            | Operation::Chat
            | Operation::Completion
            | Operation::Embeddings => true,
        }
    }

    /// The declared operations, in a stable order.
    pub fn operations(self) -> Vec<Operation> {
        [
            (self.tokenize, Operation::Tokenize),
            (self.detokenize, Operation::Detokenize),
        ]
        .into_iter()
        .filter_map(|(on, operation)| on.then_some(operation))
        .collect()
    }
}
