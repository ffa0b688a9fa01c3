//! The online-softmax step of a tile (AVX2, shared by every instruction set's kernels):
//! [`update`] masks a row block's scores to each row's visible range, turns them into
//! probabilities against the running max and updates the running max and sum of four rows at
//! once, in one pass while the max holds; [`scale_weights`] folds quantized value scales into
//! the probabilities.
//!
//! `exp` is the Cephes `expf` polynomial ([`exp256`], about 1 ulp); masked lanes get exactly 0.

use std::arch::x86_64::*;

/// Per-row visible token range `[a, b)` inside a tile for the four rows of a block (empty,
/// `a = b = 0`, for rows past the block's end or rows that see nothing of the tile).
#[derive(Clone, Copy, Debug)]
pub(crate) struct RowRanges {
    pub a: [i32; 4],
    pub b: [i32; 4],
}

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
        y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(0.5)); // Cephes 5.0000001201e-1, as f32
        y = _mm256_fmadd_ps(y, _mm256_mul_ps(x, x), _mm256_add_ps(x, _mm256_set1_ps(1.0)));
        let pow2 = _mm256_slli_epi32::<23>(_mm256_add_epi32(_mm256_cvtps_epi32(fx), _mm256_set1_epi32(127)));
        _mm256_mul_ps(y, _mm256_castsi256_ps(pow2))
    }
}

/// How far above a row's running max `m` a score may lie and still be turned into a
/// probability against `m` (it then is up to `e^32 ≈ 8e13`, far from overflowing f32 sums).
const HEADROOM: f32 = 32.0;

/// Lanes `[t: r0 r1 r2 r3 | t+1: r0 r1 r2 r3]` of `sc` outside their row's range `[a, b)`.
struct Masks {
    a: __m256i,
    b: __m256i,
}

impl Masks {
    #[inline(always)]
    unsafe fn new(ranges: &RowRanges) -> Masks {
        unsafe {
            let ra = _mm_loadu_si128(ranges.a.as_ptr().cast());
            let rb = _mm_loadu_si128(ranges.b.as_ptr().cast());
            Masks { a: _mm256_set_m128i(ra, ra), b: _mm256_set_m128i(rb, rb) }
        }
    }

    /// All-ones where token `tv` (per lane) is outside the lane's row range.
    #[inline(always)]
    unsafe fn outside(&self, tv: __m256i) -> __m256 {
        unsafe {
            let before = _mm256_cmpgt_epi32(self.a, tv);
            let after = _mm256_cmpgt_epi32(_mm256_add_epi32(tv, _mm256_set1_epi32(1)), self.b);
            _mm256_castsi256_ps(_mm256_or_si256(before, after))
        }
    }
}

/// Token index per lane for the pair starting at `t`.
#[inline(always)]
unsafe fn token_lanes(t: usize) -> __m256i {
    unsafe { _mm256_add_epi32(_mm256_set1_epi32(t as i32), _mm256_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1)) }
}

/// `p = exp(sc - m_ref)` where visible, 0 elsewhere, for tokens `t0 .. t1`; returns the row
/// sums and row maxima of `p` (`[4]` each).
#[inline(always)]
unsafe fn exp_pass(
    sc: *const f32,
    p: *mut f32,
    t0: usize,
    t1: usize,
    masks: &Masks,
    m_ref: __m128,
) -> (__m128, __m128) {
    unsafe {
        let mr = _mm256_set_m128(m_ref, m_ref);
        // Two accumulators each: the sums and maxima are the loop's only dependency chains.
        let (mut sum0, mut sum1) = (_mm256_setzero_ps(), _mm256_setzero_ps());
        let (mut max0, mut max1) = (_mm256_setzero_ps(), _mm256_setzero_ps());
        let mut t = t0;
        while t < t1 {
            let e = exp256(_mm256_sub_ps(_mm256_loadu_ps(sc.add(4 * t)), mr));
            let e = _mm256_andnot_ps(masks.outside(token_lanes(t)), e);
            _mm256_storeu_ps(p.add(4 * t), e);
            sum0 = _mm256_add_ps(sum0, e);
            max0 = _mm256_max_ps(max0, e);
            std::mem::swap(&mut sum0, &mut sum1);
            std::mem::swap(&mut max0, &mut max1);
            t += 2;
        }
        let (sum, max) = (_mm256_add_ps(sum0, sum1), _mm256_max_ps(max0, max1));
        (
            _mm_add_ps(_mm256_castps256_ps128(sum), _mm256_extractf128_ps::<1>(sum)),
            _mm_max_ps(_mm256_castps256_ps128(max), _mm256_extractf128_ps::<1>(max)),
        )
    }
}

/// Online-softmax update of a row block over tokens `t0 .. t1`: writes the probabilities
/// `p[t][r] = exp(sc[t][r] - m_r)` (exactly 0 outside row `r`'s range), updates `m`, `l`
/// (`[4]`; lanes of rows without a visible key in the tile keep theirs) and returns the
/// accumulator correction `exp(m_old - m_new)` per row.
///
/// The reference `m` is the running max only in spirit: while no score of the tile exceeds a
/// row's `m` by more than [`HEADROOM`], `m` stays and the correction is exactly 1; otherwise the
/// row takes the tile's max. Each row decides on its own scores alone, so a row's result is the
/// same whichever rows share its block of four.
/// Either way `acc / l` is the same softmax (the reference cancels).
///
/// # Safety
/// AVX2/FMA; `sc` and `p` hold `SC_LEN` floats and `t1 ≤ TILE`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn update(
    sc: *const f32,
    p: *mut f32,
    t0: usize,
    t1: usize,
    ranges: &RowRanges,
    m: &mut [f32; 4],
    l: &mut [f32; 4],
) -> [f32; 4] {
    unsafe {
        let masks = Masks::new(ranges);
        // Rows that see at least one key of the tile.
        let active = _mm_castsi128_ps(_mm_cmpgt_epi32(
            _mm_loadu_si128(ranges.b.as_ptr().cast()),
            _mm_loadu_si128(ranges.a.as_ptr().cast()),
        ));
        let m_old = _mm_loadu_ps(m.as_ptr());
        let l_old = _mm_loadu_ps(l.as_ptr());
        let ninf = _mm_set1_ps(f32::NEG_INFINITY);
        // The tile's max of each row (its masked lanes at -inf).
        let mut tile_max = _mm256_set1_ps(f32::NEG_INFINITY);
        let mut t = t0;
        while t < t1 {
            let s = _mm256_loadu_ps(sc.add(4 * t));
            let s = _mm256_blendv_ps(s, _mm256_set1_ps(f32::NEG_INFINITY), masks.outside(token_lanes(t)));
            tile_max = _mm256_max_ps(tile_max, s);
            t += 2;
        }
        let tile_max = _mm_max_ps(_mm256_castps256_ps128(tile_max), _mm256_extractf128_ps::<1>(tile_max));
        // Each row decides alone, so its result does not depend on which rows share its block
        // (a decode's rows, or a chunk's of several queries): a row with a running max keeps it
        // while the tile stays within HEADROOM of it (correction exactly 1); otherwise it takes
        // the new max and rescales.
        let known = _mm_cmpneq_ps(m_old, ninf);
        let within = _mm_cmple_ps(_mm_sub_ps(tile_max, m_old), _mm_set1_ps(HEADROOM));
        let inactive = _mm_xor_ps(active, _mm_castsi128_ps(_mm_set1_epi32(-1)));
        let keep = _mm_and_ps(known, _mm_or_ps(within, inactive));
        let m_new = _mm_blendv_ps(_mm_max_ps(m_old, tile_max), m_old, keep);
        // A row with no visible key yet keeps m = -inf; use 0 as its reference (p is 0 anyway).
        let m_ref = _mm_blendv_ps(m_new, _mm_setzero_ps(), _mm_cmpeq_ps(m_new, ninf));
        let rescale = _mm256_castps256_ps128(exp256(_mm256_castps128_ps256(_mm_sub_ps(m_old, m_ref))));
        let corr = _mm_blendv_ps(rescale, _mm_set1_ps(1.0), keep);
        let (sum, _) = exp_pass(sc, p, t0, t1, &masks, m_ref);
        _mm_storeu_ps(m.as_mut_ptr(), m_new);
        _mm_storeu_ps(l.as_mut_ptr(), _mm_fmadd_ps(l_old, corr, sum));
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
