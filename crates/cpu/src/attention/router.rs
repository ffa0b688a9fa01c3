//! `auto` routing: primitive or partitioned, from a small cost model.
//!
//! The primitive path reads each sequence's pages once with every kv head of a task served
//! from the same tile of blocks; it splits a sequence's kv heads into at most one task per
//! thread (`primitive::TASKS_PER_THREAD`) and needs no merge. The partitioned path cuts the
//! context into partitions, prepares the queries again per partition and merges the partial
//! states. So `auto` picks **partitioned** only when the primitive path cannot give every
//! thread a task, `num_seqs × num_kv_heads < threads × MIN_TASKS_PER_THREAD`, and the longest
//! read range is at least `partition_threshold` tokens (and one partition); **primitive**
//! otherwise.
//!
//! Measured on this machine (2 Zen 4 cores shared with other jobs, load average 3-4; decode,
//! 32 query heads, head_dim 128, block 16, f16; AVX-512 kernels; median wall ms of 3
//! interleaved rounds of 7 runs, `PAGEKV_DEV_ATTN_ISA=avx512 cargo run --release -p pagekv-cpu
//! --example attention_bench -- 1x512,1x4096,1x16384,4x4096,16x4096 f16
//! primitive,partitioned 7`):
//!
//! | kv heads | batch × context | primitive | partitioned (512) |
//! |---------:|-----------------|----------:|------------------:|
//! | 8        | 1 × 512         | 0.058     | 0.066             |
//! | 8        | 1 × 4096        | 0.501     | 0.493             |
//! | 8        | 1 × 16384       | 2.79      | 2.93              |
//! | 8        | 4 × 4096        | 2.81      | 3.02              |
//! | 8        | 16 × 4096       | 12.4      | 13.5              |
//! | 2        | 1 × 2048        | 0.059     | 0.062             |
//! | 2        | 1 × 16384       | 0.516     | 0.507             |
//!
//! With at least one (sequence, kv head) per thread the primitive path is as fast or faster
//! everywhere (it also uses 5-15% less CPU time), so `MIN_TASKS_PER_THREAD` is 1. With one kv
//! head and one sequence the primitive path runs on one thread; partitioning was measured at
//! 1 × 32768 but brought no wall-time gain on this loaded box (1.37 ms vs 0.98 ms: the second
//! core was mostly taken by other jobs), so the split is kept by reasoning: on an idle machine
//! it halves such calls. `DEFAULT_PARTITION_THRESHOLD` (1024 tokens, two default partitions)
//! keeps short contexts, where the merge and the repeated query preparation weigh most, on
//! the primitive path; 256-token partitions were no faster than 512 (1 kv head, 1 × 1024 to
//! 1 × 32768).

use kvcache::{AttentionRoute, LayerView};

use super::group::QueryBounds;
use super::AttentionParams;

/// Default partition size in tokens (`PAGEKV_PARTITION_SIZE`).
pub const DEFAULT_PARTITION_SIZE: usize = 512;

/// Default context length (tokens read) from which `auto` considers partitioning
/// (`PAGEKV_DEV_PARTITION_THRESHOLD`).
pub const DEFAULT_PARTITION_THRESHOLD: usize = 1024;

/// (sequence, kv head) pairs per thread below which the primitive path leaves threads idle.
pub const MIN_TASKS_PER_THREAD: usize = 1;

/// Partition size and the `auto` threshold.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RouterConfig {
    pub partition_size: usize,
    pub partition_threshold: usize,
}

impl Default for RouterConfig {
    fn default() -> Self {
        RouterConfig { partition_size: DEFAULT_PARTITION_SIZE, partition_threshold: DEFAULT_PARTITION_THRESHOLD }
    }
}

/// The fast path `auto` uses for this call on `threads` threads.
pub fn choose(layer: &LayerView, p: &AttentionParams, threads: usize, cfg: &RouterConfig) -> AttentionRoute {
    let tasks = p.num_seqs * layer.num_kv_heads;
    let longest = (0..p.num_seqs).map(|s| QueryBounds::of(p, s).read_range().len()).max().unwrap_or(0);
    if tasks < threads * MIN_TASKS_PER_THREAD && longest >= cfg.partition_threshold.max(cfg.partition_size) {
        AttentionRoute::Partitioned
    } else {
        AttentionRoute::Primitive
    }
}
