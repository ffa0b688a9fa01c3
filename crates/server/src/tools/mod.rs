//! Tool calling: OpenAI's request fields (`tools`, `tool_choice`, `parallel_tool_calls`) and
//! history fields (assistant `tool_calls`, `tool` messages answering them); one tool
//! declaration shared with the Anthropic endpoint ([`new_tool`], with the schema shape check of
//! `schema.rs`); the grammars that hold decoding to calls (`grammar/`); and the calls parsed out
//! of the generated text by one [`ToolParser`] per family, as the model's [`ToolCallFormat`]
//! says — Hermes/Qwen (`hermes.rs`), Llama 3.x JSON (`llama.rs`), Mistral (`mistral.rs`).

#[cfg(test)]
mod fixtures;
mod grammar;
mod hermes;
mod llama;
mod mistral;
mod scan;
mod schema;

use serde_json::{json, Map, Value};

use crate::backend::{ChatMessage, Role, Tool, ToolCall, ToolCallFormat};
use crate::error::ApiError;
use crate::params::{kind_of, Fields};

pub(crate) use grammar::call_grammar;
use hermes::HermesParser;
use llama::Llama3Parser;
use mistral::MistralParser;

/// Longest function name (OpenAI's limit).
const MAX_NAME: usize = 64;
/// Most tools one request may declare.
const MAX_TOOLS: usize = 128;

/// What a tool-call parser recognised in a piece of text, in order.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Piece {
    Text(String),
    /// A whole call, decided at once (where the call could not be known to be one before
    /// its end).
    Call(ParsedCall),
    /// A call streamed as it is generated: its function name (it is known to be a call) …
    CallBegin(String),
    /// … a fragment of its arguments' JSON text (the fragments of a call, joined, are its
    /// arguments, exactly as [`ParsedCall::arguments`] would give them whole) …
    CallArgs(String),
    /// … and its end.
    CallEnd,
}

/// Separates plain text from tool calls in a model's output, in one family's convention.
/// The text comes in pieces split anywhere (inside a tag, inside a UTF-8 character's
/// neighbours — pieces are `str`s); each `push` returns what is decided, in order, and holds
/// back what could still become part of a call. `finish` ends the output: what is held is
/// decided then (a complete call counts even without its closing tag).
pub(crate) trait ToolParser: Send {
    fn push(&mut self, text: &str) -> Vec<Piece>;
    fn finish(&mut self) -> Vec<Piece>;
}

/// How one request's calls are written: the model family's format, and the names of the
/// declared tools (JSON outside the family's own markers counts as a call only when it names
/// one of them).
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct CallSyntax {
    pub format: ToolCallFormat,
    pub names: Vec<String>,
}

/// A fresh parser for `syntax`.
pub(crate) fn parser(syntax: &CallSyntax) -> Box<dyn ToolParser> {
    match syntax.format {
        ToolCallFormat::Hermes => Box::new(HermesParser::new(syntax.names.clone())),
        ToolCallFormat::Llama3Json => Box::new(Llama3Parser::default()),
        ToolCallFormat::Mistral { args, .. } => Box::new(MistralParser::new(args)),
    }
}

/// A whole output's text (trimmed) and calls, in order.
pub(crate) fn split_output(syntax: &CallSyntax, text: &str) -> (String, Vec<ParsedCall>) {
    let mut p = parser(syntax);
    let mut pieces = p.push(text);
    pieces.extend(p.finish());
    let (content, calls) = join_pieces(pieces);
    (content.trim().to_string(), calls)
}

/// The text and the calls of `pieces`, a streamed call's fragments joined into one call.
fn join_pieces(pieces: Vec<Piece>) -> (String, Vec<ParsedCall>) {
    let (mut content, mut calls) = (String::new(), Vec::<ParsedCall>::new());
    for piece in pieces {
        match piece {
            Piece::Text(t) => content.push_str(&t),
            Piece::Call(call) => calls.push(call),
            Piece::CallBegin(name) => calls.push(ParsedCall { name, arguments: String::new() }),
            Piece::CallArgs(a) => {
                if let Some(c) = calls.last_mut() {
                    c.arguments.push_str(&a);
                }
            }
            Piece::CallEnd => {}
        }
    }
    (content, calls)
}

/// Appends `text` to `out`, merging it into a text piece at the end.
pub(crate) fn push_text(out: &mut Vec<Piece>, text: String) {
    if text.is_empty() {
        return;
    }
    if let Some(Piece::Text(t)) = out.last_mut() {
        t.push_str(&text);
    } else {
        out.push(Piece::Text(text));
    }
}

/// How calls are to be parsed out of this request's output, if they are (`model`: the format
/// the backend reports). A call the model cannot be made to write (`required`
/// or a named function without a known format) is a 400 naming `choice_param`.
pub(crate) fn output_format(
    model: Option<ToolCallFormat>,
    tools: &ToolRequest,
    choice_param: &str,
) -> Result<Option<CallSyntax>, ApiError> {
    if !tools.parses_calls() {
        return Ok(None);
    }
    if model.is_none() && matches!(tools.choice, ToolChoice::Required | ToolChoice::Function(_)) {
        return Err(ApiError::invalid(
            choice_param,
            "This model's chat template teaches no tool-call format the server can parse, so a call cannot be required.",
        ));
    }
    Ok(model.map(|format| CallSyntax { format, names: tools.tools.iter().map(|t| t.name.clone()).collect() }))
}

/// A call parsed out of generated text: the function and its arguments as JSON text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ParsedCall {
    pub name: String,
    /// The arguments as the model wrote them, less the blank space between JSON tokens (not
    /// re-serialized: numbers and escapes keep their spelling, so a call streamed fragment by
    /// fragment and the same call decided whole carry the same text); arguments the model gave
    /// as a JSON string are that string's content.
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
        let description = match function.remove("description") {
            None | Some(Value::Null) => None,
            Some(Value::String(d)) => Some(d),
            Some(_) => return Err(invalid(&at(".function.description"), "A description must be a string.".into())),
        };
        let strict = matches!(function.remove("strict"), Some(Value::Bool(true)));
        let parameters = function.remove("parameters");
        let tool = new_tool(
            &out,
            ToolFields { at: at(".function"), name, description, schema: parameters, schema_key: "parameters", strict },
        )?;
        out.push(tool);
    }
    Ok(out)
}

/// One declared tool's fields, as either API spells them (`at`: the tool's path, for errors).
pub(crate) struct ToolFields {
    pub at: String,
    pub name: String,
    pub description: Option<String>,
    /// The arguments' JSON Schema (absent: an empty object).
    pub schema: Option<Value>,
    /// Its key under `at` (`parameters` for OpenAI, `input_schema` for Anthropic).
    pub schema_key: &'static str,
    pub strict: bool,
}

/// Checks one declared tool against those before it (name shape, no duplicate, a schema whose
/// keywords have the shapes JSON Schema gives them) and builds it.
pub(crate) fn new_tool(before: &[Tool], f: ToolFields) -> Result<Tool, ApiError> {
    let name_at = format!("{}.name", f.at);
    check_name(&name_at, &f.name)?;
    if before.iter().any(|t| t.name == f.name) {
        return Err(invalid(&name_at, format!("Duplicate function name '{}' in 'tools'.", f.name)));
    }
    let schema_at = format!("{}.{}", f.at, f.schema_key);
    let parameters = match f.schema {
        None | Some(Value::Null) => json!({"type": "object", "properties": {}}),
        Some(p @ Value::Object(_)) => p,
        Some(v) => {
            return Err(invalid(
                &schema_at,
                format!("'{schema_at}' must be a JSON Schema object, but got {}.", kind_of(&v)),
            ))
        }
    };
    schema::check(&parameters, &schema_at)?;
    Ok(Tool { name: f.name, description: f.description, parameters, strict: f.strict })
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

/// A fresh call id, OpenAI style (`call_` and 24 hex digits), unique per `seed` and index
/// (the seed names the response and, where a response has several, the choice).
pub(crate) fn call_id(seed: &str, index: usize) -> String {
    let h = format!("{seed}/{index}")
        .bytes()
        .fold(0xcbf2_9ce4_8422_2325u64, |h, b| (h ^ b as u64).wrapping_mul(0x0000_0100_0000_01b3));
    format!("call_{h:016x}{index:08x}")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::Grammar;
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
    fn call_grammar_holds_calls_under_required_or_a_named_function_and_allows_text_under_auto() {
        let mut r = parse(json!({"tools": [weather()]})).unwrap();
        let Some(Grammar::Lark(g)) = call_grammar(&r, ToolCallFormat::Hermes) else { panic!("auto constrains") };
        assert!(g.starts_with("start: call* tail\n") && g.contains(r#""const":"get_weather""#), "{g}");
        r.choice = ToolChoice::None;
        assert_eq!(call_grammar(&r, ToolCallFormat::Hermes), None);
        r.choice = ToolChoice::Required;
        let Some(Grammar::Lark(g)) = call_grammar(&r, ToolCallFormat::Hermes) else { panic!() };
        assert!(g.starts_with("start: calls \"\\n\"?\ncalls: call (\"\\n\" call)*\n"), "{g}");
        assert!(g.contains(r#""const":"get_weather""#), "{g}");
        r.parallel = false;
        let Some(Grammar::Lark(g)) = call_grammar(&r, ToolCallFormat::Hermes) else { panic!() };
        assert!(g.starts_with("start: calls \"\\n\"?\ncalls: call\n"), "{g}");
    }

    #[test]
    fn call_ids_are_distinct() {
        assert_ne!(call_id("chatcmpl-1", 0), call_id("chatcmpl-1", 1));
        assert_ne!(call_id("chatcmpl-1", 0), call_id("chatcmpl-2", 0));
        assert!(call_id("x", 3).starts_with("call_"));
    }

    #[test]
    fn streamed_and_whole_calls_join_to_the_same_arguments() {
        // The same call, streamed (name first) and whole (arguments first), in each family.
        let args = r#"{"n": 1.50, "s": "\u00e9", "e": 1e3}"#;
        let want = r#"{"n":1.50,"s":"\u00e9","e":1e3}"#;
        for (format, streamed, whole) in [
            (
                ToolCallFormat::Hermes,
                format!(r#"<tool_call>{{"name": "f", "arguments": {args}}}</tool_call>"#),
                format!(r#"<tool_call>{{"arguments": {args}, "name": "f"}}</tool_call>"#),
            ),
            (
                ToolCallFormat::Hermes,
                format!(r#"```json {{"name": "f", "arguments": {args}}} ```"#),
                format!(r#"```json {{"arguments": {args}, "name": "f"}} ```"#),
            ),
            (
                ToolCallFormat::Llama3Json,
                format!(r#"{{"name": "f", "parameters": {args}}}"#),
                format!(r#"{{"parameters": {args}, "name": "f"}}"#),
            ),
            (
                ToolCallFormat::Mistral { args: false, tool_calls: None, args_token: None },
                format!(r#"[{{"name": "f", "arguments": {args}}}]"#),
                format!(r#"[{{"arguments": {args}, "name": "f"}}]"#),
            ),
        ] {
            let syntax = CallSyntax { format, names: vec!["f".into()] };
            let mut p = parser(&syntax);
            let mut pieces = p.push(&streamed);
            pieces.extend(p.finish());
            assert!(pieces.contains(&Piece::CallBegin("f".into())), "{streamed} streams");
            let call = ParsedCall { name: "f".into(), arguments: want.into() };
            assert_eq!(split_output(&syntax, &streamed), (String::new(), vec![call.clone()]), "{streamed}");
            assert_eq!(split_output(&syntax, &whole), (String::new(), vec![call]), "{whole}");
        }
    }
}
