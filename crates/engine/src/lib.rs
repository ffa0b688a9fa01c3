//! `pagekv-engine` — generation on top of the model runtime.
//!
//! - [`generate`]: one sequence over its own pool (the CLI's `run`, `chat` and `eval`), reusing
//!   the cached prefix of the previous call.
//!
//! The engine knows the model and the cache; it knows nothing of HTTP or of kernels.

pub mod generate;

pub use generate::{Generator, Prefill};
