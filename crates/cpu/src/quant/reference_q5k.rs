//! The float orders of llama.cpp's Q5_K × Q8_K products on x86, stated as scalar references.
//! The Q5_K kernels here reproduce them bit for bit. As for Q6_K
//! ([`reference_q6k`](super::reference_q6k)), a matmul of fewer than
//! [`TILED_MIN_ROWS`](super::reference_q6k::TILED_MIN_ROWS) activation rows takes the dot
//! product (`ggml_vec_dot_q5_K_q8_K`, AVX2 path: [`q5_k_dot`]), one of more rows the tiled K-quant
//! matmul ([`q5_k_dot_tiled`]).
//!
//! Per super-block, with codes `q` (0..31), sub-block scales `sc_s` and mins `mn_s`:
//! - `I_l = Σ_s sc_s Σ_{i = 4l..4l+4} q_{32s+i} y_{32s+i}` (eight exact i32 lanes) and
//!   `M = Σ_s mn_s (bsums_2s + bsums_2s+1)` (exact);
//! - dot product: `acc_l = fma(d · d_y, f32(I_l), acc_l)` per lane and `m = fma(dmin · d_y,
//!   f32(M), m)` (the C source's `summs += dmin * sum`, contracted by the compiler), the output
//!   `((a0 + a4) + (a2 + a6)) + ((a1 + a5) + (a3 + a7)) - m`;
//! - tiled matmul: `r = f32(Σ_l I_l) · d`, `res = fma(-dmin, f32(M), r)`, `out = fma(res, d_y,
//!   out)`, blocks in order from `out = 0`.

use super::blocks::{scale_min_k4, BlockQ5K, BlockQ8K, QK_K};
use bytemuck::pod_read_unaligned;

const BLOCK: usize = 176;

/// The unsigned codes (0..31) of a Q5_K block in value order.
fn codes(b: &BlockQ5K) -> [u8; QK_K] {
    let mut q = [0u8; QK_K];
    for c in 0..4 {
        for l in 0..32 {
            q[64 * c + l] = (b.qs[32 * c + l] & 0xF) | (((b.qh[l] >> (2 * c)) & 1) << 4);
            q[64 * c + 32 + l] = (b.qs[32 * c + l] >> 4) | (((b.qh[l] >> (2 * c + 1)) & 1) << 4);
        }
    }
    q
}

/// `([I_l; 8], M)` of one super-block (see the module docs).
fn block_sums(blk: &BlockQ5K, y: &BlockQ8K) -> ([i32; 8], i32) {
    let q = codes(blk);
    let mut lanes = [0i32; 8];
    let mut m = 0i32;
    for s in 0..8 {
        let (sc, mn) = scale_min_k4(s, &blk.scales);
        for (l, lane) in lanes.iter_mut().enumerate() {
            let at = 32 * s + 4 * l;
            let dot: i32 = (at..at + 4).map(|i| q[i] as i32 * y.qs[i] as i32).sum();
            *lane += sc as i32 * dot;
        }
        m += mn as i32 * (y.bsums[2 * s] as i32 + y.bsums[2 * s + 1] as i32);
    }
    (lanes, m)
}

/// One output, `row · y`, in the dot product's order: `row` holds `y.len()` Q5_K blocks (any
/// alignment), `y` the activation row's Q8_K blocks.
pub fn q5_k_dot(row: &[u8], y: &[BlockQ8K]) -> f32 {
    assert_eq!(row.len(), y.len() * BLOCK, "one Q5_K block per Q8_K block");
    let (mut acc, mut m) = ([0.0f32; 8], 0.0f32);
    for (bytes, y) in row.chunks_exact(BLOCK).zip(y) {
        let blk: BlockQ5K = pod_read_unaligned(bytes);
        let (lanes, mins) = block_sums(&blk, y);
        let (d, dmin) = (blk.d.to_f32() * y.d, blk.dmin.to_f32() * y.d);
        for (a, &lane) in acc.iter_mut().zip(&lanes) {
            *a = d.mul_add(lane as f32, *a);
        }
        m = dmin.mul_add(mins as f32, m);
    }
    (((acc[0] + acc[4]) + (acc[2] + acc[6])) + ((acc[1] + acc[5]) + (acc[3] + acc[7]))) - m
}

/// One output, `row · y`, in the tiled matmul's order.
pub fn q5_k_dot_tiled(row: &[u8], y: &[BlockQ8K]) -> f32 {
    assert_eq!(row.len(), y.len() * BLOCK, "one Q5_K block per Q8_K block");
    let mut out = 0.0f32;
    for (bytes, y) in row.chunks_exact(BLOCK).zip(y) {
        let blk: BlockQ5K = pod_read_unaligned(bytes);
        let (lanes, mins) = block_sums(&blk, y);
        let total: i32 = lanes.iter().sum();
        out = tiled_step(total, mins, blk.d.to_f32(), blk.dmin.to_f32(), y.d, out);
    }
    out
}

/// One super-block of the tiled order with a min: `fma(fma(-dmin, f32(M), f32(I) · d), d_y, out)`.
#[inline]
pub(super) fn tiled_step(total: i32, mins: i32, d: f32, dmin: f32, dy: f32, out: f32) -> f32 {
    let res = (-dmin).mul_add(mins as f32, total as f32 * d);
    res.mul_add(dy, out)
}
