//! The tool-call grammars compiled by llguidance (through the engine's [`GrammarCompiler`])
//! over SmolLM2's tokenizer, and walked token by token: each family's calls are accepted
//! under `required` and `auto`, free text is accepted under `auto` only, and a started call
//! cannot turn into anything else. Skipped (with a note) when the model file is absent.

use std::sync::Arc;

use pagekv_engine::constraint::{Constraint, Grammar as EngineGrammar, GrammarCompiler};
use pagekv_model::gguf::GgufFile;
use pagekv_model::tokenizer::Tokenizer;
use serde_json::json;

use super::call_grammar;
use crate::backend::{Grammar, Tool, ToolCallFormat};
use crate::tools::{ToolChoice, ToolRequest};

fn tokenizer(test: &str) -> Option<Arc<Tokenizer>> {
    let path = pagekv_testkit::default_model(test)?;
    let file = GgufFile::open(&path).expect("open the model file");
    Some(Arc::new(Tokenizer::from_gguf(file.metadata()).expect("its tokenizer")))
}

fn request(choice: ToolChoice) -> ToolRequest {
    let tool = |name: &str, schema| Tool { name: name.into(), description: None, parameters: schema, strict: true };
    ToolRequest {
        tools: vec![
            tool(
                "get_weather",
                json!({"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"],
                       "additionalProperties": false}),
            ),
            tool("get_time", json!({"type": "object", "properties": {}, "additionalProperties": false})),
        ],
        choice,
        parallel: true,
    }
}

struct Checker {
    tok: Arc<Tokenizer>,
    compiler: GrammarCompiler,
}

/// Where a walk of tokens through a grammar ended.
#[derive(Debug, PartialEq)]
enum Walk {
    /// Every token allowed; the grammar accepts the whole (may end here).
    Accepted,
    /// Every token allowed, but the grammar needs more.
    Unfinished,
    /// The token at this index was refused.
    RefusedAt(usize),
}

impl Checker {
    fn compile(&self, g: &Grammar) -> Constraint {
        let Grammar::Lark(lark) = g else { panic!("tool grammars are Lark: {g:?}") };
        self.compiler.compile(&EngineGrammar::Lark(lark.clone())).unwrap_or_else(|e| panic!("{e}\n{lark}"))
    }

    fn walk(&self, g: &Grammar, tokens: &[u32]) -> Walk {
        let mut c = self.compile(g);
        for (i, &t) in tokens.iter().enumerate() {
            c.compute_mask();
            if !c.allows(t) {
                let shown: Vec<String> = tokens
                    .iter()
                    .map(|&t| String::from_utf8_lossy(self.tok.piece(t, false).unwrap_or(b"?")).into_owned())
                    .collect();
                eprintln!("refused {i} of {shown:?}");
                return Walk::RefusedAt(i);
            }
            c.commit(t).expect("an allowed token commits");
        }
        if c.is_accepting() {
            Walk::Accepted
        } else {
            Walk::Unfinished
        }
    }

    fn text(&self, s: &str) -> Vec<u32> {
        self.tok.encode(s, false).expect("tokenizes")
    }
}

fn checker(test: &str) -> Option<Checker> {
    let tok = tokenizer(test)?;
    let compiler = GrammarCompiler::new(tok.clone(), tok.vocab_size());
    Some(Checker { tok, compiler })
}

const WEATHER: &str = r#"{"name": "get_weather", "arguments": {"city": "Paris"}}"#;

#[test]
fn hermes_calls_under_required_and_auto_and_text_only_under_auto() {
    let Some(ch) = checker("hermes_calls_under_required_and_auto_and_text_only_under_auto") else { return };
    let required = call_grammar(&request(ToolChoice::Required), ToolCallFormat::Hermes).unwrap();
    let auto = call_grammar(&request(ToolChoice::Auto), ToolCallFormat::Hermes).unwrap();
    let call = format!("<tool_call>\n{WEATHER}\n</tool_call>");
    let two = format!("{call}\n<tool_call>\n{{\"name\": \"get_time\", \"arguments\": {{}}}}\n</tool_call>");
    for g in [&required, &auto] {
        assert_eq!(ch.walk(g, &ch.text(&call)), Walk::Accepted);
        assert_eq!(ch.walk(g, &ch.text(&two)), Walk::Accepted);
        let tokens = ch.text(&call);
        assert_eq!(ch.walk(g, &tokens[..tokens.len() - 2]), Walk::Unfinished);
        // A wrong argument type, an unknown function: refused inside the call.
        let bad = "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": 5}}";
        assert!(matches!(ch.walk(g, &ch.text(bad)), Walk::RefusedAt(_)));
        let unknown = "<tool_call>\n{\"name\": \"rm_rf\"";
        assert!(matches!(ch.walk(g, &ch.text(unknown)), Walk::RefusedAt(_)));
    }
    // Under required a call may also come fenced, and a newline may close the calls.
    let fenced = format!("```json\n{WEATHER}\n```\n");
    assert_eq!(ch.walk(&required, &ch.text(&fenced)), Walk::Accepted);
    let bad_fence = "```json\n{\"name\": \"rm_rf\"";
    assert!(matches!(ch.walk(&required, &ch.text(bad_fence)), Walk::RefusedAt(_)));
    let prose = "The weather in Paris is <b>mild</b> today.\nNo call needed.";
    assert!(matches!(ch.walk(&required, &ch.text(prose)), Walk::RefusedAt(0)));
    assert_eq!(ch.walk(&auto, &ch.text(prose)), Walk::Accepted);
    assert_eq!(ch.walk(&auto, &[]), Walk::Accepted, "an empty reply is text");
    let mixed = format!("Let me check.\n{call}\nDone.");
    assert_eq!(ch.walk(&auto, &ch.text(&mixed)), Walk::Accepted);
    // Under auto a started call is still a call: garbage after the tag is refused.
    let garbage = "Sure <tool_call>\nnot json";
    assert!(matches!(ch.walk(&auto, &ch.text(garbage)), Walk::RefusedAt(_)));
}

#[test]
fn llama_and_mistral_calls_and_auto_text() {
    let Some(ch) = checker("llama_and_mistral_calls_and_auto_text") else { return };
    let marker = ch.tok.token_id("<|im_start|>").expect("SmolLM2 has <|im_start|>");
    let args_marker = ch.tok.token_id("<|im_end|>").expect("SmolLM2 has <|im_end|>");
    let prose = "Paris is mild today.";
    // Llama 3.x JSON.
    let llama = r#"{"name": "get_weather", "parameters": {"city": "Paris"}}; {"name": "get_time", "parameters": {}}"#;
    for choice in [ToolChoice::Required, ToolChoice::Auto] {
        let g = call_grammar(&request(choice.clone()), ToolCallFormat::Llama3Json).unwrap();
        assert_eq!(ch.walk(&g, &ch.text(llama)), Walk::Accepted, "{choice:?}");
        let text_walk = ch.walk(&g, &ch.text(prose));
        assert_eq!(text_walk == Walk::Accepted, choice == ToolChoice::Auto, "{choice:?}: {text_walk:?}");
        let bad = r#"{"name": "get_weather", "parameters": {"town": "#;
        assert!(matches!(ch.walk(&g, &ch.text(bad)), Walk::RefusedAt(_)));
    }
    // Mistral, list form: the marker a special token, or text.
    let list = r#"[{"name": "get_weather", "arguments": {"city": "Paris"}}, {"name": "get_time", "arguments": {}}]"#;
    // (Where the grammar forces text, llguidance allows its canonical tokenization: the
    // textual marker is tokenized with what follows it.)
    let textual = ch.text(&format!("[TOOL_CALLS]{list}"));
    for (tool_calls, tokens) in [(Some(marker), [vec![marker], ch.text(list)].concat()), (None, textual)] {
        let format = ToolCallFormat::Mistral { args: false, tool_calls, args_token: None };
        for choice in [ToolChoice::Required, ToolChoice::Auto] {
            let g = call_grammar(&request(choice.clone()), format).unwrap();
            assert_eq!(ch.walk(&g, &tokens), Walk::Accepted, "{format:?} {choice:?}");
            let text_walk = ch.walk(&g, &ch.text(prose));
            assert_eq!(text_walk == Walk::Accepted, choice == ToolChoice::Auto, "{choice:?}: {text_walk:?}");
        }
    }
    // Mistral, `name[ARGS]{…}` form with both markers special tokens.
    let format = ToolCallFormat::Mistral { args: true, tool_calls: Some(marker), args_token: Some(args_marker) };
    let call = |name: &str, args: &str| [vec![marker], ch.text(name), vec![args_marker], ch.text(args)].concat();
    let two = [call("get_weather", r#"{"city": "Paris"}"#), call("get_time", "{}")].concat();
    for choice in [ToolChoice::Required, ToolChoice::Auto] {
        let g = call_grammar(&request(choice.clone()), format).unwrap();
        assert_eq!(ch.walk(&g, &two), Walk::Accepted, "{choice:?}");
        let wrong = call("get_weather", r#"{"city": 1}"#);
        assert!(matches!(ch.walk(&g, &wrong), Walk::RefusedAt(_)));
    }
    let auto = call_grammar(&request(ToolChoice::Auto), format).unwrap();
    assert_eq!(ch.walk(&auto, &ch.text(prose)), Walk::Accepted);
    assert!(
        matches!(ch.walk(&auto, &ch.text("get_weather{\"city\"")), Walk::RefusedAt(_)),
        "text cannot look like a call"
    );
}
