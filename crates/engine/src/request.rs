//! What a client sends the engine ([`GenerationRequest`]) and what comes back on its stream
//! ([`Event`]: tokens as they are sampled, then one `Done` or one `Error`), with the typed
//! [`EngineError`] for refused and failed requests.

use crate::constraint::{Grammar, GrammarError};
use crate::sampling::{SamplingError, SamplingParams, TokenLogprobs};
use crate::stop::{FinishReason, StopConditions};
use thiserror::Error;

/// Most alternatives a request may ask for per token (OpenAI's `top_logprobs` cap).
pub const MAX_TOP_LOGPROBS: usize = 20;

/// Most continuations one request may ask for ([`crate::EngineHandle::submit_n`]; OpenAI's `n`).
pub const MAX_CHOICES: usize = 16;

/// One generation: a tokenized prompt and how to continue it.
#[derive(Clone, Debug, PartialEq)]
pub struct GenerationRequest {
    /// `[prompt tokens]` already templated and tokenized by the caller (BOS included if wanted).
    pub prompt: Vec<u32>,
    pub sampling: SamplingParams,
    /// Stop strings, extra stop tokens, `max_tokens`. The model's end-of-generation tokens are
    /// added unless `ignore_eos`.
    pub stop: StopConditions,
    /// `Some(n)`: report each generated token's log-probability and its `n` most likely
    /// alternatives (`n ≤ MAX_TOP_LOGPROBS`; `Some(0)` = the token's own only).
    pub logprobs: Option<usize>,
    /// Do not stop at the model's end-of-generation tokens (benchmarks).
    pub ignore_eos: bool,
    /// Hold the output to this grammar (constrained decoding); `None`: free text, at no cost.
    pub grammar: Option<Grammar>,
    /// Let the engine's drafter propose tokens for this request (when the engine has one;
    /// sequences with a grammar never draft). Off gives plain one-token steps — the same
    /// greedy tokens, and the same distribution when sampling.
    pub speculative: bool,
}

impl GenerationRequest {
    /// A greedy request for at most `max_tokens` tokens, no stop strings.
    pub fn new(prompt: Vec<u32>, max_tokens: usize) -> GenerationRequest {
        GenerationRequest {
            prompt,
            sampling: SamplingParams::default(),
            stop: StopConditions { max_tokens, ..StopConditions::default() },
            logprobs: None,
            ignore_eos: false,
            grammar: None,
            speculative: true,
        }
    }
}

/// Token counts of a finished request (OpenAI's `usage`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Usage {
    pub prompt_tokens: usize,
    /// Prompt tokens whose K/V came from the session bank instead of being computed
    /// (`prompt_tokens_details.cached_tokens`); a multiple of the block size.
    pub cached_tokens: usize,
    /// Tokens sampled, including a final stop or end-of-generation token.
    pub completion_tokens: usize,
}

/// What a request's stream yields, in order: any number of `Token`s, then exactly one `Done`
/// or `Error`, then the stream ends.
#[derive(Clone, Debug, PartialEq)]
pub enum Event {
    /// A sampled token. `text` is the text that became safe to show with it: possibly empty
    /// (an unfinished UTF-8 character, or text that may be the start of a stop string and is
    /// held back), possibly more than this token's own piece (held text released). Stop tokens
    /// and end-of-generation tokens produce no `Token` event.
    Token { id: u32, text: String, logprobs: Option<TokenLogprobs> },
    /// The end. `text` is what was still held back (usually empty): the full output is the
    /// concatenation of every `Token` text and this one. `stop_sequence`: the stop string that
    /// ended the request, if one did.
    Done { finish_reason: FinishReason, usage: Usage, text: String, stop_sequence: Option<String> },
    /// The request failed; nothing follows.
    Error(EngineError),
}

/// A refused or failed request.
#[derive(Clone, Debug, PartialEq, Error)]
pub enum EngineError {
    #[error("the prompt is empty")]
    EmptyPrompt,
    #[error("the prompt has {prompt_tokens} tokens but the context window is {context_window} tokens")]
    PromptTooLong { prompt_tokens: usize, context_window: usize },
    #[error(
        "the prompt has {prompt_tokens} tokens, which need {needed_blocks} KV blocks, but the whole pool has {pool_blocks}"
    )]
    PromptExceedsPool { prompt_tokens: usize, needed_blocks: usize, pool_blocks: usize },
    #[error("token id {id} at prompt position {position} is out of range (vocabulary of {vocab})")]
    TokenOutOfRange { id: u32, position: usize, vocab: usize },
    #[error("max_tokens must be at least 1")]
    ZeroMaxTokens,
    #[error("n must be between 1 and {max}, got {got}")]
    InvalidChoices { got: usize, max: usize },
    #[error("top_logprobs must be at most {max}, got {got}")]
    TooManyLogprobs { got: usize, max: usize },
    #[error(transparent)]
    Sampling(#[from] SamplingError),
    /// The request's grammar cannot be compiled, or failed while decoding.
    #[error(transparent)]
    Grammar(#[from] GrammarError),
    #[error("the engine is shut down")]
    ShutDown,
    #[error("forward pass failed: {0}")]
    Forward(String),
    #[error("invalid engine configuration: {0}")]
    Config(String),
    /// The model could not be built on the scheduler thread ([`crate::Engine::start_with`]).
    #[error("cannot start the model: {0}")]
    Model(String),
}
