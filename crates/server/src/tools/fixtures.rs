//! What the tool-call parsers' tests share: feeding a text in pieces, folding the pieces that
//! come out into text and whole calls (checking that streamed calls are well formed), and the
//! checks every family runs on its fixtures.

use super::{push_text, ParsedCall, Piece, ToolParser};

/// `pieces` with adjacent text merged and each streamed call (begin, fragments, end) folded
/// into one [`Piece::Call`]: what a test compares. Panics on a malformed stream: fragments or
/// an end outside a streamed call, text or another call inside one, a call never ended.
pub(crate) fn merged(pieces: Vec<Piece>) -> Vec<Piece> {
    let (mut out, mut open) = (Vec::new(), false);
    for piece in pieces {
        match piece {
            Piece::Text(t) => {
                assert!(!open, "text {t:?} inside a streamed call");
                push_text(&mut out, t);
            }
            Piece::Call(call) => {
                assert!(!open, "call {call:?} inside a streamed call");
                out.push(Piece::Call(call));
            }
            Piece::CallBegin(name) => {
                assert!(!open, "call {name:?} begun inside a streamed call");
                open = true;
                out.push(Piece::Call(ParsedCall { name, arguments: String::new() }));
            }
            Piece::CallArgs(a) => match out.last_mut() {
                Some(Piece::Call(c)) if open => c.arguments.push_str(&a),
                _ => panic!("arguments {a:?} outside a streamed call"),
            },
            Piece::CallEnd => {
                assert!(open, "a call end outside a streamed call");
                open = false;
            }
        }
    }
    assert!(!open, "a streamed call never ended");
    out
}

/// The pieces a parser yields for `text` fed in chunks of `n` bytes (on char boundaries),
/// then its end, in order and unmerged.
fn pieces_split(p: &mut dyn ToolParser, text: &str, n: usize) -> Vec<Piece> {
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
    out
}

/// What a stream split at every `n`-th byte yields, merged.
pub(crate) fn run_split(p: &mut dyn ToolParser, text: &str, n: usize) -> Vec<Piece> {
    merged(pieces_split(p, text, n))
}

/// Checks a family's fixtures: each text, whole and in chunks of every size, and cut in two
/// at every byte position, gives the expected pieces (streamed calls folded into whole ones).
pub(crate) fn check_fixtures(new: impl Fn() -> Box<dyn ToolParser>, cases: &[(String, Vec<Piece>)]) {
    for (text, want) in cases {
        for n in 1..=text.len().max(1) {
            assert_eq!(&run_split(new().as_mut(), text, n), want, "{text:?} in chunks of {n}");
        }
        for cut in (1..text.len()).filter(|&c| text.is_char_boundary(c)) {
            let mut p = new();
            let mut got = p.push(&text[..cut]);
            got.extend(p.push(&text[cut..]));
            got.extend(p.finish());
            assert_eq!(&merged(got), want, "{text:?} cut at {cut}");
        }
    }
}

/// Checks that call `call` (counting calls in order, whole or streamed) of `text` streams
/// when the text comes 3 bytes at a time, about a token's worth: the call begins, and its
/// arguments come in more than one fragment, before byte `end` (the call's closing brace)
/// has been pushed.
pub(crate) fn check_streams(p: &mut dyn ToolParser, text: &str, call: usize, end: usize) {
    let (mut calls, mut fragments, mut pushed, mut begun) = (0, 0, 0, false);
    let mut rest = text;
    while !rest.is_empty() {
        let mut cut = 3.min(rest.len());
        while !rest.is_char_boundary(cut) {
            cut += 1;
        }
        let pieces = p.push(&rest[..cut]);
        pushed += cut;
        rest = &rest[cut..];
        for piece in pieces {
            match piece {
                Piece::Call(c) => {
                    assert_ne!(calls, call, "call {c:?} of {text:?} went out whole");
                    calls += 1;
                }
                Piece::CallBegin(_) => {
                    if calls == call {
                        assert!(pushed <= end, "call {call} of {text:?} began only after byte {end}");
                        begun = true;
                    }
                    calls += 1;
                }
                Piece::CallArgs(_) if begun && calls == call + 1 && pushed <= end => fragments += 1,
                _ => {}
            }
        }
    }
    assert!(begun, "call {call} of {text:?} never began");
    assert!(fragments > 1, "call {call} of {text:?}: {fragments} argument fragment(s) before byte {end}");
}

/// A whole call, as the fixtures expect it.
pub(crate) fn call(name: &str, arguments: &str) -> Piece {
    Piece::Call(ParsedCall { name: name.into(), arguments: arguments.into() })
}

/// A long argument value: enough text that its call's arguments span several 3-byte pushes.
pub(crate) const LONG: &str = "Paris, the capital of France, on the Seine";

/// Texts made of what the parsers look for, drawn by a fixed pseudo-random sequence: call
/// objects (either key order, declared names or not, names and arguments holding closing
/// tags, fences and braces in strings, some cut short) between each family's openers and
/// closers, and plain text.
fn random_texts(count: usize) -> Vec<String> {
    const OPENERS: &[&str] = &[
        "",
        "<tool_call>",
        "```json\n",
        "[TOOL_CALLS]",
        "[TOOL_CALLS][",
        "[",
        "<|python_tag|>",
        "Hi ",
        "get_weather",
        "get_weather[ARGS]",
        "f",
        "é",
    ];
    const CLOSERS: &[&str] = &["", "</tool_call>", "\n```", "]", "; ", ", ", "\n", "}", " Hi"];
    const NAMES: &[&str] = &["get_weather", "f", "Ada", "``` </tool_call>", "a\\\"}"];
    const KEYS: &[&str] = &["arguments", "parameters", "args"];
    const ARGS: &[&str] =
        &["{}", "{\"x\": 1.50}", "{\"s\": \"``` } </tool_call>\", \"l\": [1, {}]}", "\"{}\"", "[1]", "null"];
    let mut state = 0x2545_f491_4f6c_dd1du64;
    let mut next = move |n: usize| {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        (state >> 32) as usize % n
    };
    let mut texts = Vec::with_capacity(count);
    for _ in 0..count {
        let mut text = String::new();
        for _ in 0..1 + next(3) {
            text.push_str(OPENERS[next(OPENERS.len())]);
            let name = format!("\"name\": \"{}\"", NAMES[next(NAMES.len())]);
            let args = format!("\"{}\": {}", KEYS[next(KEYS.len())], ARGS[next(ARGS.len())]);
            let mut object = match next(4) {
                0 => format!("{{{args}, {name}}}"),
                1 => format!("{{{name}, {args}, \"id\": 7}}"),
                2 => ARGS[next(ARGS.len())].to_string(),
                _ => format!("{{{name}, {args}}}"),
            };
            if next(4) == 0 {
                let mut cut = next(object.len());
                while !object.is_char_boundary(cut) {
                    cut -= 1;
                }
                object.truncate(cut);
            }
            text.push_str(&object);
            text.push_str(CLOSERS[next(CLOSERS.len())]);
        }
        texts.push(text);
    }
    texts
}

#[test]
fn every_family_decides_any_text_the_same_under_any_split() {
    use super::{parser, CallSyntax};
    use crate::backend::ToolCallFormat;
    let formats = [
        ToolCallFormat::Hermes,
        ToolCallFormat::Llama3Json,
        ToolCallFormat::Mistral { args: false, tool_calls: None, args_token: None },
        ToolCallFormat::Mistral { args: true, tool_calls: None, args_token: None },
    ];
    for format in formats {
        let syntax = CallSyntax { format, names: vec!["get_weather".into(), "f".into()] };
        for text in random_texts(1500) {
            let whole = run_split(parser(&syntax).as_mut(), &text, text.len());
            for n in 1..text.len() {
                assert_eq!(
                    run_split(parser(&syntax).as_mut(), &text, n),
                    whole,
                    "{format:?}: {text:?} in chunks of {n}"
                );
            }
        }
    }
}
