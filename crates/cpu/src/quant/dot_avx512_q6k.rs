//! AVX-512 VNNI tile kernel for Q6_K × Q8_K: up to 16 weight rows × up to 16 activation rows,
//! one output per 32-bit lane, in llama.cpp's orders ([`reference_q6k`](super::reference_q6k):
//! the dot product's, or with `Acts::tiled` the tiled matmul's, which takes the eight lanes'
//! exact sum per super-block), straight from plain rows.
//!
//! The order keeps eight i32 lanes per output and super-block: lane `l` sums, over the eight
//! 32-value vectors `v`, `sc_g · (the four products 32v + 4l .. 32v + 4l + 4)` with `g = 2v +
//! [l ≥ 4]`, less `32 (sc_2l bsums_2l + sc_2l+1 bsums_2l+1)`; each lane is multiply-added into its
//! own f32 accumulator. Here lane `i` of every vector belongs to weight row `i` of the tile, and
//! the eight reference lanes are eight accumulators:
//! - per super-block, the rows' `ql`, `qh` and scale bytes are transposed four bytes at a time
//!   and the six-bit codes unpacked from them (`P[v][l]`: lane `i` holds codes `32v + 4l ..+ 4`
//!   of row `i`), once for all the tile's activation rows;
//! - per activation row, `vpmaddubsw` of `P[v][l]` against the activation's matching four bytes
//!   (broadcast) gives each row's two pair sums, and `vpdpwssd` by the row's scale `sc_g` (as an
//!   i16 pair) adds `sc_g ·` their sum into accumulator `l` — exact integers throughout;
//! - the offset term is one `vpmaddwd` per lane, the float steps run lane-wise in the
//!   reference's order, and the final `((a0 + a4) + (a2 + a6)) + ((a1 + a5) + (a3 + a7))` too.
//!
//! The tiled order (`Acts::tiled`, prefill) takes only each super-block's exact integer total,
//! so there the codes meet the activations in `vpdpbusd` (four per 16-value group, the group's
//! exact dot in each lane) and one `vpmulld` applies the group's scale: six port-0 uops per group
//! and activation row where the dot product's order needs eight.
//!
//! With fewer activation rows the transposition does not pay; those tiles (decode, draft
//! verification) run the row kernel ([`dot_avx512_k`](super::dot_avx512_k)), which gives the same
//! bits.

// Kernels index several parallel arrays by the same lane or row.
#![allow(clippy::needless_range_loop)]

use super::blocks::{BlockQ8K, QK_K};
use super::dot_avx512_q4k::transpose_rows;
use super::types::{Acts, TileOut};
use std::arch::x86_64::*;

const BLOCK: usize = 210;
/// Weight rows of a tile (lanes of a vector).
pub(super) const ROWS: usize = 16;
/// Activation rows of a tile.
pub(super) const ACTS: usize = 16;

/// The tile's codes of the block at `at` of each row, transposed: `P[v][l]`, lane `i` holding
/// codes `32v + 4l .. 32v + 4l + 4` (0..63) of row `i`. The raw `ql` and `qh` bytes are
/// transposed first (a code's bits sit at the same byte position of its `ql` and `qh` dwords), so
/// the unpacking runs on all sixteen rows at once.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
#[inline]
unsafe fn codes(rows: &[*const u8; ROWS], at: usize) -> [[__m512i; 8]; 8] {
    let m4 = _mm512_set1_epi8(0x0F);
    let m3 = _mm512_set1_epi8(3);
    let mut p = [[_mm512_setzero_si512(); 8]; 8];
    for h in 0..2 {
        // Values 128h + 32s + j (s = 0..4, j = 0..32): low (s = 0, 1) or high (s = 2, 3) nibble of
        // ql byte 64h + 32 (s % 2) + j, and bits 2s, 2s + 1 of qh byte 32h + j.
        let ql = [transpose_rows(rows, at + 64 * h), transpose_rows(rows, at + 64 * h + 32)];
        let qh = transpose_rows(rows, at + 128 + 32 * h);
        for s in 0..4 {
            for k in 0..8 {
                let lo = if s < 2 { ql[s % 2][k] } else { _mm512_srli_epi16::<4>(ql[s % 2][k]) };
                let hi = _mm512_srl_epi16(qh[k], _mm_cvtsi32_si128(2 * s as i32));
                // (qh bits) << 4: a byte's two bits never reach its neighbour.
                p[4 * h + s][k] =
                    _mm512_or_si512(_mm512_and_si512(lo, m4), _mm512_slli_epi16::<4>(_mm512_and_si512(hi, m3)));
            }
        }
    }
    p
}

/// Per 16-value group `g`, each row's scale as an i16 pair `(sc_g, sc_g)`; per reference lane
/// `l`, the pair `(sc_2l, sc_2l+1)`. From the scales transposed with the 16 `qh` bytes before
/// them (bytes 176..208 of the block): lane `i` of `t[4 + m]` holds `sc[4m .. 4m + 4]` of row `i`.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
#[inline]
unsafe fn scales(rows: &[*const u8; ROWS], at: usize) -> ([__m512i; 16], [__m512i; 8]) {
    let t = transpose_rows(rows, at + 176);
    // Byte b0 of each dword into the high byte of word 0, b1 into that of word 1; an
    // arithmetic shift then sign-extends them.
    let ctl = |b0: i8, b1: i8| {
        let mut c = [0i8; 16];
        for d in 0..4 {
            c[4 * d] = -1;
            c[4 * d + 1] = 4 * d as i8 + b0;
            c[4 * d + 2] = -1;
            c[4 * d + 3] = 4 * d as i8 + b1;
        }
        _mm512_broadcast_i32x4(_mm_loadu_si128(c.as_ptr() as *const __m128i))
    };
    let sc = std::array::from_fn(|g| {
        let e = (g % 4) as i8;
        _mm512_srai_epi16::<8>(_mm512_shuffle_epi8(t[4 + g / 4], ctl(e, e)))
    });
    let sc2 = std::array::from_fn(|l| {
        let e = (2 * l % 4) as i8;
        _mm512_srai_epi16::<8>(_mm512_shuffle_epi8(t[4 + l / 2], ctl(e, e + 1)))
    });
    (sc, sc2)
}

/// The tile: `out[i][t] = W_i · x_{j0 + t}` for `i < nr`, `t < nj <= 16`.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn tile(w: &[u8], nr: usize, a: &Acts, j0: usize, nj: usize, out: &mut TileOut) {
    let nb = a.k / QK_K;
    let rb = w.len() / nr;
    debug_assert!((1..=ROWS).contains(&nr) && nj <= ACTS && rb == nb * BLOCK && a.q8k.len() >= (j0 + nj) * nb);
    // Lanes past nr repeat the last row (computed, never stored).
    let rows: [*const u8; ROWS] = std::array::from_fn(|i| w.as_ptr().add(i.min(nr - 1) * rb));
    let mut facc = [[_mm512_setzero_ps(); 8]; ACTS];
    for b in 0..nb {
        let at = b * BLOCK;
        let p = codes(&rows, at);
        let (scv, sc2v) = scales(&rows, at);
        let d: [u16; ROWS] = std::array::from_fn(|i| std::ptr::read_unaligned(rows[i].add(at + 208) as *const u16));
        let dv = _mm512_cvtph_ps(_mm256_loadu_si256(d.as_ptr() as *const __m256i));
        // The scales as plain i32 lanes (the high half of each (sc_g, sc_g) pair, sign-extended),
        // for the tiled order.
        let sci: [__m512i; 16] = if a.tiled {
            std::array::from_fn(|g| _mm512_srai_epi32::<16>(scv[g]))
        } else {
            [_mm512_setzero_si512(); 16]
        };
        for t in 0..nj {
            let y: &BlockQ8K = &a.q8k[(j0 + t) * nb + b];
            // Reference lane l's offset sum sc_2l bsums_2l + sc_2l+1 bsums_2l+1 (times 32 below).
            let offset = |l: usize| {
                let bs = (y.bsums[2 * l] as u16 as u32 | (y.bsums[2 * l + 1] as u16 as u32) << 16) as i32;
                _mm512_madd_epi16(sc2v[l], _mm512_set1_epi32(bs))
            };
            if a.tiled {
                // The tiled order needs only the block's exact integer total, so any exact
                // grouping will do: each 16-value group's dot by four `vpdpbusd` (codes 0..63
                // unsigned against the signed activations, |·| < 2^17), times its scale by one
                // `vpmulld` — six port-0 uops per group where `vpmaddubsw` + `vpdpwssd` take eight.
                // The total stays below 16 · 2^17 · 128 = 2^28 in magnitude.
                let mut total = _mm512_setzero_si512();
                for v in 0..8 {
                    for half in 0..2 {
                        let mut dot = _mm512_setzero_si512();
                        for l in 4 * half..4 * half + 4 {
                            let yq = std::ptr::read_unaligned(y.qs.as_ptr().add(32 * v + 4 * l) as *const i32);
                            dot = _mm512_dpbusd_epi32(dot, p[v][l], _mm512_set1_epi32(yq));
                        }
                        total = _mm512_add_epi32(total, _mm512_mullo_epi32(dot, sci[2 * v + half]));
                    }
                }
                let offsets = (0..8).fold(_mm512_setzero_si512(), |s, l| _mm512_add_epi32(s, offset(l)));
                let total = _mm512_sub_epi32(total, _mm512_slli_epi32::<5>(offsets));
                // The tiled matmul's order: fma(f32(total) · d, d_y, out) per super-block.
                let r = _mm512_mul_ps(_mm512_cvtepi32_ps(total), dv);
                facc[t][0] = _mm512_fmadd_ps(r, _mm512_set1_ps(y.d), facc[t][0]);
                continue;
            }
            let mut acc = [_mm512_setzero_si512(); 8];
            for v in 0..8 {
                for l in 0..8 {
                    let yq = std::ptr::read_unaligned(y.qs.as_ptr().add(32 * v + 4 * l) as *const i32);
                    let pairs = _mm512_maddubs_epi16(p[v][l], _mm512_set1_epi32(yq));
                    acc[l] = _mm512_dpwssd_epi32(acc[l], pairs, scv[2 * v + l / 4]);
                }
            }
            let dd = _mm512_mul_ps(dv, _mm512_set1_ps(y.d));
            for l in 0..8 {
                let lane = _mm512_sub_epi32(acc[l], _mm512_slli_epi32::<5>(offset(l)));
                facc[t][l] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(lane), dd, facc[t][l]);
            }
        }
    }
    for t in 0..nj {
        let f = &facc[t];
        let sum = if a.tiled {
            f[0]
        } else {
            _mm512_add_ps(
                _mm512_add_ps(_mm512_add_ps(f[0], f[4]), _mm512_add_ps(f[2], f[6])),
                _mm512_add_ps(_mm512_add_ps(f[1], f[5]), _mm512_add_ps(f[3], f[7])),
            )
        };
        let mut lanes = [0.0f32; ROWS];
        _mm512_storeu_ps(lanes.as_mut_ptr(), sum);
        for i in 0..nr {
            out[i][t] = lanes[i];
        }
    }
}

/// Fewest activation rows a transposed tile takes: below, the row kernel (four activation
/// rows a pass) costs less than the per-super-block transposition. With tiles from 3 rows up,
/// draft-verification steps of 3 and 9 tokens on Qwen2.5-Coder-1.5B ran 40 % and 12 % slower
/// (`pagekv bench speculative -m qwen2.5-coder-1.5b`'s cost table); with 16-row tiles prefill
/// runs a few percent faster.
pub(super) const MIN_TILE_ACTS: usize = 12;

/// Tile kernel (see [`TileFn`](super::matmul::TileFn)) for `nr <= 16` rows and `nj <= 16`
/// activation rows; requires AVX-512 F/BW/VL/VNNI, AVX2, FMA and F16C.
pub(super) unsafe fn q6_k(w: &[u8], nr: usize, a: &Acts, j0: usize, nj: usize, out: &mut TileOut) {
    if nj >= MIN_TILE_ACTS {
        return tile(w, nr, a, j0, nj, out);
    }
    let rb = w.len() / nr;
    for t0 in (0..nj).step_by(4) {
        let n = (nj - t0).min(4);
        for i in 0..nr {
            let mut four = [0.0f32; 4];
            super::dot_avx512_k::q6_k(&w[i * rb..(i + 1) * rb], a, j0 + t0, n, &mut four);
            out[i][t0..t0 + n].copy_from_slice(&four[..n]);
        }
    }
}
