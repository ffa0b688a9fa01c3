//! OpenAI tool calling: the request fields (`tools`, `tool_choice`, `parallel_tool_calls`),
//! the history fields (assistant `tool_calls`, `tool` messages answering them), the grammar that
//! holds decoding to a call under `required` or a named function, and parsing the calls out of
//! the generated text (`hermes.rs`, the model's convention as its [`ToolCallFormat`] says).

mod hermes;

use serde_json::{json, Map, Value};

use crate::backend::{ChatMessage, Grammar, Role, Tool, ToolCall, ToolCallFormat};
use crate::error::ApiError;
use crate::params::{kind_of, Fields};

pub(crate) use hermes::{HermesParser, Piece};

/// Longest function name (OpenAI's limit).
const MAX_NAME: usize = 64;
/// Most tools one request may declare.
const MAX_TOOLS: usize = 128;

/// A call parsed out of generated text: the function and its arguments as JSON text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ParsedCall {
    pub name: String,
    pub arguments: String,
}

/// What the request allows the model to do with its tools.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum ToolChoice {
    /// Never call: the output is text (tools are still shown to the template).
    None,
    /// Text or calls, as the model decides.
    Auto,
    /// At least one call (decoding is constrained to calls).
    Required,
    /// A call of this function (decoding is constrained to it).
    Function(String),
}

/// The tool fields of a chat request.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct ToolRequest {
    pub tools: Vec<Tool>,
    pub choice: ToolChoice,
    /// More than one call per turn (`parallel_tool_calls`, default true).
    pub parallel: bool,
}

impl ToolRequest {
    /// Whether calls are parsed out of the output.
    pub(crate) fn parses_calls(&self) -> bool {
        !self.tools.is_empty() && self.choice != ToolChoice::None
    }
}

fn invalid(param: &str, message: String) -> ApiError {
    ApiError::invalid(param, message).with_code("invalid_value")
}

fn check_name(param: &str, name: &str) -> Result<(), ApiError> {
    let ok = !name.is_empty()
        && name.len() <= MAX_NAME
        && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
    if ok {
        Ok(())
    } else {
        Err(invalid(
            param,
            format!("Invalid '{param}': '{name}'. Use 1 to {MAX_NAME} letters, digits, underscores or dashes."),
        ))
    }
}

/// Reads `tools`, `tool_choice` and `parallel_tool_calls` (the deprecated `functions` and
/// `function_call` are refused).
pub(crate) fn tool_request(f: &mut Fields) -> Result<ToolRequest, ApiError> {
    let tools = match f.take("tools") {
        None => Vec::new(),
        Some(Value::Array(items)) => tools(items)?,
        Some(v) => {
            return Err(invalid(
                "tools",
                format!("Invalid type for 'tools': expected an array, but got {}.", kind_of(&v)),
            ))
        }
    };
    let choice = match f.take("tool_choice") {
        None if tools.is_empty() => ToolChoice::None,
        None => ToolChoice::Auto,
        Some(v) => tool_choice(v, &tools)?,
    };
    let parallel = f.bool("parallel_tool_calls")?.unwrap_or(true);
    for name in ["functions", "function_call"] {
        if f.take(name).is_some() {
            return Err(crate::params::unsupported(name, "use 'tools' and 'tool_choice'"));
        }
    }
    Ok(ToolRequest { tools, choice, parallel })
}

fn tools(items: Vec<Value>) -> Result<Vec<Tool>, ApiError> {
    if items.len() > MAX_TOOLS {
        return Err(invalid("tools", format!("'tools' has {} entries; at most {MAX_TOOLS} are allowed.", items.len())));
    }
    let mut out: Vec<Tool> = Vec::with_capacity(items.len());
    for (i, item) in items.into_iter().enumerate() {
        let at = |f: &str| format!("tools[{i}]{f}");
        let Value::Object(mut o) = item else {
            return Err(invalid(&at(""), format!("'{}' must be an object.", at(""))));
        };
        match o.remove("type") {
            Some(Value::String(t)) if t == "function" => {}
            _ => return Err(invalid(&at(".type"), format!("'{}' must be 'function'.", at(".type")))),
        }
        let Some(Value::Object(mut function)) = o.remove("function") else {
            return Err(invalid(&at(".function"), format!("'{}' is required and must be an object.", at(".function"))));
        };
        let name = match function.remove("name") {
            Some(Value::String(n)) => n,
            _ => return Err(invalid(&at(".function.name"), format!("'{}' is required.", at(".function.name")))),
        };
        check_name(&at(".function.name"), &name)?;
        if out.iter().any(|t| t.name == name) {
            return Err(invalid(&at(".function.name"), format!("Duplicate function name '{name}' in 'tools'.")));
        }
        let description = match function.remove("description") {
            None | Some(Value::Null) => None,
            Some(Value::String(d)) => Some(d),
            Some(_) => return Err(invalid(&at(".function.description"), "A description must be a string.".into())),
        };
        let parameters = match function.remove("parameters") {
            None | Some(Value::Null) => json!({"type": "object", "properties": {}}),
            Some(p @ Value::Object(_)) => p,
            Some(v) => {
                let p = at(".function.parameters");
                return Err(invalid(&p, format!("'{p}' must be a JSON Schema object, but got {}.", kind_of(&v))));
            }
        };
        let strict = matches!(function.remove("strict"), Some(Value::Bool(true)));
        out.push(Tool { name, description, parameters, strict });
    }
    Ok(out)
}

fn tool_choice(v: Value, tools: &[Tool]) -> Result<ToolChoice, ApiError> {
    const P: &str = "tool_choice";
    let choice = match &v {
        Value::String(s) => match s.as_str() {
            "none" => ToolChoice::None,
            "auto" => ToolChoice::Auto,
            "required" => ToolChoice::Required,
            other => {
                return Err(invalid(
                    P,
                    format!("Invalid value for '{P}': '{other}'. Supported values are: 'none', 'auto', 'required' or a function."),
                ))
            }
        },
        Value::Object(o) => match o.get("function").and_then(|f| f.get("name")).and_then(Value::as_str) {
            Some(name) if o.get("type").and_then(Value::as_str) == Some("function") => {
                ToolChoice::Function(name.to_string())
            }
            _ => {
                return Err(invalid(
                    P,
                    format!("'{P}' as an object must be {{\"type\": \"function\", \"function\": {{\"name\": ...}}}}."),
                ))
            }
        },
        other => {
            return Err(invalid(P, format!("Invalid type for '{P}': expected a string or an object, but got {}.", kind_of(other))))
        }
    };
    match &choice {
        ToolChoice::Required if tools.is_empty() => {
            Err(invalid(P, format!("'{P}' is 'required' but no 'tools' were given.")))
        }
        ToolChoice::Function(name) if !tools.iter().any(|t| &t.name == name) => Err(invalid(
            "tool_choice.function.name",
            format!("Function '{name}' named in 'tool_choice' is not in 'tools'."),
        )),
        _ => Ok(choice),
    }
}

/// An assistant message's `tool_calls`: `[{"id", "type": "function", "function": {"name",
/// "arguments"}}]`, arguments a JSON text.
pub(crate) fn message_tool_calls(v: Value, at: &str) -> Result<Vec<ToolCall>, ApiError> {
    let Value::Array(items) = v else {
        return Err(invalid(at, format!("'{at}' must be an array.")));
    };
    let mut out = Vec::with_capacity(items.len());
    for (j, item) in items.into_iter().enumerate() {
        let at = format!("{at}[{j}]");
        let field = |o: &Map<String, Value>, path: &[&str]| -> Option<String> {
            let mut v = o.get(path[0])?;
            for k in &path[1..] {
                v = v.get(k)?;
            }
            v.as_str().map(str::to_string)
        };
        let Value::Object(o) = item else {
            return Err(invalid(&at, format!("'{at}' must be an object.")));
        };
        let id = field(&o, &["id"]).ok_or_else(|| invalid(&format!("{at}.id"), format!("'{at}.id' is required.")))?;
        let name = field(&o, &["function", "name"])
            .ok_or_else(|| invalid(&format!("{at}.function.name"), format!("'{at}.function.name' is required.")))?;
        let arguments = field(&o, &["function", "arguments"]).unwrap_or_else(|| "{}".into());
        if serde_json::from_str::<Value>(&arguments).is_err() {
            let p = format!("{at}.function.arguments");
            return Err(invalid(&p, format!("'{p}' must be a JSON text.")));
        }
        out.push(ToolCall { id, name, arguments });
    }
    Ok(out)
}

/// Every `tool` message answers a call of an earlier assistant message, by id.
pub(crate) fn check_tool_results(messages: &[ChatMessage]) -> Result<(), ApiError> {
    for (i, m) in messages.iter().enumerate() {
        if m.role != Role::Tool {
            continue;
        }
        let id = m.tool_call_id.as_deref().unwrap_or_default();
        let known = messages[..i].iter().any(|p| p.tool_calls.iter().any(|c| c.id == id));
        if !known {
            let p = format!("messages[{i}].tool_call_id");
            return Err(invalid(
                &p,
                format!("'{p}' is '{id}', which no earlier assistant message's 'tool_calls' has."),
            ));
        }
    }
    Ok(())
}

/// The grammar of the output under `required` or a named function, in the model's format:
/// one call (or, with `parallel`, one or more) whose name is among the allowed functions and
/// whose arguments follow that function's schema. `None` under `auto` and `none`.
pub(crate) fn call_grammar(request: &ToolRequest, format: ToolCallFormat) -> Option<Grammar> {
    let allowed: Vec<&Tool> = match &request.choice {
        ToolChoice::Required => request.tools.iter().collect(),
        ToolChoice::Function(name) => request.tools.iter().filter(|t| &t.name == name).collect(),
        ToolChoice::None | ToolChoice::Auto => return None,
    };
    let variants: Vec<Value> = allowed
        .iter()
        .map(|t| {
            json!({
                "type": "object",
                "properties": {"name": {"const": t.name}, "arguments": t.parameters},
                "required": ["name", "arguments"],
                "additionalProperties": false,
            })
        })
        .collect();
    let lenient = !allowed.iter().all(|t| t.strict);
    let schema = json!({
        "anyOf": variants,
        "x-guidance": {"whitespace_flexible": false, "item_separator": ", ", "key_separator": ": ", "lenient": lenient},
    });
    let ToolCallFormat::Hermes = format;
    let calls = if request.parallel && !matches!(request.choice, ToolChoice::Function(_)) {
        "call (\"\\n\" call)*"
    } else {
        "call"
    };
    Some(Grammar::Lark(format!(
        "start: {calls}\ncall: \"<tool_call>\\n\" body \"\\n</tool_call>\"\nbody: %json {schema}\n"
    )))
}

/// A fresh call id, OpenAI style (`call_` and 24 hex digits), unique per `seed` and index.
pub(crate) fn call_id(seed: &str, index: usize) -> String {
    let h = format!("{seed}/{index}")
        .bytes()
        .fold(0xcbf2_9ce4_8422_2325u64, |h, b| (h ^ b as u64).wrapping_mul(0x0000_0100_0000_01b3));
    format!("call_{h:016x}{index:08x}")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::params::parse_object;

    fn parse(body: Value) -> Result<ToolRequest, ApiError> {
        let mut f = parse_object(body.to_string().as_bytes()).unwrap();
        tool_request(&mut f)
    }

    fn weather() -> Value {
        json!({"type": "function", "function": {"name": "get_weather", "description": "Weather of a city",
               "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}})
    }

    #[test]
    fn tools_and_choices_parse() {
        let r = parse(json!({"tools": [weather()]})).unwrap();
        assert_eq!((r.tools.len(), &r.choice, r.parallel), (1, &ToolChoice::Auto, true));
        assert_eq!(r.tools[0].description.as_deref(), Some("Weather of a city"));
        let r = parse(json!({"tools": [weather()], "tool_choice": "required", "parallel_tool_calls": false})).unwrap();
        assert_eq!((&r.choice, r.parallel), (&ToolChoice::Required, false));
        let named = json!({"type": "function", "function": {"name": "get_weather"}});
        let r = parse(json!({"tools": [weather()], "tool_choice": named})).unwrap();
        assert_eq!(r.choice, ToolChoice::Function("get_weather".into()));
        assert_eq!(parse(json!({})).unwrap().choice, ToolChoice::None);
    }

    #[test]
    fn bad_tools_name_the_field() {
        let missing = json!({"type": "function", "function": {"name": "nope"}});
        for (body, param) in [
            (json!({"tools": {}}), "tools"),
            (json!({"tools": [{"type": "retrieval"}]}), "tools[0].type"),
            (json!({"tools": [{"type": "function"}]}), "tools[0].function"),
            (json!({"tools": [{"type": "function", "function": {"name": "a b"}}]}), "tools[0].function.name"),
            (json!({"tools": [weather(), weather()]}), "tools[1].function.name"),
            (
                json!({"tools": [{"type": "function", "function": {"name": "f", "parameters": []}}]}),
                "tools[0].function.parameters",
            ),
            (json!({"tools": [weather()], "tool_choice": "always"}), "tool_choice"),
            (json!({"tools": [weather()], "tool_choice": missing}), "tool_choice.function.name"),
            (json!({"tool_choice": "required"}), "tool_choice"),
            (json!({"functions": [{}]}), "functions"),
        ] {
            let e = parse(body.clone()).unwrap_err();
            assert_eq!((e.status.as_u16(), e.param.as_deref()), (400, Some(param)), "{body}");
        }
    }

    #[test]
    fn tool_results_must_answer_an_earlier_call() {
        let call = ToolCall { id: "c1".into(), name: "f".into(), arguments: "{}".into() };
        let assistant = ChatMessage { tool_calls: vec![call], ..ChatMessage::new(Role::Assistant, "") };
        let result = |id: &str| ChatMessage { tool_call_id: Some(id.into()), ..ChatMessage::new(Role::Tool, "ok") };
        assert!(check_tool_results(&[assistant.clone(), result("c1")]).is_ok());
        let e = check_tool_results(&[assistant.clone(), result("c2")]).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("messages[1].tool_call_id"));
        assert!(check_tool_results(&[result("c1"), assistant]).is_err(), "the call must come first");
        let e =
            message_tool_calls(json!([{"id": "x", "function": {"name": "f", "arguments": "{oops"}}]), "m").unwrap_err();
        assert_eq!(e.param.as_deref(), Some("m[0].function.arguments"));
    }

    #[test]
    fn call_grammar_only_under_required_or_a_named_function() {
        let mut r = parse(json!({"tools": [weather()]})).unwrap();
        assert_eq!(call_grammar(&r, ToolCallFormat::Hermes), None);
        r.choice = ToolChoice::Required;
        let Some(Grammar::Lark(g)) = call_grammar(&r, ToolCallFormat::Hermes) else { panic!() };
        assert!(g.starts_with("start: call (\"\\n\" call)*\n") && g.contains(r#""const":"get_weather""#), "{g}");
        r.parallel = false;
        let Some(Grammar::Lark(g)) = call_grammar(&r, ToolCallFormat::Hermes) else { panic!() };
        assert!(g.starts_with("start: call\n"), "{g}");
    }

    #[test]
    fn call_ids_are_distinct() {
        assert_ne!(call_id("chatcmpl-1", 0), call_id("chatcmpl-1", 1));
        assert_ne!(call_id("chatcmpl-1", 0), call_id("chatcmpl-2", 0));
        assert!(call_id("x", 3).starts_with("call_"));
    }
}
