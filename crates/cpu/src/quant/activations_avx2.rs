//! AVX2 activation quantizer for the Q8 layout, bit-exact with the reference
//! [`quantize_q8_block`](super::activations::quantize_q8_block): the same f32 operations as
//! ggml-cpu's x86 `quantize_row_q8_0`/`quantize_row_q8_1` (`id = 127 / amax`, round half to
//! even, f16 conversions by F16C with round-to-nearest-even, like `half::f16::from_f32`); and
//! for the Q8_K layout, bit-exact with [`quantize_q8_k`](super::quantize::quantize_q8_k).

use super::blocks::{BlockQ8K, QK, QK_K};
use super::types::Q8Kind;
use std::arch::x86_64::*;

/// Quantizes one row `x: [k]` into codes `qs: [k]` and `ds: [k / 32]` of `(d, s)`, `s` as
/// [`Q8Kind`] defines it.
///
/// # Safety
/// The CPU must support AVX2, FMA and F16C; `x.len() == qs.len() == 32 * ds.len()`.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn quantize_q8_row(kind: Q8Kind, x: &[f32], qs: &mut [i8], ds: &mut [[f32; 2]]) {
    debug_assert!(x.len() == qs.len() && x.len() == ds.len() * QK);
    let sign = _mm256_set1_ps(-0.0);
    // f32 → f16 → f32 with round-to-nearest-even.
    let round_f16 = |v: f32| _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtps_ph(_mm_set_ss(v), _MM_FROUND_TO_NEAREST_INT)));
    for (b, dsb) in ds.iter_mut().enumerate() {
        let xp = x.as_ptr().add(b * QK);
        let v: [__m256; 4] = std::array::from_fn(|i| _mm256_loadu_ps(xp.add(8 * i)));
        let mut m = _mm256_andnot_ps(sign, v[0]);
        for vi in &v[1..] {
            m = _mm256_max_ps(m, _mm256_andnot_ps(sign, *vi));
        }
        let m4 = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
        let m2 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
        let amax = _mm_cvtss_f32(_mm_max_ss(m2, _mm_movehdup_ps(m2)));
        let d = amax / 127.0;
        let id = _mm256_set1_ps(if amax != 0.0 { 127.0 / amax } else { 0.0 });
        let mut q = [_mm256_setzero_si256(); 4];
        for i in 0..4 {
            let t = _mm256_round_ps(_mm256_mul_ps(v[i], id), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
            q[i] = _mm256_cvtps_epi32(t);
        }
        // The offset sum, which only Q8_1 blocks carry (Q8_0's stays 0: no kernel reads it).
        let total = || {
            let sum = _mm256_add_epi32(_mm256_add_epi32(q[0], q[1]), _mm256_add_epi32(q[2], q[3]));
            let s4 = _mm_add_epi32(_mm256_castsi256_si128(sum), _mm256_extracti128_si256(sum, 1));
            let s2 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0b01_00_11_10));
            let s1 = _mm_add_epi32(s2, _mm_shuffle_epi32(s2, 0b10_11_00_01));
            _mm_cvtsi128_si32(s1) as f32
        };
        // i32 → i16 → i8 packs work per 128-bit lane; the permute restores the order.
        let p01 = _mm256_packs_epi32(q[0], q[1]);
        let p23 = _mm256_packs_epi32(q[2], q[3]);
        let p = _mm256_packs_epi16(p01, p23);
        let p = _mm256_permutevar8x32_epi32(p, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
        _mm256_storeu_si256(qs.as_mut_ptr().add(b * QK) as *mut __m256i, p);
        let d16 = round_f16(d);
        *dsb = match kind {
            Q8Kind::Q8_0 => [d16, 0.0],
            Q8Kind::Q8_1 => [d16, round_f16(d * total())],
        };
    }
}

/// One Q8_K block, bit-exact with [`quantize_q8_k`](super::quantize::quantize_q8_k): the
/// first value of largest magnitude sets `iscale = -127 / max`, codes are
/// `round_half_even(iscale · x)` (the default rounding of `vcvtps2dq`; `|iscale · x| <= 127`,
/// so the saturating packs only clamp where the reference's `min(127)` does), `d = 1 / iscale`.
///
/// # Safety
/// The CPU must support AVX2.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn quantize_q8_k_block(x: &[f32; QK_K]) -> BlockQ8K {
    let mut b = BlockQ8K { d: 0.0, qs: [0; QK_K], bsums: [0; QK_K / 16] };
    let sign = _mm256_set1_ps(-0.0);
    let v: [__m256; 32] = std::array::from_fn(|i| _mm256_loadu_ps(x.as_ptr().add(8 * i)));
    // max(|v|, m) keeps m where v is NaN, as the reference's `>` skips NaNs.
    let mut m = _mm256_setzero_ps();
    for vi in &v {
        m = _mm256_max_ps(_mm256_andnot_ps(sign, *vi), m);
    }
    let m4 = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
    let m2 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
    let amax = _mm_cvtss_f32(_mm_max_ss(m2, _mm_movehdup_ps(m2)));
    if amax == 0.0 {
        return b;
    }
    let at = _mm256_set1_ps(amax);
    let first = (0..32)
        .find_map(|i| {
            let hit = _mm256_movemask_ps(_mm256_cmp_ps(_mm256_andnot_ps(sign, v[i]), at, _CMP_EQ_OQ));
            (hit != 0).then(|| 8 * i + hit.trailing_zeros() as usize)
        })
        .expect("amax is one of the values");
    let iscale = -127.0 / x[first];
    let scale = _mm256_set1_ps(iscale);
    let order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    for c in 0..8 {
        let q: [__m256i; 4] = std::array::from_fn(|i| _mm256_cvtps_epi32(_mm256_mul_ps(v[4 * c + i], scale)));
        // Groups 2c and 2c + 1 (16 codes each).
        for g in 0..2 {
            let s = _mm256_add_epi32(q[2 * g], q[2 * g + 1]);
            let s4 = _mm_add_epi32(_mm256_castsi256_si128(s), _mm256_extracti128_si256(s, 1));
            let s2 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0b01_00_11_10));
            let s1 = _mm_add_epi32(s2, _mm_shuffle_epi32(s2, 0b10_11_00_01));
            b.bsums[2 * c + g] = _mm_cvtsi128_si32(s1) as i16;
        }
        let p = _mm256_packs_epi16(_mm256_packs_epi32(q[0], q[1]), _mm256_packs_epi32(q[2], q[3]));
        let p = _mm256_permutevar8x32_epi32(p, order);
        _mm256_storeu_si256(b.qs.as_mut_ptr().add(32 * c) as *mut __m256i, p);
    }
    b.d = 1.0 / iscale;
    b
}
