//! Small scanners the tool-call parsers share: how much of a text's end could still become a
//! tag, the first complete JSON value at the start of a text (or whether more text could
//! complete it), and a call read from a JSON object.

use serde_json::Value;

use super::ParsedCall;

/// The longest suffix of `s` that is a proper prefix of `tag` (where `s` may be cut).
pub(crate) fn partial_tag_len(s: &str, tag: &str) -> usize {
    (1..tag.len().min(s.len() + 1))
        .rev()
        .find(|&n| s.is_char_boundary(s.len() - n) && tag.starts_with(&s[s.len() - n..]))
        .unwrap_or(0)
}

/// What the start of a text holds as JSON.
#[derive(Debug, PartialEq)]
pub(crate) enum JsonPrefix {
    /// A complete value, and the bytes it spans (leading whitespace included).
    Complete(Value, usize),
    /// A value has begun and more text could complete it.
    Incomplete,
    /// The text does not start with a JSON value, whatever follows.
    Invalid,
}

/// The first JSON value at the start of `s` (after whitespace). Deterministic under any
/// split: a syntax error in a prefix is one in every longer text, and "incomplete" means
/// only that the text ended.
pub(crate) fn json_prefix(s: &str) -> JsonPrefix {
    let mut values = serde_json::Deserializer::from_str(s).into_iter::<Value>();
    match values.next() {
        Some(Ok(v)) => JsonPrefix::Complete(v, values.byte_offset()),
        Some(Err(e)) if e.is_eof() => JsonPrefix::Incomplete,
        None => JsonPrefix::Incomplete,
        Some(Err(_)) => JsonPrefix::Invalid,
    }
}

/// `{"name": "…", "arguments": {…}}` as a call: arguments may also come as a JSON string or
/// under `parameters` (Llama's key); absent arguments are `{}`.
pub(crate) fn call_of(v: Value) -> Option<ParsedCall> {
    let Value::Object(mut o) = v else { return None };
    let Value::String(name) = o.remove("name")? else { return None };
    let arguments = match o.remove("arguments").or_else(|| o.remove("parameters")) {
        None | Some(Value::Null) => "{}".to_string(),
        Some(Value::String(s)) => s,
        Some(v) => v.to_string(),
    };
    Some(ParsedCall { name, arguments })
}

/// How far the start of a call object `{"name": "…", "arguments": {` has come.
#[derive(Debug, PartialEq)]
pub(crate) enum CallHead {
    /// The text so far could still begin one.
    Incomplete,
    /// It does not (another key order, arguments that are not an object, not JSON).
    NoMatch,
    /// It does: the function's name, and the byte where the arguments object begins.
    Found(String, usize),
}

/// Reads the start of a call object in `s` (blank space allowed between tokens), up to its
/// arguments' opening brace.
pub(crate) fn call_head(s: &str) -> CallHead {
    fn blank(r: &str) -> &str {
        r.trim_start_matches([' ', '\t', '\n', '\r'])
    }
    // Consumes `lit` at the start of `r` (after blank space): the rest, or how it failed.
    fn literal<'a>(r: &'a str, lit: &str) -> Result<&'a str, CallHead> {
        let r = blank(r);
        match r.strip_prefix(lit) {
            Some(rest) => Ok(rest),
            None if lit.starts_with(r) => Err(CallHead::Incomplete),
            None => Err(CallHead::NoMatch),
        }
    }
    let step = || -> Result<(String, usize), CallHead> {
        let mut rest = literal(s, "{")?;
        rest = literal(rest, "\"name\"")?;
        rest = literal(rest, ":")?;
        rest = blank(rest);
        let name = match json_prefix(rest) {
            JsonPrefix::Complete(Value::String(name), n) => {
                rest = &rest[n..];
                name
            }
            JsonPrefix::Incomplete => return Err(CallHead::Incomplete),
            _ => return Err(CallHead::NoMatch),
        };
        rest = literal(rest, ",")?;
        rest = literal(rest, "\"arguments\"")?;
        rest = literal(rest, ":")?;
        rest = blank(rest);
        match rest.chars().next() {
            None => Err(CallHead::Incomplete),
            Some('{') => Ok((name, s.len() - rest.len())),
            Some(_) => Err(CallHead::NoMatch),
        }
    };
    match step() {
        Ok((name, at)) => CallHead::Found(name, at),
        Err(e) => e,
    }
}

/// Follows one JSON object as its text streams in: passes its characters on with the blank
/// space between tokens dropped (so the joined fragments are the object in compact form), and
/// says where it ends. Structure only — the text is known to be JSON (a grammar held it).
#[derive(Debug, Default)]
pub(crate) struct ObjectScan {
    depth: usize,
    in_string: bool,
    escaped: bool,
    /// The object's closing brace has been read.
    pub done: bool,
}

impl ObjectScan {
    /// Reads `text` (the object's next characters, its opening brace first), appending them
    /// to `out`; returns how many bytes it read: all of `text`, or up to the closing brace.
    pub(crate) fn feed(&mut self, text: &str, out: &mut String) -> usize {
        for (i, c) in text.char_indices() {
            if self.done {
                return i;
            }
            if self.in_string {
                out.push(c);
                match (self.escaped, c) {
                    (true, _) => self.escaped = false,
                    (false, '\\') => self.escaped = true,
                    (false, '"') => self.in_string = false,
                    _ => {}
                }
                continue;
            }
            match c {
                ' ' | '\t' | '\n' | '\r' => continue,
                '"' => self.in_string = true,
                '{' | '[' => self.depth += 1,
                '}' | ']' => self.depth = self.depth.saturating_sub(1),
                _ => {}
            }
            out.push(c);
            self.done = self.depth == 0;
        }
        text.len()
    }
}

/// `pieces` with adjacent text merged and each streamed call (begin, fragments, end) folded
/// into one [`Piece::Call`]: what a test compares.
#[cfg(test)]
pub(crate) fn merged(pieces: Vec<super::Piece>) -> Vec<super::Piece> {
    use super::Piece;
    let mut out = Vec::new();
    for piece in pieces {
        match piece {
            Piece::Text(t) => super::push_text(&mut out, t),
            Piece::CallBegin(name) => out.push(Piece::Call(ParsedCall { name, arguments: String::new() })),
            Piece::CallArgs(a) => match out.last_mut() {
                Some(Piece::Call(c)) => c.arguments.push_str(&a),
                other => panic!("arguments outside a call: {other:?}"),
            },
            Piece::CallEnd => {}
            c => out.push(c),
        }
    }
    out
}

/// Feeds `text` to a parser in chunks of `n` bytes (on char boundaries) and merges adjacent
/// text pieces: what a stream split at every `n`-th byte yields (tests of every family).
#[cfg(test)]
pub(crate) fn run_split(p: &mut dyn super::ToolParser, text: &str, n: usize) -> Vec<super::Piece> {
    let mut out = Vec::new();
    let mut rest = text;
    while !rest.is_empty() {
        let mut cut = n.min(rest.len());
        while !rest.is_char_boundary(cut) {
            cut += 1;
        }
        out.extend(p.push(&rest[..cut]));
        rest = &rest[cut..];
    }
    out.extend(p.finish());
    merged(out)
}

/// Checks a family's fixtures: each text, whole and split at every byte position, gives the
/// expected pieces.
#[cfg(test)]
pub(crate) fn check_fixtures(new: impl Fn() -> Box<dyn super::ToolParser>, cases: &[(String, Vec<super::Piece>)]) {
    for (text, want) in cases {
        for n in 1..=text.len().max(1) {
            assert_eq!(&run_split(new().as_mut(), text, n), want, "{text:?} in chunks of {n}");
        }
        // Two pieces cut at every byte position.
        for cut in (1..text.len()).filter(|&c| text.is_char_boundary(c)) {
            let mut p = new();
            let mut got = p.push(&text[..cut]);
            got.extend(p.push(&text[cut..]));
            got.extend(p.finish());
            assert_eq!(&merged(got), want, "{text:?} cut at {cut}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn json_prefixes() {
        assert_eq!(json_prefix(" {\"a\": 1} rest"), JsonPrefix::Complete(json!({"a": 1}), 9));
        assert_eq!(json_prefix("{\"a\": "), JsonPrefix::Incomplete);
        assert_eq!(json_prefix("   "), JsonPrefix::Incomplete);
        assert_eq!(json_prefix("{a"), JsonPrefix::Invalid);
        assert_eq!(json_prefix("[1, 2]; x"), JsonPrefix::Complete(json!([1, 2]), 6));
        assert_eq!(partial_tag_len("abc<to", "<tool_call>"), 3);
        assert_eq!(partial_tag_len("abc", "<tool_call>"), 0);
    }

    #[test]
    fn call_heads() {
        let full = r#"{"name": "f", "arguments": {"x": 1}}"#;
        let at = full.find("{\"x").unwrap();
        assert_eq!(call_head(full), CallHead::Found("f".into(), at));
        for n in 0..at {
            assert_eq!(call_head(&full[..n]), CallHead::Incomplete, "{:?}", &full[..n]);
        }
        let spaced = "{\n  \"name\":\"g\" ,\"arguments\" :{}";
        assert_eq!(call_head(spaced), CallHead::Found("g".into(), spaced.rfind('{').unwrap()));
        assert_eq!(call_head(r#"{"arguments": {}, "name": "f"}"#), CallHead::NoMatch);
        assert_eq!(call_head(r#"{"name": "f", "arguments": "{}"}"#), CallHead::NoMatch);
        assert_eq!(call_head(r#"{"name": 3"#), CallHead::NoMatch);
        assert_eq!(call_head("not json"), CallHead::NoMatch);
    }

    #[test]
    fn object_scan_compacts_and_finds_the_end() {
        let text = "{ \"a\": [1, {\"b\": \"} \\\" ]\"}], \"c\" : null }\n</tool_call>";
        let end = text.find('\n').unwrap();
        for n in 1..=text.len() {
            let (mut scan, mut out, mut read) = (ObjectScan::default(), String::new(), 0);
            for chunk in text.as_bytes().chunks(n) {
                let chunk = std::str::from_utf8(chunk).unwrap();
                read += scan.feed(chunk, &mut out);
                if scan.done {
                    break;
                }
            }
            assert!(scan.done);
            assert_eq!(read, end, "chunks of {n}");
            assert_eq!(out, r#"{"a":[1,{"b":"} \" ]"}],"c":null}"#);
        }
    }
}
