//! AVX-512 (F, BW, VL) + VNNI tile kernels for Q4_0, Q4_1, Q5_0, Q5_1, IQ4_NL and Q8_0 weights ×
//! Q8 activations, bit-exact with the AVX2 kernels of [`dot_avx2`](super::dot_avx2).
//!
//! Exactness: the AVX2 kernel keeps, per (weight row, activation row), eight f32 lanes; lane
//! `l` accumulates over the blocks `fma(d_w d_x, (f32) p_l, acc_l)`, where `p_l` is the
//! integer sum of the four byte products `4l..4l+4` of the block's 32 unpacked codes, and the
//! eight lanes are summed by one fixed tree at the end (ggml's `hsum_float_8`). Here 512-bit
//! registers carry the lanes of several weight rows at once (layouts below), so every lane sees
//! the same integers (`vpdpbusd` forms the same four-product sums as `vpmaddubsw` +
//! `vpmaddwd`, in exact integer arithmetic), the same scale and the same FMA sequence, and
//! the final sums use the same tree: the results are bit-identical, only the work per
//! instruction doubles and the two integer multiply steps become one.
//!
//! Lane layouts, in 128-bit quarters of a 512-bit register:
//! - Q4_0/Q4_1/Q5_0/Q5_1/IQ4_NL take **four** rows at a time: their 16 code bytes side by side,
//!   split into low nibbles (row `i`'s AVX2 lanes 0-3 in quarter `i`) and high nibbles (lanes
//!   4-7), against the activation halves `y[0..16]` and `y[16..32]` broadcast to every quarter;
//!   one scale vector serves both halves. IQ4_NL's nibbles index its levels (`vpshufb`).
//! - Q8_0 takes row pairs `[r0 lanes 0-7, r1 lanes 0-7]` against `[y, y]`. Signed × signed has
//!   no VNNI instruction on these CPUs, so the weights are offset to unsigned
//!   (`w ^ 0x80 = w + 128`) and the exact correction `-128 Σ y` (per lane, computed once per
//!   activation block) is the accumulator `vpdpbusd` starts from. An odd last row goes to the
//!   AVX2 kernel (identical results).
//!
//! Decode (one activation row) prefetches the weight tiles ahead of use.

// Kernels and references index several parallel arrays by the same lane or row.
#![allow(clippy::needless_range_loop)]

use super::blocks::QK;
use super::dot_avx2::{self, fmt, prefetch_share, PREFETCH_TILES};
use super::types::{Acts, TileOut};
use std::arch::x86_64::*;

/// Sum of 8 lanes given as two 4-lane halves, in the order of [`dot_avx2::hsum`]:
/// `((a0+b0) + (a2+b2)) + ((a1+b1) + (a3+b3))`.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
#[inline]
unsafe fn hsum_halves(a: __m128, b: __m128) -> f32 {
    let s = _mm_add_ps(a, b);
    let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    let s = _mm_add_ss(s, _mm_movehdup_ps(s));
    _mm_cvtss_f32(s)
}

/// Sum of 8 lanes given as two 4-lane halves, in plain f32 adds in the order of
/// [`dot_avx2::hsum`] (so bit-identical to it): `((a0+b0) + (a2+b2)) + ((a1+b1) + (a3+b3))`.
#[inline]
fn hsum_tree(a: &[f32], b: &[f32]) -> f32 {
    ((a[0] + b[0]) + (a[2] + b[2])) + ((a[1] + b[1]) + (a[3] + b[3]))
}

/// The unsigned offset the codes of `FMT` carry here: Q4_0's 8 and Q5_0's 16 (ggml's), and
/// 128 for IQ4_NL, whose signed levels (-127..113) are looked up as `level + 128` so `vpdpbusd`
/// can take them; the lanes' sums start from `-offset · Σ y`, exact integers.
const fn code_offset<const FMT: u8>() -> u8 {
    match FMT {
        fmt::IQ4_NL => 128,
        _ => fmt::code_offset(FMT) as u8,
    }
}

/// `v · code_offset::<FMT>()` per 32-bit lane, the offset being 8, 16 or 128 (a shift).
#[target_feature(enable = "avx512f")]
#[inline]
unsafe fn times_offset<const FMT: u8>(v: __m512i) -> __m512i {
    match code_offset::<FMT>() {
        8 => _mm512_slli_epi32::<3>(v),
        16 => _mm512_slli_epi32::<4>(v),
        128 => _mm512_slli_epi32::<7>(v),
        _ => unreachable!("code offsets are 0, 8, 16 or 128"),
    }
}

/// The headers of four blocks as `[d0, m0, d1, m1, d2, m2, d3, m3]` (`m` = 0 for the formats
/// without a min, whose fixed code offset is taken inside the integer sums).
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
#[inline]
unsafe fn quad_header<const FMT: u8>(b: [*const u8; 4]) -> __m256 {
    if fmt::has_min(FMT) {
        let mut h = _mm_cvtsi32_si128(std::ptr::read_unaligned(b[0] as *const i32));
        h = _mm_insert_epi32(h, std::ptr::read_unaligned(b[1] as *const i32), 1);
        h = _mm_insert_epi32(h, std::ptr::read_unaligned(b[2] as *const i32), 2);
        h = _mm_insert_epi32(h, std::ptr::read_unaligned(b[3] as *const i32), 3);
        _mm256_cvtph_ps(h)
    } else {
        let mut h = _mm_cvtsi32_si128(std::ptr::read_unaligned(b[0] as *const u16) as i32);
        h = _mm_insert_epi16(h, std::ptr::read_unaligned(b[1] as *const u16) as i32, 1);
        h = _mm_insert_epi16(h, std::ptr::read_unaligned(b[2] as *const u16) as i32, 2);
        h = _mm_insert_epi16(h, std::ptr::read_unaligned(b[3] as *const u16) as i32, 3);
        let d = _mm256_castps128_ps256(_mm_cvtph_ps(h)); // [d0, d1, d2, d3, ..]
        let dd = _mm256_permutevar8x32_ps(d, _mm256_setr_epi32(0, 0, 1, 1, 2, 2, 3, 3));
        _mm256_blend_ps::<0b1010_1010>(dd, _mm256_setzero_ps())
    }
}

/// Q4_0/Q4_1/Q5_0/Q5_1 tile: one quad of four weight rows × `NJ` activation rows. Row `i >= nr` of the
/// quad repeats row `nr - 1` (its results are not stored), so any `1 <= nr <= 4` works.
///
/// Lane layout: the four rows' 16 code bytes side by side, split into low nibbles (`lo`, the
/// AVX2 lanes 0-3 of each row, row `i` in quarter `i`) and high nibbles (`hi`, lanes 4-7),
/// against the activation halves `y[0..16]` and `y[16..32]` in every quarter. The 5-bit
/// formats add 16 to the bytes whose bit is set in `qh` (bits 0-15 of row `i` to quarter `i`
/// of `lo`, bits 16-31 to quarter `i` of `hi`), one masked add each.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
#[inline]
unsafe fn nibble_quad<const NJ: usize, const FMT: u8>(
    w: *const u8,
    row_bytes: usize,
    nr: usize,
    a: &Acts,
    j0: usize,
    out: &mut TileOut,
) {
    let (block, qs_off, qh_off) = fmt::layout(FMT);
    let five = FMT == fmt::Q5_0 || FMT == fmt::Q5_1;
    let nb = a.k / QK;
    debug_assert!(code_offset::<FMT>() == 0 || a.q8_neg_sums.len() >= (j0 + NJ) * nb);
    // d_w d_x of row i (f32 lane 2i of the header product) into quarter i.
    let scale_idx = _mm512_setr_epi32(0, 0, 0, 0, 2, 2, 2, 2, 4, 4, 4, 4, 6, 6, 6, 6);
    let nibble = _mm512_set1_epi8(0x0F);
    let iq4nl = _mm512_broadcast_i32x4(_mm_xor_si128(dot_avx2::iq4nl_table(), _mm_set1_epi8(-128)));
    let rows: [*const u8; 4] = std::array::from_fn(|i| w.add(i.min(nr - 1) * row_bytes));
    let mut acc_lo = [_mm512_setzero_ps(); NJ];
    let mut acc_hi = [_mm512_setzero_ps(); NJ];
    let mut acc_off = [_mm256_setzero_ps(); NJ];
    let ys = a.q8_qs.as_ptr().add(j0 * a.k);
    let ds = a.q8_ds.as_ptr().add(j0 * nb) as *const f64;
    for b in 0..nb {
        if NJ == 1 {
            prefetch_share(w, PREFETCH_TILES * 4 * row_bytes, b, 4 * block);
        }
        let mut ylo = [_mm512_setzero_si512(); NJ];
        let mut yhi = [_mm512_setzero_si512(); NJ];
        let mut dx = [_mm256_setzero_ps(); NJ];
        // A fixed code offset: the lanes' sums start from `-offset · Σ y` (exact integers), so
        // they hold `Σ (q - offset) y` as the AVX2 kernel's (ggml's signed codes).
        let (mut start_lo, mut start_hi) = ([_mm512_setzero_si512(); NJ], [_mm512_setzero_si512(); NJ]);
        for t in 0..NJ {
            let y = ys.add(t * a.k + b * QK);
            ylo[t] = _mm512_broadcast_i32x4(_mm_loadu_si128(y as *const __m128i));
            yhi[t] = _mm512_broadcast_i32x4(_mm_loadu_si128(y.add(16) as *const __m128i));
            // [d_x, s_x] × 4
            dx[t] = _mm256_castpd_ps(_mm256_broadcast_sd(&*ds.add(t * nb + b)));
            if code_offset::<FMT>() != 0 {
                // The activations' negated sums of four codes (lanes 0-3, then 4-7), times the
                // offset (a power of two: a shift).
                let sums = a.q8_neg_sums.as_ptr().add((j0 + t) * nb + b) as *const __m128i;
                start_lo[t] = times_offset::<FMT>(_mm512_broadcast_i32x4(_mm_loadu_si128(sums)));
                start_hi[t] = times_offset::<FMT>(_mm512_broadcast_i32x4(_mm_loadu_si128(sums.add(1))));
            }
        }
        let blk: [*const u8; 4] = std::array::from_fn(|i| rows[i].add(b * block));
        let h = quad_header::<FMT>(blk);
        let mut z = _mm512_castsi128_si512(_mm_loadu_si128(blk[0].add(qs_off) as *const __m128i));
        z = _mm512_inserti32x4(z, _mm_loadu_si128(blk[1].add(qs_off) as *const __m128i), 1);
        z = _mm512_inserti32x4(z, _mm_loadu_si128(blk[2].add(qs_off) as *const __m128i), 2);
        z = _mm512_inserti32x4(z, _mm_loadu_si128(blk[3].add(qs_off) as *const __m128i), 3);
        let mut lo = _mm512_and_si512(z, nibble);
        let mut hi = _mm512_and_si512(_mm512_srli_epi16(z, 4), nibble);
        if FMT == fmt::IQ4_NL {
            // Levels as unsigned bytes (level + 128); the lanes start from -128 Σ y.
            lo = _mm512_shuffle_epi8(iq4nl, lo);
            hi = _mm512_shuffle_epi8(iq4nl, hi);
        }
        if five {
            let (mut mask_lo, mut mask_hi) = (0u64, 0u64);
            for (i, bp) in blk.iter().enumerate() {
                let qh = std::ptr::read_unaligned(bp.add(qh_off) as *const u32) as u64;
                mask_lo |= (qh & 0xFFFF) << (16 * i);
                mask_hi |= (qh >> 16) << (16 * i);
            }
            let sixteen = _mm512_set1_epi8(16);
            lo = _mm512_mask_add_epi8(lo, mask_lo, lo, sixteen);
            hi = _mm512_mask_add_epi8(hi, mask_hi, hi, sixteen);
        }
        // Without a min, d_i spread to quarter i once per block, times each d_x below: the same
        // products d_i d_x as [d_i d_x, m_i s_x] permuted, one permutation fewer per row.
        let hq = _mm512_permutexvar_ps(scale_idx, _mm512_castps256_ps512(h));
        for t in 0..NJ {
            let scale = if fmt::has_min(FMT) {
                let prod = _mm256_mul_ps(h, dx[t]); // [d_i d_x, m_i s_x] for i < 4
                acc_off[t] = _mm256_add_ps(acc_off[t], prod);
                _mm512_permutexvar_ps(scale_idx, _mm512_castps256_ps512(prod))
            } else {
                _mm512_mul_ps(hq, _mm512_set1_ps(*(ds as *const f32).add(2 * (t * nb + b))))
            };
            let sum_lo = _mm512_dpbusd_epi32(start_lo[t], lo, ylo[t]);
            let sum_hi = _mm512_dpbusd_epi32(start_hi[t], hi, yhi[t]);
            acc_lo[t] = _mm512_fmadd_ps(scale, _mm512_cvtepi32_ps(sum_lo), acc_lo[t]);
            acc_hi[t] = _mm512_fmadd_ps(scale, _mm512_cvtepi32_ps(sum_hi), acc_hi[t]);
        }
    }
    for t in 0..NJ {
        let (mut lo, mut hi, mut off) = ([0.0f32; 16], [0.0f32; 16], [0.0f32; 8]);
        _mm512_storeu_ps(lo.as_mut_ptr(), acc_lo[t]);
        _mm512_storeu_ps(hi.as_mut_ptr(), acc_hi[t]);
        _mm256_storeu_ps(off.as_mut_ptr(), acc_off[t]);
        for i in 0..nr {
            let sum = hsum_tree(&lo[4 * i..], &hi[4 * i..]);
            out[i][t] = if fmt::has_min(FMT) { sum + off[2 * i + 1] } else { sum };
        }
    }
}

/// Q8_0 tile: `NP` row pairs × `NJ` activation rows.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
#[inline]
unsafe fn q8_pairs<const NP: usize, const NJ: usize>(
    w: *const u8,
    row_bytes: usize,
    a: &Acts,
    j0: usize,
    out: &mut TileOut,
) {
    const BLOCK: usize = 34;
    let nb = a.k / QK;
    let scale_idx = _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1);
    let bias = _mm512_set1_epi8(-128);
    debug_assert!(a.q8_neg_sums.len() >= (j0 + NJ) * nb);
    let mut acc = [[_mm512_setzero_ps(); NJ]; NP];
    let ys = a.q8_qs.as_ptr().add(j0 * a.k);
    let ds = a.q8_ds.as_ptr().add(j0 * nb) as *const f32;
    for b in 0..nb {
        let mut y = [_mm512_setzero_si512(); NJ];
        let mut corr = [_mm512_setzero_si512(); NJ];
        let mut dx = [_mm_setzero_ps(); NJ];
        for t in 0..NJ {
            y[t] = _mm512_broadcast_i64x4(_mm256_loadu_si256(ys.add(t * a.k + b * QK) as *const __m256i));
            // -128 Σ y over each lane's four bytes: (w + 128) · y summed, minus this, is w · y.
            let sums = a.q8_neg_sums.as_ptr().add((j0 + t) * nb + b) as *const __m256i;
            corr[t] = _mm512_slli_epi32::<7>(_mm512_broadcast_i64x4(_mm256_loadu_si256(sums)));
            dx[t] = _mm_set1_ps(*ds.add(2 * (t * nb + b)));
        }
        if NJ == 1 {
            prefetch_share(w, PREFETCH_TILES * 2 * NP * row_bytes, b, 2 * NP * BLOCK);
        }
        for p in 0..NP {
            let b0 = w.add(2 * p * row_bytes + b * BLOCK);
            let b1 = b0.add(row_bytes);
            let h = _mm_insert_epi16(
                _mm_cvtsi32_si128(std::ptr::read_unaligned(b0 as *const u16) as i32),
                std::ptr::read_unaligned(b1 as *const u16) as i32,
                1,
            );
            let dw = _mm_cvtph_ps(h); // [d0, d1, ..]
            let qw = _mm512_inserti64x4(
                _mm512_castsi256_si512(_mm256_loadu_si256(b0.add(2) as *const __m256i)),
                _mm256_loadu_si256(b1.add(2) as *const __m256i),
                1,
            );
            let uw = _mm512_xor_si512(qw, bias); // w + 128 as unsigned bytes
            for t in 0..NJ {
                let sum = _mm512_dpbusd_epi32(corr[t], uw, y[t]);
                let scale = _mm512_permutexvar_ps(scale_idx, _mm512_castps128_ps512(_mm_mul_ps(dw, dx[t])));
                acc[p][t] = _mm512_fmadd_ps(scale, _mm512_cvtepi32_ps(sum), acc[p][t]);
            }
        }
    }
    for p in 0..NP {
        for t in 0..NJ {
            let v = acc[p][t];
            let (q0, q1, q2, q3) = (
                _mm512_castps512_ps128(v),
                _mm512_extractf32x4_ps(v, 1),
                _mm512_extractf32x4_ps(v, 2),
                _mm512_extractf32x4_ps(v, 3),
            );
            out[2 * p][t] = hsum_halves(q0, q1);
            out[2 * p + 1][t] = hsum_halves(q2, q3);
        }
    }
}

/// Runs a pair kernel over `nr` rows: `nr / 2` pairs by `$pairs::<NP, NJ>`, an odd last row
/// by the AVX2 tile kernel `$single` (bit-identical results).
macro_rules! pair_tile {
    ($name:ident, $pairs:ident, $single:path) => {
        /// Tile kernel (see [`TileFn`](super::matmul::TileFn)): `1 <= nr <= 4` rows,
        /// `1 <= nj <= 4` activation rows. Requires AVX-512 F/BW/VL/VNNI, AVX2, FMA, F16C.
        #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
        pub(super) unsafe fn $name(w: &[u8], nr: usize, a: &Acts, j0: usize, nj: usize, out: &mut TileOut) {
            debug_assert!((1..=4).contains(&nr) && (1..=4).contains(&nj));
            let row_bytes = w.len() / nr;
            let wp = w.as_ptr();
            let np = nr / 2;
            match (np, nj) {
                (0, _) => {}
                (1, 1) => $pairs::<1, 1>(wp, row_bytes, a, j0, out),
                (1, 2) => $pairs::<1, 2>(wp, row_bytes, a, j0, out),
                (1, 3) => $pairs::<1, 3>(wp, row_bytes, a, j0, out),
                (1, _) => $pairs::<1, 4>(wp, row_bytes, a, j0, out),
                (_, 1) => $pairs::<2, 1>(wp, row_bytes, a, j0, out),
                (_, 2) => $pairs::<2, 2>(wp, row_bytes, a, j0, out),
                (_, 3) => $pairs::<2, 3>(wp, row_bytes, a, j0, out),
                (_, _) => $pairs::<2, 4>(wp, row_bytes, a, j0, out),
            }
            if nr % 2 == 1 {
                let last = nr - 1;
                let mut tail: TileOut = Default::default();
                $single(&w[last * row_bytes..nr * row_bytes], 1, a, j0, nj, &mut tail);
                out[last] = tail[0];
            }
        }
    };
}

pair_tile!(q8_0, q8_pairs, dot_avx2::q8_0);

/// Defines a [`TileFn`](super::matmul::TileFn) over [`nibble_quad`] for one format.
macro_rules! quad_tile {
    ($name:ident, $fmt:path) => {
        /// Tile kernel (see [`TileFn`](super::matmul::TileFn)): `1 <= nr <= 4` rows,
        /// `1 <= nj <= 4` activation rows. Requires AVX-512 F/BW/VL/VNNI, AVX2, FMA, F16C.
        #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
        pub(super) unsafe fn $name(w: &[u8], nr: usize, a: &Acts, j0: usize, nj: usize, out: &mut TileOut) {
            debug_assert!((1..=4).contains(&nr) && (1..=4).contains(&nj));
            let (wp, rb) = (w.as_ptr(), w.len() / nr);
            match nj {
                1 => nibble_quad::<1, { $fmt }>(wp, rb, nr, a, j0, out),
                2 => nibble_quad::<2, { $fmt }>(wp, rb, nr, a, j0, out),
                3 => nibble_quad::<3, { $fmt }>(wp, rb, nr, a, j0, out),
                _ => nibble_quad::<4, { $fmt }>(wp, rb, nr, a, j0, out),
            }
        }
    };
}

quad_tile!(q4_0, fmt::Q4_0);
quad_tile!(q4_1, fmt::Q4_1);
quad_tile!(q5_0, fmt::Q5_0);
quad_tile!(q5_1, fmt::Q5_1);
quad_tile!(iq4_nl, fmt::IQ4_NL);
