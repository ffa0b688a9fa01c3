//! The errors of an attention call or its configuration.

use crate::threadpool::ThreadPoolError;

/// Errors of an attention call or its configuration. All are bad input; the output is
/// unspecified when one is returned.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AttentionError {
    #[error("invalid {name}={value:?}: accepted values are {accepted}")]
    Config { name: &'static str, value: String, accepted: String },
    #[error("attention shape mismatch: {what}: expected {expected}, got {got}")]
    Shape { what: &'static str, expected: usize, got: usize },
    #[error("num_heads {num_heads} is not a positive multiple of num_kv_heads {num_kv_heads}")]
    HeadGroup { num_heads: usize, num_kv_heads: usize },
    #[error("sequence {seq}: context length {context_len} is shorter than q_len {q_len} (or zero)")]
    ContextTooShort { seq: usize, context_len: usize, q_len: usize },
    #[error("sliding window must be at least 1 token")]
    ZeroWindow,
    #[error("sequence {seq}: block table has {len} blocks, {needed} needed for its context")]
    BlockTableShort { seq: usize, needed: usize, len: usize },
    #[error("sequence {seq}: logical block {logical} maps to block {block}, which is not readable (pool has {num_blocks} blocks)")]
    BadBlock { seq: usize, logical: usize, block: u32, num_blocks: usize },
    #[error("layer view is inconsistent: {0}")]
    Layer(String),
    #[error(transparent)]
    Threads(#[from] ThreadPoolError),
}
