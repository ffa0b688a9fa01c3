//! OpenAI's `response_format`: `{"type": "text"}` (free text), `{"type": "json_object"}` (any
//! JSON object) or `{"type": "json_schema", "json_schema": {"name", "schema", "strict",
//! "description"}}`, parsed into the [`Grammar`] the backend constrains decoding with.
//!
//! Shapes are checked here (each error names the field); whether a schema can be compiled is
//! the backend's to say, and its refusal comes back as a 400 naming
//! `response_format.json_schema.schema` ([`SCHEMA_PARAM`]).

use serde_json::Value;

use crate::backend::Grammar;
use crate::error::ApiError;
use crate::params::{kind_of, Fields};

/// The field a schema the backend refuses is reported under.
pub(crate) const SCHEMA_PARAM: &str = "response_format.json_schema.schema";

/// Longest `json_schema.name` (OpenAI's limit).
const MAX_NAME: usize = 64;

fn invalid(param: &str, message: String) -> ApiError {
    ApiError::invalid(param, message).with_code("invalid_value")
}

/// Reads `response_format`: `None` for absent or `text`.
pub(crate) fn response_format(f: &mut Fields) -> Result<Option<Grammar>, ApiError> {
    const P: &str = "response_format";
    let Some(v) = f.take(P) else { return Ok(None) };
    let Value::Object(mut o) = v else {
        return Err(invalid(P, format!("Invalid type for '{P}': expected an object, but got {}.", kind_of(&v))));
    };
    let kind = match o.remove("type") {
        Some(Value::String(t)) => t,
        None | Some(Value::Null) => {
            return Err(invalid("response_format.type", "'response_format.type' is required.".into()))
        }
        Some(v) => {
            return Err(invalid(
                "response_format.type",
                format!("Invalid type for 'response_format.type': expected a string, but got {}.", kind_of(&v)),
            ))
        }
    };
    match kind.as_str() {
        "text" => Ok(None),
        "json_object" => Ok(Some(Grammar::JsonObject)),
        "json_schema" => match o.remove("json_schema") {
            Some(Value::Object(js)) => json_schema(js).map(Some),
            None | Some(Value::Null) => Err(invalid(
                "response_format.json_schema",
                "'response_format.json_schema' is required when 'response_format.type' is 'json_schema'.".into(),
            )),
            Some(v) => Err(invalid(
                "response_format.json_schema",
                format!("Invalid type for 'response_format.json_schema': expected an object, but got {}.", kind_of(&v)),
            )),
        },
        other => Err(invalid(
            "response_format.type",
            format!(
                "Invalid value for 'response_format.type': '{other}'. Supported values are: 'text', \
                 'json_object' and 'json_schema'."
            ),
        )),
    }
}

/// The `json_schema` object: `name` (optional here, checked when given), `schema` (an object or
/// boolean; absent means any JSON value), `strict`, `description` (ignored).
fn json_schema(mut js: serde_json::Map<String, Value>) -> Result<Grammar, ApiError> {
    const NAME: &str = "response_format.json_schema.name";
    match js.remove("name") {
        None | Some(Value::Null) => {}
        Some(Value::String(n)) => {
            let ok = !n.is_empty()
                && n.len() <= MAX_NAME
                && n.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
            if !ok {
                return Err(invalid(
                    NAME,
                    format!(
                        "Invalid '{NAME}': '{n}'. Use 1 to {MAX_NAME} letters, digits, underscores \
                         or dashes."
                    ),
                ));
            }
        }
        Some(v) => {
            return Err(invalid(
                NAME,
                format!("Invalid type for '{NAME}': expected a string, but got {}.", kind_of(&v)),
            ))
        }
    }
    let strict = match js.remove("strict") {
        None | Some(Value::Null) => false,
        Some(Value::Bool(b)) => b,
        Some(v) => {
            const S: &str = "response_format.json_schema.strict";
            return Err(invalid(S, format!("Invalid type for '{S}': expected a boolean, but got {}.", kind_of(&v))));
        }
    };
    let schema = match js.remove("schema") {
        None | Some(Value::Null) => Value::Object(Default::default()),
        Some(s @ (Value::Object(_) | Value::Bool(_))) => s,
        Some(v) => {
            return Err(invalid(
                SCHEMA_PARAM,
                format!("Invalid type for '{SCHEMA_PARAM}': expected an object, but got {}.", kind_of(&v)),
            ))
        }
    };
    js.remove("description");
    if let Some(key) = js.keys().next() {
        return Err(invalid(
            &format!("response_format.json_schema.{key}"),
            format!("Unrecognized argument 'response_format.json_schema.{key}'."),
        ));
    }
    Ok(Grammar::JsonSchema { schema, strict })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::params::parse_object;
    use serde_json::json;

    fn parse(body: Value) -> Result<Option<Grammar>, ApiError> {
        let mut f = parse_object(json!({ "response_format": body }).to_string().as_bytes()).unwrap();
        response_format(&mut f)
    }

    #[test]
    fn the_three_types() {
        assert_eq!(parse(json!({"type": "text"})).unwrap(), None);
        assert_eq!(parse(json!({"type": "json_object"})).unwrap(), Some(Grammar::JsonObject));
        let schema = json!({"type": "object", "properties": {"a": {"type": "integer"}}});
        let g =
            parse(json!({"type": "json_schema", "json_schema": {"name": "a_b-1", "schema": schema, "strict": true}}));
        assert_eq!(g.unwrap(), Some(Grammar::JsonSchema { schema, strict: true }));
        let g = parse(json!({"type": "json_schema", "json_schema": {"name": "x"}})).unwrap();
        assert_eq!(g, Some(Grammar::JsonSchema { schema: json!({}), strict: false }));
    }

    #[test]
    fn bad_shapes_name_the_field() {
        for (body, param) in [
            (json!("json"), "response_format"),
            (json!({}), "response_format.type"),
            (json!({"type": "yaml"}), "response_format.type"),
            (json!({"type": "json_schema"}), "response_format.json_schema"),
            (json!({"type": "json_schema", "json_schema": []}), "response_format.json_schema"),
            (json!({"type": "json_schema", "json_schema": {"name": "has space"}}), "response_format.json_schema.name"),
            (json!({"type": "json_schema", "json_schema": {"strict": "yes"}}), "response_format.json_schema.strict"),
            (json!({"type": "json_schema", "json_schema": {"schema": "x"}}), SCHEMA_PARAM),
            (json!({"type": "json_schema", "json_schema": {"schemas": {}}}), "response_format.json_schema.schemas"),
        ] {
            let e = parse(body.clone()).unwrap_err();
            assert_eq!((e.status.as_u16(), e.param.as_deref()), (400, Some(param)), "{body}");
        }
    }
}
