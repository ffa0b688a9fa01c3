//! Paged attention over the KV cache pages, on the CPU: [`Attention::forward`].
//!
//! One entry point serves a batch of sequences: queries `[num_seqs, q_len, num_heads,
//! head_dim]`, each sequence's block table and context length, a scale, an optional sliding
//! window and an optional causal mask (prefill, speculative verify). Keys and values are read
//! where they lie in the pages ([`kvcache::LayerView`]), block by block, only the live
//! tokens, dequantized inside the kernel; no dense copy of the context is ever made.
//!
//! Three implementations of the same function (see `../shared/DESIGN.md`):
//! - [`reference`]: scalar, f64 accumulation, online softmax; the oracle and the fallback.
//! - [`primitive`]: one pass per (sequence, kv-head group): each page is read once and serves
//!   every query row of the group (`q_len × num_heads / num_kv_heads` rows); a task takes a
//!   sequence's kv heads together (whole blocks read at once), split only to give every
//!   thread work.
//! - [`partitioned`]: split-K ("flash decoding"): the context is cut into partitions of
//!   `partition_size` tokens processed in parallel, then merged exactly.
//!
//! Both fast paths run the same tile kernels (`tile`, `simd`), built for two instruction sets
//! chosen at run time ([`KernelIsa`]): AVX-512F/VL (32 registers, wider blocking) where the CPU
//! has it, else AVX2 + FMA + F16C; `PAGEKV_DEV_ATTN_ISA` pins one (tests run both).
//!
//! [`router`] picks primitive or partitioned for `auto`; `PAGEKV_ATTN_IMPL` overrides. When a
//! requested fast path cannot serve a call (no AVX2/FMA/F16C or the pinned instruction set,
//! unsupported head_dim) the call runs on the reference, one warning per reason per process
//! goes to stderr, and every such call is counted in [`kvcache::CacheCounters::fallbacks`].
//!
//! Visibility: query `i` of a sequence with context `C` sits at position `p = C - q_len + i`.
//! It sees keys `[lo, hi)` with `hi = p + 1` when causal (else `C`) and `lo = p + 1 - W` with a
//! sliding window `W` (else 0). Rotated formats (q4r, turbo) store `R·k`, `R·v`: kernels rotate
//! the query and un-rotate the output instead of touching the keys.

pub mod bench;
pub mod ggml;
mod group;
pub mod partitioned;
#[cfg(test)]
mod precision;
pub mod primitive;
pub mod reference;
pub mod router;
#[cfg(target_arch = "x86_64")]
mod simd;
#[cfg(target_arch = "x86_64")]
mod softmax;
#[cfg(target_arch = "x86_64")]
mod tile;
mod workspace;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use kvcache::{AttentionRoute, CacheCounters, FallbackReason, KvFormat, LayerView, NULL_BLOCK};

use crate::threadpool::{ThreadPool, ThreadPoolError};
pub use group::QueryBounds;
pub use router::{RouterConfig, DEFAULT_PARTITION_SIZE, DEFAULT_PARTITION_THRESHOLD};
use workspace::Workspace;

/// Environment variable choosing the implementation.
pub const ATTN_IMPL_ENV: &str = "PAGEKV_ATTN_IMPL";
/// Environment variable setting the partition size (tokens) of the partitioned path.
pub const PARTITION_SIZE_ENV: &str = "PAGEKV_PARTITION_SIZE";
/// Environment variable setting the context length from which `auto` considers partitioning.
pub const PARTITION_THRESHOLD_ENV: &str = "PAGEKV_DEV_PARTITION_THRESHOLD";
/// Accepted values of [`ATTN_IMPL_ENV`].
pub const ATTN_IMPL_VALUES: &str = "auto, reference, primitive, partitioned";
/// Environment variable pinning the instruction set of the fast kernels.
pub const ATTN_ISA_ENV: &str = "PAGEKV_DEV_ATTN_ISA";
/// Accepted values of [`ATTN_ISA_ENV`].
pub const ATTN_ISA_VALUES: &str = "auto, avx2, avx512";

/// Largest head_dim the fast kernels serve (their tile buffers are sized by it).
pub const MAX_FAST_HEAD_DIM: usize = 512;

/// One attention call over a batch of sequences.
#[derive(Clone, Copy, Debug)]
pub struct AttentionParams<'a> {
    /// `[num_seqs, q_len, num_heads, head_dim]`
    pub queries: &'a [f32],
    pub num_seqs: usize,
    /// Query tokens per sequence (1 for decode).
    pub q_len: usize,
    /// Query heads; a multiple of the layer's `num_kv_heads` (grouped-query attention).
    pub num_heads: usize,
    /// `[num_seqs]` block tables (logical block → physical block id; `NULL_BLOCK` for blocks a
    /// sliding window reclaimed, which must lie wholly before every query's window).
    pub block_tables: &'a [&'a [u32]],
    /// `[num_seqs]` keys in the cache per sequence, including the `q_len` new ones.
    pub context_lens: &'a [usize],
    /// Multiplies `q·k` (usually `1/sqrt(head_dim)`).
    pub scale: f32,
    /// Query at position `p` sees keys `(p - W, p]`.
    pub sliding_window: Option<usize>,
    /// Query `i` sees keys up to its own position (`context_len - q_len + i`).
    pub causal: bool,
}

/// Which implementation to use.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum AttnImpl {
    /// Primitive or partitioned, chosen per call by [`router::choose`].
    #[default]
    Auto,
    Reference,
    Primitive,
    Partitioned,
}

impl AttnImpl {
    /// Parses a `PAGEKV_ATTN_IMPL` / `--attn-impl` value.
    pub fn parse(value: &str) -> Result<AttnImpl, AttentionError> {
        match value.trim().to_ascii_lowercase().as_str() {
            "auto" => Ok(AttnImpl::Auto),
            "reference" => Ok(AttnImpl::Reference),
            "primitive" => Ok(AttnImpl::Primitive),
            "partitioned" => Ok(AttnImpl::Partitioned),
            _ => Err(AttentionError::Config {
                name: ATTN_IMPL_ENV,
                value: value.to_string(),
                accepted: ATTN_IMPL_VALUES.to_string(),
            }),
        }
    }

    pub fn name(&self) -> &'static str {
        match self {
            AttnImpl::Auto => "auto",
            AttnImpl::Reference => "reference",
            AttnImpl::Primitive => "primitive",
            AttnImpl::Partitioned => "partitioned",
        }
    }
}

/// Instruction set of the fast kernels.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum KernelIsa {
    /// AVX2 + FMA + F16C: 8 lanes, 16 registers.
    Avx2,
    /// AVX-512F/VL (with AVX2, FMA, F16C): the same 8-lane kernels with 32 registers and
    /// wider blocking.
    Avx512,
}

impl KernelIsa {
    /// Every instruction set the kernels are built for, weakest first.
    pub const ALL: [KernelIsa; 2] = [KernelIsa::Avx2, KernelIsa::Avx512];

    pub fn name(&self) -> &'static str {
        match self {
            KernelIsa::Avx2 => "avx2",
            KernelIsa::Avx512 => "avx512",
        }
    }

    /// Whether this CPU runs these kernels.
    pub fn is_available(&self) -> bool {
        #[cfg(target_arch = "x86_64")]
        {
            let avx2 = std::is_x86_feature_detected!("avx2")
                && std::is_x86_feature_detected!("fma")
                && std::is_x86_feature_detected!("f16c");
            match self {
                KernelIsa::Avx2 => avx2,
                KernelIsa::Avx512 => {
                    avx2 && std::is_x86_feature_detected!("avx512f") && std::is_x86_feature_detected!("avx512vl")
                }
            }
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            false
        }
    }

    /// The strongest instruction set this CPU runs, if any.
    pub fn detect() -> Option<KernelIsa> {
        KernelIsa::ALL.into_iter().rev().find(KernelIsa::is_available)
    }
}

/// Which instruction set the fast kernels use (`PAGEKV_DEV_ATTN_ISA`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum IsaChoice {
    /// The strongest one the CPU has ([`KernelIsa::detect`]).
    #[default]
    Auto,
    /// This one; calls fall back to the reference (`unsupported_cpu`) if the CPU lacks it.
    Only(KernelIsa),
}

impl IsaChoice {
    /// Parses a `PAGEKV_DEV_ATTN_ISA` value.
    pub fn parse(value: &str) -> Result<IsaChoice, AttentionError> {
        match value.trim().to_ascii_lowercase().as_str() {
            "auto" => Ok(IsaChoice::Auto),
            "avx2" => Ok(IsaChoice::Only(KernelIsa::Avx2)),
            "avx512" => Ok(IsaChoice::Only(KernelIsa::Avx512)),
            _ => Err(AttentionError::Config {
                name: ATTN_ISA_ENV,
                value: value.to_string(),
                accepted: ATTN_ISA_VALUES.to_string(),
            }),
        }
    }

    /// The instruction set this choice resolves to on this CPU, if it can run.
    pub fn resolve(&self) -> Option<KernelIsa> {
        match self {
            IsaChoice::Auto => KernelIsa::detect(),
            IsaChoice::Only(isa) => isa.is_available().then_some(*isa),
        }
    }
}

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

/// Router and kernel configuration of an [`Attention`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AttentionConfig {
    pub impl_: AttnImpl,
    pub router: RouterConfig,
    /// Instruction set of the fast kernels.
    pub isa: IsaChoice,
}

impl Default for AttentionConfig {
    fn default() -> Self {
        AttentionConfig { impl_: AttnImpl::Auto, router: RouterConfig::default(), isa: IsaChoice::Auto }
    }
}

impl AttentionConfig {
    /// Whether a setting chooses among the fast kernels (a path, an instruction set or router
    /// thresholds other than the defaults): the default numerics (`auto`) then run those
    /// kernels rather than the ggml ones, so the choice is not silently ignored.
    pub fn picks_fast_kernels(&self) -> bool {
        *self != AttentionConfig::default()
    }

    /// Parses `PAGEKV_ATTN_IMPL`, `PAGEKV_PARTITION_SIZE`, `PAGEKV_DEV_PARTITION_THRESHOLD` and
    /// `PAGEKV_DEV_ATTN_ISA` as `lookup` gives them (the binary passes its flags over the
    /// environment; tests pass a map). Unset names keep the defaults.
    pub fn from_lookup(lookup: impl Fn(&str) -> Option<String>) -> Result<AttentionConfig, AttentionError> {
        let mut c = AttentionConfig::default();
        if let Some(v) = lookup(ATTN_IMPL_ENV) {
            c.impl_ = AttnImpl::parse(&v)?;
        }
        if let Some(v) = lookup(ATTN_ISA_ENV) {
            c.isa = IsaChoice::parse(&v)?;
        }
        let positive = |name: &'static str, v: String| -> Result<usize, AttentionError> {
            match v.trim().parse::<usize>() {
                Ok(n) if n > 0 => Ok(n),
                _ => Err(AttentionError::Config { name, value: v, accepted: "a positive integer".into() }),
            }
        };
        if let Some(v) = lookup(PARTITION_SIZE_ENV) {
            c.router.partition_size = positive(PARTITION_SIZE_ENV, v)?;
        }
        if let Some(v) = lookup(PARTITION_THRESHOLD_ENV) {
            c.router.partition_threshold = positive(PARTITION_THRESHOLD_ENV, v)?;
        }
        Ok(c)
    }
}

/// The thread pool an [`Attention`] runs on: the process-wide one or an owned one.
#[derive(Clone, Debug)]
pub enum PoolHandle {
    Static(&'static ThreadPool),
    Shared(Arc<ThreadPool>),
}

impl std::ops::Deref for PoolHandle {
    type Target = ThreadPool;
    fn deref(&self) -> &ThreadPool {
        match self {
            PoolHandle::Static(p) => p,
            PoolHandle::Shared(p) => p,
        }
    }
}

impl From<&'static ThreadPool> for PoolHandle {
    fn from(p: &'static ThreadPool) -> Self {
        PoolHandle::Static(p)
    }
}

impl From<Arc<ThreadPool>> for PoolHandle {
    fn from(p: Arc<ThreadPool>) -> Self {
        PoolHandle::Shared(p)
    }
}

/// The attention operator: configuration, thread pool and a workspace reused across calls
/// (the decode step allocates nothing once the workspace has grown to the batch's size).
pub struct Attention {
    config: AttentionConfig,
    pool: PoolHandle,
    workspace: Workspace,
}

impl Attention {
    pub fn new(config: AttentionConfig, pool: impl Into<PoolHandle>) -> Attention {
        Attention { config, pool: pool.into(), workspace: Workspace::default() }
    }

    pub fn config(&self) -> &AttentionConfig {
        &self.config
    }

    pub fn set_impl(&mut self, impl_: AttnImpl) {
        self.config.impl_ = impl_;
    }

    pub fn threads(&self) -> usize {
        self.pool.n_threads()
    }

    /// Computes attention for every query of `p` over `layer` into `out`
    /// (`[num_seqs, q_len, num_heads, head_dim]`), returns the route that served it and counts
    /// it (route, fallbacks, partitions, dequantized tokens) in `counters`.
    pub fn forward(
        &mut self,
        layer: &LayerView,
        p: &AttentionParams,
        counters: &CacheCounters,
        out: &mut [f32],
    ) -> Result<AttentionRoute, AttentionError> {
        validate(layer, p, out)?;
        let (route, isa) = match self.config.impl_ {
            AttnImpl::Reference => (AttentionRoute::Reference, None),
            requested => match fast_path_isa(layer, self.config.isa) {
                Err(reason) => {
                    warn_fallback_once(reason, requested, layer);
                    counters.count_fallback(reason);
                    (AttentionRoute::Reference, None)
                }
                Ok(isa) => {
                    let route = match requested {
                        AttnImpl::Primitive => AttentionRoute::Primitive,
                        AttnImpl::Partitioned => AttentionRoute::Partitioned,
                        _ => router::choose(layer, p, self.pool.n_threads(), &self.config.router),
                    };
                    (route, Some(isa))
                }
            },
        };
        match (route, isa) {
            (AttentionRoute::Primitive, Some(isa)) => {
                primitive::attention(layer, p, isa, &self.pool, &mut self.workspace, out)
            }
            (AttentionRoute::Partitioned, Some(isa)) => {
                let parts = partitioned::attention(
                    layer,
                    p,
                    self.config.router.partition_size,
                    isa,
                    &self.pool,
                    &mut self.workspace,
                    out,
                );
                CacheCounters::add(&counters.partitions, parts as u64);
            }
            _ => reference::attention(layer, p, out),
        }
        counters.count_route(route);
        if layer.format != KvFormat::F32 {
            CacheCounters::add(&counters.dequantized_tokens, dequantized_tokens(layer, p));
        }
        Ok(route)
    }
}

/// Token positions × kv heads read by a call: what every path decodes.
fn dequantized_tokens(layer: &LayerView, p: &AttentionParams) -> u64 {
    let per_seq: usize = (0..p.num_seqs).map(|s| QueryBounds::of(p, s).read_range().len()).sum();
    (per_seq * layer.num_kv_heads) as u64
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

/// Why the fast kernels cannot serve this layer on this CPU, if they cannot.
pub fn fast_path_unavailable(layer: &LayerView) -> Option<FallbackReason> {
    fast_path_isa(layer, IsaChoice::Auto).err()
}

/// Whether this CPU runs the fast kernels (AVX2 + FMA + F16C at least).
pub fn cpu_supports_fast_path() -> bool {
    KernelIsa::detect().is_some()
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

/// Checks every shape and every block a call will read; after this, kernels index freely.
fn validate(layer: &LayerView, p: &AttentionParams, out: &[f32]) -> Result<(), AttentionError> {
    let (hkv, d) = (layer.num_kv_heads, layer.head_dim);
    if hkv == 0 || p.num_heads == 0 || !p.num_heads.is_multiple_of(hkv) {
        return Err(AttentionError::HeadGroup { num_heads: p.num_heads, num_kv_heads: hkv });
    }
    if p.q_len == 0 {
        return Err(AttentionError::Shape { what: "q_len", expected: 1, got: 0 });
    }
    let n = p.num_seqs * p.q_len * p.num_heads * d;
    for (what, got) in [("queries", p.queries.len()), ("out", out.len())] {
        if got != n {
            return Err(AttentionError::Shape { what, expected: n, got });
        }
    }
    for (what, got) in [("block_tables", p.block_tables.len()), ("context_lens", p.context_lens.len())] {
        if got != p.num_seqs {
            return Err(AttentionError::Shape { what, expected: p.num_seqs, got });
        }
    }
    if p.sliding_window == Some(0) {
        return Err(AttentionError::ZeroWindow);
    }
    check_layer(layer)?;
    let bs = layer.block_size;
    let num_blocks = layer.keys.codes.len() / (bs * hkv * layer.keys.code_bytes);
    for seq in 0..p.num_seqs {
        let ctx = p.context_lens[seq];
        if ctx < p.q_len {
            return Err(AttentionError::ContextTooShort { seq, context_len: ctx, q_len: p.q_len });
        }
        let table = p.block_tables[seq];
        let needed = ctx.div_ceil(bs);
        if table.len() < needed {
            return Err(AttentionError::BlockTableShort { seq, needed, len: table.len() });
        }
        let range = QueryBounds::of(p, seq).read_range();
        for (logical, &block) in table.iter().enumerate().take(needed).skip(range.start / bs) {
            if block == NULL_BLOCK || block as usize >= num_blocks {
                return Err(AttentionError::BadBlock { seq, logical, block, num_blocks });
            }
        }
    }
    Ok(())
}

/// The planes agree with the layer's geometry and format.
fn check_layer(layer: &LayerView) -> Result<(), AttentionError> {
    let (hkv, d, bs) = (layer.num_kv_heads, layer.head_dim, layer.block_size);
    if d == 0 || bs == 0 || hkv == 0 {
        return Err(AttentionError::Layer(format!("head_dim {d}, block_size {bs}, kv heads {hkv}")));
    }
    for (side, plane, codec) in
        [("K", &layer.keys, layer.format.key_codec()), ("V", &layer.values, layer.format.value_codec())]
    {
        if plane.codec != codec
            || plane.code_bytes != codec.code_bytes(d)
            || plane.n_scales != codec.scales(d)
            || plane.num_kv_heads != hkv
        {
            return Err(AttentionError::Layer(format!("{side} plane does not match format {}", layer.format.name())));
        }
        let slots = plane.codes.len() / (hkv * plane.code_bytes);
        if plane.codes.len() % (bs * hkv * plane.code_bytes) != 0 || plane.scales.len() != slots * hkv * plane.n_scales
        {
            return Err(AttentionError::Layer(format!("{side} plane sizes are not whole blocks")));
        }
    }
    if layer.keys.codes.len() / layer.keys.code_bytes != layer.values.codes.len() / layer.values.code_bytes {
        return Err(AttentionError::Layer("K and V planes hold different slot counts".into()));
    }
    match (layer.format.is_rotated(), layer.rotation) {
        (true, Some(r)) if r.head_dim() == d => Ok(()),
        (false, None) => Ok(()),
        _ => {
            Err(AttentionError::Layer(format!("rotation does not match format {} / head_dim {d}", layer.format.name())))
        }
    }
}
