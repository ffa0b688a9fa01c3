//! `pagekv-engine` — generation on top of the model runtime.
//!
//! - [`Engine`] / [`EngineHandle`] (`engine.rs`): one scheduler thread (`scheduler.rs`) owns the
//!   model (any [`pagekv_model::Forward`] backend: the CPU model, or a GPU model built on that
//!   thread by [`Engine::start_with`]), one block pool in the model's memory and every sequence; requests come in through
//!   [`EngineHandle::submit`] and their [`Event`]s go out through a [`RequestStream`]
//!   (`stream.rs`; dropping it cancels). Continuous batching: each step mixes prefill chunks and
//!   decodes in one forward; when blocks run out the newest sequence is preempted and recomputed.
//! - Session bank (`bank.rs`): blocks of finished sequences stay, indexed by chained block
//!   hashes, and new prompts share them by reference; LRU eviction, tail first; byte budget, TTL.
//! - [`EngineConfig`], [`BankConfig`], [`EngineInfo`] (`config.rs`); [`EngineMetrics`]
//!   (`metrics.rs`); [`GenerationRequest`], [`Event`], [`Usage`], [`EngineError`] (`request.rs`).
//! - [`generate`]: one sequence over its own pool, stepped by the caller — the runner of
//!   `eval`'s teacher-forced scoring and `bench decode`'s timing. It samples nothing: every
//!   generation (`run`, `chat`, `serve`) goes through the engine.
//! - [`sampling`]: [`SamplingParams`] (validated), [`Sampler`] (seeded, allocation-free after the
//!   first call), [`logprobs`](sampling::logprobs) for OpenAI `logprobs`.
//! - [`stop`]: [`StopConditions`], the streaming [`StopMatcher`], [`FinishReason`].
//! - [`speculative`]: multi-token decoding — a [`Drafter`](speculative::Drafter) (prompt lookup)
//!   proposes tokens, the scheduler scores them in the sequence's next step and keeps what the
//!   model's own sampler accepts, trimming the rest from the cache.
//! - [`constraint`]: constrained decoding with llguidance — a request's [`Grammar`] (JSON Schema,
//!   JSON object, regex, Lark) compiled by the engine's [`GrammarCompiler`] into a per-sequence
//!   constraint whose token mask is computed beside the forward pass and applied before sampling.
//!
//! The engine knows the model and the cache; it knows nothing of HTTP or of kernels, and it
//! never reads the pages: they may live on a device.

mod bank;
pub mod config;
pub mod constraint;
mod engine;
pub mod generate;
pub mod metrics;
pub mod request;
pub mod sampling;
mod scheduler;
mod sequence;
pub mod speculative;
pub mod stop;
pub mod stream;

pub use config::{num_blocks_for_bytes, BankConfig, EngineConfig, EngineInfo};
pub use constraint::{Grammar, GrammarCompiler, GrammarError};
pub use engine::{Engine, EngineHandle};
pub use generate::{Generator, Prefill};
pub use metrics::EngineMetrics;
pub use request::{EngineError, Event, GenerationRequest, Usage, MAX_CHOICES, MAX_TOP_LOGPROBS};
pub use sampling::{logprobs, Sampler, SamplingError, SamplingParams, TokenLogprobs};
pub use speculative::{
    DraftMode, DraftModel, MtpDrafter, MtpModel, SpeculativeConfig, SpeculativeError, MAX_DRAFT_TOKENS,
};
pub use stop::{FinishReason, StopConditions, StopMatcher, StopOutput};
pub use stream::RequestStream;
