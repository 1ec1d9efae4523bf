//! Run events and run requests between their protobuf messages and the domain: output with
//! its structured parts, completions with usage, failures with their class, and what a
//! failed or cancelled run produced.
//!
//! Every message is destructured exhaustively, so a field added to the `.proto` file is a
//! compile error here rather than a silently dropped value.

use crate::domain::{
    AdapterName, Continuation, Embedding, FailureClass, LoraName, Operation, RunEventKind, RunId,
    StructuredOutput, Target, TokenLogprob, ToolCallDelta, TopLogprob, Usage,
};
use crate::ports::RunAssignment;

use super::proto::{self, run_event};

pub(super) fn event_kind_from_wire(kind: run_event::Kind) -> RunEventKind {
    match kind {
        run_event::Kind::Started(proto::RunStarted {}) => RunEventKind::Started,
        run_event::Kind::Output(output) => output_from_wire(output),
        run_event::Kind::Completed(proto::RunCompleted {
            finish_reason,
            usage,
        }) => RunEventKind::Completed {
            finish_reason,
            usage: usage.map(usage_from_wire),
        },
        run_event::Kind::Failed(proto::RunFailed {
            code,
            message,
            class,
            status,
            usage,
            context_window,
        }) => RunEventKind::Failed {
            context_window: (context_window > 0).then_some(context_window),
            code,
            message,
            class: class_from_wire(class),
            status: u16::try_from(status).ok().filter(|status| *status != 0),
            usage: usage.map(usage_from_wire),
        },
        run_event::Kind::Cancelled(proto::RunCancelled { reason, usage }) => {
            RunEventKind::Cancelled {
                reason,
                usage: usage.map(usage_from_wire),
            }
        }
    }
}

pub(super) fn event_kind_to_wire(kind: RunEventKind) -> run_event::Kind {
    match kind {
        RunEventKind::Started => run_event::Kind::Started(proto::RunStarted {}),
        RunEventKind::Output {
            text,
            data,
            structured,
        } => run_event::Kind::Output(output_to_wire(text, data, structured)),
        RunEventKind::Completed {
            finish_reason,
            usage,
        } => run_event::Kind::Completed(proto::RunCompleted {
            finish_reason,
            usage: usage.map(usage_to_wire),
        }),
        RunEventKind::Failed {
            context_window,
            code,
            message,
            class,
            status,
            usage,
        } => run_event::Kind::Failed(proto::RunFailed {
            code,
            message,
            class: class_to_wire(class).into(),
            status: status.map_or(0, u32::from),
            usage: usage.map(usage_to_wire),
            context_window: context_window.unwrap_or(0),
        }),
        RunEventKind::Cancelled { reason, usage } => {
            run_event::Kind::Cancelled(proto::RunCancelled {
                reason,
                usage: usage.map(usage_to_wire),
            })
        }
    }
}

fn output_from_wire(output: proto::RunOutput) -> RunEventKind {
    let proto::RunOutput {
        text,
        data,
        reasoning,
        tool_calls,
        logprobs,
        embeddings,
        tokens,
        usage,
    } = output;
    let structured = StructuredOutput {
        reasoning,
        tool_calls: tool_calls
            .into_iter()
            .map(
                |proto::ToolCallDelta {
                     index,
                     id,
                     name,
                     arguments,
                 }| ToolCallDelta {
                    index,
                    id,
                    name,
                    arguments,
                },
            )
            .collect(),
        logprobs: logprobs.into_iter().map(logprob_from_wire).collect(),
        embeddings: embeddings
            .into_iter()
            .map(|proto::Embedding { index, values }| Embedding { index, values })
            .collect(),
        tokens,
        usage: usage.map(usage_from_wire),
    };
    RunEventKind::Output {
        text,
        data,
        structured: (!structured.is_empty()).then(|| Box::new(structured)),
    }
}

fn output_to_wire(
    text: String,
    data: bytes::Bytes,
    structured: Option<Box<StructuredOutput>>,
) -> proto::RunOutput {
    let StructuredOutput {
        reasoning,
        tool_calls,
        logprobs,
        embeddings,
        tokens,
        usage,
    } = structured.map(|boxed| *boxed).unwrap_or_default();
    proto::RunOutput {
        text,
        data,
        reasoning,
        tool_calls: tool_calls
            .into_iter()
            .map(
                |ToolCallDelta {
                     index,
                     id,
                     name,
                     arguments,
                 }| proto::ToolCallDelta {
                    index,
                    id,
                    name,
                    arguments,
                },
            )
            .collect(),
        logprobs: logprobs.into_iter().map(logprob_to_wire).collect(),
        embeddings: embeddings
            .into_iter()
            .map(|Embedding { index, values }| proto::Embedding { index, values })
            .collect(),
        tokens,
        usage: usage.map(usage_to_wire),
    }
}

fn logprob_from_wire(logprob: proto::TokenLogprob) -> TokenLogprob {
    let proto::TokenLogprob {
        token,
        logprob,
        token_bytes,
        top,
    } = logprob;
    TokenLogprob {
        token,
        logprob,
        bytes: token_bytes.to_vec(),
        top: top
            .into_iter()
            .map(
                |proto::TopLogprob {
                     token,
                     logprob,
                     token_bytes,
                 }| TopLogprob {
                    token,
                    logprob,
                    bytes: token_bytes.to_vec(),
                },
            )
            .collect(),
    }
}

fn logprob_to_wire(logprob: TokenLogprob) -> proto::TokenLogprob {
    let TokenLogprob {
        token,
        logprob,
        bytes,
        top,
    } = logprob;
    proto::TokenLogprob {
        token,
        logprob,
        token_bytes: bytes.into(),
        top: top
            .into_iter()
            .map(
                |TopLogprob {
                     token,
                     logprob,
                     bytes,
                 }| proto::TopLogprob {
                    token,
                    logprob,
                    token_bytes: bytes.into(),
                },
            )
            .collect(),
    }
}

fn usage_from_wire(usage: proto::Usage) -> Usage {
    let proto::Usage {
        input_tokens,
        output_tokens,
        cached_input_tokens,
        reasoning_tokens,
    } = usage;
    Usage {
        input_tokens,
        output_tokens,
        cached_input_tokens,
        reasoning_tokens,
    }
}

fn usage_to_wire(usage: Usage) -> proto::Usage {
    let Usage {
        input_tokens,
        output_tokens,
        cached_input_tokens,
        reasoning_tokens,
    } = usage;
    proto::Usage {
        input_tokens,
        output_tokens,
        cached_input_tokens,
        reasoning_tokens,
    }
}

fn class_from_wire(class: i32) -> FailureClass {
    match proto::FailureClass::try_from(class) {
        Ok(proto::FailureClass::Request) => FailureClass::Request,
        Ok(proto::FailureClass::Node) => FailureClass::Node,
        Ok(proto::FailureClass::Refused) => FailureClass::Refused,
        // A class this edge does not know yet is judged like a v1 node's failure.
        Ok(proto::FailureClass::Unspecified) | Err(_) => FailureClass::Unspecified,
    }
}

fn class_to_wire(class: FailureClass) -> proto::FailureClass {
    match class {
        FailureClass::Unspecified => proto::FailureClass::Unspecified,
        FailureClass::Request => proto::FailureClass::Request,
        FailureClass::Node => proto::FailureClass::Node,
        FailureClass::Refused => proto::FailureClass::Refused,
    }
}

pub(super) fn operation_to_wire(operation: Operation) -> proto::Operation {
    match operation {
        Operation::Unspecified => proto::Operation::Unspecified,
        Operation::Chat => proto::Operation::Chat,
        Operation::Completion => proto::Operation::Completion,
        Operation::Embeddings => proto::Operation::Embeddings,
        Operation::Tokenize => proto::Operation::Tokenize,
        Operation::Detokenize => proto::Operation::Detokenize,
    }
}

pub(super) fn operation_from_wire(operation: i32) -> Operation {
    match proto::Operation::try_from(operation) {
        Ok(proto::Operation::Chat) => Operation::Chat,
        Ok(proto::Operation::Completion) => Operation::Completion,
        Ok(proto::Operation::Embeddings) => Operation::Embeddings,
        Ok(proto::Operation::Tokenize) => Operation::Tokenize,
        Ok(proto::Operation::Detokenize) => Operation::Detokenize,
        Ok(proto::Operation::Unspecified) | Err(_) => Operation::Unspecified,
    }
}

pub(super) fn run_to_wire(run: RunAssignment) -> proto::RunRequest {
    let RunAssignment {
        run_id,
        adapter,
        target,
        input,
        content_type,
        params,
        deadline_ms,
        operation,
        continuation,
        lora,
    } = run;
    proto::RunRequest {
        run_id: run_id.to_string(),
        adapter: adapter.to_string(),
        target: target.to_string(),
        input,
        content_type,
        params: params.into_iter().collect(),
        deadline_ms,
        operation: operation_to_wire(operation).into(),
        continuation: continuation.map(continuation_to_wire),
        lora: lora.map(|lora| lora.to_string()).unwrap_or_default(),
    }
}

fn continuation_to_wire(continuation: Continuation) -> proto::Continuation {
    let Continuation {
        text,
        output_tokens,
        number,
    } = continuation;
    proto::Continuation {
        text,
        output_tokens,
        number,
    }
}

fn continuation_from_wire(continuation: proto::Continuation) -> Continuation {
    let proto::Continuation {
        text,
        output_tokens,
        number,
    } = continuation;
    Continuation {
        text,
        output_tokens,
        number,
    }
}

/// A `RunRequest` as a node reads it; `None` when its adapter, target or LoRA is not a
/// valid name.
pub(super) fn run_from_wire(request: proto::RunRequest) -> Option<RunAssignment> {
    let proto::RunRequest {
        run_id,
        adapter,
        target,
        input,
        content_type,
        params,
        deadline_ms,
        operation,
        continuation,
        lora,
    } = request;
    let lora = match lora.as_str() {
        "" => None,
        name => Some(LoraName::parse(name).ok()?),
    };
    Some(RunAssignment {
        run_id: RunId::new(run_id),
        adapter: AdapterName::parse(&adapter).ok()?,
        target: Target::parse(&target).ok()?,
        input,
        content_type,
        params: params.into_iter().collect(),
        deadline_ms,
        operation: operation_from_wire(operation),
        continuation: continuation.map(continuation_from_wire),
        lora,
    })
}
