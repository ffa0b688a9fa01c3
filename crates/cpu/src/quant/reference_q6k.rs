//! The float orders of llama.cpp's Q6_K × Q8_K products on x86, stated as scalar references.
//! The Q6_K kernels here reproduce them bit for bit. ggml-cpu does not repack Q6_K on x86; a
//! matmul of fewer than [`TILED_MIN_ROWS`] activation rows takes the dot product
//! (`ggml_vec_dot_q6_K_q8_K`, AVX2 path: [`q6_k_dot`]), one of more rows ggml-cpu's tiled K-quant
//! matmul (`ggml-cpu/tiled`: [`q6_k_dot_tiled`]).
//!
//! Dot product. Per super-block, eight exact i32 lanes: lane `l` sums, over the eight 32-value vectors `v`,
//! `sc_g Σ q y` for the four values `32v + 4l .. 32v + 4l + 4` (codes `q` unsigned, 0..63; `g`
//! their 16-value group), minus `32 (sc_2l bsums_2l + sc_2l+1 bsums_2l+1)` (the codes' -32
//! offset). Each lane is converted and multiply-added into its own f32 accumulator with
//! `d · d_y`; at the end the lanes are summed as `((a0 + a4) + (a2 + a6)) + ((a1 + a5) + (a3 + a7))`.
//!
//! Tiled matmul. Per super-block one exact i32, `Σ_g sc_g Σ_{i in g} (q_i - 32) y_i`, converted
//! and multiplied by the block's `d` (one rounded f32 product), then multiply-added with the
//! activation's `d_y` into the output: `out = fma(f32(total) · d, d_y, out)`, blocks in order from
//! `out = 0` (the AVX2 and AVX-512 VNNI microkernels share this order).

use super::blocks::{BlockQ6K, BlockQ8K, QK_K};
use bytemuck::pod_read_unaligned;

/// The unsigned codes (0..63) of a Q6_K block in value order.
fn codes(b: &BlockQ6K) -> [u8; QK_K] {
    let mut q = [0u8; QK_K];
    for h in 0..2 {
        let (ql, qh) = (&b.ql[64 * h..], &b.qh[32 * h..]);
        for l in 0..32 {
            q[128 * h + l] = (ql[l] & 0xF) | ((qh[l] & 3) << 4);
            q[128 * h + l + 32] = (ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4);
            q[128 * h + l + 64] = (ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4);
            q[128 * h + l + 96] = (ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4);
        }
    }
    q
}

/// Fewest activation rows of a matmul that ggml-cpu sends through its tiled K-quant kernel.
pub const TILED_MIN_ROWS: usize = 8;

/// Whether an `n`-row matmul sums its Q5_K and Q6_K products in the tiled order (see the module
/// docs; Q4_K keeps its repacked orders, [`reference_q4k`](super::reference_q4k)).
pub fn tiled_order(n: usize) -> bool {
    n >= TILED_MIN_ROWS
}

/// One output, `row · y`, in the tiled matmul's order (see the module docs).
pub fn q6_k_dot_tiled(row: &[u8], y: &[BlockQ8K]) -> f32 {
    assert_eq!(row.len(), y.len() * 210, "one Q6_K block per Q8_K block");
    let mut out = 0.0f32;
    for (bytes, y) in row.chunks_exact(210).zip(y) {
        let blk: BlockQ6K = pod_read_unaligned(bytes);
        let q = codes(&blk);
        let total: i32 = (0..16)
            .map(|g| {
                let dot: i32 = (16 * g..16 * g + 16).map(|i| (q[i] as i32 - 32) * y.qs[i] as i32).sum();
                blk.scales[g] as i32 * dot
            })
            .sum();
        out = (total as f32 * blk.d.to_f32()).mul_add(y.d, out);
    }
    out
}

/// One output, `row · y`, in llama.cpp's dot-product order: `row` holds `y.len()` Q6_K blocks (any
/// alignment), `y` the activation row's Q8_K blocks.
pub fn q6_k_dot(row: &[u8], y: &[BlockQ8K]) -> f32 {
    assert_eq!(row.len(), y.len() * 210, "one Q6_K block per Q8_K block");
    let mut acc = [0.0f32; 8];
    for (bytes, y) in row.chunks_exact(210).zip(y) {
        let blk: BlockQ6K = pod_read_unaligned(bytes);
        let q = codes(&blk);
        let dd = blk.d.to_f32() * y.d;
        for (l, a) in acc.iter_mut().enumerate() {
            let mut lane = 0i32;
            for v in 0..8 {
                let at = 32 * v + 4 * l;
                let dot: i32 = (at..at + 4).map(|i| q[i] as i32 * y.qs[i] as i32).sum();
                lane += blk.scales[at / 16] as i32 * dot;
            }
            let sc = |g: usize| blk.scales[g] as i32 * y.bsums[g] as i32;
            lane -= 32 * (sc(2 * l) + sc(2 * l + 1));
            *a = (lane as f32).mul_add(dd, *a);
        }
    }
    ((acc[0] + acc[4]) + (acc[2] + acc[6])) + ((acc[1] + acc[5]) + (acc[3] + acc[7]))
}
