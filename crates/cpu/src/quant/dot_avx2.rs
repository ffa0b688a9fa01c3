//! AVX2 + FMA + F16C tile kernels for the 32-value formats (Q4_0, Q4_1, Q5_0, Q5_1, IQ4_NL,
//! Q8_0) × Q8 activations.
//!
//! Per 32-value block (as llama.cpp): unpack the 4-bit codes to 32 unsigned bytes (the 5-bit
//! formats OR in their fifth bits, IQ4_NL looks its levels up with one byte shuffle),
//! `_mm256_maddubs_epi16` against the signed activation codes (u8 × i8 → pairs of i16; no
//! saturation: |15·127·2| and |127·127·2| < 2^15), `_mm256_madd_epi16` with ones → 8 × i32,
//! convert and FMA with the block's combined scale `d_w · d_x`.
//! The offset `m_w` of Q4_1/Q5_1 multiplies the activation block's sum `s_x` (see
//! [`Q8Kind`](super::activations::Q8Kind)), so the two scales `[d_w, m_w]` meet `[d_x, s_x]`
//! in one 2-lane multiply per block; lane 1 accumulates the offsets and lane 0 feeds the FMA
//! (ggml's `summs`). The fixed code offsets of Q4_0 (8) and Q5_0 (16) are subtracted inside
//! each lane's integer sum instead, `Σ (q - offset) y`, as ggml's `vec_dot` and tinyBLAS form
//! signed codes: the products are the same integers, so the lanes, the FMA sequence and the
//! final tree equal llama.cpp's bit for bit.
//! Kernels work on tiles of `NR` weight rows × `NJ` activation rows (4×1 for decode, 1×4 for
//! prefill): each weight block is unpacked once per tile, each activation block loaded once.

// Kernels and references index several parallel arrays by the same lane or row.
#![allow(clippy::needless_range_loop)]

use super::blocks::{KVALUES_IQ4NL, QK};
use super::types::{Acts, TileOut};
use std::arch::x86_64::*;

/// How many 4-row tiles ahead decode prefetches the weights. Measured with
/// `BENCH_HUGE=1 BENCH_THREADS=1 cargo bench -p pagekv-cpu --bench decode_matvec` (whole-token
/// matvec work of SmolLM2-135M, one thread, tok/s of thread CPU time, AVX-512 kernels): no
/// prefetch ~100; 1, 2, 3, 4, 6, 8 tiles ~181, ~194, ~200, ~200, ~188, ~177 (8-row tiles:
/// ~168 at 1 or 2 tiles, which is why decode takes 4 rows at a time).
pub(super) const PREFETCH_TILES: usize = 3;

/// How many rows ahead the 256-value (K-quant) row kernels prefetch in decode: the same
/// distance as [`PREFETCH_TILES`] tiles of 4 rows.
pub(super) const K_PREFETCH_ROWS: usize = 4 * PREFETCH_TILES;

/// Decode streams the weights from memory with little work per byte, so the hardware
/// prefetchers (which stop at page boundaries and see many interleaved short row streams)
/// fall behind. A tile's rows are contiguous and its `nb` block steps each consume an equal
/// share of them, `step_bytes`; so at block step `b` this asks for the same share of the tile
/// `dist` bytes on, `step_bytes` from `tile + dist + b · step_bytes`, one prefetch per cache
/// line. A prefetch never faults, so reaching past the matrix is harmless.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
pub(super) unsafe fn prefetch_share(tile: *const u8, dist: usize, b: usize, step_bytes: usize) {
    let p = tile.wrapping_add(dist + b * step_bytes);
    // Consecutive steps' points are at most 64 bytes apart, so every line is asked for.
    for line in 0..step_bytes.div_ceil(64) {
        _mm_prefetch(p.wrapping_add(64 * line) as *const i8, _MM_HINT_T0);
    }
}

/// Horizontal sum of 8 lanes.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
pub(super) unsafe fn hsum(v: __m256) -> f32 {
    let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    let s = _mm_add_ss(s, _mm_movehdup_ps(s));
    _mm_cvtss_f32(s)
}

/// Two f16 values at `p` (little-endian) as f32 lanes 0 and 1.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn load_2xf16(p: *const u8) -> __m128 {
    _mm_cvtph_ps(_mm_cvtsi32_si128(std::ptr::read_unaligned(p as *const i32)))
}

/// The 32 4-bit codes of `qs[16]` as bytes: low nibbles (values 0..16) then high nibbles.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
pub(super) unsafe fn unpack_nibbles(qs: *const u8) -> __m256i {
    let q = _mm_loadu_si128(qs as *const __m128i);
    let both = _mm256_set_m128i(_mm_srli_epi16(q, 4), q);
    _mm256_and_si256(both, _mm256_set1_epi8(0x0F))
}

/// The 32-value formats the nibble kernels take (a const parameter of [`nibble_tile`]).
pub(super) mod fmt {
    pub const Q4_0: u8 = 0;
    pub const Q4_1: u8 = 1;
    pub const Q5_0: u8 = 2;
    pub const Q5_1: u8 = 3;
    pub const IQ4_NL: u8 = 4;

    /// `(block bytes, offset of qs, offset of qh)` (`qh` only for the 5-bit formats).
    pub const fn layout(f: u8) -> (usize, usize, usize) {
        match f {
            Q4_0 | IQ4_NL => (18, 2, 0),
            Q4_1 => (20, 4, 0),
            Q5_0 => (22, 6, 2),
            _ => (24, 8, 4),
        }
    }

    /// Whether the block header holds an offset `m` after `d`.
    pub const fn has_min(f: u8) -> bool {
        f == Q4_1 || f == Q5_1
    }

    /// The fixed code offset of a format without `m` (`x = d (q - offset)`).
    pub const fn code_offset(f: u8) -> f32 {
        match f {
            Q4_0 => 8.0,
            Q5_0 => 16.0,
            _ => 0.0,
        }
    }
}

/// The block header as `[d_w, m_w, _, _]`: with a min `[d, m]`, else `[d, 0]` (Q4_0's and
/// Q5_0's fixed code offsets are taken inside the lanes' integer sums).
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn header_scales<const FMT: u8>(blk: *const u8) -> __m128 {
    if fmt::has_min(FMT) {
        load_2xf16(blk)
    } else {
        // [d, 0, 0, 0]: a fixed code offset is taken inside the integer sums.
        _mm_cvtph_ps(_mm_cvtsi32_si128(std::ptr::read_unaligned(blk as *const u16) as i32))
    }
}

/// Byte `i` of the result is 0xFF when bit `i` of the little-endian u32 at `p` is set, else 0.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
pub(super) unsafe fn bytes_from_bits_32(p: *const u8) -> __m256i {
    let x = std::ptr::read_unaligned(p as *const i32);
    // Byte i takes source byte i / 8, then every bit but bit i % 8 is forced on.
    let spread = _mm256_shuffle_epi8(
        _mm256_set1_epi32(x),
        _mm256_set_epi64x(0x0303030303030303, 0x0202020202020202, 0x0101010101010101, 0),
    );
    let others = _mm256_set1_epi64x(0x7fbfdfeff7fbfdfe_u64 as i64);
    _mm256_cmpeq_epi8(_mm256_or_si256(spread, others), _mm256_set1_epi64x(-1))
}

/// The 32 codes of a block of format `FMT` as bytes in value order: unsigned (0..15, 0..31)
/// for the linear formats; for IQ4_NL the signed levels of [`KVALUES_IQ4NL`].
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn block_codes<const FMT: u8>(blk: *const u8) -> __m256i {
    let (_, qs_off, qh_off) = fmt::layout(FMT);
    let q = unpack_nibbles(blk.add(qs_off));
    match FMT {
        fmt::Q5_0 | fmt::Q5_1 => {
            _mm256_or_si256(q, _mm256_and_si256(bytes_from_bits_32(blk.add(qh_off)), _mm256_set1_epi8(0x10)))
        }
        fmt::IQ4_NL => _mm256_shuffle_epi8(_mm256_broadcastsi128_si256(iq4nl_table()), q),
        _ => q,
    }
}

/// [`KVALUES_IQ4NL`] as one 16-byte vector.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
pub(super) unsafe fn iq4nl_table() -> __m128i {
    _mm_loadu_si128(KVALUES_IQ4NL.as_ptr() as *const __m128i)
}

/// `Σ w y` per 4-byte lane group, as 8 × i32: unsigned codes straight into
/// `_mm256_maddubs_epi16`; signed ones (`SIGNED`, never -128) as `|y| × (w with y's sign)`,
/// which stays exact for an activation code of -128 (Q8_K makes them).
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
pub(super) unsafe fn dot_bytes<const SIGNED: bool>(w: __m256i, y: __m256i) -> __m256i {
    let ones = _mm256_set1_epi16(1);
    if SIGNED {
        _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_abs_epi8(y), _mm256_sign_epi8(w, y)), ones)
    } else {
        _mm256_madd_epi16(_mm256_maddubs_epi16(w, y), ones)
    }
}

/// Shared body of the 32-value formats of [`fmt`]: `NR` weight rows × `NJ` activation rows,
/// `NR * NJ <= 4` independent accumulator chains (which also hides the FMA latency).
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn nibble_tile<const NR: usize, const NJ: usize, const FMT: u8>(
    w: &[u8],
    a: &Acts,
    j0: usize,
    out: &mut TileOut,
) {
    let (block, _, _) = fmt::layout(FMT);
    let nb = a.k / QK;
    let row_bytes = nb * block;
    debug_assert!(w.len() == NR * row_bytes && a.q8_qs.len() >= (j0 + NJ) * a.k);
    let mut acc = [[_mm256_setzero_ps(); NJ]; NR];
    let mut acc_off = [[_mm_setzero_ps(); NJ]; NR];
    let wp = w.as_ptr();
    let ys = a.q8_qs.as_ptr().add(j0 * a.k);
    let ds = a.q8_ds.as_ptr().add(j0 * nb) as *const f64;
    for b in 0..nb {
        if NJ == 1 {
            prefetch_share(wp, PREFETCH_TILES * w.len(), b, NR * block);
        }
        let mut y = [_mm256_setzero_si256(); NJ];
        let mut dx = [_mm_setzero_ps(); NJ];
        // Formats with a fixed code offset: `offset · Σ y` per lane, subtracted from the
        // unsigned codes' sums so each lane holds the signed sum `Σ (q - offset) y` (exact
        // integers), as ggml's `vec_dot`/tinyBLAS form it.
        let mut corr = [_mm256_setzero_si256(); NJ];
        for t in 0..NJ {
            y[t] = _mm256_loadu_si256(ys.add(t * a.k + b * QK) as *const __m256i);
            dx[t] = _mm_castpd_ps(_mm_load_sd(ds.add(t * nb + b)));
            if fmt::code_offset(FMT) != 0.0 {
                corr[t] = dot_bytes::<false>(_mm256_set1_epi8(fmt::code_offset(FMT) as i8), y[t]);
            }
        }
        for i in 0..NR {
            let blk = wp.add(i * row_bytes + b * block);
            let dw = header_scales::<FMT>(blk);
            let qw = block_codes::<FMT>(blk);
            for t in 0..NJ {
                let prod = _mm_mul_ps(dw, dx[t]); // [d_w d_x, m_w s_x]
                if fmt::has_min(FMT) {
                    acc_off[i][t] = _mm_add_ps(acc_off[i][t], prod);
                }
                let p = match FMT {
                    fmt::IQ4_NL => dot_bytes::<true>(qw, y[t]),
                    _ if fmt::code_offset(FMT) != 0.0 => _mm256_sub_epi32(dot_bytes::<false>(qw, y[t]), corr[t]),
                    _ => dot_bytes::<false>(qw, y[t]),
                };
                acc[i][t] = _mm256_fmadd_ps(_mm256_broadcastss_ps(prod), _mm256_cvtepi32_ps(p), acc[i][t]);
            }
        }
    }
    for i in 0..NR {
        for t in 0..NJ {
            out[i][t] = if fmt::has_min(FMT) {
                hsum(acc[i][t]) + _mm_cvtss_f32(_mm_movehdup_ps(acc_off[i][t]))
            } else {
                hsum(acc[i][t])
            };
        }
    }
}

/// Defines the `(NR, NJ)` kernel of one [`fmt`] format over [`nibble_tile`].
macro_rules! nibble_format {
    ($name:ident, $fmt:path) => {
        #[target_feature(enable = "avx2,fma,f16c")]
        unsafe fn $name<const NR: usize, const NJ: usize>(w: &[u8], a: &Acts, j0: usize, out: &mut TileOut) {
            nibble_tile::<NR, NJ, { $fmt }>(w, a, j0, out)
        }
    };
}

nibble_format!(q4_0_t, fmt::Q4_0);
nibble_format!(q4_1_t, fmt::Q4_1);
nibble_format!(q5_0_t, fmt::Q5_0);
nibble_format!(q5_1_t, fmt::Q5_1);
nibble_format!(iq4_nl_t, fmt::IQ4_NL);

/// Q8_0: `NR` weight rows × `NJ` activation rows, `NR * NJ <= 4`.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q8_0_t<const NR: usize, const NJ: usize>(w: &[u8], a: &Acts, j0: usize, out: &mut TileOut) {
    const BLOCK: usize = 34;
    let nb = a.k / QK;
    let row_bytes = nb * BLOCK;
    debug_assert!(w.len() == NR * row_bytes && a.q8_qs.len() >= (j0 + NJ) * a.k);
    let ones = _mm256_set1_epi16(1);
    let mut acc = [[_mm256_setzero_ps(); NJ]; NR];
    let wp = w.as_ptr();
    let ys = a.q8_qs.as_ptr().add(j0 * a.k);
    let ds = a.q8_ds.as_ptr().add(j0 * nb) as *const f32;
    for b in 0..nb {
        if NJ == 1 {
            prefetch_share(wp, PREFETCH_TILES * w.len(), b, NR * BLOCK);
        }
        let mut y = [_mm256_setzero_si256(); NJ];
        let mut dx = [_mm_setzero_ps(); NJ];
        for t in 0..NJ {
            y[t] = _mm256_loadu_si256(ys.add(t * a.k + b * QK) as *const __m256i);
            dx[t] = _mm_load_ss(ds.add(2 * (t * nb + b)));
        }
        for i in 0..NR {
            let blk = wp.add(i * row_bytes + b * BLOCK);
            let dw = _mm_cvtph_ps(_mm_cvtsi32_si128(std::ptr::read_unaligned(blk as *const u16) as i32));
            let qw = _mm256_loadu_si256(blk.add(2) as *const __m256i);
            // u8 × i8 trick: |w| × (y with w's sign).
            let aw = _mm256_sign_epi8(qw, qw);
            for t in 0..NJ {
                let sy = _mm256_sign_epi8(y[t], qw);
                let p = _mm256_madd_epi16(_mm256_maddubs_epi16(aw, sy), ones);
                let d = _mm_mul_ss(dw, dx[t]);
                acc[i][t] = _mm256_fmadd_ps(_mm256_broadcastss_ps(d), _mm256_cvtepi32_ps(p), acc[i][t]);
            }
        }
    }
    for i in 0..NR {
        for t in 0..NJ {
            out[i][t] = hsum(acc[i][t]);
        }
    }
}

/// Defines a [`TileFn`](super::matmul::TileFn) from a const-generic `(NR, NJ)` tile kernel.
macro_rules! dispatch_tile {
    ($name:ident, $inner:ident) => {
        /// Tile kernel (see [`TileFn`](super::matmul::TileFn)); requires AVX2, FMA and F16C.
        pub(super) unsafe fn $name(w: &[u8], nr: usize, a: &Acts, j0: usize, nj: usize, out: &mut TileOut) {
            debug_assert!(nr == 1 || nj == 1);
            match (nr, nj) {
                (1, 1) => $inner::<1, 1>(w, a, j0, out),
                (1, 2) => $inner::<1, 2>(w, a, j0, out),
                (1, 3) => $inner::<1, 3>(w, a, j0, out),
                (1, _) => $inner::<1, 4>(w, a, j0, out),
                (2, _) => $inner::<2, 1>(w, a, j0, out),
                (3, _) => $inner::<3, 1>(w, a, j0, out),
                (_, _) => $inner::<4, 1>(w, a, j0, out),
            }
        }
    };
}

dispatch_tile!(q4_0, q4_0_t);
dispatch_tile!(q4_1, q4_1_t);
dispatch_tile!(q5_0, q5_0_t);
dispatch_tile!(q5_1, q5_1_t);
dispatch_tile!(iq4_nl, iq4_nl_t);
dispatch_tile!(q8_0, q8_0_t);

/// Defines a single-row kernel with the [`RowFn`](super::matmul::RowFn) signature from a
/// const-generic `NJ` kernel.
macro_rules! dispatch_nj {
    ($name:ident, $inner:ident) => {
        /// Row kernel (see [`RowFn`](super::matmul::RowFn)); requires AVX2, FMA and F16C.
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
pub(super) use dispatch_nj;
