//! The OpenAI request bodies: every field of `/v1/chat/completions` and `/v1/completions`
//! parsed and validated into an [`OpenAiRequest`], each bad one a 400 naming it.

use serde_json::{Map, Value};

use crate::backend::{ChatMessage, Prompt, Role, MAX_TOP_LOGPROBS};
use crate::choices::choices;
use crate::error::ApiError;
use crate::format::{response_format, SCHEMA_PARAM};
use crate::generation::Spec;
use crate::models::ModelNames;
use crate::params::{
    check_model, kind_of, max_tokens_bound, sampling, stop_strings, unsupported, Fields, SamplingRanges,
};
use crate::tools::{check_tool_results, message_tool_calls, tool_request, ToolChoice, ToolRequest};

/// Request fields accepted and ignored (they change nothing here).
pub(super) const IGNORED: &[&str] =
    &["user", "metadata", "store", "service_tier", "reasoning_effort", "safety_identifier", "prompt_cache_key"];

const OPENAI_RANGES: SamplingRanges = SamplingRanges { max_temperature: 2.0 };

/// Default completion budget of `/v1/completions` when `max_tokens` is absent (OpenAI's).
const COMPLETIONS_DEFAULT_MAX_TOKENS: usize = 16;

/// Streaming choices shared by both endpoints.
#[derive(Debug, Clone, Copy)]
pub(crate) struct StreamOptions {
    pub stream: bool,
    pub include_usage: bool,
}

fn stream_options(f: &mut Fields) -> Result<StreamOptions, ApiError> {
    let stream = f.bool("stream")?.unwrap_or(false);
    let include_usage = match f.take("stream_options") {
        None => false,
        Some(_) if !stream => {
            return Err(ApiError::invalid(
                "stream_options",
                "The 'stream_options' parameter is only allowed when 'stream' is enabled.",
            ))
        }
        Some(Value::Object(mut o)) => match o.remove("include_usage") {
            None | Some(Value::Null) => false,
            Some(Value::Bool(b)) => b,
            Some(v) => {
                return Err(ApiError::invalid(
                    "stream_options.include_usage",
                    format!(
                        "Invalid type for 'stream_options.include_usage': expected a boolean, \
                         but got {}.",
                        kind_of(&v)
                    ),
                ))
            }
        },
        Some(v) => {
            return Err(ApiError::invalid(
                "stream_options",
                format!("Invalid type for 'stream_options': expected an object, but got {}.", kind_of(&v)),
            ))
        }
    };
    Ok(StreamOptions { stream, include_usage })
}

/// `best_of` must be 1: choices are not ranked.
fn single_choice(f: &mut Fields, name: &str) -> Result<(), ApiError> {
    match f.integer(name)? {
        None | Some(1) => Ok(()),
        Some(n) => Err(unsupported(name, &format!("only 1 choice per request is supported, got {n}"))),
    }
}

/// Parameters that would change the output in ways this server does not implement.
fn reject_unsupported_common(f: &mut Fields) -> Result<(), ApiError> {
    let empty_object = |v: &Value| v.as_object().is_some_and(Map::is_empty);
    f.reject_unless("logit_bias", "logit biases are not implemented", empty_object)
}

/// A parsed chat or text completion request: the served model name, the generation, how to stream.
#[derive(Debug)]
pub(crate) struct OpenAiRequest {
    pub model: String,
    /// The tool fields (chat only; none for completions).
    pub tools: ToolRequest,
    pub spec: Spec,
    /// Choices to generate (`n`).
    pub n: usize,
    pub stream: StreamOptions,
}

/// Validates a chat completion request body (everything except the prompt's length, which
/// needs the tokenizer).
pub(crate) fn parse_chat(f: &mut Fields, served: &ModelNames, window: usize) -> Result<OpenAiRequest, ApiError> {
    let model = check_model(f, served)?;
    let messages = match f.take("messages") {
        None => return Err(ApiError::invalid("messages", "'messages' is required.")),
        Some(Value::Array(items)) => parse_messages(items)?,
        Some(v) => {
            return Err(ApiError::invalid(
                "messages",
                format!("Invalid type for 'messages': expected an array, but got {}.", kind_of(&v)),
            ))
        }
    };
    let stream = stream_options(f)?;
    let (max_tokens, max_tokens_param) = match (f.integer("max_completion_tokens")?, f.integer("max_tokens")?) {
        (Some(n), _) => (Some(max_tokens_bound("max_completion_tokens", n, window)?), "max_completion_tokens"),
        (None, Some(n)) => (Some(max_tokens_bound("max_tokens", n, window)?), "max_tokens"),
        (None, None) => (None, "max_tokens"),
    };
    let sampling = sampling(f, &OPENAI_RANGES)?;
    let stop = stop_strings(f, "stop")?;
    let want_logprobs = f.bool("logprobs")?.unwrap_or(false);
    let logprobs = match (want_logprobs, f.integer("top_logprobs")?) {
        (false, None) => None,
        (false, Some(_)) => {
            return Err(ApiError::invalid("top_logprobs", "'top_logprobs' requires 'logprobs' to be true."))
        }
        (true, top) => Some(top_logprobs("top_logprobs", top.unwrap_or(0))?),
    };
    let n = choices(f)?;
    reject_unsupported_common(f)?;
    let grammar = response_format(f)?;
    let tools = tool_request(f)?;
    let prompt_tools = tools.tools.clone();
    if grammar.is_some() && matches!(tools.choice, ToolChoice::Required | ToolChoice::Function(_)) {
        return Err(ApiError::invalid(
            "response_format",
            "'response_format' cannot be combined with a 'tool_choice' that forces a call.",
        ));
    }
    f.reject_unless("modalities", "only text output is supported", |v| {
        v.as_array().is_some_and(|m| m.iter().all(|x| x.as_str() == Some("text")))
    })?;
    f.reject_unless("audio", "audio output is not supported", |_| false)?;
    f.reject_unless("prediction", "predicted outputs are not supported", |_| false)?;
    f.reject_unless("web_search_options", "web search is not supported", |_| false)?;
    Ok(OpenAiRequest {
        model,
        tools,
        spec: Spec {
            prompt: Prompt::Chat { messages, tools: prompt_tools },
            prompt_param: "messages",
            max_tokens,
            max_tokens_param,
            sampling,
            stop,
            logprobs,
            grammar: grammar.map(|g| (g, SCHEMA_PARAM)),
        },
        n,
        stream,
    })
}

fn top_logprobs(name: &str, k: i64) -> Result<usize, ApiError> {
    match usize::try_from(k) {
        Ok(k) if k <= MAX_TOP_LOGPROBS => Ok(k),
        _ => Err(ApiError::invalid(name, format!("'{name}' must be between 0 and {MAX_TOP_LOGPROBS}, but got {k}."))),
    }
}

/// Chat messages: roles system/developer/user/assistant, content a string or text parts.
fn parse_messages(items: Vec<Value>) -> Result<Vec<ChatMessage>, ApiError> {
    if items.is_empty() {
        return Err(ApiError::invalid("messages", "'messages' must contain at least one message."));
    }
    let mut out = Vec::with_capacity(items.len());
    for (i, item) in items.into_iter().enumerate() {
        let at = |field: &str| format!("messages[{i}]{field}");
        let Value::Object(mut m) = item else {
            return Err(ApiError::invalid(
                at(""),
                format!("Invalid type for '{}': expected an object, but got {}.", at(""), kind_of(&item)),
            ));
        };
        let role = match m.remove("role") {
            Some(Value::String(r)) => match r.as_str() {
                "system" | "developer" => Role::System,
                "user" => Role::User,
                "assistant" => Role::Assistant,
                "tool" => Role::Tool,
                "function" => return Err(unsupported(&at(".role"), "the deprecated 'function' role; use 'tool'")),
                _ => {
                    return Err(ApiError::invalid(
                        at(".role"),
                        format!(
                            "Invalid value for '{}': '{r}'. Supported values are: 'system', \
                             'developer', 'user' and 'assistant'.",
                            at(".role")
                        ),
                    ))
                }
            },
            None | Some(Value::Null) => {
                return Err(ApiError::invalid(at(".role"), format!("'{}' is required.", at(".role"))))
            }
            Some(v) => {
                return Err(ApiError::invalid(
                    at(".role"),
                    format!("Invalid type for '{}': expected a string, but got {}.", at(".role"), kind_of(&v)),
                ))
            }
        };
        let tool_calls = match m.remove("tool_calls") {
            None | Some(Value::Null) => Vec::new(),
            Some(v) if role == Role::Assistant => message_tool_calls(v, &at(".tool_calls"))?,
            Some(_) => return Err(ApiError::invalid(at(".tool_calls"), "Only assistant messages carry 'tool_calls'.")),
        };
        if m.remove("function_call").is_some_and(|v| !v.is_null()) {
            return Err(unsupported(&at(".function_call"), "the deprecated 'function_call'; use 'tool_calls'"));
        }
        let tool_call_id = match (role, m.remove("tool_call_id")) {
            (Role::Tool, Some(Value::String(id))) => Some(id),
            (Role::Tool, _) => {
                return Err(ApiError::invalid(at(".tool_call_id"), format!("'{}' is required.", at(".tool_call_id"))))
            }
            _ => None,
        };
        let content = match m.remove("content") {
            None | Some(Value::Null) if role == Role::Assistant => String::new(),
            None | Some(Value::Null) => {
                return Err(ApiError::invalid(at(".content"), format!("'{}' is required.", at(".content"))))
            }
            Some(v) => content_text(v, &at(".content"))?,
        };
        out.push(ChatMessage { role, content, tool_calls, tool_call_id });
    }
    check_tool_results(&out)?;
    Ok(out)
}

/// A message's content: a string, or an array of `{"type": "text", "text": ...}` parts
/// (joined with newlines). Other part types are not supported.
pub(crate) fn content_text(v: Value, param: &str) -> Result<String, ApiError> {
    match v {
        Value::String(s) => Ok(s),
        Value::Array(parts) => {
            let mut texts = Vec::with_capacity(parts.len());
            for (j, part) in parts.into_iter().enumerate() {
                let at = format!("{param}[{j}]");
                let kind = part.get("type").and_then(Value::as_str);
                match (kind, part.get("text")) {
                    (Some("text"), Some(Value::String(t))) => texts.push(t.clone()),
                    (Some("text"), _) => {
                        return Err(ApiError::invalid(format!("{at}.text"), format!("'{at}.text' must be a string.")))
                    }
                    (Some(other), _) => {
                        return Err(unsupported(
                            &format!("{at}.type"),
                            &format!("content parts of type '{other}' are not supported (text only)"),
                        ))
                    }
                    (None, _) => {
                        return Err(ApiError::invalid(
                            format!("{at}.type"),
                            format!("'{at}' must be an object with a 'type'."),
                        ))
                    }
                }
            }
            Ok(texts.join("\n"))
        }
        other => Err(ApiError::invalid(
            param,
            format!(
                "Invalid type for '{param}': expected a string or an array of content parts, \
                 but got {}.",
                kind_of(&other)
            ),
        )),
    }
}

/// Validates a `/v1/completions` request body.
pub(crate) fn parse_completion(f: &mut Fields, served: &ModelNames, window: usize) -> Result<OpenAiRequest, ApiError> {
    let model = check_model(f, served)?;
    let prompt = match f.take("prompt") {
        None => return Err(ApiError::invalid("prompt", "'prompt' is required.")),
        Some(v) => parse_prompt(v)?,
    };
    let stream = stream_options(f)?;
    let max_tokens = match f.integer("max_tokens")? {
        Some(n) => max_tokens_bound("max_tokens", n, window)?,
        None => COMPLETIONS_DEFAULT_MAX_TOKENS.min(window),
    };
    let sampling = sampling(f, &OPENAI_RANGES)?;
    let stop = stop_strings(f, "stop")?;
    let logprobs = match f.integer("logprobs")? {
        None => None,
        Some(k) => Some(top_logprobs("logprobs", k)?),
    };
    let n = choices(f)?;
    single_choice(f, "best_of")?;
    reject_unsupported_common(f)?;
    let grammar = response_format(f)?;
    f.reject_unless("echo", "echoing the prompt is not implemented", |v| v.as_bool() == Some(false))?;
    f.reject_unless("suffix", "insertion (suffix) is not implemented", |v| v.as_str() == Some(""))?;
    Ok(OpenAiRequest {
        model,
        tools: ToolRequest { tools: Vec::new(), choice: ToolChoice::None, parallel: false },
        spec: Spec {
            prompt,
            prompt_param: "prompt",
            max_tokens: Some(max_tokens),
            max_tokens_param: "max_tokens",
            sampling,
            stop,
            logprobs,
            grammar: grammar.map(|g| (g, SCHEMA_PARAM)),
        },
        n,
        stream,
    })
}

/// `prompt`: a string, a one-string array, an array of token ids, or a one-element array of
/// token-id arrays. Batches (several prompts) are not supported.
fn parse_prompt(v: Value) -> Result<Prompt, ApiError> {
    fn token_ids(items: &[Value], param: &str) -> Result<Vec<u32>, ApiError> {
        items
            .iter()
            .enumerate()
            .map(|(i, t)| {
                t.as_u64().and_then(|x| u32::try_from(x).ok()).ok_or_else(|| {
                    ApiError::invalid(
                        format!("{param}[{i}]"),
                        format!("'{param}[{i}]' must be a token id (a non-negative integer)."),
                    )
                })
            })
            .collect()
    }
    let batch = || unsupported("prompt", "only one prompt per request is supported");
    match v {
        Value::String(s) => Ok(Prompt::Text(s)),
        Value::Array(items) => match items.first() {
            None => Err(ApiError::invalid("prompt", "'prompt' must not be empty.")),
            Some(Value::String(_)) => match <[Value; 1]>::try_from(items) {
                Ok([Value::String(s)]) => Ok(Prompt::Text(s)),
                Ok(_) => Err(ApiError::invalid("prompt", "'prompt' must be a string.")),
                Err(_) => Err(batch()),
            },
            Some(Value::Number(_)) => Ok(Prompt::Tokens(token_ids(&items, "prompt")?)),
            Some(Value::Array(inner)) => {
                if items.len() > 1 {
                    return Err(batch());
                }
                Ok(Prompt::Tokens(token_ids(inner, "prompt[0]")?))
            }
            Some(other) => Err(ApiError::invalid(
                "prompt[0]",
                format!("Invalid type for 'prompt[0]': expected a string or a token id, but got {}.", kind_of(other)),
            )),
        },
        other => Err(ApiError::invalid(
            "prompt",
            format!("Invalid type for 'prompt': expected a string or an array, but got {}.", kind_of(&other)),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::params::parse_object;

    /// The error a chat body produces, from parsing or from the unknown-field check.
    fn chat_err(body: &str) -> ApiError {
        let mut f = parse_object(body.as_bytes()).unwrap();
        match parse_chat(&mut f, &ModelNames::single("m"), 100) {
            Err(e) => e,
            Ok(_) => f.finish(IGNORED).expect_err(body),
        }
    }

    #[test]
    fn chat_messages_parse_roles_and_parts() {
        let body = r#"{"model": "m", "messages": [
            {"role": "developer", "content": "be brief"},
            {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
            {"role": "assistant", "content": null}
        ], "max_completion_tokens": 5, "max_tokens": 9, "logprobs": true, "top_logprobs": 2}"#;
        let mut f = parse_object(body.as_bytes()).unwrap();
        let r = parse_chat(&mut f, &ModelNames::single("m"), 100).unwrap();
        f.finish(IGNORED).unwrap();
        assert_eq!(
            r.spec.prompt,
            Prompt::Chat {
                messages: vec![
                    ChatMessage::new(Role::System, "be brief"),
                    ChatMessage::new(Role::User, "a\nb"),
                    ChatMessage::new(Role::Assistant, ""),
                ],
                tools: vec![],
            }
        );
        assert_eq!(r.spec.max_tokens, Some(5));
        assert_eq!(r.spec.max_tokens_param, "max_completion_tokens");
        assert_eq!(r.spec.logprobs, Some(2));
    }

    #[test]
    fn chat_rejections_name_the_field() {
        let cases = [
            (r#"{"messages": []}"#, "messages"),
            (r#"{"messages": "hi"}"#, "messages"),
            (r#"{}"#, "messages"),
            (r#"{"messages": [{"role": "tool", "content": "x"}]}"#, "messages[0].tool_call_id"),
            (r#"{"messages": [{"role": "tool", "tool_call_id": "c9", "content": "x"}]}"#, "messages[0].tool_call_id"),
            (r#"{"messages": [{"role": "function", "content": "x"}]}"#, "messages[0].role"),
            (r#"{"messages": [{"role": "wizard", "content": "x"}]}"#, "messages[0].role"),
            (r#"{"messages": [{"content": "x"}]}"#, "messages[0].role"),
            (r#"{"messages": [{"role": "user"}]}"#, "messages[0].content"),
            (r#"{"messages": [{"role": "user", "content": 5}]}"#, "messages[0].content"),
            (r#"{"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}"#, "messages[0].content[0].type"),
            (r#"{"messages": [{"role": "user", "content": "x"}], "n": 17}"#, "n"),
            (r#"{"messages": [{"role": "user", "content": "x"}], "n": 0}"#, "n"),
            (r#"{"messages": [{"role": "user", "content": "x"}], "tools": [{}]}"#, "tools[0].type"),
            (r#"{"messages": [{"role": "user", "content": "x"}], "max_tokens": -1}"#, "max_tokens"),
            (r#"{"messages": [{"role": "user", "content": "x"}], "max_tokens": 101}"#, "max_tokens"),
            (r#"{"messages": [{"role": "user", "content": "x"}], "top_logprobs": 2}"#, "top_logprobs"),
            (
                r#"{"messages": [{"role": "user", "content": "x"}], "logprobs": true, "top_logprobs": 21}"#,
                "top_logprobs",
            ),
            (r#"{"messages": [{"role": "user", "content": "x"}], "stream_options": {}}"#, "stream_options"),
            (r#"{"messages": [{"role": "user", "content": "x"}], "logit_bias": {"1": 5}}"#, "logit_bias"),
            (r#"{"messages": [{"role": "user", "content": "x"}], "frobnicate": 1}"#, "frobnicate"),
        ];
        for (body, param) in cases {
            let e = chat_err(body);
            assert_eq!(e.status, 400, "{body}");
            assert_eq!(e.param.as_deref(), Some(param), "{body}: {e:?}");
        }
        let e = chat_err(r#"{"model": "other", "messages": [{"role": "user", "content": "x"}]}"#);
        assert_eq!((e.status.as_u16(), e.code), (404, Some("model_not_found")));
    }

    #[test]
    fn completion_prompts() {
        let p = |s: &str| parse_prompt(serde_json::from_str(s).unwrap());
        assert_eq!(p(r#""hi""#).unwrap(), Prompt::Text("hi".into()));
        assert_eq!(p(r#"["hi"]"#).unwrap(), Prompt::Text("hi".into()));
        assert_eq!(p(r#"[1, 2]"#).unwrap(), Prompt::Tokens(vec![1, 2]));
        assert_eq!(p(r#"[[3]]"#).unwrap(), Prompt::Tokens(vec![3]));
        assert!(p(r#"["a", "b"]"#).is_err());
        assert!(p(r#"[[1], [2]]"#).is_err());
        assert!(p(r#"[-1]"#).is_err());
        assert!(p(r#"[]"#).is_err());
        assert!(p(r#"{}"#).is_err());
        assert!(p(r#"[true]"#).is_err());
    }

    #[test]
    fn completion_defaults_and_rejections() {
        let mut f = parse_object(br#"{"prompt": "x", "echo": false, "best_of": 1}"#).unwrap();
        let r = parse_completion(&mut f, &ModelNames::single("m"), 100).unwrap();
        f.finish(IGNORED).unwrap();
        assert_eq!(r.spec.max_tokens, Some(COMPLETIONS_DEFAULT_MAX_TOKENS));
        for (body, param) in [
            (r#"{"prompt": "x", "echo": true}"#, "echo"),
            (r#"{"prompt": "x", "suffix": "y"}"#, "suffix"),
            (r#"{"prompt": "x", "best_of": 3}"#, "best_of"),
            (r#"{"prompt": "x", "n": 17}"#, "n"),
            (r#"{"prompt": "x", "logprobs": 50}"#, "logprobs"),
            (r#"{"prompt": "x", "max_tokens": 0}"#, "max_tokens"),
        ] {
            let mut f = parse_object(body.as_bytes()).unwrap();
            let e = parse_completion(&mut f, &ModelNames::single("m"), 100).unwrap_err();
            assert_eq!(e.param.as_deref(), Some(param), "{body}");
        }
    }
}
