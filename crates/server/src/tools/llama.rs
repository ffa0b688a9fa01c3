//! The Llama 3.x JSON tool-call convention: a reply that is a call is the JSON object
//! `{"name": "…", "parameters": {…}}` — several joined by `;` — optionally after
//! `<|python_tag|>` (a special token: its text prints only when special tokens are printed).
//! A reply that begins with anything else is text, whole (the convention puts calls only at
//! the start, as vLLM's `llama3_json` parser reads it).
//!
//! [`Llama3Parser`] holds the start of the output until it is decided: leading whitespace, a
//! (partial) `<|python_tag|>`, a JSON object still open. An object that opens as a call —
//! `{"name": "…", "parameters": {` (or `"arguments"`) — is one: the call begins and its
//! arguments stream as they are generated (blank space between JSON tokens dropped), keys
//! after them are dropped, and the call ends at the object's closing brace. An object in
//! another key order is decided whole once complete. A call begun is committed: arguments cut
//! by the length limit end the call where they stop. A complete value that is not a call, or
//! text after a call that is not another call, turns the rest of the output into text.

use super::scan::{call_head, call_of, json_prefix, partial_tag_len, CallHead, JsonPrefix, StreamedCall};
use super::{push_text, Piece, ToolParser};

const PYTHON_TAG: &str = "<|python_tag|>";

#[derive(Debug, Default)]
enum State {
    /// Nothing but whitespace (and perhaps the python tag) so far, or `;` after a call.
    #[default]
    Start,
    /// Streaming a call.
    Call(StreamedCall),
    /// Calls have been read; what follows must be `;` and another call.
    Calls,
    /// The rest of the output is text.
    Text,
}

/// Streaming reader of Llama 3.x JSON calls.
#[derive(Debug, Default)]
pub(crate) struct Llama3Parser {
    held: String,
    state: State,
    /// Text consumed but not yet decided (the python tag, a separator), given back if the
    /// output turns out to be text.
    consumed: String,
}

impl Llama3Parser {
    fn fall_back_to_text(&mut self, out: &mut Vec<Piece>) {
        self.state = State::Text;
        let text = std::mem::take(&mut self.consumed) + &std::mem::take(&mut self.held);
        push_text(out, text);
    }

    /// Decides as much of `held` as can be decided.
    fn scan(&mut self, out: &mut Vec<Piece>) {
        loop {
            match &mut self.state {
                State::Text => {
                    push_text(out, std::mem::take(&mut self.held));
                    return;
                }
                State::Start => {
                    let body = self.held.trim_start();
                    if body.is_empty() {
                        return;
                    }
                    if let Some(rest) = body.strip_prefix(PYTHON_TAG) {
                        let taken = self.held.len() - rest.len();
                        self.consumed.extend(self.held.drain(..taken));
                        continue;
                    }
                    if body.len() < PYTHON_TAG.len() && partial_tag_len(body, PYTHON_TAG) == body.len() {
                        return;
                    }
                    if !body.starts_with('{') {
                        return self.fall_back_to_text(out);
                    }
                    match call_head(&self.held) {
                        // The object opens as a call: it is one, and streams from here.
                        CallHead::Found(name, at) => {
                            self.held.drain(..at);
                            self.consumed.clear();
                            out.push(Piece::CallBegin(name));
                            self.state = State::Call(StreamedCall::new(true));
                        }
                        // A JSON text so far that may still open as a call.
                        CallHead::Incomplete => return,
                        CallHead::NoMatch => {
                            if !self.read_call(out) {
                                return;
                            }
                        }
                    }
                }
                State::Call(call) => {
                    let (read, over) = call.feed(&self.held, out);
                    self.held.drain(..read);
                    if !over {
                        return;
                    }
                    self.state = State::Calls;
                }
                State::Calls => {
                    let body = self.held.trim_start();
                    if body.is_empty() {
                        return;
                    }
                    let Some(rest) = body.strip_prefix(';') else { return self.fall_back_to_text(out) };
                    if rest.trim_start().is_empty() {
                        return;
                    }
                    if !rest.trim_start().starts_with('{') {
                        return self.fall_back_to_text(out);
                    }
                    // The separator is consumed; the next call is read as the first one was
                    // (and given back as text with the separator if it is none).
                    let skip = self.held.len() - rest.len();
                    let separator: String = self.held.drain(..skip).collect();
                    self.consumed.push_str(&separator);
                    self.state = State::Start;
                }
            }
        }
    }

    /// Reads the call at the start of `held` whole; false when more text is needed.
    fn read_call(&mut self, out: &mut Vec<Piece>) -> bool {
        match json_prefix(&self.held) {
            JsonPrefix::Incomplete => false,
            JsonPrefix::Invalid => {
                self.fall_back_to_text(out);
                true
            }
            JsonPrefix::Complete(_, end) => match call_of(&self.held[..end]) {
                Some(call) => {
                    self.held.drain(..end);
                    self.consumed.clear();
                    out.push(Piece::Call(call));
                    self.state = State::Calls;
                    true
                }
                None => {
                    self.fall_back_to_text(out);
                    true
                }
            },
        }
    }
}

impl ToolParser for Llama3Parser {
    fn push(&mut self, text: &str) -> Vec<Piece> {
        self.held.push_str(text);
        let mut out = Vec::new();
        self.scan(&mut out);
        out
    }

    fn finish(&mut self) -> Vec<Piece> {
        let mut out = Vec::new();
        match self.state {
            // A streamed call cut by the length limit ends where the text did.
            State::Call(_) => {
                self.held.clear();
                out.push(Piece::CallEnd);
            }
            State::Calls if matches!(self.held.trim(), "" | ";") => self.held.clear(),
            _ => self.fall_back_to_text(&mut out),
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tools::fixtures::{call, check_fixtures, check_streams, LONG};

    fn parser() -> Box<dyn ToolParser> {
        Box::new(Llama3Parser::default())
    }

    #[test]
    fn fixtures_whole_and_split_at_every_position() {
        let weather = r#"{"name": "get_weather", "parameters": {"city": "Paris"}}"#;
        let time = r#"{"name": "get_time", "parameters": {}}"#;
        let paris = || call("get_weather", r#"{"city":"Paris"}"#);
        let cases: Vec<(String, Vec<Piece>)> = vec![
            (weather.into(), vec![paris()]),
            (format!("<|python_tag|>{weather}"), vec![paris()]),
            (format!(" \n{weather}; {time}\n"), vec![paris(), call("get_time", "{}")]),
            (format!("<|python_tag|>{weather};{time};"), vec![paris(), call("get_time", "{}")]),
            ("The weather is fine {not json}.".into(), vec![Piece::Text("The weather is fine {not json}.".into())]),
            (" {\"a\": 1} is JSON".into(), vec![Piece::Text(" {\"a\": 1} is JSON".into())]),
            // JSON that is no call, even with a `parameters` object: text, verbatim.
            (
                r#"{"title": "t", "parameters": {"a": 1}}"#.into(),
                vec![Piece::Text(r#"{"title": "t", "parameters": {"a": 1}}"#.into())],
            ),
            ("[{\"name\": \"f\"}]".into(), vec![Piece::Text("[{\"name\": \"f\"}]".into())]),
            (format!("{weather}; [1]"), vec![paris(), Piece::Text("; [1]".into())]),
            ("{\"name\": \"f\", \"parame".into(), vec![Piece::Text("{\"name\": \"f\", \"parame".into())]),
            (format!("{weather} and then"), vec![paris(), Piece::Text(" and then".into())]),
            ("<|python_ta".into(), vec![Piece::Text("<|python_ta".into())]),
            ("<|python_tag|>print(1)".into(), vec![Piece::Text("<|python_tag|>print(1)".into())]),
            ("{\"name\": \"é\"}".into(), vec![call("é", "{}")]),
            // Cut by the length limit inside the arguments: the call ends where the text did.
            ("{\"name\": \"f\", \"parameters\": {\"x\": [1, ".into(), vec![call("f", "{\"x\":[1,")]),
            // Keys after the arguments are dropped.
            ("{\"name\": \"f\", \"parameters\": {}, \"id\": \"}\"}".into(), vec![call("f", "{}")]),
            // Streamed (name first) or whole (parameters first), the arguments keep the
            // model's spelling of numbers and escapes.
            (
                r#"{"name": "f", "parameters": {"n": 1.50, "s": "\u00e9"}}; {"parameters": {"n": 1.50, "s": "\u00e9"}, "name": "f"}"#.into(),
                vec![call("f", r#"{"n":1.50,"s":"\u00e9"}"#), call("f", r#"{"n":1.50,"s":"\u00e9"}"#)],
            ),
        ];
        check_fixtures(parser, &cases);
    }

    #[test]
    fn single_and_joined_calls_stream_token_by_token() {
        let object = format!(r#"{{"name": "get_weather", "parameters": {{"city": "{LONG}", "days": [1, 2, 3]}}}}"#);
        let time = r#"{"name": "get_time", "parameters": {}}"#;
        for (text, call) in [
            (object.clone(), 0),
            (format!("<|python_tag|>{object}"), 0),
            (format!("{object}; {time}"), 0),
            (format!("{time}; {object}"), 1),
            (format!("<|python_tag|>{time};{object}"), 1),
        ] {
            let end = text.find(&object).unwrap() + object.len() - 1;
            check_streams(parser().as_mut(), &text, call, end);
        }
    }

    #[test]
    fn calls_begin_at_their_arguments_and_other_orders_go_out_whole() {
        let mut p = Llama3Parser::default();
        assert_eq!(p.push("{\"name\": \"f\", "), vec![]);
        assert_eq!(
            p.push("\"parameters\": {\"x\""),
            vec![Piece::CallBegin("f".into()), Piece::CallArgs("{\"x\"".into())]
        );
        assert_eq!(p.push(": 1 }"), vec![Piece::CallArgs(":1}".into())]);
        assert_eq!(p.push(" }"), vec![Piece::CallEnd]);
        assert_eq!(p.push(";"), vec![]);
        assert_eq!(p.push(" {\"parameters\": {}, "), vec![]);
        assert_eq!(p.push("\"name\": \"g\"}"), vec![call("g", "{}")]);
        assert!(p.finish().is_empty(), "a trailing separator is layout");
        let mut p = Llama3Parser::default();
        assert_eq!(p.push("Sure"), vec![Piece::Text("Sure".into())], "text is released at once");
    }
}
