//! AVX2 activation quantizer for the Q8 layout, bit-exact with the reference
//! `quantize_q8_0` (same f32 operations in the same order; `roundf`'s ties-away-from-zero done
//! as truncate + compare of the exact remainder).

use super::blocks::QK;
use std::arch::x86_64::*;

/// Quantizes one row `x: [k]` into codes `qs: [k]` and `ds: [k / 32]` of `(d, d * Σqs)`.
///
/// # Safety
/// The CPU must support AVX2, FMA and F16C; `x.len() == qs.len() == 32 * ds.len()`.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn quantize_q8_row(x: &[f32], qs: &mut [i8], ds: &mut [[f32; 2]]) {
    debug_assert!(x.len() == qs.len() && x.len() == ds.len() * QK);
    let sign = _mm256_set1_ps(-0.0);
    let half = _mm256_set1_ps(0.5);
    let one = _mm256_set1_ps(1.0);
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
        let id = _mm256_set1_ps(if d != 0.0 { 1.0 / d } else { 0.0 });
        let d16 = _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtps_ph(_mm_set_ss(d), _MM_FROUND_TO_NEAREST_INT)));
        let mut q = [_mm256_setzero_si256(); 4];
        for i in 0..4 {
            let t = _mm256_mul_ps(v[i], id);
            let tr = _mm256_round_ps(t, _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);
            let frac = _mm256_andnot_ps(sign, _mm256_sub_ps(t, tr));
            let away = _mm256_cmp_ps(frac, half, _CMP_GE_OQ);
            let step = _mm256_or_ps(_mm256_and_ps(t, sign), one); // ±1 with t's sign
            q[i] = _mm256_cvttps_epi32(_mm256_add_ps(tr, _mm256_and_ps(away, step)));
        }
        let sum = _mm256_add_epi32(_mm256_add_epi32(q[0], q[1]), _mm256_add_epi32(q[2], q[3]));
        let s4 = _mm_add_epi32(_mm256_castsi256_si128(sum), _mm256_extracti128_si256(sum, 1));
        let s2 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0b01_00_11_10));
        let s1 = _mm_add_epi32(s2, _mm_shuffle_epi32(s2, 0b10_11_00_01));
        let total = _mm_cvtsi128_si32(s1);
        // i32 → i16 → i8 packs work per 128-bit lane; the permute restores the order.
        let p01 = _mm256_packs_epi32(q[0], q[1]);
        let p23 = _mm256_packs_epi32(q[2], q[3]);
        let p = _mm256_packs_epi16(p01, p23);
        let p = _mm256_permutevar8x32_epi32(p, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
        _mm256_storeu_si256(qs.as_mut_ptr().add(b * QK) as *mut __m256i, p);
        *dsb = [d16, d16 * total as f32];
    }
}
