//! Responses API request → the chat body the chat endpoint would send a node: `instructions`
//! becomes a system message, `input` (text or items) becomes chat messages (`function_call`
//! items an assistant's `tool_calls`, `function_call_output` items `tool` messages),
//! function `tools` take the chat form (the functions of a `namespace` tool too, their
//! namespace kept for the calls' way back), `max_output_tokens` becomes `max_tokens` and
//! `text.format` becomes `response_format`. `background: true` (with or without
//! `store: true`) makes a run that outlives the caller's connection, found again by its
//! response id; otherwise stateless: `store: true`, `previous_response_id` and
//! `conversation` are refused by name. A `compaction_trigger` as the last item asks for the
//! conversation's summary, and a `compaction` item stands for an earlier one
//! (`compaction.rs`).
//!
//! Pure: JSON in, JSON out, errors as [`ApiError`]s in OpenAI's shape.

use std::collections::BTreeMap;

use serde_json::{Map, Value, json};

use super::compaction;
use crate::adapters::api::translators::ApiError;
use crate::adapters::api::translators::ChatTranslation;

/// A checked Responses request, translated.
#[derive(Debug, Clone, PartialEq)]
pub(in crate::adapters::api) struct ResponsesRequest {
    /// The model as the client named it.
    pub model: String,
    /// Whether the answer is an SSE stream.
    pub stream: bool,
    /// `background: true`: the run is not cancelled when the caller goes away.
    pub background: bool,
    /// `instructions`, echoed in the answer.
    pub instructions: Value,
    /// The chat-completions body (without `model` and `stream`) the run gets as input.
    pub chat: Value,
    /// The namespace of each function that came inside a `namespace` tool, by the function's
    /// name: its calls go back with it.
    pub namespaces: BTreeMap<String, String>,
    /// The input ended with a `compaction_trigger`: the run summarises the conversation and
    /// the answer is one `compaction` item.
    pub compaction: bool,
}

impl ChatTranslation for ResponsesRequest {
    fn model(&self) -> &str {
        &self.model
    }

    fn chat(&self) -> &Value {
        &self.chat
    }

    fn stream(&self) -> bool {
        self.stream
    }

    fn background(&self) -> bool {
        self.background
    }
}

fn unsupported(param: &'static str, message: impl Into<String>) -> ApiError {
    ApiError::bad_request(Some(param), "unsupported_parameter", message)
}

/// Translates a Responses request body.
///
/// # Errors
/// A 400 naming the field when the body is not a valid request, or asks for what a
/// stateless edge does not do (stored responses, server-side tools).
pub(in crate::adapters::api) fn translate(body: &Value) -> Result<ResponsesRequest, ApiError> {
    let Some(object) = body.as_object() else {
        return Err(ApiError::malformed_json("the body must be a JSON object"));
    };
    refuse_state(object)?;
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
    let stream = match object.get("stream") {
        None | Some(Value::Null) => false,
        Some(Value::Bool(stream)) => *stream,
        Some(_) => return Err(ApiError::invalid("stream", "`stream` must be a boolean.")),
    };
    let mut messages = Vec::new();
    let instructions = object.get("instructions").cloned().unwrap_or(Value::Null);
    match &instructions {
        Value::Null => {}
        Value::String(text) => messages.push(json!({ "role": "system", "content": text })),
        _ => {
            return Err(ApiError::invalid(
                "instructions",
                "`instructions` must be a string.",
            ));
        }
    }
    let compacting = input_messages(object.get("input"), &mut messages)?;
    let mut chat = Map::new();
    chat.insert("messages".into(), Value::Array(messages));
    options(object, &mut chat)?;
    if compacting {
        // The summary is text: no tool calls, no structured output.
        for field in [
            "tools",
            "tool_choice",
            "parallel_tool_calls",
            "response_format",
        ] {
            chat.remove(field);
        }
    }
    Ok(ResponsesRequest {
        model,
        stream,
        background: object.get("background") == Some(&Value::Bool(true)),
        instructions,
        chat: Value::Object(chat),
        namespaces: object.get("tools").map(namespaces).unwrap_or_default(),
        compaction: compacting,
    })
}

/// `input` (text or items) as chat messages; whether its last item is a
/// `compaction_trigger` (the messages then end with the request for a summary).
fn input_messages(input: Option<&Value>, messages: &mut Vec<Value>) -> Result<bool, ApiError> {
    match input {
        Some(Value::String(text)) => {
            messages.push(json!({ "role": "user", "content": text }));
            Ok(false)
        }
        Some(Value::Array(items)) if !items.is_empty() => {
            let (last, earlier) = items.split_last().unwrap_or((&Value::Null, &[]));
            let compacting = last.get("type").and_then(Value::as_str) == Some(compaction::TRIGGER);
            let conversation = if compacting {
                earlier
            } else {
                items.as_slice()
            };
            for item in conversation {
                translate_item(item, messages)?;
            }
            if compacting {
                messages.push(compaction::summary_request());
            }
            Ok(compacting)
        }
        None | Some(Value::Null) => Err(ApiError::missing("input")),
        Some(_) => Err(ApiError::invalid(
            "input",
            "`input` must be a string or a non-empty array of items.",
        )),
    }
}

/// Refuses what needs state the edge does not keep.
fn refuse_state(object: &Map<String, Value>) -> Result<(), ApiError> {
    let background = object.get("background") == Some(&Value::Bool(true));
    if object.get("store") == Some(&Value::Bool(true)) && !background {
        return Err(unsupported(
            "store",
            "`store: true` is only supported with `background: true`: this server keeps no other responses. Send `store: false` or leave it out.",
        ));
    }
    for (name, what) in [
        (
            "previous_response_id",
            "`previous_response_id` is not supported: this server keeps no responses. Send the whole conversation in `input`.",
        ),
        (
            "conversation",
            "`conversation` is not supported: this server keeps no conversations. Send the whole conversation in `input`.",
        ),
        (
            "prompt",
            "`prompt` (stored prompt templates) is not supported by this server.",
        ),
    ] {
        if object.get(name).is_some_and(|value| !value.is_null()) {
            return Err(unsupported(name, what));
        }
    }
    Ok(())
}

/// Sampling, limits, tools and the output format.
fn options(object: &Map<String, Value>, chat: &mut Map<String, Value>) -> Result<(), ApiError> {
    for (from, to) in [
        ("temperature", "temperature"),
        ("top_p", "top_p"),
        ("max_output_tokens", "max_tokens"),
    ] {
        match object.get(from) {
            None | Some(Value::Null) => {}
            Some(value @ Value::Number(_)) => {
                chat.insert(to.into(), value.clone());
            }
            Some(_) => {
                return Err(ApiError::invalid(
                    "temperature",
                    format!("`{from}` must be a number."),
                ));
            }
        }
    }
    if let Some(parallel) = object.get("parallel_tool_calls").filter(|v| !v.is_null()) {
        if !parallel.is_boolean() {
            return Err(ApiError::invalid(
                "parallel_tool_calls",
                "`parallel_tool_calls` must be a boolean.",
            ));
        }
        chat.insert("parallel_tool_calls".into(), parallel.clone());
    }
    if let Some(tools) = object.get("tools").filter(|t| !t.is_null()) {
        let tools = translate_tools(tools)?;
        if !tools.is_empty() {
            chat.insert("tools".into(), Value::Array(tools));
        }
    }
    if let Some(choice) = object.get("tool_choice").filter(|c| !c.is_null()) {
        chat.insert("tool_choice".into(), translate_tool_choice(choice)?);
    }
    if let Some(format) = object.get("text").and_then(|text| text.get("format"))
        && let Some(format) = translate_format(format)?
    {
        chat.insert("response_format".into(), format);
    }
    if let Some(effort) = object
        .get("reasoning")
        .and_then(|r| r.get("effort"))
        .and_then(Value::as_str)
    {
        chat.insert("reasoning_effort".into(), Value::from(effort));
    }
    Ok(())
}

/// One input item as chat messages.
fn translate_item(item: &Value, out: &mut Vec<Value>) -> Result<(), ApiError> {
    let kind = item.get("type").and_then(Value::as_str);
    match kind {
        None | Some("message") if item.get("role").is_some() => message_item(item, out),
        Some("function_call") => function_call_item(item, out),
        Some("function_call_output") => {
            let call_id = string_field(item, "call_id", "function_call_output")?;
            let output = match item.get("output") {
                Some(Value::String(text)) => text.clone(),
                Some(Value::Array(parts)) => content_text(parts)?,
                _ => {
                    return Err(ApiError::invalid(
                        "input",
                        "A `function_call_output` item needs an `output`.",
                    ));
                }
            };
            out.push(json!({ "role": "tool", "tool_call_id": call_id, "content": output }));
            Ok(())
        }
        Some("reasoning") => Ok(()),
        Some(kind) if compaction::is_compaction(kind) => {
            out.push(compaction::expand(item)?);
            Ok(())
        }
        Some(compaction::TRIGGER) => Err(ApiError::invalid(
            "input",
            "A `compaction_trigger` item must be the last input item.",
        )),
        Some(other) => Err(unsupported(
            "input",
            format!("Input items of type `{other}` are not supported by this server."),
        )),
        None => Err(ApiError::invalid(
            "input",
            "An input item needs a `type` or a `role`.",
        )),
    }
}

fn string_field<'a>(item: &'a Value, name: &str, kind: &str) -> Result<&'a str, ApiError> {
    item[name].as_str().ok_or_else(|| {
        ApiError::invalid("input", format!("A `{kind}` item needs a string `{name}`."))
    })
}

/// A message item (`developer` is sent as `system`, which every engine knows).
fn message_item(item: &Value, out: &mut Vec<Value>) -> Result<(), ApiError> {
    let role = match item["role"].as_str() {
        Some("developer" | "system") => "system",
        Some(role @ ("user" | "assistant")) => role,
        _ => {
            return Err(ApiError::invalid(
                "input",
                "A message's `role` must be `user`, `assistant`, `system` or `developer`.",
            ));
        }
    };
    let content = match &item["content"] {
        Value::String(text) => Value::from(text.as_str()),
        Value::Array(parts) if role == "user" => user_parts(parts)?,
        Value::Array(parts) => Value::from(content_text(parts)?),
        _ => {
            return Err(ApiError::invalid(
                "input",
                "A message's `content` must be a string or an array.",
            ));
        }
    };
    out.push(json!({ "role": role, "content": content }));
    Ok(())
}

/// The text of `input_text`/`output_text`/`refusal` parts, concatenated.
fn content_text(parts: &[Value]) -> Result<String, ApiError> {
    let mut text = String::new();
    for part in parts {
        match part.get("type").and_then(Value::as_str) {
            Some("input_text" | "output_text" | "text") => {
                text.push_str(string_field(part, "text", "text")?)
            }
            Some("refusal") => text.push_str(string_field(part, "refusal", "refusal")?),
            other => {
                return Err(unsupported(
                    "input",
                    format!(
                        "Content parts of type `{}` are not supported here.",
                        other.unwrap_or("?")
                    ),
                ));
            }
        }
    }
    Ok(text)
}

/// A user message's parts as chat content: a string when it is one text part.
fn user_parts(parts: &[Value]) -> Result<Value, ApiError> {
    let mut out = Vec::new();
    for part in parts {
        match part.get("type").and_then(Value::as_str) {
            Some("input_text" | "text") => {
                out.push(
                    json!({ "type": "text", "text": string_field(part, "text", "input_text")? }),
                );
            }
            Some("input_image") => {
                let url = string_field(part, "image_url", "input_image")?;
                let mut image = json!({ "url": url });
                if let Some(detail) = part.get("detail").filter(|d| d.is_string()) {
                    image["detail"] = detail.clone();
                }
                out.push(json!({ "type": "image_url", "image_url": image }));
            }
            other => {
                return Err(unsupported(
                    "input",
                    format!(
                        "Content parts of type `{}` are not supported by this server.",
                        other.unwrap_or("?")
                    ),
                ));
            }
        }
    }
    Ok(match out.as_slice() {
        [only] if only["type"] == "text" => only["text"].clone(),
        _ => Value::Array(out),
    })
}

/// A `function_call` item: a tool call of the previous assistant message, or of a new one.
fn function_call_item(item: &Value, out: &mut Vec<Value>) -> Result<(), ApiError> {
    let call = json!({
        "id": string_field(item, "call_id", "function_call")?,
        "type": "function",
        "function": {
            "name": string_field(item, "name", "function_call")?,
            "arguments": item["arguments"].as_str().unwrap_or("{}"),
        },
    });
    if let Some(last) = out.last_mut().filter(|m| m["role"] == "assistant")
        && let Some(Value::Array(calls)) = last.get_mut("tool_calls")
    {
        calls.push(call);
        return Ok(());
    }
    if let Some(last) = out.last_mut().filter(|m| m["role"] == "assistant") {
        last["tool_calls"] = json!([call]);
        return Ok(());
    }
    out.push(json!({ "role": "assistant", "content": null, "tool_calls": [call] }));
    Ok(())
}

/// The hosted tools OpenAI's servers run (web and file search, code, computers, images,
/// remote MCP): no node here runs them, so they are left out of the chat tools.
const HOSTED_TOOLS: [&str; 9] = [
    "web_search",
    "web_search_preview",
    "file_search",
    "code_interpreter",
    "computer_use_preview",
    "image_generation",
    "mcp",
    "local_shell",
    "tool_search",
];

fn is_hosted(kind: &str) -> bool {
    HOSTED_TOOLS.contains(&kind) || kind.starts_with("web_search_preview_")
}

/// Function tools in the chat form, and the function tools of each `namespace` tool (by
/// their own names, so the calls map back); hosted tools are left out; other types refused.
fn translate_tools(tools: &Value) -> Result<Vec<Value>, ApiError> {
    let Value::Array(tools) = tools else {
        return Err(ApiError::invalid("tools", "`tools` must be an array."));
    };
    let mut out = Vec::new();
    for tool in tools {
        match tool.get("type").and_then(Value::as_str) {
            Some("function") => out.push(function_tool(tool)?),
            Some("namespace") => {
                let Some(Value::Array(members)) = tool.get("tools") else {
                    return Err(ApiError::invalid(
                        "tools",
                        "A `namespace` tool needs an array `tools`.",
                    ));
                };
                for member in members {
                    out.push(function_tool(member)?);
                }
            }
            Some(kind) if is_hosted(kind) => {}
            other => {
                return Err(unsupported(
                    "tools",
                    format!(
                        "Tools of type `{}` are not supported by this server; only `function` and `namespace` tools (hosted tools are left out).",
                        other.unwrap_or("?")
                    ),
                ));
            }
        }
    }
    Ok(out)
}

/// The namespace of each function inside a `namespace` tool of `tools` (already checked by
/// [`translate_tools`]), by the function's name.
fn namespaces(tools: &Value) -> BTreeMap<String, String> {
    let mut namespaces = BTreeMap::new();
    for tool in tools.as_array().into_iter().flatten() {
        if tool.get("type").and_then(Value::as_str) != Some("namespace") {
            continue;
        }
        let Some(namespace) = tool.get("name").and_then(Value::as_str) else {
            continue;
        };
        for member in tool["tools"].as_array().into_iter().flatten() {
            if let Some(name) = member.get("name").and_then(Value::as_str) {
                namespaces.insert(name.to_owned(), namespace.to_owned());
            }
        }
    }
    namespaces
}

/// A `function` tool (inside a namespace too) in the chat form.
fn function_tool(tool: &Value) -> Result<Value, ApiError> {
    if tool.get("type").and_then(Value::as_str) != Some("function") {
        return Err(unsupported(
            "tools",
            "A `namespace` tool may hold only `function` tools.",
        ));
    }
    let name = tool["name"]
        .as_str()
        .ok_or_else(|| ApiError::invalid("tools", "A function tool needs a string `name`."))?;
    let mut function = json!({ "name": name });
    for field in ["description", "parameters", "strict"] {
        if let Some(value) = tool.get(field).filter(|v| !v.is_null()) {
            function[field] = value.clone();
        }
    }
    Ok(json!({ "type": "function", "function": function }))
}

fn translate_tool_choice(choice: &Value) -> Result<Value, ApiError> {
    if let Some(kind) = choice["type"].as_str().filter(|kind| is_hosted(kind)) {
        return Err(unsupported(
            "tool_choice",
            format!("`tool_choice` forces the hosted tool `{kind}`, which this server cannot run."),
        ));
    }
    match choice {
        Value::String(mode) if matches!(mode.as_str(), "auto" | "none" | "required") => {
            Ok(choice.clone())
        }
        Value::Object(object) if object.get("type") == Some(&json!("function")) => {
            let name = object.get("name").and_then(Value::as_str).ok_or_else(|| {
                ApiError::invalid("tool_choice", "A function `tool_choice` needs a `name`.")
            })?;
            Ok(json!({ "type": "function", "function": { "name": name } }))
        }
        _ => Err(unsupported(
            "tool_choice",
            "`tool_choice` must be `auto`, `none`, `required` or a function.",
        )),
    }
}

/// `text.format` as `response_format` (`None` for plain text).
fn translate_format(format: &Value) -> Result<Option<Value>, ApiError> {
    match format.get("type").and_then(Value::as_str) {
        None | Some("text") => Ok(None),
        Some("json_object") => Ok(Some(json!({ "type": "json_object" }))),
        Some("json_schema") => {
            let mut schema =
                json!({ "name": format.get("name").cloned().unwrap_or(json!("response")) });
            for field in ["schema", "strict", "description"] {
                if let Some(value) = format.get(field).filter(|v| !v.is_null()) {
                    schema[field] = value.clone();
                }
            }
            Ok(Some(
                json!({ "type": "json_schema", "json_schema": schema }),
            ))
        }
        Some(other) => Err(unsupported(
            "text",
            format!("`text.format.type` `{other}` is not supported."),
        )),
    }
}
