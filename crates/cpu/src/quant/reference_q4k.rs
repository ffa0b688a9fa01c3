//! The float order of llama.cpp's Q4_K × Q8_K products on x86, stated as a scalar reference
//! over plain (not repacked) Q4_K rows. Every Q4_K kernel here reproduces it bit for bit.
//!
//! On x86 with AVX2 (and so with AVX-512), ggml-cpu repacks a Q4_K matrix whose row count is a
//! multiple of 8 into 8-row interleaved blocks (`block_q4_Kx8`) and multiplies it with
//! `ggml_gemm_q4_K_8x8_q8_K` (groups of 4 activation rows, quantized by
//! `ggml_quantize_mat_q8_K_4x8`) and `ggml_gemv_q4_K_8x8_q8_K` (single rows). A matmul of `n`
//! activation rows sends rows `0 .. n - n % 4` through the gemm and the last `n % 4` through the
//! gemv (so with `n <= 3` every row takes the gemv). Both kernels keep one f32 lane per output
//! and do all code × activation arithmetic in exact integers (i16 pair sums that cannot
//! overflow, widened to i32); they differ only in how often they convert and multiply-add:
//!
//! Per super-block `b`, with `I_j = sc_j Σ_{i in sub-block j} q_i y_i` and
//! `M_j = mn_j (bsums_2j + bsums_2j+1)` (exact i32), `dd = d · d_y` and `dm = dmin · d_y`
//! (each one rounded f32 product):
//! - gemm ([`Q4KOrder::Gemm`]): for each pair of sub-blocks `p = 0..4`,
//!   `acc = fma(f32(I_2p + I_2p+1), dd, acc)` then `accm = fma(f32(M_2p + M_2p+1), dm, accm)`;
//! - gemv ([`Q4KOrder::Gemv`]): `acc = fma(f32(Σ_j I_j), dd, acc)`,
//!   `accm = fma(f32(Σ_j M_j), dm, accm)` once per super-block;
//!
//! and the output is `acc - accm`. The AVX2 and AVX-512 paths of both kernels share this order
//! (the AVX-512 gemm only widens the lanes). `ggml_quantize_mat_q8_K_4x8` gives the same codes
//! and scales as `quantize_row_q8_K` up to a simultaneous sign flip of `d` and every code when a
//! block holds both `+amax` and `-amax`, which leaves every product above unchanged.

use super::blocks::{scale_min_k4, BlockQ4K, BlockQ8K};
use bytemuck::pod_read_unaligned;

/// Which of llama.cpp's two repacked Q4_K kernels an output row follows (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Q4KOrder {
    /// `ggml_gemv_q4_K_8x8_q8_K`: one multiply-add per super-block.
    Gemv,
    /// `ggml_gemm_q4_K_8x8_q8_K`: one multiply-add per pair of sub-blocks.
    Gemm,
}

impl Q4KOrder {
    /// The order of activation row `j` of a matmul over `n` rows.
    pub fn of_row(j: usize, n: usize) -> Q4KOrder {
        if j < gemm_rows(n) {
            Q4KOrder::Gemm
        } else {
            Q4KOrder::Gemv
        }
    }
}

/// How many leading activation rows of an `n`-row matmul take the gemm order.
pub fn gemm_rows(n: usize) -> usize {
    n - n % 4
}

/// The exact integer sums of pair `p` (sub-blocks `2p`, `2p + 1`) of a Q4_K super-block
/// against a Q8_K block: `(I_2p + I_2p+1, M_2p + M_2p+1)`.
pub fn q4_k_pair_sums(blk: &BlockQ4K, y: &BlockQ8K, p: usize) -> (i32, i32) {
    let (mut isum, mut msum) = (0i32, 0i32);
    for h in 0..2 {
        let j = 2 * p + h;
        let (sc, mn) = scale_min_k4(j, &blk.scales);
        let dot: i32 = (0..32)
            .map(|l| {
                let byte = blk.qs[32 * p + l];
                let q = if h == 0 { byte & 0xF } else { byte >> 4 };
                q as i32 * y.qs[32 * j + l] as i32
            })
            .sum();
        isum += sc as i32 * dot;
        msum += mn as i32 * (y.bsums[2 * j] as i32 + y.bsums[2 * j + 1] as i32);
    }
    (isum, msum)
}

/// One output, `row · y`, in llama.cpp's `order`: `row` holds `y.len()` Q4_K blocks (any
/// alignment), `y` the activation row's Q8_K blocks.
pub fn q4_k_dot(row: &[u8], y: &[BlockQ8K], order: Q4KOrder) -> f32 {
    assert_eq!(row.len(), y.len() * 144, "one Q4_K block per Q8_K block");
    let (mut acc, mut accm) = (0.0f32, 0.0f32);
    for (bytes, y) in row.chunks_exact(144).zip(y) {
        let blk: BlockQ4K = pod_read_unaligned(bytes);
        let dd = blk.d.to_f32() * y.d;
        let dm = blk.dmin.to_f32() * y.d;
        let (mut isum, mut msum) = (0i32, 0i32);
        for p in 0..4 {
            let (i, m) = q4_k_pair_sums(&blk, y, p);
            match order {
                Q4KOrder::Gemm => {
                    acc = (i as f32).mul_add(dd, acc);
                    accm = (m as f32).mul_add(dm, accm);
                }
                Q4KOrder::Gemv => {
                    isum += i;
                    msum += m;
                }
            }
        }
        if order == Q4KOrder::Gemv {
            acc = (isum as f32).mul_add(dd, acc);
            accm = (msum as f32).mul_add(dm, accm);
        }
    }
    acc - accm
}
