//! Anthropic Messages request → the chat body the chat endpoint would send a node: `system`
//! becomes a system message, content blocks become chat content parts, `tool_use` blocks
//! become an assistant's `tool_calls` and `tool_result` blocks `tool` messages; `tools` and
//! `tool_choice` take OpenAI's form; `stop_sequences` becomes `stop`. Pure: JSON in, JSON
//! out, errors as [`ApiError`]s the handler renders in Anthropic's shape.

use serde_json::{Map, Value, json};

use crate::adapters::api::translators::ApiError;
use crate::adapters::api::translators::ChatTranslation;
use crate::adapters::api::translators::ResumableStream;

/// A checked Messages request, translated.
#[derive(Debug, Clone, PartialEq)]
pub(in crate::adapters::api) struct MessagesRequest {
    /// The model as the client named it.
    pub model: String,
    /// Whether the answer is an SSE stream.
    pub stream: bool,
    /// Whether the client asked for thinking (only then is reasoning shown).
    pub thinking: bool,
    /// The chat-completions body (without `model` and `stream`) the run gets as input.
    pub chat: Value,
}

impl ChatTranslation for MessagesRequest {
    fn model(&self) -> &str {
        &self.model
    }

    fn chat(&self) -> &Value {
        &self.chat
    }

    fn stream(&self) -> bool {
        self.stream
    }

    fn resumable_stream(&self) -> Option<ResumableStream> {
        self.stream.then(|| ResumableStream::Messages {
            model: self.model.clone(),
            thinking: self.thinking,
        })
    }
}

/// Translates a Messages request body.
///
/// # Errors
/// A 400 naming the field when the body is not a valid Messages request, or asks for
/// something the edge does not support (server tools, documents).
pub(in crate::adapters::api) fn translate(body: &Value) -> Result<MessagesRequest, ApiError> {
    let Some(object) = body.as_object() else {
        return Err(ApiError::malformed_json("the body must be a JSON object"));
    };
    let model = match object.get("model") {
        Some(Value::String(model)) if !model.is_empty() => model.clone(),
        None | Some(Value::Null) => return Err(ApiError::missing("model")),
        Some(_) => {
            return Err(ApiError::invalid(
                "model",
                "`model` must be a non-empty string.",
            ));
        }
    };
    let max_tokens = match object.get("max_tokens") {
        Some(Value::Number(n)) if n.as_u64().is_some_and(|n| n > 0) => n.clone(),
        None | Some(Value::Null) => return Err(ApiError::missing("max_tokens")),
        Some(_) => {
            return Err(ApiError::invalid(
                "max_tokens",
                "`max_tokens` must be a positive integer.",
            ));
        }
    };
    let stream = optional_bool(object, "stream")?;
    let mut messages = Vec::new();
    if let Some(system) = object.get("system").filter(|s| !s.is_null()) {
        let text = text_of(system, "system")?;
        messages.push(json!({ "role": "system", "content": text }));
    }
    let turns = match object.get("messages") {
        Some(Value::Array(turns)) if !turns.is_empty() => turns,
        None | Some(Value::Null) => return Err(ApiError::missing("messages")),
        Some(_) => {
            return Err(ApiError::invalid(
                "messages",
                "`messages` must be a non-empty array.",
            ));
        }
    };
    for turn in turns {
        translate_turn(turn, &mut messages)?;
    }
    let mut chat = Map::new();
    chat.insert("messages".into(), Value::Array(messages));
    chat.insert("max_tokens".into(), Value::Number(max_tokens));
    sampling(object, &mut chat)?;
    if let Some(tools) = object.get("tools").filter(|t| !t.is_null()) {
        chat.insert("tools".into(), translate_tools(tools)?);
    }
    if let Some(choice) = object.get("tool_choice").filter(|c| !c.is_null()) {
        refuse_forced_server_tool(choice, object.get("tools"))?;
        translate_tool_choice(choice, &mut chat)?;
    }
    Ok(MessagesRequest {
        model,
        stream,
        thinking: thinking(object)?,
        chat: Value::Object(chat),
    })
}

fn optional_bool(object: &Map<String, Value>, name: &'static str) -> Result<bool, ApiError> {
    match object.get(name) {
        None | Some(Value::Null) => Ok(false),
        Some(Value::Bool(value)) => Ok(*value),
        Some(_) => Err(ApiError::invalid(
            name,
            format!("`{name}` must be a boolean."),
        )),
    }
}

/// `temperature`, `top_p`, `top_k` (numbers, passed on) and `stop_sequences` (→ `stop`).
fn sampling(object: &Map<String, Value>, chat: &mut Map<String, Value>) -> Result<(), ApiError> {
    for name in ["temperature", "top_p", "top_k"] {
        match object.get(name) {
            None | Some(Value::Null) => {}
            Some(value @ Value::Number(_)) => {
                chat.insert(name.into(), value.clone());
            }
            Some(_) => {
                return Err(ApiError::invalid(
                    "temperature",
                    format!("`{name}` must be a number."),
                ));
            }
        }
    }
    match object.get("stop_sequences") {
        None | Some(Value::Null) => {}
        Some(Value::Array(stops)) if stops.iter().all(Value::is_string) => {
            if !stops.is_empty() {
                chat.insert("stop".into(), Value::Array(stops.clone()));
            }
        }
        Some(_) => {
            return Err(ApiError::invalid(
                "stop_sequences",
                "`stop_sequences` must be an array of strings.",
            ));
        }
    }
    Ok(())
}

/// Whether `thinking` asks for thinking (`enabled` or `adaptive`).
fn thinking(object: &Map<String, Value>) -> Result<bool, ApiError> {
    match object.get("thinking") {
        None | Some(Value::Null) => Ok(false),
        Some(Value::Object(thinking)) => match thinking.get("type").and_then(Value::as_str) {
            Some("enabled" | "adaptive") => Ok(true),
            Some("disabled") => Ok(false),
            _ => Err(ApiError::invalid(
                "thinking",
                "`thinking.type` must be `enabled`, `adaptive` or `disabled`.",
            )),
        },
        Some(_) => Err(ApiError::invalid(
            "thinking",
            "`thinking` must be an object.",
        )),
    }
}

/// A string, or the text of an array of `text` blocks (joined by blank lines).
fn text_of(value: &Value, param: &'static str) -> Result<String, ApiError> {
    match value {
        Value::String(text) => Ok(text.clone()),
        Value::Array(blocks) => {
            let texts = blocks
                .iter()
                .map(|block| match block_type(block) {
                    Some("text") => block["text"].as_str().ok_or_else(|| {
                        ApiError::invalid(param, "A `text` block needs a string `text`.")
                    }),
                    _ => Err(ApiError::invalid(
                        param,
                        format!("`{param}` may hold only `text` blocks."),
                    )),
                })
                .collect::<Result<Vec<_>, _>>()?;
            Ok(texts.join("\n\n"))
        }
        _ => Err(ApiError::invalid(
            param,
            format!("`{param}` must be a string or an array of text blocks."),
        )),
    }
}

fn block_type(block: &Value) -> Option<&str> {
    block.get("type").and_then(Value::as_str)
}

/// One Messages turn as one or more chat messages.
fn translate_turn(turn: &Value, out: &mut Vec<Value>) -> Result<(), ApiError> {
    let role = turn.get("role").and_then(Value::as_str);
    let content = turn.get("content");
    match (role, content) {
        (Some(role @ ("user" | "assistant")), Some(Value::String(text))) => {
            out.push(json!({ "role": role, "content": text }));
            Ok(())
        }
        (Some("user"), Some(Value::Array(blocks))) => user_turn(blocks, out),
        (Some("assistant"), Some(Value::Array(blocks))) => assistant_turn(blocks, out),
        // Claude Code sends system turns mid-conversation (its environment, reminders):
        // they stay where they are, as chat system messages.
        (Some("system"), Some(content)) => {
            out.push(json!({ "role": "system", "content": text_of(content, "messages")? }));
            Ok(())
        }
        (Some("user" | "assistant" | "system"), _) => Err(ApiError::invalid(
            "messages",
            "A message's `content` must be a string or an array of content blocks.",
        )),
        _ => Err(ApiError::invalid(
            "messages",
            "A message's `role` must be `user`, `assistant` or `system`.",
        )),
    }
}

/// A user turn: `tool_result` blocks become `tool` messages (first, as Anthropic requires
/// them first), the other blocks one user message of content parts.
fn user_turn(blocks: &[Value], out: &mut Vec<Value>) -> Result<(), ApiError> {
    let mut parts = Vec::new();
    for block in blocks {
        match block_type(block) {
            Some("text") => parts.push(json!({ "type": "text", "text": text_field(block)? })),
            Some("image") => parts.push(image_part(block)?),
            Some("tool_result") => out.push(tool_message(block)?),
            Some(other) => return Err(unsupported_block(other)),
            None => {
                return Err(ApiError::invalid(
                    "messages",
                    "A content block needs a `type`.",
                ));
            }
        }
    }
    match parts.as_slice() {
        [] => {}
        [only] if only["type"] == "text" => {
            out.push(json!({ "role": "user", "content": only["text"] }));
        }
        _ => out.push(json!({ "role": "user", "content": parts })),
    }
    Ok(())
}

/// An assistant turn: its text, and its `tool_use` blocks as `tool_calls`; thinking
/// blocks are the model's own and are not sent back.
fn assistant_turn(blocks: &[Value], out: &mut Vec<Value>) -> Result<(), ApiError> {
    let mut text = Vec::new();
    let mut calls = Vec::new();
    for block in blocks {
        match block_type(block) {
            Some("text") => text.push(text_field(block)?),
            Some("tool_use") => calls.push(tool_call(block)?),
            Some("thinking" | "redacted_thinking") => {}
            Some(other) => return Err(unsupported_block(other)),
            None => {
                return Err(ApiError::invalid(
                    "messages",
                    "A content block needs a `type`.",
                ));
            }
        }
    }
    let content = if text.is_empty() && !calls.is_empty() {
        Value::Null
    } else {
        Value::from(text.join(""))
    };
    let mut message = json!({ "role": "assistant", "content": content });
    if !calls.is_empty() {
        message["tool_calls"] = Value::Array(calls);
    }
    out.push(message);
    Ok(())
}

fn unsupported_block(kind: &str) -> ApiError {
    ApiError::invalid(
        "messages",
        format!("Content blocks of type `{kind}` are not supported by this server."),
    )
}

fn text_field(block: &Value) -> Result<&str, ApiError> {
    block["text"]
        .as_str()
        .ok_or_else(|| ApiError::invalid("messages", "A `text` block needs a string `text`."))
}

fn string_field<'a>(block: &'a Value, name: &str, kind: &str) -> Result<&'a str, ApiError> {
    block[name].as_str().ok_or_else(|| {
        ApiError::invalid(
            "messages",
            format!("A `{kind}` block needs a string `{name}`."),
        )
    })
}

/// An `image` block as an `image_url` part (a data URL for base64 sources).
fn image_part(block: &Value) -> Result<Value, ApiError> {
    let source = &block["source"];
    let url = match source["type"].as_str() {
        Some("base64") => format!(
            "data:{};base64,{}",
            string_field(source, "media_type", "image")?,
            string_field(source, "data", "image")?
        ),
        Some("url") => string_field(source, "url", "image")?.to_owned(),
        _ => {
            return Err(ApiError::invalid(
                "messages",
                "An `image` block's `source.type` must be `base64` or `url`.",
            ));
        }
    };
    Ok(json!({ "type": "image_url", "image_url": { "url": url } }))
}

/// A `tool_use` block as a chat tool call (its `input` as the arguments' JSON text).
fn tool_call(block: &Value) -> Result<Value, ApiError> {
    let id = string_field(block, "id", "tool_use")?;
    let name = string_field(block, "name", "tool_use")?;
    let input = block.get("input").cloned().unwrap_or_else(|| json!({}));
    Ok(json!({
        "id": id,
        "type": "function",
        "function": { "name": name, "arguments": input.to_string() },
    }))
}

/// A `tool_result` block as a `tool` message.
fn tool_message(block: &Value) -> Result<Value, ApiError> {
    let id = string_field(block, "tool_use_id", "tool_result")?;
    let content = match block.get("content") {
        None | Some(Value::Null) => String::new(),
        Some(content) => text_of(content, "messages")?,
    };
    Ok(json!({ "role": "tool", "tool_call_id": id, "content": content }))
}

/// `tools`: client tools (`name`, `description`, `input_schema`; no `type`, or `custom`) as
/// OpenAI function tools. Server tools (a `type` such as `web_search_20250305`, run by
/// Anthropic's servers) cannot run in this pool and are left out;
/// [`refuse_forced_server_tool`] refuses a `tool_choice` that names one.
fn translate_tools(tools: &Value) -> Result<Value, ApiError> {
    let Value::Array(tools) = tools else {
        return Err(ApiError::invalid("tools", "`tools` must be an array."));
    };
    tools
        .iter()
        .filter(|tool| !is_server_tool(tool))
        .map(|tool| {
            let name = tool["name"]
                .as_str()
                .ok_or_else(|| ApiError::invalid("tools", "A tool needs a string `name`."))?;
            let schema = tool
                .get("input_schema")
                .filter(|schema| schema.is_object())
                .ok_or_else(|| {
                    ApiError::invalid("tools", "A tool needs an object `input_schema`.")
                })?;
            let mut function = json!({ "name": name, "parameters": schema });
            if let Some(description) = tool.get("description").and_then(Value::as_str) {
                function["description"] = Value::from(description);
            }
            Ok(json!({ "type": "function", "function": function }))
        })
        .collect()
}

/// Whether `tool` is one of Anthropic's server tools: typed, and not `custom`.
fn is_server_tool(tool: &Value) -> bool {
    block_type(tool).is_some_and(|kind| kind != "custom")
}

/// Refuses a `tool_choice` naming a server tool, which [`translate_tools`] leaves out.
fn refuse_forced_server_tool(choice: &Value, tools: Option<&Value>) -> Result<(), ApiError> {
    match choice["name"]
        .as_str()
        .and_then(|name| server_tool_named(tools, name))
    {
        Some(kind) => Err(ApiError::invalid(
            "tool_choice",
            format!(
                "`tool_choice` forces the server tool `{kind}`, which this server cannot run; only client tools with an `input_schema` run here."
            ),
        )),
        None => Ok(()),
    }
}

/// The server tool `name` names in `tools`, if any.
fn server_tool_named<'a>(tools: Option<&'a Value>, name: &str) -> Option<&'a str> {
    tools?
        .as_array()?
        .iter()
        .find(|tool| is_server_tool(tool) && tool["name"] == name)
        .and_then(block_type)
}

/// `tool_choice` (`auto`, `any`, `tool`, `none`) as OpenAI's, and
/// `disable_parallel_tool_use` as `parallel_tool_calls: false`.
fn translate_tool_choice(choice: &Value, chat: &mut Map<String, Value>) -> Result<(), ApiError> {
    let translated = match block_type(choice) {
        Some("auto") => json!("auto"),
        Some("any") => json!("required"),
        Some("none") => json!("none"),
        Some("tool") => {
            let name = choice["name"].as_str().ok_or_else(|| {
                ApiError::invalid(
                    "tool_choice",
                    "`tool_choice` of type `tool` needs a `name`.",
                )
            })?;
            json!({ "type": "function", "function": { "name": name } })
        }
        _ => {
            return Err(ApiError::invalid(
                "tool_choice",
                "`tool_choice.type` must be `auto`, `any`, `tool` or `none`.",
            ));
        }
    };
    chat.insert("tool_choice".into(), translated);
    if choice["disable_parallel_tool_use"] == Value::Bool(true) {
        chat.insert("parallel_tool_calls".into(), Value::Bool(false));
    }
    Ok(())
}
