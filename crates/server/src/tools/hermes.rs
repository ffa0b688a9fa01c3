//! The Hermes / Qwen 2.5 tool-call convention: each call is a block
//! `<tool_call>\n{"name": "…", "arguments": {…}}\n</tool_call>` in the generated text.
//!
//! [`HermesParser`] takes the text as it streams (any split, even inside a tag) and separates
//! plain text from complete calls; text that could be the start of a `<tool_call>` tag is held
//! back until it is decided. A block whose JSON does not parse as a call stays text.

use serde_json::Value;

use super::scan::{call_of, partial_tag_len};
use super::{push_text, ParsedCall, Piece, ToolParser};

const OPEN: &str = "<tool_call>";
const CLOSE: &str = "</tool_call>";

/// Streaming separator of text and `<tool_call>` blocks.
#[derive(Debug, Default)]
pub(crate) struct HermesParser {
    /// Text not yet decided: a possible tag start, or an open block waiting for its close.
    held: String,
    /// Inside a block (after `<tool_call>`).
    in_call: bool,
}

impl ToolParser for HermesParser {
    /// Takes the next piece of generated text; returns what is decided.
    fn push(&mut self, text: &str) -> Vec<Piece> {
        self.held.push_str(text);
        let mut out = Vec::new();
        loop {
            if self.in_call {
                let Some(end) = self.held.find(CLOSE) else { break };
                let body: String = self.held[..end].to_string();
                self.held.drain(..end + CLOSE.len());
                self.in_call = false;
                match parse_call(&body) {
                    Some(call) => out.push(Piece::Call(call)),
                    None => push_text(&mut out, format!("{OPEN}{body}{CLOSE}")),
                }
            } else if let Some(start) = self.held.find(OPEN) {
                let before: String = self.held[..start].to_string();
                self.held.drain(..start + OPEN.len());
                self.in_call = true;
                push_text(&mut out, before);
            } else {
                let keep = partial_tag_len(&self.held, OPEN);
                let ready: String = self.held.drain(..self.held.len() - keep).collect();
                push_text(&mut out, ready);
                break;
            }
        }
        out
    }

    /// The end of the output: what is still held is text (an unclosed block included, tag and all).
    fn finish(&mut self) -> Vec<Piece> {
        let mut out = Vec::new();
        let rest = std::mem::take(&mut self.held);
        if self.in_call {
            self.in_call = false;
            // A block cut by the length limit, or left unclosed at the end: a complete call
            // inside still counts (some models omit the closing tag before their end token).
            match parse_call(&rest) {
                Some(call) => out.push(Piece::Call(call)),
                None => push_text(&mut out, format!("{OPEN}{rest}")),
            }
        } else {
            push_text(&mut out, rest);
        }
        out
    }
}

/// `{"name": "…", "arguments": {…}}` (surrounding whitespace ignored), as [`call_of`] reads it.
fn parse_call(body: &str) -> Option<ParsedCall> {
    call_of(serde_json::from_str::<Value>(body.trim()).ok()?)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn call(name: &str, arguments: &str) -> Piece {
        Piece::Call(ParsedCall { name: name.into(), arguments: arguments.into() })
    }

    fn run(text: &str, n: usize) -> Vec<Piece> {
        crate::tools::scan::run_split(&mut HermesParser::default(), text, n)
    }

    #[test]
    fn fixtures_whole_and_split_at_every_size() {
        let qwen = "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"unit\": \"celsius\"}}\n</tool_call>";
        let two = format!(
            "Let me check.\n{qwen}\n<tool_call>\n{{\"name\": \"get_time\", \"arguments\": {{}}}}\n</tool_call>"
        );
        let cases: Vec<(String, Vec<Piece>)> = vec![
            (qwen.into(), vec![call("get_weather", r#"{"city":"Paris","unit":"celsius"}"#)]),
            (
                two,
                vec![
                    Piece::Text("Let me check.\n".into()),
                    call("get_weather", r#"{"city":"Paris","unit":"celsius"}"#),
                    Piece::Text("\n".into()),
                    call("get_time", "{}"),
                ],
            ),
            (
                "No tools needed: 1 < 2 and <b>bold</b>.".into(),
                vec![Piece::Text("No tools needed: 1 < 2 and <b>bold</b>.".into())],
            ),
            (
                "<tool_call>not json</tool_call> after".into(),
                vec![Piece::Text("<tool_call>not json</tool_call> after".into())],
            ),
            // Cut by the length limit inside a block: the text comes back whole.
            (
                "ok <tool_call>\n{\"name\": \"f\", \"argu".into(),
                vec![Piece::Text("ok <tool_call>\n{\"name\": \"f\", \"argu".into())],
            ),
            // A complete call whose closing tag never came.
            ("<tool_call>{\"name\": \"f\", \"arguments\": \"{\\\"x\\\": 1}\"}".into(), vec![call("f", r#"{"x": 1}"#)]),
            ("ends with a partial tag <tool_ca".into(), vec![Piece::Text("ends with a partial tag <tool_ca".into())]),
            ("é<tool_call>{\"name\": \"ü\"}</tool_call>".into(), vec![Piece::Text("é".into()), call("ü", "{}")]),
        ];
        for (text, want) in cases {
            for n in 1..=text.len() {
                assert_eq!(run(&text, n), want, "{text:?} in chunks of {n}");
            }
        }
    }

    #[test]
    fn text_before_a_tag_is_released_as_soon_as_it_cannot_start_one() {
        let mut p = HermesParser::default();
        assert_eq!(p.push("Hello <to"), vec![Piece::Text("Hello ".into())]);
        assert_eq!(p.push("day"), vec![Piece::Text("<today".into())]);
        assert_eq!(p.push(" <tool_call>{\"name\""), vec![Piece::Text(" ".into())]);
        assert_eq!(p.push(": \"f\"}</tool_call>"), vec![call("f", "{}")]);
        assert!(p.finish().is_empty());
    }
}
