//! Anthropic Messages API: `POST /v1/messages` and `POST /v1/messages/count_tokens`, streaming
//! (named SSE events, `stream.rs`) and not, over the same backend. Errors use Anthropic's shape
//! (`{"type": "error", "error": {"type", "message"}}`).
//!
//! Tools (`content.rs` reads them and the `tool_use` / `tool_result` history): calls are parsed
//! out of the output in the model's format and answered as `tool_use` blocks with
//! `stop_reason: "tool_use"`; `tool_choice` `any` and `tool` constrain decoding to a call
//! exactly as OpenAI's `required` and named function do (the same grammar, `tools/`).
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

mod content;
mod stream;

use crate::backend::{FinishReason, Prompt, Usage};
use crate::error::{AnthropicError, ApiError};
use crate::generation::{self, collect, sse_response, sse_stream, Spec};
use crate::models::ModelNames;
use crate::params::{
    check_model, max_tokens_bound, parse_object, read_body, sampling, stop_strings, Fields, SamplingRanges,
};
use crate::server::AppState;
use crate::tools::{call_grammar, output_format, split_output, ParsedCall, ToolRequest};
use content::{conversation, tool_request};
use stream::MessagesEncoder;

/// Request fields accepted and ignored (`cache_control` at the top level asks for prompt
/// caching, which the session bank does for every request anyway).
const IGNORED: &[&str] = &["metadata", "service_tier", "cache_control"];

const ANTHROPIC_RANGES: SamplingRanges = SamplingRanges { max_temperature: 1.0 };

/// A parsed Messages request.
#[derive(Debug)]
pub(crate) struct MessagesRequest {
    pub model: String,
    pub tools: ToolRequest,
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
    let messages = conversation(f)?;
    let stream = f.bool("stream")?.unwrap_or(false);
    let sampling = sampling(f, &ANTHROPIC_RANGES)?;
    let stop = stop_strings(f, "stop_sequences")?;
    let tools = tool_request(f)?;
    reject_unsupported(f)?;
    Ok(MessagesRequest {
        model,
        spec: Spec {
            prompt: Prompt::Chat { messages, tools: tools.tools.clone() },
            prompt_param: "messages",
            max_tokens: Some(max_tokens),
            max_tokens_param: "max_tokens",
            sampling,
            stop,
            logprobs: None,
            grammar: None,
        },
        tools,
        stream,
    })
}

/// Refuses the fields this server does not implement.
fn reject_unsupported(f: &mut Fields) -> Result<(), ApiError> {
    let is_empty_array = |v: &Value| v.as_array().is_some_and(Vec::is_empty);
    f.reject_unless("mcp_servers", "MCP servers are not supported", is_empty_array)?;
    f.reject_unless("thinking", "extended thinking is not supported", |v| {
        v.get("type").and_then(Value::as_str) == Some("disabled")
    })?;
    f.reject_unless("container", "containers are not supported", |_| false)?;
    Ok(())
}

/// `POST /v1/messages/count_tokens`: the prompt tokens a Messages request with this `system`,
/// `messages` and `tools` would have, rendered and tokenized exactly as `/v1/messages` does:
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
    let messages = conversation(&mut f)?;
    let tools = tool_request(&mut f)?;
    reject_unsupported(&mut f)?;
    f.finish(IGNORED)?;
    let backend = state.backend.clone();
    let prompt = Prompt::Chat { messages, tools: tools.tools };
    let prepared = tokio::task::spawn_blocking(move || backend.prepare(&prompt))
        .await
        .map_err(|e| ApiError::internal(format!("preparing the prompt failed: {e}")))??;
    Ok(Json(json!({"input_tokens": prepared.token_ids.len()})).into_response())
}

/// Anthropic's `stop_reason` (`called`: the output made tool calls).
fn stop_reason(finish: FinishReason, stop_sequence: &Option<String>, called: bool) -> &'static str {
    match (finish, stop_sequence) {
        (FinishReason::Length, _) => "max_tokens",
        (FinishReason::Stop, _) if called => "tool_use",
        (FinishReason::Stop, Some(_)) => "stop_sequence",
        (FinishReason::Stop, None) => "end_turn",
    }
}

/// A `tool_use` block's id (`toolu_` and 24 hex digits), unique per message id and index.
fn tool_use_id(message_id: &str, index: usize) -> String {
    let call = crate::tools::call_id(message_id, index);
    format!("toolu_{}", call.trim_start_matches("call_"))
}

/// A parsed call as a `tool_use` block: `input` is its arguments object (arguments that are
/// not a JSON object, which only unconstrained output can produce, become `{}`).
fn tool_use_block(call: &ParsedCall, id: String) -> Value {
    let input = match serde_json::from_str::<Value>(&call.arguments) {
        Ok(v @ Value::Object(_)) => v,
        _ => json!({}),
    };
    json!({"type": "tool_use", "id": id, "name": call.name, "input": input})
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
    let mut spec = req.spec;
    let calls = output_format(backend.tool_call_format(), &req.tools, "tool_choice")?;
    if let Some(grammar) = calls.as_ref().and_then(|c| call_grammar(&req.tools, c.format)) {
        spec.grammar = Some((grammar, "tools"));
    }
    let job = generation::start(&state, arrived, spec).await?;
    let id = state.request_id("msg_");
    if req.stream {
        let encoder = MessagesEncoder::new(id, req.model, job.prompt_tokens, calls.as_ref());
        return Ok(sse_response(sse_stream(job, encoder)));
    }
    let c = collect(job).await?;
    let (content, called) = match &calls {
        None => (json!([{"type": "text", "text": c.text}]), false),
        Some(syntax) => {
            let (text, calls) = split_output(syntax, &c.text);
            let mut blocks = Vec::new();
            if !text.is_empty() || calls.is_empty() {
                blocks.push(json!({"type": "text", "text": text}));
            }
            blocks.extend(calls.iter().enumerate().map(|(i, call)| tool_use_block(call, tool_use_id(&id, i))));
            (Value::Array(blocks), !calls.is_empty())
        }
    };
    Ok(Json(json!({
        "id": id,
        "type": "message",
        "role": "assistant",
        "model": req.model,
        "content": content,
        "stop_reason": stop_reason(c.finish_reason, &c.stop_sequence, called),
        "stop_sequence": c.stop_sequence,
        "usage": usage_json(&c.usage),
    }))
    .into_response())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::{ChatMessage, Role};

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
            (
                r#"{"max_tokens": 5, "messages": [{"role": "user", "content": "x"}], "tools": [{"name": "t"}]}"#,
                "tools[0].input_schema",
            ),
            (r#"{"max_tokens": -5, "messages": [{"role": "user", "content": "x"}]}"#, "max_tokens"),
        ] {
            let e = parse(body).unwrap_err();
            assert_eq!(e.param.as_deref(), Some(param), "{body}: {e:?}");
        }
    }

    #[test]
    fn stop_reasons() {
        assert_eq!(stop_reason(FinishReason::Length, &None, false), "max_tokens");
        assert_eq!(stop_reason(FinishReason::Length, &None, true), "max_tokens");
        assert_eq!(stop_reason(FinishReason::Stop, &None, false), "end_turn");
        assert_eq!(stop_reason(FinishReason::Stop, &None, true), "tool_use");
        assert_eq!(stop_reason(FinishReason::Stop, &Some("x".into()), false), "stop_sequence");
    }
}
