//! AVX2 + FMA + F16C row kernels for the K-quants (Q4_K, Q5_K, Q6_K) × Q8_K activations.
//!
//! Per 256-value super-block: the weight codes are unpacked once into eight vectors of 32
//! unsigned bytes (Q4_K 0..15, Q5_K 0..31, Q6_K 0..63 without its -32 offset), then for each
//! activation row: `_mm256_maddubs_epi16` (no saturation: 2·63·127 < 2^15), `_mm256_madd_epi16`
//! with the sub-block scales broadcast as i16, summed as i32 over the super-block and converted
//! once. The min terms (Q4_K/Q5_K `dmin · mn_j`) and the Q6_K offset (`-32 · sc_g`) use the
//! activation block sums `bsums`, in scalar integers.

// Kernels and references index several parallel arrays by the same lane or row.
#![allow(clippy::needless_range_loop)]

use super::blocks::{scale_min_k4, BlockQ8K, K_SCALE_SIZE, QK_K};
use super::dot_avx2::{dispatch_nj, hsum};
use super::types::Acts;
use std::arch::x86_64::*;

/// Header of a Q4_K/Q5_K block at `blk`: `(d, dmin)` and the eight 6-bit scales and mins.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn k4_header(blk: *const u8) -> (f32, f32, [i16; 8], [i32; 8]) {
    let dd = _mm_cvtph_ps(_mm_cvtsi32_si128(std::ptr::read_unaligned(blk as *const i32)));
    let d = _mm_cvtss_f32(dd);
    let dmin = _mm_cvtss_f32(_mm_movehdup_ps(dd));
    let scales: [u8; K_SCALE_SIZE] = std::ptr::read_unaligned(blk.add(4) as *const [u8; K_SCALE_SIZE]);
    let (mut sc, mut mn) = ([0i16; 8], [0i32; 8]);
    for j in 0..8 {
        let (s, m) = scale_min_k4(j, &scales);
        sc[j] = s as i16;
        mn[j] = m as i32;
    }
    (d, dmin, sc, mn)
}

/// `Σ_j sc_j Σ_{i in sub-block j} q_i y_i` for 8 sub-blocks of 32 (codes in `q`), as 8 × i32.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn k4_dot(q: &[__m256i; 8], sc: &[__m256i; 8], y: *const i8) -> __m256i {
    let mut sumi = _mm256_setzero_si256();
    for v in 0..8 {
        let yv = _mm256_loadu_si256(y.add(32 * v) as *const __m256i);
        let p = _mm256_madd_epi16(_mm256_maddubs_epi16(q[v], yv), sc[v]);
        sumi = _mm256_add_epi32(sumi, p);
    }
    sumi
}

/// Shared body of Q4_K (`FIVE = false`) and Q5_K (`FIVE = true`).
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn k4_rows<const NJ: usize, const FIVE: bool>(w: &[u8], a: &Acts, j0: usize, out: &mut [f32; 4]) {
    let (block, qs_off) = if FIVE { (176, 48) } else { (144, 16) };
    let nb = a.k / QK_K;
    debug_assert!(w.len() == nb * block && a.q8k.len() >= (j0 + NJ) * nb);
    let mask = _mm256_set1_epi8(0x0F);
    let one = _mm256_set1_epi8(1);
    let mut acc = [_mm256_setzero_ps(); NJ];
    let mut acc_min = [0.0f32; NJ];
    for b in 0..nb {
        let blk = w.as_ptr().add(b * block);
        let (d, dmin, sc, mn) = k4_header(blk);
        let scv: [__m256i; 8] = std::array::from_fn(|v| _mm256_set1_epi16(sc[v]));
        let mut q = [_mm256_setzero_si256(); 8];
        let qh = if FIVE { _mm256_loadu_si256(blk.add(16) as *const __m256i) } else { _mm256_setzero_si256() };
        for c in 0..4 {
            let raw = _mm256_loadu_si256(blk.add(qs_off + 32 * c) as *const __m256i);
            q[2 * c] = _mm256_and_si256(raw, mask);
            q[2 * c + 1] = _mm256_and_si256(_mm256_srli_epi16(raw, 4), mask);
            if FIVE {
                let h_lo = _mm256_and_si256(_mm256_srl_epi16(qh, _mm_cvtsi32_si128(2 * c as i32)), one);
                let h_hi = _mm256_and_si256(_mm256_srl_epi16(qh, _mm_cvtsi32_si128(2 * c as i32 + 1)), one);
                q[2 * c] = _mm256_or_si256(q[2 * c], _mm256_slli_epi16(h_lo, 4));
                q[2 * c + 1] = _mm256_or_si256(q[2 * c + 1], _mm256_slli_epi16(h_hi, 4));
            }
        }
        for t in 0..NJ {
            let y: &BlockQ8K = &a.q8k[(j0 + t) * nb + b];
            let sumi = k4_dot(&q, &scv, y.qs.as_ptr());
            acc[t] = _mm256_fmadd_ps(_mm256_set1_ps(d * y.d), _mm256_cvtepi32_ps(sumi), acc[t]);
            let summ: i32 = (0..8).map(|j| mn[j] * (y.bsums[2 * j] as i32 + y.bsums[2 * j + 1] as i32)).sum();
            acc_min[t] += dmin * y.d * summ as f32;
        }
    }
    for t in 0..NJ {
        out[t] = hsum(acc[t]) - acc_min[t];
    }
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q4_k_n<const NJ: usize>(w: &[u8], a: &Acts, j0: usize, out: &mut [f32; 4]) {
    k4_rows::<NJ, false>(w, a, j0, out)
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q5_k_n<const NJ: usize>(w: &[u8], a: &Acts, j0: usize, out: &mut [f32; 4]) {
    k4_rows::<NJ, true>(w, a, j0, out)
}

/// Q6_K: codes unpacked to 0..63 (`q + 32`), so the dot is `Σ sc_g Σ q y - 32 Σ sc_g bsums_g`.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q6_k_n<const NJ: usize>(w: &[u8], a: &Acts, j0: usize, out: &mut [f32; 4]) {
    const BLOCK: usize = 210;
    let nb = a.k / QK_K;
    debug_assert!(w.len() == nb * BLOCK && a.q8k.len() >= (j0 + NJ) * nb);
    let mask = _mm256_set1_epi8(0x0F);
    let three = _mm256_set1_epi8(3);
    let mut acc = [_mm256_setzero_ps(); NJ];
    for b in 0..nb {
        let blk = w.as_ptr().add(b * BLOCK);
        let sc: [i8; 16] = std::ptr::read_unaligned(blk.add(192) as *const [i8; 16]);
        let d =
            _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(std::ptr::read_unaligned(blk.add(208) as *const u16) as i32)));
        let mut q = [_mm256_setzero_si256(); 8];
        for h in 0..2 {
            let ql0 = _mm256_loadu_si256(blk.add(64 * h) as *const __m256i);
            let ql1 = _mm256_loadu_si256(blk.add(64 * h + 32) as *const __m256i);
            let qh = _mm256_loadu_si256(blk.add(128 + 32 * h) as *const __m256i);
            let high = |shift: i32| {
                _mm256_slli_epi16(_mm256_and_si256(_mm256_srl_epi16(qh, _mm_cvtsi32_si128(shift)), three), 4)
            };
            q[4 * h] = _mm256_or_si256(_mm256_and_si256(ql0, mask), high(0));
            q[4 * h + 1] = _mm256_or_si256(_mm256_and_si256(ql1, mask), high(2));
            q[4 * h + 2] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql0, 4), mask), high(4));
            q[4 * h + 3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql1, 4), mask), high(6));
        }
        // Vector v covers values 32v..32v+32: groups 2v (low 128 bits) and 2v+1 (high).
        let scv: [__m256i; 8] = std::array::from_fn(|v| {
            _mm256_set_m128i(_mm_set1_epi16(sc[2 * v + 1] as i16), _mm_set1_epi16(sc[2 * v] as i16))
        });
        for t in 0..NJ {
            let y: &BlockQ8K = &a.q8k[(j0 + t) * nb + b];
            let sumi = k4_dot(&q, &scv, y.qs.as_ptr());
            let offset: i32 = (0..16).map(|g| sc[g] as i32 * y.bsums[g] as i32).sum();
            let s = _mm256_cvtepi32_ps(sumi);
            let s = _mm256_sub_ps(s, _mm256_setr_ps(32.0 * offset as f32, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0));
            acc[t] = _mm256_fmadd_ps(_mm256_set1_ps(d * y.d), s, acc[t]);
        }
    }
    for t in 0..NJ {
        out[t] = hsum(acc[t]);
    }
}

dispatch_nj!(q4_k, q4_k_n);
dispatch_nj!(q5_k, q5_k_n);
dispatch_nj!(q6_k, q6_k_n);
