//! Small scanners the tool-call parsers share: how much of a text's end could still become a
//! tag, the first complete JSON value at the start of a text (or whether more text could
//! complete it), a call read whole from a JSON object, the start of a call object up to its
//! arguments (where a call is known to be one), and a call's arguments streamed as they come.

use serde_json::Value;

use super::{ParsedCall, Piece};

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

/// `{"name": "…", "arguments": {…}}` as a call (`raw`: the text of one complete JSON value):
/// arguments may also come as a JSON string or under `parameters` (Llama's key); absent
/// arguments are `{}`. As serde_json reads an object, a repeated key counts by its last value.
/// The arguments are their own text compacted ([`compact`]) — not re-serialized — so that a
/// call decided whole carries exactly the text the same call streamed by [`StreamedCall`] would.
pub(crate) fn call_of(raw: &str) -> Option<ParsedCall> {
    let fields = members(raw)?;
    let last = |key: &str| fields.iter().rev().find(|(k, _)| k == key).map(|&(_, v)| v);
    let name = serde_json::from_str::<String>(last("name")?).ok()?;
    let arguments = match last("arguments").or_else(|| last("parameters")) {
        None => "{}".to_string(),
        Some(v) => match serde_json::from_str::<Value>(v).ok()? {
            Value::Null => "{}".to_string(),
            Value::String(s) => s,
            _ => compact(v),
        },
    };
    Some(ParsedCall { name, arguments })
}

/// The members of the JSON object whose text is `raw`, in order: each key, and its value's
/// text. `None` when `raw` is not an object (or not JSON).
fn members(raw: &str) -> Option<Vec<(String, &str)>> {
    let mut rest = raw.trim_start().strip_prefix('{')?;
    let mut out = Vec::new();
    loop {
        rest = rest.trim_start();
        if rest.starts_with('}') {
            return Some(out);
        }
        if !out.is_empty() {
            rest = rest.strip_prefix(',')?;
        }
        let JsonPrefix::Complete(Value::String(key), n) = json_prefix(rest) else { return None };
        rest = rest[n..].trim_start().strip_prefix(':')?;
        let (value, n) = value_text(rest)?;
        rest = &rest[n..];
        out.push((key, value));
    }
}

/// The elements of the JSON array whose text is `raw`, each as its text. `None` when `raw` is
/// not an array (or not JSON).
pub(crate) fn elements(raw: &str) -> Option<Vec<&str>> {
    let mut rest = raw.trim_start().strip_prefix('[')?;
    let mut out = Vec::new();
    loop {
        rest = rest.trim_start();
        if rest.starts_with(']') {
            return Some(out);
        }
        if !out.is_empty() {
            rest = rest.strip_prefix(',')?;
        }
        let (value, n) = value_text(rest)?;
        rest = &rest[n..];
        out.push(value);
    }
}

/// The text of the complete JSON value at the start of `s` (leading blank space excluded),
/// and the bytes it spans (leading blank space included).
fn value_text(s: &str) -> Option<(&str, usize)> {
    let JsonPrefix::Complete(_, n) = json_prefix(s) else { return None };
    Some((s[..n].trim_start(), n))
}

/// How far the start of a call object `{"name": "…", "arguments": {` has come.
#[derive(Debug, PartialEq)]
pub(crate) enum CallHead {
    /// The text so far could still begin one (it is a prefix of a JSON text).
    Incomplete,
    /// It does not (another key order, arguments that are not an object, not JSON).
    NoMatch,
    /// It does: the function's name, and the byte where the arguments object begins.
    Found(String, usize),
}

/// Reads the start of a call object in `s` (blank space allowed between tokens), up to its
/// arguments' opening brace; the arguments' key is `arguments` or `parameters`.
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
    // Consumes a JSON string at the start of `r` (after blank space): its value and the rest.
    fn string(r: &str) -> Result<(String, &str), CallHead> {
        let r = blank(r);
        match json_prefix(r) {
            JsonPrefix::Complete(Value::String(v), n) => Ok((v, &r[n..])),
            JsonPrefix::Incomplete if r.starts_with('"') => Err(CallHead::Incomplete),
            JsonPrefix::Incomplete if r.is_empty() => Err(CallHead::Incomplete),
            _ => Err(CallHead::NoMatch),
        }
    }
    let step = || -> Result<(String, usize), CallHead> {
        let mut rest = literal(s, "{")?;
        let (key, after) = string(rest)?;
        if key != "name" {
            return Err(CallHead::NoMatch);
        }
        rest = literal(after, ":")?;
        let (name, after) = string(rest)?;
        rest = literal(after, ",")?;
        let (key, after) = string(rest)?;
        if key != "arguments" && key != "parameters" {
            return Err(CallHead::NoMatch);
        }
        rest = literal(after, ":")?;
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

/// `raw` (the text of a JSON value) without the blank space between its tokens: how a call's
/// arguments are given, streamed or whole.
pub(crate) fn compact(raw: &str) -> String {
    let mut strings = Strings::default();
    raw.chars().filter(|&c| strings.inside(c) || !is_blank(c)).collect()
}

fn is_blank(c: char) -> bool {
    matches!(c, ' ' | '\t' | '\n' | '\r')
}

/// Where a JSON text's characters fall: inside a string (its quotes included) or not.
#[derive(Debug, Default)]
struct Strings {
    in_string: bool,
    escaped: bool,
}

impl Strings {
    /// Reads the next character: whether it belongs to a string (its quotes included).
    fn inside(&mut self, c: char) -> bool {
        if self.in_string {
            match (self.escaped, c) {
                (true, _) => self.escaped = false,
                (false, '\\') => self.escaped = true,
                (false, '"') => self.in_string = false,
                _ => {}
            }
            true
        } else {
            self.in_string = c == '"';
            self.in_string
        }
    }
}

/// Follows one JSON object as its text streams in: passes its characters on with the blank
/// space between tokens dropped (so the joined fragments are the object in compact form, as
/// [`compact`] gives it), and says where it ends. Structure only — what it reads is taken to
/// be JSON (the text was already decided to be a call's).
#[derive(Debug, Default)]
struct ObjectScan {
    depth: usize,
    strings: Strings,
    /// The object's closing brace has been read.
    done: bool,
}

impl ObjectScan {
    /// A scan of the rest of an object whose opening brace has already been read.
    fn inside() -> ObjectScan {
        ObjectScan { depth: 1, ..ObjectScan::default() }
    }

    /// Reads `text` (the object's next characters, its opening brace first), appending them
    /// to `out`; returns how many bytes it read: all of `text`, or up to the closing brace.
    fn feed(&mut self, text: &str, out: &mut String) -> usize {
        for (i, c) in text.char_indices() {
            if self.done {
                return i;
            }
            if self.strings.inside(c) {
                out.push(c);
                continue;
            }
            match c {
                c if is_blank(c) => continue,
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

/// A call going out as it is generated, once its name is known: its arguments object (as
/// fragments, compacted), then — when the arguments are a member of a call object — the rest
/// of that object up to its closing brace, read and dropped (keys after the arguments are
/// not part of the call).
#[derive(Debug)]
pub(crate) struct StreamedCall {
    arguments: ObjectScan,
    /// The rest of the call object around the arguments, once they are read (`None`: the
    /// arguments object is all there is, as in Mistral's `name[ARGS]{…}`).
    rest: Option<ObjectScan>,
}

impl StreamedCall {
    /// A call whose arguments object begins the next text; `in_object`: the arguments are a
    /// member of a call object (`{"name": …, "arguments": {…}}`).
    pub(crate) fn new(in_object: bool) -> StreamedCall {
        StreamedCall { arguments: ObjectScan::default(), rest: in_object.then(ObjectScan::inside) }
    }

    /// Reads the call's next text: what it holds of the arguments goes to `out` as one
    /// [`Piece::CallArgs`], and [`Piece::CallEnd`] follows once the call is over. Returns the
    /// bytes read (all of `text`, or up to the end of the call) and whether the call is over.
    pub(crate) fn feed(&mut self, text: &str, out: &mut Vec<Piece>) -> (usize, bool) {
        let mut read = 0;
        if !self.arguments.done {
            let mut fragment = String::new();
            read = self.arguments.feed(text, &mut fragment);
            if !fragment.is_empty() {
                out.push(Piece::CallArgs(fragment));
            }
            if !self.arguments.done {
                return (read, false);
            }
        }
        if let Some(rest) = self.rest.as_mut() {
            read += rest.feed(&text[read..], &mut String::new());
            if !rest.done {
                return (read, false);
            }
        }
        out.push(Piece::CallEnd);
        (read, true)
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
        let llama = r#"{"name": "f", "parameters": {}}"#;
        assert_eq!(call_head(llama), CallHead::Found("f".into(), llama.rfind("{}").unwrap()));
        assert_eq!(call_head(r#"{"name": "f", "params": {}}"#), CallHead::NoMatch);
        assert_eq!(call_head(r#"{"title": "f""#), CallHead::NoMatch);
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

    #[test]
    fn whole_calls_carry_their_arguments_text_compacted() {
        let text = r#"{ "name" : "f", "arguments" : { "n" : 1.50, "e": 1E3, "s": "\u00e9 \" } x", "a": [ ] } }"#;
        let args = r#"{"n":1.50,"e":1E3,"s":"\u00e9 \" } x","a":[]}"#;
        assert_eq!(call_of(text), Some(ParsedCall { name: "f".into(), arguments: args.into() }));
        // The same text streamed by the object scan, in pieces of every size.
        let start = text.find("{ \"n\"").unwrap();
        for n in 1..text.len() - start {
            let (mut scan, mut out) = (ObjectScan::default(), String::new());
            for chunk in text.as_bytes()[start..].chunks(n) {
                scan.feed(std::str::from_utf8(chunk).unwrap(), &mut out);
            }
            assert_eq!(out, args, "chunks of {n}");
        }
        let call = |t: &str| call_of(t).map(|c| (c.name, c.arguments));
        assert_eq!(call(r#"{"name": "f", "parameters": [1, 2]}"#), Some(("f".into(), "[1,2]".into())));
        assert_eq!(call(r#"{"name": "f", "arguments": "{\"x\": 1}"}"#), Some(("f".into(), r#"{"x": 1}"#.into())));
        assert_eq!(call(r#"{"name": "f", "arguments": null}"#), Some(("f".into(), "{}".into())));
        assert_eq!(
            call(r#"{"name": "f", "name": "g", "arguments": {}, "arguments": {"b": 2}}"#),
            Some(("g".into(), r#"{"b":2}"#.into()))
        );
        assert_eq!(call(r#"{"name": 1}"#), None);
        assert_eq!(call(r#"[{"name": "f"}]"#), None);
        assert_eq!(elements(r#"[ {"a": [1]} , 2,"x" ]"#), Some(vec![r#"{"a": [1]}"#, "2", r#""x""#]));
        assert_eq!(elements("[]"), Some(vec![]));
        assert_eq!(compact("[ 1 ,\n\t\"a b\" ]"), "[1,\"a b\"]");
    }

    #[test]
    fn a_streamed_call_ends_with_its_object_and_drops_the_keys_after_its_arguments() {
        let text = "{\"x\": \"}\"} , \"id\": {\"k\": \"}\"} }; rest";
        let (mut call, mut out) = (StreamedCall::new(true), Vec::new());
        let (read, over) = call.feed(text, &mut out);
        assert!(over);
        assert_eq!(&text[read..], "; rest");
        assert_eq!(out, vec![Piece::CallArgs("{\"x\":\"}\"}".into()), Piece::CallEnd]);
        let (mut call, mut out) = (StreamedCall::new(false), Vec::new());
        assert_eq!(call.feed("{ } rest", &mut out), (3, true));
        assert_eq!(out, vec![Piece::CallArgs("{}".into()), Piece::CallEnd]);
    }
}
