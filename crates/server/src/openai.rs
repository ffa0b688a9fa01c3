//! OpenAI-compatible endpoints: `POST /v1/chat/completions` and `POST /v1/completions`,
//! streaming (SSE `data: {...}` chunks, `data: [DONE]`) and not, in OpenAI's exact shapes.
//!
//! Each handler: read the body (size limit) → parse and validate every field
//! ([`parse_chat`], [`parse_completion`]) → [`generation::start`] → either collect and answer
//! with one JSON object, or stream chunks through an [`Encoder`].

use std::sync::Arc;
use std::time::Instant;

use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::Json;
use bytes::Bytes;
use serde_json::{json, Map, Value};

use crate::backend::{
    ChatMessage, FinishReason, LogprobEntry, Prompt, Role, TokenLogprob, ToolCallFormat, Usage, MAX_TOP_LOGPROBS,
};
use crate::choices::{choices, choices_stream, stamp_index, total_usage};
use crate::error::ApiError;
use crate::format::{response_format, SCHEMA_PARAM};
use crate::generation::{self, collect_all, sse_data, Collected, Encoder, Spec, Step};
use crate::models::ModelNames;
use crate::params::{
    check_model, kind_of, logprob_json, max_tokens_bound, parse_object, read_body, sampling, stop_strings, unsupported,
    Fields, SamplingRanges,
};
use crate::server::{unix_now, AppState};
use crate::tools::{
    call_grammar, call_id, check_tool_results, message_tool_calls, output_format, parser, split_output, tool_request,
    ParsedCall, Piece, ToolChoice, ToolParser, ToolRequest,
};

/// Request fields accepted and ignored (they change nothing here).
const IGNORED: &[&str] =
    &["user", "metadata", "store", "service_tier", "reasoning_effort", "safety_identifier", "prompt_cache_key"];

const OPENAI_RANGES: SamplingRanges = SamplingRanges { max_temperature: 2.0 };

/// Default completion budget of `/v1/completions` when `max_tokens` is absent (OpenAI's).
const COMPLETIONS_DEFAULT_MAX_TOKENS: usize = 16;

/// Streaming choices shared by both endpoints.
#[derive(Debug, Clone, Copy)]
struct StreamOptions {
    stream: bool,
    include_usage: bool,
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
    stream: StreamOptions,
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

// ---------------------------------------------------------------------------------------------
// Handlers

pub(crate) async fn chat_completions(
    State(state): State<Arc<AppState>>,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    let arrived = Instant::now();
    respond(state, arrived, body, Endpoint::Chat).await.unwrap_or_else(IntoResponse::into_response)
}

pub(crate) async fn completions(State(state): State<Arc<AppState>>, body: Result<Bytes, BytesRejection>) -> Response {
    let arrived = Instant::now();
    respond(state, arrived, body, Endpoint::Completion).await.unwrap_or_else(IntoResponse::into_response)
}

/// The two OpenAI generation endpoints, which differ only in their request and response shapes.
#[derive(Clone, Copy, Debug)]
enum Endpoint {
    Chat,
    Completion,
}

/// One request of either endpoint: validate, start the generation, then stream its chunks or
/// answer with the whole response object.
async fn respond(
    state: Arc<AppState>,
    arrived: Instant,
    body: Result<Bytes, BytesRejection>,
    endpoint: Endpoint,
) -> Result<Response, ApiError> {
    let body = read_body(body, state.max_body_bytes)?;
    let mut f = parse_object(&body)?;
    let (served, window) = (&state.models, state.backend.context_window());
    let req = match endpoint {
        Endpoint::Chat => parse_chat(&mut f, served, window)?,
        Endpoint::Completion => parse_completion(&mut f, served, window)?,
    };
    f.finish(IGNORED)?;
    let want_logprobs = req.spec.logprobs.is_some();
    let mut spec = req.spec;
    let tool_format = output_format(state.backend.tool_call_format(), &req.tools, "tool_choice")?;
    // A `response_format` under `auto` wins: the output is its JSON (a forced call cannot be
    // combined with one; parse_chat refuses that).
    if let Some(grammar) = tool_format.filter(|_| spec.grammar.is_none()).and_then(|f| call_grammar(&req.tools, f)) {
        spec.grammar = Some((grammar, "tools"));
    }
    let jobs = generation::start_n(&state, arrived, spec, req.n).await?;
    let prefix = match endpoint {
        Endpoint::Chat => "chatcmpl-",
        Endpoint::Completion => "cmpl-",
    };
    let head = Head { id: state.request_id(prefix), created: unix_now(), model: req.model };
    let include_usage = req.stream.include_usage;
    if req.stream.stream {
        // One encoder per choice, stamping its index; with several choices the usage chunk
        // and `[DONE]` close the whole stream once, after the last choice's finish chunk.
        let closes = jobs.len() == 1;
        return Ok(match endpoint {
            Endpoint::Chat => {
                let encoders = (0..jobs.len()).map(|index| ChatEncoder {
                    head: head.clone(),
                    include_usage,
                    calls: tool_format.map(|format| StreamedCalls {
                        parser: parser(format),
                        count: 0,
                        blank: String::new(),
                    }),
                    index,
                    closes,
                });
                choices_stream(jobs, encoders.collect())
            }
            Endpoint::Completion => {
                let encoders = (0..jobs.len()).map(|index| CompletionEncoder {
                    head: head.clone(),
                    include_usage,
                    chars: 0,
                    index,
                    closes,
                });
                choices_stream(jobs, encoders.collect())
            }
        });
    }
    let collected = collect_all(jobs).await?;
    let choices: Vec<Value> = collected
        .iter()
        .enumerate()
        .map(|(index, c)| choice_json(endpoint, index, c, want_logprobs, tool_format, &head.id))
        .collect();
    let object = match endpoint {
        Endpoint::Chat => "chat.completion",
        Endpoint::Completion => "text_completion",
    };
    Ok(Json(json!({
        "id": head.id,
        "object": object,
        "created": head.created,
        "model": head.model,
        "choices": choices,
        "usage": usage_json(&total_usage(collected.iter().map(|c| c.usage))),
    }))
    .into_response())
}

/// Choice `index` of a whole (not streamed) response.
fn choice_json(
    endpoint: Endpoint,
    index: usize,
    c: &Collected,
    want_logprobs: bool,
    tool_format: Option<ToolCallFormat>,
    request_id: &str,
) -> Value {
    let mut finish_reason = c.finish_reason.as_str();
    let mut choice = match endpoint {
        Endpoint::Chat => {
            let logprobs = want_logprobs
                .then(|| json!({"content": c.logprobs.iter().map(chat_logprob).collect::<Vec<_>>(), "refusal": null}));
            let mut message = json!({"role": "assistant", "content": c.text, "refusal": null});
            if let Some(format) = tool_format {
                let (text, calls) = split_output(format, &c.text);
                let calls: Vec<Value> =
                    calls.iter().enumerate().map(|(i, call)| call_json(call, call_id(request_id, i))).collect();
                if !calls.is_empty() {
                    message["content"] = if text.is_empty() { Value::Null } else { json!(text) };
                    message["tool_calls"] = json!(calls);
                    if c.finish_reason == FinishReason::Stop {
                        finish_reason = "tool_calls";
                    }
                }
            }
            json!({"index": index, "message": message, "logprobs": logprobs})
        }
        Endpoint::Completion => {
            let logprobs = want_logprobs.then(|| completion_logprobs(&c.logprobs, &c.text_offsets));
            json!({"index": index, "text": c.text, "logprobs": logprobs})
        }
    };
    choice["finish_reason"] = json!(finish_reason);
    choice
}

/// One parsed call in OpenAI's response shape.
fn call_json(call: &ParsedCall, id: String) -> Value {
    json!({"id": id, "type": "function", "function": {"name": call.name, "arguments": call.arguments}})
}

// ---------------------------------------------------------------------------------------------
// Response shapes

/// The fields every response object and chunk of one request repeats.
#[derive(Clone, Debug)]
struct Head {
    id: String,
    created: u64,
    model: String,
}

fn usage_json(u: &Usage) -> Value {
    json!({
        "prompt_tokens": u.prompt_tokens,
        "completion_tokens": u.completion_tokens,
        "total_tokens": u.prompt_tokens + u.completion_tokens,
        "prompt_tokens_details": {"cached_tokens": u.cached_tokens},
    })
}

fn logprob_entry(e: &LogprobEntry) -> Value {
    json!({"token": e.token, "logprob": logprob_json(e.logprob), "bytes": e.bytes})
}

/// One position of chat `logprobs.content`.
fn chat_logprob(lp: &TokenLogprob) -> Value {
    let mut v = logprob_entry(&lp.chosen);
    v["top_logprobs"] = lp.top.iter().map(logprob_entry).collect();
    v
}

/// The legacy completions `logprobs` object over some positions.
fn completion_logprobs(lps: &[TokenLogprob], text_offsets: &[usize]) -> Value {
    debug_assert_eq!(lps.len(), text_offsets.len());
    let top: Vec<Value> = lps
        .iter()
        .map(|lp| {
            let map: Map<String, Value> =
                lp.top.iter().map(|e| (e.token.clone(), json!(logprob_json(e.logprob)))).collect();
            Value::Object(map)
        })
        .collect();
    json!({
        "tokens": lps.iter().map(|lp| lp.chosen.token.clone()).collect::<Vec<_>>(),
        "token_logprobs": lps.iter().map(|lp| logprob_json(lp.chosen.logprob)).collect::<Vec<_>>(),
        "top_logprobs": top,
        "text_offset": text_offsets,
    })
}

const DONE: &[u8] = b"data: [DONE]\n\n";

/// Error chunk then `[DONE]`, as vLLM does when a stream fails midway.
fn stream_error(e: &ApiError, out: &mut Vec<Bytes>) {
    out.push(sse_data(&e.body(crate::error::Dialect::OpenAi)));
    out.push(Bytes::from_static(DONE));
}

/// `chat.completion.chunk` stream of one choice.
struct ChatEncoder {
    head: Head,
    include_usage: bool,
    /// Tool calls parsed out of the stream, when the request has tools the model can call.
    calls: Option<StreamedCalls>,
    /// The choice's `index`, stamped on every chunk.
    index: usize,
    /// This choice's `Done` ends the stream (usage, `[DONE]`): the only choice; with several,
    /// [`Encoder::close`] does once they are all done.
    closes: bool,
}

/// The tool-call state of a chat stream.
struct StreamedCalls {
    parser: Box<dyn ToolParser>,
    /// Calls sent so far (the next one's `index`).
    count: usize,
    /// Whitespace at the end of the text so far, held until it is known whether a call (which
    /// it would only lay out) or more text follows.
    blank: String,
}

impl ChatEncoder {
    fn chunk(&self, choices: Value, usage: Option<Value>) -> Bytes {
        let mut v = json!({
            "id": self.head.id,
            "object": "chat.completion.chunk",
            "created": self.head.created,
            "model": self.head.model,
            "choices": stamp_index(choices, self.index),
        });
        if self.include_usage {
            v["usage"] = usage.unwrap_or(Value::Null);
        }
        sse_data(&v)
    }

    fn choice(delta: Value, logprobs: Option<Value>, finish: Option<FinishReason>) -> Value {
        json!([{
            "index": 0,
            "delta": delta,
            "logprobs": logprobs,
            "finish_reason": finish.map(FinishReason::as_str),
        }])
    }
}

impl ChatEncoder {
    /// Chunks for parsed pieces: text as `content` deltas (the token's logprobs ride on the
    /// first chunk, or on an empty one), each call as OpenAI's incremental `tool_calls` deltas —
    /// its index, id, type and name first, then its arguments.
    fn pieces(&mut self, pieces: Vec<Piece>, mut logprobs: Option<Value>, out: &mut Vec<Bytes>) {
        for piece in pieces {
            match piece {
                Piece::Text(t) => {
                    let Some(calls) = self.calls.as_mut() else { continue };
                    // Blank text around calls is layout, not content (as in the whole response).
                    let mut text = std::mem::take(&mut calls.blank) + &t;
                    let end = text.trim_end().len();
                    calls.blank = text.split_off(end);
                    if text.trim().is_empty() && calls.count > 0 || text.is_empty() {
                        continue;
                    }
                    out.push(self.chunk(Self::choice(json!({"content": text}), logprobs.take(), None), None));
                }
                Piece::Call(call) => {
                    let Some(calls) = self.calls.as_mut() else { continue };
                    calls.blank.clear();
                    let index = calls.count;
                    calls.count += 1;
                    let id = call_id(&self.head.id, index);
                    let first = json!({"tool_calls": [{"index": index, "id": id, "type": "function",
                                       "function": {"name": call.name, "arguments": ""}}]});
                    out.push(self.chunk(Self::choice(first, logprobs.take(), None), None));
                    let args = json!({"tool_calls": [{"index": index, "function": {"arguments": call.arguments}}]});
                    out.push(self.chunk(Self::choice(args, None, None), None));
                }
            }
        }
        if let Some(lp) = logprobs {
            out.push(self.chunk(Self::choice(json!({"content": ""}), Some(lp), None), None));
        }
    }
}

impl Encoder for ChatEncoder {
    fn start(&mut self, out: &mut Vec<Bytes>) {
        let delta = json!({"role": "assistant", "content": ""});
        out.push(self.chunk(Self::choice(delta, None, None), None));
    }

    fn step(&mut self, step: Step, out: &mut Vec<Bytes>) {
        match step {
            Step::Token { text, logprob } => {
                let logprobs = logprob.as_ref().map(|lp| json!({"content": [chat_logprob(lp)], "refusal": null}));
                let Some(calls) = self.calls.as_mut() else {
                    if text.is_empty() && logprobs.is_none() {
                        return;
                    }
                    out.push(self.chunk(Self::choice(json!({"content": text}), logprobs, None), None));
                    return;
                };
                let pieces = calls.parser.push(&text);
                self.pieces(pieces, logprobs, out);
            }
            Step::Done { finish_reason, usage, .. } => {
                let mut reason = finish_reason.as_str();
                if let Some(calls) = self.calls.as_mut() {
                    let pieces = calls.parser.finish();
                    self.pieces(pieces, None, out);
                    // Trailing blank text of a plain answer is content.
                    if let Some(c) = self.calls.as_mut().filter(|c| c.count == 0 && !c.blank.is_empty()) {
                        let blank = std::mem::take(&mut c.blank);
                        out.push(self.chunk(Self::choice(json!({"content": blank}), None, None), None));
                    }
                    if self.calls.as_ref().is_some_and(|c| c.count > 0) && finish_reason == FinishReason::Stop {
                        reason = "tool_calls";
                    }
                }
                let choices = json!([{"index": 0, "delta": {}, "logprobs": null, "finish_reason": reason}]);
                out.push(self.chunk(choices, None));
                if self.closes {
                    self.close(usage, out);
                }
            }
            Step::Failed(e) => stream_error(&e, out),
        }
    }

    fn close(&mut self, usage: Usage, out: &mut Vec<Bytes>) {
        if self.include_usage {
            out.push(self.chunk(json!([]), Some(usage_json(&usage))));
        }
        out.push(Bytes::from_static(DONE));
    }
}

/// `text_completion` stream of one choice.
struct CompletionEncoder {
    head: Head,
    include_usage: bool,
    /// Characters streamed so far (for `text_offset`).
    chars: usize,
    /// As [`ChatEncoder`]'s.
    index: usize,
    closes: bool,
}

impl CompletionEncoder {
    fn chunk(&self, choices: Value, usage: Option<Value>) -> Bytes {
        let mut v = json!({
            "id": self.head.id,
            "object": "text_completion",
            "created": self.head.created,
            "model": self.head.model,
            "choices": stamp_index(choices, self.index),
        });
        if self.include_usage {
            v["usage"] = usage.unwrap_or(Value::Null);
        }
        sse_data(&v)
    }
}

impl Encoder for CompletionEncoder {
    fn start(&mut self, _out: &mut Vec<Bytes>) {}

    fn step(&mut self, step: Step, out: &mut Vec<Bytes>) {
        match step {
            Step::Token { text, logprob } => {
                if text.is_empty() && logprob.is_none() {
                    return;
                }
                let logprobs = logprob.as_ref().map(|lp| completion_logprobs(std::slice::from_ref(lp), &[self.chars]));
                self.chars += text.chars().count();
                let choices = json!([{
                    "index": 0,
                    "text": text,
                    "logprobs": logprobs,
                    "finish_reason": null,
                }]);
                out.push(self.chunk(choices, None));
            }
            Step::Done { finish_reason, usage, .. } => {
                let choices = json!([{
                    "index": 0,
                    "text": "",
                    "logprobs": null,
                    "finish_reason": finish_reason.as_str(),
                }]);
                out.push(self.chunk(choices, None));
                if self.closes {
                    self.close(usage, out);
                }
            }
            Step::Failed(e) => stream_error(&e, out),
        }
    }

    fn close(&mut self, usage: Usage, out: &mut Vec<Bytes>) {
        if self.include_usage {
            out.push(self.chunk(json!([]), Some(usage_json(&usage))));
        }
        out.push(Bytes::from_static(DONE));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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

    #[test]
    fn logprob_shapes() {
        let e = |id, token: &str, logprob| LogprobEntry {
            id,
            token: token.into(),
            bytes: token.as_bytes().to_vec(),
            logprob,
        };
        let lp = TokenLogprob { chosen: e(1, "a", -0.1), top: vec![e(1, "a", -0.1), e(2, "b", f32::NEG_INFINITY)] };
        assert_eq!(
            chat_logprob(&lp),
            json!({"token": "a", "logprob": -0.1, "bytes": [97], "top_logprobs": [
                {"token": "a", "logprob": -0.1, "bytes": [97]},
                {"token": "b", "logprob": -9999.0, "bytes": [98]},
            ]})
        );
        assert_eq!(
            completion_logprobs(&[lp], &[0]),
            json!({"tokens": ["a"], "token_logprobs": [-0.1],
                   "top_logprobs": [{"a": -0.1, "b": -9999.0}], "text_offset": [0]})
        );
    }
}
