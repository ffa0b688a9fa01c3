//! AVX2 + FMA + F16C row kernels for the 256-value formats (Q2_K, Q3_K, Q4_K, Q5_K, Q6_K,
//! IQ4_XS) × Q8_K activations.
//!
//! Per 256-value super-block: the weight codes are unpacked once into eight vectors of 32
//! unsigned bytes (Q4_K 0..15, Q5_K 0..31, Q6_K 0..63 without its -32 offset), then for each
//! activation row: `_mm256_maddubs_epi16` (no saturation: 2·63·127 < 2^15), `_mm256_madd_epi16`
//! with the sub-block scales broadcast as i16, summed as i32 over the super-block and converted
//! once. The min terms (Q4_K/Q5_K `dmin · mn_j`) and the Q6_K offset (`-32 · sc_g`) use the
//! activation block sums `bsums`, in integers. Q2_K (0..3) and Q3_K (0..7, its -4 offset
//! through `bsums`, out of lane 0) take the same path with 16 group scales; IQ4_XS looks its
//! signed levels up with a byte shuffle and multiplies them as signed bytes. Q4_K and Q6_K keep
//! llama.cpp's float order exactly ([`reference_q4k`](super::reference_q4k),
//! [`reference_q6k`](super::reference_q6k)): Q4_K sums its lanes per pair of sub-blocks and
//! multiply-adds in scalar, Q6_K subtracts its offset lane by lane before the conversion.

// Kernels and references index several parallel arrays by the same lane or row.
#![allow(clippy::needless_range_loop)]

use super::blocks::{iq4xs_scale, scale_min_k4, BlockQ8K, K_SCALE_SIZE, QK_K};
use super::dot_avx2::{dispatch_nj, hsum, iq4nl_table, prefetch_share, unpack_nibbles, K_PREFETCH_ROWS};
use super::reference_q5k::tiled_step;
use super::types::Acts;
use std::arch::x86_64::*;

/// Header of a Q4_K/Q5_K block at `blk`: `(d, dmin)` and the eight 6-bit scales and mins.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn k4_header(blk: *const u8) -> (f32, f32, [i16; 8], [i32; 8]) {
    let dd = _mm_cvtph_ps(_mm_cvtsi32_si128(std::ptr::read_unaligned(blk as *const i32)));
    let d = _mm_cvtss_f32(dd);
    let dmin = _mm_cvtss_f32(_mm_movehdup_ps(dd));
    let scales: [u8; K_SCALE_SIZE] = std::ptr::read_unaligned(blk.add(4) as *const [u8; K_SCALE_SIZE]);
    let (mut sc, mut mn) = ([0i16; 8], [0i32; 8]);
    for j in 0..8 {
        let (s, m) = scale_min_k4(j, &scales);
        sc[j] = s as i16;
        mn[j] = m as i32;
    }
    (d, dmin, sc, mn)
}

/// `Σ_j sc_j Σ_{i in sub-block j} q_i y_i` for 8 sub-blocks of 32 (codes in `q`), as 8 × i32.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn k4_dot(q: &[__m256i; 8], sc: &[__m256i; 8], y: *const i8) -> __m256i {
    let mut sumi = _mm256_setzero_si256();
    for v in 0..8 {
        let yv = _mm256_loadu_si256(y.add(32 * v) as *const __m256i);
        let p = _mm256_madd_epi16(_mm256_maddubs_epi16(q[v], yv), sc[v]);
        sumi = _mm256_add_epi32(sumi, p);
    }
    sumi
}

/// Q5_K (`FIVE = true`; `FIVE = false` reads Q4_K's layout) in llama.cpp's orders
/// ([`reference_q5k`](super::reference_q5k)): the dot product's, or with `a.tiled` the tiled matmul's.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn k4_rows<const NJ: usize, const FIVE: bool>(w: &[u8], a: &Acts, j0: usize, out: &mut [f32; 4]) {
    let (block, qs_off) = if FIVE { (176, 48) } else { (144, 16) };
    let nb = a.k / QK_K;
    debug_assert!(w.len() == nb * block && a.q8k.len() >= (j0 + NJ) * nb);
    let mask = _mm256_set1_epi8(0x0F);
    let one = _mm256_set1_epi8(1);
    let mut acc = [_mm256_setzero_ps(); NJ];
    let mut acc_min = [0.0f32; NJ];
    let mut tiled = [0.0f32; NJ];
    for b in 0..nb {
        if NJ == 1 {
            prefetch_share(w.as_ptr(), K_PREFETCH_ROWS * w.len(), b, w.len() / nb);
        }
        let blk = w.as_ptr().add(b * block);
        let (d, dmin, sc, mn) = k4_header(blk);
        let scv: [__m256i; 8] = std::array::from_fn(|v| _mm256_set1_epi16(sc[v]));
        let mut q = [_mm256_setzero_si256(); 8];
        let qh = if FIVE { _mm256_loadu_si256(blk.add(16) as *const __m256i) } else { _mm256_setzero_si256() };
        for c in 0..4 {
            let raw = _mm256_loadu_si256(blk.add(qs_off + 32 * c) as *const __m256i);
            q[2 * c] = _mm256_and_si256(raw, mask);
            q[2 * c + 1] = _mm256_and_si256(_mm256_srli_epi16(raw, 4), mask);
            if FIVE {
                let h_lo = _mm256_and_si256(_mm256_srl_epi16(qh, _mm_cvtsi32_si128(2 * c as i32)), one);
                let h_hi = _mm256_and_si256(_mm256_srl_epi16(qh, _mm_cvtsi32_si128(2 * c as i32 + 1)), one);
                q[2 * c] = _mm256_or_si256(q[2 * c], _mm256_slli_epi16(h_lo, 4));
                q[2 * c + 1] = _mm256_or_si256(q[2 * c + 1], _mm256_slli_epi16(h_hi, 4));
            }
        }
        for t in 0..NJ {
            let y: &BlockQ8K = &a.q8k[(j0 + t) * nb + b];
            let sumi = k4_dot(&q, &scv, y.qs.as_ptr());
            let summ: i32 = (0..8).map(|j| mn[j] * (y.bsums[2 * j] as i32 + y.bsums[2 * j + 1] as i32)).sum();
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

/// Q4_K in llama.cpp's order ([`reference_q4k`](super::reference_q4k)): per super-block and
/// activation row, the four sub-block pair sums as exact i32 (one horizontal add tree for all
/// four), then the gemm order's four or the gemv order's one multiply-add per super-block in
/// scalar FMA.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q4_k_n<const NJ: usize>(w: &[u8], a: &Acts, j0: usize, out: &mut [f32; 4]) {
    const BLOCK: usize = 144;
    let nb = a.k / QK_K;
    debug_assert!(w.len() == nb * BLOCK && a.q8k.len() >= (j0 + NJ) * nb);
    let mask = _mm256_set1_epi8(0x0F);
    let (mut acc, mut accm) = ([0.0f32; NJ], [0.0f32; NJ]);
    for b in 0..nb {
        if NJ == 1 {
            prefetch_share(w.as_ptr(), K_PREFETCH_ROWS * w.len(), b, w.len() / nb);
        }
        let blk = w.as_ptr().add(b * BLOCK);
        let (d, dmin, sc, mn) = k4_header(blk);
        let scv: [__m256i; 8] = std::array::from_fn(|v| _mm256_set1_epi16(sc[v]));
        let mut q = [_mm256_setzero_si256(); 8];
        for c in 0..4 {
            let raw = _mm256_loadu_si256(blk.add(16 + 32 * c) as *const __m256i);
            q[2 * c] = _mm256_and_si256(raw, mask);
            q[2 * c + 1] = _mm256_and_si256(_mm256_srli_epi16(raw, 4), mask);
        }
        for t in 0..NJ {
            let y: &BlockQ8K = &a.q8k[(j0 + t) * nb + b];
            let yq = y.qs.as_ptr();
            let pair = |p: usize| {
                let lo = _mm256_maddubs_epi16(q[2 * p], _mm256_loadu_si256(yq.add(64 * p) as *const __m256i));
                let hi = _mm256_maddubs_epi16(q[2 * p + 1], _mm256_loadu_si256(yq.add(64 * p + 32) as *const __m256i));
                _mm256_add_epi32(_mm256_madd_epi16(lo, scv[2 * p]), _mm256_madd_epi16(hi, scv[2 * p + 1]))
            };
            let h = _mm256_hadd_epi32(_mm256_hadd_epi32(pair(0), pair(1)), _mm256_hadd_epi32(pair(2), pair(3)));
            let isums: [i32; 4] =
                std::mem::transmute(_mm_add_epi32(_mm256_castsi256_si128(h), _mm256_extracti128_si256(h, 1)));
            let msums: [i32; 4] = std::array::from_fn(|p| {
                let s = |j: usize| y.bsums[2 * j] as i32 + y.bsums[2 * j + 1] as i32;
                mn[2 * p] * s(2 * p) + mn[2 * p + 1] * s(2 * p + 1)
            });
            let (dd, dm) = (d * y.d, dmin * y.d);
            if j0 + t < a.gemm_acts {
                for p in 0..4 {
                    acc[t] = (isums[p] as f32).mul_add(dd, acc[t]);
                    accm[t] = (msums[p] as f32).mul_add(dm, accm[t]);
                }
            } else {
                acc[t] = (isums.iter().sum::<i32>() as f32).mul_add(dd, acc[t]);
                accm[t] = (msums.iter().sum::<i32>() as f32).mul_add(dm, accm[t]);
            }
        }
    }
    for t in 0..NJ {
        out[t] = acc[t] - accm[t];
    }
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q5_k_n<const NJ: usize>(w: &[u8], a: &Acts, j0: usize, out: &mut [f32; 4]) {
    k4_rows::<NJ, true>(w, a, j0, out)
}

/// Q6_K: codes unpacked to 0..63 (`q + 32`), so the dot is `Σ sc_g Σ q y - 32 Σ sc_g bsums_g`,
/// the offset taken from each lane as in [`reference_q6k`](super::reference_q6k); with
/// `a.tiled`, the lanes' exact sum per super-block goes into the tiled matmul's order instead.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q6_k_n<const NJ: usize>(w: &[u8], a: &Acts, j0: usize, out: &mut [f32; 4]) {
    const BLOCK: usize = 210;
    let nb = a.k / QK_K;
    debug_assert!(w.len() == nb * BLOCK && a.q8k.len() >= (j0 + NJ) * nb);
    let mask = _mm256_set1_epi8(0x0F);
    let three = _mm256_set1_epi8(3);
    let mut acc = [_mm256_setzero_ps(); NJ];
    let mut tiled = [0.0f32; NJ];
    for b in 0..nb {
        if NJ == 1 {
            prefetch_share(w.as_ptr(), K_PREFETCH_ROWS * w.len(), b, w.len() / nb);
        }
        let blk = w.as_ptr().add(b * BLOCK);
        let sc: [i8; 16] = std::ptr::read_unaligned(blk.add(192) as *const [i8; 16]);
        let sc_i16 = _mm256_cvtepi8_epi16(_mm_loadu_si128(sc.as_ptr() as *const __m128i));
        let d =
            _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(std::ptr::read_unaligned(blk.add(208) as *const u16) as i32)));
        let mut q = [_mm256_setzero_si256(); 8];
        for h in 0..2 {
            let ql0 = _mm256_loadu_si256(blk.add(64 * h) as *const __m256i);
            let ql1 = _mm256_loadu_si256(blk.add(64 * h + 32) as *const __m256i);
            let qh = _mm256_loadu_si256(blk.add(128 + 32 * h) as *const __m256i);
            let high = |shift: i32| {
                _mm256_slli_epi16(_mm256_and_si256(_mm256_srl_epi16(qh, _mm_cvtsi32_si128(shift)), three), 4)
            };
            q[4 * h] = _mm256_or_si256(_mm256_and_si256(ql0, mask), high(0));
            q[4 * h + 1] = _mm256_or_si256(_mm256_and_si256(ql1, mask), high(2));
            q[4 * h + 2] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql0, 4), mask), high(4));
            q[4 * h + 3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql1, 4), mask), high(6));
        }
        // Vector v covers values 32v..32v+32: groups 2v (low 128 bits) and 2v+1 (high).
        let scv: [__m256i; 8] = std::array::from_fn(|v| {
            _mm256_set_m128i(_mm_set1_epi16(sc[2 * v + 1] as i16), _mm_set1_epi16(sc[2 * v] as i16))
        });
        for t in 0..NJ {
            let y: &BlockQ8K = &a.q8k[(j0 + t) * nb + b];
            let sumi = k4_dot(&q, &scv, y.qs.as_ptr());
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

/// The exact sum of eight i32 lanes (wrapping, as the lanes' own sums are: a K-quant
/// super-block's total fits in i32).
#[target_feature(enable = "avx2")]
#[inline]
pub(super) unsafe fn hsum_i32(v: __m256i) -> i32 {
    let s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256::<1>(v));
    let s = _mm_add_epi32(s, _mm_shuffle_epi32::<0b01_00_11_10>(s));
    let s = _mm_add_epi32(s, _mm_shuffle_epi32::<0b10_11_00_01>(s));
    _mm_cvtsi128_si32(s)
}

/// The f16 at `p` as f32.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
pub(super) unsafe fn load_f16(p: *const u8) -> f32 {
    _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(std::ptr::read_unaligned(p as *const u16) as i32)))
}

/// Sixteen group scales (groups of 16 values; `sc16` as i16) as the i16 vectors [`k4_dot`]
/// takes: vector `v` covers values `32 v..32 v + 32`, group `2 v` in its low 128 bits and
/// `2 v + 1` in the high. Two lane broadcasts and a byte shuffle a vector.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn group_scales(sc16: __m256i) -> [__m256i; 8] {
    // Both 128-bit lanes holding groups 0..8, and both holding groups 8..16.
    let halves = [_mm256_permute2x128_si256::<0x00>(sc16, sc16), _mm256_permute2x128_si256::<0x11>(sc16, sc16)];
    std::array::from_fn(|v| {
        // Shuffle indices picking i16 word `w` of a lane in all eight positions.
        let pick = |w: usize| _mm_set1_epi16((((2 * w + 1) << 8) | (2 * w)) as i16);
        let idx = _mm256_set_m128i(pick((2 * v + 1) % 8), pick(2 * v % 8));
        _mm256_shuffle_epi8(halves[v / 4], idx)
    })
}

/// The 2-bit fields of 64 bytes at `qs` in value order: vector `4 n + j` holds
/// `(qs[32 n + l] >> 2 j) & 3`.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn two_bit_codes(qs: *const u8) -> [__m256i; 8] {
    let three = _mm256_set1_epi8(3);
    let mut q = [_mm256_setzero_si256(); 8];
    for n in 0..2 {
        let raw = _mm256_loadu_si256(qs.add(32 * n) as *const __m256i);
        for j in 0..4 {
            q[4 * n + j] = _mm256_and_si256(_mm256_srl_epi16(raw, _mm_cvtsi32_si128(2 * j as i32)), three);
        }
    }
    q
}

/// The 16 signed scales (`-32..31`, as i8) of the Q3_K block at `blk`, the values of
/// [`scales_q3k`](super::blocks::scales_q3k), unpacked in registers as ggml does with its
/// 32-bit masks: with the packed bytes as words `a0, a1, a2`, word `i` of the result is
/// `(a0, a1, a0 >> 4, a1 >> 4)[i] & 0x0f0f0f0f | ((a2 >> 2 i) & 0x03030303) << 4`, less 32 a byte.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
pub(super) unsafe fn q3k_scales(blk: *const u8) -> __m128i {
    // Bytes 94..110 (the block's last 16): two code bytes, the 12 scale bytes, then `d`.
    let raw = _mm_srli_si128::<2>(_mm_loadu_si128(blk.add(94) as *const __m128i));
    let nibble = _mm_set1_epi8(0x0F);
    let low = _mm_and_si128(_mm_unpacklo_epi64(raw, _mm_srli_epi16::<4>(raw)), nibble);
    let a2 = _mm_shuffle_epi32::<0b10_10_10_10>(raw);
    let high = _mm_and_si128(_mm_srlv_epi32(a2, _mm_setr_epi32(0, 2, 4, 6)), _mm_set1_epi8(3));
    _mm_sub_epi8(_mm_or_si128(low, _mm_slli_epi16::<4>(high)), _mm_set1_epi8(32))
}

/// `lanes` less `[Σ p, 0, .., 0]`: a total of eight i32 lanes taken from lane 0 only (exact,
/// wrapping as [`hsum_i32`]).
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
pub(super) unsafe fn sub_total_from_lane0(lanes: __m256i, p: __m256i) -> __m256i {
    let s = _mm_add_epi32(_mm256_castsi256_si128(p), _mm256_extracti128_si256::<1>(p));
    let s = _mm_add_epi32(s, _mm_srli_si128::<8>(s));
    let s = _mm_add_epi32(s, _mm_srli_si128::<4>(s));
    let total = _mm_blend_epi32::<0b0001>(_mm_setzero_si128(), s);
    _mm256_sub_epi32(lanes, _mm256_zextsi128_si256(total))
}

/// The codes of the Q3_K block at `blk` plus 4 (`0..7`, in value order, as
/// [`two_bit_codes`]): vector `v`'s third bit is bit `v` of `hmask[l]`, moved to bit 2 with an
/// immediate shift (the 16-bit shifts keep bit 2 of each byte within its byte).
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn q3k_codes(blk: *const u8) -> [__m256i; 8] {
    let four = _mm256_set1_epi8(4);
    let hm = _mm256_loadu_si256(blk as *const __m256i);
    let high = [
        _mm256_slli_epi16::<2>(hm),
        _mm256_slli_epi16::<1>(hm),
        hm,
        _mm256_srli_epi16::<1>(hm),
        _mm256_srli_epi16::<2>(hm),
        _mm256_srli_epi16::<3>(hm),
        _mm256_srli_epi16::<4>(hm),
        _mm256_srli_epi16::<5>(hm),
    ];
    let low = two_bit_codes(blk.add(32));
    std::array::from_fn(|v| _mm256_or_si256(low[v], _mm256_and_si256(high[v], four)))
}

/// Q2_K: `d d_x Σ_g sc_g Σ q y - dmin d_x Σ_g mn_g bsums_g`.
#[target_feature(enable = "avx2,fma,f16c")]
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
        let scales: [u8; 16] = std::ptr::read_unaligned(blk as *const [u8; 16]);
        let (d, dmin) = (load_f16(blk.add(80)), load_f16(blk.add(82)));
        let scv = group_scales(_mm256_cvtepu8_epi16(_mm_and_si128(
            _mm_loadu_si128(blk as *const __m128i),
            _mm_set1_epi8(0x0F),
        )));
        let q = two_bit_codes(blk.add(16));
        for t in 0..NJ {
            let y: &BlockQ8K = &a.q8k[(j0 + t) * nb + b];
            let sumi = k4_dot(&q, &scv, y.qs.as_ptr());
            acc[t] = _mm256_fmadd_ps(_mm256_set1_ps(d * y.d), _mm256_cvtepi32_ps(sumi), acc[t]);
            let summ: i32 = (0..16).map(|g| (scales[g] >> 4) as i32 * y.bsums[g] as i32).sum();
            acc_min[t] += dmin * y.d * summ as f32;
        }
    }
    for t in 0..NJ {
        out[t] = hsum(acc[t]) - acc_min[t];
    }
}

/// Q3_K: codes unpacked to 0..7 (`q + 4`), so the dot is `Σ sc_g Σ q y - 4 Σ sc_g bsums_g`,
/// the offset taken from lane 0 as an integer before the conversion. That gives the same f32 as
/// subtracting it from the converted lane: lane 0 (below `8 · 32 · 4 · 7 · 128 < 2^20` in
/// magnitude), the offset (at most `4 · 16 · 32 · 2048 = 2^22`) and their difference are all
/// exact in f32.
#[target_feature(enable = "avx2,fma,f16c")]
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
        let q = q3k_codes(blk);
        for t in 0..NJ {
            let y: &BlockQ8K = &a.q8k[(j0 + t) * nb + b];
            let sumi = k4_dot(&q, &scv, y.qs.as_ptr());
            let bsums = _mm256_loadu_si256(y.bsums.as_ptr() as *const __m256i);
            let sumi = sub_total_from_lane0(sumi, _mm256_madd_epi16(bsums, sc16x4));
            acc[t] = _mm256_fmadd_ps(_mm256_set1_ps(d * y.d), _mm256_cvtepi32_ps(sumi), acc[t]);
        }
    }
    for t in 0..NJ {
        out[t] = hsum(acc[t]);
    }
}

/// IQ4_XS: `d d_x Σ_b sc_b Σ KVALUES_IQ4NL[q] y`, the levels as signed bytes.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn iq4_xs_n<const NJ: usize>(w: &[u8], a: &Acts, j0: usize, out: &mut [f32; 4]) {
    const BLOCK: usize = 136;
    let nb = a.k / QK_K;
    debug_assert!(w.len() == nb * BLOCK && a.q8k.len() >= (j0 + NJ) * nb);
    let table = _mm256_broadcastsi128_si256(iq4nl_table());
    let mut acc = [_mm256_setzero_ps(); NJ];
    for b in 0..nb {
        if NJ == 1 {
            prefetch_share(w.as_ptr(), K_PREFETCH_ROWS * w.len(), b, w.len() / nb);
        }
        let blk = w.as_ptr().add(b * BLOCK);
        let d = load_f16(blk);
        let scales_h = std::ptr::read_unaligned(blk.add(2) as *const u16);
        let scales_l: [u8; 4] = std::ptr::read_unaligned(blk.add(4) as *const [u8; 4]);
        let scv: [__m256i; 8] = std::array::from_fn(|v| _mm256_set1_epi16(iq4xs_scale(scales_h, &scales_l, v) as i16));
        let q: [__m256i; 8] = std::array::from_fn(|v| _mm256_shuffle_epi8(table, unpack_nibbles(blk.add(8 + 16 * v))));
        for t in 0..NJ {
            let y: &BlockQ8K = &a.q8k[(j0 + t) * nb + b];
            let mut sumi = _mm256_setzero_si256();
            for v in 0..8 {
                let yv = _mm256_loadu_si256(y.qs.as_ptr().add(32 * v) as *const __m256i);
                // |y| × (level with y's sign): exact for y = -128; pairs fit i16 (2·128·127).
                let pairs = _mm256_maddubs_epi16(_mm256_abs_epi8(yv), _mm256_sign_epi8(q[v], yv));
                sumi = _mm256_add_epi32(sumi, _mm256_madd_epi16(pairs, scv[v]));
            }
            acc[t] = _mm256_fmadd_ps(_mm256_set1_ps(d * y.d), _mm256_cvtepi32_ps(sumi), acc[t]);
        }
    }
    for t in 0..NJ {
        out[t] = hsum(acc[t]);
    }
}

dispatch_nj!(q2_k, q2_k_n);
dispatch_nj!(q3_k, q3_k_n);
dispatch_nj!(iq4_xs, iq4_xs_n);
dispatch_nj!(q4_k, q4_k_n);
dispatch_nj!(q5_k, q5_k_n);
dispatch_nj!(q6_k, q6_k_n);

#[cfg(test)]
mod tests {
    use super::super::blocks::{scales_q3k, K_SCALE_SIZE};
    use super::q3k_scales;

    #[test]
    fn q3k_register_unpacking_matches_scales_q3k() {
        if !is_x86_feature_detected!("avx2") {
            return;
        }
        // Every byte value in every scale position (others varied too), in a whole 110-byte block.
        for pos in 0..K_SCALE_SIZE {
            for v in 0..=255u8 {
                let mut p = [0u8; K_SCALE_SIZE];
                for (i, b) in p.iter_mut().enumerate() {
                    *b = (v as usize * 7 + i * 31 + pos * 13) as u8;
                }
                p[pos] = v;
                let mut blk = [0xA5u8; 110];
                blk[96..108].copy_from_slice(&p);
                let want = scales_q3k(&p);
                // SAFETY: AVX2 checked above; the function reads the block's last 16 bytes.
                let got: [i8; 16] = unsafe { std::mem::transmute(q3k_scales(blk.as_ptr())) };
                assert_eq!(got, want, "scale bytes {p:?}");
            }
        }
    }
}
