//! AVX-512 VNNI tile kernel for Q4_K × Q8_K: up to 16 weight rows × up to 32 activation rows,
//! one output per 32-bit lane, in llama.cpp's order ([`reference_q4k`](super::reference_q4k)),
//! straight from plain rows ([`q4_k`]) or from rows interleaved in groups of 16
//! ([`q4_k_x16`], the layout of [`interleave`](super::interleave)).
//!
//! Lane `i` of every vector belongs to weight row `i` of the tile. Per pair of sub-blocks `p`
//! (64 values, 32 packed bytes per row) the rows' bytes are transposed in registers into eight
//! vectors `P_k`, lane `i` holding bytes `4k..4k + 4` of row `i`: their low nibbles are codes
//! `4k..4k + 4` of sub-block `2p`, their high nibbles those of sub-block `2p + 1`. `vpdpbusd` of
//! these against the activation's matching 4 bytes, broadcast to every lane, accumulates each
//! row's sub-block dot in its own lane: exact, and without horizontal sums. The scales (one
//! i32 per lane) multiply the two sub-block dots (`vpmulld` in the gemv order's integer sums; in
//! the gemm order the same exact integers as floats, which cost fewer uops on the port every
//! `vpdpbusd` needs), and the mins, as i16 pairs, meet
//! the activation's pair of 32-value sums in one `vpmaddwd`. The float steps then run lane-wise
//! with the reference's per-output order, so lanes, tile shape and threads change nothing.
//!
//! The transposition (24 shuffles per pair of sub-blocks) and the scale unpacking are done once
//! per tile and shared by its activation rows. Interleaved rows already lie as `P_k` and the
//! headers as lanes, so they are plain vector loads; one activation row (decode) then takes
//! [`gemv_x16`], the same arithmetic with every vector in registers and, unlike the four-row
//! kernel on plain rows ([`dot_avx512_q4k_gemv`](super::dot_avx512_q4k_gemv)), no shuffles of
//! codes, scales or sums (`kquant_matvec -- q4_k 8960x1536 1 2 avx512 row rows|x16` compares
//! them).

// Kernels index several parallel arrays by the same lane or row.
#![allow(clippy::needless_range_loop)]

use super::blocks::{BlockQ8K, QK_K};
use super::interleave::word_offset;
use super::types::{Acts, TileOut};
use std::arch::x86_64::*;

const BLOCK: usize = 144;
/// Weight rows of a tile (lanes of a vector).
pub(super) const ROWS: usize = 16;

/// The 32 bytes at `off` of each of the 16 rows, transposed: lane `i` of vector `k` holds
/// bytes `off + 4k .. off + 4k + 4` of row `i`.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
#[inline]
pub(super) unsafe fn transpose_rows(rows: &[*const u8; ROWS], off: usize) -> [__m512i; 8] {
    // z[r]: row r's 8 dwords, then row r + 8's.
    let z: [__m512i; 8] = std::array::from_fn(|r| {
        let lo = _mm256_loadu_si256(rows[r].add(off) as *const __m256i);
        let hi = _mm256_loadu_si256(rows[r + 8].add(off) as *const __m256i);
        _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1)
    });
    // 4×4 transposes inside each 128-bit lane: u[4g + e] holds element e of rows 4g..4g + 4
    // (and of rows 4g + 8..4g + 12 in the upper 256 bits); 128-bit lane 0 holds dwords 0..4,
    // lane 1 dwords 4..8, and so on.
    let mut u = [_mm512_setzero_si512(); 8];
    for g in 0..2 {
        let (z0, z1, z2, z3) = (z[4 * g], z[4 * g + 1], z[4 * g + 2], z[4 * g + 3]);
        let t0 = _mm512_unpacklo_epi32(z0, z1);
        let t1 = _mm512_unpackhi_epi32(z0, z1);
        let t2 = _mm512_unpacklo_epi32(z2, z3);
        let t3 = _mm512_unpackhi_epi32(z2, z3);
        u[4 * g] = _mm512_unpacklo_epi64(t0, t2);
        u[4 * g + 1] = _mm512_unpackhi_epi64(t0, t2);
        u[4 * g + 2] = _mm512_unpacklo_epi64(t1, t3);
        u[4 * g + 3] = _mm512_unpackhi_epi64(t1, t3);
    }
    // Rows 0..4, 4..8, 8..12, 12..16 of dword e (even 128-bit lanes) and of dword 4 + e (odd).
    let even = _mm512_setr_epi64(0, 1, 8, 9, 4, 5, 12, 13);
    let odd = _mm512_setr_epi64(2, 3, 10, 11, 6, 7, 14, 15);
    let mut p = [_mm512_setzero_si512(); 8];
    for e in 0..4 {
        p[e] = _mm512_permutex2var_epi64(u[e], even, u[4 + e]);
        p[4 + e] = _mm512_permutex2var_epi64(u[e], odd, u[4 + e]);
    }
    p
}

/// Per-lane `(d, dmin)`, the eight scales (i32 lanes) and the four min pairs
/// `(mn_2p, mn_2p+1)` (i16 pairs) of block `b` of each row.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
#[inline]
unsafe fn block_header(rows: &[*const u8; ROWS], b: usize) -> (__m512, __m512, [__m512i; 8], [__m512i; 4]) {
    // Words 0..4 of each row's block: f16 d and dmin, then the 12 packed scale bytes.
    let mut words = [[0u32; ROWS]; 4];
    for i in 0..ROWS {
        let blk = rows[i].add(b * BLOCK);
        for w in 0..4 {
            words[w][i] = std::ptr::read_unaligned(blk.add(4 * w) as *const u32);
        }
    }
    let load = |w: usize| _mm512_loadu_si512(words[w].as_ptr() as *const __m512i);
    unpack_header([load(0), load(1), load(2), load(3)])
}

/// [`block_header`] from the header words already in lanes: word `w` of row `i`'s block in
/// lane `i` of `words[w]`.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
#[inline]
pub(super) unsafe fn unpack_header(words: [__m512i; 4]) -> (__m512, __m512, [__m512i; 8], [__m512i; 4]) {
    let [dd, u0, u1, u2] = words;
    let d = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(dd));
    let dmin = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32::<16>(dd)));
    // ggml's kmask unpacking, four rows' bytes per dword.
    let k1 = _mm512_set1_epi32(0x3f3f_3f3f);
    let k2 = _mm512_set1_epi32(0x0f0f_0f0f);
    let k3 = _mm512_set1_epi32(0x0303_0303);
    let sc_lo = _mm512_and_si512(u0, k1);
    let mn_lo = _mm512_and_si512(u1, k1);
    let sc_hi = _mm512_or_si512(
        _mm512_and_si512(u2, k2),
        _mm512_slli_epi32::<4>(_mm512_and_si512(_mm512_srli_epi32::<6>(u0), k3)),
    );
    let mn_hi = _mm512_or_si512(
        _mm512_and_si512(_mm512_srli_epi32::<4>(u2), k2),
        _mm512_slli_epi32::<4>(_mm512_and_si512(_mm512_srli_epi32::<6>(u1), k3)),
    );
    let byte = _mm512_set1_epi32(0xFF);
    let sc: [__m512i; 8] = std::array::from_fn(|j| {
        let v = if j < 4 { sc_lo } else { sc_hi };
        _mm512_and_si512(_mm512_srl_epi32(v, _mm_cvtsi32_si128(8 * (j % 4) as i32)), byte)
    });
    let third = _mm512_set1_epi32(0xFF_0000);
    let mn: [__m512i; 4] = std::array::from_fn(|p| {
        // Bytes 0 and 1 are mn_2p and mn_2p+1; spread them to the two i16 halves.
        let v = _mm512_srl_epi32(if p < 2 { mn_lo } else { mn_hi }, _mm_cvtsi32_si128(16 * (p % 2) as i32));
        _mm512_or_si512(_mm512_and_si512(v, byte), _mm512_and_si512(_mm512_slli_epi32::<8>(v), third))
    });
    (d, dmin, sc, mn)
}

/// `(Σ bsums of sub-block 2p, Σ bsums of sub-block 2p + 1)` as an i16 pair, for `p = 0..4`.
#[inline]
fn bsum_pairs(y: &BlockQ8K) -> [i32; 4] {
    let s = |j: usize| (y.bsums[2 * j] + y.bsums[2 * j + 1]) as u16 as u32;
    std::array::from_fn(|p| (s(2 * p) | s(2 * p + 1) << 16) as i32)
}

/// Activation rows of a tile.
pub(super) const ACTS: usize = 32;

/// The tile: `out[i][t] = W_i · x_{j0 + t}` for `i < nr`, `t < nj`, every output in the gemm
/// order (`GEMM`) or the gemv order, from plain rows or (`X16`) one interleaved group of 16.
/// Codes are transposed (plain rows) or loaded (interleaved) and unpacked once per pair of
/// sub-blocks and shared by all `nj` activation rows; the accumulators live in L1.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn tile<const GEMM: bool, const X16: bool>(
    w: &[u8],
    nr: usize,
    a: &Acts,
    j0: usize,
    nj: usize,
    out: &mut TileOut,
) {
    let nb = a.k / QK_K;
    let rb = w.len() / nr;
    debug_assert!((1..=ROWS).contains(&nr) && nj <= ACTS && rb == nb * BLOCK && a.q8k.len() >= (j0 + nj) * nb);
    debug_assert!(!X16 || nr == ROWS);
    // Lanes past nr repeat the last row (computed, never stored).
    let rows: [*const u8; ROWS] = std::array::from_fn(|i| w.as_ptr().add(i.min(nr - 1) * rb));
    let nibble = _mm512_set1_epi8(0x0F);
    let mut acc = [_mm512_setzero_ps(); ACTS];
    let mut accm = [_mm512_setzero_ps(); ACTS];
    let mut dd = [_mm512_setzero_ps(); ACTS];
    let mut dm = [_mm512_setzero_ps(); ACTS];
    let mut spairs = [[0i32; 4]; ACTS];
    let mut isum = [_mm512_setzero_si512(); ACTS];
    let mut msum = [_mm512_setzero_si512(); ACTS];
    for b in 0..nb {
        let (d, dmin, sc, mn) = if X16 { unpack_header(x16_words(w, b, 0)) } else { block_header(&rows, b) };
        // The scales as floats, for the gemm order's exact float form of `s0·sc0 + s1·sc1`.
        let scf: [__m512; 8] = std::array::from_fn(|j| _mm512_cvtepi32_ps(sc[j]));
        for t in 0..nj {
            let y = &a.q8k[(j0 + t) * nb + b];
            dd[t] = _mm512_mul_ps(d, _mm512_set1_ps(y.d));
            dm[t] = _mm512_mul_ps(dmin, _mm512_set1_ps(y.d));
            spairs[t] = bsum_pairs(y);
            if !GEMM {
                isum[t] = _mm512_setzero_si512();
                msum[t] = _mm512_setzero_si512();
            }
        }
        for p in 0..4 {
            let raw = if X16 { x16_words(w, b, 4 + 8 * p) } else { transpose_rows(&rows, b * BLOCK + 16 + 32 * p) };
            let lo: [__m512i; 8] = std::array::from_fn(|k| _mm512_and_si512(raw[k], nibble));
            let hi: [__m512i; 8] = std::array::from_fn(|k| _mm512_and_si512(_mm512_srli_epi16::<4>(raw[k]), nibble));
            for t in 0..nj {
                let yq = a.q8k[(j0 + t) * nb + b].qs.as_ptr().add(64 * p);
                let bcast = |at: usize| _mm512_set1_epi32(std::ptr::read_unaligned(yq.add(at) as *const i32));
                let (mut s0, mut s1) = (_mm512_setzero_si512(), _mm512_setzero_si512());
                for k in 0..8 {
                    s0 = _mm512_dpbusd_epi32(s0, lo[k], bcast(4 * k));
                    s1 = _mm512_dpbusd_epi32(s1, hi[k], bcast(32 + 4 * k));
                }
                let m = _mm512_madd_epi16(mn[p], _mm512_set1_epi32(spairs[t][p]));
                if GEMM {
                    // The integer s0·sc0 + s1·sc1 exactly, in floats: |s| ≤ 32 · 15 · 128 and a
                    // scale ≤ 63, so each product and their sum stay below 2^24 and round to
                    // themselves — two conversions, a multiply and an FMA in place of two
                    // `vpmulld` (two uops each), an add and a conversion.
                    let i = _mm512_fmadd_ps(
                        _mm512_cvtepi32_ps(s1),
                        scf[2 * p + 1],
                        _mm512_mul_ps(_mm512_cvtepi32_ps(s0), scf[2 * p]),
                    );
                    acc[t] = _mm512_fmadd_ps(i, dd[t], acc[t]);
                    accm[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(m), dm[t], accm[t]);
                } else {
                    let i = _mm512_add_epi32(_mm512_mullo_epi32(s0, sc[2 * p]), _mm512_mullo_epi32(s1, sc[2 * p + 1]));
                    isum[t] = _mm512_add_epi32(isum[t], i);
                    msum[t] = _mm512_add_epi32(msum[t], m);
                }
            }
        }
        if !GEMM {
            for t in 0..nj {
                acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum[t]), dd[t], acc[t]);
                accm[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(msum[t]), dm[t], accm[t]);
            }
        }
    }
    for t in 0..nj {
        let mut lanes = [0.0f32; ROWS];
        _mm512_storeu_ps(lanes.as_mut_ptr(), _mm512_sub_ps(acc[t], accm[t]));
        for i in 0..nr {
            out[i][t] = lanes[i];
        }
    }
}

/// Words `w0..w0 + N` of super-block `b` of an interleaved group (`group`, see
/// [`interleave`](super::interleave)): lane `i` of vector `k` holds word `w0 + k` of row `i`'s
/// block, as [`transpose_rows`] and [`block_header`] gather them from plain rows.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
#[inline]
unsafe fn x16_words<const N: usize>(group: &[u8], b: usize, w0: usize) -> [__m512i; N] {
    debug_assert!(word_offset(b, w0 + N, 0) <= group.len());
    let at = group.as_ptr().add(word_offset(b, w0, 0));
    // Word w + 1 of the 16 rows follows word w's 64 bytes.
    std::array::from_fn(|k| _mm512_loadu_si512(at.add(64 * k) as *const __m512i))
}

/// Decode over one interleaved group: `out[i][col] = W_i · x_j` in the gemv order, the
/// tile's arithmetic for one activation row with every vector in registers.
///
/// No software prefetch: a task's groups are one contiguous stream, which the hardware
/// prefetchers follow (the plain-row kernels' four interleaved row streams need one; here
/// prefetching 4 super-blocks ahead measured slower from memory).
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn gemv_x16(w: &[u8], a: &Acts, j: usize, col: usize, out: &mut TileOut) {
    let nb = a.k / QK_K;
    debug_assert!(w.len() == nb * BLOCK * ROWS && a.q8k.len() >= (j + 1) * nb);
    let nibble = _mm512_set1_epi8(0x0F);
    let (mut acc, mut accm) = (_mm512_setzero_ps(), _mm512_setzero_ps());
    for b in 0..nb {
        let y = &a.q8k[j * nb + b];
        let (d, dmin, sc, mn) = unpack_header(x16_words(w, b, 0));
        let dd = _mm512_mul_ps(d, _mm512_set1_ps(y.d));
        let dm = _mm512_mul_ps(dmin, _mm512_set1_ps(y.d));
        let spairs = bsum_pairs(y);
        let (mut isum, mut msum) = (_mm512_setzero_si512(), _mm512_setzero_si512());
        for p in 0..4 {
            let raw: [__m512i; 8] = x16_words(w, b, 4 + 8 * p);
            let yq = y.qs.as_ptr().add(64 * p);
            let bcast = |at: usize| _mm512_set1_epi32(std::ptr::read_unaligned(yq.add(at) as *const i32));
            let (mut s0, mut s1) = (_mm512_setzero_si512(), _mm512_setzero_si512());
            for k in 0..8 {
                s0 = _mm512_dpbusd_epi32(s0, _mm512_and_si512(raw[k], nibble), bcast(4 * k));
                let hi = _mm512_and_si512(_mm512_srli_epi16::<4>(raw[k]), nibble);
                s1 = _mm512_dpbusd_epi32(s1, hi, bcast(32 + 4 * k));
            }
            let i = _mm512_add_epi32(_mm512_mullo_epi32(s0, sc[2 * p]), _mm512_mullo_epi32(s1, sc[2 * p + 1]));
            isum = _mm512_add_epi32(isum, i);
            msum = _mm512_add_epi32(msum, _mm512_madd_epi16(mn[p], _mm512_set1_epi32(spairs[p])));
        }
        acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum), dd, acc);
        accm = _mm512_fmadd_ps(_mm512_cvtepi32_ps(msum), dm, accm);
    }
    let mut lanes = [0.0f32; ROWS];
    _mm512_storeu_ps(lanes.as_mut_ptr(), _mm512_sub_ps(acc, accm));
    for (i, &v) in lanes.iter().enumerate() {
        out[i][col] = v;
    }
}

/// Tile kernel (see [`TileFn`](super::matmul::TileFn)) over one interleaved group
/// ([`RowLayout::Q4kX16`](super::types::RowLayout), `nr == 16`) and `nj <= 32` activation rows,
/// each output in the order `a.gemm_acts` gives it, bit for bit what [`q4_k`] gives on the
/// plain rows; requires AVX-512 F/BW/VL/VNNI, AVX2, FMA and F16C.
pub(super) unsafe fn q4_k_x16(w: &[u8], nr: usize, a: &Acts, j0: usize, nj: usize, out: &mut TileOut) {
    debug_assert_eq!(nr, ROWS);
    let split = a.gemm_acts.clamp(j0, j0 + nj) - j0;
    if split == 0 && nj <= X16_GEMV_MAX_ACTS {
        for t in 0..nj {
            gemv_x16(w, a, j0 + t, t, out);
        }
        return;
    }
    tiles::<true>(w, nr, a, j0, nj, split, out);
}

/// Activation rows `j0..j0 + nj` by tiles, the first `split` in the gemm order and the rest in
/// the gemv order (a tile across `a.gemm_acts` is split in two).
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn tiles<const X16: bool>(w: &[u8], nr: usize, a: &Acts, j0: usize, nj: usize, split: usize, out: &mut TileOut) {
    if split == 0 {
        return tile::<false, X16>(w, nr, a, j0, nj, out);
    }
    tile::<true, X16>(w, nr, a, j0, split, out);
    if split < nj {
        let mut rest: TileOut = Default::default();
        tile::<false, X16>(w, nr, a, j0 + split, nj - split, &mut rest);
        for i in 0..nr {
            out[i][split..nj].copy_from_slice(&rest[i][..nj - split]);
        }
    }
}

/// Up to this many gemv-order activation rows an interleaved group is read once per row by
/// [`gemv_x16`] (everything in registers) rather than once by the tile.
const X16_GEMV_MAX_ACTS: usize = 1;

/// Tile kernel (see [`TileFn`](super::matmul::TileFn)) for `nr <= 16` rows and `nj <= 32`
/// activation rows; requires AVX-512 F/BW/VL/VNNI, AVX2, FMA and F16C.
pub(super) unsafe fn q4_k(w: &[u8], nr: usize, a: &Acts, j0: usize, nj: usize, out: &mut TileOut) {
    // Rows below a.gemm_acts take the gemm order. Tiles start at multiples of 4, as gemm_acts
    // is, so a tile lies on one side; a tile across it is split all the same.
    let split = a.gemm_acts.clamp(j0, j0 + nj) - j0;
    let few = super::dot_avx512_q4k_gemv::MAX_ACTS;
    if split <= few && nj - split <= few {
        // Decode and short steps (a draft's verification): four rows at a time cost far less
        // than transposing sixteen for so few activation rows.
        if split > 0 {
            super::dot_avx512_q4k_gemv::q4_k_few(w, nr, a, j0, split, true, 0, out);
        }
        if split < nj {
            super::dot_avx512_q4k_gemv::q4_k_few(w, nr, a, j0 + split, nj - split, false, split, out);
        }
        return;
    }
    tiles::<false>(w, nr, a, j0, nj, split, out);
}
