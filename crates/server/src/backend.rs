//! The one seam between the HTTP server and an inference engine: the [`Backend`] trait.
//!
//! The server knows requests, not tensors. Everything it needs from an engine is here:
//!
//! - identity: [`Backend::model_id`], [`Backend::context_window`];
//! - prompt preparation: [`Backend::prepare`] renders a chat template / tokenizes a
//!   [`Prompt`] into a [`PreparedPrompt`] (token ids), so the server can count tokens and
//!   reject over-long prompts before anything is queued;
//! - generation: [`Backend::submit`] takes a validated [`GenerationRequest`] and returns an
//!   [`EventStream`] of [`Event`]s — tokens, then exactly one `Done` or `Error`.
//!   **Dropping the stream cancels the request**: the engine sees it through
//!   [`EventSender::is_cancelled`] or a failed [`EventSender::send`] and frees its blocks;
//! - observability: [`Backend::metrics`] returns a [`BackendMetrics`] snapshot for `/metrics`.
//!
//! An adapter over the engine implements this trait; the server's tests implement it with a
//! deterministic fake. Nothing here depends on the engine crate.

use std::fmt;

use tokio::sync::mpsc;

/// What the server needs from an inference engine. Object-safe; used as `Arc<dyn Backend>`.
///
/// Methods are called from async tasks. `prepare` may be CPU-heavy (templating, tokenizing a
/// long prompt): the server calls it on a blocking thread. `submit` must return quickly (it
/// only enqueues); `metrics` must be cheap (it is read on every `/metrics` scrape).
pub trait Backend: Send + Sync + 'static {
    /// The model name clients pass in `model` and that `/v1/models` lists.
    fn model_id(&self) -> &str;

    /// Maximum number of tokens (prompt + completion) one sequence may hold.
    fn context_window(&self) -> usize;

    /// Renders (chat template) and tokenizes a prompt. Errors here are the client's fault
    /// (e.g. a token id outside the vocabulary) unless the kind says otherwise.
    fn prepare(&self, prompt: &Prompt) -> Result<PreparedPrompt, BackendError>;

    /// Enqueues a generation. The server has already checked that
    /// `prompt.len() + max_tokens <= context_window()` and that every parameter is in range.
    ///
    /// Contract for the returned stream: zero or more [`Event::Token`], then exactly one
    /// [`Event::Done`] or [`Event::Error`], then the sender is dropped. Stop strings are the
    /// backend's job: the text of the tokens never contains (any part of) the matched stop
    /// string, and `Done` names it. A stream that ends without `Done`/`Error` is reported to
    /// the client as an internal error.
    fn submit(&self, request: GenerationRequest) -> Result<EventStream, BackendError>;

    /// Enqueues `n` continuations of one request (OpenAI's `n`; `2..=MAX_CHOICES`, checked by
    /// the server) and returns their streams, choice 0 first; each follows `submit`'s contract,
    /// and dropping one cancels that continuation. Continuation `i` samples with seed
    /// `seed + i` when the request has a seed. The default submits `n` independent requests;
    /// an engine that forks the computed prompt's cache (prefilling it once) overrides it.
    fn submit_n(&self, request: GenerationRequest, n: usize) -> Result<Vec<EventStream>, BackendError> {
        (0..n)
            .map(|i| {
                let mut r = request.clone();
                r.sampling.seed = r.sampling.seed.map(|s| s.wrapping_add(i as u64));
                self.submit(r)
            })
            .collect()
    }

    /// A snapshot of the engine's gauges and counters (counters are monotonic totals).
    fn metrics(&self) -> BackendMetrics;

    /// How the model writes tool calls (from its chat template), if it was taught a way the
    /// server can parse. `None`: tools are shown to the template but no call is parsed, and
    /// `tool_choice: required` is refused.
    fn tool_call_format(&self) -> Option<ToolCallFormat> {
        None
    }
}

/// A model's tool-call convention.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ToolCallFormat {
    /// Hermes / Qwen 2.5: `<tool_call>\n{"name": …, "arguments": {…}}\n</tool_call>` blocks.
    Hermes,
    /// Llama 3.x JSON: the reply is `{"name": …, "parameters": {…}}` (several joined by `; `),
    /// after `<|python_tag|>` when the model writes it.
    Llama3Json,
    /// Mistral: `[TOOL_CALLS][{"name": …, "arguments": {…}}, …]`, or with `args`
    /// `[TOOL_CALLS]name[ARGS]{…}` per call. `tool_calls` / `args_token`: the ids of the
    /// `[TOOL_CALLS]` / `[ARGS]` special tokens when the vocabulary has them (grammars then
    /// write the token; its text prints nothing, so the parser also reads calls without it);
    /// `None`: the marker is plain text.
    Mistral { args: bool, tool_calls: Option<u32>, args_token: Option<u32> },
}

/// A function the model may call.
#[derive(Debug, Clone, PartialEq)]
pub struct Tool {
    pub name: String,
    pub description: Option<String>,
    /// JSON Schema of the arguments object.
    pub parameters: serde_json::Value,
    /// Schema keywords that cannot be enforced are an error rather than ignored.
    pub strict: bool,
}

/// A call an assistant message made.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ToolCall {
    pub id: String,
    pub name: String,
    /// The arguments as JSON text (as OpenAI carries them).
    pub arguments: String,
}

/// A prompt as the client sent it, before templating and tokenization.
#[derive(Debug, Clone, PartialEq)]
pub enum Prompt {
    /// Chat messages and the tools the model may call; the backend applies the model's chat
    /// template (which receives `tools`) and the generation prompt for the assistant's turn
    /// (unless the last message is the assistant's, which the model should continue).
    Chat { messages: Vec<ChatMessage>, tools: Vec<Tool> },
    /// Raw text (`/v1/completions`), tokenized as is (the backend decides about BOS).
    Text(String),
    /// Token ids given by the client (`/v1/completions` with an integer array); the backend
    /// checks them against its vocabulary.
    Tokens(Vec<u32>),
}

/// One chat turn with plain-text content (content parts are joined by the server).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChatMessage {
    pub role: Role,
    pub content: String,
    /// An assistant's calls (empty otherwise).
    pub tool_calls: Vec<ToolCall>,
    /// A tool message's answer: the id of the call it answers (checked by the server).
    pub tool_call_id: Option<String>,
}

impl ChatMessage {
    /// A message with text only.
    pub fn new(role: Role, content: impl Into<String>) -> ChatMessage {
        ChatMessage { role, content: content.into(), tool_calls: Vec::new(), tool_call_id: None }
    }
}

/// Roles the server accepts. OpenAI's `developer` maps to [`Role::System`]; the deprecated
/// `function` role is rejected before it reaches a backend.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    System,
    User,
    Assistant,
    /// A tool's result (`tool_call_id` names the call).
    Tool,
}

impl Role {
    /// The conventional lower-case name (`"system"`, `"user"`, `"assistant"`, `"tool"`), as chat
    /// templates expect it.
    pub fn as_str(self) -> &'static str {
        match self {
            Role::System => "system",
            Role::User => "user",
            Role::Assistant => "assistant",
            Role::Tool => "tool",
        }
    }
}

/// A tokenized prompt, ready to submit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PreparedPrompt {
    /// Token ids, in order, including any BOS/template tokens.
    pub token_ids: Vec<u32>,
}

/// Everything the engine needs to run one generation. All values are validated by the server.
#[derive(Debug, Clone, PartialEq)]
pub struct GenerationRequest {
    /// Prompt token ids (from [`Backend::prepare`]); never empty.
    pub prompt: Vec<u32>,
    /// Most tokens to generate; ≥ 1. Reaching it ends with [`FinishReason::Length`].
    pub max_tokens: usize,
    pub sampling: SamplingParams,
    /// Stop strings (each non-empty, at most [`MAX_STOP_SEQUENCES`]); matching one ends with
    /// [`FinishReason::Stop`] and the matched string is excluded from the output.
    pub stop: Vec<String>,
    /// `None`: no logprobs. `Some(k)`: report the sampled token's log-probability and the
    /// `k` most likely alternatives (`k` may be 0; at most [`MAX_TOP_LOGPROBS`]).
    pub logprobs: Option<usize>,
    /// Hold the output to this grammar (constrained decoding); `None`: free text. A grammar
    /// the backend cannot compile is refused by `submit` with [`BackendErrorKind::InvalidRequest`]
    /// and code [`INVALID_GRAMMAR`].
    pub grammar: Option<Grammar>,
}

/// What a constrained output must match (`response_format`, and tool calls under
/// `tool_choice: required`).
#[derive(Debug, Clone, PartialEq)]
pub enum Grammar {
    /// A JSON value valid under `schema`; `strict`: schema keywords the backend cannot enforce
    /// are an error rather than ignored.
    JsonSchema { schema: serde_json::Value, strict: bool },
    /// Any JSON object.
    JsonObject,
    /// Text matching a regular expression, whole.
    Regex(String),
    /// Text in the language of a Lark grammar (llguidance's dialect).
    Lark(String),
}

/// The [`BackendError::code`] of a grammar the backend cannot compile.
pub const INVALID_GRAMMAR: &str = "invalid_grammar";

/// Most choices (`n`) one request may ask for.
pub const MAX_CHOICES: usize = 16;

/// Most stop strings one request may carry.
pub const MAX_STOP_SEQUENCES: usize = 16;
/// Most alternatives per position in logprobs (OpenAI's limit for chat).
pub const MAX_TOP_LOGPROBS: usize = 20;

/// Sampling parameters, already range-checked by the server.
#[derive(Debug, Clone, PartialEq)]
pub struct SamplingParams {
    /// 0 means greedy (argmax); otherwise in (0, 2].
    pub temperature: f32,
    /// Nucleus sampling mass in (0, 1]; 1 disables it.
    pub top_p: f32,
    /// Keep only the k most likely tokens; `None` disables it.
    pub top_k: Option<u32>,
    /// Drop tokens whose probability is below `min_p` × the top probability; in [0, 1], 0
    /// disables it.
    pub min_p: f32,
    /// Seed for a reproducible sample path; `None` lets the engine choose.
    pub seed: Option<u64>,
    /// OpenAI presence penalty in [-2, 2]: subtracted once from the logit of every token
    /// that already appeared in the completion.
    pub presence_penalty: f32,
    /// OpenAI frequency penalty in [-2, 2]: subtracted per occurrence in the completion.
    pub frequency_penalty: f32,
}

impl Default for SamplingParams {
    /// OpenAI's defaults: temperature 1, no truncation, no penalties.
    fn default() -> Self {
        SamplingParams {
            temperature: 1.0,
            top_p: 1.0,
            top_k: None,
            min_p: 0.0,
            seed: None,
            presence_penalty: 0.0,
            frequency_penalty: 0.0,
        }
    }
}

/// One event of a generation.
#[derive(Debug, Clone, PartialEq)]
pub enum Event {
    /// One generated token. `text` is the newly decodable text it adds: it may be empty
    /// when the token ends inside a UTF-8 sequence (the bytes come with a later token) or
    /// while the backend holds text back that could begin a stop string.
    Token { id: u32, text: String, logprob: Option<TokenLogprob> },
    /// The generation finished normally.
    Done {
        finish_reason: FinishReason,
        /// The stop string that ended it, if one did (`None` for end-of-sequence or length).
        stop_sequence: Option<String>,
        usage: Usage,
    },
    /// The generation failed; no more events follow.
    Error(BackendError),
}

/// Why a generation ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FinishReason {
    /// End-of-sequence token or a stop string.
    Stop,
    /// `max_tokens` reached (or the context window).
    Length,
}

impl FinishReason {
    /// OpenAI's name: `"stop"` or `"length"`.
    pub fn as_str(self) -> &'static str {
        match self {
            FinishReason::Stop => "stop",
            FinishReason::Length => "length",
        }
    }
}

/// Token accounting of one finished generation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Usage {
    /// Tokens in the prompt (all of them, cached or not).
    pub prompt_tokens: usize,
    /// Of those, how many were reused from the session bank instead of computed.
    pub cached_tokens: usize,
    /// Tokens generated.
    pub completion_tokens: usize,
}

impl Usage {
    /// A request's usage over its choices: the prompt counted once (it was computed once), the
    /// completion tokens of every choice summed — as OpenAI counts `n > 1`.
    pub(crate) fn of_choices(usages: impl IntoIterator<Item = Usage>) -> Usage {
        usages.into_iter().enumerate().fold(Usage::default(), |total, (i, u)| match i {
            0 => u,
            _ => Usage { completion_tokens: total.completion_tokens + u.completion_tokens, ..total },
        })
    }
}

/// Log-probabilities at one generated position.
#[derive(Debug, Clone, PartialEq)]
pub struct TokenLogprob {
    /// The sampled token.
    pub chosen: LogprobEntry,
    /// The most likely tokens at this position, most likely first (`k` of them).
    pub top: Vec<LogprobEntry>,
}

/// One token with its log-probability (natural log, after temperature/penalties are applied
/// as the engine documents).
#[derive(Debug, Clone, PartialEq)]
pub struct LogprobEntry {
    pub id: u32,
    /// The token's own text (lossy UTF-8 of `bytes`).
    pub token: String,
    /// The token's raw bytes.
    pub bytes: Vec<u8>,
    pub logprob: f32,
}

/// An engine failure, with a kind that decides the HTTP status.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{kind}: {message}")]
pub struct BackendError {
    pub kind: BackendErrorKind,
    pub message: String,
    /// The OpenAI error `code` clients match on (`"context_length_exceeded"`), when one applies.
    pub code: Option<&'static str>,
}

impl BackendError {
    pub fn new(kind: BackendErrorKind, message: impl Into<String>) -> Self {
        BackendError { kind, message: message.into(), code: None }
    }

    pub fn with_code(mut self, code: &'static str) -> Self {
        self.code = Some(code);
        self
    }
}

/// What went wrong, from the client's point of view.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BackendErrorKind {
    /// The request is invalid for this model (HTTP 400): bad token ids, template failure on
    /// the given messages, prompt that can never fit the pool.
    InvalidRequest,
    /// Temporarily unable to take work: queue full (HTTP 503, retryable).
    Overloaded,
    /// The engine is shutting down (HTTP 503).
    ShuttingDown,
    /// A bug or an internal failure (HTTP 500).
    Internal,
}

impl fmt::Display for BackendErrorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            BackendErrorKind::InvalidRequest => "invalid request",
            BackendErrorKind::Overloaded => "overloaded",
            BackendErrorKind::ShuttingDown => "shutting down",
            BackendErrorKind::Internal => "internal error",
        })
    }
}

/// The receiving half of a generation: what [`Backend::submit`] returns.
///
/// Dropping it is the cancellation signal. Unbounded, so the engine's scheduler never blocks
/// on a slow client (one request buffers at most `max_tokens` events).
#[derive(Debug)]
pub struct EventStream {
    rx: mpsc::UnboundedReceiver<Event>,
}

/// The sending half, kept by the engine for one request.
#[derive(Debug, Clone)]
pub struct EventSender {
    tx: mpsc::UnboundedSender<Event>,
}

/// The client went away (the [`EventStream`] was dropped): stop work on this request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("the request was cancelled")]
pub struct Cancelled;

impl EventStream {
    /// A connected pair. The sender is usable from any thread, sync or async.
    pub fn channel() -> (EventSender, EventStream) {
        let (tx, rx) = mpsc::unbounded_channel();
        (EventSender { tx }, EventStream { rx })
    }

    /// The next event; `None` once the sender is dropped and the buffer is drained.
    pub async fn recv(&mut self) -> Option<Event> {
        self.rx.recv().await
    }
}

impl EventSender {
    /// Sends one event (never blocks). `Err(Cancelled)` when the stream was dropped.
    pub fn send(&self, event: Event) -> Result<(), Cancelled> {
        self.tx.send(event).map_err(|_| Cancelled)
    }

    /// True once the receiving [`EventStream`] is dropped.
    pub fn is_cancelled(&self) -> bool {
        self.tx.is_closed()
    }

    /// Resolves when the receiving [`EventStream`] is dropped (for async engines).
    pub async fn cancelled(&self) {
        self.tx.closed().await
    }
}

/// A snapshot of the engine's state for `/metrics`. Gauges are current values; the
/// `*_total`-like fields (hits, misses, evictions, preemptions, calls, fallbacks) are
/// monotonic counters since start.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct BackendMetrics {
    /// Sequences being computed (prefill or decode).
    pub running_sequences: u64,
    /// Sequences queued or preempted, waiting for blocks.
    pub waiting_sequences: u64,
    /// Blocks in the pool.
    pub kv_blocks_total: u64,
    /// Blocks referenced by live sequences.
    pub kv_blocks_used: u64,
    /// Blocks holding nothing.
    pub kv_blocks_free: u64,
    /// Blocks held by two or more live sequences at once (the `n` choices of a request share
    /// their prompt's blocks copy-on-write).
    pub kv_blocks_shared: u64,
    /// Choices forked from a request's computed prompt (`n − 1` per request with `n > 1`).
    pub sequence_forks: u64,
    /// Grammar masks computed for constrained decoding (one per constrained token), and the
    /// seconds spent computing them.
    pub grammar_masks: u64,
    pub grammar_mask_seconds: f64,
    /// Unreferenced blocks kept by the session bank for prefix reuse (evictable).
    pub kv_blocks_cached: u64,
    /// `[layer groups]` (attention type: `full` or `sliding_W`, blocks running sequences
    /// hold in the group).
    pub kv_group_blocks: Vec<(String, u64)>,
    /// Session-bank lookups that found a cached block (counted in blocks).
    pub session_bank_hits: u64,
    /// Session-bank lookups that missed (counted in blocks).
    pub session_bank_misses: u64,
    /// Cached blocks evicted from the session bank.
    pub session_bank_evictions: u64,
    /// Sequences preempted because the pool ran dry.
    pub preemptions: u64,
    /// Prompt tokens the engine computed (prompt tokens minus those reused from the bank).
    pub computed_tokens: u64,
    /// Live tokens ÷ token slots of the blocks running sequences hold (1 when none).
    pub kv_pool_utilization: f64,
    /// Tokens generated, and sequence-steps that generated them (a step of one sequence emits
    /// one token, or up to draft + 1 with multi-token decoding).
    pub generated_tokens: u64,
    pub sequence_steps: u64,
    /// Multi-token decoding: sequence-steps that verified a draft, tokens drafted, tokens kept.
    pub draft_steps: u64,
    pub draft_tokens: u64,
    pub draft_accepted_tokens: u64,
    /// Attention calls by route (`reference|primitive|partitioned|ggml`) and KV format.
    pub attention_calls: Vec<AttentionCalls>,
    /// Calls that fell back from a requested fast path, by reason.
    pub fallbacks: Vec<FallbackCalls>,
}

/// Attention calls through one route over one KV format.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AttentionCalls {
    pub route: String,
    pub format: String,
    pub calls: u64,
}

/// Fallback calls for one reason.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FallbackCalls {
    pub reason: String,
    pub calls: u64,
}
