//! The Mistral tool-call convention: `[TOOL_CALLS]` then either a JSON list of calls
//! (`[{"name": "…", "arguments": {…}}, …]`) or, in the newer form, `name[ARGS]{…}` — one
//! `[TOOL_CALLS]` per call. Text may come before the first call.
//!
//! `[TOOL_CALLS]` and `[ARGS]` are special tokens in Mistral's vocabularies, and special
//! tokens print no text: so the parser also reads a call without its markers where one can
//! start — at the start of the output and right after a call (`[{…}]`, or `name{…}` in the
//! newer form) — and only there, so that text is never mistaken for a call elsewhere. A
//! candidate that turns out not to be a call (a complete JSON value of another shape, a word
//! not followed by arguments) is text.

use super::scan::{call_of, json_prefix, partial_tag_len, JsonPrefix};
use super::{push_text, ParsedCall, Piece, ToolParser};

const TOOL_CALLS: &str = "[TOOL_CALLS]";
const ARGS: &str = "[ARGS]";

#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Where a call may start without its marker: the start of the output, or after a call.
    #[default]
    Open,
    /// Text; a `[TOOL_CALLS]` starts a call.
    Text,
    /// After `[TOOL_CALLS]` (or a markerless candidate): reading a call.
    Call,
}

/// Streaming reader of Mistral calls, in the list form or (`args`) the `name[ARGS]{…}` form.
#[derive(Debug, Default)]
pub(crate) struct MistralParser {
    args: bool,
    held: String,
    state: State,
    /// Text consumed for the call being read (its marker), given back if it is not a call.
    consumed: String,
    /// A call has been read.
    called: bool,
}

fn is_name_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_' || c == '-' || c == '.'
}

/// What the start of a text holds as one call of the newer form.
enum NameArgs {
    Call(ParsedCall, usize),
    Incomplete,
    NotACall,
}

/// `name[ARGS]{…}` or `name{…}` at the start of `s`.
fn name_args(s: &str) -> NameArgs {
    let name_len = s.find(|c: char| !is_name_char(c)).unwrap_or(s.len());
    if name_len == s.len() {
        return NameArgs::Incomplete;
    }
    if name_len == 0 {
        return NameArgs::NotACall;
    }
    let mut at = name_len;
    let rest = &s[at..];
    if rest.starts_with(ARGS) {
        at += ARGS.len();
    } else if rest.len() < ARGS.len() && ARGS.starts_with(rest) {
        return NameArgs::Incomplete;
    }
    if !s[at..].is_empty() && !s[at..].starts_with('{') {
        return NameArgs::NotACall;
    }
    match json_prefix(&s[at..]) {
        JsonPrefix::Incomplete => NameArgs::Incomplete,
        JsonPrefix::Invalid => NameArgs::NotACall,
        JsonPrefix::Complete(v, end) if v.is_object() => {
            NameArgs::Call(ParsedCall { name: s[..name_len].to_string(), arguments: v.to_string() }, at + end)
        }
        JsonPrefix::Complete(..) => NameArgs::NotACall,
    }
}

impl MistralParser {
    /// A parser for the list form, or (`args`) the `name[ARGS]{…}` form.
    pub(crate) fn new(args: bool) -> MistralParser {
        MistralParser { args, ..MistralParser::default() }
    }

    /// What was read as a possible call is text: the consumed marker goes out, and `held` is
    /// scanned as text (it may hold a later marker).
    fn fall_back_to_text(&mut self, out: &mut Vec<Piece>) {
        self.state = State::Text;
        push_text(out, std::mem::take(&mut self.consumed));
    }

    /// Text: released up to a `[TOOL_CALLS]` (a partial one at the end is held).
    fn scan_text(&mut self, out: &mut Vec<Piece>) {
        if let Some(at) = self.held.find(TOOL_CALLS) {
            let before: String = self.held.drain(..at).collect();
            push_text(out, before);
            self.consumed = self.held.drain(..TOOL_CALLS.len()).collect();
            self.state = State::Call;
        } else {
            let keep = partial_tag_len(&self.held, TOOL_CALLS);
            let ready: String = self.held.drain(..self.held.len() - keep).collect();
            push_text(out, ready);
        }
    }

    fn scan(&mut self, out: &mut Vec<Piece>) {
        loop {
            match self.state {
                State::Text => {
                    self.scan_text(out);
                    if self.state == State::Text {
                        return;
                    }
                }
                State::Open => {
                    let body = self.held.trim_start();
                    if body.is_empty() || (TOOL_CALLS.starts_with(body) && body.len() < TOOL_CALLS.len()) {
                        return;
                    }
                    if body.starts_with(TOOL_CALLS) {
                        let skip = self.held.len() - body.len() + TOOL_CALLS.len();
                        self.consumed = self.held.drain(..skip).collect();
                        self.state = State::Call;
                        continue;
                    }
                    let candidate = if self.args { body.starts_with(is_name_char) } else { body.starts_with('[') };
                    if !candidate {
                        // Plain text: it may still hold a marked call further on.
                        self.state = State::Text;
                        continue;
                    }
                    self.state = State::Call;
                }
                State::Call => {
                    if !self.read_call(out) {
                        return;
                    }
                }
            }
        }
    }

    /// Reads the call(s) at the start of `held`; false when more text is needed.
    fn read_call(&mut self, out: &mut Vec<Piece>) -> bool {
        let lead = self.held.len() - self.held.trim_start().len();
        let calls = if self.args {
            match name_args(&self.held[lead..]) {
                NameArgs::Incomplete => return false,
                NameArgs::NotACall => None,
                NameArgs::Call(call, end) => Some((vec![call], lead + end)),
            }
        } else {
            match json_prefix(&self.held) {
                JsonPrefix::Incomplete => return false,
                JsonPrefix::Invalid => None,
                JsonPrefix::Complete(serde_json::Value::Array(items), end) if !items.is_empty() => {
                    items.into_iter().map(call_of).collect::<Option<Vec<_>>>().map(|calls| (calls, end))
                }
                JsonPrefix::Complete(..) => None,
            }
        };
        match calls {
            Some((calls, end)) => {
                self.held.drain(..end);
                self.consumed.clear();
                out.extend(calls.into_iter().map(Piece::Call));
                self.state = State::Open;
                self.called = true;
            }
            None => self.fall_back_to_text(out),
        }
        true
    }
}

impl ToolParser for MistralParser {
    fn push(&mut self, text: &str) -> Vec<Piece> {
        self.held.push_str(text);
        let mut out = Vec::new();
        self.scan(&mut out);
        out
    }

    fn finish(&mut self) -> Vec<Piece> {
        let mut out = Vec::new();
        let rest = std::mem::take(&mut self.consumed) + &std::mem::take(&mut self.held);
        // Blank text after calls only lays them out; anything else undecided is text.
        if !(self.called && self.state == State::Open && rest.trim().is_empty()) {
            push_text(&mut out, rest);
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tools::scan::check_fixtures;

    fn call(name: &str, arguments: &str) -> Piece {
        Piece::Call(ParsedCall { name: name.into(), arguments: arguments.into() })
    }

    #[test]
    fn list_form_whole_and_split_at_every_position() {
        let list =
            r#"[{"name": "get_weather", "arguments": {"city": "Paris"}}, {"name": "get_time", "arguments": {}}]"#;
        let both = vec![call("get_weather", r#"{"city":"Paris"}"#), call("get_time", "{}")];
        let cases: Vec<(String, Vec<Piece>)> = vec![
            (format!("[TOOL_CALLS]{list}"), both.clone()),
            // The marker is a special token that printed nothing.
            (list.to_string(), both.clone()),
            (
                format!("Let me check.[TOOL_CALLS]{list}"),
                [vec![Piece::Text("Let me check.".into())], both.clone()].concat(),
            ),
            ("[1] is a footnote.".into(), vec![Piece::Text("[1] is a footnote.".into())]),
            ("No [TOOL_CALLS here".into(), vec![Piece::Text("No [TOOL_CALLS here".into())]),
            (
                "[TOOL_CALLS][{\"name\": \"f\", \"argu".into(),
                vec![Piece::Text("[TOOL_CALLS][{\"name\": \"f\", \"argu".into())],
            ),
            ("Text [{\"name\": \"f\"}]".into(), vec![Piece::Text("Text [{\"name\": \"f\"}]".into())]),
            ("[TOOL_CALLS][{\"name\": \"é\"}]\n".into(), vec![call("é", "{}")]),
        ];
        check_fixtures(|| Box::new(MistralParser::new(false)), &cases);
    }

    #[test]
    fn args_form_whole_and_split_at_every_position() {
        let w = call("get_weather", r#"{"city":"Paris"}"#);
        let cases: Vec<(String, Vec<Piece>)> = vec![
            ("[TOOL_CALLS]get_weather[ARGS]{\"city\": \"Paris\"}".into(), vec![w.clone()]),
            (
                "[TOOL_CALLS]get_weather[ARGS]{\"city\": \"Paris\"}[TOOL_CALLS]get_time[ARGS]{}".into(),
                vec![w.clone(), call("get_time", "{}")],
            ),
            // Both markers are special tokens that printed nothing.
            ("get_weather{\"city\": \"Paris\"}get_time{}".into(), vec![w.clone(), call("get_time", "{}")]),
            ("Sure, here it is.".into(), vec![Piece::Text("Sure, here it is.".into())]),
            (
                "I will call.[TOOL_CALLS]get_weather[ARGS]{\"city\": \"Paris\"}".into(),
                vec![Piece::Text("I will call.".into()), w.clone()],
            ),
            (
                "[TOOL_CALLS]get_weather[ARGS]{\"city\": ".into(),
                vec![Piece::Text("[TOOL_CALLS]get_weather[ARGS]{\"city\": ".into())],
            ),
            ("[TOOL_CALLS]get_weather[ARGS][1]".into(), vec![Piece::Text("[TOOL_CALLS]get_weather[ARGS][1]".into())]),
        ];
        check_fixtures(|| Box::new(MistralParser::new(true)), &cases);
    }
}
