//! Counters, not logs: everything the cache and the kernels reading it count, shared by
//! reference (`Arc<CacheCounters>`) so kernels can count through a `&` view. A
//! [`CacheStats`] is a consistent-enough snapshot for `/metrics`, benches and tests.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

/// Attention implementation that served a call.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum AttentionRoute {
    #[default]
    Reference,
    Primitive,
    Partitioned,
    /// llama.cpp's rounding (the CPU's ggml-numerics kernels, SIMD or scalar).
    Ggml,
}

impl AttentionRoute {
    pub const ALL: [AttentionRoute; 4] =
        [AttentionRoute::Reference, AttentionRoute::Primitive, AttentionRoute::Partitioned, AttentionRoute::Ggml];

    pub fn name(&self) -> &'static str {
        match self {
            AttentionRoute::Reference => "reference",
            AttentionRoute::Primitive => "primitive",
            AttentionRoute::Partitioned => "partitioned",
            AttentionRoute::Ggml => "ggml",
        }
    }
}

/// Why a requested fast attention path fell back to the reference.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum FallbackReason {
    /// The fast kernels are not built for this head_dim.
    #[default]
    UnsupportedHeadDim,
    /// The fast kernels do not handle this KV format.
    UnsupportedFormat,
    /// The CPU lacks the instruction set the fast kernels need.
    UnsupportedCpu,
    /// Some other shape limit (e.g. head group too large).
    UnsupportedShape,
}

impl FallbackReason {
    pub const ALL: [FallbackReason; 4] = [
        FallbackReason::UnsupportedHeadDim,
        FallbackReason::UnsupportedFormat,
        FallbackReason::UnsupportedCpu,
        FallbackReason::UnsupportedShape,
    ];

    pub fn name(&self) -> &'static str {
        match self {
            FallbackReason::UnsupportedHeadDim => "unsupported_head_dim",
            FallbackReason::UnsupportedFormat => "unsupported_format",
            FallbackReason::UnsupportedCpu => "unsupported_cpu",
            FallbackReason::UnsupportedShape => "unsupported_shape",
        }
    }
}

/// Live counters of one pool and the kernels reading it.
#[derive(Debug, Default)]
pub struct CacheCounters {
    pub appends: AtomicU64,
    pub tokens_written: AtomicU64,
    pub grow_events: AtomicU64,
    pub trims: AtomicU64,
    pub trimmed_tokens: AtomicU64,
    pub forks: AtomicU64,
    pub cow_copies: AtomicU64,
    pub reclaimed_blocks: AtomicU64,
    pub capacity_errors: AtomicU64,
    /// `[route]` attention calls served by each implementation.
    pub attention_calls: [AtomicU64; 4],
    /// Partitions processed by the partitioned path (and shares of a ggml decode row split over
    /// threads).
    pub partitions: AtomicU64,
    /// Token positions (K and V of one kv head group) decoded inside attention kernels.
    pub dequantized_tokens: AtomicU64,
    /// `[reason]` calls that fell back to the reference.
    pub fallbacks: [AtomicU64; 4],
}

impl CacheCounters {
    pub fn count_route(&self, route: AttentionRoute) {
        self.attention_calls[route as usize].fetch_add(1, Relaxed);
    }

    pub fn count_fallback(&self, reason: FallbackReason) {
        self.fallbacks[reason as usize].fetch_add(1, Relaxed);
    }

    pub fn add(counter: &AtomicU64, n: u64) {
        counter.fetch_add(n, Relaxed);
    }
}

/// A snapshot of a pool's counters and occupancy.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CacheStats {
    pub format: String,
    pub appends: u64,
    pub tokens_written: u64,
    pub grow_events: u64,
    pub trims: u64,
    pub trimmed_tokens: u64,
    pub forks: u64,
    pub cow_copies: u64,
    pub reclaimed_blocks: u64,
    pub capacity_errors: u64,
    pub blocks_total: usize,
    pub blocks_used: usize,
    pub blocks_free: usize,
    /// Blocks with more than one reference (forks, the session bank).
    pub blocks_shared: usize,
    /// Bytes of code planes in used blocks (all layers, K and V).
    pub code_bytes_used: usize,
    /// Bytes of scale planes in used blocks.
    pub scale_bytes_used: usize,
    /// Bytes of all pages of the pool.
    pub bytes_total: usize,
    pub attention_calls: [(AttentionRoute, u64); 4],
    pub partitions: u64,
    pub dequantized_tokens: u64,
    pub fallbacks: [(FallbackReason, u64); 4],
}

impl CacheStats {
    pub(crate) fn read_counters(c: &CacheCounters, s: &mut CacheStats) {
        let r = |a: &AtomicU64| a.load(Relaxed);
        s.appends = r(&c.appends);
        s.tokens_written = r(&c.tokens_written);
        s.grow_events = r(&c.grow_events);
        s.trims = r(&c.trims);
        s.trimmed_tokens = r(&c.trimmed_tokens);
        s.forks = r(&c.forks);
        s.cow_copies = r(&c.cow_copies);
        s.reclaimed_blocks = r(&c.reclaimed_blocks);
        s.capacity_errors = r(&c.capacity_errors);
        s.attention_calls = AttentionRoute::ALL.map(|route| (route, r(&c.attention_calls[route as usize])));
        s.partitions = r(&c.partitions);
        s.dequantized_tokens = r(&c.dequantized_tokens);
        s.fallbacks = FallbackReason::ALL.map(|reason| (reason, r(&c.fallbacks[reason as usize])));
    }

    /// Calls served by `route`.
    pub fn calls(&self, route: AttentionRoute) -> u64 {
        self.attention_calls[route as usize].1
    }

    /// Fallbacks counted for `reason`.
    pub fn fallbacks_for(&self, reason: FallbackReason) -> u64 {
        self.fallbacks[reason as usize].1
    }
}
