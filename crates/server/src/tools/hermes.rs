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
//! bare object) is held back until it is decided. A call in tags streams: once its object has
//! named the function and opened its arguments (`{"name": "…", "arguments": {`), the arguments
//! go out fragment by fragment as they are generated (blank space between JSON tokens dropped)
//! — a grammar holds every tagged call whenever tools are offered, so a call begun is a call.
//! Tagged objects in another shape, fenced and bare ones are decided whole at their end; a
//! block whose JSON does not parse as a call stays text, verbatim.

use serde_json::Value;

use super::scan::{call_head, call_of, json_prefix, partial_tag_len, CallHead, JsonPrefix, ObjectScan};
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
}

impl Block {
    fn open(self) -> &'static str {
        match self {
            Block::Tag => OPEN,
            Block::Fence => FENCE_OPEN,
        }
    }

    fn close(self) -> &'static str {
        match self {
            Block::Tag => CLOSE,
            Block::Fence => FENCE_CLOSE,
        }
    }
}

/// Where the parser is inside a tagged block.
#[derive(Debug, Default)]
enum Tagged {
    /// Before the arguments: the object's start is not decided yet.
    #[default]
    Head,
    /// Streaming the arguments object.
    Arguments(ObjectScan),
    /// After the arguments, until the closing tag.
    Tail,
    /// Not in the streamable shape: the block is decided whole at its closing tag.
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
    /// Progress inside a tagged block.
    tagged: Tagged,
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

    /// Releases `text` as text; non-blank text ends the output's start.
    fn release(&mut self, out: &mut Vec<Piece>, text: String) {
        if !text.trim().is_empty() {
            self.at_start = false;
        }
        push_text(out, text);
    }

    /// At the start, a bare JSON object naming a declared tool: `Some(true)` when one was
    /// taken, `Some(false)` when the held text may still become one (wait for more), `None`
    /// when it cannot.
    fn bare_call(&mut self, out: &mut Vec<Piece>) -> Option<bool> {
        let body = self.held.trim_start();
        if body.is_empty() {
            return Some(false);
        }
        if !body.starts_with('{') {
            return None;
        }
        match json_prefix(&self.held) {
            JsonPrefix::Incomplete => Some(false),
            JsonPrefix::Invalid => None,
            JsonPrefix::Complete(v, end) => {
                let call = call_of(v).filter(|c| self.names.contains(&c.name))?;
                self.held.drain(..end);
                out.push(Piece::Call(call));
                Some(true)
            }
        }
    }
}

impl HermesParser {
    /// Advances a tagged block that may stream; returns whether it made progress (so the
    /// caller goes on) or waits for more text.
    fn stream_tagged(&mut self, out: &mut Vec<Piece>) -> bool {
        match &mut self.tagged {
            Tagged::Head => match call_head(&self.held) {
                CallHead::Incomplete if !self.held.contains(CLOSE) => false,
                CallHead::Incomplete | CallHead::NoMatch => {
                    self.tagged = Tagged::Whole;
                    true
                }
                CallHead::Found(name, at) => {
                    self.held.drain(..at);
                    out.push(Piece::CallBegin(name));
                    self.tagged = Tagged::Arguments(ObjectScan::default());
                    true
                }
            },
            Tagged::Arguments(scan) => {
                let mut fragment = String::new();
                let read = scan.feed(&self.held, &mut fragment);
                let done = scan.done;
                self.held.drain(..read);
                if !fragment.is_empty() {
                    out.push(Piece::CallArgs(fragment));
                }
                if done {
                    self.tagged = Tagged::Tail;
                }
                done
            }
            // What follows the arguments up to the closing tag (the object's `}`) is layout.
            Tagged::Tail => {
                let Some(end) = self.held.find(CLOSE) else { return false };
                self.held.drain(..end + CLOSE.len());
                self.open = None;
                self.tagged = Tagged::Head;
                out.push(Piece::CallEnd);
                true
            }
            Tagged::Whole => unreachable!("whole blocks are decided by the caller"),
        }
    }
}

impl ToolParser for HermesParser {
    /// Takes the next piece of generated text; returns what is decided.
    fn push(&mut self, text: &str) -> Vec<Piece> {
        self.held.push_str(text);
        let mut out = Vec::new();
        loop {
            if self.open == Some(Block::Tag) && !matches!(self.tagged, Tagged::Whole) {
                if self.stream_tagged(&mut out) {
                    continue;
                }
                break;
            }
            if let Some(block) = self.open {
                let Some(end) = self.held.find(block.close()) else { break };
                let body: String = self.held[..end].to_string();
                self.held.drain(..end + block.close().len());
                self.open = None;
                match self.call_in(block, &body) {
                    Some(call) => out.push(Piece::Call(call)),
                    None => self.release(&mut out, format!("{}{body}{}", block.open(), block.close())),
                }
                continue;
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
                self.tagged = Tagged::Head;
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

    /// The end of the output: what is still held is text (an unclosed block included, tag and all).
    fn finish(&mut self) -> Vec<Piece> {
        let mut out = Vec::new();
        let rest = std::mem::take(&mut self.held);
        match self.open.take() {
            // A streamed call cut by the length limit (or left unclosed) ends where the text did.
            Some(Block::Tag) if matches!(self.tagged, Tagged::Arguments(_) | Tagged::Tail) => out.push(Piece::CallEnd),
            // A block cut by the length limit, or left unclosed at the end: a complete call
            // inside still counts (some models omit the closing tag before their end token).
            Some(block) => match self.call_in(block, &rest) {
                Some(call) => out.push(Piece::Call(call)),
                None => self.release(&mut out, format!("{}{rest}", block.open())),
            },
            None => self.release(&mut out, rest),
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
        crate::tools::scan::run_split(&mut HermesParser::new(vec!["get_weather".into(), "get_time".into()]), text, n)
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
    fn fenced_and_bare_objects_naming_a_declared_tool_are_calls() {
        let weather = r#"{"name": "get_weather", "arguments": {"city": "Paris"}}"#;
        let example = r#"{"name": "Ada", "arguments": 2}"#;
        let cases: Vec<(String, Vec<Piece>)> = vec![
            (format!("```json\n{weather}\n```"), vec![call("get_weather", r#"{"city":"Paris"}"#)]),
            (
                format!("Checking.\n```json\n{weather}\n```\nDone."),
                vec![
                    Piece::Text("Checking.\n".into()),
                    call("get_weather", r#"{"city":"Paris"}"#),
                    Piece::Text("\nDone.".into()),
                ],
            ),
            (format!("  {weather}"), vec![call("get_weather", r#"{"city":"Paris"}"#)]),
            (
                format!("{weather}\n{weather}"),
                vec![call("get_weather", r#"{"city":"Paris"}"#), call("get_weather", r#"{"city":"Paris"}"#)],
            ),
            // Not a declared tool, not a call, or not at the start: text, verbatim.
            (format!("```json\n{example}\n```"), vec![Piece::Text(format!("```json\n{example}\n```"))]),
            (example.to_string(), vec![Piece::Text(example.into())]),
            ("{\"a\": 1} and more".into(), vec![Piece::Text("{\"a\": 1} and more".into())]),
            (format!("Like this: {weather}"), vec![Piece::Text(format!("Like this: {weather}"))]),
            ("```python\nx = {}\n```".into(), vec![Piece::Text("```python\nx = {}\n```".into())]),
            ("{\"name\": \"get_wea".into(), vec![Piece::Text("{\"name\": \"get_wea".into())]),
            // A fence left open by the length limit: a complete call inside still counts.
            (format!("```json\n{weather}\n"), vec![call("get_weather", r#"{"city":"Paris"}"#)]),
        ];
        for (text, want) in cases {
            for n in 1..=text.len() {
                assert_eq!(run(&text, n), want, "{text:?} in chunks of {n}");
            }
        }
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
        assert_eq!(p.push("ris\"}}\n</tool"), vec![Piece::CallArgs("ris\"}".into())]);
        assert_eq!(p.push("_call>"), vec![Piece::CallEnd]);
        // Cut by the length limit inside the arguments: the call ends where the text did.
        assert_eq!(
            p.push("\n<tool_call>\n{\"name\": \"f\", \"arguments\": {\"x\": [1,"),
            vec![Piece::Text("\n".into()), Piece::CallBegin("f".into()), Piece::CallArgs("{\"x\":[1,".into()),]
        );
        assert_eq!(p.finish(), vec![Piece::CallEnd]);
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
