//! The conversation and tool fields of a Messages request, turned into the server's chat
//! messages and [`ToolRequest`] — the same values the OpenAI endpoint builds, so both APIs
//! render through the model's chat template by one path:
//!
//! - `system`: a string or a list of text blocks (`cache_control` and other block keys ignored);
//! - `messages[i].content`: a string or blocks — `text`; in assistant turns `tool_use`
//!   (`{id, name, input}` → the message's tool calls) and `thinking`/`redacted_thinking`
//!   (dropped: the model does not see earlier reasoning); in user turns `tool_result`
//!   (`{tool_use_id, content, is_error}` → a tool message answering that call, which an earlier
//!   `tool_use` must have made);
//! - `tools`: `{name, description, input_schema, cache_control, type: "custom"}`;
//! - `tool_choice`: `auto | any | tool{name} | none`, with `disable_parallel_tool_use`.

use serde_json::{Map, Value};

use crate::backend::{ChatMessage, Role, Tool, ToolCall};
use crate::error::ApiError;
use crate::openai::content_text;
use crate::params::{kind_of, unsupported, Fields};
use crate::tools::{new_tool, ToolChoice, ToolFields, ToolRequest};

fn invalid(param: &str, message: String) -> ApiError {
    ApiError::invalid(param, message)
}

/// The `system` and `messages` fields as one conversation (system first).
pub(crate) fn conversation(f: &mut Fields) -> Result<Vec<ChatMessage>, ApiError> {
    let mut messages = Vec::new();
    if let Some(v) = f.take("system") {
        messages.push(ChatMessage::new(Role::System, content_text(v, "system")?));
    }
    match f.take("messages") {
        None => return Err(ApiError::invalid("messages", "messages: Field required")),
        Some(Value::Array(items)) if items.is_empty() => {
            return Err(ApiError::invalid("messages", "messages: at least one message is required"))
        }
        Some(Value::Array(items)) => {
            for (i, item) in items.into_iter().enumerate() {
                message(i, item, &mut messages)?;
            }
        }
        Some(v) => {
            return Err(ApiError::invalid("messages", format!("messages: expected an array, but got {}", kind_of(&v))))
        }
    }
    Ok(messages)
}

fn role(at: &str, v: Option<Value>) -> Result<Role, ApiError> {
    match v {
        Some(Value::String(r)) if r == "user" => Ok(Role::User),
        Some(Value::String(r)) if r == "assistant" => Ok(Role::Assistant),
        Some(Value::String(r)) if r == "system" => Err(ApiError::invalid(
            at,
            "Unexpected role \"system\". The Messages API accepts a top-level `system` \
             parameter, not \"system\" as an input message role.",
        )),
        Some(Value::String(r)) => {
            Err(invalid(at, format!("{at}: unexpected role \"{r}\"; expected \"user\" or \"assistant\"")))
        }
        None | Some(Value::Null) => Err(invalid(at, format!("{at}: Field required"))),
        Some(v) => Err(invalid(at, format!("{at}: expected a string, but got {}", kind_of(&v)))),
    }
}

/// One Messages turn, appended to `out` as one chat message — or, for a user turn with
/// `tool_result` blocks, one tool message per result then a user message with its text.
fn message(i: usize, item: Value, out: &mut Vec<ChatMessage>) -> Result<(), ApiError> {
    let at = format!("messages[{i}]");
    let Value::Object(mut m) = item else {
        return Err(invalid(&at, format!("{at}: expected an object, but got {}", kind_of(&item))));
    };
    let role = role(&format!("{at}.role"), m.remove("role"))?;
    let content_at = format!("{at}.content");
    let blocks = match m.remove("content") {
        None | Some(Value::Null) => return Err(invalid(&content_at, format!("{content_at}: Field required"))),
        Some(Value::String(s)) => {
            out.push(ChatMessage::new(role, s));
            return Ok(());
        }
        Some(Value::Array(blocks)) => blocks,
        Some(v) => {
            return Err(invalid(
                &content_at,
                format!("{content_at}: expected a string or an array of content blocks, but got {}", kind_of(&v)),
            ))
        }
    };
    let mut text: Vec<String> = Vec::new();
    let mut calls: Vec<ToolCall> = Vec::new();
    let mut results: Vec<ChatMessage> = Vec::new();
    for (j, block) in blocks.into_iter().enumerate() {
        let at = format!("{content_at}[{j}]");
        let kind = block.get("type").and_then(Value::as_str).map(str::to_string);
        let Value::Object(b) = block else {
            return Err(invalid(&at, format!("{at}: expected a content block object")));
        };
        match (kind.as_deref(), role) {
            (Some("text"), _) => match b.get("text") {
                Some(Value::String(t)) => text.push(t.clone()),
                _ => return Err(invalid(&format!("{at}.text"), format!("{at}.text: expected a string"))),
            },
            (Some("tool_use"), Role::Assistant) => calls.push(tool_use(&at, b)?),
            (Some("thinking" | "redacted_thinking"), Role::Assistant) => {}
            (Some("tool_result"), Role::User) => results.push(tool_result(&at, b, out)?),
            (Some(k @ ("tool_use" | "tool_result" | "thinking" | "redacted_thinking")), _) => {
                return Err(invalid(
                    &format!("{at}.type"),
                    format!("{at}.type: a '{k}' block cannot appear in a {} message", role.as_str()),
                ))
            }
            (Some(other), _) => {
                return Err(unsupported(
                    &format!("{at}.type"),
                    &format!("content blocks of type '{other}' are not supported (text and tools only)"),
                ))
            }
            (None, _) => return Err(invalid(&format!("{at}.type"), format!("{at}.type: Field required"))),
        }
    }
    let had_results = !results.is_empty();
    out.extend(results);
    if !had_results || !text.is_empty() {
        out.push(ChatMessage { tool_calls: calls, ..ChatMessage::new(role, text.join("\n")) });
    }
    Ok(())
}

/// `{"type": "tool_use", "id", "name", "input": {…}}` → a call (arguments as JSON text).
fn tool_use(at: &str, mut b: Map<String, Value>) -> Result<ToolCall, ApiError> {
    let field = |b: &mut Map<String, Value>, key: &str| match b.remove(key) {
        Some(Value::String(s)) if !s.is_empty() => Ok(s),
        _ => Err(invalid(&format!("{at}.{key}"), format!("{at}.{key}: Field required (a non-empty string)"))),
    };
    let id = field(&mut b, "id")?;
    let name = field(&mut b, "name")?;
    let input = match b.remove("input") {
        Some(v @ Value::Object(_)) => v,
        None | Some(Value::Null) => Value::Object(Map::new()),
        Some(v) => {
            return Err(invalid(
                &format!("{at}.input"),
                format!("{at}.input: expected an object, but got {}", kind_of(&v)),
            ))
        }
    };
    Ok(ToolCall { id, name, arguments: input.to_string() })
}

/// `{"type": "tool_result", "tool_use_id", "content", "is_error"}` → a tool message; the id
/// must be one an earlier assistant turn's `tool_use` gave (`before`: the conversation so far).
fn tool_result(at: &str, mut b: Map<String, Value>, before: &[ChatMessage]) -> Result<ChatMessage, ApiError> {
    let id_at = format!("{at}.tool_use_id");
    let Some(Value::String(id)) = b.remove("tool_use_id") else {
        return Err(invalid(&id_at, format!("{id_at}: Field required")));
    };
    if !before.iter().any(|m| m.tool_calls.iter().any(|c| c.id == id)) {
        return Err(invalid(
            &id_at,
            format!("{id_at}: unexpected `tool_use_id` found in `tool_result` blocks: {id}. Each `tool_result` block must have a corresponding `tool_use` block in a previous message."),
        ));
    }
    let content = match b.remove("content") {
        None | Some(Value::Null) => String::new(),
        Some(v) => content_text(v, &format!("{at}.content"))?,
    };
    match b.remove("is_error") {
        None | Some(Value::Null | Value::Bool(_)) => {}
        Some(v) => {
            let p = format!("{at}.is_error");
            return Err(invalid(&p, format!("{p}: expected a boolean, but got {}", kind_of(&v))));
        }
    }
    Ok(ChatMessage { tool_call_id: Some(id), ..ChatMessage::new(Role::Tool, content) })
}

/// Reads `tools` and `tool_choice`.
pub(crate) fn tool_request(f: &mut Fields) -> Result<ToolRequest, ApiError> {
    let tools = match f.take("tools") {
        None => Vec::new(),
        Some(Value::Array(items)) => tools(items)?,
        Some(v) => return Err(invalid("tools", format!("tools: expected an array, but got {}", kind_of(&v)))),
    };
    let (choice, parallel) = match f.take("tool_choice") {
        None if tools.is_empty() => (ToolChoice::None, true),
        None => (ToolChoice::Auto, true),
        Some(v) => tool_choice(v, &tools)?,
    };
    Ok(ToolRequest { tools, choice, parallel })
}

fn tools(items: Vec<Value>) -> Result<Vec<Tool>, ApiError> {
    let mut out: Vec<Tool> = Vec::with_capacity(items.len());
    for (i, item) in items.into_iter().enumerate() {
        let at = format!("tools[{i}]");
        let Value::Object(mut o) = item else {
            return Err(invalid(&at, format!("{at}: expected an object, but got {}", kind_of(&item))));
        };
        match o.remove("type") {
            None | Some(Value::Null) => {}
            Some(Value::String(t)) if t == "custom" => {}
            Some(Value::String(t)) => {
                return Err(unsupported(&format!("{at}.type"), &format!("server tools ('{t}') are not available")))
            }
            Some(v) => {
                return Err(invalid(
                    &format!("{at}.type"),
                    format!("{at}.type: expected a string, but got {}", kind_of(&v)),
                ))
            }
        }
        let name = match o.remove("name") {
            Some(Value::String(n)) => n,
            _ => return Err(invalid(&format!("{at}.name"), format!("{at}.name: Field required"))),
        };
        let description = match o.remove("description") {
            None | Some(Value::Null) => None,
            Some(Value::String(d)) => Some(d),
            Some(_) => {
                return Err(invalid(&format!("{at}.description"), format!("{at}.description: expected a string")))
            }
        };
        let schema = match o.remove("input_schema") {
            None => return Err(invalid(&format!("{at}.input_schema"), format!("{at}.input_schema: Field required"))),
            s => s,
        };
        let strict = matches!(o.remove("strict"), Some(Value::Bool(true)));
        out.push(new_tool(&out, ToolFields { at, name, description, schema, schema_key: "input_schema", strict })?);
    }
    Ok(out)
}

/// `{"type": "auto" | "any" | "none"}` or `{"type": "tool", "name"}`, each with an optional
/// `disable_parallel_tool_use`.
fn tool_choice(v: Value, tools: &[Tool]) -> Result<(ToolChoice, bool), ApiError> {
    const P: &str = "tool_choice";
    let Value::Object(o) = v else {
        return Err(invalid(P, format!("{P}: expected an object, but got {}", kind_of(&v))));
    };
    let parallel = match o.get("disable_parallel_tool_use") {
        None | Some(Value::Null) => true,
        Some(Value::Bool(b)) => !b,
        Some(v) => {
            let p = "tool_choice.disable_parallel_tool_use";
            return Err(invalid(p, format!("{p}: expected a boolean, but got {}", kind_of(v))));
        }
    };
    let choice = match o.get("type").and_then(Value::as_str) {
        Some("auto") => ToolChoice::Auto,
        Some("none") => ToolChoice::None,
        Some("any") if tools.is_empty() => {
            return Err(invalid(P, "tool_choice: 'any' requires at least one tool in 'tools'".into()))
        }
        Some("any") => ToolChoice::Required,
        Some("tool") => match o.get("name").and_then(Value::as_str) {
            Some(name) if tools.iter().any(|t| t.name == name) => ToolChoice::Function(name.to_string()),
            Some(name) => {
                return Err(invalid("tool_choice.name", format!("tool_choice.name: tool '{name}' is not in 'tools'")))
            }
            None => return Err(invalid("tool_choice.name", "tool_choice.name: Field required".into())),
        },
        _ => {
            return Err(invalid(
                "tool_choice.type",
                "tool_choice.type: expected one of 'auto', 'any', 'tool', 'none'".into(),
            ))
        }
    };
    Ok((choice, parallel))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::params::parse_object;
    use serde_json::json;

    fn fields(v: Value) -> Fields {
        parse_object(v.to_string().as_bytes()).unwrap()
    }

    fn weather() -> Value {
        json!({"name": "get_weather", "description": "Weather", "cache_control": {"type": "ephemeral"},
               "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}})
    }

    #[test]
    fn tool_use_and_results_become_calls_and_tool_messages() {
        let mut f = fields(json!({"system": [{"type": "text", "text": "sys", "cache_control": {"type": "ephemeral"}}],
            "messages": [
            {"role": "user", "content": "weather?"},
            {"role": "assistant", "content": [{"type": "thinking", "thinking": "hm", "signature": "s"},
                {"type": "text", "text": "Checking."},
                {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Paris"}},
                {"type": "tool_use", "id": "toolu_2", "name": "get_weather", "input": {"city": "Rome"}}]},
            {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": "toolu_1", "content": "21C"},
                {"type": "tool_result", "tool_use_id": "toolu_2", "content": [{"type": "text", "text": "25C"}], "is_error": false},
                {"type": "text", "text": "thanks"}]},
        ]}));
        let m = conversation(&mut f).unwrap();
        let call = |id: &str, city: &str| ToolCall {
            id: id.into(),
            name: "get_weather".into(),
            arguments: json!({"city": city}).to_string(),
        };
        let result =
            |id: &str, c: &str| ChatMessage { tool_call_id: Some(id.into()), ..ChatMessage::new(Role::Tool, c) };
        assert_eq!(
            m,
            vec![
                ChatMessage::new(Role::System, "sys"),
                ChatMessage::new(Role::User, "weather?"),
                ChatMessage {
                    tool_calls: vec![call("toolu_1", "Paris"), call("toolu_2", "Rome")],
                    ..ChatMessage::new(Role::Assistant, "Checking.")
                },
                result("toolu_1", "21C"),
                result("toolu_2", "25C"),
                ChatMessage::new(Role::User, "thanks"),
            ]
        );
    }

    #[test]
    fn tools_and_choices() {
        let r = tool_request(&mut fields(json!({"tools": [weather()]}))).unwrap();
        assert_eq!((r.tools.len(), &r.choice, r.parallel), (1, &ToolChoice::Auto, true));
        assert_eq!(r.tools[0].parameters["required"], json!(["city"]));
        for (choice, want) in [
            (json!({"type": "any"}), ToolChoice::Required),
            (json!({"type": "none"}), ToolChoice::None),
            (json!({"type": "tool", "name": "get_weather"}), ToolChoice::Function("get_weather".into())),
        ] {
            let r = tool_request(&mut fields(json!({"tools": [weather()], "tool_choice": choice}))).unwrap();
            assert_eq!(r.choice, want);
        }
        let choice = json!({"type": "auto", "disable_parallel_tool_use": true});
        let r = tool_request(&mut fields(json!({"tools": [weather()], "tool_choice": choice}))).unwrap();
        assert!(!r.parallel);
    }

    #[test]
    fn bad_tools_and_history_name_the_field() {
        let bad_schema =
            json!({"name": "f", "input_schema": {"type": "object", "properties": {"x": {"type": "text"}}}});
        for (body, param) in [
            (json!({"tools": [bad_schema]}), "tools[0].input_schema.properties.x.type"),
            (json!({"tools": [{"name": "f"}]}), "tools[0].input_schema"),
            (json!({"tools": [{"name": "a b", "input_schema": {}}]}), "tools[0].name"),
            (json!({"tools": [weather(), weather()]}), "tools[1].name"),
            (json!({"tools": [{"type": "web_search_20250305", "name": "web_search"}]}), "tools[0].type"),
            (json!({"tools": [weather()], "tool_choice": {"type": "tool", "name": "nope"}}), "tool_choice.name"),
            (json!({"tools": [weather()], "tool_choice": {"type": "sometimes"}}), "tool_choice.type"),
            (json!({"tool_choice": {"type": "any"}}), "tool_choice"),
        ] {
            let e = tool_request(&mut fields(body.clone())).unwrap_err();
            assert_eq!((e.status.as_u16(), e.param.as_deref()), (400, Some(param)), "{body}");
        }
        let result = json!({"type": "tool_result", "tool_use_id": "toolu_9", "content": "x"});
        let use_block = json!({"type": "tool_use", "id": "toolu_1", "name": "f", "input": {}});
        for (messages, param) in [
            (json!([{"role": "user", "content": [result]}]), "messages[0].content[0].tool_use_id"),
            (json!([{"role": "user", "content": [use_block]}]), "messages[0].content[0].type"),
            (
                json!([{"role": "assistant", "content": [{"type": "tool_use", "id": "t", "name": "f", "input": 3}]}]),
                "messages[0].content[0].input",
            ),
            (json!([{"role": "user", "content": [{"type": "image"}]}]), "messages[0].content[0].type"),
        ] {
            let e = conversation(&mut fields(json!({"messages": messages}))).unwrap_err();
            assert_eq!((e.status.as_u16(), e.param.as_deref()), (400, Some(param)), "{messages}");
        }
    }
}
