//! Integration tests: the real server on 127.0.0.1 (port 0) over a deterministic fake
//! backend (fake.rs), driven by the shared HTTP test client (`pagekv_testkit`, wrapped in client.rs).
//!
//! - openai.rs: chat and completions, streaming and not, finish reasons, parameters,
//!   logprobs, usage with cached tokens, models, health.
//! - anthropic.rs: /v1/messages, streaming and not.
//! - anthropic_tools.rs: Anthropic tool use: tool_use blocks, streaming, constrained choices,
//!   history, Claude Code request shapes, errors.
//! - choices.rs: `n` choices on both OpenAI endpoints: indices, usage, interleaved streams, errors, cancellation.
//! - errors.rs: every bad input gets the right status and error shape, and the server keeps
//!   serving; API keys.
//! - format.rs: `response_format` to the backend's grammar, and its errors.
//! - models.rs: served model names, aliases and the `*` wildcard.
//! - tools.rs: tool calling: parsing, streaming deltas, constrained choices, history, errors.
//! - lifecycle.rs: disconnect mid-stream cancels the backend stream, /metrics format and
//!   counters, concurrent streams, graceful shutdown (finish within the grace period, cancel
//!   after it).

mod anthropic;
mod anthropic_tools;
mod choices;
mod client;
mod errors;
mod fake;
mod format;
mod lifecycle;
mod models;
mod openai;
mod tools;
