//! The `tojson` filter as Hugging Face's chat-template environment defines it:
//! `json.dumps(x, ensure_ascii=False, indent=indent, separators=separators,
//! sort_keys=sort_keys)`.
//!
//! minijinja's built-in `tojson` escapes `<`, `>`, `&` and `'` for HTML and prints compact
//! separators, so a tool schema would render differently from Python; templates that embed
//! tool definitions need this one to produce the prompt the model was trained on.
//! Keys keep their insertion order (Python dicts are ordered) unless `sort_keys=true`.

use minijinja::value::{Kwargs, Value, ValueKind};
use minijinja::{Error, ErrorKind};

/// Formatting options, named as in Python's `json.dumps`.
struct JsonStyle {
    indent: Option<String>, // None: one line
    item_sep: String,       // ", " on one line, "," when indented
    key_sep: String,        // ": "
    sort_keys: bool,
    ensure_ascii: bool,
}

/// `{{ value | tojson(indent=2, separators=(",", ":"), sort_keys=true, ensure_ascii=false) }}`.
pub fn tojson(value: Value, kwargs: Kwargs) -> Result<Value, Error> {
    let indent = match kwargs.get::<Option<Value>>("indent")? {
        None => None,
        Some(v) if v.is_none() || v.is_undefined() => None,
        Some(v) if v.is_integer() => {
            let n = v.as_i64().unwrap_or(0).max(0) as usize;
            Some(" ".repeat(n))
        }
        Some(v) => match v.as_str() {
            Some(s) => Some(s.to_owned()),
            None => return Err(invalid("tojson: indent must be an integer or a string")),
        },
    };
    let (item_sep, key_sep) = match kwargs.get::<Option<Vec<String>>>("separators")? {
        Some(seps) if seps.len() == 2 => (seps[0].clone(), seps[1].clone()),
        Some(_) => return Err(invalid("tojson: separators must be a pair of strings")),
        None if indent.is_some() => (",".to_owned(), ": ".to_owned()),
        None => (", ".to_owned(), ": ".to_owned()),
    };
    let style = JsonStyle {
        indent,
        item_sep,
        key_sep,
        sort_keys: kwargs.get::<Option<bool>>("sort_keys")?.unwrap_or(false),
        ensure_ascii: kwargs.get::<Option<bool>>("ensure_ascii")?.unwrap_or(false),
    };
    kwargs.assert_all_used()?;
    let mut out = String::new();
    write_value(&mut out, &value, &style, 0)?;
    Ok(Value::from_safe_string(out))
}

fn invalid(msg: &str) -> Error {
    Error::new(ErrorKind::InvalidOperation, msg.to_owned())
}

fn write_value(out: &mut String, v: &Value, style: &JsonStyle, depth: usize) -> Result<(), Error> {
    if depth > 64 {
        return Err(invalid("tojson: value nested deeper than 64 levels"));
    }
    match v.kind() {
        ValueKind::Undefined | ValueKind::None => out.push_str("null"),
        ValueKind::Bool => out.push_str(if v.is_true() { "true" } else { "false" }),
        ValueKind::Number => write_number(out, v),
        ValueKind::String => write_string(out, v.as_str().unwrap_or_default(), style),
        ValueKind::Seq | ValueKind::Iterable => {
            let items: Vec<Value> = v.try_iter()?.collect();
            write_container(out, '[', ']', items.len(), style, depth, |out, i| {
                write_value(out, &items[i], style, depth + 1)
            })?;
        }
        ValueKind::Map => {
            let mut keys: Vec<Value> = v.try_iter()?.collect();
            if style.sort_keys {
                keys.sort_by_key(key_text);
            }
            let mut entries = Vec::with_capacity(keys.len());
            for k in keys {
                let item = v.get_item(&k)?;
                entries.push((key_text(&k), item));
            }
            write_container(out, '{', '}', entries.len(), style, depth, |out, i| {
                write_string(out, &entries[i].0, style);
                out.push_str(&style.key_sep);
                write_value(out, &entries[i].1, style, depth + 1)
            })?;
        }
        _ => write_string(out, &v.to_string(), style),
    }
    Ok(())
}

/// Python turns non-string dict keys into strings (`1` → `"1"`, `True` → `"true"`).
fn key_text(k: &Value) -> String {
    match k.kind() {
        ValueKind::String => k.as_str().unwrap_or_default().to_owned(),
        ValueKind::Bool => (if k.is_true() { "true" } else { "false" }).to_owned(),
        ValueKind::None | ValueKind::Undefined => "null".to_owned(),
        _ => k.to_string(),
    }
}

fn write_container(
    out: &mut String,
    open: char,
    close: char,
    len: usize,
    style: &JsonStyle,
    depth: usize,
    mut item: impl FnMut(&mut String, usize) -> Result<(), Error>,
) -> Result<(), Error> {
    out.push(open);
    if len == 0 {
        out.push(close);
        return Ok(());
    }
    for i in 0..len {
        if i > 0 {
            out.push_str(&style.item_sep);
        }
        if let Some(ind) = &style.indent {
            out.push('\n');
            out.push_str(&ind.repeat(depth + 1));
        }
        item(out, i)?;
    }
    if let Some(ind) = &style.indent {
        out.push('\n');
        out.push_str(&ind.repeat(depth));
    }
    out.push(close);
    Ok(())
}

fn write_number(out: &mut String, v: &Value) {
    if v.is_integer() {
        out.push_str(&v.to_string());
        return;
    }
    match f64::try_from(v.clone()) {
        Ok(f) if f.is_nan() => out.push_str("NaN"),
        Ok(f) if f.is_infinite() => out.push_str(if f > 0.0 { "Infinity" } else { "-Infinity" }),
        // Rust's `{:?}` is a shortest round-trip repr like Python's (`1.0`, `0.1`).
        Ok(f) => out.push_str(&format!("{f:?}")),
        Err(_) => out.push_str(&v.to_string()),
    }
}

fn write_string(out: &mut String, s: &str, style: &JsonStyle) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c if style.ensure_ascii && !c.is_ascii() => {
                let mut buf = [0u16; 2];
                for unit in c.encode_utf16(&mut buf) {
                    out.push_str(&format!("\\u{unit:04x}"));
                }
            }
            c => out.push(c),
        }
    }
    out.push('"');
}
