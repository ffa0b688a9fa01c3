//! Sixteen f32 lanes, the width of ggml's AVX-512 accumulators, on two instruction sets
//! ([`Lanes16`]): [`Zmm`] (one AVX-512 register) and [`YmmPair`] (two AVX2 registers, lanes
//! 0–7 and 8–15). Every operation rounds exactly as the scalar code of `super::super` (`ggml/mod.rs`)
//! does lane by lane, so a kernel written once over [`Lanes16`] gives the same bits on both.
//!
//! The one non-elementwise operation is GCC's `_mm512_reduce_add_ps` tree (`ggml::reduce16`):
//! lanes `(i, i+8)`, then `(i, i+4)`, `(i, i+2)`, `(0, 1)`. [`Lanes16::reduce`] applies it to one
//! vector; [`Lanes16::reduce_transposed`] applies it to sixteen vectors at once and returns their
//! sums as the lanes of one vector (shuffles that keep each pairing, so lane `j` of the result is
//! bit-identical to `reduce16(x[j])`). The first level of the tree goes through
//! [`Lanes16::fold_half`] so the AVX2 form can take it as soon as a vector is complete (its two
//! halves are exactly the pairs `(i, i+8)`) and keep sixteen half-width values, not sixteen
//! register pairs, live.
//!
//! All functions are `unsafe` and `#[inline(always)]`: they must be inlined into a function
//! compiled for the instruction set ([`Zmm`]: AVX-512F with AVX2, FMA, F16C; [`YmmPair`]: AVX2,
//! FMA, F16C) on a CPU that has it.

use std::arch::x86_64::*;

use crate::expf::{expf_avx2, expf_avx512};

/// Sixteen f32 lanes and the operations the ggml-order kernels need.
pub(crate) trait Lanes16: Copy {
    /// A vector after the first level of the reduction tree (`x[i] + x[i+8]`, or the vector
    /// itself when the instruction set takes that level later).
    type Half: Copy;

    unsafe fn zero() -> Self;
    unsafe fn splat(x: f32) -> Self;
    /// Loads 16 f32 (unaligned).
    unsafe fn load(p: *const f32) -> Self;
    unsafe fn store(self, p: *mut f32);
    /// Loads 16 f16 (unaligned) as f32 (exact).
    unsafe fn load_f16(p: *const u16) -> Self;
    unsafe fn add(self, b: Self) -> Self;
    unsafe fn mul(self, b: Self) -> Self;
    /// `a·b + c`, rounded once.
    unsafe fn fma(a: Self, b: Self, c: Self) -> Self;
    unsafe fn max(self, b: Self) -> Self;
    /// Each lane rounded to f16 (to nearest, ties to even) and back.
    unsafe fn round_f16(self) -> Self;
    /// `crate::expf::expf` on each lane.
    unsafe fn expf(self) -> Self;
    /// `ggml::reduce16` of the lanes.
    unsafe fn reduce(self) -> f32;
    /// The largest lane (NaN-free input).
    unsafe fn max_lane(self) -> f32;
    /// The first level of [`Self::reduce`]'s tree, or nothing (see the module docs).
    unsafe fn fold_half(self) -> Self::Half;
    /// Stores a [`Self::Half`] at `p` (16 floats of room).
    unsafe fn store_half(h: Self::Half, p: *mut f32);
    /// Loads what [`Self::store_half`] stored.
    unsafe fn load_half(p: *const f32) -> Self::Half;
    /// Lane `j` = `reduce16` of the vector `x[j]` was folded from.
    unsafe fn reduce_transposed(x: &[Self::Half; 16]) -> Self;
}

/// One AVX-512 register.
#[derive(Clone, Copy)]
pub(crate) struct Zmm(__m512);

/// Two AVX2 registers: lanes 0–7, lanes 8–15.
#[derive(Clone, Copy)]
pub(crate) struct YmmPair(__m256, __m256);

impl Lanes16 for Zmm {
    type Half = __m512;

    #[inline(always)]
    unsafe fn zero() -> Self {
        Zmm(_mm512_setzero_ps())
    }
    #[inline(always)]
    unsafe fn splat(x: f32) -> Self {
        Zmm(_mm512_set1_ps(x))
    }
    #[inline(always)]
    unsafe fn load(p: *const f32) -> Self {
        unsafe { Zmm(_mm512_loadu_ps(p)) }
    }
    #[inline(always)]
    unsafe fn store(self, p: *mut f32) {
        unsafe { _mm512_storeu_ps(p, self.0) }
    }
    #[inline(always)]
    unsafe fn load_f16(p: *const u16) -> Self {
        unsafe { Zmm(_mm512_cvtph_ps(_mm256_loadu_si256(p.cast()))) }
    }
    #[inline(always)]
    unsafe fn add(self, b: Self) -> Self {
        Zmm(_mm512_add_ps(self.0, b.0))
    }
    #[inline(always)]
    unsafe fn mul(self, b: Self) -> Self {
        Zmm(_mm512_mul_ps(self.0, b.0))
    }
    #[inline(always)]
    unsafe fn fma(a: Self, b: Self, c: Self) -> Self {
        Zmm(_mm512_fmadd_ps(a.0, b.0, c.0))
    }
    #[inline(always)]
    unsafe fn max(self, b: Self) -> Self {
        Zmm(_mm512_max_ps(self.0, b.0))
    }
    #[inline(always)]
    unsafe fn round_f16(self) -> Self {
        Zmm(_mm512_cvtph_ps(_mm512_cvtps_ph::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(self.0)))
    }
    #[inline(always)]
    unsafe fn expf(self) -> Self {
        unsafe { Zmm(expf_avx512(self.0)) }
    }
    #[inline(always)]
    unsafe fn reduce(self) -> f32 {
        let x = self.0;
        let hi = _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(x)));
        let y = _mm256_add_ps(_mm512_castps512_ps256(x), hi); // (i, i+8)
        unsafe { reduce8(y) }
    }
    #[inline(always)]
    unsafe fn max_lane(self) -> f32 {
        _mm512_reduce_max_ps(self.0)
    }
    #[inline(always)]
    unsafe fn fold_half(self) -> __m512 {
        self.0
    }
    #[inline(always)]
    unsafe fn store_half(h: __m512, p: *mut f32) {
        unsafe { _mm512_storeu_ps(p, h) }
    }
    #[inline(always)]
    unsafe fn load_half(p: *const f32) -> __m512 {
        unsafe { _mm512_loadu_ps(p) }
    }
    #[inline(always)]
    unsafe fn reduce_transposed(x: &[__m512; 16]) -> Self {
        // Level 1, (i, i+8): y[k] = [fold of x[2k] (8 lanes) | fold of x[2k+1]].
        let mut y = [_mm512_setzero_ps(); 8];
        for k in 0..8 {
            let (a, b) = (x[2 * k], x[2 * k + 1]);
            let u = _mm512_shuffle_f32x4::<0x44>(a, b); // quarters a0 a1 b0 b1
            let v = _mm512_shuffle_f32x4::<0xEE>(a, b); // quarters a2 a3 b2 b3
            y[k] = _mm512_add_ps(u, v);
        }
        // Level 2, (i, i+4): z[m] quarter q = position 4m + q.
        let mut z = [_mm512_setzero_ps(); 4];
        for m in 0..4 {
            let (a, b) = (y[2 * m], y[2 * m + 1]);
            let u = _mm512_shuffle_f32x4::<0x88>(a, b); // quarters 0 2 of a, 0 2 of b
            let v = _mm512_shuffle_f32x4::<0xDD>(a, b); // quarters 1 3 of a, 1 3 of b
            z[m] = _mm512_add_ps(u, v);
        }
        // Level 3, (i, i+2): w[r] quarter q = [pos 8r+q lanes 0 1, pos 8r+4+q lanes 0 1].
        let mut w = [_mm512_setzero_ps(); 2];
        for r in 0..2 {
            let (a, b) = (z[2 * r], z[2 * r + 1]);
            let u = _mm512_shuffle_ps::<0x44>(a, b);
            let v = _mm512_shuffle_ps::<0xEE>(a, b);
            w[r] = _mm512_add_ps(u, v);
        }
        // Level 4, (0, 1): lane 4q + k holds position 4k + q.
        let u = _mm512_shuffle_ps::<0x88>(w[0], w[1]);
        let v = _mm512_shuffle_ps::<0xDD>(w[0], w[1]);
        let s = _mm512_add_ps(u, v);
        let idx = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
        Zmm(_mm512_permutexvar_ps(idx, s))
    }
}

/// Levels 2–4 of the tree on eight lanes (`y[i] = x[i] + x[i+8]` already taken).
#[inline(always)]
unsafe fn reduce8(y: __m256) -> f32 {
    let z = _mm_add_ps(_mm256_castps256_ps128(y), _mm256_extractf128_ps::<1>(y)); // (i, i+4)
    let w = _mm_add_ps(z, _mm_movehl_ps(z, z)); // (i, i+2)
    _mm_cvtss_f32(_mm_add_ss(w, _mm_movehdup_ps(w))) // (0, 1)
}

impl Lanes16 for YmmPair {
    type Half = __m256;

    #[inline(always)]
    unsafe fn zero() -> Self {
        YmmPair(_mm256_setzero_ps(), _mm256_setzero_ps())
    }
    #[inline(always)]
    unsafe fn splat(x: f32) -> Self {
        YmmPair(_mm256_set1_ps(x), _mm256_set1_ps(x))
    }
    #[inline(always)]
    unsafe fn load(p: *const f32) -> Self {
        unsafe { YmmPair(_mm256_loadu_ps(p), _mm256_loadu_ps(p.add(8))) }
    }
    #[inline(always)]
    unsafe fn store(self, p: *mut f32) {
        unsafe {
            _mm256_storeu_ps(p, self.0);
            _mm256_storeu_ps(p.add(8), self.1);
        }
    }
    #[inline(always)]
    unsafe fn load_f16(p: *const u16) -> Self {
        unsafe {
            YmmPair(_mm256_cvtph_ps(_mm_loadu_si128(p.cast())), _mm256_cvtph_ps(_mm_loadu_si128(p.add(8).cast())))
        }
    }
    #[inline(always)]
    unsafe fn add(self, b: Self) -> Self {
        YmmPair(_mm256_add_ps(self.0, b.0), _mm256_add_ps(self.1, b.1))
    }
    #[inline(always)]
    unsafe fn mul(self, b: Self) -> Self {
        YmmPair(_mm256_mul_ps(self.0, b.0), _mm256_mul_ps(self.1, b.1))
    }
    #[inline(always)]
    unsafe fn fma(a: Self, b: Self, c: Self) -> Self {
        YmmPair(_mm256_fmadd_ps(a.0, b.0, c.0), _mm256_fmadd_ps(a.1, b.1, c.1))
    }
    #[inline(always)]
    unsafe fn max(self, b: Self) -> Self {
        YmmPair(_mm256_max_ps(self.0, b.0), _mm256_max_ps(self.1, b.1))
    }
    #[inline(always)]
    unsafe fn round_f16(self) -> Self {
        const RNE: i32 = _MM_FROUND_TO_NEAREST_INT;
        YmmPair(_mm256_cvtph_ps(_mm256_cvtps_ph::<RNE>(self.0)), _mm256_cvtph_ps(_mm256_cvtps_ph::<RNE>(self.1)))
    }
    #[inline(always)]
    unsafe fn expf(self) -> Self {
        unsafe { YmmPair(expf_avx2(self.0), expf_avx2(self.1)) }
    }
    #[inline(always)]
    unsafe fn reduce(self) -> f32 {
        unsafe { reduce8(_mm256_add_ps(self.0, self.1)) }
    }
    #[inline(always)]
    unsafe fn max_lane(self) -> f32 {
        let m = _mm256_max_ps(self.0, self.1);
        let m = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps::<1>(m));
        let m = _mm_max_ps(m, _mm_movehl_ps(m, m));
        _mm_cvtss_f32(_mm_max_ss(m, _mm_movehdup_ps(m)))
    }
    #[inline(always)]
    unsafe fn fold_half(self) -> __m256 {
        _mm256_add_ps(self.0, self.1) // (i, i+8)
    }
    #[inline(always)]
    unsafe fn store_half(h: __m256, p: *mut f32) {
        unsafe { _mm256_storeu_ps(p, h) }
    }
    #[inline(always)]
    unsafe fn load_half(p: *const f32) -> __m256 {
        unsafe { _mm256_loadu_ps(p) }
    }
    #[inline(always)]
    unsafe fn reduce_transposed(y: &[__m256; 16]) -> Self {
        // Level 2, (i, i+4): z[m] half h = position 2m + h.
        let mut z = [_mm256_setzero_ps(); 8];
        for m in 0..8 {
            let (a, b) = (y[2 * m], y[2 * m + 1]);
            z[m] = _mm256_add_ps(_mm256_permute2f128_ps::<0x20>(a, b), _mm256_permute2f128_ps::<0x31>(a, b));
        }
        // Level 3, (i, i+2): w[r] half h = [pos 4r+h lanes 0 1, pos 4r+2+h lanes 0 1].
        let mut w = [_mm256_setzero_ps(); 4];
        for r in 0..4 {
            let (a, b) = (z[2 * r], z[2 * r + 1]);
            w[r] = _mm256_add_ps(_mm256_shuffle_ps::<0x44>(a, b), _mm256_shuffle_ps::<0xEE>(a, b));
        }
        // Level 4, (0, 1): s[k] lane 4h + i holds position 8k + 2i + h.
        let idx = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
        let mut s = [_mm256_setzero_ps(); 2];
        for k in 0..2 {
            let (a, b) = (w[2 * k], w[2 * k + 1]);
            let r = _mm256_add_ps(_mm256_shuffle_ps::<0x88>(a, b), _mm256_shuffle_ps::<0xDD>(a, b));
            s[k] = _mm256_permutevar8x32_ps(r, idx);
        }
        YmmPair(s[0], s[1])
    }
}
