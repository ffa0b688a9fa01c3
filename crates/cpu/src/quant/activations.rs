//! Quantized activations and the reusable scratch that holds them ([`QuantScratch`]).
//!
//! Two layouts, chosen by the weight type of the matmul:
//! - Q8 (for Q4_0, Q4_1, Q8_0 weights): ggml Q8_0/Q8_1 blocks stored as structure-of-arrays,
//!   codes `qs: [n, k]` and per block `ds: [n, k/32]` of `(d, s)`; `d` is the f16-rounded
//!   scale (exactly what a ggml block holds) widened to f32, and `s` the offset sum that
//!   [`Q8Kind`] defines (the activation block ggml pairs with the weight type; 0 for Q8_0,
//!   whose kernels never read it).
//! - Q8_K (for K-quant weights): ggml `block_q8_K` super-blocks `[n, k/256]`.
//!
//! F32/F16/BF16 weights use the f32 activations directly.

use super::blocks::{BlockQ8K, QK, QK_K};
use super::quantize::{quantize_q8_0_act, quantize_q8_1_act, quantize_q8_k};
pub use super::types::Q8Kind;
use super::types::{Isa, SyncPtr};
use crate::threadpool::ThreadPool;

/// One block in the Q8 layout: codes and `(d, s)`. The reference for every ISA's quantizer.
pub fn quantize_q8_block(kind: Q8Kind, x: &[f32; QK]) -> ([i8; QK], [f32; 2]) {
    match kind {
        // No kernel reads a Q8_0 block's offset sum: it stays 0 (not computed).
        Q8Kind::Q8_0 => {
            let b = quantize_q8_0_act(x);
            (b.qs, [b.d.to_f32(), 0.0])
        }
        Q8Kind::Q8_1 => {
            let b = quantize_q8_1_act(x);
            (b.qs, [b.d.to_f32(), b.s.to_f32()])
        }
    }
}

/// Reusable buffers for quantized activations. Grows to the largest `n * k` seen and is then
/// reused, so a decode step allocates nothing. One per concurrent matmul caller.
#[derive(Debug, Default)]
pub struct QuantScratch {
    /// Q8 codes, `[n, k]`.
    q8_qs: Vec<i8>,
    /// Q8 per-block `(d, s)`, `[n, k / 32]`.
    q8_ds: Vec<[f32; 2]>,
    /// Q8_0 per-block negated sums of four codes (see [`Acts::q8_neg_sums`]), `[n, k / 32]`.
    q8_neg_sums: Vec<[i32; 8]>,
    /// Whether the last Q8 quantization filled `q8_neg_sums` (Q8_0 activations).
    has_neg_sums: bool,
    /// Q8_K super-blocks, `[n, k / 256]`.
    q8k: Vec<BlockQ8K>,
    /// Shape of the last quantization, `(n, k)`.
    shape: (usize, usize),
}

/// Rows quantized per pool task.
const ROWS_PER_TASK: usize = 4;

impl QuantScratch {
    /// An empty scratch; buffers grow on first use.
    pub fn new() -> QuantScratch {
        QuantScratch::default()
    }

    /// A scratch already sized for `n` rows of `k` activations in either layout.
    pub fn with_capacity(n: usize, k: usize) -> QuantScratch {
        QuantScratch {
            q8_qs: vec![0; n * k],
            q8_ds: vec![[0.0; 2]; n * k / QK],
            q8_neg_sums: vec![[0; 8]; n * k / QK],
            has_neg_sums: false,
            q8k: vec![bytemuck::Zeroable::zeroed(); n * k / QK_K],
            shape: (0, 0),
        }
    }

    /// The Q8 layout of the last [`QuantScratch::quantize_q8`]: codes `[n, k]` and
    /// `(d, s)` per block `[n, k / 32]`.
    pub fn q8(&self) -> (&[i8], &[[f32; 2]]) {
        let (n, k) = self.shape;
        (&self.q8_qs[..n * k], &self.q8_ds[..n * k / QK])
    }

    /// The per-block negated sums of four codes of the last [`QuantScratch::quantize_q8`]
    /// (`[n, k / 32]`), empty unless it quantized to [`Q8Kind::Q8_0`].
    pub fn q8_neg_sums(&self) -> &[[i32; 8]] {
        let (n, k) = self.shape;
        if self.has_neg_sums {
            &self.q8_neg_sums[..n * k / QK]
        } else {
            &[]
        }
    }

    /// The Q8_K blocks of the last [`QuantScratch::quantize_q8k`], `[n, k / 256]`.
    pub fn q8k(&self) -> &[BlockQ8K] {
        let (n, k) = self.shape;
        &self.q8k[..n * k / QK_K]
    }

    /// Quantizes `x: [n, k]` (k a multiple of 32) to the Q8 layout of `kind`, with the fastest
    /// quantizer of this CPU (all are bit-exact with [`quantize_q8_block`]).
    pub fn quantize_q8(&mut self, kind: Q8Kind, x: &[f32], n: usize, k: usize, pool: &ThreadPool) {
        self.quantize_q8_with(Isa::best(), kind, x, n, k, pool)
    }

    /// [`QuantScratch::quantize_q8`] with the quantizer of `isa` (which must be available).
    pub(crate) fn quantize_q8_with(
        &mut self,
        isa: Isa,
        kind: Q8Kind,
        x: &[f32],
        n: usize,
        k: usize,
        pool: &ThreadPool,
    ) {
        debug_assert!(k.is_multiple_of(QK) && x.len() == n * k);
        let nb = k / QK;
        if self.q8_qs.len() < n * k {
            self.q8_qs.resize(n * k, 0);
        }
        if self.q8_ds.len() < n * nb {
            self.q8_ds.resize(n * nb, [0.0; 2]);
        }
        let with_sums = kind == Q8Kind::Q8_0;
        if with_sums && self.q8_neg_sums.len() < n * nb {
            self.q8_neg_sums.resize(n * nb, [0; 8]);
        }
        self.shape = (n, k);
        self.has_neg_sums = with_sums;
        let (qs, ds) = (SyncPtr(self.q8_qs.as_mut_ptr()), SyncPtr(self.q8_ds.as_mut_ptr()));
        let sums = SyncPtr(self.q8_neg_sums.as_mut_ptr());
        // Rows r0..r1's negated sums of four codes, from their codes (written just before).
        let neg_sums = |r0: usize, r1: usize| {
            if !with_sums {
                return;
            }
            // SAFETY: rows r0..r1 belong to this task alone; the buffers hold n*k codes and
            // n*nb sum blocks, and the codes of these rows were written by this task.
            let (codes, out) = unsafe {
                (
                    std::slice::from_raw_parts(qs.get().add(r0 * k) as *const i8, (r1 - r0) * k),
                    std::slice::from_raw_parts_mut(sums.get().add(r0 * nb), (r1 - r0) * nb),
                )
            };
            for (block, o) in codes.chunks_exact(QK).zip(out) {
                for (l, v) in o.iter_mut().enumerate() {
                    *v = -block[4 * l..4 * l + 4].iter().map(|&c| c as i32).sum::<i32>();
                }
            }
        };
        let quantize_rows = |r0: usize, r1: usize| {
            #[cfg(target_arch = "x86_64")]
            if isa.has_avx2() {
                // SAFETY: rows r0..r1 belong to this task alone, the buffers hold n*k codes and
                // n*nb scale pairs, and AVX2 is available (the caller's contract).
                unsafe {
                    let codes = std::slice::from_raw_parts_mut(qs.get().add(r0 * k), (r1 - r0) * k);
                    let scales = std::slice::from_raw_parts_mut(ds.get().add(r0 * nb), (r1 - r0) * nb);
                    super::activations_avx2::quantize_q8_row(kind, &x[r0 * k..r1 * k], codes, scales);
                }
                return;
            }
            let _ = isa;
            for b in r0 * nb..r1 * nb {
                let (codes, scales) = quantize_q8_block(kind, x[b * QK..(b + 1) * QK].try_into().expect("block of QK"));
                // SAFETY: block b lies in rows r0..r1, which only this task writes; the buffers
                // hold n*k codes and n*nb scale pairs.
                unsafe {
                    std::ptr::copy_nonoverlapping(codes.as_ptr(), qs.get().add(b * QK), QK);
                    *ds.get().add(b) = scales;
                }
            }
        };
        let rows = |r0: usize, r1: usize| {
            quantize_rows(r0, r1);
            neg_sums(r0, r1);
        };
        for_rows(n, pool, &rows);
    }

    /// Quantizes `x: [n, k]` (k a multiple of 256) to Q8_K blocks, with the fastest quantizer
    /// of this CPU (all are bit-exact with [`quantize_q8_k`]).
    pub fn quantize_q8k(&mut self, x: &[f32], n: usize, k: usize, pool: &ThreadPool) {
        self.quantize_q8k_with(Isa::best(), x, n, k, pool)
    }

    /// [`QuantScratch::quantize_q8k`] with the quantizer of `isa` (which must be available).
    pub(crate) fn quantize_q8k_with(&mut self, isa: Isa, x: &[f32], n: usize, k: usize, pool: &ThreadPool) {
        debug_assert!(k.is_multiple_of(QK_K) && x.len() == n * k);
        let nb = k / QK_K;
        if self.q8k.len() < n * nb {
            self.q8k.resize(n * nb, bytemuck::Zeroable::zeroed());
        }
        self.shape = (n, k);
        let out = SyncPtr(self.q8k.as_mut_ptr());
        let rows = |r0: usize, r1: usize| {
            for b in r0 * nb..r1 * nb {
                let xb: &[f32; QK_K] = x[b * QK_K..(b + 1) * QK_K].try_into().expect("block of QK_K");
                #[cfg(target_arch = "x86_64")]
                // SAFETY: `isa` is available (the caller's contract) and has AVX2.
                let block = if isa.has_avx2() {
                    unsafe { super::activations_avx2::quantize_q8_k_block(xb) }
                } else {
                    quantize_q8_k(xb)
                };
                #[cfg(not(target_arch = "x86_64"))]
                let block = quantize_q8_k(xb);
                // SAFETY: as in `quantize_q8`: rows r0..r1 belong to this task alone.
                unsafe { *out.get().add(b) = block };
            }
        };
        for_rows(n, pool, &rows);
    }
}

/// Runs `f(r0, r1)` over row ranges, in parallel when there are enough rows.
fn for_rows(n: usize, pool: &ThreadPool, f: &(dyn Fn(usize, usize) + Sync)) {
    if n <= ROWS_PER_TASK {
        f(0, n);
        return;
    }
    pool.run(n.div_ceil(ROWS_PER_TASK), |t, _| f(t * ROWS_PER_TASK, ((t + 1) * ROWS_PER_TASK).min(n)));
}
