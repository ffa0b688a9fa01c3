//! The attention router: the one place that decides which route serves a call — `reference`,
//! `primitive`, `partitioned` or `ggml` — from the configuration, the layer and the call. The
//! dispatcher (`dispatch.rs`) runs the route and counts it in the cache counters.
//!
//! 1. **Numerics.** `ggml` numerics take the ggml route for every call (a cache other than f16
//!    is then an error). `auto` takes it where the SIMD ggml kernel serves the cache (f16,
//!    head_dim a multiple of 16 up to 512, a CPU with AVX2) and no setting picks among the fast
//!    kernels ([`AttentionConfig::picks_fast_kernels`]); the fast kernels everywhere else.
//! 2. **Fast kernels.** `reference` when asked. Otherwise the fast kernels need an instruction
//!    set the CPU runs (AVX2 + FMA + F16C, or the pinned one) and a head_dim they are built for
//!    (a multiple of 16 up to [`MAX_FAST_HEAD_DIM`]); where either is missing the call runs on the
//!    reference, one warning per reason per process goes to stderr, and every such call is
//!    counted in [`CacheCounters::fallbacks`].
//! 3. **`auto` among the fast kernels**: primitive or partitioned, from a small cost model.
//!
//! The primitive path reads each sequence's pages once with every kv head of a task served
//! from the same tile of blocks; it splits a sequence's kv heads into at most one task per
//! thread (`primitive::TASKS_PER_THREAD`) and needs no merge. The partitioned path cuts the
//! context into partitions, prepares the queries again per partition and merges the partial
//! states. Both sum a sequence's keys partition by partition (`partition_size` positions,
//! aligned to absolute positions) and fold the partials in position order, so the choice
//! changes the speed of a call, never its bits (the fast numerics promise a query the same
//! result however it is batched, and the choice depends on the batch). So `auto` picks **partitioned** only when the primitive path cannot keep every
//! thread busy — fewer (sequence, kv head) tasks than `threads × MIN_TASKS_PER_THREAD`, or
//! tasks that do not spread evenly: with `n` tasks on `t` threads the call lasts
//! `⌈n/t⌉` task times, so threads are busy `n / (⌈n/t⌉·t)` of it (3 kv heads on 2 threads:
//! 3/4) and below [`MIN_BUSY_SHARE`] the partitions, which split evenly, win — and the longest
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

use std::sync::atomic::{AtomicBool, Ordering};

use kvcache::{AttentionRoute, CacheCounters, FallbackReason, KvFormat, LayerView};

use super::config::{AttentionConfig, AttnImpl, AttnNumerics, IsaChoice, RouterConfig};
use super::ggml::GgmlAttention;
use super::group::QueryBounds;
use super::isa::{KernelIsa, MAX_FAST_HEAD_DIM};
use super::params::AttentionParams;

/// (sequence, kv head) pairs per thread below which the primitive path leaves threads idle.
pub const MIN_TASKS_PER_THREAD: usize = 1;

/// Least share of a primitive call the threads must be busy for `auto` to keep it primitive
/// (see the module docs): 3 kv heads on 2 threads (3/4) partition, 7 on 4 (7/8) do not.
/// SmolLM2-135M (3 kv heads) decoding one sequence at 4,096 tokens on 2 threads, q8 KV: the
/// primitive path left one thread idle for a third of every call (`perf`: 51 % / 15 % of the
/// samples on the two threads); partitioned, q8 decode went from 0.67× to about 0.85× the f16
/// rate of the same run (`pagekv bench decode --contexts 4096 --formats f16,q8,q4r`).
pub const MIN_BUSY_SHARE: f64 = 0.85;

/// What serves one call: the route and, for the fast kernels, their instruction set.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Plan {
    Reference,
    Primitive(KernelIsa),
    Partitioned(KernelIsa),
    /// The ggml operator (its SIMD kernel where it serves the layer, else its scalar one).
    Ggml,
}

impl Plan {
    /// The route the call is counted under.
    pub fn route(&self) -> AttentionRoute {
        match self {
            Plan::Reference => AttentionRoute::Reference,
            Plan::Primitive(_) => AttentionRoute::Primitive,
            Plan::Partitioned(_) => AttentionRoute::Partitioned,
            Plan::Ggml => AttentionRoute::Ggml,
        }
    }
}

/// The numerics calls over a cache of `format` with heads of `head_dim` run under `config`
/// (`ggml` is the operator the ggml route would run): `Fast` or `Ggml`, never `Auto`.
pub fn numerics_for(config: &AttentionConfig, ggml: &GgmlAttention, format: KvFormat, head_dim: usize) -> AttnNumerics {
    match config.numerics {
        AttnNumerics::Auto if !config.picks_fast_kernels() && ggml.serves_fast(format, head_dim) => {
            AttnNumerics::Ggml(ggml.steps())
        }
        AttnNumerics::Auto => AttnNumerics::Fast,
        n => n,
    }
}

/// The plan for one validated call on `threads` threads. A fast path that cannot serve it falls
/// back to the reference: counted in `counters`, warned about once per reason.
pub fn plan(
    config: &AttentionConfig,
    ggml: &GgmlAttention,
    layer: &LayerView,
    p: &AttentionParams,
    threads: usize,
    counters: &CacheCounters,
) -> Plan {
    if let AttnNumerics::Ggml(_) = numerics_for(config, ggml, layer.format, layer.head_dim) {
        return Plan::Ggml;
    }
    let requested = config.impl_;
    if requested == AttnImpl::Reference {
        return Plan::Reference;
    }
    match fast_path_isa(layer, config.isa) {
        Err(reason) => {
            warn_fallback_once(reason, requested, layer);
            counters.count_fallback(reason);
            Plan::Reference
        }
        Ok(isa) => match requested {
            AttnImpl::Primitive => Plan::Primitive(isa),
            AttnImpl::Partitioned => Plan::Partitioned(isa),
            _ => match choose(layer, p, threads, &config.router) {
                AttentionRoute::Partitioned => Plan::Partitioned(isa),
                _ => Plan::Primitive(isa),
            },
        },
    }
}

/// The instruction set the fast kernels serve this layer with under `choice`, or why they
/// cannot.
pub fn fast_path_isa(layer: &LayerView, choice: IsaChoice) -> Result<KernelIsa, FallbackReason> {
    let isa = choice.resolve().ok_or(FallbackReason::UnsupportedCpu)?;
    if !layer.head_dim.is_multiple_of(16) || layer.head_dim > MAX_FAST_HEAD_DIM {
        return Err(FallbackReason::UnsupportedHeadDim);
    }
    Ok(isa)
}

/// One flag per [`FallbackReason`]: set once its warning was printed.
static WARNED: [AtomicBool; 4] =
    [AtomicBool::new(false), AtomicBool::new(false), AtomicBool::new(false), AtomicBool::new(false)];

/// Prints the fallback warning for `reason` unless this process already did; returns whether
/// it printed.
fn warn_fallback_once(reason: FallbackReason, requested: AttnImpl, layer: &LayerView) -> bool {
    if WARNED[reason as usize].swap(true, Ordering::Relaxed) {
        return false;
    }
    eprintln!(
        "pagekv: warning: attention falls back to the reference path ({}): {} attention cannot serve \
         head_dim {} / format {} on this CPU; further fallbacks for this reason are only counted",
        reason.name(),
        requested.name(),
        layer.head_dim,
        layer.format.name(),
    );
    true
}

/// The fast path `auto` uses for this call on `threads` threads.
pub fn choose(layer: &LayerView, p: &AttentionParams, threads: usize, cfg: &RouterConfig) -> AttentionRoute {
    let tasks = p.num_seqs * layer.num_kv_heads;
    let threads = threads.max(1);
    let longest = (0..p.num_seqs).map(|s| QueryBounds::of(p, s).read_range().len()).max().unwrap_or(0);
    let busy = tasks as f64 / (tasks.div_ceil(threads) * threads).max(1) as f64;
    let few = tasks < threads * MIN_TASKS_PER_THREAD || busy < MIN_BUSY_SHARE;
    if few && longest >= cfg.partition_threshold.max(cfg.partition_size) {
        AttentionRoute::Partitioned
    } else {
        AttentionRoute::Primitive
    }
}
