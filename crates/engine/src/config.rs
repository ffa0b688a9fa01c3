//! Engine configuration: the pool (a [`CacheConfig`], geometry filled in from the model), the
//! step budget and the session bank, with defaults; and [`EngineInfo`], what a server needs to
//! know about a running engine.

use std::time::Duration;

use kvcache::CacheConfig;
use pagekv_model::ModelConfig;

use crate::speculative::SpeculativeConfig;

/// How the engine runs.
#[derive(Clone, Debug, PartialEq)]
pub struct EngineConfig {
    /// Pool size, block size, KV format, context and sliding window. Layers, KV heads and head
    /// dimension are taken from the model; a missing context window is the model's, a missing
    /// sliding window the model's. `dynamic_growth` is ignored: engine sequences take blocks one
    /// at a time as their tokens arrive, up to the context window.
    pub cache: CacheConfig,
    /// Most tokens in one forward step (prefill chunks and decodes together), `--max-batch-tokens`.
    pub max_batch_tokens: usize,
    /// Most sequences running at once, `--max-seqs`.
    pub max_seqs: usize,
    pub bank: BankConfig,
    /// Steps whose samplers need only the argmax (or a small top-k) of each row take those from
    /// the backend instead of the full logit rows — the same tokens and seeded draws
    /// (`PAGEKV_DEV_REDUCED_SAMPLING`, default on; off reads every full row, for comparisons).
    pub reduced_sampling: bool,
    /// Multi-token decoding: the drafter and draft lengths (off by default).
    pub speculative: SpeculativeConfig,
}

/// The session bank: prefix reuse across requests.
#[derive(Clone, Debug, PartialEq)]
pub struct BankConfig {
    /// Keep finished sequences' blocks for reuse (off for sliding-window models, whose early
    /// blocks are reclaimed).
    pub enabled: bool,
    /// Most bytes of blocks held only by the bank (`--session-bank-bytes`); `None` = bounded
    /// only by the pool, whose pressure evicts first.
    pub max_bytes: Option<usize>,
    /// Entries unused for longer are dropped (`--session-bank-ttl`); `None` = never.
    pub ttl: Option<Duration>,
}

impl Default for BankConfig {
    fn default() -> Self {
        BankConfig { enabled: true, max_bytes: None, ttl: None }
    }
}

impl EngineConfig {
    /// Defaults around a cache configuration: 512 tokens and 64 sequences per step, bank on.
    pub fn new(cache: CacheConfig) -> EngineConfig {
        EngineConfig {
            cache,
            max_batch_tokens: 512,
            max_seqs: 64,
            bank: BankConfig::default(),
            reduced_sampling: true,
            speculative: SpeculativeConfig::default(),
        }
    }

    /// Defaults for `model`, with the pool sized to `kv_bytes` of KV memory (at least one block).
    pub fn for_model(model: &ModelConfig, kv_bytes: usize) -> EngineConfig {
        let mut cache = CacheConfig::new(model.num_layers, model.num_kv_heads, model.head_dim);
        cache.num_blocks = num_blocks_for_bytes(&cache, kv_bytes);
        EngineConfig::new(cache)
    }
}

/// Blocks of `cache`'s geometry and format that fit in `bytes` (at least 1).
pub fn num_blocks_for_bytes(cache: &CacheConfig, bytes: usize) -> usize {
    let per_block = (cache.bytes_per_token() * cache.block_size).max(1);
    (bytes / per_block).max(1)
}

/// Facts about a running engine, fixed at start.
#[derive(Clone, Debug, PartialEq)]
pub struct EngineInfo {
    /// The model's name from its metadata.
    pub model_name: String,
    /// Most positions a sequence may hold: prompt + generated tokens never exceed it.
    pub context_window: usize,
    pub vocab_size: usize,
    pub block_size: usize,
    pub num_blocks: usize,
    /// Bytes of one block (all layers, K and V, codes and scales).
    pub block_bytes: usize,
    /// KV format name (`f16`, `q8`, …).
    pub kv_format: String,
    pub max_batch_tokens: usize,
    pub max_seqs: usize,
    /// Tokens that end generation unless a request sets `ignore_eos`.
    pub eos_tokens: Vec<u32>,
    /// Where the model runs (`Forward::device_label`: `cpu`, `cuda:0 NVIDIA H200, bf16 weights`).
    pub device: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocks_for_bytes() {
        let mut c = CacheConfig::new(2, 1, 8);
        c.block_size = 16;
        // f16: 2 layers × (K+V) × 8 values × 2 bytes = 64 bytes a token, 1024 a block.
        assert_eq!(c.bytes_per_token(), 64);
        assert_eq!(num_blocks_for_bytes(&c, 10 * 1024 + 5), 10);
        assert_eq!(num_blocks_for_bytes(&c, 3), 1);
    }
}
