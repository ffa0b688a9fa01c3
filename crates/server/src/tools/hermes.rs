//! The Hermes / Qwen 2.5 tool-call convention: each call is a block
//! `<tool_call>\n{"name": "…", "arguments": {…}}\n</tool_call>` in the generated text.
//!
//! Models of this family do not always keep to their tags when nothing forces them (under
//! `tool_choice: auto`): Qwen2.5-Coder often writes the same object in a fenced block
//! (```` ```json … ``` ````) or bare, as its whole answer. Like llama.cpp's Hermes parser, such
//! a block counts as a call too — but only when its object names one of the declared tools, so
//! a JSON example in an answer stays text. A bare object counts only at the start of the output
//! (or right after another call).
//!
//! [`HermesParser`] takes the text as it streams (any split, even inside a tag) and separates
//! plain text from calls; text that could be the start of a tag or fence (or, at the start, of a
//! bare object) is held back until it is decided. A call streams: once its object has named the
//! function and opened its arguments (`{"name": "…", "arguments": {`, or `"parameters"`) — in
//! a fenced or bare block, naming a declared tool — the call begins and its arguments go out
//! fragment by fragment as they are generated (blank space between JSON tokens dropped); the
//! rest of the object is dropped, and the call ends at the object's closing brace (blank space
//! and stray braces up to the block's closing tag or fence are layout; other text after the
//! object ends the block without its close). The call is committed once begun: its
//! arguments are what the model writes, a grammar holding them or not. Objects in another shape
//! (another key order, arguments as a string) are decided whole at the block's end; a block
//! whose JSON does not parse as a call stays text, verbatim.

use super::scan::{call_head, call_of, json_prefix, partial_tag_len, CallHead, JsonPrefix, StreamedCall};
use super::{push_text, ParsedCall, Piece, ToolParser};

const OPEN: &str = "<tool_call>";
const CLOSE: &str = "</tool_call>";
const FENCE_OPEN: &str = "```json";
const FENCE_CLOSE: &str = "```";

/// The kind of block the parser is inside.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Block {
    /// After `<tool_call>`, until `</tool_call>`.
    Tag,
    /// After ```` ```json ````, until the closing fence.
    Fence,
    /// A bare call object at the start of the output, until its closing brace (entered only
    /// once the object is known to be a call).
    Bare,
}

impl Block {
    fn open(self) -> &'static str {
        match self {
            Block::Tag => OPEN,
            Block::Fence => FENCE_OPEN,
            Block::Bare => "",
        }
    }

    fn close(self) -> &'static str {
        match self {
            Block::Tag => CLOSE,
            Block::Fence => FENCE_CLOSE,
            Block::Bare => "",
        }
    }
}

/// Where the parser is inside a block.
#[derive(Debug, Default)]
enum Inside {
    /// Before the arguments: whether the block streams is not decided yet.
    #[default]
    Head,
    /// Streaming the call.
    Call(StreamedCall),
    /// After the call's object, until the block's closing tag or fence.
    Tail,
    /// Not in the streamable shape: the block is decided whole at its close.
    Whole,
}

/// Streaming separator of text and call blocks.
#[derive(Debug, Default)]
pub(crate) struct HermesParser {
    /// Text not yet decided: a possible tag start, or an open block waiting for its close.
    held: String,
    /// The block the parser is inside, if any.
    open: Option<Block>,
    /// The declared tools' names: a fenced or bare object is a call only if it names one.
    names: Vec<String>,
    /// Nothing but blank text and calls released so far (where a bare object may be a call).
    at_start: bool,
    /// Progress inside the open block.
    inside: Inside,
}

impl HermesParser {
    pub(crate) fn new(names: Vec<String>) -> HermesParser {
        HermesParser { names, at_start: true, ..HermesParser::default() }
    }

    /// `body` as a call if it is one in `block`'s convention.
    fn call_in(&self, block: Block, body: &str) -> Option<ParsedCall> {
        let call = parse_call(body)?;
        (block == Block::Tag || self.names.contains(&call.name)).then_some(call)
    }

    /// Whether a call named `name` in `block` is one (outside tags it must name a declared tool).
    fn names_a_tool(&self, block: Block, name: &str) -> bool {
        block == Block::Tag || self.names.iter().any(|n| n == name)
    }

    /// Releases `text` as text; non-blank text ends the output's start.
    fn release(&mut self, out: &mut Vec<Piece>, text: String) {
        if !text.trim().is_empty() {
            self.at_start = false;
        }
        push_text(out, text);
    }

    /// Begins streaming the call named `name` of `block`, whose arguments start at byte `at`.
    fn begin(&mut self, out: &mut Vec<Piece>, block: Block, name: String, at: usize) {
        self.held.drain(..at);
        out.push(Piece::CallBegin(name));
        self.open = Some(block);
        self.inside = Inside::Call(StreamedCall::new(true));
    }

    /// At the start, a bare JSON object naming a declared tool: `Some(true)` when one was
    /// taken (whole, or begun streaming), `Some(false)` when the held text may still become
    /// one (wait for more), `None` when it cannot.
    fn bare_call(&mut self, out: &mut Vec<Piece>) -> Option<bool> {
        let body = self.held.trim_start();
        if body.is_empty() {
            return Some(false);
        }
        if !body.starts_with('{') {
            return None;
        }
        if let CallHead::Found(name, at) = call_head(&self.held) {
            if self.names_a_tool(Block::Bare, &name) {
                self.begin(out, Block::Bare, name, at);
                return Some(true);
            }
        }
        match json_prefix(&self.held) {
            JsonPrefix::Incomplete => Some(false),
            JsonPrefix::Invalid => None,
            JsonPrefix::Complete(_, end) => {
                let call = call_of(&self.held[..end]).filter(|c| self.names.contains(&c.name))?;
                self.held.drain(..end);
                out.push(Piece::Call(call));
                Some(true)
            }
        }
    }
}

impl HermesParser {
    /// Advances the open block: decides whether it streams, streams it, or decides it whole;
    /// returns whether it made progress (so the caller goes on) or waits for more text.
    fn advance_block(&mut self, out: &mut Vec<Piece>, block: Block) -> bool {
        match &mut self.inside {
            Inside::Head => {
                // The block ends at its first closing tag or fence, wherever that is (inside a
                // string too): a call streams only if it opens its arguments before that.
                let close = self.held.find(block.close());
                match call_head(&self.held) {
                    CallHead::Incomplete if close.is_none() => false,
                    CallHead::Found(name, at) if close.is_none_or(|c| c > at) && self.names_a_tool(block, &name) => {
                        self.begin(out, block, name, at);
                        true
                    }
                    _ => {
                        self.inside = Inside::Whole;
                        true
                    }
                }
            }
            Inside::Call(call) => {
                let (read, over) = call.feed(&self.held, out);
                self.held.drain(..read);
                if over {
                    // A bare call ends with its object; a tagged or fenced one waits for its close.
                    match block {
                        Block::Bare => self.close_block(),
                        Block::Tag | Block::Fence => self.inside = Inside::Tail,
                    }
                }
                over
            }
            // Blank space and stray closing braces (a slip typical of small models) between
            // the call's object and the block's close lay the block out: dropped with the
            // close. Anything else means the close is missing: the block ends there, and what
            // follows is read afresh.
            Inside::Tail => {
                let rest = self.held.trim_start_matches(|c: char| c.is_whitespace() || c == '}');
                if rest.is_empty() || (rest.len() < block.close().len() && block.close().starts_with(rest)) {
                    return false;
                }
                let close = if rest.starts_with(block.close()) { block.close().len() } else { 0 };
                self.held.drain(..self.held.len() - rest.len() + close);
                self.close_block();
                true
            }
            // Decided whole at the block's close: a call, or text with its tags.
            Inside::Whole => {
                let Some(end) = self.held.find(block.close()) else { return false };
                let body: String = self.held[..end].to_string();
                self.held.drain(..end + block.close().len());
                self.close_block();
                match self.call_in(block, &body) {
                    Some(call) => out.push(Piece::Call(call)),
                    None => self.release(out, format!("{}{body}{}", block.open(), block.close())),
                }
                true
            }
        }
    }

    fn close_block(&mut self) {
        self.open = None;
        self.inside = Inside::Head;
    }
}

impl ToolParser for HermesParser {
    /// Takes the next piece of generated text; returns what is decided.
    fn push(&mut self, text: &str) -> Vec<Piece> {
        self.held.push_str(text);
        let mut out = Vec::new();
        loop {
            if let Some(block) = self.open {
                if self.advance_block(&mut out, block) {
                    continue;
                }
                break;
            }
            if self.at_start {
                match self.bare_call(&mut out) {
                    Some(true) => continue,
                    Some(false) => break,
                    None => {}
                }
            }
            let tag = self.held.find(OPEN).map(|i| (i, Block::Tag));
            let fence = self.held.find(FENCE_OPEN).map(|i| (i, Block::Fence));
            if let Some((start, block)) = [tag, fence].into_iter().flatten().min_by_key(|&(i, _)| i) {
                let before: String = self.held[..start].to_string();
                self.held.drain(..start + block.open().len());
                self.open = Some(block);
                self.inside = Inside::Head;
                self.release(&mut out, before);
            } else {
                let keep = partial_tag_len(&self.held, OPEN).max(partial_tag_len(&self.held, FENCE_OPEN));
                let ready: String = self.held.drain(..self.held.len() - keep).collect();
                self.release(&mut out, ready);
                break;
            }
        }
        out
    }

    /// The end of the output: what is still held is decided (an unclosed block's text comes
    /// back with its opening tag).
    fn finish(&mut self) -> Vec<Piece> {
        let mut out = Vec::new();
        let rest = std::mem::take(&mut self.held);
        let inside = std::mem::take(&mut self.inside);
        match (self.open.take(), inside) {
            // A streamed call cut by the length limit ends where the text did.
            (Some(_), Inside::Call(_)) => out.push(Piece::CallEnd),
            // After a streamed call, a block left unclosed: what is held is layout (blank
            // space, stray braces, a partial close).
            (Some(_), Inside::Tail) => {}
            // A block cut by the length limit, or left unclosed at the end: a complete call
            // inside still counts (some models omit the closing tag before their end token).
            (Some(block), _) => match self.call_in(block, &rest) {
                Some(call) => out.push(Piece::Call(call)),
                None => self.release(&mut out, format!("{}{rest}", block.open())),
            },
            (None, _) => self.release(&mut out, rest),
        }
        out
    }
}

/// `{"name": "…", "arguments": {…}}` (surrounding whitespace ignored), as [`call_of`] reads it.
fn parse_call(body: &str) -> Option<ParsedCall> {
    let body = body.trim();
    serde_json::from_str::<serde_json::Value>(body).ok()?;
    call_of(body)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tools::fixtures::{call, check_fixtures, check_streams, LONG};

    fn parser() -> Box<dyn ToolParser> {
        Box::new(HermesParser::new(vec!["get_weather".into(), "get_time".into()]))
    }

    #[test]
    fn fixtures_whole_and_split_at_every_position() {
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
            // Streamed (name first) or whole (arguments first), the arguments keep the model's
            // spelling of numbers and escapes.
            (
                "<tool_call>{\"name\": \"f\", \"arguments\": {\"n\": 1.50, \"s\": \"\\u00e9\"}}</tool_call>\n<tool_call>{\"arguments\": {\"n\": 1.50, \"s\": \"\\u00e9\"}, \"name\": \"f\"}</tool_call>".into(),
                vec![call("f", r#"{"n":1.50,"s":"\u00e9"}"#), Piece::Text("\n".into()), call("f", r#"{"n":1.50,"s":"\u00e9"}"#)],
            ),
        ];
        check_fixtures(parser, &cases);
    }

    #[test]
    fn fenced_and_bare_objects_naming_a_declared_tool_are_calls() {
        let weather = r#"{"name": "get_weather", "arguments": {"city": "Paris"}}"#;
        let example = r#"{"name": "Ada", "arguments": 2}"#;
        let undeclared = r#"{"name": "Ada", "arguments": {"age": 36}}"#;
        let paris = || call("get_weather", r#"{"city":"Paris"}"#);
        let cases: Vec<(String, Vec<Piece>)> = vec![
            (format!("```json\n{weather}\n```"), vec![paris()]),
            (
                format!("Checking.\n```json\n{weather}\n```\nDone."),
                vec![Piece::Text("Checking.\n".into()), paris(), Piece::Text("\nDone.".into())],
            ),
            (format!("  {weather}"), vec![paris()]),
            (format!("{weather}\n{weather}"), vec![paris(), paris()]),
            (format!("{weather}\n```json\n{weather}\n```"), vec![paris(), Piece::Text("\n".into()), paris()]),
            // Parameters under Llama's key; the arguments first (decided whole at the end).
            (r#"{"name": "get_time", "parameters": {"tz": "CET"}}"#.into(), vec![call("get_time", r#"{"tz":"CET"}"#)]),
            (r#"{"arguments": {"tz": "CET"}, "name": "get_time"}"#.into(), vec![call("get_time", r#"{"tz":"CET"}"#)]),
            // Not a declared tool, not a call, or not at the start: text, verbatim.
            (format!("```json\n{example}\n```"), vec![Piece::Text(format!("```json\n{example}\n```"))]),
            (format!("```json\n{undeclared}\n```"), vec![Piece::Text(format!("```json\n{undeclared}\n```"))]),
            (example.to_string(), vec![Piece::Text(example.into())]),
            (undeclared.to_string(), vec![Piece::Text(undeclared.into())]),
            ("{\"a\": 1} and more".into(), vec![Piece::Text("{\"a\": 1} and more".into())]),
            (format!("Like this: {weather}"), vec![Piece::Text(format!("Like this: {weather}"))]),
            ("```python\nx = {}\n```".into(), vec![Piece::Text("```python\nx = {}\n```".into())]),
            ("{\"name\": \"get_wea".into(), vec![Piece::Text("{\"name\": \"get_wea".into())]),
            // A fence left open by the length limit: a complete call inside still counts.
            (format!("```json\n{weather}\n"), vec![paris()]),
            (format!("```json\n{weather}\n``"), vec![paris()]),
            // Cut inside the arguments: the streamed call ends where the text did.
            ("```json\n{\"name\": \"get_weather\", \"arguments\": {\"ci".into(), vec![call("get_weather", "{\"ci")]),
            // Keys after the arguments are dropped, and so is what follows the object in its
            // block (here a stray brace).
            (
                "```json\n{\"name\": \"get_time\", \"arguments\": {}, \"id\": 1}}\n```".into(),
                vec![call("get_time", "{}")],
            ),
            ("<tool_call>{\"name\": \"get_time\", \"arguments\": {}}}\n</tool_".into(), vec![call("get_time", "{}")]),
            // A fence left open after a call: the text that follows is text.
            (format!("```json\n{weather}\nDone."), vec![paris(), Piece::Text("Done.".into())]),
        ];
        check_fixtures(parser, &cases);
    }

    #[test]
    fn tagged_fenced_and_bare_arguments_stream_token_by_token() {
        let args = format!(r#"{{"city": "{LONG}", "unit": "celsius"}}"#);
        let object = format!(r#"{{"name": "get_weather", "arguments": {args}}}"#);
        for text in [
            format!("<tool_call>\n{object}\n</tool_call>"),
            format!("Checking.\n```json\n{object}\n```"),
            format!("\n{object}"),
            format!("{object}\n{object}"),
        ] {
            let end = text.find(&object).unwrap() + object.len() - 1;
            check_streams(parser().as_mut(), &text, 0, end);
        }
        // The second of two bare calls streams too.
        let two = format!("{object}\n{object}");
        check_streams(parser().as_mut(), &two, 1, two.len() - 1);
    }

    #[test]
    fn tagged_arguments_stream_as_they_are_generated() {
        let mut p = HermesParser::new(vec![]);
        assert_eq!(p.push("Sure.\n<tool_call>\n{\"name\": \"get_wea"), vec![Piece::Text("Sure.\n".into())]);
        assert_eq!(
            p.push("ther\", \"arguments\": {\"ci"),
            vec![Piece::CallBegin("get_weather".into()), Piece::CallArgs("{\"ci".into())]
        );
        assert_eq!(p.push("ty\": \"Pa"), vec![Piece::CallArgs("ty\":\"Pa".into())]);
        // The call ends with its object; the closing tag that follows is layout.
        assert_eq!(p.push("ris\"}}\n</tool"), vec![Piece::CallArgs("ris\"}".into()), Piece::CallEnd]);
        assert_eq!(p.push("_call>"), vec![]);
        // Cut by the length limit inside the arguments: the call ends where the text did.
        assert_eq!(
            p.push("\n<tool_call>\n{\"name\": \"f\", \"arguments\": {\"x\": [1,"),
            vec![Piece::Text("\n".into()), Piece::CallBegin("f".into()), Piece::CallArgs("{\"x\":[1,".into()),]
        );
        assert_eq!(p.finish(), vec![Piece::CallEnd]);
    }

    #[test]
    fn fenced_and_bare_calls_begin_once_they_name_a_declared_tool() {
        let mut p = HermesParser::new(vec!["get_weather".into()]);
        assert_eq!(p.push("```json\n{\"name\": \"get_weather\", \"arguments\": "), vec![]);
        assert_eq!(
            p.push("{\"city\": \"Pa"),
            vec![Piece::CallBegin("get_weather".into()), Piece::CallArgs("{\"city\":\"Pa".into())]
        );
        assert_eq!(p.push("ris\"} }\n`"), vec![Piece::CallArgs("ris\"}".into()), Piece::CallEnd]);
        assert_eq!(p.push("``\n"), vec![]);
        assert_eq!(p.finish(), vec![Piece::Text("\n".into())]);
        let mut p = HermesParser::new(vec!["get_weather".into()]);
        assert_eq!(
            p.push(" {\"name\": \"get_weather\", \"arguments\": {"),
            vec![Piece::CallBegin("get_weather".into()), Piece::CallArgs("{".into())]
        );
        assert_eq!(p.push("}}"), vec![Piece::CallArgs("}".into()), Piece::CallEnd]);
        // An undeclared name waits for the whole object, and is text.
        let mut p = HermesParser::new(vec!["get_weather".into()]);
        assert_eq!(p.push("{\"name\": \"other\", \"arguments\": {\"a\": 1"), vec![]);
        assert_eq!(p.push("}}"), vec![Piece::Text("{\"name\": \"other\", \"arguments\": {\"a\": 1}}".into())]);
    }

    #[test]
    fn a_code_fence_other_than_json_streams_at_once() {
        let mut p = HermesParser::new(vec!["f".into()]);
        assert_eq!(p.push("Here:\n```py"), vec![Piece::Text("Here:\n```py".into())]);
        assert_eq!(p.push("thon\n"), vec![Piece::Text("thon\n".into())]);
    }

    #[test]
    fn text_before_a_tag_is_released_as_soon_as_it_cannot_start_one() {
        let mut p = HermesParser::new(vec![]);
        assert_eq!(p.push("Hello <to"), vec![Piece::Text("Hello ".into())]);
        assert_eq!(p.push("day"), vec![Piece::Text("<today".into())]);
        assert_eq!(p.push(" <tool_call>{\"name\""), vec![Piece::Text(" ".into())]);
        assert_eq!(p.push(": \"f\"}</tool_call>"), vec![call("f", "{}")]);
        assert!(p.finish().is_empty());
    }
}
