//! Paged decode attention on the GPU: [`DecodeAttention::forward`].
//!
//! One query token per sequence (`q_len = 1`): queries `[num_seqs, num_heads, head_dim]` f32,
//! each sequence's block table and context length, a scale and an optional sliding window; keys
//! and values are read where they lie in [`DevicePages`], dequantized inside the kernel. Output
//! `[num_seqs, num_heads, head_dim]` f32.
//!
//! Kernels ([`DecodeKernel`]):
//! - tensor cores (`kernels/decode_tc*.cu`, `pk_decode_tc`): f16/bf16 pages (head_dim 32–256,
//!   powers of two) and q8/q4/q4r pages (head_dim 64, 128, 256); mma.sync with f32 operands
//!   split into exact parts, so it meets the same error bounds as the SIMT kernel. Groups of at
//!   most 4 query heads share the mma columns with the split parts, and queries already rounded
//!   to the page type (as the GPU model passes them for f16/bf16 caches) skip the QK mma of the
//!   parts past the first — same results, fewer mma. The tuning's [`TcTuning::base`] selects the
//!   kernel before those two changes (`pk_decode_tc_base`, for same-call comparisons);
//!   f16/bf16/q8 pages put an L2 evict-first policy on their page copies
//!   ([`crate::shapes::tc_evict_first`], [`TcTuning::l2`]).
//! - SIMT (`kernels/decode.cu`, `pk_decode`): every format and head_dim (f32, turbo, odd
//!   head dims); fp32 FMA.
//!
//! `Auto` takes the tensor-core kernel where it serves the call.
//!
//! Routes (see `../shared/DESIGN.md`):
//! - [`DecodeRoute::Primitive`]: one CTA per (sequence, kv head) over the whole visible context;
//!   its pages are read once for all query heads of the group.
//! - [`DecodeRoute::Partitioned`]: split-K — the visible context is cut into partitions of
//!   `partition_size` tokens, one CTA each, and `pk_merge` combines the partial softmaxes
//!   exactly (or, with [`TcTuning::fused_merge`], the last CTA of each head group does, in the
//!   same launch). `pk_merge` is a programmatic dependent launch (unless [`TcTuning::pdl`] is off): it is scheduled while the decode kernel runs and waits for its results in-kernel,
//!   which hides the launch gap (about 1 µs of the ~15 µs of a 1 × 4096 bf16 call on the H200).
//!   [`DecodeAttention::auto_route`] picks the route and partition size from the H200
//!   measurements ([`tc_partition_size`] for the tensor-core kernel,
//!   [`auto_partition_size`] for the SIMT kernel).
//!
//! Grids of the tensor-core kernel ([`DecodeGrid`], [`TcTuning::grid`]): the partitioned one
//! above (default), or stream-K (`pk_decode_tc_sk`): about one CTA per SM, each over a balanced
//! contiguous share of all (sequence, kv head, 16-token tile) work, its warps' copy pipelines
//! running on across unit boundaries, units split between CTAs merged by the last of them.
//!
//! In the model step the tensor-core kernel itself is a programmatic dependent launch after the
//! cache write ([`DecodeAttention::set_programmatic`], `CudaTuning::attention_pdl`).
//!
//! The tuning is the device's ([`CudaDevice::tuning`]), the one its modules were compiled with.
//!
//! Visibility matches the CPU: the query of a sequence with context `C` sees keys `[lo, C)`,
//! `lo = C − W` with a sliding window `W`, else 0. Rotated formats: the kernel rotates the query
//! and un-rotates the output.

use std::sync::Arc;

use cudarc::driver::{CudaSlice, LaunchConfig};

use crate::device::{arg, launch_kernel, set_max_dynamic_smem, CudaDevice, KernelModule};
use crate::pages::{dptr, DevicePages};
use crate::shapes::{
    decode_smem_bytes, decode_tc_sk_smem_bytes, decode_tc_smem_bytes, decode_tc_smem_bytes_for, tc_heads_per_cta,
    tc_shape, tc_supported, tc_vreg_call, tc_vreg_smem_bytes,
};
use crate::spec::ModuleSpec;
use crate::tuning::{DecodeGrid, TcTuning, INVARIANT_PARTITION};
use crate::CudaError;

/// Largest query-head group per kv head the kernels serve (accumulators live in registers).
pub const MAX_GROUP: usize = 16;

/// Tokens per kernel tile; partition sizes are rounded up to a multiple of it.
const TILE: usize = 32;

/// Which implementation serves a call.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DecodeRoute {
    Primitive,
    Partitioned { partition_size: usize },
}

impl DecodeRoute {
    pub fn name(&self) -> &'static str {
        match self {
            DecodeRoute::Primitive => "primitive",
            DecodeRoute::Partitioned { .. } => "partitioned",
        }
    }
}

/// Partition size (tokens, a multiple of 32) that gives at least `4 × sm_count` CTAs (or
/// partitions of one tile when the context is too short for that).
pub fn auto_partition_size(num_seqs: usize, num_kv_heads: usize, max_context: usize, sm_count: usize) -> usize {
    let units = (num_seqs * num_kv_heads).max(1);
    let parts = (4 * sm_count.max(1)).div_ceil(units).max(1);
    // Rounded down to whole tiles so the partition count never falls below `parts`.
    (max_context / parts / TILE).max(1) * TILE
}

/// Which kernel computes a call (both serve both routes and give the same results within the
/// error bounds).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum DecodeKernel {
    /// The tensor-core kernel where it serves the format (f16/bf16 pages, head_dim a multiple
    /// of 16), else the SIMT kernel.
    #[default]
    Auto,
    /// Always the SIMT kernel (fp32 FMA; every format and head_dim).
    Simt,
}

impl DecodeKernel {
    /// The kernel that serves `format` at `head_dim` with `group` query heads per kv head.
    pub fn resolve(
        self,
        device: &CudaDevice,
        format: kvcache::KvFormat,
        head_dim: usize,
        group: usize,
    ) -> &'static str {
        match self {
            DecodeKernel::Auto
                if tc_supported(format, head_dim, group)
                    && decode_tc_smem_bytes(&device.tuning().tc, format, head_dim) <= device.smem_optin() =>
            {
                "tc"
            }
            _ => "simt",
        }
    }
}

/// Partition size for the tensor-core kernel: at most one CTA per SM in all
/// (`num_seqs × num_kv_heads × partitions ≤ sm_count`: a few CTAs more would start a second,
/// nearly empty round on some SMs), in multiples of 64 tokens; the whole context (one
/// partition) once the batch alone fills the machine, or when the context is at most
/// `direct_max` tokens (`CudaTuning::tc_direct_max`: a model step's merge launch costs more
/// than a short context's partitions save).
/// Measured on the H200 (`pagekv bench attention --device cuda`): 1×4096 best at 256, 1×32768 at 2048
/// (1984, 17 partitions of 8 CTAs, was 4 % slower), 16×4096 and larger with one partition.
pub fn tc_partition_size(
    num_seqs: usize,
    num_kv_heads: usize,
    max_context: usize,
    sm_count: usize,
    direct_max: usize,
) -> usize {
    let units = (num_seqs * num_kv_heads).max(1);
    if 2 * units >= sm_count || max_context <= direct_max {
        return max_context.max(1).div_ceil(64) * 64;
    }
    let parts = (sm_count / units).max(1);
    max_context.div_ceil(parts).div_ceil(64).max(1) * 64
}

/// Checks `layer` and `num_heads` against the pages' geometry (shared by the decode and prefill
/// kernels' argument checks); returns the query heads per kv head.
pub(crate) fn kv_group(g: &kvcache::PageGeometry, layer: usize, num_heads: usize) -> Result<usize, CudaError> {
    if layer >= g.num_layers {
        return Err(CudaError::Invalid(format!("layer {layer} out of range ({} layers)", g.num_layers)));
    }
    if num_heads == 0 || !num_heads.is_multiple_of(g.num_kv_heads) {
        return Err(CudaError::Invalid(format!(
            "{num_heads} query heads is not a multiple of {} kv heads",
            g.num_kv_heads
        )));
    }
    Ok(num_heads / g.num_kv_heads)
}

/// One decode call over a batch of sequences. Device arrays; shapes in comments.
#[derive(Clone, Copy)]
pub struct DecodeBatch<'a> {
    /// `[num_seqs, num_heads, head_dim]`
    pub queries: &'a CudaSlice<f32>,
    pub num_seqs: usize,
    /// A multiple of the pages' `num_kv_heads`.
    pub num_heads: usize,
    /// `[num_seqs, max_blocks_per_seq]` physical block ids; entries for positions before a
    /// sequence's window may be anything (they are not read).
    pub block_tables: &'a CudaSlice<u32>,
    pub max_blocks_per_seq: usize,
    /// `[num_seqs]` tokens in the cache per sequence (≥ 1, ≤ `max_context_len`), including the
    /// new one.
    pub context_lens: &'a CudaSlice<u32>,
    /// Host-side maximum of `context_lens`: sizes the partition grid.
    pub max_context_len: usize,
    /// Multiplies `q·k` (usually `1/sqrt(head_dim)`).
    pub scale: f32,
    pub sliding_window: Option<usize>,
}

/// The decode attention launcher, with its scratch buffers for the partitioned route.
pub struct DecodeAttention {
    device: Arc<CudaDevice>,
    kernel: DecodeKernel,
    /// `[num_seqs, num_heads, max_parts, head_dim]` partial accumulators.
    part_acc: Option<CudaSlice<f32>>,
    /// `[num_seqs, num_heads, max_parts, 2]` partial (max, sum).
    part_ml: Option<CudaSlice<f32>>,
    /// `[num_seqs, num_kv_heads]` arrival counters of the tensor-core kernel's fused merge; zero
    /// between launches (the last CTA of each group resets its counter).
    counters: Option<CudaSlice<u32>>,
    /// Counts reallocations of the buffers above (a captured CUDA graph holds their addresses).
    generation: u64,
    /// The tensor-core kernel is a programmatic dependent launch ([`Self::set_programmatic`]).
    programmatic: bool,
    /// The tensor-core kernel's grid ([`Self::set_grid`]).
    grid: DecodeGrid,
    /// `[units + ctas, group, head_dim]` / `[units + ctas, group, 2]` partials and `[units]`
    /// arrival counters of the stream-K grid (zero between launches).
    sk_acc: Option<CudaSlice<f32>>,
    sk_ml: Option<CudaSlice<f32>>,
    sk_counters: Option<CudaSlice<u32>>,
    /// Stream-K CTAs per SM by (function, dynamic shared memory), from the occupancy API.
    sk_occupancy: Vec<(usize, usize, usize)>,
    /// Launches of `pk_decode_tc_vreg` ([`Self::vreg_launches`]).
    vreg_launches: u64,
}

impl DecodeAttention {
    pub fn new(device: Arc<CudaDevice>) -> DecodeAttention {
        DecodeAttention {
            device,
            kernel: DecodeKernel::Auto,
            part_acc: None,
            part_ml: None,
            counters: None,
            generation: 0,
            programmatic: false,
            grid: DecodeGrid::Auto,
            sk_acc: None,
            sk_ml: None,
            sk_counters: None,
            sk_occupancy: Vec::new(),
            vreg_launches: 0,
        }
    }

    /// The device's tensor-core kernel tuning.
    fn tc(&self) -> &TcTuning {
        &self.device.tuning().tc
    }

    /// How many calls were routed to the tensor-core kernel with the V rows in registers
    /// (`pk_decode_tc_vreg`, [`crate::shapes::tc_vreg_call`]).
    pub fn vreg_launches(&self) -> u64 {
        self.vreg_launches
    }

    /// Chooses the tensor-core kernel's grid (default [`DecodeGrid::Auto`]).
    pub fn set_grid(&mut self, grid: DecodeGrid) {
        self.grid = grid;
    }

    pub fn grid(&self) -> DecodeGrid {
        self.grid
    }

    /// Whether a call of `num_seqs` sequences with `num_heads` query heads over `pages` runs on
    /// the stream-K grid: the grid chosen ([`Self::set_grid`]) is stream-K and it serves the call.
    pub fn takes_stream_k(&self, pages: &DevicePages, num_heads: usize, num_seqs: usize, max_context: usize) -> bool {
        use kvcache::PageStore;
        let group = num_heads / pages.geometry().num_kv_heads.max(1);
        self.stream_k_smem(pages, group, num_seqs, max_context).is_some()
    }

    /// Whether the stream-K grid serves a call of `num_seqs` sequences over `pages` (the
    /// tensor-core kernel, an unrotated format, shared memory within the device's limit, and
    /// fewer than 2^31 tiles in all); `None` when it does not, else its dynamic shared memory.
    fn stream_k_smem(&self, pages: &DevicePages, group: usize, num_seqs: usize, max_context: usize) -> Option<usize> {
        use kvcache::PageStore;
        let g = pages.geometry();
        if self.grid.resolve(self.tc()) != DecodeGrid::StreamK
            || self.device.tuning().batch_invariant
            || self.kernel.resolve(&self.device, g.format, g.head_dim, group) != "tc"
            || pages.rotation_args().0 != 0
            || num_seqs * g.num_kv_heads * max_context.div_ceil(16) >= 1 << 31
        {
            return None;
        }
        let bytes = decode_tc_sk_smem_bytes(self.tc(), g.format, g.head_dim, group, num_seqs);
        (bytes <= self.device.smem_optin()).then_some(bytes)
    }

    /// Launches the tensor-core kernel (`pk_decode_tc`, `pk_decode_tc_base`) as a programmatic
    /// dependent launch (off by default): it may be scheduled while the kernel before it on the
    /// stream still runs, reads the block tables and context lengths, then waits for that
    /// kernel's results in-kernel (`pdl_wait`) before it reads pages or queries or writes
    /// anything. So block tables and context lengths must not be written by the kernels just
    /// before it — true of the model step, which uploads them before its kernels
    /// (`CudaTuning::attention_pdl`). The SIMT kernel stays a plain launch.
    pub fn set_programmatic(&mut self, on: bool) {
        self.programmatic = on;
    }

    /// Chooses the kernel (default [`DecodeKernel::Auto`]).
    pub fn set_kernel(&mut self, kernel: DecodeKernel) {
        self.kernel = kernel;
    }

    pub fn kernel(&self) -> DecodeKernel {
        self.kernel
    }

    /// Changes whenever the launcher's scratch buffers are reallocated: a CUDA graph that
    /// captured a call is valid only while this stays the same.
    pub fn generation(&self) -> u64 {
        self.generation
    }

    /// The route `auto` takes for a batch over `pages`: the partitioned route with the
    /// measured partition size of the kernel that serves the format, or the primitive route
    /// when that would be a single partition (for the tensor-core kernel, every context of at
    /// most `CudaTuning::tc_direct_max` tokens).
    /// In batch-invariant mode ([`CudaTuning::batch_invariant`](crate::CudaTuning)) always the
    /// partitioned route with [`INVARIANT_PARTITION`]-token partitions.
    pub fn auto_route(
        &self,
        pages: &DevicePages,
        num_heads: usize,
        num_seqs: usize,
        max_context: usize,
    ) -> DecodeRoute {
        use kvcache::PageStore;
        if self.device.tuning().batch_invariant {
            return DecodeRoute::Partitioned { partition_size: INVARIANT_PARTITION };
        }
        let g = pages.geometry();
        let group = num_heads / g.num_kv_heads.max(1);
        let sms = self.device.sm_count();
        let ps = match self.kernel.resolve(&self.device, g.format, g.head_dim, group) {
            "tc" => {
                let hpc = tc_heads_per_cta(self.tc(), g.format, g.head_dim, g.num_kv_heads, num_seqs, sms);
                let direct_max = self.device.tuning().tc_direct_max;
                tc_partition_size(num_seqs, g.num_kv_heads / hpc, max_context, sms, direct_max)
            }
            _ => auto_partition_size(num_seqs, g.num_kv_heads, max_context, sms),
        };
        if ps >= max_context {
            DecodeRoute::Primitive
        } else {
            DecodeRoute::Partitioned { partition_size: ps }
        }
    }

    fn check(&self, pages: &DevicePages, layer: usize, b: &DecodeBatch, out_len: usize) -> Result<usize, CudaError> {
        use kvcache::PageStore;
        let g = pages.geometry();
        let bad = |m: String| Err(CudaError::Invalid(m));
        let group = kv_group(g, layer, b.num_heads)?;
        if group > MAX_GROUP {
            return Err(CudaError::Unsupported(format!("{group} query heads per kv head (at most {MAX_GROUP})")));
        }
        let n = b.num_seqs * b.num_heads * g.head_dim;
        if b.num_seqs == 0 || b.queries.len() < n || out_len < n {
            return bad(format!(
                "{} sequences × {} heads × {}: queries {}, out {out_len}",
                b.num_seqs,
                b.num_heads,
                g.head_dim,
                b.queries.len()
            ));
        }
        if b.context_lens.len() < b.num_seqs || b.block_tables.len() < b.num_seqs * b.max_blocks_per_seq {
            return bad("context_lens or block_tables shorter than the batch".into());
        }
        if b.max_context_len == 0 || b.max_context_len > b.max_blocks_per_seq * g.block_size {
            return bad(format!(
                "max_context_len {} must be in 1..={} (max_blocks_per_seq × block_size)",
                b.max_context_len,
                b.max_blocks_per_seq * g.block_size
            ));
        }
        if b.num_seqs > 65535 {
            return Err(CudaError::Unsupported(format!("{} sequences in one call (at most 65535)", b.num_seqs)));
        }
        Ok(group)
    }

    /// `out [num_seqs, num_heads, head_dim]` ← attention of the batch's queries over `layer`.
    pub fn forward(
        &mut self,
        pages: &DevicePages,
        layer: usize,
        b: &DecodeBatch,
        route: DecodeRoute,
        out: &mut CudaSlice<f32>,
    ) -> Result<(), CudaError> {
        use kvcache::PageStore;
        let group = self.check(pages, layer, b, out.len())?;
        if route == (DecodeRoute::Partitioned { partition_size: 0 }) {
            return Err(CudaError::Invalid("partition_size 0".into())); // on either grid
        }
        if let Some(smem) = self.stream_k_smem(pages, group, b.num_seqs, b.max_context_len) {
            return self.forward_stream_k(pages, layer, b, group, smem, out);
        }
        let g = pages.geometry().clone();
        let d = g.head_dim;
        let module = self.device.module(&ModuleSpec::Kv { format: g.format, head_dim: d, group })?;
        let span = b.sliding_window.map_or(b.max_context_len, |w| w.min(b.max_context_len)).max(1);
        let invariant = self.device.tuning().batch_invariant;
        let (parts, part_size) = match route {
            DecodeRoute::Primitive => (1, span),
            DecodeRoute::Partitioned { partition_size } => {
                if partition_size == 0 {
                    return Err(CudaError::Invalid("partition_size 0".into()));
                }
                // Batch-invariant: never the one-partition grid (the kernels finish such a row
                // in place, `direct`): a row of one partition is merged like every other, so
                // its result does not depend on the longest context of the call.
                let parts = span.div_ceil(partition_size);
                (if invariant { parts.max(2) } else { parts }, partition_size)
            }
        };
        if parts > 65535 {
            return Err(CudaError::Unsupported(format!("{parts} partitions (at most 65535)")));
        }
        let dev = self.device.clone();
        let stream = dev.stream();
        if parts > 1 {
            let need_acc = b.num_seqs * b.num_heads * parts * d;
            let need_ml = b.num_seqs * b.num_heads * parts * 2;
            if self.part_acc.as_ref().is_none_or(|s| s.len() < need_acc) {
                self.generation += 1;
                self.part_acc =
                    Some(stream.alloc_zeros::<f32>(need_acc).map_err(|e| CudaError::driver("cuMemAlloc", e))?);
            }
            if self.part_ml.as_ref().is_none_or(|s| s.len() < need_ml) {
                self.generation += 1;
                self.part_ml =
                    Some(stream.alloc_zeros::<f32>(need_ml).map_err(|e| CudaError::driver("cuMemAlloc", e))?);
            }
        }
        let tc = self.kernel.resolve(&self.device, g.format, d, group) == "tc";
        if tc && parts > 1 {
            let need = b.num_seqs * g.num_kv_heads;
            if self.counters.as_ref().is_none_or(|s| s.len() < need) {
                self.generation += 1;
                self.counters = Some(stream.alloc_zeros::<u32>(need).map_err(|e| CudaError::driver("cuMemAlloc", e))?);
            }
        }
        let fused = tc && parts > 1 && self.tc().fused_merge;
        let counters_p = if fused { self.counters.as_ref().map_or(0, |s| dptr(s, &dev)) } else { 0u64 };
        let p = pages.layer_ptrs(layer)?;
        let (signs, norm) = pages.rotation_args();
        let out_p = dptr(out, &dev);
        let acc_p = self.part_acc.as_ref().map_or(0, |s| dptr(s, &dev));
        let ml_p = self.part_ml.as_ref().map_or(0, |s| dptr(s, &dev));
        let q_p = dptr(b.queries, &dev);
        let tables = dptr(b.block_tables, &dev);
        let ctx = dptr(b.context_lens, &dev);
        let max_blocks = b.max_blocks_per_seq as u32;
        let scale_log2 = b.scale * std::f32::consts::LOG2_E;
        let window = b.sliding_window.unwrap_or(0) as u32;
        let log2_bs = g.block_size.trailing_zeros();
        let part_size_u = part_size as u32;
        let parts_u = parts as u32;

        let (f, threads, smem, heads_per_cta) = if tc {
            let t = &dev.tuning().tc;
            let sms = self.device.sm_count();
            // Batch-invariant: one kv head per CTA and one kernel variant whatever the call's
            // size (both change how a partition's tiles are split over warps).
            let hpc = if invariant { 1 } else { tc_heads_per_cta(t, g.format, d, g.num_kv_heads, b.num_seqs, sms) };
            let ctas = g.num_kv_heads / hpc * b.num_seqs * parts;
            let (f, smem) = if t.base {
                (base_function(t, &module, g.format, d)?, decode_tc_smem_bytes_for(t, g.format, d, group))
            } else if !invariant && tc_vreg_call(t, g.format, d, group, ctas, sms) {
                self.vreg_launches += 1;
                (module.function("pk_decode_tc_vreg")?, tc_vreg_smem_bytes(t, g.format, d, group))
            } else {
                (module.function("pk_decode_tc")?, decode_tc_smem_bytes_for(t, g.format, d, group))
            };
            (f, 32 * tc_shape(t, g.format, d).0, smem, hpc)
        } else {
            (module.function("pk_decode")?, 128, decode_smem_bytes(g.format, d, group), 1)
        };
        debug_assert_eq!(g.num_kv_heads % heads_per_cta, 0);
        let num_kv_heads = g.num_kv_heads as u32;
        let cfg = LaunchConfig {
            grid_dim: ((g.num_kv_heads / heads_per_cta) as u32, b.num_seqs as u32, parts_u),
            block_dim: (threads as u32, 1, 1),
            shared_mem_bytes: smem as u32,
        };
        let mut args = [
            arg(&out_p),
            arg(&acc_p),
            arg(&ml_p),
            arg(&q_p),
            arg(&p.k_codes),
            arg(&p.k_scales),
            arg(&p.v_codes),
            arg(&p.v_scales),
            arg(&tables),
            arg(&max_blocks),
            arg(&ctx),
            arg(&signs),
            arg(&norm),
            arg(&scale_log2),
            arg(&window),
            arg(&log2_bs),
            arg(&part_size_u),
            arg(&num_kv_heads),
            arg(&counters_p),
        ];
        // pk_decode takes the first 17 parameters; the tensor-core kernels two more.
        let n_args = if tc { args.len() } else { args.len() - 2 };
        // SAFETY: `args[..n_args]` points at values of the kernel's parameter types, in order,
        // alive for the call (pk_decode, pk_decode_tc, pk_decode_tc_base); buffer sizes were
        // checked above, and the caller guarantees context_lens ≤ max_context_len and valid
        // block ids for visible positions. A programmatic tensor-core launch reads only tables
        // and context lengths before its pdl_wait (see `set_programmatic`).
        let launched =
            unsafe { launch_kernel(&dev, &f, cfg, &mut args[..n_args], tc && self.programmatic) }.map_err(|e| {
                CudaError::driver(if tc { "cuLaunchKernelEx(pk_decode_tc)" } else { "cuLaunchKernelEx(pk_decode)" }, e)
            });
        if let Err(e) = launched {
            self.counters = None; // a failed launch may leave counts behind: start from zeros
            return Err(e);
        }

        if parts > 1 && !fused {
            let f = module.function("pk_merge")?;
            let cfg = LaunchConfig {
                grid_dim: (b.num_heads as u32, b.num_seqs as u32, 1),
                block_dim: (128, 1, 1),
                shared_mem_bytes: (4 * (d + parts + 8)) as u32,
            };
            let mut args = [
                arg(&out_p),
                arg(&acc_p),
                arg(&ml_p),
                arg(&ctx),
                arg(&parts_u),
                arg(&window),
                arg(&part_size_u),
                arg(&signs),
                arg(&norm),
            ];
            // SAFETY: `args` points at values of pk_merge's parameter types, in order, alive for
            // the call; the partial buffers hold num_seqs × num_heads × parts entries; pk_merge
            // reads the partials only after its pdl_wait.
            unsafe { launch_kernel(&dev, &f, cfg, &mut args, dev.tuning().tc.pdl) }
                .map_err(|e| CudaError::driver("cuLaunchKernelEx(pk_merge)", e))?;
        }
        Ok(())
    }
}

impl DecodeAttention {
    /// The stream-K grid (`pk_decode_tc_sk`): as many CTAs as fit on the device at once (the
    /// occupancy of the function at `smem` bytes, or [`TcTuning::stream_k_ctas_per_sm`] if fewer, times the
    /// SMs); the kernel uses at most one per 2 × warps tiles.
    fn forward_stream_k(
        &mut self,
        pages: &DevicePages,
        layer: usize,
        b: &DecodeBatch,
        group: usize,
        smem: usize,
        out: &mut CudaSlice<f32>,
    ) -> Result<(), CudaError> {
        use kvcache::PageStore;
        let g = pages.geometry().clone();
        let d = g.head_dim;
        let module = self.device.module(&ModuleSpec::Kv { format: g.format, head_dim: d, group })?;
        let f = module.function("pk_decode_tc_sk")?;
        let threads = 32 * tc_shape(self.tc(), g.format, d).0;
        let key = (f.cu_function() as usize, smem);
        let per_sm = match self.sk_occupancy.iter().find(|e| (e.0, e.1) == key) {
            Some(e) => e.2,
            None => {
                self.device.bind()?;
                let n = f
                    .occupancy_max_active_blocks_per_multiprocessor(threads as u32, smem, None)
                    .map_err(|e| CudaError::driver("cuOccupancyMaxActiveBlocksPerMultiprocessor", e))?
                    as usize;
                self.sk_occupancy.push((key.0, key.1, n.max(1)));
                n.max(1)
            }
        };
        let per_sm = match self.tc().stream_k_ctas_per_sm {
            0 => per_sm,
            n => n.min(per_sm),
        };
        let ctas = per_sm * self.device.sm_count().max(1);
        let units = b.num_seqs * g.num_kv_heads;
        let dev = self.device.clone();
        let stream = dev.stream();
        let alloc = |e| CudaError::driver("cuMemAlloc", e);
        let need_acc = (units + ctas) * group * d;
        if self.sk_acc.as_ref().is_none_or(|s| s.len() < need_acc) {
            self.generation += 1;
            self.sk_acc = Some(stream.alloc_zeros::<f32>(need_acc).map_err(alloc)?);
        }
        if self.sk_ml.as_ref().is_none_or(|s| s.len() < (units + ctas) * group * 2) {
            self.generation += 1;
            self.sk_ml = Some(stream.alloc_zeros::<f32>((units + ctas) * group * 2).map_err(alloc)?);
        }
        if self.sk_counters.as_ref().is_none_or(|s| s.len() < units) {
            self.generation += 1;
            self.sk_counters = Some(stream.alloc_zeros::<u32>(units).map_err(alloc)?);
        }
        let p = pages.layer_ptrs(layer)?;
        let out_p = dptr(out, &dev);
        let acc_p = self.sk_acc.as_ref().map_or(0, |s| dptr(s, &dev));
        let ml_p = self.sk_ml.as_ref().map_or(0, |s| dptr(s, &dev));
        let counters_p = self.sk_counters.as_ref().map_or(0, |s| dptr(s, &dev));
        let q_p = dptr(b.queries, &dev);
        let tables = dptr(b.block_tables, &dev);
        let ctx = dptr(b.context_lens, &dev);
        let max_blocks = b.max_blocks_per_seq as u32;
        let num_seqs = b.num_seqs as u32;
        let scale_log2 = b.scale * std::f32::consts::LOG2_E;
        let window = b.sliding_window.unwrap_or(0) as u32;
        let log2_bs = g.block_size.trailing_zeros();
        let num_kv_heads = g.num_kv_heads as u32;
        let cfg = LaunchConfig {
            grid_dim: (ctas as u32, 1, 1),
            block_dim: (threads as u32, 1, 1),
            shared_mem_bytes: smem as u32,
        };
        let mut args = [
            arg(&out_p),
            arg(&acc_p),
            arg(&ml_p),
            arg(&q_p),
            arg(&p.k_codes),
            arg(&p.k_scales),
            arg(&p.v_codes),
            arg(&p.v_scales),
            arg(&tables),
            arg(&max_blocks),
            arg(&ctx),
            arg(&num_seqs),
            arg(&scale_log2),
            arg(&window),
            arg(&log2_bs),
            arg(&num_kv_heads),
            arg(&counters_p),
        ];
        // SAFETY: `args` points at values of pk_decode_tc_sk's parameter types, in order, alive
        // for the call; the partials hold (units + ctas) slots, the counters `units`; buffer
        // sizes were checked by `check`, and the caller guarantees context_lens in
        // 1..=max_context_len and valid block ids for visible positions; a programmatic launch
        // reads only tables and context lengths before its pdl_wait.
        let launched = unsafe { launch_kernel(&dev, &f, cfg, &mut args, self.programmatic) }
            .map_err(|e| CudaError::driver("cuLaunchKernelEx(pk_decode_tc_sk)", e));
        if launched.is_err() {
            self.sk_counters = None; // a failed launch may leave counts behind: start from zeros
        }
        launched
    }
}

/// `pk_decode_tc_base` of `module`, with its dynamic shared memory limit raised like the module
/// loader does for `pk_decode_tc` (the same layout, so the same bytes).
fn base_function(
    t: &TcTuning,
    module: &KernelModule,
    format: kvcache::KvFormat,
    head_dim: usize,
) -> Result<cudarc::driver::CudaFunction, CudaError> {
    // Handles whose limit is set already (one driver call per function, not per launch).
    static DONE: std::sync::Mutex<Vec<usize>> = std::sync::Mutex::new(Vec::new());
    let f = module.function("pk_decode_tc_base")?;
    let key = f.cu_function() as usize;
    let mut done = DONE.lock().unwrap_or_else(|e| e.into_inner());
    if !done.contains(&key) {
        set_max_dynamic_smem(&f, decode_tc_smem_bytes(t, format, head_dim))?;
        done.push(key);
    }
    Ok(f)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn auto_partition_fills_the_machine() {
        // H200: 132 SMs. 1 × 8 kv heads needs ≥ 66 partitions of a 4096 context.
        let ps = auto_partition_size(1, 8, 4096, 132);
        assert_eq!(ps % 32, 0);
        assert!(8 * 4096usize.div_ceil(ps) >= 4 * 132 || ps == 32, "{ps}");
        // Large batches need no split beyond 2.
        assert_eq!(auto_partition_size(64, 8, 16384, 132), 8192);
        assert_eq!(auto_partition_size(1, 8, 1, 132), 32);
    }

    #[test]
    fn tc_partition_size_matches_the_h200_measurements() {
        assert_eq!(tc_partition_size(1, 8, 4096, 132, 0), 256);
        assert_eq!(tc_partition_size(1, 8, 32768, 132, 0), 2048);
        // Never more CTAs than SMs: 4 × 8 units → 4 partitions, not 5.
        assert_eq!(tc_partition_size(4, 8, 8192, 132, 0), 2048);
        // 16 × 8 CTAs nearly fill 132 SMs: one partition.
        assert_eq!(tc_partition_size(16, 8, 4096, 132, 0), 4096);
        assert_eq!(tc_partition_size(64, 8, 16384, 132, 0), 16384);
        assert_eq!(tc_partition_size(1, 1, 5, 132, 0), 64);
        // Contexts of at most `direct_max` tokens are one partition (a step's span is a
        // multiple of 256); longer ones split as before.
        assert_eq!(tc_partition_size(1, 8, 256, 132, 0), 64);
        assert_eq!(tc_partition_size(1, 8, 256, 132, 256), 256);
        assert_eq!(tc_partition_size(1, 8, 100, 132, 256), 128);
        assert_eq!(tc_partition_size(1, 8, 512, 132, 256), 64);
        assert_eq!(tc_partition_size(1, 8, 4096, 132, 256), 256);
    }
}
