//! Paged attention over the KV cache pages, on the CPU: [`Attention::forward`].
//!
//! One entry point serves a batch of sequences: queries `[num_seqs, q_len, num_heads,
//! head_dim]`, each sequence's block table and context length, a scale, an optional sliding
//! window and an optional causal mask (prefill, speculative verify). Keys and values are read
//! where they lie in the pages ([`kvcache::LayerView`]), block by block, only the live
//! tokens, dequantized inside the kernel; no dense copy of the context is ever made.
//!
//! Four routes compute the same function (see `../shared/DESIGN.md`):
//! - [`reference`]: scalar, f64 accumulation, online softmax; the oracle and the fallback.
//! - [`primitive`]: one pass per (sequence, kv-head group): each page is read once and serves
//!   every query row of the group (`q_len × num_heads / num_kv_heads` rows); a task takes a
//!   sequence's kv heads together (whole blocks read at once), split only to give every
//!   thread work.
//! - [`partitioned`]: split-K ("flash decoding"): the context is cut into partitions of
//!   `partition_size` tokens processed in parallel, then merged exactly.
//! - [`ggml`]: llama.cpp's rounding, step for step, over f16 caches (a SIMD kernel and its
//!   scalar reference), for agreement with llama.cpp to the bit.
//!
//! Primitive and partitioned run the same tile kernels (`tile`, `simd`), built for two
//! instruction sets chosen at run time ([`KernelIsa`]): AVX-512F/VL (32 registers, wider
//! blocking) where the CPU has it, else AVX2 + FMA + F16C; `PAGEKV_DEV_ATTN_ISA` pins one
//! (tests run both).
//!
//! [`router`] picks the route of every call from the [`AttentionConfig`] (numerics `auto |
//! fast | ggml`, path `auto | reference | primitive | partitioned`), the layer and the call;
//! [`Attention`] (`dispatch.rs`) runs it and counts it in [`kvcache::CacheCounters`].
//!
//! Visibility: query `i` of a sequence with context `C` sits at position `p = C - q_len + i`.
//! It sees keys `[lo, hi)` with `hi = p + 1` when causal (else `C`) and `lo = p + 1 - W` with a
//! sliding window `W` (else 0). Rotated formats (q4r, turbo) store `R·k`, `R·v`: kernels rotate
//! the query and un-rotate the output instead of touching the keys.
//!
//! Files: `config.rs` (settings), `isa.rs` (instruction sets), `error.rs`, `params.rs` (one
//! call's arguments), `validate.rs` (input checks), `router.rs` (the route), `dispatch.rs` (the
//! operator), `queries.rs` (query rounding of the fast numerics), one file or folder per kernel
//! family.

pub mod bench;
mod config;
mod dispatch;
mod error;
pub mod ggml;
mod group;
mod isa;
mod params;
pub mod partitioned;
mod pool;
#[cfg(test)]
mod precision;
pub mod primitive;
mod queries;
pub mod reference;
pub mod router;
#[cfg(target_arch = "x86_64")]
mod simd;
#[cfg(target_arch = "x86_64")]
mod softmax;
#[cfg(target_arch = "x86_64")]
mod tile;
mod validate;
mod workspace;

pub use config::{
    AttentionConfig, AttnImpl, AttnNumerics, IsaChoice, RouterConfig, ATTN_IMPL_ENV, ATTN_IMPL_VALUES, ATTN_ISA_ENV,
    ATTN_ISA_VALUES, ATTN_NUMERICS_ENV, ATTN_NUMERICS_VALUES, DEFAULT_PARTITION_SIZE, DEFAULT_PARTITION_THRESHOLD,
    PARTITION_SIZE_ENV, PARTITION_THRESHOLD_ENV,
};
pub use dispatch::Attention;
pub use error::AttentionError;
pub use group::QueryBounds;
pub use isa::{KernelIsa, MAX_FAST_HEAD_DIM};
pub use params::AttentionParams;
pub use pool::PoolHandle;
pub use queries::round_to_cache;
