//! The online-softmax step of a tile (AVX2, shared by every instruction set's kernels):
//! [`update`] masks a row block's scores to each row's visible range, turns them into
//! probabilities against the new running max and updates the running max and sum of four
//! rows at once; [`scale_weights`] folds quantized value scales into the probabilities.
//!
//! `exp` is the Cephes `expf` polynomial ([`exp256`], about 1 ulp); masked lanes get exactly 0.

use std::arch::x86_64::*;

use super::tile::RowRanges;

/// `exp(x)` on 8 lanes (Cephes `expf`: range reduction by ln 2, degree-6 polynomial), relative
/// error about 1 ulp on [-87, 88]; inputs are clamped to that range (NaN reads as -87).
#[inline(always)]
pub(crate) unsafe fn exp256(x: __m256) -> __m256 {
    unsafe {
        let x = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(-87.0)), _mm256_set1_ps(88.0));
        let fx = _mm256_round_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(_mm256_mul_ps(
            x,
            _mm256_set1_ps(std::f32::consts::LOG2_E),
        ));
        let x = _mm256_fnmadd_ps(fx, _mm256_set1_ps(0.693_359_4), x);
        let x = _mm256_fnmadd_ps(fx, _mm256_set1_ps(-2.121_944_4e-4), x);
        let mut y = _mm256_set1_ps(1.987_569_1e-4);
        y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(1.398_199_9e-3));
        y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(8.333_452e-3));
        y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(4.166_579_6e-2));
        y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(1.666_666_5e-1));
        y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(5.000_000_1e-1));
        y = _mm256_fmadd_ps(y, _mm256_mul_ps(x, x), _mm256_add_ps(x, _mm256_set1_ps(1.0)));
        let pow2 = _mm256_slli_epi32::<23>(_mm256_add_epi32(_mm256_cvtps_epi32(fx), _mm256_set1_epi32(127)));
        _mm256_mul_ps(y, _mm256_castsi256_ps(pow2))
    }
}

/// Online-softmax update of a row block over tokens `t0 .. t1` of `sc`: masks each lane to its
/// row's range, takes the tile max, turns scores into probabilities `exp(s - m_new)` (exactly 0
/// where masked) in place, updates `m`, `l` (`[4]`, lanes past the block's rows ignored) and
/// returns the accumulator correction `exp(m_old - m_new)` per row.
///
/// # Safety
/// AVX2/FMA; `sc` holds [`super::tile::SC_LEN`] floats and `t1 ≤ TILE`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn update(
    sc: *mut f32,
    t0: usize,
    t1: usize,
    ranges: &RowRanges,
    m: &mut [f32; 4],
    l: &mut [f32; 4],
) -> [f32; 4] {
    unsafe {
        let ra = _mm_loadu_si128(ranges.a.as_ptr().cast());
        let rb = _mm_loadu_si128(ranges.b.as_ptr().cast());
        let av = _mm256_set_m128i(ra, ra);
        let bv = _mm256_set_m128i(rb, rb);
        let ninf = _mm256_set1_ps(f32::NEG_INFINITY);
        let two = _mm256_set1_epi32(2);
        let t_first = _mm256_add_epi32(_mm256_set1_epi32(t0 as i32), _mm256_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1));

        // Pass 1: mask in place, running max.
        let mut tv = t_first;
        let mut mx = ninf;
        let mut t = t0;
        while t < t1 {
            let p = sc.add(4 * t);
            let outside = _mm256_or_si256(
                _mm256_cmpgt_epi32(av, tv),
                _mm256_cmpgt_epi32(_mm256_add_epi32(tv, _mm256_set1_epi32(1)), bv),
            );
            let s = _mm256_blendv_ps(_mm256_loadu_ps(p), ninf, _mm256_castsi256_ps(outside));
            _mm256_storeu_ps(p, s);
            mx = _mm256_max_ps(mx, s);
            tv = _mm256_add_epi32(tv, two);
            t += 2;
        }
        let tile_max = _mm_max_ps(_mm256_castps256_ps128(mx), _mm256_extractf128_ps::<1>(mx));
        let m_old = _mm_loadu_ps(m.as_ptr());
        let m_new = _mm_max_ps(m_old, tile_max);
        // A row with no visible key yet keeps m = -inf; use 0 as its reference (p is 0 anyway).
        let m_ref = _mm_blendv_ps(m_new, _mm_setzero_ps(), _mm_cmpeq_ps(m_new, _mm256_castps256_ps128(ninf)));
        let mr = _mm256_set_m128(m_ref, m_ref);
        let corr = _mm256_castps256_ps128(exp256(_mm256_castps128_ps256(_mm_sub_ps(m_old, m_ref))));

        // Pass 2: probabilities and row sums.
        let mut sum = _mm256_setzero_ps();
        let mut t = t0;
        while t < t1 {
            let p = sc.add(4 * t);
            let s = _mm256_loadu_ps(p);
            let e = _mm256_and_ps(exp256(_mm256_sub_ps(s, mr)), _mm256_cmp_ps::<_CMP_NEQ_OQ>(s, ninf));
            _mm256_storeu_ps(p, e);
            sum = _mm256_add_ps(sum, e);
            t += 2;
        }
        let row_sum = _mm_add_ps(_mm256_castps256_ps128(sum), _mm256_extractf128_ps::<1>(sum));
        let l_new = _mm_fmadd_ps(_mm_loadu_ps(l.as_ptr()), corr, row_sum);
        _mm_storeu_ps(m.as_mut_ptr(), m_new);
        _mm_storeu_ps(l.as_mut_ptr(), l_new);
        let mut c = [0f32; 4];
        _mm_storeu_ps(c.as_mut_ptr(), corr);
        c
    }
}

/// Folds value group scales into the probabilities: `w[t][g][r] = p[t][r] · vscale[t][g]`
/// for tokens `t0 .. t1`; `w`: `[TILE, ng, 4]`, `vscale`: `[TILE, ngp]`.
///
/// # Safety
/// AVX; buffers sized as documented, `t1 ≤ TILE`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn scale_weights(
    sc: *const f32,
    vscale: &[f32],
    ngp: usize,
    ng: usize,
    t0: usize,
    t1: usize,
    w: &mut [f32],
) {
    unsafe {
        debug_assert!(w.len() >= t1 * ng * 4 && vscale.len() >= t1 * ngp);
        for t in t0..t1 {
            let p = _mm_loadu_ps(sc.add(4 * t));
            for g in 0..ng {
                let s = _mm_broadcast_ss(vscale.get_unchecked(t * ngp + g));
                _mm_storeu_ps(w.as_mut_ptr().add((t * ng + g) * 4), _mm_mul_ps(p, s));
            }
        }
    }
}
