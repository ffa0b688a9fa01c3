//! The shape check of a tool's JSON Schema before anything compiles it: every keyword this
//! server's grammars read has the type JSON Schema gives it (`type` a type name or a list of
//! them, `properties` an object of schemas, `required` a list of strings, …), so a malformed
//! schema is a 400 naming the exact keyword (`tools[0].input_schema.properties.city.type`)
//! instead of a grammar compiler's message. Unknown keywords pass (schemas carry
//! `description`, `title`, `examples`, vendor keys); whether llguidance supports a keyword is
//! the backend's to say when it compiles the grammar.

use serde_json::Value;

use crate::error::ApiError;
use crate::params::kind_of;

/// Deepest nesting of sub-schemas checked (deeper is refused: no input may exhaust the stack).
const MAX_DEPTH: usize = 64;

const TYPES: &[&str] = &["object", "array", "string", "number", "integer", "boolean", "null"];

fn bad(at: &str, what: &str, got: &Value) -> ApiError {
    ApiError::invalid(at, format!("Invalid schema: '{at}' must be {what}, but got {}.", kind_of(got)))
        .with_code("invalid_value")
}

/// Checks `schema` (found at `at`); `Ok` when every known keyword is well-formed.
pub(crate) fn check(schema: &Value, at: &str) -> Result<(), ApiError> {
    check_at(schema, at, 0)
}

fn check_at(schema: &Value, at: &str, depth: usize) -> Result<(), ApiError> {
    if depth > MAX_DEPTH {
        return Err(ApiError::invalid(at, format!("Invalid schema: '{at}' nests deeper than {MAX_DEPTH} levels."))
            .with_code("invalid_value"));
    }
    let o = match schema {
        Value::Bool(_) => return Ok(()),
        Value::Object(o) => o,
        other => return Err(bad(at, "a schema (an object or a boolean)", other)),
    };
    for (key, v) in o {
        let here = format!("{at}.{key}");
        match key.as_str() {
            "type" => check_type(v, &here)?,
            "properties" | "patternProperties" | "$defs" | "definitions" => {
                let Value::Object(props) = v else { return Err(bad(&here, "an object of schemas", v)) };
                for (name, sub) in props {
                    check_at(sub, &format!("{here}.{name}"), depth + 1)?;
                }
            }
            "required" => {
                let strings = v.as_array().is_some_and(|a| a.iter().all(Value::is_string));
                if !strings {
                    return Err(bad(&here, "an array of property names", v));
                }
            }
            "items" | "additionalProperties" | "not" | "contains" | "propertyNames" | "additionalItems" => match v {
                Value::Array(items) if key == "items" => {
                    for (i, sub) in items.iter().enumerate() {
                        check_at(sub, &format!("{here}[{i}]"), depth + 1)?;
                    }
                }
                _ => check_at(v, &here, depth + 1)?,
            },
            "anyOf" | "oneOf" | "allOf" | "prefixItems" => {
                let Some(items) = v.as_array().filter(|a| !a.is_empty()) else {
                    return Err(bad(&here, "a non-empty array of schemas", v));
                };
                for (i, sub) in items.iter().enumerate() {
                    check_at(sub, &format!("{here}[{i}]"), depth + 1)?;
                }
            }
            "enum" if !v.is_array() => return Err(bad(&here, "an array", v)),
            "minimum" | "maximum" | "exclusiveMinimum" | "exclusiveMaximum" | "multipleOf" if !v.is_number() => {
                return Err(bad(&here, "a number", v))
            }
            "minLength" | "maxLength" | "minItems" | "maxItems" | "minProperties" | "maxProperties" if !v.is_u64() => {
                return Err(bad(&here, "a non-negative integer", v))
            }
            "pattern" | "format" | "$ref" if !v.is_string() => return Err(bad(&here, "a string", v)),
            _ => {}
        }
    }
    Ok(())
}

fn check_type(v: &Value, at: &str) -> Result<(), ApiError> {
    let known = |t: &Value| t.as_str().is_some_and(|s| TYPES.contains(&s));
    let ok = match v {
        Value::String(_) => known(v),
        Value::Array(ts) => !ts.is_empty() && ts.iter().all(known),
        _ => false,
    };
    if ok {
        Ok(())
    } else {
        Err(ApiError::invalid(
            at,
            format!("Invalid schema: '{at}' must be one of {} (or a list of them), but got {v}.", TYPES.join(", ")),
        )
        .with_code("invalid_value"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn well_formed_schemas_pass() {
        let s = json!({"type": "object", "title": "x", "x-vendor": 1, "properties": {
            "city": {"type": "string", "description": "a city", "minLength": 1, "pattern": "^[A-Z]"},
            "unit": {"enum": ["c", "f"]},
            "tags": {"type": "array", "items": {"type": ["string", "null"]}, "maxItems": 3},
            "n": {"anyOf": [{"type": "integer", "minimum": 0}, true]},
        }, "required": ["city"], "additionalProperties": false, "$defs": {"a": {"type": "null"}}});
        check(&s, "p").unwrap();
        check(&json!({}), "p").unwrap();
    }

    #[test]
    fn malformed_keywords_are_named() {
        for (schema, param) in [
            (json!({"type": "dict"}), "p.type"),
            (json!({"type": []}), "p.type"),
            (json!({"properties": []}), "p.properties"),
            (json!({"properties": {"city": {"type": 5}}}), "p.properties.city.type"),
            (json!({"properties": {"city": "string"}}), "p.properties.city"),
            (json!({"required": "city"}), "p.required"),
            (json!({"items": {"type": "text"}}), "p.items.type"),
            (json!({"items": [{"type": "text"}]}), "p.items[0].type"),
            (json!({"anyOf": []}), "p.anyOf"),
            (json!({"enum": "a"}), "p.enum"),
            (json!({"minimum": "0"}), "p.minimum"),
            (json!({"maxLength": -1}), "p.maxLength"),
            (json!({"additionalProperties": 3}), "p.additionalProperties"),
        ] {
            let e = check(&schema, "p").unwrap_err();
            assert_eq!((e.status.as_u16(), e.param.as_deref()), (400, Some(param)), "{schema}");
        }
        let mut deep = json!({"type": "string"});
        for _ in 0..100 {
            deep = json!({"items": deep});
        }
        assert!(check(&deep, "p").is_err(), "too deep is refused, not a stack overflow");
    }
}
