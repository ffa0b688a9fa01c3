//! Fused 8-lane readers of one stored head vector per KV codec: chunk `k` of a row is 16 values,
//! returned as two 8-lane f32 vectors **without** the group scale, together with the head
//! dimensions they belong to ([`RowCodec::dims`]). The kernels apply the scales: the QK kernel
//! multiplies the key chunk by its group scale, the PV kernel folds value scales into the
//! softmax weights (one multiply per token and group instead of one per 8 values).
//!
//! Each reader computes exactly the scalar decoders of `kvcache::format` up to the scale
//! (`c` for q8, `nibble - 8` for q4, `level[code]` for Lloyd–Max; floats converted exactly),
//! so `scale · raw` is the decoded value bit for bit.
//!
//! Chunk layouts (head_dim `d`, a multiple of 16; scale groups of 32 values, the last one
//! possibly 16):
//! - f32 / f16 / bf16 / q8 / Lloyd–Max: values `16k .. 16k+16`, in order.
//! - q4: byte `j` of a group holds value `j` (low nibble) and `j + len/2` (high nibble), so
//!   chunk `k` (group `k/2`, `j0 = 8·(k%2)`) is values `32g+j0 ..+8` and `32g+len/2+j0 ..+8`,
//!   both from the 8 bytes at `16g + j0`.

use std::arch::x86_64::*;

use kvcache::format::lloyd_max::codebook;

/// One codec's fused 8-lane reader. Methods are `#[inline(always)]` and called only from
/// kernels compiled with (at least) `#[target_feature(enable = "avx2,fma,f16c")]`.
pub(crate) trait RowCodec: Copy {
    /// Values carry per-group f16 scales (quantized codecs).
    const SCALED: bool;

    /// The QK kernel scales keys through [`Self::scaled`] / [`Self::chunk_scaled`] (prepared
    /// once per token and group) instead of multiplying each decoded chunk by the scale.
    const FOLDS_SCALE: bool = false;

    /// Values carry one scale per 8 (sub-scaled Lloyd–Max, [`SubScaled`]) instead of per 32:
    /// the PV kernel multiplies each half of a chunk by its own scale.
    const SUB_SCALED: bool = false;

    /// Head dimensions `(a, b)` of the two 8-value halves of chunk `k`.
    #[inline(always)]
    fn dims(k: usize, _d: usize) -> (usize, usize) {
        (16 * k, 16 * k + 8)
    }

    /// The two halves of chunk `k` of the row at `row` (unscaled).
    ///
    /// # Safety
    /// `row` points to a whole stored head vector of the reader's `head_dim`; `k < head_dim/16`;
    /// AVX2, FMA and F16C are available.
    unsafe fn chunk(&self, row: *const u8, k: usize) -> (__m256, __m256);

    /// What [`Self::chunk_scaled`] needs to decode one group's chunks times scale `s` (by
    /// default the broadcast scale), prepared once per (token, group).
    ///
    /// # Safety
    /// As [`Self::chunk`].
    #[inline(always)]
    unsafe fn scaled(&self, s: *const f32) -> Scaled {
        // SAFETY: `s` is readable; AVX per the caller.
        unsafe { Scaled(_mm256_broadcast_ss(&*s), _mm256_setzero_ps()) }
    }

    /// Chunk `k` times its group scale, `scaled` being [`Self::scaled`] of that scale: the
    /// values of `chunk(row, k)` multiplied by the scale, bit for bit.
    ///
    /// # Safety
    /// As [`Self::chunk`].
    #[inline(always)]
    unsafe fn chunk_scaled(&self, scaled: &Scaled, row: *const u8, k: usize) -> (__m256, __m256) {
        // SAFETY: forwarded contract.
        unsafe {
            let (x0, x1) = self.chunk(row, k);
            (_mm256_mul_ps(x0, scaled.0), _mm256_mul_ps(x1, scaled.0))
        }
    }
}

/// A codec's per-(token, group) state for scaled chunks: the broadcast scale, or (for
/// [`Q4LutRow`]) its table of `scale · (nibble - 8)`.
#[derive(Clone, Copy)]
pub(crate) struct Scaled(__m256, __m256);

#[derive(Clone, Copy)]
pub(crate) struct F32Row;

#[derive(Clone, Copy)]
pub(crate) struct F16Row;

#[derive(Clone, Copy)]
pub(crate) struct Bf16Row;

#[derive(Clone, Copy)]
pub(crate) struct Q8Row;

#[derive(Clone, Copy)]
pub(crate) struct Q4Row;

impl RowCodec for F32Row {
    const SCALED: bool = false;

    #[inline(always)]
    unsafe fn chunk(&self, row: *const u8, k: usize) -> (__m256, __m256) {
        // SAFETY: values 16k..16k+16 lie in the row (caller's contract).
        unsafe {
            let p = row.cast::<f32>().add(16 * k);
            (_mm256_loadu_ps(p), _mm256_loadu_ps(p.add(8)))
        }
    }
}

impl RowCodec for F16Row {
    const SCALED: bool = false;

    #[inline(always)]
    unsafe fn chunk(&self, row: *const u8, k: usize) -> (__m256, __m256) {
        // SAFETY: values 16k..16k+16 (32 bytes) lie in the row.
        unsafe {
            let p = row.cast::<u16>().add(16 * k);
            (_mm256_cvtph_ps(_mm_loadu_si128(p.cast())), _mm256_cvtph_ps(_mm_loadu_si128(p.add(8).cast())))
        }
    }
}

impl RowCodec for Bf16Row {
    const SCALED: bool = false;

    #[inline(always)]
    unsafe fn chunk(&self, row: *const u8, k: usize) -> (__m256, __m256) {
        // SAFETY: values 16k..16k+16 (32 bytes) lie in the row.
        unsafe {
            let p = row.cast::<u16>().add(16 * k);
            (bf16_widen(_mm_loadu_si128(p.cast())), bf16_widen(_mm_loadu_si128(p.add(8).cast())))
        }
    }
}

/// Eight bf16 values as f32 (the bits shifted into the high half).
#[inline(always)]
unsafe fn bf16_widen(h: __m128i) -> __m256 {
    // SAFETY: AVX2 per the caller.
    unsafe { _mm256_castsi256_ps(_mm256_slli_epi32::<16>(_mm256_cvtepu16_epi32(h))) }
}

impl RowCodec for Q8Row {
    const SCALED: bool = true;

    #[inline(always)]
    unsafe fn chunk(&self, row: *const u8, k: usize) -> (__m256, __m256) {
        // SAFETY: codes 16k..16k+16 lie in the row (one byte per value).
        unsafe {
            let p = row.add(16 * k);
            let a = _mm256_cvtepi8_epi32(_mm_loadl_epi64(p.cast()));
            let b = _mm256_cvtepi8_epi32(_mm_loadl_epi64(p.add(8).cast()));
            (_mm256_cvtepi32_ps(a), _mm256_cvtepi32_ps(b))
        }
    }
}

impl RowCodec for Q4Row {
    const SCALED: bool = true;

    #[inline(always)]
    fn dims(k: usize, d: usize) -> (usize, usize) {
        let g = k / 2;
        let half = 16.min((d - 32 * g) / 2);
        let j0 = 8 * (k % 2);
        (32 * g + j0, 32 * g + half + j0)
    }

    #[inline(always)]
    unsafe fn chunk(&self, row: *const u8, k: usize) -> (__m256, __m256) {
        // SAFETY: chunk k's 8 bytes (16g + j0 ..+8) lie in the row of d/2 bytes.
        unsafe {
            let x = _mm256_cvtepu8_epi32(_mm_loadl_epi64(row.add(16 * (k / 2) + 8 * (k % 2)).cast()));
            let eight = _mm256_set1_epi32(8);
            let lo = _mm256_sub_epi32(_mm256_and_si256(x, _mm256_set1_epi32(0xF)), eight);
            let hi = _mm256_sub_epi32(_mm256_srli_epi32::<4>(x), eight);
            (_mm256_cvtepi32_ps(lo), _mm256_cvtepi32_ps(hi))
        }
    }
}

/// q4 for AVX-512F/VL kernels: a nibble indexes the 16-entry table of `nibble - 8` with one
/// `vpermt2ps`, which reads only the index's low four bits (no mask, no subtract, no
/// int-to-float conversion): four operations per 16 values instead of seven. Same chunk layout
/// and values as [`Q4Row`].
#[derive(Clone, Copy)]
pub(crate) struct Q4LutRow {
    /// `nibble - 8` for nibbles 0..8.
    lo: __m256,
    /// `nibble - 8` for nibbles 8..16.
    hi: __m256,
}

impl Q4LutRow {
    /// # Safety
    /// AVX must be available (and AVX-512F/VL wherever [`RowCodec::chunk`] is called).
    #[inline(always)]
    pub unsafe fn new() -> Self {
        // SAFETY: AVX per the caller.
        unsafe {
            Q4LutRow {
                lo: _mm256_setr_ps(-8.0, -7.0, -6.0, -5.0, -4.0, -3.0, -2.0, -1.0),
                hi: _mm256_setr_ps(0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0),
            }
        }
    }
}

impl RowCodec for Q4LutRow {
    const SCALED: bool = true;
    const FOLDS_SCALE: bool = true;

    #[inline(always)]
    fn dims(k: usize, d: usize) -> (usize, usize) {
        Q4Row::dims(k, d)
    }

    #[inline(always)]
    unsafe fn chunk(&self, row: *const u8, k: usize) -> (__m256, __m256) {
        // SAFETY: chunk k's 8 bytes (16g + j0 ..+8) lie in the row of d/2 bytes; AVX-512F/VL
        // per the caller (the kernels of the AVX-512 set are the only users).
        unsafe {
            let x = _mm256_cvtepu8_epi32(_mm_loadl_epi64(row.add(16 * (k / 2) + 8 * (k % 2)).cast()));
            let lo = _mm256_permutex2var_ps(self.lo, x, self.hi);
            let hi = _mm256_permutex2var_ps(self.lo, _mm256_srli_epi32::<4>(x), self.hi);
            (lo, hi)
        }
    }

    /// The table times the scale: two multiplies per group and token instead of one per 8
    /// decoded values.
    #[inline(always)]
    unsafe fn scaled(&self, s: *const f32) -> Scaled {
        // SAFETY: `s` is readable; AVX per the caller.
        unsafe {
            let s = _mm256_broadcast_ss(&*s);
            Scaled(_mm256_mul_ps(self.lo, s), _mm256_mul_ps(self.hi, s))
        }
    }

    #[inline(always)]
    unsafe fn chunk_scaled(&self, scaled: &Scaled, row: *const u8, k: usize) -> (__m256, __m256) {
        // SAFETY: as `chunk`.
        unsafe {
            let x = _mm256_cvtepu8_epi32(_mm_loadl_epi64(row.add(16 * (k / 2) + 8 * (k % 2)).cast()));
            let lo = _mm256_permutex2var_ps(scaled.0, x, scaled.1);
            let hi = _mm256_permutex2var_ps(scaled.0, _mm256_srli_epi32::<4>(x), scaled.1);
            (lo, hi)
        }
    }
}

/// Lloyd–Max codes of `B` ∈ {2, 3, 4} bits: 8 values fill `B` bytes of a little-endian bit
/// stream; a code indexes a 16-entry level table with `vpermps` (two and a blend for 4 bits).
#[derive(Clone, Copy)]
pub(crate) struct LloydMaxRow<const B: usize> {
    /// Levels 0..8.
    lo: __m256,
    /// Levels 8..16 (4-bit codes only).
    hi: __m256,
    /// `[0, B, 2B, …, 7B]`
    shifts: __m256i,
    /// Head dimension (the last 8 values of a row are read without over-reading).
    d: usize,
}

impl<const B: usize> LloydMaxRow<B> {
    /// # Safety
    /// AVX2 must be available.
    #[inline(always)]
    pub unsafe fn new(d: usize) -> Self {
        let levels = &codebook(B as u8).levels;
        let mut lut = [0f32; 16];
        for (o, l) in lut.iter_mut().zip(levels) {
            *o = *l;
        }
        let b = B as i32;
        // SAFETY: AVX2 per the caller; lut has 16 values.
        unsafe {
            LloydMaxRow {
                lo: _mm256_loadu_ps(lut.as_ptr()),
                hi: _mm256_loadu_ps(lut.as_ptr().add(8)),
                shifts: _mm256_setr_epi32(0, b, 2 * b, 3 * b, 4 * b, 5 * b, 6 * b, 7 * b),
                d,
            }
        }
    }

    /// Levels of the 8 codes whose `B` bytes start at `p`; `exact` forbids reading past them.
    #[inline(always)]
    unsafe fn eight(&self, p: *const u8, exact: bool) -> __m256 {
        // SAFETY: reads B bytes at p (4 when !exact, which the caller allows).
        unsafe {
            let word = if exact && B < 4 {
                let mut w = 0i32;
                for i in 0..B {
                    w |= (*p.add(i) as i32) << (8 * i);
                }
                _mm256_set1_epi32(w)
            } else {
                _mm256_set1_epi32(p.cast::<i32>().read_unaligned())
            };
            let idx = _mm256_and_si256(_mm256_srlv_epi32(word, self.shifts), _mm256_set1_epi32((1 << B) - 1));
            let lo = _mm256_permutevar8x32_ps(self.lo, idx);
            if B == 4 {
                let hi = _mm256_permutevar8x32_ps(self.hi, idx);
                _mm256_blendv_ps(lo, hi, _mm256_castsi256_ps(_mm256_slli_epi32::<28>(idx)))
            } else {
                lo
            }
        }
    }
}

impl<const B: usize> RowCodec for LloydMaxRow<B> {
    const SCALED: bool = true;

    #[inline(always)]
    unsafe fn chunk(&self, row: *const u8, k: usize) -> (__m256, __m256) {
        // SAFETY: chunk k is 2B bytes at 2Bk; only the row's last 8 codes need exact reads.
        unsafe {
            let p = row.add(2 * B * k);
            let last = 16 * (k + 1) == self.d;
            (self.eight(p, false), self.eight(p.add(B), last))
        }
    }
}

/// A reader whose rows carry one scale per 8 values (`kvcache::Codec::LloydMaxSub`): the same
/// codes as `R`'s, only the scale plane differs, which the tile driver expands (the scale of the
/// 8 values at `a` is `D · q` of sub-group `a / 8`).
#[derive(Clone, Copy)]
pub(crate) struct SubScaled<R>(pub R);

impl<R: RowCodec> RowCodec for SubScaled<R> {
    const SCALED: bool = true;
    const SUB_SCALED: bool = true;

    #[inline(always)]
    fn dims(k: usize, d: usize) -> (usize, usize) {
        R::dims(k, d)
    }

    #[inline(always)]
    unsafe fn chunk(&self, row: *const u8, k: usize) -> (__m256, __m256) {
        // SAFETY: forwarded contract.
        unsafe { self.0.chunk(row, k) }
    }
}

/// 8-bit Lloyd–Max codes: one byte per value, levels gathered from the 256-entry table.
#[derive(Clone, Copy)]
pub(crate) struct LloydMax8Row {
    levels: *const f32,
}

impl LloydMax8Row {
    pub fn new() -> Self {
        let levels = &codebook(8).levels;
        debug_assert_eq!(levels.len(), 256);
        LloydMax8Row { levels: levels.as_ptr() }
    }
}

impl RowCodec for LloydMax8Row {
    const SCALED: bool = true;

    #[inline(always)]
    unsafe fn chunk(&self, row: *const u8, k: usize) -> (__m256, __m256) {
        // SAFETY: codes 16k..16k+16 lie in the row; every byte indexes the 256 levels.
        unsafe {
            let p = row.add(16 * k);
            let a = _mm256_cvtepu8_epi32(_mm_loadl_epi64(p.cast()));
            let b = _mm256_cvtepu8_epi32(_mm_loadl_epi64(p.add(8).cast()));
            (_mm256_i32gather_ps::<4>(self.levels, a), _mm256_i32gather_ps::<4>(self.levels, b))
        }
    }
}

#[cfg(test)]
mod tests {
    //! Every chunk reader against the scalar decoder of `kvcache` on fresh random head vectors,
    //! on each instruction set this CPU runs (the AVX-512 set reads q4 through [`Q4LutRow`]).

    use super::*;
    use half::f16;
    use kvcache::Codec;
    use rand::rngs::StdRng;
    use rand::{Rng, SeedableRng};
    use rand_distr::StandardNormal;

    /// Every chunk of `codec` (times its group's scale for scaled codecs) placed at its head
    /// dimensions: `out` (`[d]`) is what the kernels compute with.
    #[inline(always)]
    unsafe fn decode_row<K: RowCodec>(codec: &K, row: &[u8], scales: &[f32], d: usize, out: &mut [f32]) {
        let mut t = [0f32; 16];
        for k in 0..d / 16 {
            let (a, b) = K::dims(k, d);
            // SAFETY: the row holds a whole head vector of `d` values; the caller's ISA.
            unsafe {
                let (x0, x1) = codec.chunk(row.as_ptr(), k);
                _mm256_storeu_ps(t.as_mut_ptr(), x0);
                _mm256_storeu_ps(t.as_mut_ptr().add(8), x1);
            }
            let group = if K::SUB_SCALED { 8 } else { 32 };
            for i in 0..8 {
                let (sa, sb) = if K::SCALED { (scales[(a + i) / group], scales[(b + i) / group]) } else { (1.0, 1.0) };
                out[a + i] = t[i] * sa;
                out[b + i] = t[8 + i] * sb;
            }
            // The scaled reader serves keys, which are never sub-scaled.
            if K::SCALED && !K::SUB_SCALED {
                // The scaled reader gives the same products bit for bit.
                let mut u = [0f32; 16];
                // SAFETY: as above; the group's scale is readable.
                unsafe {
                    let (y0, y1) = codec.chunk_scaled(&codec.scaled(&scales[a / 32]), row.as_ptr(), k);
                    _mm256_storeu_ps(u.as_mut_ptr(), y0);
                    _mm256_storeu_ps(u.as_mut_ptr().add(8), y1);
                }
                for i in 0..8 {
                    assert_eq!(u[i].to_bits(), out[a + i].to_bits(), "scaled chunk {k} lane {i}");
                    assert_eq!(u[8 + i].to_bits(), out[b + i].to_bits(), "scaled chunk {k} lane {}", 8 + i);
                }
            }
        }
    }

    macro_rules! decode_with {
        ($name:ident, $feat:literal, $q4:expr) => {
            #[target_feature(enable = $feat)]
            unsafe fn $name(codec: Codec, row: &[u8], scales: &[f32], d: usize, out: &mut [f32]) {
                // SAFETY: forwarded contract; the features are enabled here.
                unsafe {
                    match codec {
                        Codec::F32 => decode_row(&F32Row, row, scales, d, out),
                        Codec::F16 => decode_row(&F16Row, row, scales, d, out),
                        Codec::Bf16 => decode_row(&Bf16Row, row, scales, d, out),
                        Codec::Q8 => decode_row(&Q8Row, row, scales, d, out),
                        Codec::Q4 => decode_row(&$q4, row, scales, d, out),
                        Codec::LloydMax { bits: 2 } => decode_row(&LloydMaxRow::<2>::new(d), row, scales, d, out),
                        Codec::LloydMax { bits: 3 } => decode_row(&LloydMaxRow::<3>::new(d), row, scales, d, out),
                        Codec::LloydMax { bits: 4 } => decode_row(&LloydMaxRow::<4>::new(d), row, scales, d, out),
                        Codec::LloydMax { .. } => decode_row(&LloydMax8Row::new(), row, scales, d, out),
                        Codec::LloydMaxSub { bits: 2 } => {
                            decode_row(&SubScaled(LloydMaxRow::<2>::new(d)), row, scales, d, out)
                        }
                        Codec::LloydMaxSub { bits: 3 } => {
                            decode_row(&SubScaled(LloydMaxRow::<3>::new(d)), row, scales, d, out)
                        }
                        Codec::LloydMaxSub { .. } => {
                            decode_row(&SubScaled(LloydMaxRow::<4>::new(d)), row, scales, d, out)
                        }
                    }
                }
            }
        };
    }

    decode_with!(decode_avx2, "avx2,fma,f16c", Q4Row);
    decode_with!(decode_avx512, "avx512f,avx512vl,avx2,fma,f16c", Q4LutRow::new());

    #[test]
    fn chunks_match_the_scalar_decoder_on_every_isa() {
        let avx2 =
            is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma") && is_x86_feature_detected!("f16c");
        assert!(avx2, "the fast kernels need AVX2 + FMA + F16C");
        let avx512 = is_x86_feature_detected!("avx512f") && is_x86_feature_detected!("avx512vl");
        let codecs = [
            Codec::F32,
            Codec::F16,
            Codec::Bf16,
            Codec::Q8,
            Codec::Q4,
            Codec::LloydMax { bits: 2 },
            Codec::LloydMax { bits: 3 },
            Codec::LloydMax { bits: 4 },
            Codec::LloydMax { bits: 8 },
            Codec::LloydMaxSub { bits: 2 },
            Codec::LloydMaxSub { bits: 3 },
            Codec::LloydMaxSub { bits: 4 },
        ];
        let mut rng = StdRng::seed_from_u64(0xc0dec);
        for d in [16, 64, 80, 96, 128, 256] {
            for codec in codecs {
                for _ in 0..20 {
                    let amp: f32 = rng.gen_range(0.01..100.0);
                    let x: Vec<f32> = (0..d).map(|_| amp * rng.sample::<f32, _>(StandardNormal)).collect();
                    let mut codes = vec![0u8; codec.code_bytes(d)];
                    let mut scales = vec![f16::ZERO; codec.scales(d)];
                    codec.encode(&x, &mut codes, &mut scales);
                    let mut want = vec![0f32; d];
                    codec.decode(&codes, &scales, &mut want);
                    // f32 scales as the tile driver expands them: per 32 values, or `D · q`
                    // per 8 for sub-scaled codes.
                    let fscales: Vec<f32> = if let Codec::LloydMaxSub { .. } = codec {
                        (0..d / 8).map(|j| kvcache::format::turbo_sub::sub_scale(&scales, j)).collect()
                    } else {
                        scales.iter().map(|s| s.to_f32()).collect()
                    };
                    let mut got = vec![f32::NAN; d];
                    // SAFETY: AVX2/FMA/F16C checked above; the row is one whole head vector.
                    unsafe { decode_avx2(codec, &codes, &fscales, d, &mut got) };
                    assert_eq!(got, want, "{codec:?} d {d} on avx2");
                    if avx512 {
                        let mut got = vec![f32::NAN; d];
                        // SAFETY: AVX-512F/VL checked above.
                        unsafe { decode_avx512(codec, &codes, &fscales, d, &mut got) };
                        assert_eq!(got, want, "{codec:?} d {d} on avx512");
                    }
                }
            }
        }
    }
}
