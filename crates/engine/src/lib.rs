//! `pagekv-engine` — generation on top of the model runtime.
//!
//! - [`generate`]: one sequence over its own pool (the CLI's `run`, `chat` and `eval`), reusing
//!   the cached prefix of the previous call.
//! - [`sampling`]: [`SamplingParams`] (validated), [`Sampler`] (seeded, allocation-free after the
//!   first call), [`logprobs`](sampling::logprobs) for OpenAI `logprobs`.
//! - [`stop`]: [`StopConditions`], the streaming [`StopMatcher`], [`FinishReason`].
//!
//! The engine knows the model and the cache; it knows nothing of HTTP or of kernels.

pub mod generate;
pub mod sampling;
pub mod stop;

pub use generate::{Generator, Prefill};
pub use sampling::{logprobs, Sampler, SamplingError, SamplingParams, TokenLogprobs};
pub use stop::{FinishReason, StopConditions, StopMatcher, StopOutput};
