//! The grammars that hold decoding to a tool call, in the model's own format (llguidance's
//! Lark dialect, with `%json {…}` for the call objects):
//!
//! - `required` / a named function: the output is calls only — one, or with
//!   `parallel_tool_calls` one or more — whose name is among the allowed functions and whose
//!   arguments follow that function's schema;
//! - `auto` ([`auto_grammar`]): free text, or calls as above, so a call once begun always
//!   parses. The text terminals exclude what would begin a call, so the grammar is not
//!   ambiguous and the parser of the family reads the output exactly as the grammar split it.
//!
//! Families: Hermes `<tool_call>\n{…}\n</tool_call>` blocks (text before, between and after;
//! under `required` or a named function a ```` ```json ```` fenced block also counts);
//! Llama 3.x JSON `{"name", "parameters"}` objects joined by `; ` (the whole reply, or text);
//! Mistral `[TOOL_CALLS]` + a list of `{"name", "arguments"}` or `name[ARGS]{…}` per call. A
//! marker that is a special token is written as that token (`<[id]>`); since its text prints
//! nothing, a Mistral call can only be read back where one may start without its marker —
//! the start of the reply — so under `auto` with special-token markers the grammar allows text
//! or calls, not text followed by calls.

use serde_json::{json, Value};

use super::{ToolChoice, ToolRequest};
use crate::backend::{Grammar, Tool, ToolCallFormat};

/// Separators of constrained JSON (no free whitespace: a sampled call cannot wander off into
/// blank space).
fn layout(lenient: bool) -> Value {
    json!({"whitespace_flexible": false, "item_separator": ", ", "key_separator": ": ", "lenient": lenient})
}

/// `{"name": <one of allowed>, <args_key>: <its schema>}` as one JSON Schema.
fn call_schema(allowed: &[&Tool], args_key: &str) -> Value {
    let variants: Vec<Value> = allowed
        .iter()
        .map(|t| {
            json!({
                "type": "object",
                "properties": {"name": {"const": t.name}, args_key: t.parameters},
                "required": ["name", args_key],
                "additionalProperties": false,
            })
        })
        .collect();
    json!({"anyOf": variants, "x-guidance": layout(!allowed.iter().all(|t| t.strict))})
}

/// A marker: its special token when the vocabulary has one, else its text.
fn marker(token: Option<u32>, text: &str) -> String {
    match token {
        Some(id) => format!("<[{id}]>"),
        None => format!("{text:?}"),
    }
}

/// Lark rules for the calls of `format`: the rule `head` (one call, or one or more with
/// `many`) over the `allowed` functions.
fn call_rules(format: ToolCallFormat, allowed: &[&Tool], many: bool, head: &str) -> String {
    let repeat = |one: &str, sep: &str| if many { format!("{one} ({sep:?} {one})*") } else { one.to_string() };
    match format {
        // A call in its tags, or in a ```json fence (which Qwen2.5-Coder prefers by far: held
        // to the tags it tends to add unasked calls after the first); the parser reads both.
        ToolCallFormat::Hermes => format!(
            "{head}: {}\ncall: \"<tool_call>\\n\" body \"\\n</tool_call>\" | \"```json\\n\" body \"\\n```\"\nbody: %json {}\n",
            repeat("call", "\n"),
            call_schema(allowed, "arguments")
        ),
        ToolCallFormat::Llama3Json => {
            format!("{head}: {}\nbody: %json {}\n", repeat("body", "; "), call_schema(allowed, "parameters"))
        }
        ToolCallFormat::Mistral { args: false, tool_calls, .. } => format!(
            "{head}: {} \"[\" {} \"]\"\nbody: %json {}\n",
            marker(tool_calls, "[TOOL_CALLS]"),
            repeat("body", ", "),
            call_schema(allowed, "arguments")
        ),
        ToolCallFormat::Mistral { args: true, tool_calls, args_token } => {
            let mut rules = format!(
                "{head}: call{}\ncall: {} fn\nfn: {}\n",
                if many { "+" } else { "" },
                marker(tool_calls, "[TOOL_CALLS]"),
                (0..allowed.len()).map(|i| format!("f{i}")).collect::<Vec<_>>().join(" | ")
            );
            for (i, t) in allowed.iter().enumerate() {
                let schema = match &t.parameters {
                    Value::Object(o) => {
                        let mut o = o.clone();
                        o.entry("x-guidance").or_insert_with(|| layout(!t.strict));
                        Value::Object(o)
                    }
                    other => other.clone(),
                };
                rules.push_str(&format!("f{i}: {:?} {} %json {schema}\n", t.name, marker(args_token, "[ARGS]")));
            }
            rules
        }
    }
}

/// The grammar of the output under `request`'s choice in `format`: calls only under
/// `required` or a named function, text or calls under `auto`, `None` under `none`.
pub(crate) fn call_grammar(request: &ToolRequest, format: ToolCallFormat) -> Option<Grammar> {
    let allowed: Vec<&Tool> = match &request.choice {
        ToolChoice::Required | ToolChoice::Auto => request.tools.iter().collect(),
        ToolChoice::Function(name) => request.tools.iter().filter(|t| &t.name == name).collect(),
        ToolChoice::None => return None,
    };
    if allowed.is_empty() {
        return None;
    }
    let many = request.parallel && !matches!(request.choice, ToolChoice::Function(_));
    match request.choice {
        ToolChoice::Auto => Some(auto_grammar(format, &allowed, many)),
        // One newline may follow the last call, as llama.cpp's tool grammars allow trailing
        // space: a model that writes one after a call can still end there instead of being
        // held to begin another.
        _ => Some(Grammar::Lark(format!("start: calls \"\\n\"?\n{}", call_rules(format, &allowed, many, "calls")))),
    }
}

/// Text of any length that does not contain `tag` (a Lark terminal: regex and negation).
fn text_without(tag: &str) -> String {
    let escaped: String = tag
        .chars()
        .map(|c| if "\\.+*?()|[]{}^$#&-~/".contains(c) { format!("\\{c}") } else { c.to_string() })
        .collect();
    format!("/(.|\\n)*/ & ~/(.|\\n)*{escaped}(.|\\n)*/")
}

/// `auto`: text, or calls. Hermes: text with calls anywhere in it — a lazy lexeme reads text
/// up to the first `<tool_call>` (then the call must follow), and the text after the last
/// call cannot contain the tag, so the tag always begins a call. Llama 3.x and Mistral: the
/// reply is text or calls, and the text cannot begin like a call (`{` for Llama, `[` or
/// `name{` / `name[ARGS]` for Mistral, whose parsers read such a start as a call).
fn auto_grammar(format: ToolCallFormat, allowed: &[&Tool], many: bool) -> Grammar {
    const BLANK: &str = "[ \\t\\r\\n]*";
    let lark = match format {
        ToolCallFormat::Hermes => format!(
            "start: call{} tail\ncall: call_hd \"\\n\" body \"\\n</tool_call>\"\ncall_hd[lazy]: ANY \"<tool_call>\"\n\
             tail: TEXT\nANY: /(.|\\n)*/\nTEXT: {}\nbody: %json {}\n",
            if many { "*" } else { "?" },
            text_without("<tool_call>"),
            call_schema(allowed, "arguments")
        ),
        ToolCallFormat::Llama3Json => format!(
            "start: TEXT | calls\nTEXT: /(.|\\n)*/ & ~/{BLANK}\\{{(.|\\n)*/\n{}",
            call_rules(format, allowed, many, "calls")
        ),
        ToolCallFormat::Mistral { args, .. } => {
            let start = if args { "[A-Za-z0-9_.\\-]+(\\{|\\[ARGS\\])" } else { "\\[" };
            format!(
                "start: TEXT | calls\nTEXT: /(.|\\n)*/ & ~/{BLANK}{start}(.|\\n)*/ & ~/(.|\\n)*\\[TOOL_CALLS\\](.|\\n)*/\n{}",
                call_rules(format, allowed, many, "calls")
            )
        }
    };
    Grammar::Lark(lark)
}

#[cfg(test)]
mod llguidance_check;

#[cfg(test)]
mod tests {
    use super::*;

    fn tool(name: &str) -> Tool {
        Tool {
            name: name.into(),
            description: None,
            parameters: json!({"type": "object", "properties": {"city": {"type": "string"}}}),
            strict: false,
        }
    }

    fn request(choice: ToolChoice, parallel: bool) -> ToolRequest {
        ToolRequest { tools: vec![tool("get_weather"), tool("get_time")], choice, parallel }
    }

    fn lark(r: &ToolRequest, format: ToolCallFormat) -> String {
        match call_grammar(r, format) {
            Some(Grammar::Lark(g)) => g,
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn required_and_named_grammars_per_family() {
        let required = request(ToolChoice::Required, true);
        let g = lark(&required, ToolCallFormat::Hermes);
        assert!(g.starts_with("start: calls \"\\n\"?\ncalls: call (\"\\n\" call)*\n"), "{g}");
        assert!(g.contains(r#""const":"get_weather""#) && g.contains(r#""const":"get_time""#), "{g}");
        let g = lark(&required, ToolCallFormat::Llama3Json);
        assert!(
            g.starts_with("start: calls \"\\n\"?\ncalls: body (\"; \" body)*\n")
                && g.contains(r#""parameters":{"type""#),
            "{g}"
        );
        let mistral = ToolCallFormat::Mistral { args: false, tool_calls: Some(5), args_token: None };
        let g = lark(&required, mistral);
        assert!(g.starts_with("start: calls \"\\n\"?\ncalls: <[5]> \"[\" body (\", \" body)* \"]\"\n"), "{g}");
        let text_marker = ToolCallFormat::Mistral { args: false, tool_calls: None, args_token: None };
        assert!(lark(&required, text_marker).starts_with("start: calls \"\\n\"?\ncalls: \"[TOOL_CALLS]\" \"[\""));
        let args = ToolCallFormat::Mistral { args: true, tool_calls: Some(5), args_token: Some(32) };
        let g = lark(&required, args);
        assert!(
            g.starts_with(
                "start: calls \"\\n\"?\ncalls: call+\ncall: <[5]> fn\nfn: f0 | f1\nf0: \"get_weather\" <[32]> %json {"
            ),
            "{g}"
        );

        let named = request(ToolChoice::Function("get_time".into()), true);
        for format in [ToolCallFormat::Hermes, ToolCallFormat::Llama3Json, mistral, args] {
            let g = lark(&named, format);
            assert!(g.contains("get_time") && !g.contains("get_weather"), "{g}");
            assert!(!g.contains('*') && !g.contains('+'), "a named function is one call: {g}");
        }
        assert_eq!(call_grammar(&request(ToolChoice::None, true), ToolCallFormat::Hermes), None);
    }
}
