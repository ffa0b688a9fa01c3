//! AVX2 + FMA + F16C row kernels for Q4_0, Q4_1 and Q8_0 weights × Q8 activations.
//!
//! Per 32-value block (as llama.cpp): unpack the 4-bit codes to 32 unsigned bytes,
//! `_mm256_maddubs_epi16` against the signed activation codes (u8 × i8 → pairs of i16; no
//! saturation: |15·127·2| and |127·127·2| < 2^15), `_mm256_madd_epi16` with ones → 8 × i32,
//! convert and FMA with the block's combined scale `d_w · d_x`.
//! The offset terms (`m_w` of Q4_1, `-8 d_w` of Q4_0) multiply `d_x Σq_x`, so the two scales
//! `[d_w, off_w]` meet `[d_x, d_x Σq_x]` in one 2-lane multiply per block; lane 1 accumulates
//! the offsets and lane 0 feeds the FMA.
//! Each weight block is unpacked once and used for up to four activation rows (`NJ`).

use super::blocks::QK;
use super::matmul::Acts;
use std::arch::x86_64::*;

/// Horizontal sum of 8 lanes.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
pub(super) unsafe fn hsum(v: __m256) -> f32 {
    let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    let s = _mm_add_ss(s, _mm_movehdup_ps(s));
    _mm_cvtss_f32(s)
}

/// Two f16 values at `p` (little-endian) as f32 lanes 0 and 1.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn load_2xf16(p: *const u8) -> __m128 {
    _mm_cvtph_ps(_mm_cvtsi32_si128(std::ptr::read_unaligned(p as *const i32)))
}

/// The 32 4-bit codes of `qs[16]` as bytes: low nibbles (values 0..16) then high nibbles.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn unpack_nibbles(qs: *const u8) -> __m256i {
    let q = _mm_loadu_si128(qs as *const __m128i);
    let both = _mm256_set_m128i(_mm_srli_epi16(q, 4), q);
    _mm256_and_si256(both, _mm256_set1_epi8(0x0F))
}

/// The block header as `[d_w, off_w, _, _]`: Q4_1 `[d, m]`, Q4_0 `[d, -8 d]`.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn header_scales<const Q4_1: bool>(blk: *const u8) -> __m128 {
    if Q4_1 {
        load_2xf16(blk)
    } else {
        let d = _mm_cvtph_ps(_mm_cvtsi32_si128(std::ptr::read_unaligned(blk as *const u16) as i32));
        _mm_mul_ps(_mm_broadcastss_ps(d), _mm_setr_ps(1.0, -8.0, 0.0, 0.0))
    }
}

/// Shared body of Q4_0/Q4_1 (`Q4_1` selects the format: block size and header).
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn nibble_rows<const NJ: usize, const Q4_1: bool>(w: &[u8], a: &Acts, j0: usize, out: &mut [f32; 4]) {
    let (block, qs_off) = if Q4_1 { (20, 4) } else { (18, 2) };
    let nb = a.k / QK;
    debug_assert!(w.len() == nb * block && a.q8_qs.len() >= (j0 + NJ) * a.k);
    let ones = _mm256_set1_epi16(1);
    let mut acc = [_mm256_setzero_ps(); NJ];
    let mut acc_off = [_mm_setzero_ps(); NJ];
    let wp = w.as_ptr();
    let ys = a.q8_qs.as_ptr().add(j0 * a.k);
    let ds = a.q8_ds.as_ptr().add(j0 * nb) as *const f64;
    for b in 0..nb {
        let blk = wp.add(b * block);
        let dw = header_scales::<Q4_1>(blk);
        let qw = unpack_nibbles(blk.add(qs_off));
        for t in 0..NJ {
            let y = _mm256_loadu_si256(ys.add(t * a.k + b * QK) as *const __m256i);
            let dx = _mm_castpd_ps(_mm_load_sd(ds.add(t * nb + b)));
            let prod = _mm_mul_ps(dw, dx); // [d_w d_x, off_w d_x Σq_x]
            acc_off[t] = _mm_add_ps(acc_off[t], prod);
            let p = _mm256_madd_epi16(_mm256_maddubs_epi16(qw, y), ones);
            acc[t] = _mm256_fmadd_ps(_mm256_broadcastss_ps(prod), _mm256_cvtepi32_ps(p), acc[t]);
        }
    }
    for t in 0..NJ {
        out[t] = hsum(acc[t]) + _mm_cvtss_f32(_mm_movehdup_ps(acc_off[t]));
    }
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q4_1_n<const NJ: usize>(w: &[u8], a: &Acts, j0: usize, out: &mut [f32; 4]) {
    nibble_rows::<NJ, true>(w, a, j0, out)
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q4_0_n<const NJ: usize>(w: &[u8], a: &Acts, j0: usize, out: &mut [f32; 4]) {
    nibble_rows::<NJ, false>(w, a, j0, out)
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q8_0_n<const NJ: usize>(w: &[u8], a: &Acts, j0: usize, out: &mut [f32; 4]) {
    const BLOCK: usize = 34;
    let nb = a.k / QK;
    debug_assert!(w.len() == nb * BLOCK && a.q8_qs.len() >= (j0 + NJ) * a.k);
    let ones = _mm256_set1_epi16(1);
    let mut acc = [_mm256_setzero_ps(); NJ];
    let wp = w.as_ptr();
    let ys = a.q8_qs.as_ptr().add(j0 * a.k);
    let ds = a.q8_ds.as_ptr().add(j0 * nb) as *const f32;
    for b in 0..nb {
        let blk = wp.add(b * BLOCK);
        let dw = _mm_cvtph_ps(_mm_cvtsi32_si128(std::ptr::read_unaligned(blk as *const u16) as i32));
        let qw = _mm256_loadu_si256(blk.add(2) as *const __m256i);
        // u8 × i8 trick: |w| × (y with w's sign).
        let aw = _mm256_sign_epi8(qw, qw);
        for t in 0..NJ {
            let y = _mm256_loadu_si256(ys.add(t * a.k + b * QK) as *const __m256i);
            let sy = _mm256_sign_epi8(y, qw);
            let p = _mm256_madd_epi16(_mm256_maddubs_epi16(aw, sy), ones);
            let d = _mm_mul_ss(dw, _mm_load_ss(ds.add(2 * (t * nb + b))));
            acc[t] = _mm256_fmadd_ps(_mm256_broadcastss_ps(d), _mm256_cvtepi32_ps(p), acc[t]);
        }
    }
    for t in 0..NJ {
        out[t] = hsum(acc[t]);
    }
}

macro_rules! dispatch_nj {
    ($name:ident, $inner:ident) => {
        /// Row kernel (see [`RowFn`](super::matmul::RowFn)); requires AVX2, FMA and F16C.
        pub(super) unsafe fn $name(w: &[u8], a: &Acts, j0: usize, nj: usize, out: &mut [f32; 4]) {
            match nj {
                1 => $inner::<1>(w, a, j0, out),
                2 => $inner::<2>(w, a, j0, out),
                3 => $inner::<3>(w, a, j0, out),
                _ => $inner::<4>(w, a, j0, out),
            }
        }
    };
}
pub(super) use dispatch_nj;

dispatch_nj!(q4_0, q4_0_n);
dispatch_nj!(q4_1, q4_1_n);
dispatch_nj!(q8_0, q8_0_n);
