//! Portable scalar row kernels: the fallback when AVX2 is missing. Same integer arithmetic as
//! the SIMD kernels (weights × Q8/Q8_K activation codes, one float scale per block), so they
//! double as a readable statement of what the SIMD code computes.
//!
//! Every kernel computes `out[t] = W_row · x_{j0 + t}` for `t < nj` (nj ≤ 4) and has the
//! [`RowFn`](super::matmul::RowFn) signature.

use super::blocks::*;
use super::reference_q4k::{q4_k_dot, Q4KOrder};
use super::reference_q5k::{q5_k_dot, q5_k_dot_tiled};
use super::reference_q6k::{q6_k_dot, q6_k_dot_tiled};
use super::types::Acts;
use bytemuck::pod_read_unaligned;
use half::{bf16, f16};

fn for_rows(nj: usize, out: &mut [f32; 4], mut f: impl FnMut(usize) -> f32) {
    for (t, o) in out.iter_mut().enumerate().take(nj) {
        *o = f(t);
    }
}

/// Runs `block_dot(block bytes, activation codes, [d_x, s_x])` over the `B`-byte blocks of a
/// 32-value format and sums the results, for each of the `nj` activation rows.
fn legacy_rows<const B: usize>(
    w: &[u8],
    a: &Acts,
    j0: usize,
    nj: usize,
    out: &mut [f32; 4],
    block_dot: impl Fn(&[u8], &[i8], [f32; 2]) -> f32,
) {
    for_rows(nj, out, |t| {
        let j = j0 + t;
        w.chunks_exact(B)
            .enumerate()
            .map(|(b, bytes)| block_dot(bytes, &a.q8_qs[j * a.k + b * QK..][..QK], a.q8_ds[j * a.k / QK + b]))
            .sum()
    })
}

/// Runs `block_dot(block bytes, activation super-block)` over the `B`-byte super-blocks of a
/// 256-value format and sums the results, for each of the `nj` activation rows.
fn k_rows<const B: usize>(
    w: &[u8],
    a: &Acts,
    j0: usize,
    nj: usize,
    out: &mut [f32; 4],
    block_dot: impl Fn(&[u8], &BlockQ8K) -> f32,
) {
    let nb = a.k / QK_K;
    for_rows(nj, out, |t| {
        w.chunks_exact(B).enumerate().map(|(b, bytes)| block_dot(bytes, &a.q8k[(j0 + t) * nb + b])).sum()
    })
}

fn dot_i32(q: impl IntoIterator<Item = i32>, y: &[i8]) -> i32 {
    q.into_iter().zip(y).map(|(q, &y)| q * y as i32).sum()
}

/// Q5_0 × Q8_0: `d_w d_x Σ (q_w - 16) q_x` per block, `q_w` the 5-bit code (0..31).
pub fn q5_0(w: &[u8], a: &Acts, j0: usize, nj: usize, out: &mut [f32; 4]) {
    legacy_rows::<22>(w, a, j0, nj, out, |bytes, y, [dx, _]| {
        let blk: BlockQ5_0 = pod_read_unaligned(bytes);
        let sumi = dot_i32(super::reference::q5_codes(&blk.qh, &blk.qs).map(|q| q as i32 - 16), y);
        blk.d.to_f32() * dx * sumi as f32
    })
}

/// Q5_1 × Q8_1: `d_w (d_x Σ q_w q_x) + m_w s_x` per block.
pub fn q5_1(w: &[u8], a: &Acts, j0: usize, nj: usize, out: &mut [f32; 4]) {
    legacy_rows::<24>(w, a, j0, nj, out, |bytes, y, [dx, sx]| {
        let blk: BlockQ5_1 = pod_read_unaligned(bytes);
        let sumi = dot_i32(super::reference::q5_codes(&blk.qh, &blk.qs).map(i32::from), y);
        blk.d.to_f32() * dx * sumi as f32 + blk.m.to_f32() * sx
    })
}

/// IQ4_NL × Q8_0: `d_w d_x Σ KVALUES_IQ4NL[q_w] q_x` per block.
pub fn iq4_nl(w: &[u8], a: &Acts, j0: usize, nj: usize, out: &mut [f32; 4]) {
    legacy_rows::<18>(w, a, j0, nj, out, |bytes, y, [dx, _]| {
        let blk: BlockIQ4NL = pod_read_unaligned(bytes);
        let lo = blk.qs.map(|q| KVALUES_IQ4NL[(q & 0xF) as usize] as i32);
        let hi = blk.qs.map(|q| KVALUES_IQ4NL[(q >> 4) as usize] as i32);
        let sumi = dot_i32(lo, &y[..16]) + dot_i32(hi, &y[16..]);
        blk.d.to_f32() * dx * sumi as f32
    })
}

/// Q2_K × Q8_K: `d d_x Σ_g sc_g Σ q y - dmin d_x Σ_g mn_g bsums_g` over 16 groups of 16.
pub fn q2_k(w: &[u8], a: &Acts, j0: usize, nj: usize, out: &mut [f32; 4]) {
    k_rows::<84>(w, a, j0, nj, out, |bytes, y| {
        let blk: BlockQ2K = pod_read_unaligned(bytes);
        let q = super::reference::two_bit_codes(&blk.qs);
        let (mut sumi, mut summ) = (0i32, 0i32);
        for g in 0..16 {
            let sc = blk.scales[g];
            sumi += (sc & 0xF) as i32 * dot_i32(q[16 * g..16 * g + 16].iter().map(|&v| v as i32), &y.qs[16 * g..]);
            summ += (sc >> 4) as i32 * y.bsums[g] as i32;
        }
        blk.d.to_f32() * y.d * sumi as f32 - blk.dmin.to_f32() * y.d * summ as f32
    })
}

/// Q3_K × Q8_K: `d d_x Σ_g sc_g Σ q y` over 16 groups of 16, `q` in -4..3.
pub fn q3_k(w: &[u8], a: &Acts, j0: usize, nj: usize, out: &mut [f32; 4]) {
    k_rows::<110>(w, a, j0, nj, out, |bytes, y| {
        let blk: BlockQ3K = pod_read_unaligned(bytes);
        let (q, sc) = (super::reference::q3_k_codes(&blk), scales_q3k(&blk.scales));
        let sumi: i32 = (0..16)
            .map(|g| sc[g] as i32 * dot_i32(q[16 * g..16 * g + 16].iter().map(|&v| v as i32), &y.qs[16 * g..]))
            .sum();
        blk.d.to_f32() * y.d * sumi as f32
    })
}

/// IQ4_XS × Q8_K: `d d_x Σ_b sc_b Σ KVALUES_IQ4NL[q] y` over 8 sub-blocks of 32.
pub fn iq4_xs(w: &[u8], a: &Acts, j0: usize, nj: usize, out: &mut [f32; 4]) {
    k_rows::<136>(w, a, j0, nj, out, |bytes, y| {
        let blk: BlockIQ4XS = pod_read_unaligned(bytes);
        let sumi: i32 = (0..8)
            .map(|sb| {
                let qs = &blk.qs[16 * sb..16 * sb + 16];
                let lo = qs.iter().map(|q| KVALUES_IQ4NL[(q & 0xF) as usize] as i32);
                let hi = qs.iter().map(|q| KVALUES_IQ4NL[(q >> 4) as usize] as i32);
                blk.scale(sb) * (dot_i32(lo, &y.qs[32 * sb..]) + dot_i32(hi, &y.qs[32 * sb + 16..]))
            })
            .sum();
        blk.d.to_f32() * y.d * sumi as f32
    })
}

/// Q4_0 × Q8_0: `Σ_b d_w d_x Σ (q_w - 8) q_x`, `q_w` the raw nibble.
pub fn q4_0(w: &[u8], a: &Acts, j0: usize, nj: usize, out: &mut [f32; 4]) {
    for_rows(nj, out, |t| {
        let j = j0 + t;
        let mut acc = 0.0f32;
        for (b, bytes) in w.chunks_exact(18).enumerate() {
            let blk: BlockQ4_0 = pod_read_unaligned(bytes);
            let y = &a.q8_qs[j * a.k + b * QK..][..QK];
            let dx = a.q8_ds[j * a.k / QK + b][0];
            let sumi = nibble_dot(&blk.qs, y) - 8 * y.iter().map(|&v| v as i32).sum::<i32>();
            acc += blk.d.to_f32() * dx * sumi as f32;
        }
        acc
    })
}

/// Q4_1 × Q8_1: `Σ_b d_w (d_x Σ q_w q_x) + m_w s_x`, `s_x` the block's f16 sum (see
/// [`Q8Kind`](super::activations::Q8Kind)).
pub fn q4_1(w: &[u8], a: &Acts, j0: usize, nj: usize, out: &mut [f32; 4]) {
    for_rows(nj, out, |t| {
        let j = j0 + t;
        let mut acc = 0.0f32;
        for (b, bytes) in w.chunks_exact(20).enumerate() {
            let blk: BlockQ4_1 = pod_read_unaligned(bytes);
            let y = &a.q8_qs[j * a.k + b * QK..][..QK];
            let [dx, sx] = a.q8_ds[j * a.k / QK + b];
            let sumi = nibble_dot(&blk.qs, y);
            acc += blk.d.to_f32() * dx * sumi as f32 + blk.m.to_f32() * sx;
        }
        acc
    })
}

/// `Σ_j lo(qs[j]) y[j] + hi(qs[j]) y[j + 16]`.
fn nibble_dot(qs: &[u8; 16], y: &[i8]) -> i32 {
    (0..16).map(|j| (qs[j] & 0xF) as i32 * y[j] as i32 + (qs[j] >> 4) as i32 * y[j + 16] as i32).sum()
}

/// Q8_0 × Q8: `Σ_b d_w d_x Σ q_w q_x`.
pub fn q8_0(w: &[u8], a: &Acts, j0: usize, nj: usize, out: &mut [f32; 4]) {
    for_rows(nj, out, |t| {
        let j = j0 + t;
        let mut acc = 0.0f32;
        for (b, bytes) in w.chunks_exact(34).enumerate() {
            let blk: BlockQ8_0 = pod_read_unaligned(bytes);
            let y = &a.q8_qs[j * a.k + b * QK..][..QK];
            let sumi: i32 = blk.qs.iter().zip(y).map(|(&p, &q)| p as i32 * q as i32).sum();
            acc += blk.d.to_f32() * a.q8_ds[j * a.k / QK + b][0] * sumi as f32;
        }
        acc
    })
}

/// Q4_K × Q8_K, in llama.cpp's order for each activation row ([`reference_q4k`](super::reference_q4k)).
pub fn q4_k(w: &[u8], a: &Acts, j0: usize, nj: usize, out: &mut [f32; 4]) {
    let nb = a.k / QK_K;
    for_rows(nj, out, |t| {
        let j = j0 + t;
        let order = if j < a.gemm_acts { Q4KOrder::Gemm } else { Q4KOrder::Gemv };
        q4_k_dot(w, &a.q8k[j * nb..(j + 1) * nb], order)
    })
}

/// Q5_K × Q8_K, in llama.cpp's order for the matmul's row count
/// ([`reference_q5k`](super::reference_q5k)).
pub fn q5_k(w: &[u8], a: &Acts, j0: usize, nj: usize, out: &mut [f32; 4]) {
    let nb = a.k / QK_K;
    let dot = if a.tiled { q5_k_dot_tiled } else { q5_k_dot };
    for_rows(nj, out, |t| dot(w, &a.q8k[(j0 + t) * nb..(j0 + t + 1) * nb]))
}

/// Q6_K × Q8_K, in llama.cpp's order ([`reference_q6k`](super::reference_q6k)).
pub fn q6_k(w: &[u8], a: &Acts, j0: usize, nj: usize, out: &mut [f32; 4]) {
    let nb = a.k / QK_K;
    let dot = if a.tiled { q6_k_dot_tiled } else { q6_k_dot };
    for_rows(nj, out, |t| dot(w, &a.q8k[(j0 + t) * nb..(j0 + t + 1) * nb]))
}

/// F32 weights × f32 activations.
pub fn f32_row(w: &[u8], a: &Acts, j0: usize, nj: usize, out: &mut [f32; 4]) {
    float_row(w, 4, a, j0, nj, out, |b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
}

/// F16 weights × f32 activations.
pub fn f16_row(w: &[u8], a: &Acts, j0: usize, nj: usize, out: &mut [f32; 4]) {
    float_row(w, 2, a, j0, nj, out, |b| f16::from_le_bytes([b[0], b[1]]).to_f32())
}

/// BF16 weights × f32 activations.
pub fn bf16_row(w: &[u8], a: &Acts, j0: usize, nj: usize, out: &mut [f32; 4]) {
    float_row(w, 2, a, j0, nj, out, |b| bf16::from_le_bytes([b[0], b[1]]).to_f32())
}

fn float_row(w: &[u8], size: usize, a: &Acts, j0: usize, nj: usize, out: &mut [f32; 4], get: impl Fn(&[u8]) -> f32) {
    for_rows(nj, out, |t| {
        let x = &a.x[(j0 + t) * a.k..][..a.k];
        w.chunks_exact(size).zip(x).map(|(b, &v)| get(b) * v).sum()
    })
}
