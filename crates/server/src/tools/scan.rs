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
    let mut merged = Vec::new();
    for piece in out {
        match piece {
            super::Piece::Text(t) => super::push_text(&mut merged, t),
            c => merged.push(c),
        }
    }
    merged
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
            let mut merged = Vec::new();
            for piece in got {
                match piece {
                    super::Piece::Text(t) => super::push_text(&mut merged, t),
                    c => merged.push(c),
                }
            }
            assert_eq!(&merged, want, "{text:?} cut at {cut}");
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
}
