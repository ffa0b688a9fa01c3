//! The Llama 3.x JSON tool-call convention: a reply that is a call is the JSON object
//! `{"name": "…", "parameters": {…}}` — several joined by `;` — optionally after
//! `<|python_tag|>` (a special token: its text prints only when special tokens are printed).
//! A reply that begins with anything else is text, whole (the convention puts calls only at
//! the start, as vLLM's `llama3_json` parser reads it).
//!
//! [`Llama3Parser`] holds the start of the output until it is decided: leading whitespace, a
//! (partial) `<|python_tag|>`, a JSON object still open. Each complete object that is a call
//! goes out at once; a complete value that is not a call, or text after a call that is not
//! another call, turns the rest of the output into text.

use super::scan::{call_of, json_prefix, partial_tag_len, JsonPrefix};
use super::{push_text, Piece, ToolParser};

const PYTHON_TAG: &str = "<|python_tag|>";

#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Nothing but whitespace (and perhaps the python tag) so far, or `;` after a call.
    #[default]
    Start,
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
    /// Text consumed but not yet decided (the python tag), given back if the output turns
    /// out to be text.
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
            match self.state {
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
                    if !self.read_call(out) {
                        return;
                    }
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

    /// Reads the call at the start of `held`; false when more text is needed.
    fn read_call(&mut self, out: &mut Vec<Piece>) -> bool {
        match json_prefix(&self.held) {
            JsonPrefix::Incomplete => false,
            JsonPrefix::Invalid => {
                self.fall_back_to_text(out);
                true
            }
            JsonPrefix::Complete(v, end) => match call_of(v) {
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
        if self.state == State::Calls && matches!(self.held.trim(), "" | ";") {
            self.held.clear();
        } else {
            self.fall_back_to_text(&mut out);
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tools::scan::check_fixtures;
    use crate::tools::ParsedCall;

    fn call(name: &str, arguments: &str) -> Piece {
        Piece::Call(ParsedCall { name: name.into(), arguments: arguments.into() })
    }

    #[test]
    fn fixtures_whole_and_split_at_every_position() {
        let weather = r#"{"name": "get_weather", "parameters": {"city": "Paris"}}"#;
        let cases: Vec<(String, Vec<Piece>)> = vec![
            (weather.into(), vec![call("get_weather", r#"{"city":"Paris"}"#)]),
            (format!("<|python_tag|>{weather}"), vec![call("get_weather", r#"{"city":"Paris"}"#)]),
            (
                format!(" \n{weather}; {{\"name\": \"get_time\", \"parameters\": {{}}}}\n"),
                vec![call("get_weather", r#"{"city":"Paris"}"#), call("get_time", "{}")],
            ),
            ("The weather is fine {not json}.".into(), vec![Piece::Text("The weather is fine {not json}.".into())]),
            (" {\"a\": 1} is JSON".into(), vec![Piece::Text(" {\"a\": 1} is JSON".into())]),
            ("{\"name\": \"f\", \"parame".into(), vec![Piece::Text("{\"name\": \"f\", \"parame".into())]),
            (
                format!("{weather} and then"),
                vec![call("get_weather", r#"{"city":"Paris"}"#), Piece::Text(" and then".into())],
            ),
            ("<|python_ta".into(), vec![Piece::Text("<|python_ta".into())]),
            ("<|python_tag|>print(1)".into(), vec![Piece::Text("<|python_tag|>print(1)".into())]),
            ("{\"name\": \"é\"}".into(), vec![call("é", "{}")]),
        ];
        check_fixtures(|| Box::new(Llama3Parser::default()), &cases);
    }

    #[test]
    fn calls_go_out_as_soon_as_they_are_complete() {
        let mut p = Llama3Parser::default();
        assert_eq!(p.push("{\"name\": \"f\", "), vec![]);
        assert_eq!(p.push("\"parameters\": {}}"), vec![call("f", "{}")]);
        assert_eq!(p.push(";"), vec![]);
        assert!(p.finish().is_empty(), "a trailing separator is layout");
        let mut p = Llama3Parser::default();
        assert_eq!(p.push("Sure"), vec![Piece::Text("Sure".into())], "text is released at once");
    }
}
