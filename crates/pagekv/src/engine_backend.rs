//! The adapter between the server's [`Backend`] seam and the engine: templating and
//! tokenizing prompts, translating requests and events, forwarding a request's events from the
//! engine's stream to the server's (one small thread per request), and cancelling the engine
//! request when the server drops its stream.
//!
//! It lives in the binary, the one crate above both the engine and the server.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use kvcache::{AttentionRoute, FallbackReason};
use pagekv_engine::sampling::DEFAULT_SEED;
use pagekv_engine::{self as engine, EngineError, EngineHandle};
use pagekv_model::template::{ChatMessage as TemplateMessage, ChatTemplate, ToolCallFormat as TemplateToolFormat};
use pagekv_model::tokenizer::Tokenizer;
use pagekv_server::{
    AttentionCalls, Backend, BackendError, BackendErrorKind, BackendMetrics, Event, EventSender, EventStream,
    FallbackCalls, FinishReason, GenerationRequest, Grammar, LogprobEntry, PreparedPrompt, Prompt, Role, TokenLogprob,
    Tool, ToolCallFormat, Usage, INVALID_GRAMMAR,
};

/// How often a forwarding thread checks whether the client went away while the engine is quiet.
const CANCEL_POLL: Duration = Duration::from_millis(20);

pub struct EngineBackend {
    handle: EngineHandle,
    tokenizer: Arc<Tokenizer>,
    template: ChatTemplate,
    model_id: String,
    context_window: usize,
    /// Seeds for requests that name none (each such request samples differently, as OpenAI's do).
    seeds: AtomicU64,
}

impl EngineBackend {
    pub fn new(
        handle: EngineHandle,
        tokenizer: Arc<Tokenizer>,
        template: ChatTemplate,
        model_id: String,
    ) -> EngineBackend {
        let context_window = handle.info().context_window;
        let t = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos() as u64);
        EngineBackend { handle, tokenizer, template, model_id, context_window, seeds: AtomicU64::new(DEFAULT_SEED ^ t) }
    }

    fn translate(&self, r: GenerationRequest) -> engine::GenerationRequest {
        let seed = r.sampling.seed.unwrap_or_else(|| self.seeds.fetch_add(0x9E37_79B9_7F4A_7C15, Ordering::Relaxed));
        engine::GenerationRequest {
            prompt: r.prompt,
            sampling: engine::SamplingParams {
                temperature: r.sampling.temperature,
                top_k: r.sampling.top_k.map_or(0, |k| k as usize),
                top_p: r.sampling.top_p,
                min_p: r.sampling.min_p,
                presence_penalty: r.sampling.presence_penalty,
                frequency_penalty: r.sampling.frequency_penalty,
                seed,
                ..engine::SamplingParams::default()
            },
            stop: engine::StopConditions { stop_strings: r.stop, stop_tokens: Vec::new(), max_tokens: r.max_tokens },
            logprobs: r.logprobs,
            ignore_eos: false,
            grammar: r.grammar.map(grammar),
            speculative: true,
        }
    }
}

impl EngineBackend {
    /// The server-side stream of one engine stream, fed by a forwarding thread.
    fn relay(&self, mut stream: engine::RequestStream) -> Result<EventStream, BackendError> {
        let (tx, rx) = EventStream::channel();
        let tokenizer = self.tokenizer.clone();
        std::thread::Builder::new()
            .name("pagekv-forward".into())
            .spawn(move || forward(&mut stream, &tx, &tokenizer))
            .map_err(|e| {
                BackendError::new(BackendErrorKind::Overloaded, format!("cannot start a request thread: {e}"))
            })?;
        Ok(rx)
    }
}

impl Backend for EngineBackend {
    fn model_id(&self) -> &str {
        &self.model_id
    }

    fn context_window(&self) -> usize {
        self.context_window
    }

    fn prepare(&self, prompt: &Prompt) -> Result<PreparedPrompt, BackendError> {
        let invalid = |e: &dyn std::fmt::Display| BackendError::new(BackendErrorKind::InvalidRequest, e.to_string());
        let token_ids = match prompt {
            Prompt::Chat { messages, tools } => {
                let msgs: Vec<TemplateMessage> = messages.iter().map(template_message).collect();
                let tools: Vec<serde_json::Value> = tools.iter().map(template_tool).collect();
                // A trailing assistant message is continued, not answered.
                let add_generation_prompt = messages.last().is_none_or(|m| m.role != Role::Assistant);
                let text =
                    self.template.render_with_tools(&msgs, &tools, add_generation_prompt).map_err(|e| invalid(&e))?;
                self.tokenizer.encode(&text, true).map_err(|e| invalid(&e))?
            }
            Prompt::Text(text) => self.tokenizer.encode_with_bos(text, true).map_err(|e| invalid(&e))?,
            Prompt::Tokens(ids) => {
                let vocab = self.tokenizer.vocab_size();
                if let Some((i, id)) = ids.iter().enumerate().find(|(_, &id)| id as usize >= vocab) {
                    return Err(BackendError::new(
                        BackendErrorKind::InvalidRequest,
                        format!("token id {id} at position {i} is outside the vocabulary of {vocab}"),
                    ));
                }
                ids.clone()
            }
        };
        Ok(PreparedPrompt { token_ids })
    }

    fn submit(&self, request: GenerationRequest) -> Result<EventStream, BackendError> {
        let stream = self.handle.submit(self.translate(request)).map_err(backend_error)?;
        self.relay(stream)
    }

    /// The engine prefills the prompt once and forks its cache into the `n` choices.
    fn submit_n(&self, request: GenerationRequest, n: usize) -> Result<Vec<EventStream>, BackendError> {
        let streams = self.handle.submit_n(self.translate(request), n).map_err(backend_error)?;
        streams.into_iter().map(|s| self.relay(s)).collect()
    }

    fn tool_call_format(&self) -> Option<ToolCallFormat> {
        let special = |text: &str| self.tokenizer.token_id(text).filter(|&id| self.tokenizer.is_special(id));
        self.template.tool_call_format().map(|f| match f {
            TemplateToolFormat::Hermes => ToolCallFormat::Hermes,
            TemplateToolFormat::Llama3Json => ToolCallFormat::Llama3Json,
            TemplateToolFormat::Mistral { args } => {
                ToolCallFormat::Mistral { args, tool_calls: special("[TOOL_CALLS]"), args_token: special("[ARGS]") }
            }
        })
    }

    fn metrics(&self) -> BackendMetrics {
        let m = self.handle.metrics();
        let format = m.cache.format.clone();
        BackendMetrics {
            running_sequences: m.running as u64,
            waiting_sequences: m.waiting as u64,
            kv_blocks_total: m.blocks_total as u64,
            kv_blocks_used: m.blocks_used as u64,
            kv_blocks_free: m.blocks_free as u64,
            kv_blocks_cached: m.blocks_cached as u64,
            kv_blocks_shared: m.blocks_shared as u64,
            sequence_forks: m.sequence_forks,
            grammar_masks: m.masks_computed,
            grammar_mask_seconds: m.mask_seconds,
            kv_group_blocks: m
                .group_blocks
                .iter()
                .map(|&(kind, n)| match kind {
                    kvcache::GroupKind::Full => ("full".to_string(), n as u64),
                    kvcache::GroupKind::Sliding { window } => (format!("sliding_{window}"), n as u64),
                })
                .collect(),
            session_bank_hits: m.bank_hits,
            session_bank_misses: m.bank_misses,
            session_bank_evictions: m.bank_evictions,
            preemptions: m.preemptions,
            computed_tokens: m.computed_tokens,
            kv_pool_utilization: m.pool_utilization(),
            generated_tokens: m.generated_tokens,
            sequence_steps: m.sampling_steps,
            draft_steps: m.draft_steps,
            draft_tokens: m.draft_tokens,
            draft_accepted_tokens: m.draft_accepted_tokens,
            attention_calls: AttentionRoute::ALL
                .iter()
                .map(|&r| AttentionCalls { route: r.name().into(), format: format.clone(), calls: m.cache.calls(r) })
                .collect(),
            fallbacks: FallbackReason::ALL
                .iter()
                .map(|&r| FallbackCalls { reason: r.name().into(), calls: m.cache.fallbacks_for(r) })
                .collect(),
        }
    }
}

/// Moves one request's events from the engine to the server as they come. Text the engine
/// releases only at `Done` (held back as a possible stop-string start, then freed by a stop
/// token or the length limit) goes out as one more `Token` event with the last token's id, so
/// the concatenated `Token` texts are the whole output. Returning drops the engine stream, which
/// cancels the request if it is still running.
fn forward(stream: &mut engine::RequestStream, tx: &EventSender, tokenizer: &Tokenizer) {
    let mut last_id = None;
    loop {
        let event = match stream.recv_timeout(CANCEL_POLL) {
            Ok(e) => e,
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {
                if tx.is_cancelled() {
                    return;
                }
                continue;
            }
            Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => {
                let _ = tx.send(Event::Error(BackendError::new(BackendErrorKind::Internal, "the engine stopped")));
                return;
            }
        };
        match event {
            engine::Event::Token { id, text, logprobs } => {
                last_id = Some(id);
                let logprob = logprobs.map(|l| token_logprob(&l, tokenizer));
                if tx.send(Event::Token { id, text, logprob }).is_err() {
                    return;
                }
            }
            engine::Event::Done { finish_reason, usage, text, stop_sequence } => {
                if let (false, Some(id)) = (text.is_empty(), last_id) {
                    if tx.send(Event::Token { id, text, logprob: None }).is_err() {
                        return;
                    }
                }
                let finish_reason = match finish_reason {
                    engine::FinishReason::Stop => FinishReason::Stop,
                    engine::FinishReason::Length => FinishReason::Length,
                };
                let usage = Usage {
                    prompt_tokens: usage.prompt_tokens,
                    cached_tokens: usage.cached_tokens,
                    completion_tokens: usage.completion_tokens,
                };
                let _ = tx.send(Event::Done { finish_reason, stop_sequence, usage });
                return;
            }
            engine::Event::Error(e) => {
                let _ = tx.send(Event::Error(backend_error(e)));
                return;
            }
        }
    }
}

fn token_logprob(l: &engine::TokenLogprobs, tokenizer: &Tokenizer) -> TokenLogprob {
    let entry = |id: u32, logprob: f32| {
        let bytes = tokenizer.piece(id, false).map(<[u8]>::to_vec).unwrap_or_default();
        LogprobEntry { id, token: String::from_utf8_lossy(&bytes).into_owned(), bytes, logprob }
    };
    TokenLogprob { chosen: entry(l.token, l.logprob), top: l.top.iter().map(|&(id, lp)| entry(id, lp)).collect() }
}

/// A message as Hugging Face templates read it: calls with `arguments` as an object (OpenAI
/// carries them as JSON text; the server checked that they parse).
fn template_message(m: &pagekv_server::ChatMessage) -> TemplateMessage {
    let tool_calls = (!m.tool_calls.is_empty()).then(|| {
        m.tool_calls
            .iter()
            .map(|c| {
                let arguments: serde_json::Value =
                    serde_json::from_str(&c.arguments).unwrap_or_else(|_| serde_json::Value::String(c.arguments.clone()));
                serde_json::json!({"id": c.id, "type": "function", "function": {"name": c.name, "arguments": arguments}})
            })
            .collect()
    });
    TemplateMessage {
        tool_calls,
        tool_call_id: m.tool_call_id.clone(),
        ..TemplateMessage::new(m.role.as_str(), m.content.as_str())
    }
}

/// A tool as `apply_chat_template` receives it: `{"type": "function", "function": {…}}`.
fn template_tool(t: &Tool) -> serde_json::Value {
    let mut function = serde_json::json!({"name": t.name});
    if let Some(d) = &t.description {
        function["description"] = serde_json::json!(d);
    }
    function["parameters"] = t.parameters.clone();
    serde_json::json!({"type": "function", "function": function})
}

fn grammar(g: Grammar) -> engine::Grammar {
    match g {
        Grammar::JsonSchema { schema, strict } => engine::Grammar::JsonSchema { schema, strict },
        Grammar::JsonObject => engine::Grammar::JsonObject,
        Grammar::Regex(rx) => engine::Grammar::Regex(rx),
        Grammar::Lark(lark) => engine::Grammar::Lark(lark),
    }
}

fn backend_error(e: EngineError) -> BackendError {
    let kind = match &e {
        EngineError::ShutDown => BackendErrorKind::ShuttingDown,
        EngineError::Forward(_) | EngineError::Config(_) | EngineError::Model(_) => BackendErrorKind::Internal,
        EngineError::Grammar(engine::GrammarError::Decoding(_)) => BackendErrorKind::Internal,
        _ => BackendErrorKind::InvalidRequest,
    };
    let code = match &e {
        EngineError::PromptTooLong { .. } | EngineError::PromptExceedsPool { .. } => Some("context_length_exceeded"),
        EngineError::Grammar(engine::GrammarError::Invalid(_)) => Some(INVALID_GRAMMAR),
        _ => None,
    };
    let error = BackendError::new(kind, e.to_string());
    match code {
        Some(code) => error.with_code(code),
        None => error,
    }
}
