//! Fused AVX-512 readers of one stored head vector per KV codec: chunk `k` of a row is values
//! `16k .. 16k+16` in order, one 16-lane f32 vector **without** the group scale (the kernels
//! apply scales as the AVX2 ones do).
//!
//! Each reader computes exactly the scalar decoders of `kvcache::format` up to the scale:
//! q8 `c`, q4 `nibble - 8` and Lloyd–Max `level[code]` through a 16-entry `vpermps` table
//! (one instruction per 16 values), 8-bit Lloyd–Max by a gather from the 256 levels.
//! A q4 group of 32 values is 16 bytes, byte `j` holding value `j` (low nibble) and `j + 16`
//! (high nibble), so chunk `2g` is the low nibbles of group `g`'s bytes and chunk `2g + 1` the
//! high ones; a last group of 16 values (head_dim ≡ 16 mod 32) is 8 bytes, both halves in one
//! chunk.

use std::arch::x86_64::*;

use kvcache::format::lloyd_max::codebook;

/// One codec's fused 16-lane reader. Methods are `#[inline(always)]` and called only from
/// `#[target_feature(enable = "avx512f,avx2,fma,f16c")]` kernels.
pub(crate) trait RowCodec512: Copy {
    /// Values carry per-group f16 scales (quantized codecs).
    const SCALED: bool;

    /// Values `16k .. 16k+16` of the row at `row` (unscaled).
    ///
    /// # Safety
    /// `row` points to a whole stored head vector of the reader's head_dim; `k < head_dim/16`;
    /// AVX-512F, AVX2, FMA and F16C are available.
    unsafe fn chunk(&self, row: *const u8, k: usize) -> __m512;
}

#[derive(Clone, Copy)]
pub(crate) struct F32Row;

#[derive(Clone, Copy)]
pub(crate) struct F16Row;

#[derive(Clone, Copy)]
pub(crate) struct Bf16Row;

#[derive(Clone, Copy)]
pub(crate) struct Q8Row;

impl RowCodec512 for F32Row {
    const SCALED: bool = false;

    #[inline(always)]
    unsafe fn chunk(&self, row: *const u8, k: usize) -> __m512 {
        // SAFETY: values 16k..16k+16 lie in the row.
        unsafe { _mm512_loadu_ps(row.cast::<f32>().add(16 * k)) }
    }
}

impl RowCodec512 for F16Row {
    const SCALED: bool = false;

    #[inline(always)]
    unsafe fn chunk(&self, row: *const u8, k: usize) -> __m512 {
        // SAFETY: values 16k..16k+16 (32 bytes) lie in the row.
        unsafe { _mm512_cvtph_ps(_mm256_loadu_si256(row.cast::<u16>().add(16 * k).cast())) }
    }
}

impl RowCodec512 for Bf16Row {
    const SCALED: bool = false;

    #[inline(always)]
    unsafe fn chunk(&self, row: *const u8, k: usize) -> __m512 {
        // SAFETY: values 16k..16k+16 (32 bytes) lie in the row.
        unsafe {
            let h = _mm512_cvtepu16_epi32(_mm256_loadu_si256(row.cast::<u16>().add(16 * k).cast()));
            _mm512_castsi512_ps(_mm512_slli_epi32::<16>(h))
        }
    }
}

impl RowCodec512 for Q8Row {
    const SCALED: bool = true;

    #[inline(always)]
    unsafe fn chunk(&self, row: *const u8, k: usize) -> __m512 {
        // SAFETY: codes 16k..16k+16 lie in the row.
        unsafe { _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(row.add(16 * k).cast()))) }
    }
}

/// q4: nibbles index the table `[-8, -7, …, 7]`.
#[derive(Clone, Copy)]
pub(crate) struct Q4Row {
    lut: __m512,
    d: usize,
}

impl Q4Row {
    /// # Safety
    /// AVX-512F must be available.
    #[inline(always)]
    pub unsafe fn new(d: usize) -> Q4Row {
        let mut lut = [0f32; 16];
        for (i, v) in lut.iter_mut().enumerate() {
            *v = i as f32 - 8.0;
        }
        // SAFETY: AVX-512F per the caller.
        unsafe { Q4Row { lut: _mm512_loadu_ps(lut.as_ptr()), d } }
    }
}

impl RowCodec512 for Q4Row {
    const SCALED: bool = true;

    #[inline(always)]
    unsafe fn chunk(&self, row: *const u8, k: usize) -> __m512 {
        let g = k / 2;
        // SAFETY: group g's bytes (16, or 8 for a last group of 16 values) lie in the row.
        unsafe {
            let src = row.add(16 * g);
            let idx = if self.d - 32 * g >= 32 {
                // vpermps reads the low 4 bits of each index: the low nibble as is.
                let x = _mm512_cvtepu8_epi32(_mm_loadu_si128(src.cast()));
                if k % 2 == 0 {
                    x
                } else {
                    _mm512_srli_epi32::<4>(x)
                }
            } else {
                let x = _mm256_cvtepu8_epi32(_mm_loadl_epi64(src.cast()));
                _mm512_inserti64x4::<1>(_mm512_castsi256_si512(x), _mm256_srli_epi32::<4>(x))
            };
            _mm512_permutexvar_ps(idx, self.lut)
        }
    }
}

/// Lloyd–Max codes of `B` ∈ {2, 3, 4} bits: 16 values fill `2B` bytes of a little-endian bit
/// stream; the codes index the (zero-padded) 16-entry level table.
#[derive(Clone, Copy)]
pub(crate) struct LloydMaxRow<const B: usize> {
    levels: __m512,
    /// `[0, B, …, 7B, 0, B, …, 7B]`
    shifts: __m512i,
    /// Head dimension (the last 8 codes of a row are read without over-reading).
    d: usize,
}

impl<const B: usize> LloydMaxRow<B> {
    /// # Safety
    /// AVX-512F must be available.
    #[inline(always)]
    pub unsafe fn new(d: usize) -> Self {
        let mut lut = [0f32; 16];
        for (o, l) in lut.iter_mut().zip(&codebook(B as u8).levels) {
            *o = *l;
        }
        let mut shifts = [0i32; 16];
        for (i, s) in shifts.iter_mut().enumerate() {
            *s = (B * (i % 8)) as i32;
        }
        // SAFETY: AVX-512F per the caller; both arrays hold 16 values.
        unsafe {
            LloydMaxRow { levels: _mm512_loadu_ps(lut.as_ptr()), shifts: _mm512_loadu_si512(shifts.as_ptr().cast()), d }
        }
    }

    /// The `B` bytes of 8 codes at `p` as an integer; `exact` forbids reading past them.
    #[inline(always)]
    unsafe fn word(p: *const u8, exact: bool) -> i32 {
        // SAFETY: reads B bytes at p (4 when !exact, which the caller allows).
        unsafe {
            if exact && B < 4 {
                let mut w = 0i32;
                for i in 0..B {
                    w |= (*p.add(i) as i32) << (8 * i);
                }
                w
            } else {
                p.cast::<i32>().read_unaligned()
            }
        }
    }
}

impl<const B: usize> RowCodec512 for LloydMaxRow<B> {
    const SCALED: bool = true;

    #[inline(always)]
    unsafe fn chunk(&self, row: *const u8, k: usize) -> __m512 {
        // SAFETY: chunk k is 2B bytes at 2Bk; only the row's last 8 codes need exact reads.
        unsafe {
            let p = row.add(2 * B * k);
            let last = 16 * (k + 1) == self.d;
            let lo = _mm256_set1_epi32(Self::word(p, false));
            let hi = _mm256_set1_epi32(Self::word(p.add(B), last));
            let words = _mm512_inserti64x4::<1>(_mm512_castsi256_si512(lo), hi);
            let mut idx = _mm512_srlv_epi32(words, self.shifts);
            if B < 4 {
                idx = _mm512_and_si512(idx, _mm512_set1_epi32((1 << B) - 1));
            }
            _mm512_permutexvar_ps(idx, self.levels)
        }
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

impl RowCodec512 for LloydMax8Row {
    const SCALED: bool = true;

    #[inline(always)]
    unsafe fn chunk(&self, row: *const u8, k: usize) -> __m512 {
        // SAFETY: codes 16k..16k+16 lie in the row; every byte indexes the 256 levels.
        unsafe {
            let idx = _mm512_cvtepu8_epi32(_mm_loadu_si128(row.add(16 * k).cast()));
            _mm512_i32gather_ps::<4>(idx, self.levels.cast())
        }
    }
}
