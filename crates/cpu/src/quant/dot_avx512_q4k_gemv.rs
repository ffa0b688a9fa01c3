//! AVX-512 VNNI kernel for Q4_K × Q8_K with few activation rows: four weight rows at a time
//! against one to four activation rows (decode, and the short steps that verify a draft), in
//! either of llama.cpp's orders ([`reference_q4k`](super::reference_q4k)), straight from plain
//! (not repacked) rows.
//!
//! The orders fix only the float steps: per super-block one `fma` of the exact integer total
//! `Σ_j sc_j Σ q y` by `d · d_y` and one of the min term `Σ_j mn_j (bsums_2j + bsums_2j+1)` by
//! `dmin · d_y` (gemv), or those per pair of sub-blocks (gemm). How the integers are formed is
//! free, so this kernel shares all the work it can between its rows:
//! - the four rows' 16-byte headers (f16 `d`, `dmin`, 12 packed scale bytes) sit in one vector,
//!   a 128-bit lane per row, and ggml's kmask unpacking runs once for all of them;
//! - a 64-byte load of codes holds sub-blocks `4h`, `4h + 2` in its low nibbles and `4h + 1`,
//!   `4h + 3` in its high nibbles, so the activation's 32-byte quarters are paired to match
//!   (once per super-block, shared by the rows) and no code vector is shuffled; its low 256
//!   bits then belong to pair `2h`, its high 256 bits to pair `2h + 1`;
//! - `vpmaddubsw` then `vpdpwssd` by the two scales (a `vpshufb` of the row's scale words)
//!   accumulate each row's sums in sixteen i32 lanes, and the four rows' lanes are summed
//!   together in one transposing tree; the min terms are one `vpmaddwd` (a dword per pair);
//! - the float steps run on `[acc_0, accm_0, acc_1, accm_1, ..]` lane-wise, each lane exactly
//!   the reference's `mul_add` sequence for its output.
//!
//! Per row and super-block that is about twenty 512-bit instructions against the row kernel's
//! forty-odd with two horizontal sums, which moves the Q4_K decode product from arithmetic-bound
//! to memory-bound on two Zen 4 cores, and a few activation rows cost far less than transposing
//! sixteen rows for them ([`dot_avx512_q4k`](super::dot_avx512_q4k)'s tiles).

use super::blocks::{BlockQ8K, QK_K};
use super::dot_avx2::{prefetch_share, K_PREFETCH_ROWS};
use super::types::{Acts, TileOut, TILE_MAX_ACTS};
use std::arch::x86_64::*;

const BLOCK: usize = 144;
/// Weight rows per pass.
const ROWS: usize = 4;
/// Most activation rows per call.
pub(super) const MAX_ACTS: usize = 4;

/// Rows `0..nr` of `w` against activation rows `j0..j0 + nj` (`nj <= 4`), every output in the
/// gemm order (`gemm`) or the gemv order: `out[i][col + t] = W_i · x_{j0 + t}`.
///
/// # Safety
/// As [`TileFn`](super::matmul::TileFn) with `nj <= 4`; requires AVX-512 F/BW/VL/VNNI, AVX2, FMA
/// and F16C.
#[allow(clippy::too_many_arguments)]
pub(super) unsafe fn q4_k_few(
    w: &[u8],
    nr: usize,
    a: &Acts,
    j0: usize,
    nj: usize,
    gemm: bool,
    col: usize,
    out: &mut TileOut,
) {
    let rb = w.len() / nr;
    for r0 in (0..nr).step_by(ROWS) {
        let n = (nr - r0).min(ROWS);
        let (quad, o) = (&w[r0 * rb..(r0 + n) * rb], &mut out[r0..r0 + n]);
        match (nj, gemm) {
            (1, false) => quad_rows::<1, false>(quad, n, a, j0, col, o),
            (2, false) => quad_rows::<2, false>(quad, n, a, j0, col, o),
            (3, false) => quad_rows::<3, false>(quad, n, a, j0, col, o),
            (_, false) => quad_rows::<4, false>(quad, n, a, j0, col, o),
            (1, true) => quad_rows::<1, true>(quad, n, a, j0, col, o),
            (2, true) => quad_rows::<2, true>(quad, n, a, j0, col, o),
            (3, true) => quad_rows::<3, true>(quad, n, a, j0, col, o),
            (_, true) => quad_rows::<4, true>(quad, n, a, j0, col, o),
        }
    }
}

/// Rows `0..nr` (`nr <= 4`) of `w` against activation rows `j0..j0 + NJ`: `out[i][col + t]`,
/// `out` holding the `nr` rows' lines of the tile.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn quad_rows<const NJ: usize, const GEMM: bool>(
    w: &[u8],
    nr: usize,
    a: &Acts,
    j0: usize,
    col: usize,
    out: &mut [[f32; TILE_MAX_ACTS]],
) {
    let nb = a.k / QK_K;
    let rb = w.len() / nr;
    debug_assert!((1..=ROWS).contains(&nr) && rb == nb * BLOCK && a.q8k.len() >= (j0 + NJ) * nb);
    // Rows past nr repeat the last one (computed, never stored).
    let rows: [*const u8; ROWS] = std::array::from_fn(|i| w.as_ptr().add(i.min(nr - 1) * rb));
    let nibble = _mm512_set1_epi8(0x0F);
    let k1 = _mm512_set1_epi32(0x3f3f_3f3f);
    let k2 = _mm512_set1_epi32(0x0f0f_0f0f);
    let k3 = _mm512_set1_epi32(0x0303_0303);
    // u2 >> 0 for the scales' dword, u2 >> 4 for the mins'.
    let u2_shift = _mm512_set4_epi32(0, 0, 4, 0);
    let zero = _mm512_setzero_si512();
    // vpshufb controls: 128-bit lanes 0, 1 take scale word `s0` of their lane, lanes 2, 3 word
    // `s1` (every lane holding one row's eight scales as i16).
    let pick = |s0: i8, s1: i8| {
        let w = |s: i8| _mm_set1_epi16(i16::from_le_bytes([(2 * s) as u8, (2 * s + 1) as u8]));
        let lo = _mm256_broadcastsi128_si256(w(s0));
        _mm512_inserti64x4::<1>(_mm512_castsi256_si512(lo), _mm256_broadcastsi128_si256(w(s1)))
    };
    let pick = [pick(0, 2), pick(1, 3), pick(4, 6), pick(5, 7)];
    // Dword 0 of each 128-bit lane, gathered into the low four dwords.
    let lane_heads = _mm512_setr_epi32(0, 4, 8, 12, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0);
    // Dword k of each 128-bit lane r into lane k, dword r: a 4 × 4 transpose.
    let transpose = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
    // Per activation row: [acc_0, accm_0, acc_1, accm_1, acc_2, accm_2, acc_3, accm_3].
    let mut acc = [_mm256_setzero_ps(); NJ];
    for b in 0..nb {
        let ys: [&BlockQ8K; NJ] = std::array::from_fn(|t| &a.q8k[(j0 + t) * nb + b]);
        // The four rows are contiguous: one stream K_PREFETCH_ROWS rows ahead, each block step
        // asking for its share of them (per-row prefetches of the same bytes run at half the
        // speed: four short interleaved streams).
        prefetch_share(w.as_ptr(), K_PREFETCH_ROWS * rb, b, w.len() / nb);
        let at = b * BLOCK;
        // Lane r: row r's d|dmin, u0, u1, u2.
        let hdr = {
            let h = |r: usize| _mm_loadu_si128(rows[r].add(at) as *const __m128i);
            let lo = _mm256_inserti128_si256::<1>(_mm256_castsi128_si256(h(0)), h(1));
            let hi = _mm256_inserti128_si256::<1>(_mm256_castsi128_si256(h(2)), h(3));
            _mm512_inserti64x4::<1>(_mm512_castsi256_si512(lo), hi)
        };
        // ggml's kmask unpacking in every lane: x = [u0, u1, ..], s = [u2, u2 >> 4, ..].
        let x = _mm512_shuffle_epi32::<0b11_11_10_01>(hdr);
        let s = _mm512_srlv_epi32(_mm512_shuffle_epi32::<0b11_11_11_11>(hdr), u2_shift);
        let lo = _mm512_and_si512(x, k1); // [sc_lo, mn_lo, ..]
        let hi = _mm512_or_si512(
            _mm512_and_si512(s, k2),
            _mm512_slli_epi32::<4>(_mm512_and_si512(_mm512_srli_epi32::<6>(x), k3)),
        ); // [sc_hi, mn_hi, ..]
        let sm = _mm512_unpacklo_epi32(lo, hi); // bytes sc0..sc7, mn0..mn7 per lane
        let sc16 = _mm512_unpacklo_epi8(sm, zero);
        let mn16 = _mm512_unpackhi_epi8(sm, zero);
        // Min terms, row r's in lane r: dword p = mn_2p bsp_2p + mn_2p+1 bsp_2p+1 (pair p),
        // with bsp_j = bsums_2j + bsums_2j+1. Gemv wants each lane's sum (in lane r's dword 0,
        // gathered to dword r); gemm each pair's four rows (in lane p, dword r).
        let msum: [__m512i; NJ] = std::array::from_fn(|t| {
            let bs = _mm256_loadu_si256(ys[t].bsums.as_ptr() as *const __m256i);
            let bs = _mm256_madd_epi16(bs, _mm256_set1_epi16(1));
            let bs = _mm256_packs_epi32(bs, bs); // pairs fit i16: |Σ 32 codes| <= 4096
            let bs = _mm256_permute4x64_epi64::<0b00_00_10_00>(bs);
            let m = _mm512_madd_epi16(mn16, _mm512_broadcast_i32x4(_mm256_castsi256_si128(bs)));
            if GEMM {
                _mm512_permutexvar_epi32(transpose, m)
            } else {
                let m = _mm512_add_epi32(m, _mm512_shuffle_epi32::<0b01_00_11_10>(m));
                let m = _mm512_add_epi32(m, _mm512_shuffle_epi32::<0b10_11_00_01>(m));
                _mm512_permutexvar_epi32(lane_heads, m)
            }
        });
        // The activation's sub-blocks paired as the code vectors hold them: y4[q] holds
        // sub-blocks 2q, 2q + 1; vector 2h pairs sub-blocks 4h, 4h + 2 and 2h + 1 pairs
        // 4h + 1, 4h + 3 (128-bit lanes 0, 1 of one load with 0, 1 of the next; 2, 3 with 2, 3).
        let yv: [[__m512i; 4]; NJ] = std::array::from_fn(|t| {
            let y4: [__m512i; 4] =
                std::array::from_fn(|q| _mm512_loadu_si512(ys[t].qs.as_ptr().add(64 * q) as *const __m512i));
            [
                _mm512_shuffle_i64x2::<0b01_00_01_00>(y4[0], y4[1]),
                _mm512_shuffle_i64x2::<0b11_10_11_10>(y4[0], y4[1]),
                _mm512_shuffle_i64x2::<0b01_00_01_00>(y4[2], y4[3]),
                _mm512_shuffle_i64x2::<0b11_10_11_10>(y4[2], y4[3]),
            ]
        });
        // Row r's scales in every lane.
        let row_sc = [
            _mm512_shuffle_i32x4::<0x00>(sc16, sc16),
            _mm512_shuffle_i32x4::<0x55>(sc16, sc16),
            _mm512_shuffle_i32x4::<0xAA>(sc16, sc16),
            _mm512_shuffle_i32x4::<0xFF>(sc16, sc16),
        ];
        // Integer sums, per activation row: gemv one [rows] vector (the super-block's totals),
        // gemm one per pair. Each h leaves its rows' 16-lane sums reduced to four lanes per
        // 128-bit quarter (quarters 0, 1 pair 2h; 2, 3 pair 2h + 1).
        let mut isum = [[zero; 2]; NJ];
        for h in 0..2 {
            let mut part = [[zero; ROWS]; NJ];
            for r in 0..ROWS {
                let v = _mm512_loadu_si512(rows[r].add(at + 16 + 64 * h) as *const __m512i);
                let lo = _mm512_and_si512(v, nibble);
                let hi = _mm512_and_si512(_mm512_srli_epi16::<4>(v), nibble);
                let sc_lo = _mm512_shuffle_epi8(row_sc[r], pick[2 * h]);
                let sc_hi = _mm512_shuffle_epi8(row_sc[r], pick[2 * h + 1]);
                for t in 0..NJ {
                    let s = _mm512_dpwssd_epi32(part[t][r], _mm512_maddubs_epi16(lo, yv[t][2 * h]), sc_lo);
                    part[t][r] = _mm512_dpwssd_epi32(s, _mm512_maddubs_epi16(hi, yv[t][2 * h + 1]), sc_hi);
                }
            }
            for t in 0..NJ {
                isum[t][h] = sum_rows(part[t]);
            }
        }
        // [d_0, dmin_0, d_1, dmin_1, ..] of the rows.
        let dmins = _mm256_cvtph_ps(_mm512_castsi512_si128(_mm512_permutexvar_epi32(lane_heads, hdr)));
        for t in 0..NJ {
            // · d_y, each one rounded product as in the reference.
            let dd = _mm256_mul_ps(dmins, _mm256_set1_ps(ys[t].d));
            // `[i_r, m_r]` pairs of four rows, multiply-added in order.
            let mut add = |i: __m128i, m: __m128i| {
                let sums = _mm256_inserti128_si256::<1>(
                    _mm256_castsi128_si256(_mm_unpacklo_epi32(i, m)),
                    _mm_unpackhi_epi32(i, m),
                );
                acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sums), dd, acc[t]);
            };
            if GEMM {
                let m: [__m128i; 4] = [
                    _mm512_extracti32x4_epi32::<0>(msum[t]),
                    _mm512_extracti32x4_epi32::<1>(msum[t]),
                    _mm512_extracti32x4_epi32::<2>(msum[t]),
                    _mm512_extracti32x4_epi32::<3>(msum[t]),
                ];
                for h in 0..2 {
                    let q = isum[t][h];
                    let pair = |k0: __m128i, k1: __m128i| _mm_add_epi32(k0, k1);
                    let p0 = pair(_mm512_extracti32x4_epi32::<0>(q), _mm512_extracti32x4_epi32::<1>(q));
                    let p1 = pair(_mm512_extracti32x4_epi32::<2>(q), _mm512_extracti32x4_epi32::<3>(q));
                    add(p0, m[2 * h]);
                    add(p1, m[2 * h + 1]);
                }
            } else {
                let q = _mm512_add_epi32(isum[t][0], isum[t][1]);
                let h = _mm256_add_epi32(_mm512_castsi512_si256(q), _mm512_extracti64x4_epi64::<1>(q));
                let i = _mm_add_epi32(_mm256_castsi256_si128(h), _mm256_extracti128_si256::<1>(h));
                add(i, _mm512_castsi512_si128(msum[t]));
            }
        }
    }
    for t in 0..NJ {
        let mut lanes = [0.0f32; 2 * ROWS];
        _mm256_storeu_ps(lanes.as_mut_ptr(), acc[t]);
        for i in 0..nr {
            out[i][col + t] = lanes[2 * i] - lanes[2 * i + 1];
        }
    }
}

/// Four vectors of sixteen i32 lanes summed per 128-bit quarter: quarter `k` of the result is
/// `[Σ quarter k of v_0, .. of v_1, .. of v_2, .. of v_3]` (exact).
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
#[inline]
unsafe fn sum_rows(v: [__m512i; ROWS]) -> __m512i {
    let s01 = _mm512_add_epi32(_mm512_unpacklo_epi32(v[0], v[1]), _mm512_unpackhi_epi32(v[0], v[1]));
    let s23 = _mm512_add_epi32(_mm512_unpacklo_epi32(v[2], v[3]), _mm512_unpackhi_epi32(v[2], v[3]));
    _mm512_add_epi32(_mm512_unpacklo_epi64(s01, s23), _mm512_unpackhi_epi64(s01, s23))
}
