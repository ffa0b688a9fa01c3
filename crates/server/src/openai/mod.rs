//! OpenAI-compatible endpoints: `POST /v1/chat/completions` and `POST /v1/completions`,
//! streaming (SSE `data: {...}` chunks, `data: [DONE]`) and not, in OpenAI's exact shapes.
//!
//! Each handler: read the body (size limit) → parse and validate every field
//! ([`parse_chat`], [`parse_completion`], `request.rs`) → [`generation::start`] → either
//! collect and answer with one JSON object, or stream chunks through an
//! [`Encoder`](crate::generation::Encoder) (`stream.rs`).

mod request;
mod stream;

use std::sync::Arc;
use std::time::Instant;

use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::Json;
use bytes::Bytes;
use serde_json::{json, Map, Value};

use crate::backend::{FinishReason, LogprobEntry, TokenLogprob, Usage};
use crate::choices::choices_stream;
use crate::error::ApiError;
use crate::generation::{self, collect_all, Collected};
use crate::params::{logprob_json, parse_object, read_body};
use crate::server::{unix_now, AppState};
use crate::tools::{call_grammar, call_id, output_format, split_output, CallSyntax, ParsedCall};

pub(crate) use request::content_text;
use request::{parse_chat, parse_completion, IGNORED};
use stream::{ChatEncoder, CompletionEncoder};

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
    let calls = output_format(state.backend.tool_call_format(), &req.tools, "tool_choice")?;
    // A `response_format` under `auto` wins: the output is its JSON (a forced call cannot be
    // combined with one; parse_chat refuses that).
    if let Some(grammar) =
        calls.as_ref().filter(|_| spec.grammar.is_none()).and_then(|c| call_grammar(&req.tools, c.format))
    {
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
                let encoders = (0..jobs.len())
                    .map(|index| ChatEncoder::new(head.clone(), include_usage, calls.as_ref(), index, closes));
                choices_stream(jobs, encoders.collect())
            }
            Endpoint::Completion => {
                let encoders =
                    (0..jobs.len()).map(|index| CompletionEncoder::new(head.clone(), include_usage, index, closes));
                choices_stream(jobs, encoders.collect())
            }
        });
    }
    let collected = collect_all(jobs).await?;
    let choices: Vec<Value> = collected
        .iter()
        .enumerate()
        .map(|(index, c)| choice_json(endpoint, index, c, want_logprobs, calls.as_ref(), &head.id))
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
        "usage": usage_json(&Usage::of_choices(collected.iter().map(|c| c.usage))),
    }))
    .into_response())
}

/// Choice `index` of a whole (not streamed) response.
fn choice_json(
    endpoint: Endpoint,
    index: usize,
    c: &Collected,
    want_logprobs: bool,
    calls: Option<&CallSyntax>,
    request_id: &str,
) -> Value {
    let mut finish_reason = c.finish_reason.as_str();
    let mut choice = match endpoint {
        Endpoint::Chat => {
            let logprobs = want_logprobs
                .then(|| json!({"content": c.logprobs.iter().map(chat_logprob).collect::<Vec<_>>(), "refusal": null}));
            let mut message = json!({"role": "assistant", "content": c.text, "refusal": null});
            if let Some(syntax) = calls {
                let (text, calls) = split_output(syntax, &c.text);
                let calls: Vec<Value> = calls
                    .iter()
                    .enumerate()
                    .map(|(i, call)| call_json(call, call_id(&choice_seed(request_id, index), i)))
                    .collect();
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

/// What a call id is made from: the response id and, with several choices, the choice, so
/// ids never repeat across the choices of one response.
fn choice_seed(request_id: &str, choice: usize) -> String {
    format!("{request_id}/{choice}")
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

#[cfg(test)]
mod tests {
    use super::*;

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
