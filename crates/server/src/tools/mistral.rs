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
//!
//! Calls stream: once a call's name and the start of its arguments are read — `name[ARGS]{"`
//! (or `name{"`, `{}` for no arguments), or a list item opening `{"name": "…", "arguments": {`
//! — the call begins and its arguments go out as they are generated (blank space between JSON
//! tokens dropped); the call ends with its arguments object (in a list, with its item's object,
//! later keys dropped). A list whose first item opens in another key order is decided whole
//! once complete; after a streamed item, each further item streams, or is taken whole if it is
//! a call in another key order; an item that is no call turns the rest into text. A call begun
//! is committed: arguments cut by the length limit or broken off end the call where they stop.

use super::scan::{call_head, call_of, elements, json_prefix, partial_tag_len, CallHead, JsonPrefix, StreamedCall};
use super::{push_text, Piece, ToolParser};

const TOOL_CALLS: &str = "[TOOL_CALLS]";
const ARGS: &str = "[ARGS]";

#[derive(Debug, Default)]
enum State {
    /// Where a call may start without its marker: the start of the output, or after a call.
    #[default]
    Open,
    /// Text; a `[TOOL_CALLS]` starts a call.
    Text,
    /// After `[TOOL_CALLS]` (or a markerless candidate): reading a call.
    Call,
    /// Streaming a call.
    Streaming(StreamedCall),
    /// In a list, after a call: `,` and the next call, or the closing `]`.
    List,
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

/// `name[ARGS]{` or `name{` at the start of `s`, the object going on with a key or closing
/// at once: the name and where the arguments begin (or whether more text could make one).
fn args_head(s: &str) -> CallHead {
    let name_len = s.find(|c: char| !is_name_char(c)).unwrap_or(s.len());
    if name_len == s.len() {
        return CallHead::Incomplete;
    }
    if name_len == 0 {
        return CallHead::NoMatch;
    }
    let mut at = name_len;
    let rest = &s[at..];
    if rest.starts_with(ARGS) {
        at += ARGS.len();
    } else if rest.len() < ARGS.len() && ARGS.starts_with(rest) {
        return CallHead::Incomplete;
    }
    // The brace and the next token: a word followed by `{` alone could still be text.
    let Some(object) = s[at..].strip_prefix('{') else {
        return if s.len() == at { CallHead::Incomplete } else { CallHead::NoMatch };
    };
    match object.trim_start().chars().next() {
        None => CallHead::Incomplete,
        Some('"' | '}') => CallHead::Found(s[..name_len].to_string(), at),
        Some(_) => CallHead::NoMatch,
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

    /// Begins streaming the call named `name`, whose arguments start at byte `at` of `held`
    /// (`in_object`: they are a member of a list item's object).
    fn begin(&mut self, out: &mut Vec<Piece>, name: String, at: usize, in_object: bool) {
        self.held.drain(..at);
        self.consumed.clear();
        out.push(Piece::CallBegin(name));
        self.state = State::Streaming(StreamedCall::new(in_object));
        self.called = true;
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
            match &mut self.state {
                State::Text => {
                    self.scan_text(out);
                    if matches!(self.state, State::Text) {
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
                    // Plain text otherwise: it may still hold a marked call further on.
                    self.state = if candidate { State::Call } else { State::Text };
                }
                State::Call => {
                    if !self.read_call(out) {
                        return;
                    }
                }
                State::Streaming(call) => {
                    let (read, over) = call.feed(&self.held, out);
                    self.held.drain(..read);
                    if !over {
                        return;
                    }
                    self.state = if self.args { State::Open } else { State::List };
                }
                State::List => {
                    if !self.read_item(out) {
                        return;
                    }
                }
            }
        }
    }

    /// Reads the call(s) at the start of `held`: begins streaming one, or takes a list whole
    /// (its first item opening in another key order); false when more text is needed.
    fn read_call(&mut self, out: &mut Vec<Piece>) -> bool {
        let lead = self.held.len() - self.held.trim_start().len();
        if self.args {
            return match args_head(&self.held[lead..]) {
                CallHead::Incomplete => false,
                CallHead::NoMatch => {
                    self.fall_back_to_text(out);
                    true
                }
                CallHead::Found(name, at) => {
                    self.begin(out, name, lead + at, false);
                    true
                }
            };
        }
        if let Some(items) = self.held[lead..].strip_prefix('[') {
            match call_head(items) {
                CallHead::Found(name, at) => {
                    self.begin(out, name, lead + 1 + at, true);
                    return true;
                }
                CallHead::Incomplete => return false,
                CallHead::NoMatch => {}
            }
        }
        let calls = match json_prefix(&self.held) {
            JsonPrefix::Incomplete => return false,
            JsonPrefix::Complete(serde_json::Value::Array(items), end) if !items.is_empty() => {
                let calls = elements(&self.held[..end]).and_then(|e| e.into_iter().map(call_of).collect());
                calls.map(|calls: Vec<_>| (calls, end))
            }
            JsonPrefix::Invalid | JsonPrefix::Complete(..) => None,
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

    /// In a list after a call: the list's end, or `,` and the next item — streamed, or whole
    /// if it is a call in another key order. Anything else is text from there on. False when
    /// more text is needed.
    fn read_item(&mut self, out: &mut Vec<Piece>) -> bool {
        let lead = self.held.len() - self.held.trim_start().len();
        let body = &self.held[lead..];
        if body.is_empty() {
            return false;
        }
        if body.starts_with(']') {
            self.held.drain(..lead + 1);
            self.state = State::Open;
            return true;
        }
        let Some(item) = body.strip_prefix(',') else {
            self.state = State::Text;
            return true;
        };
        let at = lead + 1;
        match call_head(item) {
            CallHead::Found(name, head) => {
                self.begin(out, name, at + head, true);
                return true;
            }
            CallHead::Incomplete => return false,
            CallHead::NoMatch => {}
        }
        match json_prefix(item) {
            JsonPrefix::Incomplete => false,
            JsonPrefix::Complete(_, end) => {
                match call_of(&item[..end]) {
                    Some(call) => {
                        self.held.drain(..at + end);
                        out.push(Piece::Call(call));
                    }
                    None => self.state = State::Text,
                }
                true
            }
            JsonPrefix::Invalid => {
                self.state = State::Text;
                true
            }
        }
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
        match std::mem::take(&mut self.state) {
            // A streamed call cut by the length limit ends where the text did.
            State::Streaming(_) => out.push(Piece::CallEnd),
            // Blank text after calls only lays them out; anything else undecided is text.
            State::Open | State::List if self.called && rest.trim().is_empty() => {}
            _ => push_text(&mut out, rest),
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tools::fixtures::{call, check_fixtures, check_streams, LONG};

    fn parser(args: bool) -> impl Fn() -> Box<dyn ToolParser> {
        move || Box::new(MistralParser::new(args))
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
            ("[{\"a\": 1}] is JSON.".into(), vec![Piece::Text("[{\"a\": 1}] is JSON.".into())]),
            ("No [TOOL_CALLS here".into(), vec![Piece::Text("No [TOOL_CALLS here".into())]),
            (
                "[TOOL_CALLS][{\"name\": \"f\", \"argu".into(),
                vec![Piece::Text("[TOOL_CALLS][{\"name\": \"f\", \"argu".into())],
            ),
            ("Text [{\"name\": \"f\"}]".into(), vec![Piece::Text("Text [{\"name\": \"f\"}]".into())]),
            ("[TOOL_CALLS][{\"name\": \"é\"}]\n".into(), vec![call("é", "{}")]),
            // After a streamed item: one in another key order is taken whole, and the
            // arguments keep the model's spelling either way.
            (
                r#"[{"name": "f", "arguments": {"n": 1.50}}, {"arguments": {"n": 1.50}, "name": "g"}]"#.into(),
                vec![call("f", r#"{"n":1.50}"#), call("g", r#"{"n":1.50}"#)],
            ),
            // An item that is no call: the rest is text.
            ("[{\"name\": \"f\", \"arguments\": {}}, 5]".into(), vec![call("f", "{}"), Piece::Text(", 5]".into())]),
            // Cut by the length limit inside the arguments: the call ends where the text did.
            ("[TOOL_CALLS][{\"name\": \"f\", \"arguments\": {\"x\": ".into(), vec![call("f", "{\"x\":")]),
        ];
        check_fixtures(parser(false), &cases);
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
            ("get_weather{ \"n\": 1.50 }\n".into(), vec![call("get_weather", r#"{"n":1.50}"#)]),
            ("Sure, here it is.".into(), vec![Piece::Text("Sure, here it is.".into())]),
            // A word and a brace that opens no JSON object: text.
            ("Hello{world}".into(), vec![Piece::Text("Hello{world}".into())]),
            (
                "I will call.[TOOL_CALLS]get_weather[ARGS]{\"city\": \"Paris\"}".into(),
                vec![Piece::Text("I will call.".into()), w.clone()],
            ),
            // Cut by the length limit inside the arguments: the call ends where the text did.
            ("[TOOL_CALLS]get_weather[ARGS]{\"city\": ".into(), vec![call("get_weather", "{\"city\":")]),
            ("[TOOL_CALLS]get_weather[AR".into(), vec![Piece::Text("[TOOL_CALLS]get_weather[AR".into())]),
            ("[TOOL_CALLS]get_weather[ARGS][1]".into(), vec![Piece::Text("[TOOL_CALLS]get_weather[ARGS][1]".into())]),
        ];
        check_fixtures(parser(true), &cases);
    }

    #[test]
    fn both_forms_stream_token_by_token() {
        let args = format!(r#"{{"city": "{LONG}", "days": [1, 2, 3]}}"#);
        let item = format!(r#"{{"name": "get_weather", "arguments": {args}}}"#);
        let time = r#"{"name": "get_time", "arguments": {}}"#;
        let end = |text: &str, part: &str| text.find(part).unwrap() + part.len() - 1;
        for (text, call) in [
            (format!("[TOOL_CALLS][{item}]"), 0),
            (format!("[{item}, {time}]"), 0),
            (format!("Sure.[TOOL_CALLS][{time}, {item}]"), 1),
        ] {
            check_streams(parser(false)().as_mut(), &text, call, end(&text, &item));
        }
        for (text, call) in [
            (format!("[TOOL_CALLS]get_weather[ARGS]{args}"), 0),
            (format!("get_weather{args}"), 0),
            (format!("get_time{{}}get_weather{args}"), 1),
            (format!("[TOOL_CALLS]get_time[ARGS]{{}}[TOOL_CALLS]get_weather[ARGS]{args}"), 1),
        ] {
            check_streams(parser(true)().as_mut(), &text, call, end(&text, &args));
        }
    }

    #[test]
    fn calls_begin_with_their_arguments() {
        let mut p = MistralParser::new(true);
        assert_eq!(p.push("[TOOL_CALLS]get_weather[ARGS]{"), vec![]);
        assert_eq!(
            p.push("\"city\": \"Pa"),
            vec![Piece::CallBegin("get_weather".into()), Piece::CallArgs("{\"city\":\"Pa".into())]
        );
        assert_eq!(p.push("ris\"}"), vec![Piece::CallArgs("ris\"}".into()), Piece::CallEnd]);
        assert!(p.finish().is_empty());
        let mut p = MistralParser::new(false);
        assert_eq!(p.push("[{\"name\": \"f\", \"arguments\": "), vec![]);
        assert_eq!(p.push("{\"x\": 1}"), vec![Piece::CallBegin("f".into()), Piece::CallArgs("{\"x\":1}".into())]);
        assert_eq!(p.push("}"), vec![Piece::CallEnd]);
        assert_eq!(p.push("]"), vec![]);
        assert!(p.finish().is_empty());
    }
}
