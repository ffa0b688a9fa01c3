//! AVX-512 VNNI decode kernel for Q4_K × Q8_K: four weight rows at a time against one to three
//! activation rows (decode, and the short steps that verify a draft), in llama.cpp's gemv order ([`reference_q4k`](super::reference_q4k)), straight from
//! plain (not repacked) rows.
//!
//! The gemv order fixes only the float steps: per super-block one `fma` of the exact integer
//! total `Σ_j sc_j Σ q y` by `d · d_y`, and one of `Σ_j mn_j (bsums_2j + bsums_2j+1)` by
//! `dmin · d_y`. How the integers are formed is free, so this kernel shares all the work it can
//! between its four rows:
//! - the four rows' 16-byte headers (f16 `d`, `dmin`, 12 packed scale bytes) sit in one vector,
//!   a 128-bit lane per row, and ggml's kmask unpacking runs once for all of them;
//! - a 64-byte load of codes holds sub-blocks `4h`, `4h + 2` in its low nibbles and `4h + 1`,
//!   `4h + 3` in its high nibbles, so the activation's 32-byte quarters are paired to match
//!   (once per super-block, shared by the rows) and no code vector is shuffled;
//! - `vpmaddubsw` then `vpdpwssd` by the pair's two scales (a `vpshufb` of the row's scale
//!   words) accumulate each row's total in sixteen i32 lanes; the four rows' lanes are summed
//!   together in one transposing tree, and the min terms in one `vpmaddwd`;
//! - the float steps run on `[acc_0, accm_0, acc_1, accm_1, ..]` lane-wise, each lane exactly
//!   the reference's `mul_add` sequence for its output.
//!
//! Per row and super-block that is about twenty 512-bit instructions against the row kernel's
//! forty-odd with two horizontal sums, which moves the Q4_K decode product from arithmetic-bound
//! to memory-bound on two Zen 4 cores.

use super::blocks::{BlockQ8K, QK_K};
use super::dot_avx2::{prefetch_share, K_PREFETCH_ROWS};
use super::types::{Acts, TileOut, TILE_MAX_ACTS};
use std::arch::x86_64::*;

const BLOCK: usize = 144;
/// Weight rows per call.
pub(super) const ROWS: usize = 4;

/// Most activation rows per call.
pub(super) const MAX_ACTS: usize = 3;

/// Rows `0..nr` of `w` against activation rows `j0..j0 + nj` (`nj <= 3`), every output in the
/// gemv order: `out[i][t] = W_i · x_{j0 + t}`. Four rows at a time; the header work is shared by
/// the activation rows too.
///
/// # Safety
/// As [`TileFn`](super::matmul::TileFn) with `nj <= 3`; requires AVX-512 F/BW/VL/VNNI, AVX2, FMA
/// and F16C.
pub(super) unsafe fn q4_k_gemv(w: &[u8], nr: usize, a: &Acts, j0: usize, nj: usize, out: &mut TileOut) {
    let rb = w.len() / nr;
    for r0 in (0..nr).step_by(ROWS) {
        let n = (nr - r0).min(ROWS);
        let quad = &w[r0 * rb..(r0 + n) * rb];
        match nj {
            1 => gemv4::<1>(quad, n, a, j0, &mut out[r0..r0 + n]),
            2 => gemv4::<2>(quad, n, a, j0, &mut out[r0..r0 + n]),
            _ => gemv4::<3>(quad, n, a, j0, &mut out[r0..r0 + n]),
        }
    }
}

/// Rows `0..nr` (`nr <= 4`) of `w` against activation rows `j0..j0 + NJ`, in the gemv order:
/// `out[i][t]`, `out` holding the `nr` rows' lines of the tile.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn gemv4<const NJ: usize>(w: &[u8], nr: usize, a: &Acts, j0: usize, out: &mut [[f32; TILE_MAX_ACTS]]) {
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
        // Min terms: Σ_j mn_j (bsums_2j + bsums_2j+1), one i32 per lane after the in-lane sum.
        let msum: [__m128i; NJ] = std::array::from_fn(|t| {
            let bs = _mm256_loadu_si256(ys[t].bsums.as_ptr() as *const __m256i);
            let bs = _mm256_madd_epi16(bs, _mm256_set1_epi16(1));
            let bs = _mm256_packs_epi32(bs, bs); // pairs fit i16: |Σ 32 codes| <= 4096
            let bs = _mm256_permute4x64_epi64::<0b00_00_10_00>(bs);
            let m = _mm512_madd_epi16(mn16, _mm512_broadcast_i32x4(_mm256_castsi256_si128(bs)));
            let m = _mm512_add_epi32(m, _mm512_shuffle_epi32::<0b01_00_11_10>(m));
            let m = _mm512_add_epi32(m, _mm512_shuffle_epi32::<0b10_11_00_01>(m));
            _mm512_castsi512_si128(_mm512_permutexvar_epi32(lane_heads, m))
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
        let mut isum = [[zero; ROWS]; NJ];
        for r in 0..ROWS {
            for h in 0..2 {
                let v = _mm512_loadu_si512(rows[r].add(at + 16 + 64 * h) as *const __m512i);
                let lo = _mm512_and_si512(v, nibble);
                let hi = _mm512_and_si512(_mm512_srli_epi16::<4>(v), nibble);
                let sc_lo = _mm512_shuffle_epi8(row_sc[r], pick[2 * h]);
                let sc_hi = _mm512_shuffle_epi8(row_sc[r], pick[2 * h + 1]);
                for t in 0..NJ {
                    let s = _mm512_dpwssd_epi32(isum[t][r], _mm512_maddubs_epi16(lo, yv[t][2 * h]), sc_lo);
                    isum[t][r] = _mm512_dpwssd_epi32(s, _mm512_maddubs_epi16(hi, yv[t][2 * h + 1]), sc_hi);
                }
            }
        }
        // [d_0, dmin_0, d_1, dmin_1, ..] of the rows.
        let dmins = _mm256_cvtph_ps(_mm512_castsi512_si128(_mm512_permutexvar_epi32(lane_heads, hdr)));
        for t in 0..NJ {
            let isum = sum_lanes4(isum[t]);
            // · d_y, each one rounded product as in the reference.
            let dd = _mm256_mul_ps(dmins, _mm256_set1_ps(ys[t].d));
            let sums = _mm256_inserti128_si256::<1>(
                _mm256_castsi128_si256(_mm_unpacklo_epi32(isum, msum[t])),
                _mm_unpackhi_epi32(isum, msum[t]),
            );
            acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sums), dd, acc[t]);
        }
    }
    for t in 0..NJ {
        let mut lanes = [0.0f32; 2 * ROWS];
        _mm256_storeu_ps(lanes.as_mut_ptr(), acc[t]);
        for i in 0..nr {
            out[i][t] = lanes[2 * i] - lanes[2 * i + 1];
        }
    }
}

/// `[Σ v_0, Σ v_1, Σ v_2, Σ v_3]` of four vectors of sixteen i32 lanes (exact).
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
#[inline]
unsafe fn sum_lanes4(v: [__m512i; ROWS]) -> __m128i {
    let s01 = _mm512_add_epi32(_mm512_unpacklo_epi32(v[0], v[1]), _mm512_unpackhi_epi32(v[0], v[1]));
    let s23 = _mm512_add_epi32(_mm512_unpacklo_epi32(v[2], v[3]), _mm512_unpackhi_epi32(v[2], v[3]));
    let t = _mm512_add_epi32(_mm512_unpacklo_epi64(s01, s23), _mm512_unpackhi_epi64(s01, s23));
    let h = _mm256_add_epi32(_mm512_castsi512_si256(t), _mm512_extracti64x4_epi64::<1>(t));
    _mm_add_epi32(_mm256_castsi256_si128(h), _mm256_extracti128_si256::<1>(h))
}
