//! `auto` routing: primitive or partitioned, from a small cost model.
//!
//! The primitive path has one task per (sequence, kv head); when there are fewer such tasks
//! than a few per thread, threads idle (or finish unevenly) and splitting the context into
//! partitions wins, provided the context is long enough to pay for the extra merge step and
//! the repeated query preparation. So `auto` picks **partitioned** when
//! `num_seqs × num_kv_heads < threads × MIN_TASKS_PER_THREAD` and the longest read range is at
//! least `partition_threshold` tokens; **primitive** otherwise.
//!
//! Thresholds (see the measurements below, taken on this machine's 2 cores):
//! MEASUREMENTS_PLACEHOLDER

use kvcache::{AttentionRoute, LayerView};

use super::group::QueryBounds;
use super::AttentionParams;

/// Default partition size in tokens (`PAGEKV_PARTITION_SIZE`).
pub const DEFAULT_PARTITION_SIZE: usize = 512;

/// Default context length (tokens read) from which `auto` considers partitioning
/// (`PAGEKV_PARTITION_THRESHOLD`).
pub const DEFAULT_PARTITION_THRESHOLD: usize = 1024;

/// Primitive tasks per thread below which the pool is considered under-filled.
pub const MIN_TASKS_PER_THREAD: usize = 4;

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
