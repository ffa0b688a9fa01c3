//! `pagekv-server` — an OpenAI- and Anthropic-compatible HTTP server over any inference
//! engine that implements [`Backend`].
//!
//! - [`backend`]: the [`Backend`] trait and its types — the only thing the server needs from
//!   an engine (prompt preparation, submission with a cancellable [`EventStream`], metrics).
//! - [`serve`] / [`Server`]: bind (127.0.0.1:8080 by default), serve, shut down gracefully.
//! - Endpoints: `POST /v1/chat/completions`, `POST /v1/completions` (openai.rs; `n` choices:
//!   choices.rs),
//!   `POST /v1/messages` (anthropic.rs), `GET /v1/models`, `GET /health`, `GET /metrics`
//!   (Prometheus text, metrics.rs).
//! - Every bad input becomes an [`ApiError`] in the API's error shape (error.rs, params.rs);
//!   no input panics or stalls the server.
//!
//! ```no_run
//! # async fn run(backend: std::sync::Arc<dyn pagekv_server::Backend>) -> Result<(), pagekv_server::ServerError> {
//! let config = pagekv_server::ServerConfig::default();
//! pagekv_server::serve(config, backend, async {
//!     let _ = tokio::signal::ctrl_c().await;
//! })
//! .await
//! # }
//! ```

mod anthropic;
pub mod backend;
mod choices;
mod error;
mod format;
mod generation;
mod metrics;
mod models;
mod openai;
mod params;
mod server;
mod tools;

pub use backend::{
    AttentionCalls, Backend, BackendError, BackendErrorKind, BackendMetrics, Cancelled, ChatMessage, Event,
    EventSender, EventStream, FallbackCalls, FinishReason, GenerationRequest, Grammar, LogprobEntry, PreparedPrompt,
    Prompt, Role, SamplingParams, TokenLogprob, Tool, ToolCall, ToolCallFormat, Usage, INVALID_GRAMMAR, MAX_CHOICES,
    MAX_STOP_SEQUENCES, MAX_TOP_LOGPROBS,
};
pub use error::ApiError;
pub use models::{ModelNames, ANY_MODEL};
pub use server::{serve, Server, ServerConfig, ServerError, CANCEL_DRAIN};
