//! [`CudaTuning`]: every setting of the CUDA backend that is not part of a call — kernel
//! shapes and variants, launch options, the model step's routing thresholds, where compiled
//! kernels are cached — as one plain value. The binary builds it once (from its configuration,
//! through [`crate::dev::tuning_from_lookup`]) and hands it to [`crate::CudaDevice::new`]; the
//! kernel compiler, the attention, model and top-k launchers read it from the device they run
//! on, so a module is always launched with the shape it was compiled for. Nothing here reads
//! the environment.

use std::path::PathBuf;

/// Everything the CUDA backend can be tuned with. [`CudaTuning::default`] holds the measured
/// defaults (no kernel cache directory).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CudaTuning {
    /// The tensor-core decode kernel's shape, variants and grid.
    pub tc: TcTuning,
    /// Launch shape of the decode-step matrix-vector product (`ModelOps::gemv`).
    pub gemv: GemvShape,
    /// The largest matrix (bytes) a decode step multiplies with the fused matrix-vector kernel
    /// rather than cuBLAS; 0: cuBLAS only. No cap by default — measured on the H200 (`pagekv
    /// bench decode --device cuda --model synthetic:llama3-8b`), the split kernel streams Llama 3
    /// 8B's 235 MB gate|up, 117 MB down and 1 GB output matrices faster than cuBLAS, besides
    /// saving the separate norm/SiLU/conversion launches.
    pub gemv_max_bytes: usize,
    /// Items (row slices) a warp of the K-quant decode product (`QuantOps::gemv`, one token row)
    /// loads before it multiplies any: 1 or 2.
    pub qgemv_items: usize,
    /// Rounds of items (one item a warp) the K-quant decode product fetches into L2 ahead of
    /// the one it multiplies (the first rounds before it waits on the previous kernel); 0: none.
    pub qgemv_prefetch: usize,
    /// The K-quant decode product loads each warp's first items into registers before it waits
    /// on the previous kernel (their latency overlaps the input's prologue). On by default:
    /// about 1 % on an 8 B Q4_K_M decode step (docs/performance.md).
    pub qgemv_preload: bool,
    /// A weight stacked from two K-quant parts of different types (Q4_K_M's q|k and v) is
    /// multiplied by one launch (`QuantOps::gemv_pair`), its blocks split between the parts in
    /// proportion to their bytes, instead of a launch per part.
    pub qgemv_pair: bool,
    /// Most token rows a product with a quantized weight runs on the tensor cores with the
    /// weight dequantized tile by tile in shared memory (`QuantOps::mma`); larger products
    /// dequantize row ranges into a bf16 tile for cuBLAS. 0: never (docs/performance.md).
    pub qmma_max_rows: usize,
    /// Longest context the tensor-core decode kernel's automatic route
    /// (`DecodeAttention::auto_route`) serves as one partition, finished in place: a short
    /// context's partitions save less time than the merge launch they need costs. 256 by default
    /// (docs/performance.md); 0: the measured partition size alone decides.
    pub tc_direct_max: usize,
    /// New tokens of one sequence from which a model step takes the prefill kernel
    /// (`PrefillAttention`); `usize::MAX`: never. 96 by default (see `prefill.rs`).
    pub prefill_min_tokens: usize,
    /// Inside the model step, the cache write (`pk_cache_write`, after `pk_qkv_rope`) and the
    /// tensor-core decode kernel (after the cache write) are programmatic dependent launches —
    /// scheduled while the kernel before them still runs, they read block tables and context
    /// lengths, then wait for its results in-kernel (`pdl_wait`) — which hides two launch gaps
    /// per layer. `false`: plain launches (same-process comparisons).
    pub attention_pdl: bool,
    /// The model step finishes its queries, keys and values (bias, norms, RoPE) and writes the
    /// keys and values into the cache in one launch (`DevicePages::write_qkv`), not two
    /// (`ModelOps::qkv_rope`, then `DevicePages::write_device`): one kernel boundary less on
    /// each layer's path to its attention (measured in docs/performance.md). `false`: the two
    /// launches (same-process comparisons).
    pub qkv_write: bool,
    /// Capture and replay the model's decode steps as CUDA graphs.
    pub graphs: bool,
    /// A fixed chunk of the top-k partial selection (one of `TOP_K_CHUNKS`) for tuning runs;
    /// `None`: the plan's own choice (`TopKPlan::new`).
    pub topk_chunk: Option<usize>,
    /// Directory of the on-disk kernel cache; `None`: kernels are compiled in every process.
    pub kernel_cache: Option<PathBuf>,
    /// Print NVRTC's log (ptxas register and spill counts) for every kernel module compiled.
    pub nvrtc_verbose: bool,
    /// Batch-invariant kernels: every token row's result depends on that row's inputs and
    /// context alone, never on how many rows or sequences share its step, so a token computed
    /// in a multi-token (speculative) step equals the one computed alone, bit for bit. Costs
    /// speed: decode attention always splits the context into partitions of
    /// [`INVARIANT_PARTITION`] tokens merged by `pk_merge` (no stream-K grid, no V-in-registers
    /// variant, one kv head per CTA), every token row takes the decode attention kernel (no
    /// prefill kernel), and every matrix product runs the matrix-vector kernels a few rows at a
    /// time (no cuBLAS). Off by default (`PAGEKV_BATCH_INVARIANT`).
    pub batch_invariant: bool,
}

/// Tokens per partition of the decode attention in batch-invariant mode
/// ([`CudaTuning::batch_invariant`]): a multiple of both kernels' tiles (32 and 64); the
/// partition size the H200 measured best for one sequence at 4,096 tokens.
pub const INVARIANT_PARTITION: usize = 256;

impl Default for CudaTuning {
    fn default() -> CudaTuning {
        CudaTuning {
            tc: TcTuning::DEFAULT,
            gemv: GemvShape::DEFAULT,
            gemv_max_bytes: usize::MAX,
            qgemv_items: 1,
            qgemv_prefetch: 2,
            qgemv_preload: true,
            qgemv_pair: true,
            qmma_max_rows: 256,
            tc_direct_max: 256,
            prefill_min_tokens: 96,
            attention_pdl: true,
            qkv_write: true,
            graphs: true,
            topk_chunk: None,
            kernel_cache: None,
            nvrtc_verbose: false,
            batch_invariant: false,
        }
    }
}

/// The grid of the tensor-core decode kernel (`DecodeAttention::set_grid`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum DecodeGrid {
    /// The device's tuning ([`TcTuning::grid`]; `partitioned` by default).
    #[default]
    Auto,
    /// One CTA per (kv head, sequence, partition) of the route (`pk_decode_tc`).
    Partitioned,
    /// A persistent grid of about one CTA per SM, each over a balanced contiguous share of the
    /// call's (sequence, kv head, tile) space, split units merged in the same launch
    /// (`pk_decode_tc_sk`). Serves the tensor-core kernel's unrotated formats (f16, bf16, q4 —
    /// not q8 or q4r, whose pages are rotated) where its shared memory fits; a call it does not
    /// serve takes the route as given. The route's partition size is not used. Measured on the
    /// H200 no faster than the partitioned grid (`pagekv bench attention --device cuda`,
    /// 2026-12-02), so not the default.
    StreamK,
}

impl DecodeGrid {
    /// `Auto` resolved through `tuning` (its own `Auto` counts as `Partitioned`).
    pub fn resolve(self, tuning: &TcTuning) -> DecodeGrid {
        match (self, tuning.grid) {
            (DecodeGrid::Auto, DecodeGrid::StreamK) => DecodeGrid::StreamK,
            (DecodeGrid::Auto, _) => DecodeGrid::Partitioned,
            (g, _) => g,
        }
    }
}

/// Tuning of the tensor-core decode kernel (`kernels/decode_tc*.cu`): warps per CTA, pipeline
/// stages per warp, the most kv heads one CTA serves, its compiled variants and its launch.
/// Defaults measured on the H200 with `pagekv bench attention --device cuda`
/// (docs/performance.md); the kernel-shape rules that apply it are in `shapes.rs`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TcTuning {
    pub warps: usize,
    pub stages: usize,
    /// The most kv heads one CTA serves; 0: the measured rule of `shapes::tc_heads_per_cta`.
    pub max_heads_per_cta: usize,
    /// Warps per CTA for quantized pages (`warps` is for float pages).
    pub quant_warps: usize,
    /// Stages for quantized pages; 0: the measured default (see `shapes::tc_shape`).
    pub quant_stages: usize,
    /// Minimum CTAs per SM promised to the compiler (`__launch_bounds__`, which caps the
    /// registers) for quantized pages; 0: the measured default (see `shapes::tc_min_blocks`).
    pub quant_min_blocks: usize,
    /// The partitioned route merges inside the decode launch (the last CTA of each head group)
    /// instead of in `pk_merge`. Off by default: measured slower on the H200 (`pagekv bench
    /// attention --device cuda`: 1×4096 bf16 881 vs 957 GB/s).
    pub fused_merge: bool,
    /// `pk_merge` is launched as a programmatic dependent launch (it may start while the
    /// decode kernel still runs, and waits for its results in-kernel); `false` launches it
    /// plainly.
    pub pdl: bool,
    /// L2 policy of the page copies (`PK_TC_EF`): `auto` (the measured choice per format,
    /// `shapes::tc_evict_first`), `normal` or `evict-first`.
    pub l2: &'static str,
    /// A warp whose tiles all fit in its stages issues every copy at once (`PK_TC_EAGER`):
    /// `auto` (the measured choice per format, `shapes::tc_eager`), `0`, `1`.
    pub eager: &'static str,
    /// Calls whose grid has more CTAs than SMs take `pk_decode_tc_vreg`, the V rows in registers:
    /// `auto` (that rule, `shapes::tc_vreg_call`), `0` never, `1` always where the shape allows it.
    pub vreg: &'static str,
    /// Quantized pages attend two tiles per step of the tensor-core loop (`PK_TC_PAIR`): `auto`
    /// (the measured choice, `shapes::tc_pair`), `0`, `1`.
    pub pair: &'static str,
    /// The tensor-core route runs `pk_decode_tc_base` (one n-tile per split part, no
    /// rounded-query shortcut), the kernel before packed columns, for same-process comparisons.
    pub base: bool,
    /// The grid a launcher left at [`DecodeGrid::Auto`] takes.
    pub grid: DecodeGrid,
    /// CTAs per SM of the stream-K grid: 0 as many as fit (the occupancy of `pk_decode_tc_sk`),
    /// else at most that many.
    pub stream_k_ctas_per_sm: usize,
}

impl TcTuning {
    /// The measured defaults (`pagekv bench attention --device cuda`, 2026-12-01 and
    /// 2026-12-02): quantized pages take 8 warps per CTA and the heads-per-CTA rule
    /// (`shapes::measured_heads_per_cta`).
    pub const DEFAULT: TcTuning = TcTuning {
        warps: 8,
        stages: 2,
        max_heads_per_cta: 0,
        quant_warps: 8,
        quant_stages: 0,
        quant_min_blocks: 0,
        fused_merge: false,
        pdl: true,
        l2: "auto",
        eager: "auto",
        vreg: "auto",
        pair: "auto",
        base: false,
        grid: DecodeGrid::Partitioned,
        stream_k_ctas_per_sm: 0,
    };
}

impl Default for TcTuning {
    fn default() -> TcTuning {
        TcTuning::DEFAULT
    }
}

/// Rows one warp of the earlier row-per-warp product streams at a time (the kernels compiled).
pub const GEMV_ROWS_PER_WARP: [usize; 3] = [1, 2, 4];

/// Launch shape of `ModelOps::gemv`: which kernel, its block shape, and whether it is a
/// programmatic dependent launch.
///
/// The split kernel (`split_warps: Some(w)`, the default) runs `blocks_per_sm` blocks of `w`
/// warps per SM, each block computing the prologue once and streaming a contiguous range of
/// rows; the earlier kernel (`None`) runs one group of `rows_per_warp` rows per warp, with up to
/// `blocks_per_sm` blocks of 8 warps per SM, each repeating the prologue.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GemvShape {
    /// Warps per block of the split kernel (one of [`GemvShape::SPLIT_WARPS`]), or `None` for
    /// the earlier row-per-warp kernel.
    pub split_warps: Option<usize>,
    /// Rows per warp of the earlier kernel (one of [`GEMV_ROWS_PER_WARP`]).
    pub rows_per_warp: usize,
    pub blocks_per_sm: usize,
    /// The split kernel (and `pk_qkv_rope`, which follows the QKV product) is launched as a
    /// programmatic dependent launch: it may start while the previous kernel still runs, loads
    /// its first weights, and waits for that kernel's results in-kernel.
    pub pdl: bool,
}

impl GemvShape {
    /// Warps per block the split kernel is compiled for.
    pub const SPLIT_WARPS: [usize; 2] = [16, 32];

    /// The split kernel with one block of 32 warps per SM. Measured on the H200 (`pagekv bench
    /// decode --device cuda --model synthetic:llama3-8b`): with the earlier kernel, one row per
    /// warp and 8 blocks per SM ([`GemvShape::ROWS_DEFAULT`]) streamed Llama 3 8B's matrices
    /// fastest of {1, 2, 4} × {2, 4, 8, 16}.
    pub const DEFAULT: GemvShape = GemvShape { split_warps: Some(32), rows_per_warp: 1, blocks_per_sm: 1, pdl: true };

    /// The earlier row-per-warp kernel at its measured best shape.
    pub const ROWS_DEFAULT: GemvShape = GemvShape { split_warps: None, rows_per_warp: 1, blocks_per_sm: 8, pdl: true };
}

impl Default for GemvShape {
    fn default() -> GemvShape {
        GemvShape::DEFAULT
    }
}
