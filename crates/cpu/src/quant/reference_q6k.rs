//! The float order of llama.cpp's Q6_K × Q8_K dot on x86 (`ggml_vec_dot_q6_K_q8_K`, AVX2 path;
//! ggml-cpu does not repack Q6_K there), stated as a scalar reference. The Q6_K kernels here
//! reproduce it bit for bit.
//!
//! Per super-block, eight exact i32 lanes: lane `l` sums, over the eight 32-value vectors `v`,
//! `sc_g Σ q y` for the four values `32v + 4l .. 32v + 4l + 4` (codes `q` unsigned, 0..63; `g`
//! their 16-value group), minus `32 (sc_2l bsums_2l + sc_2l+1 bsums_2l+1)` (the codes' -32
//! offset). Each lane is converted and multiply-added into its own f32 accumulator with
//! `d · d_y`; at the end the lanes are summed as `((a0 + a4) + (a2 + a6)) + ((a1 + a5) + (a3 + a7))`.

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

/// One output, `row · y`, in llama.cpp's order: `row` holds `y.len()` Q6_K blocks (any
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
