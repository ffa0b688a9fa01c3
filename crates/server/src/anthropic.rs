//! Anthropic Messages API: `POST /v1/messages` and `POST /v1/messages/count_tokens`, streaming (named SSE events `message_start`,
//! `content_block_start`, `ping`, `content_block_delta`, `content_block_stop`,
//! `message_delta`, `message_stop`; `error` on failure) and not, over the same backend.
//! Errors use Anthropic's shape (`{"type": "error", "error": {"type", "message"}}`).
//!
//! Usage follows Anthropic's accounting: `input_tokens` counts the prompt tokens that were
//! computed, `cache_read_input_tokens` those reused from the session bank.

use std::sync::Arc;
use std::time::Instant;

use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::Json;
use bytes::Bytes;
use serde_json::{json, Value};

use crate::backend::{ChatMessage, FinishReason, Prompt, Role, Usage};
use crate::error::{AnthropicError, ApiError, Dialect};
use crate::generation::{self, collect, sse_event, sse_response, sse_stream, Encoder, Spec, Step};
use crate::models::ModelNames;
use crate::openai::content_text;
use crate::params::{
    check_model, kind_of, max_tokens_bound, parse_object, read_body, sampling, stop_strings, Fields, SamplingRanges,
};
use crate::server::AppState;

/// Request fields accepted and ignored.
const IGNORED: &[&str] = &["metadata", "service_tier"];

const ANTHROPIC_RANGES: SamplingRanges = SamplingRanges { max_temperature: 1.0 };

/// A parsed Messages request.
#[derive(Debug)]
pub(crate) struct MessagesRequest {
    pub model: String,
    pub spec: Spec,
    pub stream: bool,
}

/// Validates a Messages request body.
pub(crate) fn parse_messages_request(
    f: &mut Fields,
    served: &ModelNames,
    window: usize,
) -> Result<MessagesRequest, ApiError> {
    let model = check_model(f, served)?;
    let max_tokens = match f.integer("max_tokens")? {
        Some(n) => max_tokens_bound("max_tokens", n, window)?,
        None => return Err(ApiError::invalid("max_tokens", "max_tokens: Field required")),
    };
    let messages = parse_conversation(f)?;
    let stream = f.bool("stream")?.unwrap_or(false);
    let sampling = sampling(f, &ANTHROPIC_RANGES)?;
    let stop = stop_strings(f, "stop_sequences")?;
    reject_unsupported(f)?;
    Ok(MessagesRequest {
        model,
        spec: Spec {
            prompt: Prompt::Chat { messages, tools: Vec::new() },
            prompt_param: "messages",
            max_tokens: Some(max_tokens),
            max_tokens_param: "max_tokens",
            sampling,
            stop,
            logprobs: None,
            grammar: None,
        },
        stream,
    })
}

/// The `system` and `messages` fields as one conversation (system first).
fn parse_conversation(f: &mut Fields) -> Result<Vec<ChatMessage>, ApiError> {
    let mut messages = Vec::new();
    match f.take("system") {
        None => {}
        Some(v) => {
            let content = content_text(v, "system")?;
            messages.push(ChatMessage::new(Role::System, content));
        }
    }
    match f.take("messages") {
        None => return Err(ApiError::invalid("messages", "messages: Field required")),
        Some(Value::Array(items)) if items.is_empty() => {
            return Err(ApiError::invalid("messages", "messages: at least one message is required"))
        }
        Some(Value::Array(items)) => {
            for (i, item) in items.into_iter().enumerate() {
                messages.push(parse_message(i, item)?);
            }
        }
        Some(v) => {
            return Err(ApiError::invalid("messages", format!("messages: expected an array, but got {}", kind_of(&v))))
        }
    }
    Ok(messages)
}

/// Refuses the fields this server does not implement (an empty `tools` list and `tool_choice`
/// `auto`/`none` change nothing, so they pass).
fn reject_unsupported(f: &mut Fields) -> Result<(), ApiError> {
    let is_empty_array = |v: &Value| v.as_array().is_some_and(Vec::is_empty);
    f.reject_unless("tools", "tool use is not implemented", is_empty_array)?;
    f.reject_unless("mcp_servers", "MCP servers are not supported", is_empty_array)?;
    f.reject_unless("tool_choice", "tool use is not implemented", |v| {
        matches!(v.get("type").and_then(Value::as_str), Some("auto" | "none"))
    })?;
    f.reject_unless("thinking", "extended thinking is not supported", |v| {
        v.get("type").and_then(Value::as_str) == Some("disabled")
    })?;
    f.reject_unless("container", "containers are not supported", |_| false)?;
    Ok(())
}

/// `POST /v1/messages/count_tokens`: the prompt tokens a Messages request with this `system`
/// and `messages` would have, rendered and tokenized exactly as `/v1/messages` does:
/// `{"input_tokens": N}`.
pub(crate) async fn count_tokens(State(state): State<Arc<AppState>>, body: Result<Bytes, BytesRejection>) -> Response {
    match count(state, body).await {
        Ok(r) => r,
        Err(e) => AnthropicError(e).into_response(),
    }
}

async fn count(state: Arc<AppState>, body: Result<Bytes, BytesRejection>) -> Result<Response, ApiError> {
    let body = read_body(body, state.max_body_bytes)?;
    let mut f = parse_object(&body)?;
    check_model(&mut f, &state.models)?;
    let messages = parse_conversation(&mut f)?;
    reject_unsupported(&mut f)?;
    f.finish(IGNORED)?;
    let backend = state.backend.clone();
    let prompt = Prompt::Chat { messages, tools: Vec::new() };
    let prepared = tokio::task::spawn_blocking(move || backend.prepare(&prompt))
        .await
        .map_err(|e| ApiError::internal(format!("preparing the prompt failed: {e}")))??;
    Ok(Json(json!({"input_tokens": prepared.token_ids.len()})).into_response())
}

fn parse_message(i: usize, item: Value) -> Result<ChatMessage, ApiError> {
    let at = |field: &str| format!("messages[{i}]{field}");
    let Value::Object(mut m) = item else {
        return Err(ApiError::invalid(at(""), format!("{}: expected an object, but got {}", at(""), kind_of(&item))));
    };
    let role = match m.remove("role") {
        Some(Value::String(r)) if r == "user" => Role::User,
        Some(Value::String(r)) if r == "assistant" => Role::Assistant,
        Some(Value::String(r)) if r == "system" => {
            return Err(ApiError::invalid(
                at(".role"),
                "Unexpected role \"system\". The Messages API accepts a top-level `system` \
                 parameter, not \"system\" as an input message role.",
            ))
        }
        Some(Value::String(r)) => {
            return Err(ApiError::invalid(
                at(".role"),
                format!("{}: unexpected role \"{r}\"; expected \"user\" or \"assistant\"", at(".role")),
            ))
        }
        None | Some(Value::Null) => {
            return Err(ApiError::invalid(at(".role"), format!("{}: Field required", at(".role"))))
        }
        Some(v) => {
            return Err(ApiError::invalid(
                at(".role"),
                format!("{}: expected a string, but got {}", at(".role"), kind_of(&v)),
            ))
        }
    };
    let content = match m.remove("content") {
        None | Some(Value::Null) => {
            return Err(ApiError::invalid(at(".content"), format!("{}: Field required", at(".content"))))
        }
        Some(v) => content_text(v, &at(".content"))?,
    };
    Ok(ChatMessage::new(role, content))
}

/// Anthropic's `stop_reason`.
fn stop_reason(finish: FinishReason, stop_sequence: &Option<String>) -> &'static str {
    match (finish, stop_sequence) {
        (FinishReason::Length, _) => "max_tokens",
        (FinishReason::Stop, Some(_)) => "stop_sequence",
        (FinishReason::Stop, None) => "end_turn",
    }
}

fn usage_json(u: &Usage) -> Value {
    json!({
        "input_tokens": u.prompt_tokens.saturating_sub(u.cached_tokens),
        "output_tokens": u.completion_tokens,
        "cache_read_input_tokens": u.cached_tokens,
        "cache_creation_input_tokens": 0,
    })
}

pub(crate) async fn messages(State(state): State<Arc<AppState>>, body: Result<Bytes, BytesRejection>) -> Response {
    let arrived = Instant::now();
    match run(state, arrived, body).await {
        Ok(r) => r,
        Err(e) => AnthropicError(e).into_response(),
    }
}

async fn run(
    state: Arc<AppState>,
    arrived: Instant,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let body = read_body(body, state.max_body_bytes)?;
    let mut f = parse_object(&body)?;
    let backend = &state.backend;
    let req = parse_messages_request(&mut f, &state.models, backend.context_window())?;
    f.finish(IGNORED)?;
    let job = generation::start(&state, arrived, req.spec).await?;
    let id = state.request_id("msg_");
    if req.stream {
        let encoder = MessagesEncoder { id, model: req.model, prompt_tokens: job.prompt_tokens };
        return Ok(sse_response(sse_stream(job, encoder)));
    }
    let c = collect(job).await?;
    Ok(Json(json!({
        "id": id,
        "type": "message",
        "role": "assistant",
        "model": req.model,
        "content": [{"type": "text", "text": c.text}],
        "stop_reason": stop_reason(c.finish_reason, &c.stop_sequence),
        "stop_sequence": c.stop_sequence,
        "usage": usage_json(&c.usage),
    }))
    .into_response())
}

/// The Messages event stream: one text content block.
struct MessagesEncoder {
    id: String,
    model: String,
    prompt_tokens: usize,
}

impl Encoder for MessagesEncoder {
    fn start(&mut self, out: &mut Vec<Bytes>) {
        out.push(sse_event(
            "message_start",
            &json!({
                "type": "message_start",
                "message": {
                    "id": self.id,
                    "type": "message",
                    "role": "assistant",
                    "model": self.model,
                    "content": [],
                    "stop_reason": null,
                    "stop_sequence": null,
                    "usage": {"input_tokens": self.prompt_tokens, "output_tokens": 0},
                },
            }),
        ));
        out.push(sse_event(
            "content_block_start",
            &json!({
                "type": "content_block_start",
                "index": 0,
                "content_block": {"type": "text", "text": ""},
            }),
        ));
        out.push(sse_event("ping", &json!({"type": "ping"})));
    }

    fn step(&mut self, step: Step, out: &mut Vec<Bytes>) {
        match step {
            Step::Token { text, .. } => {
                if !text.is_empty() {
                    out.push(sse_event(
                        "content_block_delta",
                        &json!({
                            "type": "content_block_delta",
                            "index": 0,
                            "delta": {"type": "text_delta", "text": text},
                        }),
                    ));
                }
            }
            Step::Done { finish_reason, stop_sequence, usage } => {
                out.push(sse_event("content_block_stop", &json!({"type": "content_block_stop", "index": 0})));
                out.push(sse_event(
                    "message_delta",
                    &json!({
                        "type": "message_delta",
                        "delta": {
                            "stop_reason": stop_reason(finish_reason, &stop_sequence),
                            "stop_sequence": stop_sequence,
                        },
                        "usage": usage_json(&usage),
                    }),
                ));
                out.push(sse_event("message_stop", &json!({"type": "message_stop"})));
            }
            Step::Failed(e) => out.push(sse_event("error", &e.body(Dialect::Anthropic))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(body: &str) -> Result<MessagesRequest, ApiError> {
        let mut f = parse_object(body.as_bytes())?;
        let r = parse_messages_request(&mut f, &ModelNames::single("m"), 100)?;
        f.finish(IGNORED)?;
        Ok(r)
    }

    #[test]
    fn system_and_blocks_become_chat_messages() {
        let r = parse(
            r#"{"model": "m", "max_tokens": 8, "system": [{"type": "text", "text": "sys"}],
                "messages": [{"role": "user", "content": [{"type": "text", "text": "hi",
                "cache_control": {"type": "ephemeral"}}]}], "stop_sequences": ["x"],
                "metadata": {"user_id": "u"}}"#,
        )
        .unwrap();
        assert_eq!(
            r.spec.prompt,
            Prompt::Chat {
                tools: vec![],
                messages: vec![ChatMessage::new(Role::System, "sys"), ChatMessage::new(Role::User, "hi"),]
            }
        );
        assert_eq!(r.spec.stop, vec!["x"]);
        assert_eq!(r.spec.max_tokens, Some(8));
    }

    #[test]
    fn rejections() {
        for (body, param) in [
            (r#"{"messages": [{"role": "user", "content": "x"}]}"#, "max_tokens"),
            (r#"{"max_tokens": 5, "messages": []}"#, "messages"),
            (r#"{"max_tokens": 5, "messages": [{"role": "system", "content": "x"}]}"#, "messages[0].role"),
            (
                r#"{"max_tokens": 5, "messages": [{"role": "user", "content": [{"type": "image"}]}]}"#,
                "messages[0].content[0].type",
            ),
            (r#"{"max_tokens": 5, "messages": [{"role": "user", "content": "x"}], "temperature": 1.5}"#, "temperature"),
            (r#"{"max_tokens": 5, "messages": [{"role": "user", "content": "x"}], "tools": [{"name": "t"}]}"#, "tools"),
            (r#"{"max_tokens": -5, "messages": [{"role": "user", "content": "x"}]}"#, "max_tokens"),
        ] {
            let e = parse(body).unwrap_err();
            assert_eq!(e.param.as_deref(), Some(param), "{body}: {e:?}");
        }
    }

    #[test]
    fn stop_reasons() {
        assert_eq!(stop_reason(FinishReason::Length, &None), "max_tokens");
        assert_eq!(stop_reason(FinishReason::Stop, &None), "end_turn");
        assert_eq!(stop_reason(FinishReason::Stop, &Some("x".into())), "stop_sequence");
    }
}
