//! Request-body parsing shared by every endpoint: UTF-8 and JSON checks, typed field
//! extraction that names the offending field, and the range checks for sampling parameters,
//! stop strings and `max_tokens`.
//!
//! Fields are taken out of the JSON object one by one ([`Fields`]); whatever is left at the
//! end is either on the endpoint's list of accepted-and-ignored names or rejected as
//! unrecognized (as OpenAI does), so a misspelt parameter never silently does nothing.

use axum::extract::rejection::BytesRejection;
use axum::http::StatusCode;
use bytes::Bytes;
use serde_json::{Map, Value};

use crate::backend::{SamplingParams, MAX_STOP_SEQUENCES};
use crate::error::ApiError;
use crate::models::ModelNames;

/// The fields of a JSON request object, taken out one at a time.
#[derive(Debug)]
pub(crate) struct Fields {
    map: Map<String, Value>,
}

/// The JSON type name of a value, for error messages.
pub(crate) fn kind_of(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(n) if n.is_f64() => "a number",
        Value::Number(_) => "an integer",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

fn wrong_type(param: &str, expected: &str, got: &Value) -> ApiError {
    ApiError::invalid(param, format!("Invalid type for '{param}': expected {expected}, but got {}.", kind_of(got)))
        .with_code("invalid_type")
}

/// 400 for a parameter this server understands but does not implement.
pub(crate) fn unsupported(param: &str, what: &str) -> ApiError {
    ApiError::invalid(param, format!("'{param}' is not supported by this server: {what}."))
        .with_code("unsupported_parameter")
}

/// Parses a request body into a JSON object: invalid UTF-8, malformed JSON and non-objects
/// are 400s with a message saying which.
pub(crate) fn parse_object(body: &[u8]) -> Result<Fields, ApiError> {
    let text = std::str::from_utf8(body).map_err(|e| {
        ApiError::bad_request(format!(
            "The request body is not valid UTF-8 (invalid byte at offset {}).",
            e.valid_up_to()
        ))
        .with_code("invalid_utf8")
    })?;
    if text.trim().is_empty() {
        return Err(
            ApiError::bad_request("The request body is empty; expected a JSON object.").with_code("invalid_json")
        );
    }
    let value: Value = serde_json::from_str(text).map_err(|e| {
        ApiError::bad_request(format!("We could not parse the JSON body of your request: {e}."))
            .with_code("invalid_json")
    })?;
    match value {
        Value::Object(map) => Ok(Fields { map }),
        other => {
            Err(ApiError::bad_request(format!("The request body must be a JSON object, but got {}.", kind_of(&other)))
                .with_code("invalid_json"))
        }
    }
}

impl Fields {
    /// Takes a field; JSON `null` counts as absent (OpenAI clients send explicit nulls).
    pub(crate) fn take(&mut self, name: &str) -> Option<Value> {
        match self.map.remove(name) {
            None | Some(Value::Null) => None,
            Some(v) => Some(v),
        }
    }

    pub(crate) fn string(&mut self, name: &str) -> Result<Option<String>, ApiError> {
        match self.take(name) {
            None => Ok(None),
            Some(Value::String(s)) => Ok(Some(s)),
            Some(v) => Err(wrong_type(name, "a string", &v)),
        }
    }

    pub(crate) fn bool(&mut self, name: &str) -> Result<Option<bool>, ApiError> {
        match self.take(name) {
            None => Ok(None),
            Some(Value::Bool(b)) => Ok(Some(b)),
            Some(v) => Err(wrong_type(name, "a boolean", &v)),
        }
    }

    /// A finite number (integers accepted).
    pub(crate) fn number(&mut self, name: &str) -> Result<Option<f64>, ApiError> {
        match self.take(name) {
            None => Ok(None),
            Some(Value::Number(n)) => match n.as_f64() {
                Some(x) if x.is_finite() => Ok(Some(x)),
                _ => Err(ApiError::invalid(name, format!("'{name}' is out of range."))),
            },
            Some(v) => Err(wrong_type(name, "a number", &v)),
        }
    }

    /// An integer that fits i64; 1e3 or 2.5 are type errors, 2^64 is out of range.
    pub(crate) fn integer(&mut self, name: &str) -> Result<Option<i64>, ApiError> {
        match self.take(name) {
            None => Ok(None),
            Some(Value::Number(n)) => {
                if let Some(i) = n.as_i64() {
                    Ok(Some(i))
                } else if n.is_u64() {
                    Err(ApiError::invalid(name, format!("'{name}' is too large.")))
                } else {
                    Err(wrong_type(name, "an integer", &Value::Number(n)))
                }
            }
            Some(v) => Err(wrong_type(name, "an integer", &v)),
        }
    }

    /// Rejects a field unless it is absent or `accept` says its value is harmless
    /// (e.g. `n: 1`, `tools: []`).
    pub(crate) fn reject_unless(
        &mut self,
        name: &str,
        what: &str,
        accept: impl FnOnce(&Value) -> bool,
    ) -> Result<(), ApiError> {
        match self.take(name) {
            Some(v) if !accept(&v) => Err(unsupported(name, what)),
            _ => Ok(()),
        }
    }

    /// Ends parsing: fields on `ignored` are dropped, anything else is an unrecognized
    /// argument (400), like OpenAI's own API.
    pub(crate) fn finish(self, ignored: &[&str]) -> Result<(), ApiError> {
        for key in self.map.keys() {
            if !ignored.contains(&key.as_str()) {
                return Err(ApiError::invalid(key.clone(), format!("Unrecognized request argument supplied: {key}"))
                    .with_code("unknown_parameter"));
            }
        }
        Ok(())
    }
}

/// The body bytes, or the extractor's failure as an API error (413 over the size limit).
pub(crate) fn read_body(body: Result<Bytes, BytesRejection>, max_body_bytes: usize) -> Result<Bytes, ApiError> {
    body.map_err(|rejection| {
        if rejection.status() == StatusCode::PAYLOAD_TOO_LARGE {
            ApiError::new(
                StatusCode::PAYLOAD_TOO_LARGE,
                format!("The request body is larger than the limit of {max_body_bytes} bytes."),
            )
            .with_code("request_too_large")
        } else {
            ApiError::new(rejection.status(), rejection.body_text())
        }
    })
}

/// A log-probability as JSON: the shortest decimal of the f32 (not its widened f64 digits);
/// -inf (a masked token) becomes -9999, OpenAI's convention, since JSON has no infinity.
pub(crate) fn logprob_json(x: f32) -> f64 {
    if !x.is_finite() {
        return -9999.0;
    }
    format!("{x}").parse().unwrap_or(f64::from(x))
}

/// Checks `model` against the served model's names; absent means the reported one.
pub(crate) fn check_model(fields: &mut Fields, served: &ModelNames) -> Result<String, ApiError> {
    served.resolve(fields.string("model")?)
}

/// Range of the temperature parameter per API (OpenAI 0..=2, Anthropic 0..=1).
pub(crate) struct SamplingRanges {
    pub max_temperature: f64,
}

fn in_range(name: &str, x: f64, lo: f64, hi: f64) -> Result<f64, ApiError> {
    if (lo..=hi).contains(&x) {
        Ok(x)
    } else {
        Err(ApiError::invalid(name, format!("'{name}' must be between {lo} and {hi}, but got {x}."))
            .with_code("invalid_value"))
    }
}

/// Reads `temperature`, `top_p`, `top_k`, `min_p`, `seed`, `presence_penalty`,
/// `frequency_penalty` (those present), range-checked.
pub(crate) fn sampling(fields: &mut Fields, ranges: &SamplingRanges) -> Result<SamplingParams, ApiError> {
    let mut p = SamplingParams::default();
    if let Some(t) = fields.number("temperature")? {
        p.temperature = in_range("temperature", t, 0.0, ranges.max_temperature)? as f32;
    }
    if let Some(t) = fields.number("top_p")? {
        if t <= 0.0 || t > 1.0 {
            return Err(ApiError::invalid("top_p", format!("'top_p' must be in (0, 1], but got {t}."))
                .with_code("invalid_value"));
        }
        p.top_p = t as f32;
    }
    if let Some(k) = fields.integer("top_k")? {
        // vLLM's convention: 0 and -1 both mean "disabled".
        p.top_k = match k {
            -1 | 0 => None,
            k if k > 0 => Some(u32::try_from(k).unwrap_or(u32::MAX)),
            k => {
                return Err(ApiError::invalid(
                    "top_k",
                    format!("'top_k' must be -1, 0 (disabled) or positive, but got {k}."),
                )
                .with_code("invalid_value"))
            }
        };
    }
    if let Some(m) = fields.number("min_p")? {
        p.min_p = in_range("min_p", m, 0.0, 1.0)? as f32;
    }
    if let Some(s) = fields.take("seed") {
        // OpenAI documents an integer; negative seeds are accepted and used bit for bit.
        p.seed = Some(match &s {
            Value::Number(n) if n.is_u64() => n.as_u64().unwrap_or_default(),
            Value::Number(n) if n.is_i64() => n.as_i64().unwrap_or_default() as u64,
            _ => return Err(wrong_type("seed", "an integer", &s)),
        });
    }
    if let Some(x) = fields.number("presence_penalty")? {
        p.presence_penalty = in_range("presence_penalty", x, -2.0, 2.0)? as f32;
    }
    if let Some(x) = fields.number("frequency_penalty")? {
        p.frequency_penalty = in_range("frequency_penalty", x, -2.0, 2.0)? as f32;
    }
    Ok(p)
}

/// Reads stop strings from `name`: a string or an array of strings, each non-empty, at most
/// [`MAX_STOP_SEQUENCES`].
pub(crate) fn stop_strings(fields: &mut Fields, name: &str) -> Result<Vec<String>, ApiError> {
    let stops = match fields.take(name) {
        None => return Ok(Vec::new()),
        Some(Value::String(s)) => vec![s],
        Some(Value::Array(items)) => {
            let mut out = Vec::with_capacity(items.len());
            for (i, item) in items.into_iter().enumerate() {
                match item {
                    Value::String(s) => out.push(s),
                    other => return Err(wrong_type(&format!("{name}[{i}]"), "a string", &other)),
                }
            }
            out
        }
        Some(v) => return Err(wrong_type(name, "a string or an array of strings", &v)),
    };
    if stops.len() > MAX_STOP_SEQUENCES {
        return Err(ApiError::invalid(
            name,
            format!("'{name}' has {} entries; at most {MAX_STOP_SEQUENCES} are allowed.", stops.len()),
        )
        .with_code("invalid_value"));
    }
    if let Some(i) = stops.iter().position(|s| s.is_empty()) {
        return Err(
            ApiError::invalid(format!("{name}[{i}]"), "Stop strings must not be empty.").with_code("invalid_value")
        );
    }
    Ok(stops)
}

/// Checks a requested token limit before the prompt is known: at least 1 and at most the
/// context window.
pub(crate) fn max_tokens_bound(name: &str, requested: i64, context_window: usize) -> Result<usize, ApiError> {
    if requested < 1 {
        return Err(ApiError::invalid(name, format!("'{name}' must be at least 1, but got {requested}."))
            .with_code("invalid_value"));
    }
    match usize::try_from(requested) {
        Ok(n) if n <= context_window => Ok(n),
        _ => Err(ApiError::invalid(
            name,
            format!(
                "'{name}' is too large: {requested}. This model's context window is \
                 {context_window} tokens."
            ),
        )
        .with_code("invalid_value")),
    }
}

/// Decides the completion budget once the prompt length is known: the prompt must leave room
/// for at least one token, and prompt + requested must fit the window. `None` requested
/// means "as many as fit".
pub(crate) fn fit_context(
    prompt_param: &str,
    param: &str,
    prompt_tokens: usize,
    requested: Option<usize>,
    context_window: usize,
) -> Result<usize, ApiError> {
    let exceeded = |completion: usize| {
        ApiError::invalid(
            param,
            format!(
                "This model's maximum context length is {context_window} tokens. However, you \
                 requested {} tokens ({prompt_tokens} in the prompt, {completion} for the \
                 completion). Please reduce the length of the prompt or the completion.",
                prompt_tokens + completion
            ),
        )
        .with_code("context_length_exceeded")
    };
    if prompt_tokens >= context_window {
        return Err(ApiError { param: Some(prompt_param.into()), ..exceeded(requested.unwrap_or(1)) });
    }
    match requested {
        None => Ok(context_window - prompt_tokens),
        Some(n) if prompt_tokens + n <= context_window => Ok(n),
        Some(n) => Err(exceeded(n)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fields(json: &str) -> Fields {
        parse_object(json.as_bytes()).unwrap()
    }

    #[test]
    fn body_checks_name_the_problem() {
        assert_eq!(parse_object(b"{\"a\": \"\xff\"}").unwrap_err().code, Some("invalid_utf8"));
        assert_eq!(parse_object(b"{").unwrap_err().code, Some("invalid_json"));
        assert_eq!(parse_object(b"").unwrap_err().code, Some("invalid_json"));
        assert!(parse_object(b"[1]").unwrap_err().message.contains("an array"));
    }

    #[test]
    fn typed_fields_and_nulls() {
        let mut f = fields(r#"{"a": null, "b": "x", "c": 3, "d": 2.5, "e": true}"#);
        assert_eq!(f.string("a").unwrap(), None);
        assert_eq!(f.string("b").unwrap().as_deref(), Some("x"));
        assert_eq!(f.integer("c").unwrap(), Some(3));
        assert_eq!(f.integer("d").unwrap_err().param.as_deref(), Some("d"));
        assert_eq!(f.bool("e").unwrap(), Some(true));
        f.finish(&[]).unwrap();
        let mut f = fields(r#"{"big": 18446744073709551615}"#);
        assert!(f.integer("big").unwrap_err().message.contains("too large"));
        let f = fields(r#"{"typo": 1}"#);
        assert_eq!(f.finish(&[]).unwrap_err().param.as_deref(), Some("typo"));
        let f = fields(r#"{"user": "u"}"#);
        f.finish(&["user"]).unwrap();
    }

    #[test]
    fn sampling_ranges() {
        let r = SamplingRanges { max_temperature: 2.0 };
        let p = sampling(&mut fields(r#"{"temperature": 0, "top_k": -1, "seed": -1, "min_p": 0.1}"#), &r).unwrap();
        assert_eq!(p.temperature, 0.0);
        assert_eq!(p.top_k, None);
        assert_eq!(p.seed, Some(u64::MAX));
        assert_eq!(p.min_p, 0.1);
        for bad in [
            r#"{"temperature": 2.5}"#,
            r#"{"top_p": 0}"#,
            r#"{"top_k": -2}"#,
            r#"{"min_p": 1.5}"#,
            r#"{"presence_penalty": -3}"#,
            r#"{"frequency_penalty": "1"}"#,
            r#"{"seed": 1.5}"#,
        ] {
            assert_eq!(sampling(&mut fields(bad), &r).unwrap_err().status, 400, "{bad}");
        }
    }

    #[test]
    fn stops_and_limits() {
        assert_eq!(stop_strings(&mut fields(r#"{"stop": "x"}"#), "stop").unwrap(), vec!["x"]);
        assert!(stop_strings(&mut fields(r#"{"stop": [""]}"#), "stop").is_err());
        assert!(stop_strings(&mut fields(r#"{"stop": [1]}"#), "stop").is_err());
        let many = format!(r#"{{"stop": {:?}}}"#, vec!["a"; MAX_STOP_SEQUENCES + 1]);
        assert!(stop_strings(&mut fields(&many), "stop").is_err());

        assert!(max_tokens_bound("max_tokens", 0, 100).is_err());
        assert!(max_tokens_bound("max_tokens", -5, 100).is_err());
        assert!(max_tokens_bound("max_tokens", 101, 100).is_err());
        assert_eq!(max_tokens_bound("max_tokens", 100, 100).unwrap(), 100);

        assert_eq!(fit_context("prompt", "max_tokens", 10, None, 100).unwrap(), 90);
        assert_eq!(fit_context("prompt", "max_tokens", 10, Some(90), 100).unwrap(), 90);
        let e = fit_context("prompt", "max_tokens", 10, Some(91), 100).unwrap_err();
        assert_eq!(e.code, Some("context_length_exceeded"));
        assert!(fit_context("prompt", "max_tokens", 100, None, 100).is_err());
    }
}
