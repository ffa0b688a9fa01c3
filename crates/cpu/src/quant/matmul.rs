//! `out[n, m] = x[n, k] · W[m, k]ᵀ` for every [`WeightType`]: quantize the activations once
//! (Q8 or Q8_K, into a [`QuantScratch`]), then split the output rows over the thread pool.
//! [`matmul_fused`] does the same for several matrices that multiply the same activations
//! (a layer's Q/K/V, or gate and up): one quantization and one parallel region for all of
//! them, each output exactly what its own [`matmul`] would give.
//!
//! Per task (a run of consecutive weight rows of one matrix), decode (`n == 1`) calls the tile
//! kernel on [`Kernel::decode_rows`] rows at a time. With more activation rows they are taken
//! in panels of [`ACT_PANEL`] rows, and inside a panel the kernel computes register tiles of
//! [`Kernel::tile_rows`] weight rows × [`Kernel::tile_acts`] activation rows, so each weight
//! block is loaded and unpacked once per tile and the tile's weight rows stay in L1 across the
//! panel: weights stream from memory once per call.
//!
//! Tile kernels ([`TileFn`]) exist per instruction set ([`Isa`]); the best one is picked at
//! run time with `is_x86_feature_detected!`. Every kernel computes each output with the same
//! float operations in the same order whatever the tile shape, so results do not depend on
//! the tiling, the thread count or the fusion. They do depend on the row count for the
//! K-quants under [`SumOrder::LlamaCpp`] (llama.cpp's orders, chosen by the call's row count);
//! [`SumOrder::RowInvariant`] ([`matmul_fused_ordered`]) sums every row as a one-row call does.
//!
//! A matrix's [`RowLayout`] picks its kernels too: Q4_K rows interleaved in groups of 16 are
//! read by tiles of 16 rows (and a task's rows are whole groups), with the same results.

use super::activations::QuantScratch;
use super::dot_scalar;
use super::interleave::GROUP;
use super::reference_q4k::gemm_rows;
use super::reference_q6k::tiled_order;
pub use super::types::{Acts, Isa, SumOrder, TileOut, TILE_MAX_ACTS, TILE_MAX_ROWS};
use super::types::{Q8Kind, QuantError, RowLayout, SyncPtr, WeightType, WeightView};
use crate::threadpool::ThreadPool;

/// Activation rows per panel (see the module docs).
pub const ACT_PANEL: usize = 64;
/// Tasks per thread a matmul is cut into (dynamic balancing between threads).
const TASKS_PER_THREAD: usize = 4;
/// Fewest weight rows per task, so tiny tasks do not drown in scheduling.
const MIN_ROWS_PER_TASK: usize = 8;
/// Most matrices in one [`matmul_fused`] call.
pub const MAX_FUSED: usize = 4;

/// A row kernel: `out[t] = W_row · x_{j0 + t}` for `t < nj`, `1 <= nj <= 4`.
///
/// # Safety
/// `w` holds one full row of `a.k` values of the kernel's type, the activation field of that
/// type holds at least `j0 + nj` rows, and the CPU supports the kernel's instruction set.
pub type RowFn = unsafe fn(w: &[u8], a: &Acts, j0: usize, nj: usize, out: &mut [f32; 4]);

/// A tile kernel: `out[i][t] = W_{r + i} · x_{j0 + t}` for `i < nr`, `t < nj`, where `w` holds
/// the `nr` consecutive weight rows `r..r + nr`. Callers stay within the kernel's
/// [`Kernel`] shapes: `nr <= decode_rows` with `nj == 1`, or `nr <= tile_rows`, `nj <= tile_acts`.
///
/// # Safety
/// As [`RowFn`], for each of the `nr` rows.
pub type TileFn = unsafe fn(w: &[u8], nr: usize, a: &Acts, j0: usize, nj: usize, out: &mut TileOut);

/// Defines a [`TileFn`] that runs a [`RowFn`] row by row.
macro_rules! tile_from_rows {
    ($name:ident, $row:path) => {
        #[allow(unused_unsafe)]
        pub(super) unsafe fn $name(w: &[u8], nr: usize, a: &Acts, j0: usize, nj: usize, out: &mut TileOut) {
            let row_bytes = w.len() / nr;
            for i in 0..nr {
                // SAFETY: forwarded from the TileFn contract, one row at a time.
                unsafe {
                    $row(
                        &w[i * row_bytes..(i + 1) * row_bytes],
                        a,
                        j0,
                        nj,
                        out[i].first_chunk_mut::<4>().expect("tile of 4 or more acts"),
                    )
                };
            }
        }
    };
}

/// Defines a [`TileFn`] over one interleaved Q4_K group ([`RowLayout::Q4kX16`]) that copies
/// each row out as plain blocks and runs a [`RowFn`] on it: the layout's kernels where the
/// instruction set has no interleaved one (same sums, so the same bits). A fallback, not a
/// fast path: the loader interleaves only for AVX-512 VNNI, which has its own kernel.
macro_rules! tile_from_group_rows {
    ($name:ident, $row:path) => {
        #[allow(unused_unsafe)]
        pub(super) unsafe fn $name(w: &[u8], nr: usize, a: &Acts, j0: usize, nj: usize, out: &mut TileOut) {
            debug_assert_eq!(nr, $crate::quant::interleave::GROUP);
            let mut row = vec![0u8; w.len() / nr];
            for i in 0..nr {
                $crate::quant::interleave::group_row(w, a.k, i, &mut row);
                // SAFETY: forwarded from the TileFn contract, one (copied) row at a time.
                unsafe { $row(&row, a, j0, nj, out[i].first_chunk_mut::<4>().expect("tile of 4 or more acts")) };
            }
        }
    };
}

tile_from_group_rows!(scalar_q4_k_x16, dot_scalar::q4_k);
tile_from_rows!(scalar_q4_0, dot_scalar::q4_0);
tile_from_rows!(scalar_q4_1, dot_scalar::q4_1);
tile_from_rows!(scalar_q8_0, dot_scalar::q8_0);
tile_from_rows!(scalar_q5_0, dot_scalar::q5_0);
tile_from_rows!(scalar_q5_1, dot_scalar::q5_1);
tile_from_rows!(scalar_iq4_nl, dot_scalar::iq4_nl);
tile_from_rows!(scalar_q2_k, dot_scalar::q2_k);
tile_from_rows!(scalar_q3_k, dot_scalar::q3_k);
tile_from_rows!(scalar_iq4_xs, dot_scalar::iq4_xs);
tile_from_rows!(scalar_q4_k, dot_scalar::q4_k);
tile_from_rows!(scalar_q5_k, dot_scalar::q5_k);
tile_from_rows!(scalar_q6_k, dot_scalar::q6_k);
tile_from_rows!(scalar_f32, dot_scalar::f32_row);
tile_from_rows!(scalar_f16, dot_scalar::f16_row);
tile_from_rows!(scalar_bf16, dot_scalar::bf16_row);
#[cfg(target_arch = "x86_64")]
mod avx512_rows {
    use super::super::dot_avx512_k as kq;
    use super::{Acts, TileOut};
    tile_from_rows!(q5_k, kq::q5_k);
    tile_from_rows!(q2_k, kq::q2_k);
    tile_from_rows!(q3_k, kq::q3_k);
}
#[cfg(target_arch = "x86_64")]
mod avx2_rows {
    use super::super::{dot_avx2_float as f, dot_avx2_k as kq};
    use super::Acts;
    use super::TileOut;
    tile_from_rows!(q4_k, kq::q4_k);
    tile_from_group_rows!(q4_k_x16, kq::q4_k);
    tile_from_rows!(q5_k, kq::q5_k);
    tile_from_rows!(q6_k, kq::q6_k);
    tile_from_rows!(q2_k, kq::q2_k);
    tile_from_rows!(q3_k, kq::q3_k);
    tile_from_rows!(iq4_xs, kq::iq4_xs);
    tile_from_rows!(f32_row, f::f32_row);
    tile_from_rows!(f16_row, f::f16_row);
    tile_from_rows!(bf16_row, f::bf16_row);
}

/// A tile kernel and the tile shapes it takes.
#[derive(Clone, Copy)]
pub struct Kernel {
    pub tile: TileFn,
    /// Weight rows per call when there is one activation row.
    pub decode_rows: usize,
    /// Weight rows × activation rows of a tile when there are more.
    pub tile_rows: usize,
    pub tile_acts: usize,
}

/// The kernel for a matrix of `ty` whose rows lie as `layout` says, on `isa` (which must be
/// available), in a product of `n` activation rows.
fn kernel_for(isa: Isa, ty: WeightType, layout: RowLayout, n: usize) -> Kernel {
    if layout == RowLayout::Q4kX16 {
        debug_assert_eq!(ty, WeightType::Q4K);
        let group = |tile: TileFn| Kernel { tile, decode_rows: GROUP, tile_rows: GROUP, tile_acts: 4 };
        #[cfg(target_arch = "x86_64")]
        if isa == Isa::Avx512Vnni {
            use super::dot_avx512_q4k as q4;
            return Kernel { tile: q4::q4_k_x16, decode_rows: GROUP, tile_rows: GROUP, tile_acts: q4::ACTS };
        }
        #[cfg(target_arch = "x86_64")]
        if isa.has_avx2() {
            return group(avx2_rows::q4_k_x16);
        }
        return group(scalar_q4_k_x16);
    }
    kernel_for_rows(isa, ty, n)
}

/// [`kernel_for`] plain rows.
fn kernel_for_rows(isa: Isa, ty: WeightType, n: usize) -> Kernel {
    let rows = |tile: TileFn| Kernel { tile, decode_rows: 4, tile_rows: 1, tile_acts: 4 };
    #[cfg(target_arch = "x86_64")]
    if isa == Isa::Avx512Vnni {
        use super::dot_avx512 as v;
        let quads = |tile: TileFn| Kernel { tile, decode_rows: 4, tile_rows: 4, tile_acts: 4 };
        match ty {
            WeightType::Q4_0 => return quads(v::q4_0),
            WeightType::Q4_1 => return quads(v::q4_1),
            WeightType::Q5_0 => return quads(v::q5_0),
            WeightType::Q5_1 => return quads(v::q5_1),
            WeightType::Q8_0 => return quads(v::q8_0),
            WeightType::IQ4NL => return quads(v::iq4_nl),
            WeightType::Q4K => {
                use super::dot_avx512_q4k as q4;
                return Kernel { tile: q4::q4_k, decode_rows: 4, tile_rows: q4::ROWS, tile_acts: q4::ACTS };
            }
            WeightType::Q5K => return rows(avx512_rows::q5_k),
            WeightType::Q2K => return rows(avx512_rows::q2_k),
            WeightType::Q3K => return rows(avx512_rows::q3_k),
            WeightType::Q6K => {
                use super::dot_avx512_q6k as q6;
                // Below MIN_TILE_ACTS rows the tile function runs the row kernel: tasks and
                // driver prefetches go row by row (by 16-row tiles, a 4-row product of the
                // 151936-row output matrix ran at 40 % of the bandwidth).
                return if n < q6::MIN_TILE_ACTS {
                    Kernel { tile: q6::q6_k, decode_rows: 4, tile_rows: 1, tile_acts: 4 }
                } else {
                    Kernel { tile: q6::q6_k, decode_rows: 4, tile_rows: q6::ROWS, tile_acts: q6::ACTS }
                };
            }
            _ => {}
        }
    }
    #[cfg(target_arch = "x86_64")]
    if isa.has_avx2() {
        use super::dot_avx2 as v;
        return rows(match ty {
            WeightType::Q4_0 => v::q4_0,
            WeightType::Q4_1 => v::q4_1,
            WeightType::Q8_0 => v::q8_0,
            WeightType::Q4K => avx2_rows::q4_k,
            WeightType::Q5K => avx2_rows::q5_k,
            WeightType::Q6K => avx2_rows::q6_k,
            WeightType::Q5_0 => v::q5_0,
            WeightType::Q5_1 => v::q5_1,
            WeightType::IQ4NL => v::iq4_nl,
            WeightType::Q2K => avx2_rows::q2_k,
            WeightType::Q3K => avx2_rows::q3_k,
            WeightType::IQ4XS => avx2_rows::iq4_xs,
            WeightType::F32 => avx2_rows::f32_row,
            WeightType::F16 => avx2_rows::f16_row,
            WeightType::BF16 => avx2_rows::bf16_row,
        });
    }
    let _ = isa;
    rows(match ty {
        WeightType::Q4_0 => scalar_q4_0,
        WeightType::Q4_1 => scalar_q4_1,
        WeightType::Q8_0 => scalar_q8_0,
        WeightType::Q4K => scalar_q4_k,
        WeightType::Q5K => scalar_q5_k,
        WeightType::Q6K => scalar_q6_k,
        WeightType::Q5_0 => scalar_q5_0,
        WeightType::Q5_1 => scalar_q5_1,
        WeightType::IQ4NL => scalar_iq4_nl,
        WeightType::Q2K => scalar_q2_k,
        WeightType::Q3K => scalar_q3_k,
        WeightType::IQ4XS => scalar_iq4_xs,
        WeightType::F32 => scalar_f32,
        WeightType::F16 => scalar_f16,
        WeightType::BF16 => scalar_bf16,
    })
}

/// The activation layout a weight type's kernels read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ActLayout {
    Q8(Q8Kind),
    Q8K,
    F32,
}

impl ActLayout {
    fn of(ty: WeightType) -> ActLayout {
        match (Q8Kind::for_weights(ty), ty) {
            (Some(kind), _) => ActLayout::Q8(kind),
            (None, ty) if ty.reads_q8k() => ActLayout::Q8K,
            (None, _) => ActLayout::F32,
        }
    }
}

/// Whether matrices of these types can share one [`matmul_fused`] call (they read the same
/// activation layout).
pub fn fusable(types: &[WeightType]) -> bool {
    types.windows(2).all(|w| ActLayout::of(w[0]) == ActLayout::of(w[1])) && types.len() <= MAX_FUSED
}

/// One matrix of a [`matmul_fused`] call and its output `[n, w.rows]`.
#[derive(Debug)]
pub struct MatmulPart<'w, 'o> {
    pub w: WeightView<'w>,
    pub out: &'o mut [f32],
}

/// `out[j, r] = Σ_c x[j, c] · W[r, c]` with the best kernels for this CPU.
///
/// Shapes: `x: [n, k]`, `out: [n, m]` with `m = w.rows`, `k = w.cols`. Quantized weight types
/// quantize `x` to 8 bits first (Q8_0 blocks for Q4_0/Q4_1/Q8_0, Q8_K for the K-quants), into
/// `scratch`; nothing is allocated once `scratch` has grown to the largest `n * k`.
/// The activations are quantized as llama.cpp's ggml-cpu does on x86 (see [`Q8Kind`] and
/// [`quantize`](super::quantize)), so results match llama.cpp's up to f32 summation order.
pub fn matmul(
    w: WeightView,
    x: &[f32],
    n: usize,
    out: &mut [f32],
    scratch: &mut QuantScratch,
    pool: &ThreadPool,
) -> Result<(), QuantError> {
    matmul_with_isa(Isa::best(), w, x, n, out, scratch, pool)
}

/// [`matmul`] with an explicit instruction-set family (tests, benches).
pub fn matmul_with_isa(
    isa: Isa,
    w: WeightView,
    x: &[f32],
    n: usize,
    out: &mut [f32],
    scratch: &mut QuantScratch,
    pool: &ThreadPool,
) -> Result<(), QuantError> {
    matmul_fused_with_isa(isa, &mut [MatmulPart { w, out }], x, n, scratch, pool)
}

/// [`matmul`] of up to [`MAX_FUSED`] matrices with the same `cols` against the same `x`, in one
/// parallel region: `parts[i].out[n, parts[i].w.rows] = x · parts[i].wᵀ`. The weight types
/// must read the same activation layout (all Q4_1; or Q4_0 and Q8_0; or all K-quants; or all
/// float types). Each output is bit-identical to a separate [`matmul`] of its matrix.
pub fn matmul_fused(
    parts: &mut [MatmulPart],
    x: &[f32],
    n: usize,
    scratch: &mut QuantScratch,
    pool: &ThreadPool,
) -> Result<(), QuantError> {
    matmul_fused_with_isa(Isa::best(), parts, x, n, scratch, pool)
}

/// A fused part as the tasks see it.
#[derive(Clone, Copy)]
struct Job<'a> {
    data: &'a [u8],
    row_bytes: usize,
    m: usize,
    out: SyncPtr<f32>,
    kernel: Kernel,
    /// First task index of this part.
    first_task: usize,
}

/// [`matmul_fused`] with an explicit instruction-set family (tests, benches).
pub fn matmul_fused_with_isa(
    isa: Isa,
    parts: &mut [MatmulPart],
    x: &[f32],
    n: usize,
    scratch: &mut QuantScratch,
    pool: &ThreadPool,
) -> Result<(), QuantError> {
    matmul_fused_ordered(isa, SumOrder::LlamaCpp, parts, x, n, scratch, pool)
}

/// [`matmul_fused`] with an explicit instruction-set family and K-quant summation order
/// ([`SumOrder::RowInvariant`]: each output as a one-row call computes it).
pub fn matmul_fused_ordered(
    isa: Isa,
    order: SumOrder,
    parts: &mut [MatmulPart],
    x: &[f32],
    n: usize,
    scratch: &mut QuantScratch,
    pool: &ThreadPool,
) -> Result<(), QuantError> {
    if !isa.is_available() {
        return Err(QuantError::IsaUnavailable(isa));
    }
    let Some(first) = parts.first() else {
        return Ok(());
    };
    if parts.len() > MAX_FUSED {
        return Err(QuantError::Fusion("more than MAX_FUSED matrices"));
    }
    let (k, layout) = (first.w.cols, ActLayout::of(first.w.ty));
    for p in parts.iter() {
        p.w.check()?;
        if p.w.cols != k {
            return Err(QuantError::Fusion("fused matrices differ in columns"));
        }
        if ActLayout::of(p.w.ty) != layout {
            return Err(QuantError::Fusion("fused weight types read different activations"));
        }
        if p.out.len() != n * p.w.rows {
            return Err(QuantError::Length { what: "output out[n, m]", expected: n * p.w.rows, actual: p.out.len() });
        }
    }
    if x.len() != n * k {
        return Err(QuantError::Length { what: "activations x[n, k]", expected: n * k, actual: x.len() });
    }
    let total_rows: usize = parts.iter().map(|p| p.w.rows).sum();
    if n == 0 || total_rows == 0 {
        return Ok(());
    }
    let mut acts = Acts {
        k,
        q8_qs: &[],
        q8_ds: &[],
        q8_neg_sums: &[],
        q8k: &[],
        x: &[],
        gemm_acts: if order == SumOrder::RowInvariant { 0 } else { gemm_rows(n) },
        tiled: order == SumOrder::LlamaCpp && tiled_order(n),
    };
    match layout {
        ActLayout::Q8(kind) => {
            scratch.quantize_q8_with(isa, kind, x, n, k, pool);
            (acts.q8_qs, acts.q8_ds) = scratch.q8();
            acts.q8_neg_sums = scratch.q8_neg_sums();
        }
        ActLayout::Q8K => {
            scratch.quantize_q8k_with(isa, x, n, k, pool);
            acts.q8k = scratch.q8k();
        }
        ActLayout::F32 => acts.x = x,
    }
    // One task size for every part (so tasks are of similar cost), a multiple of every
    // kernel's row step; a task never spans two parts.
    let step = parts
        .iter()
        .map(|p| {
            let kn = kernel_for(isa, p.w.ty, p.w.layout, n);
            if n == 1 {
                kn.decode_rows
            } else {
                kn.tile_rows
            }
        })
        .fold(1, lcm);
    let rows_per_task =
        total_rows.div_ceil(pool.n_threads() * TASKS_PER_THREAD).max(MIN_ROWS_PER_TASK).next_multiple_of(step);
    let mut jobs = [None; MAX_FUSED];
    let mut n_tasks = 0;
    for (slot, p) in jobs.iter_mut().zip(parts.iter_mut()) {
        *slot = Some(Job {
            data: p.w.data,
            row_bytes: p.w.row_bytes()?,
            m: p.w.rows,
            out: SyncPtr(p.out.as_mut_ptr()),
            kernel: kernel_for(isa, p.w.ty, p.w.layout, n),
            first_task: n_tasks,
        });
        n_tasks += p.w.rows.div_ceil(rows_per_task);
    }
    let jobs = &jobs[..parts.len()];
    pool.run(n_tasks, |task, _| {
        let job = jobs.iter().rev().flatten().find(|j| j.first_task <= task).expect("task of some part");
        let r0 = (task - job.first_task) * rows_per_task;
        let r1 = (r0 + rows_per_task).min(job.m);
        // SAFETY: rows r0..r1 of this part belong to this task alone, `job.out` points to the
        // part's [n, m] output, `acts` holds n rows of the kernel's layout, the weight bytes
        // were checked to hold m full rows, and `isa` is available (checked above).
        unsafe { run_rows(job, &acts, n, r0, r1) };
    });
    Ok(())
}

fn lcm(a: usize, b: usize) -> usize {
    let gcd = |mut a: usize, mut b: usize| {
        while b != 0 {
            (a, b) = (b, a % b);
        }
        a
    };
    a / gcd(a, b) * b
}

/// With more than [`DRIVER_PREFETCH_MIN_ACTS`] activation rows, how many row tiles ahead the
/// driver prefetches the weights (they come from memory once, on the first panel). Decode leaves
/// it to the kernels: the quantized ones prefetch per block step, and for the float ones (long
/// contiguous rows the hardware prefetcher follows) a driver burst was slower (F16: 87 -> 62).
const DRIVER_PREFETCH_TILES: usize = 2;

/// Up to this many activation rows (a draft's verification step) the driver does not prefetch: a
/// tile's work is then short, and its burst of a whole tile's lines stalls the core on full fill
/// buffers instead of overlapping the arithmetic; the kernels' own spread prefetches and the
/// hardware's serve those steps. `pagekv bench speculative -m qwen2.5-coder-1.5b --step-tokens
/// 1,2,3,5,9` (2 threads, alternated builds): a 2-token step 70 -> 50 ms, 3 tokens 85 -> 59,
/// 5 tokens 126 -> 103, 9 tokens 162 -> 156-169 (a one-token step 41). (An earlier host's
/// one-thread `decode_matvec` bench had favoured the bursts at 4 and 8 rows: 57 -> 65 and
/// 35 -> 38 steps/s; in the whole model on two threads they cost.)
const DRIVER_PREFETCH_MIN_ACTS: usize = 32;

/// Asks for rows `r..r + count` of `job`'s weights (those that exist) to be brought into cache.
fn prefetch_rows(job: &Job, r: usize, count: usize) {
    let (start, end) = ((r * job.row_bytes).min(job.data.len()), ((r + count) * job.row_bytes).min(job.data.len()));
    #[cfg(target_arch = "x86_64")]
    for line in (start..end).step_by(64) {
        // SAFETY: SSE is part of x86-64; the address lies inside `job.data`.
        unsafe {
            use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
            _mm_prefetch(job.data.as_ptr().add(line) as *const i8, _MM_HINT_T0)
        };
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = (start, end);
}

/// Computes `out[j, r]` for weight rows `r0..r1` of `job` and every activation row `j < n`.
///
/// # Safety
/// See the call in [`matmul_fused_with_isa`]: the rows are this caller's alone and every
/// buffer has the shape the job states.
unsafe fn run_rows(job: &Job, acts: &Acts, n: usize, r0: usize, r1: usize) {
    let (m, rb, kn) = (job.m, job.row_bytes, job.kernel);
    let mut dots: TileOut = [[0.0; TILE_MAX_ACTS]; TILE_MAX_ROWS];
    // Writes out[j, r..r + nr] for j in j0..j0 + nj from the tile `dots[i][t]`, one
    // activation row at a time: each writes nr consecutive floats of `out` (one or two cache
    // lines) instead of one float in each of nj rows per weight row.
    let store = |dots: &TileOut, r: usize, nr: usize, j0: usize, nj: usize| {
        for t in 0..nj {
            // SAFETY: j0 + t < n and r + nr <= m, so the run is inside out[n, m], and rows
            // r0..r1 belong to this task alone.
            let dst = unsafe { job.out.get().add((j0 + t) * m + r) };
            for (i, row) in dots.iter().enumerate().take(nr) {
                // SAFETY: i < nr (see above).
                unsafe { *dst.add(i) = row[t] };
            }
        }
    };
    if n == 1 {
        for r in (r0..r1).step_by(kn.decode_rows) {
            let nr = (r1 - r).min(kn.decode_rows);
            // SAFETY: nr full rows; the kernel takes nr <= decode_rows with one activation row.
            unsafe { (kn.tile)(&job.data[r * rb..(r + nr) * rb], nr, acts, 0, 1, &mut dots) };
            store(&dots, r, nr, 0, 1);
        }
        return;
    }
    for p0 in (0..n).step_by(ACT_PANEL) {
        let p1 = (p0 + ACT_PANEL).min(n);
        for r in (r0..r1).step_by(kn.tile_rows) {
            let nr = (r1 - r).min(kn.tile_rows);
            if p0 == 0 && n > DRIVER_PREFETCH_MIN_ACTS {
                prefetch_rows(job, r + DRIVER_PREFETCH_TILES * kn.tile_rows, kn.tile_rows);
            }
            let rows = &job.data[r * rb..(r + nr) * rb];
            for j0 in (p0..p1).step_by(kn.tile_acts) {
                let nj = (p1 - j0).min(kn.tile_acts);
                // SAFETY: as above, a tile within the kernel's shapes.
                unsafe { (kn.tile)(rows, nr, acts, j0, nj, &mut dots) };
                store(&dots, r, nr, j0, nj);
            }
        }
    }
}
