//! `kvcache` — the paged KV cache at the heart of pagekv.
//!
//! K/V live in fixed-size blocks of a pre-allocated pool, laid out per layer as
//! `[num_blocks, block_size, num_kv_heads, head_dim]` (codes, plus f16 scales for quantized
//! formats). Each sequence owns a block table and grows block by block.
//!
//! Main types:
//! - [`BlockPool`]: block ids, reference counts, free queue; [`BlockHash`]: the chained identity
//!   of a full block's tokens, which the engine's session bank indexes prefixes by.
//! - [`KvPool`]: a block pool plus its page storage ([`HostPages`], or device pages behind
//!   [`PageStore`]) and its counters ([`CacheCounters`], [`CacheStats`]).
//! - [`SequenceCache`]: one sequence's block table, offset, growth and window policy, trim,
//!   snapshot/restore, fork (copy-on-write), from_dense, gather.
//! - [`StandaloneCache`]: the single-request API — a sequence over its own pool.
//! - [`KvFormat`] and [`format`]: f32, f16, bf16, q8, q4 (optionally rotated), turbo, each with
//!   a scalar reference codec; [`LayerView`] is what attention kernels read.
//! - [`CacheConfig`]: geometry and policy with the `PAGEKV_*` variables.
//! - [`LayerGroups`]: layers grouped by attention type (full, or sliding window W); a
//!   sequence keeps one block table per group and a sliding group frees what its window left.
//!
//! No device code and no model code lives here.

mod aligned;
pub mod bench;
mod block_hash;
pub mod config;
pub mod error;
pub mod format;
mod group_table;
pub mod groups;
mod kv_pool;
pub mod pages;
mod policy;
pub mod pool;
mod prefix;
mod sequence;
mod standalone;
pub mod stats;

pub use block_hash::BlockHash;
pub use config::CacheConfig;
pub use error::{CacheError, CapacityReason, ConfigError};
pub use format::{Codec, KvFormat, Rotation};
pub use groups::{GroupKind, LayerGroups};
pub use kv_pool::{geometry_of, KvPool};
pub use pages::{HostPages, LayerView, PageGeometry, PageStore, PlaneView};
pub use policy::SequencePolicy;
pub use pool::{BlockPool, NULL_BLOCK};
pub use prefix::PrefixBlocks;
pub use sequence::{SequenceCache, Snapshot};
pub use standalone::StandaloneCache;
pub use stats::{AttentionRoute, CacheCounters, CacheStats, FallbackReason};
