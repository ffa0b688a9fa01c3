//! The value pass of the integer-key kernels ([`super::Int8Ops`]) in 512-bit vectors: q8 and
//! q4 values, head_dim a multiple of 64, AVX-512F.
//!
//! A pass holds 64 head dimensions (two scale groups of 32) of up to four rows in 16 `zmm`
//! accumulators and walks the tile's tokens once: per token, two groups decoded to four
//! vectors of 16 values and four FMAs a row, against the 256-bit pass's eight FMAs and twice
//! the decoding work a row for the same dimensions ([`super::kernels::accumulate`]).
//! Every accumulator lane sees the same products in the same order as there, so the two are
//! bit-identical.

use std::arch::x86_64::*;

use super::codecs::{Q4LutRow, Q8Row, RowCodec};
use crate::attention::tile::{NextRows, TILE};

/// A value codec decoded a scale group (32 values) at a time into two 512-bit vectors.
pub(crate) trait WideValues: RowCodec {
    /// Values `32g .. 32g + 16` and `32g + 16 .. 32g + 32` of the row at `row`, unscaled
    /// (the decoded codes of [`RowCodec::chunk`], bit for bit).
    ///
    /// # Safety
    /// `row` points to a whole stored head vector with more than `32g` values; AVX-512F.
    unsafe fn group(&self, row: *const u8, g: usize) -> (__m512, __m512);
}

impl WideValues for Q8Row {
    #[inline(always)]
    unsafe fn group(&self, row: *const u8, g: usize) -> (__m512, __m512) {
        // SAFETY: the group's 32 code bytes lie in the row (one byte per value).
        unsafe {
            let p = row.add(32 * g);
            let a = _mm512_cvtepi8_epi32(_mm_loadu_si128(p.cast()));
            let b = _mm512_cvtepi8_epi32(_mm_loadu_si128(p.add(16).cast()));
            (_mm512_cvtepi32_ps(a), _mm512_cvtepi32_ps(b))
        }
    }
}

impl WideValues for Q4LutRow {
    #[inline(always)]
    unsafe fn group(&self, row: *const u8, g: usize) -> (__m512, __m512) {
        // SAFETY: the group's 16 bytes lie in the row (byte j: value j low, j + 16 high).
        unsafe {
            // `nibble - 8`; `vpermps` reads only an index's low four bits.
            let table =
                _mm512_setr_ps(-8.0, -7.0, -6.0, -5.0, -4.0, -3.0, -2.0, -1.0, 0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0);
            let x = _mm512_cvtepu8_epi32(_mm_loadu_si128(row.add(16 * g).cast()));
            (_mm512_permutexvar_ps(x, table), _mm512_permutexvar_ps(_mm512_srli_epi32::<4>(x), table))
        }
    }
}

/// `acc[r] = acc[r]·corr[r] + Σ_t w_t[r]·v_t` over tokens `t0 .. t1` for `R` rows, 64 head
/// dimensions a pass.
///
/// `w`: weights of token `t`, row `r`, value group `g`: `w[t·wt + 4g + r]` (probabilities
/// times the group scales); `acc`: `[R, d]`. Prefetches `next`'s rows pass by pass.
///
/// # Safety
/// AVX-512F/VL; `d` a multiple of 64; `vrows[t0..t1]` valid value rows of head_dim `d`;
/// `w` and `acc` sized as documented; `t1 ≤ TILE`.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn accumulate<V: WideValues, const R: usize>(
    codec: &V,
    vrows: &[*const u8; TILE],
    t0: usize,
    t1: usize,
    w: *const f32,
    wt: usize,
    corr: &[f32; 4],
    d: usize,
    acc: *mut f32,
    next: &NextRows,
) {
    debug_assert!(d.is_multiple_of(64) && R <= 4 && t1 <= TILE);
    unsafe {
        // Code bytes of 64 values (rows are whole groups in order).
        let pass_bytes = next.bytes / (d / 64);
        for pass in 0..d / 64 {
            let (g0, o) = (2 * pass, 64 * pass);
            let mut a = [[_mm512_setzero_ps(); 4]; R];
            for (r, a) in a.iter_mut().enumerate() {
                let c = _mm512_set1_ps(corr[r]);
                for (i, a) in a.iter_mut().enumerate() {
                    *a = _mm512_mul_ps(_mm512_loadu_ps(acc.add(r * d + o + 16 * i)), c);
                }
            }
            for t in t0..t1 {
                next.lines(t, pass * pass_bytes, (pass + 1) * pass_bytes);
                let row = *vrows.get_unchecked(t);
                let (x0, x1) = codec.group(row, g0);
                let (x2, x3) = codec.group(row, g0 + 1);
                let wr = w.add(t * wt + 4 * g0);
                for (r, a) in a.iter_mut().enumerate() {
                    let p0 = _mm512_set1_ps(*wr.add(r));
                    let p1 = _mm512_set1_ps(*wr.add(4 + r));
                    a[0] = _mm512_fmadd_ps(p0, x0, a[0]);
                    a[1] = _mm512_fmadd_ps(p0, x1, a[1]);
                    a[2] = _mm512_fmadd_ps(p1, x2, a[2]);
                    a[3] = _mm512_fmadd_ps(p1, x3, a[3]);
                }
            }
            for (r, a) in a.iter().enumerate() {
                for (i, a) in a.iter().enumerate() {
                    _mm512_storeu_ps(acc.add(r * d + o + 16 * i), *a);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    //! The 512-bit pass against the 256-bit one ([`super::super::kernels::accumulate`], itself
    //! checked against the scalar reference through the tile driver's tests) on fresh random
    //! rows and weights: bit for bit, both codecs, every row count, head_dims 64 to 256, tile
    //! ranges that start and end inside the tile.

    use super::*;
    use crate::attention::simd::kernels;
    use crate::attention::tile::MAX_GROUPS;
    use rand::rngs::StdRng;
    use rand::{Rng, SeedableRng};

    #[target_feature(enable = "avx512f,avx512vl,avx2,fma,f16c")]
    #[allow(clippy::too_many_arguments)]
    unsafe fn both<V: WideValues>(
        codec: &V,
        rows: usize,
        vrows: &[*const u8; TILE],
        t0: usize,
        t1: usize,
        w: &[f32],
        corr: &[f32; 4],
        d: usize,
        acc: &[f32],
    ) -> (Vec<f32>, Vec<f32>) {
        let next = NextRows { rows: [std::ptr::null(); TILE], n: 0, bytes: 0 };
        let (mut wide, mut narrow) = (acc.to_vec(), acc.to_vec());
        let wt = 4 * d / 32;
        let (wp, vs) = (w.as_ptr(), std::ptr::null());
        // SAFETY: forwarded contract; buffers sized by the caller.
        unsafe {
            let (aw, an) = (wide.as_mut_ptr(), narrow.as_mut_ptr());
            match rows {
                1 => {
                    accumulate::<V, 1>(codec, vrows, t0, t1, wp, wt, corr, d, aw, &next);
                    kernels::accumulate::<V, 1, 2>(codec, vrows, vs, t0, t1, wp, wt, corr, d, an, &next);
                }
                2 => {
                    accumulate::<V, 2>(codec, vrows, t0, t1, wp, wt, corr, d, aw, &next);
                    kernels::accumulate::<V, 2, 2>(codec, vrows, vs, t0, t1, wp, wt, corr, d, an, &next);
                }
                3 => {
                    accumulate::<V, 3>(codec, vrows, t0, t1, wp, wt, corr, d, aw, &next);
                    kernels::accumulate::<V, 3, 2>(codec, vrows, vs, t0, t1, wp, wt, corr, d, an, &next);
                }
                _ => {
                    accumulate::<V, 4>(codec, vrows, t0, t1, wp, wt, corr, d, aw, &next);
                    kernels::accumulate::<V, 4, 2>(codec, vrows, vs, t0, t1, wp, wt, corr, d, an, &next);
                }
            }
        }
        (wide, narrow)
    }

    #[test]
    fn the_wide_value_pass_equals_the_256_bit_one_bit_for_bit() {
        if !(is_x86_feature_detected!("avx512f") && is_x86_feature_detected!("avx512vl")) {
            eprintln!("skipped: this CPU has no AVX-512F/VL");
            return;
        }
        let mut rng = StdRng::seed_from_u64(0x51de);
        for q4 in [false, true] {
            for d in [64, 128, 192, 256] {
                // Bytes of a stored row: one per value (q8), one per two (q4).
                let row_bytes = if q4 { d / 2 } else { d };
                let codes: Vec<u8> = (0..TILE * row_bytes).map(|_| rng.gen()).collect();
                let mut vrows = [std::ptr::null::<u8>(); TILE];
                for (t, r) in vrows.iter_mut().enumerate() {
                    *r = codes[t * row_bytes..].as_ptr();
                }
                for rows in 1..=4 {
                    for (t0, t1) in [(0, TILE), (0, 1), (3, 17), (5, TILE)] {
                        let w: Vec<f32> = (0..TILE * MAX_GROUPS * 4).map(|_| rng.gen_range(-0.01..0.05)).collect();
                        let acc: Vec<f32> = (0..rows * d).map(|_| rng.gen_range(-3.0..3.0)).collect();
                        let mut corr = [0f32; 4];
                        for c in &mut corr {
                            *c = rng.gen_range(0.0..1.0);
                        }
                        // SAFETY: AVX-512F/VL checked; rows of `row_bytes` for TILE tokens.
                        let (wide, narrow) = unsafe {
                            if q4 {
                                both(&Q4LutRow::new(), rows, &vrows, t0, t1, &w, &corr, d, &acc)
                            } else {
                                both(&Q8Row, rows, &vrows, t0, t1, &w, &corr, d, &acc)
                            }
                        };
                        for (i, (a, b)) in wide.iter().zip(&narrow).enumerate() {
                            assert_eq!(a.to_bits(), b.to_bits(), "q4 {q4} d {d} rows {rows} {t0}..{t1} at {i}");
                        }
                    }
                }
            }
        }
    }
}
