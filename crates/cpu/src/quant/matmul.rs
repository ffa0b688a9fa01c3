//! `out[n, m] = x[n, k] · W[m, k]ᵀ` for every [`WeightType`]: quantize the activations once
//! (Q8 or Q8_K, into a [`QuantScratch`]), then split the output rows over the thread pool.
//!
//! Per task (a run of consecutive weight rows), activations are taken in panels of
//! [`ACT_PANEL`] rows; inside a panel every weight row is combined with the activations four
//! rows at a time by one row kernel call, so each weight block is loaded and unpacked once per
//! four activation rows and a weight row stays in L1 across the panel: weights stream from
//! memory once per call (decode is a pure stream over the weight bytes).
//!
//! Row kernels ([`RowFn`]) exist per instruction set ([`Isa`]); the best one is picked at run
//! time with `is_x86_feature_detected!`.

use super::activations::{Q8Kind, SyncPtr};
use super::blocks::BlockQ8K;
use super::{dot_scalar, QuantError, QuantScratch, WeightType, WeightView};
use crate::threadpool::ThreadPool;
use std::sync::OnceLock;

/// Activation rows per panel (see the module docs).
pub const ACT_PANEL: usize = 64;
/// Tasks per thread a matmul is cut into (dynamic balancing between threads).
const TASKS_PER_THREAD: usize = 4;
/// Fewest weight rows per task, so tiny tasks do not drown in scheduling.
const MIN_ROWS_PER_TASK: usize = 8;

/// Activations in the layout the row kernel of a weight type expects; the unused fields are
/// empty. All are row-major with `k` values per row.
#[derive(Debug, Clone, Copy)]
pub struct Acts<'a> {
    /// Values per activation row.
    pub k: usize,
    /// Q8 codes `[n, k]`.
    pub q8_qs: &'a [i8],
    /// Q8 `(d, s)` per block `[n, k / 32]` (`s` as [`Q8Kind`] defines it).
    pub q8_ds: &'a [[f32; 2]],
    /// Q8_K super-blocks `[n, k / 256]`.
    pub q8k: &'a [BlockQ8K],
    /// Raw f32 activations `[n, k]` (float weight types).
    pub x: &'a [f32],
}

/// A row kernel: `out[t] = W_row · x_{j0 + t}` for `t < nj`, `1 <= nj <= 4`.
///
/// # Safety
/// `w` holds one full row of `a.k` values of the kernel's type, the activation field of that
/// type holds at least `j0 + nj` rows, and the CPU supports the kernel's instruction set.
pub type RowFn = unsafe fn(w: &[u8], a: &Acts, j0: usize, nj: usize, out: &mut [f32; 4]);

/// A tile kernel: `out[i][t] = W_{r + i} · x_{j0 + t}` for `i < nr`, `t < nj`, where `w` holds
/// the `nr` consecutive weight rows `r..r + nr`. Callers pass `nr == 1` (any `nj <= 4`) or
/// `nj == 1` (any `nr <= 4`).
///
/// # Safety
/// As [`RowFn`], for each of the `nr` rows.
pub type TileFn = unsafe fn(w: &[u8], nr: usize, a: &Acts, j0: usize, nj: usize, out: &mut [[f32; 4]; 4]);

/// Defines a [`TileFn`] that runs a [`RowFn`] row by row.
macro_rules! tile_from_rows {
    ($name:ident, $row:path) => {
        #[allow(unused_unsafe)]
        pub(super) unsafe fn $name(w: &[u8], nr: usize, a: &Acts, j0: usize, nj: usize, out: &mut [[f32; 4]; 4]) {
            let row_bytes = w.len() / nr;
            for i in 0..nr {
                // SAFETY: forwarded from the TileFn contract, one row at a time.
                unsafe { $row(&w[i * row_bytes..(i + 1) * row_bytes], a, j0, nj, &mut out[i]) };
            }
        }
    };
}

tile_from_rows!(scalar_q4_0, dot_scalar::q4_0);
tile_from_rows!(scalar_q4_1, dot_scalar::q4_1);
tile_from_rows!(scalar_q8_0, dot_scalar::q8_0);
tile_from_rows!(scalar_q4_k, dot_scalar::q4_k);
tile_from_rows!(scalar_q5_k, dot_scalar::q5_k);
tile_from_rows!(scalar_q6_k, dot_scalar::q6_k);
tile_from_rows!(scalar_f32, dot_scalar::f32_row);
tile_from_rows!(scalar_f16, dot_scalar::f16_row);
tile_from_rows!(scalar_bf16, dot_scalar::bf16_row);
#[cfg(target_arch = "x86_64")]
mod avx2_rows {
    use super::super::{dot_avx2_float as f, dot_avx2_k as kq};
    use super::Acts;
    tile_from_rows!(q4_k, kq::q4_k);
    tile_from_rows!(q5_k, kq::q5_k);
    tile_from_rows!(q6_k, kq::q6_k);
    tile_from_rows!(f32_row, f::f32_row);
    tile_from_rows!(f16_row, f::f16_row);
    tile_from_rows!(bf16_row, f::bf16_row);
}

/// Instruction-set families with row kernels.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Isa {
    /// Portable Rust, any CPU.
    Scalar,
    /// x86-64 AVX2 + FMA + F16C.
    Avx2,
}

impl Isa {
    /// Whether this CPU can run the family.
    pub fn is_available(self) -> bool {
        match self {
            Isa::Scalar => true,
            #[cfg(target_arch = "x86_64")]
            Isa::Avx2 => {
                is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma") && is_x86_feature_detected!("f16c")
            }
            #[cfg(not(target_arch = "x86_64"))]
            Isa::Avx2 => false,
        }
    }

    /// The best available family (detected once per process).
    pub fn best() -> Isa {
        static BEST: OnceLock<Isa> = OnceLock::new();
        *BEST.get_or_init(|| if Isa::Avx2.is_available() { Isa::Avx2 } else { Isa::Scalar })
    }

    /// Every family this CPU can run, for tests and benches.
    pub fn available() -> Vec<Isa> {
        [Isa::Scalar, Isa::Avx2].into_iter().filter(|i| i.is_available()).collect()
    }
}

/// The tile kernel for `ty` on `isa` (which must be available).
fn tile_fn(isa: Isa, ty: WeightType) -> TileFn {
    #[cfg(target_arch = "x86_64")]
    if isa == Isa::Avx2 {
        use super::dot_avx2 as v;
        return match ty {
            WeightType::Q4_0 => v::q4_0,
            WeightType::Q4_1 => v::q4_1,
            WeightType::Q8_0 => v::q8_0,
            WeightType::Q4K => avx2_rows::q4_k,
            WeightType::Q5K => avx2_rows::q5_k,
            WeightType::Q6K => avx2_rows::q6_k,
            WeightType::F32 => avx2_rows::f32_row,
            WeightType::F16 => avx2_rows::f16_row,
            WeightType::BF16 => avx2_rows::bf16_row,
        };
    }
    let _ = isa;
    match ty {
        WeightType::Q4_0 => scalar_q4_0,
        WeightType::Q4_1 => scalar_q4_1,
        WeightType::Q8_0 => scalar_q8_0,
        WeightType::Q4K => scalar_q4_k,
        WeightType::Q5K => scalar_q5_k,
        WeightType::Q6K => scalar_q6_k,
        WeightType::F32 => scalar_f32,
        WeightType::F16 => scalar_f16,
        WeightType::BF16 => scalar_bf16,
    }
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
    if !isa.is_available() {
        return Err(QuantError::IsaUnavailable(isa));
    }
    w.check()?;
    let (m, k) = (w.rows, w.cols);
    if x.len() != n * k {
        return Err(QuantError::Length { what: "activations x[n, k]", expected: n * k, actual: x.len() });
    }
    if out.len() != n * m {
        return Err(QuantError::Length { what: "output out[n, m]", expected: n * m, actual: out.len() });
    }
    if n == 0 || m == 0 {
        return Ok(());
    }
    let mut acts = Acts { k, q8_qs: &[], q8_ds: &[], q8k: &[], x: &[] };
    match (Q8Kind::for_weights(w.ty), w.ty) {
        (Some(kind), _) => {
            scratch.quantize_q8_with(isa, kind, x, n, k, pool);
            (acts.q8_qs, acts.q8_ds) = scratch.q8();
        }
        (None, WeightType::Q4K | WeightType::Q5K | WeightType::Q6K) => {
            scratch.quantize_q8k(x, n, k, pool);
            acts.q8k = scratch.q8k();
        }
        (None, _) => acts.x = x,
    }
    let kernel = tile_fn(isa, w.ty);
    let row_bytes = w.row_bytes()?;
    let rows_per_task = m.div_ceil(pool.n_threads() * TASKS_PER_THREAD).max(MIN_ROWS_PER_TASK).next_multiple_of(4);
    let n_tasks = m.div_ceil(rows_per_task);
    let out_ptr = SyncPtr(out.as_mut_ptr());
    let data = w.data;
    pool.run(n_tasks, |task, _| {
        let r0 = task * rows_per_task;
        let r1 = (r0 + rows_per_task).min(m);
        let mut dots = [[0.0f32; 4]; 4];
        // Writes out[j, r..r + nr] for j in j0..j0 + nj from the tile `dots[i][t]`.
        let store = |dots: &[[f32; 4]; 4], r: usize, nr: usize, j0: usize, nj: usize| {
            for (i, row) in dots.iter().enumerate().take(nr) {
                for (t, &d) in row.iter().enumerate().take(nj) {
                    // SAFETY: j0 + t < n and r + i < m, so the index is inside out[n, m];
                    // rows r0..r1 belong to this task alone.
                    unsafe { *out_ptr.get().add((j0 + t) * m + r + i) = d };
                }
            }
        };
        if n == 1 {
            // Decode: 4 weight rows per kernel call, one activation row.
            for r in (r0..r1).step_by(4) {
                let nr = (r1 - r).min(4);
                let rows = &data[r * row_bytes..(r + nr) * row_bytes];
                // SAFETY: `rows` is nr full rows (checked by `w.check()`), `acts` holds n rows
                // of the kernel's layout, and `isa` is available (checked above).
                unsafe { kernel(rows, nr, &acts, 0, 1, &mut dots) };
                store(&dots, r, nr, 0, 1);
            }
            return;
        }
        for p0 in (0..n).step_by(ACT_PANEL) {
            let p1 = (p0 + ACT_PANEL).min(n);
            for r in r0..r1 {
                let row = &data[r * row_bytes..(r + 1) * row_bytes];
                for j0 in (p0..p1).step_by(4) {
                    let nj = (p1 - j0).min(4);
                    // SAFETY: as above, with one row and nj activation rows.
                    unsafe { kernel(row, 1, &acts, j0, nj, &mut dots) };
                    store(&dots, r, 1, j0, nj);
                }
            }
        }
    });
    Ok(())
}
