//! AVX-512 (F, BW, VL) + VNNI tile kernels for Q4_0, Q4_1 and Q8_0 weights × Q8 activations,
//! bit-exact with the AVX2 kernels of [`dot_avx2`](super::dot_avx2).
//!
//! Exactness: the AVX2 kernel keeps, per (weight row, activation row), eight f32 lanes; lane
//! `l` accumulates over the blocks `fma(d_w d_x, (f32) p_l, acc_l)`, where `p_l` is the
//! integer sum of the four byte products `4l..4l+4` of the block's 32 unpacked codes, and the
//! eight lanes are summed by one fixed tree at the end (ggml's `hsum_float_8`). Here a 512-bit
//! register carries the eight lanes of **two weight rows** (a row pair), so every lane sees
//! the same integers (`vpdpbusd` forms the same four-product sums as `vpmaddubsw` +
//! `vpmaddwd`, in exact integer arithmetic), the same scale and the same FMA sequence, and
//! the final sums use the same tree: the results are bit-identical, only the work per
//! instruction doubles and the two integer multiply steps become one.
//!
//! Lane layout of a row pair `(r0, r1)` in 128-bit quarters:
//! - Q4_0/Q4_1: `[r0 lanes 0-3, r1 lanes 0-3, r0 lanes 4-7, r1 lanes 4-7]`: the two rows' 16
//!   code bytes are loaded side by side and split into low nibbles (quarters 0, 1) and high
//!   nibbles (quarters 2, 3); the activation block is laid out to match once per tile as
//!   `[y0..16, y0..16, y16..32, y16..32]`.
//! - Q8_0: `[r0 lanes 0-7, r1 lanes 0-7]` against `[y, y]`. Signed × signed has no VNNI
//!   instruction on these CPUs, so the weights are offset to unsigned (`w ^ 0x80 = w + 128`)
//!   and the exact correction `-128 Σ y` (per lane, computed once per activation block) is the
//!   accumulator `vpdpbusd` starts from.
//!
//! A tile is `NP` row pairs × `NJ` activation rows; an odd last row goes to the AVX2 kernel
//! (identical results).

use super::blocks::QK;
use super::dot_avx2;
use super::matmul::{Acts, TileOut};
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

/// How many tiles ahead decode prefetches (1 and 2 measured alike, 0 about 30% slower and 3
/// a little slower: `cargo bench -p pagekv-cpu --bench decode_matvec`, one thread).
const PREFETCH_TILES: usize = 2;

/// Decode streams the weights from memory with little work per byte, so the hardware
/// prefetchers (which stop at page boundaries and see eight interleaved short row streams)
/// fall behind: each block of a tile asks for the same place in the tile that follows,
/// `dist` bytes on. A prefetch never faults, so reaching past the matrix is harmless.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
#[inline]
unsafe fn prefetch_next_tile(b0: *const u8, b1: *const u8, dist: usize) {
    _mm_prefetch(b0.wrapping_add(dist) as *const i8, _MM_HINT_T0);
    _mm_prefetch(b1.wrapping_add(dist) as *const i8, _MM_HINT_T0);
}

/// `[d0, off0, d1, off1]` of the block headers at `b0` and `b1`: Q4_1 `[d, m]`, Q4_0 `[d, -8d]`.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
#[inline]
unsafe fn pair_header<const Q4_1: bool>(b0: *const u8, b1: *const u8) -> __m128 {
    if Q4_1 {
        let h = _mm_insert_epi32(
            _mm_cvtsi32_si128(std::ptr::read_unaligned(b0 as *const i32)),
            std::ptr::read_unaligned(b1 as *const i32),
            1,
        );
        _mm_cvtph_ps(h)
    } else {
        let h = _mm_insert_epi16(
            _mm_cvtsi32_si128(std::ptr::read_unaligned(b0 as *const u16) as i32),
            std::ptr::read_unaligned(b1 as *const u16) as i32,
            1,
        );
        let d = _mm_cvtph_ps(h); // [d0, d1, ..]
                                 // -8 d is exact (a power-of-two scaling), as in the AVX2 kernel.
        _mm_mul_ps(_mm_unpacklo_ps(d, d), _mm_setr_ps(1.0, -8.0, 1.0, -8.0))
    }
}

/// The 32 + 32 codes of two Q4 blocks (16 bytes each at `q0`, `q1`) as
/// `[lo(q0), lo(q1), hi(q0), hi(q1)]`.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
#[inline]
unsafe fn unpack_pair(q0: *const u8, q1: *const u8) -> __m512i {
    let t = _mm256_inserti128_si256(
        _mm256_castsi128_si256(_mm_loadu_si128(q0 as *const __m128i)),
        _mm_loadu_si128(q1 as *const __m128i),
        1,
    );
    let z = _mm512_inserti64x4(_mm512_castsi256_si512(t), _mm256_srli_epi16(t, 4), 1);
    _mm512_and_si512(z, _mm512_set1_epi8(0x0F))
}

/// Q4_0/Q4_1 tile: `NP` row pairs (rows `2p`, `2p + 1` of `w`) × `NJ` activation rows.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
#[inline]
unsafe fn nibble_pairs<const NP: usize, const NJ: usize, const Q4_1: bool>(
    w: *const u8,
    row_bytes: usize,
    a: &Acts,
    j0: usize,
    out: &mut TileOut,
) {
    let (block, qs_off) = if Q4_1 { (20, 4) } else { (18, 2) };
    let nb = a.k / QK;
    // Scale lane d·d_x of r0 (f32 lane 0 of the header product) into quarters 0 and 2,
    // r1's (lane 2) into quarters 1 and 3.
    let scale_idx = _mm512_setr_epi32(0, 0, 0, 0, 2, 2, 2, 2, 0, 0, 0, 0, 2, 2, 2, 2);
    let mut acc = [[_mm512_setzero_ps(); NJ]; NP];
    let mut acc_off = [[_mm_setzero_ps(); NJ]; NP];
    let ys = a.q8_qs.as_ptr().add(j0 * a.k);
    let ds = a.q8_ds.as_ptr().add(j0 * nb) as *const f64;
    for b in 0..nb {
        let mut y = [_mm512_setzero_si512(); NJ];
        let mut dx = [_mm_setzero_ps(); NJ];
        for t in 0..NJ {
            let yv = _mm512_castsi256_si512(_mm256_loadu_si256(ys.add(t * a.k + b * QK) as *const __m256i));
            y[t] = _mm512_shuffle_i64x2(yv, yv, 0b01_01_00_00);
            dx[t] = _mm_castpd_ps(_mm_loaddup_pd(ds.add(t * nb + b))); // [d_x, s_x, d_x, s_x]
        }
        for p in 0..NP {
            let b0 = w.add(2 * p * row_bytes + b * block);
            let b1 = b0.add(row_bytes);
            if NJ == 1 {
                prefetch_next_tile(b0, b1, PREFETCH_TILES * 2 * NP * row_bytes);
            }
            let h = pair_header::<Q4_1>(b0, b1);
            let qw = unpack_pair(b0.add(qs_off), b1.add(qs_off));
            for t in 0..NJ {
                let prod = _mm_mul_ps(h, dx[t]); // [d0 d_x, off0 s_x, d1 d_x, off1 s_x]
                acc_off[p][t] = _mm_add_ps(acc_off[p][t], prod);
                let sum = _mm512_dpbusd_epi32(_mm512_setzero_si512(), qw, y[t]);
                let scale = _mm512_permutexvar_ps(scale_idx, _mm512_castps128_ps512(prod));
                acc[p][t] = _mm512_fmadd_ps(scale, _mm512_cvtepi32_ps(sum), acc[p][t]);
            }
        }
    }
    for p in 0..NP {
        for t in 0..NJ {
            let v = acc[p][t];
            let off = acc_off[p][t];
            let (q0, q1, q2, q3) = (
                _mm512_castps512_ps128(v),
                _mm512_extractf32x4_ps(v, 1),
                _mm512_extractf32x4_ps(v, 2),
                _mm512_extractf32x4_ps(v, 3),
            );
            out[2 * p][t] = hsum_halves(q0, q2) + _mm_cvtss_f32(_mm_movehdup_ps(off));
            out[2 * p + 1][t] = hsum_halves(q1, q3) + _mm_cvtss_f32(_mm_shuffle_ps(off, off, 0b11_11_11_11));
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
            corr[t] = _mm512_sub_epi32(_mm512_setzero_si512(), _mm512_dpbusd_epi32(_mm512_setzero_si512(), bias, y[t]));
            dx[t] = _mm_set1_ps(*ds.add(2 * (t * nb + b)));
        }
        for p in 0..NP {
            let b0 = w.add(2 * p * row_bytes + b * BLOCK);
            let b1 = b0.add(row_bytes);
            if NJ == 1 {
                prefetch_next_tile(b0, b1, PREFETCH_TILES * 2 * NP * row_bytes);
            }
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
        /// Tile kernel (see [`TileFn`](super::matmul::TileFn)): `nr <= 8` rows with `nj == 1`,
        /// or `nr <= 4` rows with `nj <= 4`. Requires AVX-512 F/BW/VL/VNNI, AVX2, FMA, F16C.
        #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
        pub(super) unsafe fn $name(w: &[u8], nr: usize, a: &Acts, j0: usize, nj: usize, out: &mut TileOut) {
            debug_assert!((nj == 1 && nr <= 8) || (nr <= 4 && nj <= 4));
            let row_bytes = w.len() / nr;
            let wp = w.as_ptr();
            let np = nr / 2;
            match (np, nj) {
                (0, _) => {}
                (1, 1) => $pairs::<1, 1>(wp, row_bytes, a, j0, out),
                (2, 1) => $pairs::<2, 1>(wp, row_bytes, a, j0, out),
                (3, 1) => $pairs::<3, 1>(wp, row_bytes, a, j0, out),
                (_, 1) => $pairs::<4, 1>(wp, row_bytes, a, j0, out),
                (1, 2) => $pairs::<1, 2>(wp, row_bytes, a, j0, out),
                (1, 3) => $pairs::<1, 3>(wp, row_bytes, a, j0, out),
                (1, _) => $pairs::<1, 4>(wp, row_bytes, a, j0, out),
                (_, 2) => $pairs::<2, 2>(wp, row_bytes, a, j0, out),
                (_, 3) => $pairs::<2, 3>(wp, row_bytes, a, j0, out),
                (_, _) => $pairs::<2, 4>(wp, row_bytes, a, j0, out),
            }
            if nr % 2 == 1 {
                let last = nr - 1;
                let mut tail: TileOut = [[0.0; 4]; 8];
                $single(&w[last * row_bytes..nr * row_bytes], 1, a, j0, nj, &mut tail);
                out[last] = tail[0];
            }
        }
    };
}

#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn q4_0_pairs<const NP: usize, const NJ: usize>(
    w: *const u8,
    row_bytes: usize,
    a: &Acts,
    j0: usize,
    out: &mut TileOut,
) {
    nibble_pairs::<NP, NJ, false>(w, row_bytes, a, j0, out)
}

#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn q4_1_pairs<const NP: usize, const NJ: usize>(
    w: *const u8,
    row_bytes: usize,
    a: &Acts,
    j0: usize,
    out: &mut TileOut,
) {
    nibble_pairs::<NP, NJ, true>(w, row_bytes, a, j0, out)
}

pair_tile!(q4_0, q4_0_pairs, dot_avx2::q4_0);
pair_tile!(q4_1, q4_1_pairs, dot_avx2::q4_1);
pair_tile!(q8_0, q8_pairs, dot_avx2::q8_0);
