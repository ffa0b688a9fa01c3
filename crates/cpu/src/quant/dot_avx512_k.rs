//! AVX-512 (F, BW, VL) + VNNI row kernels for Q2_K, Q3_K, Q5_K and Q6_K × Q8_K
//! activations, bit-identical to the AVX2 kernels of [`dot_avx2_k`](super::dot_avx2_k). Q4_K has
//! its own: decode in
//! [`dot_avx512_q4k_gemv`](super::dot_avx512_q4k_gemv), prefill tiles in
//! [`dot_avx512_q4k`](super::dot_avx512_q4k).
//!
//! Exactness: per super-block the AVX2 kernel forms eight i32 lanes, lane `l` being
//! `Σ_v sc_v · (the four byte products 4l..4l+4 of 32-value vector v)`, converts them once and
//! FMAs them into eight f32 accumulators; everything before the conversion is exact integer
//! arithmetic. Here a 512-bit register holds two 32-value vectors side by side (64 codes
//! against 64 contiguous activation bytes): `vpmaddubsw` forms the same byte-pair sums, and
//! `vpdpwssd` multiplies them by the scale (as i16) and adds the pairs into the running i32 sums
//! in one instruction (AVX2: `vpmaddwd` + `vpaddd`). The two 256-bit halves (even and odd
//! vectors) are added at the end of the super-block, which gives the same eight integers; the
//! float steps after that are the AVX2 kernel's, in the same order.
//!
//! The 6-bit scales and mins of Q5_K are unpacked with ggml's 32-bit mask trick instead
//! of one sub-block at a time, and the min term's `Σ mn_j (bsums_2j + bsums_2j+1)` is one
//! `vpmaddwd` (integers again, so exact). Q3_K's 16 scales come from [`q3k_scales`] (the same
//! trick, in registers) and its high code bits from one `vptestmb` a chunk, so no part of a
//! block is unpacked in scalar code.

// Kernels and references index several parallel arrays by the same lane or row.
#![allow(clippy::needless_range_loop)]

use super::blocks::{BlockQ8K, QK_K};
use super::dot_avx2::{hsum, prefetch_share, K_PREFETCH_ROWS};
use super::dot_avx2_k::{hsum_i32, load_f16, q3k_scales, sub_total_from_lane0};
use super::reference_q5k::tiled_step;
use super::types::Acts;
use std::arch::x86_64::*;

/// The eight 6-bit scales (bytes 0..8) and mins (bytes 8..16) of a Q5_K block, from its
/// 12 packed bytes at `p` (ggml's `kmask` unpacking; the same values as
/// [`scale_min_k4`](super::blocks::scale_min_k4)).
#[inline]
fn unpack_scales_mins(p: &[u8; 12]) -> [u8; 16] {
    const KMASK1: u32 = 0x3f3f_3f3f;
    const KMASK2: u32 = 0x0f0f_0f0f;
    const KMASK3: u32 = 0x0303_0303;
    let w = |i: usize| u32::from_le_bytes([p[4 * i], p[4 * i + 1], p[4 * i + 2], p[4 * i + 3]]);
    let (u0, u1, u2) = (w(0), w(1), w(2));
    let sc_lo = u0 & KMASK1;
    let mn_lo = u1 & KMASK1;
    let sc_hi = (u2 & KMASK2) | (((u0 >> 6) & KMASK3) << 4);
    let mn_hi = ((u2 >> 4) & KMASK2) | (((u1 >> 6) & KMASK3) << 4);
    let mut out = [0u8; 16];
    out[0..4].copy_from_slice(&sc_lo.to_le_bytes());
    out[4..8].copy_from_slice(&sc_hi.to_le_bytes());
    out[8..12].copy_from_slice(&mn_lo.to_le_bytes());
    out[12..16].copy_from_slice(&mn_hi.to_le_bytes());
    out
}

/// Adds the two 256-bit halves of `v` (eight i32 lanes each).
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
#[inline]
unsafe fn fold_halves(v: __m512i) -> __m256i {
    _mm256_add_epi32(_mm512_castsi512_si256(v), _mm512_extracti64x4_epi64(v, 1))
}

/// Q5_K: one weight row × `NJ` activation rows, in llama.cpp's orders
/// ([`reference_q5k`](super::reference_q5k)): the dot product's, or with `a.tiled` the tiled matmul's.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn q5_k_n<const NJ: usize>(w: &[u8], a: &Acts, j0: usize, out: &mut [f32; 4]) {
    let (block, qs_off) = (176, 48);
    let nb = a.k / QK_K;
    debug_assert!(w.len() == nb * block && a.q8k.len() >= (j0 + NJ) * nb);
    let mask = _mm512_set1_epi8(0x0F);
    let one = _mm512_set1_epi8(1);
    let mut acc = [_mm256_setzero_ps(); NJ];
    let mut acc_min = [0.0f32; NJ];
    let mut tiled = [0.0f32; NJ];
    for b in 0..nb {
        if NJ == 1 {
            prefetch_share(w.as_ptr(), K_PREFETCH_ROWS * w.len(), b, w.len() / nb);
        }
        let blk = w.as_ptr().add(b * block);
        let dd = _mm_cvtph_ps(_mm_cvtsi32_si128(std::ptr::read_unaligned(blk as *const i32)));
        let (d, dmin) = (_mm_cvtss_f32(dd), _mm_cvtss_f32(_mm_movehdup_ps(dd)));
        let sm = unpack_scales_mins(&*(blk.add(4) as *const [u8; 12]));
        let sm = _mm_loadu_si128(sm.as_ptr() as *const __m128i);
        let sc16 = _mm512_castsi256_si512(_mm256_cvtepu8_epi16(sm)); // i16 lanes 0..8: scales
                                                                     // Mins doubled up, [m0, m0, m1, m1, ..], to meet bsums[2j] and bsums[2j + 1].
        let mn16 = _mm256_cvtepu8_epi16(_mm_unpackhi_epi8(sm, sm));
        // Chunk c holds vectors 2c (low half) and 2c + 1 (high half).
        let mut q = [_mm512_setzero_si512(); 4];
        let mut scz = [_mm512_setzero_si512(); 4];
        let qh = _mm256_loadu_si256(blk.add(16) as *const __m256i);
        for c in 0..4 {
            let raw = _mm256_loadu_si256(blk.add(qs_off + 32 * c) as *const __m256i);
            let z = _mm512_inserti64x4(_mm512_castsi256_si512(raw), _mm256_srli_epi16(raw, 4), 1);
            let h = _mm512_inserti64x4(
                _mm512_castsi256_si512(_mm256_srl_epi16(qh, _mm_cvtsi32_si128(2 * c as i32))),
                _mm256_srl_epi16(qh, _mm_cvtsi32_si128(2 * c as i32 + 1)),
                1,
            );
            q[c] = _mm512_or_si512(_mm512_and_si512(z, mask), _mm512_slli_epi16(_mm512_and_si512(h, one), 4));
            let idx = _mm512_inserti64x4(
                _mm512_castsi256_si512(_mm256_set1_epi16(2 * c as i16)),
                _mm256_set1_epi16(2 * c as i16 + 1),
                1,
            );
            scz[c] = _mm512_permutexvar_epi16(idx, sc16);
        }
        for t in 0..NJ {
            let y: &BlockQ8K = &a.q8k[(j0 + t) * nb + b];
            let mut sumi = _mm512_setzero_si512();
            for c in 0..4 {
                let yv = _mm512_loadu_si512(y.qs.as_ptr().add(64 * c) as *const __m512i);
                sumi = _mm512_dpwssd_epi32(sumi, _mm512_maddubs_epi16(q[c], yv), scz[c]);
            }
            let sumi = fold_halves(sumi);
            let bsums = _mm256_loadu_si256(y.bsums.as_ptr() as *const __m256i);
            let summ = hsum_i32(_mm256_madd_epi16(bsums, mn16));
            if a.tiled {
                tiled[t] = tiled_step(hsum_i32(sumi), summ, d, dmin, y.d, tiled[t]);
            } else {
                acc[t] = _mm256_fmadd_ps(_mm256_set1_ps(d * y.d), _mm256_cvtepi32_ps(sumi), acc[t]);
                acc_min[t] = (dmin * y.d).mul_add(summ as f32, acc_min[t]);
            }
        }
    }
    for t in 0..NJ {
        out[t] = if a.tiled { tiled[t] } else { hsum(acc[t]) - acc_min[t] };
    }
}

/// How far ahead the Q6_K row kernel (decode and short steps) prefetches: a fixed distance rather than
/// [`K_PREFETCH_ROWS`] rows, since Q6_K rows of 8,960 values (a `ffn_down`) are 7 KiB and twelve
/// of them ahead overrun L1 — the lines are evicted before they are read (two threads on
/// 1536 × 8960 matrices: about 20 % more bandwidth at 2–4 KiB than at twelve rows; rows of 1,536
/// values run the same at both).
const Q6K_PREFETCH_BYTES: usize = 4096;

/// Q6_K: codes unpacked to 0..63 (`q + 32`), so the dot is `Σ sc_g Σ q y - 32 Σ sc_g bsums_g`.
/// Chunk `2h + i` holds the AVX2 kernel's vectors `4h + 2i` and `4h + 2i + 1`, whose 16-value
/// groups (scales) are `8h + 4i .. 8h + 4i + 4`, one per 128-bit quarter. With `a.tiled`, the
/// lanes' exact sum per super-block goes into the tiled matmul's order.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn q6_k_n<const NJ: usize>(w: &[u8], a: &Acts, j0: usize, out: &mut [f32; 4]) {
    const BLOCK: usize = 210;
    let nb = a.k / QK_K;
    debug_assert!(w.len() == nb * BLOCK && a.q8k.len() >= (j0 + NJ) * nb);
    let mask = _mm512_set1_epi8(0x0F);
    let three = _mm512_set1_epi8(3);
    let mut acc = [_mm256_setzero_ps(); NJ];
    let mut tiled = [0.0f32; NJ];
    for b in 0..nb {
        prefetch_share(w.as_ptr(), Q6K_PREFETCH_BYTES, b, w.len() / nb);
        let blk = w.as_ptr().add(b * BLOCK);
        let sc: [i8; 16] = std::ptr::read_unaligned(blk.add(192) as *const [i8; 16]);
        let sc_i16 = _mm256_cvtepi8_epi16(_mm_loadu_si128(sc.as_ptr() as *const __m128i));
        let sc16 = _mm512_castsi256_si512(_mm256_cvtepi8_epi16(_mm_loadu_si128(sc.as_ptr() as *const __m128i)));
        let d = load_f16(blk.add(208));
        let mut q = [_mm512_setzero_si512(); 4];
        let mut scz = [_mm512_setzero_si512(); 4];
        for h in 0..2 {
            // ql0 | ql1 of the AVX2 kernel, side by side; qh beside itself.
            let ql = _mm512_loadu_si512(blk.add(64 * h) as *const __m512i);
            let qh256 = _mm256_loadu_si256(blk.add(128 + 32 * h) as *const __m256i);
            let qh = _mm512_inserti64x4(_mm512_castsi256_si512(qh256), qh256, 1);
            // ((qh >> s) & 3) << 4 with s = lo in the low half and s = hi in the high half.
            let high = |lo: u64, hi: u64| {
                let shifts = _mm512_inserti64x4(
                    _mm512_castsi256_si512(_mm256_set1_epi16(lo as i16)),
                    _mm256_set1_epi16(hi as i16),
                    1,
                );
                _mm512_slli_epi16(_mm512_and_si512(_mm512_srlv_epi16(qh, shifts), three), 4)
            };
            q[2 * h] = _mm512_or_si512(_mm512_and_si512(ql, mask), high(0, 2));
            q[2 * h + 1] = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(ql, 4), mask), high(4, 6));
            for i in 0..2 {
                let g = (8 * h + 4 * i) as i16;
                let idx = _mm512_setr_epi64(
                    0x0001_0001_0001_0001 * g as i64,
                    0x0001_0001_0001_0001 * g as i64,
                    0x0001_0001_0001_0001 * (g + 1) as i64,
                    0x0001_0001_0001_0001 * (g + 1) as i64,
                    0x0001_0001_0001_0001 * (g + 2) as i64,
                    0x0001_0001_0001_0001 * (g + 2) as i64,
                    0x0001_0001_0001_0001 * (g + 3) as i64,
                    0x0001_0001_0001_0001 * (g + 3) as i64,
                );
                scz[2 * h + i] = _mm512_permutexvar_epi16(idx, sc16);
            }
        }
        for t in 0..NJ {
            let y: &BlockQ8K = &a.q8k[(j0 + t) * nb + b];
            let mut sumi = _mm512_setzero_si512();
            for c in 0..4 {
                let yv = _mm512_loadu_si512(y.qs.as_ptr().add(64 * c) as *const __m512i);
                sumi = _mm512_dpwssd_epi32(sumi, _mm512_maddubs_epi16(q[c], yv), scz[c]);
            }
            let sumi = fold_halves(sumi);
            // ggml's order: lane l loses 32 (sc_2l bsums_2l + sc_2l+1 bsums_2l+1) as an integer.
            let bsums = _mm256_loadu_si256(y.bsums.as_ptr() as *const __m256i);
            let sumi = _mm256_sub_epi32(sumi, _mm256_slli_epi32(_mm256_madd_epi16(bsums, sc_i16), 5));
            if a.tiled {
                tiled[t] = (hsum_i32(sumi) as f32 * d).mul_add(y.d, tiled[t]);
            } else {
                acc[t] = _mm256_fmadd_ps(_mm256_set1_ps(d * y.d), _mm256_cvtepi32_ps(sumi), acc[t]);
            }
        }
    }
    for t in 0..NJ {
        out[t] = if a.tiled { tiled[t] } else { hsum(acc[t]) };
    }
}

/// `vpermw` indices that spread 16 group scales (i16) over four chunks: chunk `c`'s 128-bit
/// quarter `q` takes group `4c + q` (each chunk holds two 32-value vectors, four 16-value groups).
const GROUP_IDX: [[i16; 32]; 4] = {
    let mut idx = [[0i16; 32]; 4];
    let mut c = 0;
    while c < 4 {
        let mut w = 0;
        while w < 32 {
            idx[c][w] = (4 * c + w / 8) as i16;
            w += 1;
        }
        c += 1;
    }
    idx
};

/// The 16 group scales of a 256-value block (`sc16`, i16) as the four chunks' i16 scale vectors.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
#[inline]
unsafe fn group_scales(sc16: __m256i) -> [__m512i; 4] {
    let sc16 = _mm512_castsi256_si512(sc16);
    std::array::from_fn(|c| _mm512_permutexvar_epi16(_mm512_loadu_si512(GROUP_IDX[c].as_ptr() as *const __m512i), sc16))
}

/// The AVX2 kernels' eight lanes `Σ_v sc_g Σ q y` (four products a lane) of small unsigned codes
/// (`q ≤ 7`, so byte-pair sums fit i16) in chunks `q[c]` (vectors `2c`, `2c + 1`) against `y`.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
#[inline]
unsafe fn small_code_lanes(q: &[__m512i; 4], sc: &[__m512i; 4], y: &BlockQ8K) -> __m256i {
    let mut sumi = _mm512_setzero_si512();
    for c in 0..4 {
        let yv = _mm512_loadu_si512(y.qs.as_ptr().add(64 * c) as *const __m512i);
        sumi = _mm512_dpwssd_epi32(sumi, _mm512_maddubs_epi16(q[c], yv), sc[c]);
    }
    fold_halves(sumi)
}

/// A 512-bit vector of `lo` in its low half and `hi` in its high half, every byte.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
#[inline]
unsafe fn halves_epi8(lo: i8, hi: i8) -> __m512i {
    _mm512_inserti64x4::<1>(_mm512_castsi256_si512(_mm256_set1_epi8(lo)), _mm256_set1_epi8(hi))
}

/// The 2-bit fields of the 64 bytes at `qs` in value order, two 32-value vectors a chunk:
/// vector `4n + j` holds `(qs[32n + l] >> 2j) & 3`. Chunk `c` is `qs[32 (c / 2)..]` in both
/// halves, shifted by `4 (c % 2)` (low half) and `4 (c % 2) + 2` (high half) in one `vpsrlvw`.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
#[inline]
unsafe fn two_bit_chunks(qs: *const u8) -> [__m512i; 4] {
    let three = _mm512_set1_epi8(3);
    std::array::from_fn(|c| {
        let raw = _mm512_broadcast_i64x4(_mm256_loadu_si256(qs.add(32 * (c / 2)) as *const __m256i));
        let j = 4 * (c % 2) as i16;
        let shifts = _mm512_inserti64x4::<1>(_mm512_castsi256_si512(_mm256_set1_epi16(j)), _mm256_set1_epi16(j + 2));
        _mm512_and_si512(_mm512_srlv_epi16(raw, shifts), three)
    })
}

/// Q2_K: `d d_x Σ_g sc_g Σ q y - dmin d_x Σ_g mn_g bsums_g`, in the AVX2 kernel's order.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn q2_k_n<const NJ: usize>(w: &[u8], a: &Acts, j0: usize, out: &mut [f32; 4]) {
    const BLOCK: usize = 84;
    let nb = a.k / QK_K;
    debug_assert!(w.len() == nb * BLOCK && a.q8k.len() >= (j0 + NJ) * nb);
    let mut acc = [_mm256_setzero_ps(); NJ];
    let mut acc_min = [0.0f32; NJ];
    for b in 0..nb {
        if NJ == 1 {
            prefetch_share(w.as_ptr(), K_PREFETCH_ROWS * w.len(), b, w.len() / nb);
        }
        let blk = w.as_ptr().add(b * BLOCK);
        let (d, dmin) = (load_f16(blk.add(80)), load_f16(blk.add(82)));
        let packed = _mm_loadu_si128(blk as *const __m128i);
        let sc = group_scales(_mm256_cvtepu8_epi16(_mm_and_si128(packed, _mm_set1_epi8(0x0F))));
        let mins = _mm256_cvtepu8_epi16(_mm_srli_epi16(_mm_and_si128(packed, _mm_set1_epi8(-16)), 4));
        let q = two_bit_chunks(blk.add(16));
        for t in 0..NJ {
            let y: &BlockQ8K = &a.q8k[(j0 + t) * nb + b];
            let sumi = small_code_lanes(&q, &sc, y);
            acc[t] = _mm256_fmadd_ps(_mm256_set1_ps(d * y.d), _mm256_cvtepi32_ps(sumi), acc[t]);
            let summ = hsum_i32(_mm256_madd_epi16(_mm256_loadu_si256(y.bsums.as_ptr() as *const __m256i), mins));
            acc_min[t] += dmin * y.d * summ as f32;
        }
    }
    for t in 0..NJ {
        out[t] = hsum(acc[t]) - acc_min[t];
    }
}

/// The codes of the Q3_K block at `blk` plus 4 (`0..7`) as [`two_bit_chunks`]' four chunks: 4
/// is added where the code's high bit, bit `v` of `hmask[l]` for vector `v`, is set (one
/// `vptestmb` and one masked byte add a chunk).
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
#[inline]
unsafe fn q3k_chunks(blk: *const u8) -> [__m512i; 4] {
    let four = _mm512_set1_epi8(4);
    let hm = _mm512_broadcast_i64x4(_mm256_loadu_si256(blk as *const __m256i));
    let low = two_bit_chunks(blk.add(32));
    std::array::from_fn(|c| {
        let high = _mm512_test_epi8_mask(hm, halves_epi8(1 << (2 * c), 1 << (2 * c + 1)));
        _mm512_mask_add_epi8(low[c], high, low[c], four)
    })
}

/// Q3_K: codes unpacked to 0..7 (`q + 4`), so the dot is `Σ sc_g Σ q y - 4 Σ sc_g bsums_g`, the
/// offset taken from lane 0 before the conversion as the AVX2 kernel does.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn q3_k_n<const NJ: usize>(w: &[u8], a: &Acts, j0: usize, out: &mut [f32; 4]) {
    const BLOCK: usize = 110;
    let nb = a.k / QK_K;
    debug_assert!(w.len() == nb * BLOCK && a.q8k.len() >= (j0 + NJ) * nb);
    let mut acc = [_mm256_setzero_ps(); NJ];
    for b in 0..nb {
        if NJ == 1 {
            prefetch_share(w.as_ptr(), K_PREFETCH_ROWS * w.len(), b, w.len() / nb);
        }
        let blk = w.as_ptr().add(b * BLOCK);
        let sc16 = _mm256_cvtepi8_epi16(q3k_scales(blk));
        let sc16x4 = _mm256_slli_epi16::<2>(sc16);
        let scv = group_scales(sc16);
        let d = load_f16(blk.add(108));
        let q = q3k_chunks(blk);
        for t in 0..NJ {
            let y: &BlockQ8K = &a.q8k[(j0 + t) * nb + b];
            let sumi = small_code_lanes(&q, &scv, y);
            let bsums = _mm256_loadu_si256(y.bsums.as_ptr() as *const __m256i);
            let sumi = sub_total_from_lane0(sumi, _mm256_madd_epi16(bsums, sc16x4));
            acc[t] = _mm256_fmadd_ps(_mm256_set1_ps(d * y.d), _mm256_cvtepi32_ps(sumi), acc[t]);
        }
    }
    for t in 0..NJ {
        out[t] = hsum(acc[t]);
    }
}

/// Defines a row kernel with the [`RowFn`](super::matmul::RowFn) signature from a
/// const-generic `NJ` kernel.
macro_rules! dispatch_nj_avx512 {
    ($name:ident, $inner:ident) => {
        /// Row kernel (see [`RowFn`](super::matmul::RowFn)); requires AVX-512 F/BW/VL/VNNI,
        /// AVX2, FMA and F16C.
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

dispatch_nj_avx512!(q5_k, q5_k_n);
dispatch_nj_avx512!(q6_k, q6_k_n);
dispatch_nj_avx512!(q2_k, q2_k_n);
dispatch_nj_avx512!(q3_k, q3_k_n);

#[cfg(test)]
mod tests {
    use super::super::blocks::scale_min_k4;
    use super::unpack_scales_mins;

    #[test]
    fn mask_unpacking_matches_scale_min_k4() {
        // Every byte value in every position (12 positions × 256 values, others varied too).
        for pos in 0..12 {
            for v in 0..=255u8 {
                let mut p = [0u8; 12];
                for (i, b) in p.iter_mut().enumerate() {
                    *b = (v as usize * 7 + i * 31 + pos * 13) as u8;
                }
                p[pos] = v;
                let got = unpack_scales_mins(&p);
                for j in 0..8 {
                    assert_eq!((got[j], got[8 + j]), scale_min_k4(j, &p), "bytes {p:?} sub-block {j}");
                }
            }
        }
    }
}
