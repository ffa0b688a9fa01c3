//! AVX2 + FMA + F16C attention kernels: one call processes a range of key positions of one
//! (sequence, kv head) for a contiguous set of query rows, updating their online-softmax state.
//!
//! The range is walked in *tiles*: consecutive positions inside one block (at most [`TILE`]),
//! so a tile's head vectors lie at a fixed stride in the pages. Per tile:
//! 1. K rows: f32/f16/bf16 are read in place (converted in registers inside the dot products);
//!    q8/q4/turbo codes are decoded once into `kbuf` (`[TILE, head_dim]` f32, L1-resident) and
//!    then serve every query row. Decoding computes exactly what the scalar decoders of
//!    `kvcache::format` compute (`d·q`, `d·(nibble-8)`, `s·level[code]`).
//! 2. Scores `s[row][t] = q_row · k_t` for 4 query rows × 2 tokens at a time (8 independent
//!    FMA chains), the query already scaled and rotated.
//! 3. Masking (causal / window / tile end), tile max, `exp` (Cephes polynomial, ~1 ulp),
//!    running max/sum update; the correction `exp(m_old - m_new)` is folded into step 4.
//! 4. V rows as K; `acc[row] = acc[row]·corr + Σ_t p[row][t]·v_t` for 4 rows × 16 lanes.
//!
//! Nothing is allocated; the tile buffers come from the caller's workspace. The scalar oracle
//! is [`super::reference`]; tests compare the two on fresh random data for every format.

use std::arch::x86_64::*;

use half::f16;
use kvcache::format::lloyd_max::codebook;
use kvcache::{Codec, LayerView, PlaneView};

use super::group::{QueryBounds, RowState};

/// Most key positions per tile (block sizes are 8, 16 or 32).
pub const TILE: usize = 32;

/// Query rows processed together.
const NR: usize = 4;

/// One (sequence, kv head) work item's inputs.
pub(crate) struct RangeInput<'a> {
    pub layer: &'a LayerView<'a>,
    pub kv_head: usize,
    /// The sequence's block table (validated over the read range).
    pub table: &'a [u32],
    pub bounds: QueryBounds,
    /// Query rows per query token (`num_heads / num_kv_heads`).
    pub group: usize,
    /// `[q_len * group, head_dim]` scaled (and rotated) queries.
    pub q: &'a [f32],
}

/// Per-thread tile buffers.
pub(crate) struct TileScratch<'a> {
    /// `[TILE, head_dim]` decoded keys of one tile.
    pub kbuf: &'a mut [f32],
    /// `[TILE, head_dim]` decoded values of one tile.
    pub vbuf: &'a mut [f32],
    /// `[rows, TILE]` scores, then probabilities.
    pub scores: &'a mut [f32],
    /// `[rows]` correction factor of the current tile.
    pub corr: &'a mut [f32],
}

/// How the rows handed to the dot/accumulate loops are stored.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Lanes {
    F32,
    F16,
    Bf16,
}

/// Element loaders, inlined into the `target_feature` loops that call them.
trait Load8 {
    /// Elements `i..i+8` of a row starting at `p`, as f32.
    unsafe fn load8(p: *const u8, i: usize) -> __m256;
}

struct F32L;
struct F16L;
struct Bf16L;

impl Load8 for F32L {
    #[inline(always)]
    unsafe fn load8(p: *const u8, i: usize) -> __m256 {
        unsafe { _mm256_loadu_ps(p.cast::<f32>().add(i)) }
    }
}

impl Load8 for F16L {
    #[inline(always)]
    unsafe fn load8(p: *const u8, i: usize) -> __m256 {
        unsafe { _mm256_cvtph_ps(_mm_loadu_si128(p.cast::<u16>().add(i).cast())) }
    }
}

impl Load8 for Bf16L {
    #[inline(always)]
    unsafe fn load8(p: *const u8, i: usize) -> __m256 {
        unsafe {
            let h = _mm256_cvtepu16_epi32(_mm_loadu_si128(p.cast::<u16>().add(i).cast()));
            _mm256_castsi256_ps(_mm256_slli_epi32::<16>(h))
        }
    }
}

/// Reads one plane (K or V) of one kv head: where a tile's rows are and how to decode them.
struct PlaneReader<'a> {
    plane: &'a PlaneView<'a>,
    kv_head: usize,
    /// Codebook levels for Lloyd–Max codecs (`[2^bits]`), else empty.
    levels: &'static [f32],
    /// First 16 levels, zero padded (permute tables for 2/3/4-bit codes).
    lut: [f32; 16],
}

impl<'a> PlaneReader<'a> {
    fn new(plane: &'a PlaneView<'a>, kv_head: usize) -> PlaneReader<'a> {
        let levels: &'static [f32] = match plane.codec {
            Codec::LloydMax { bits } => &codebook(bits).levels,
            _ => &[],
        };
        let mut lut = [0f32; 16];
        for (o, l) in lut.iter_mut().zip(levels) {
            *o = *l;
        }
        PlaneReader { plane, kv_head, levels, lut }
    }

    /// Bytes between the head vectors of consecutive slots.
    fn stride(&self) -> usize {
        self.plane.num_kv_heads * self.plane.code_bytes
    }

    /// Rows of tokens `slot0..slot0+n`: `(lanes, first row, row stride in bytes)`; quantized
    /// codes are decoded into `buf` (`[TILE, head_dim]`).
    ///
    /// # Safety
    /// The slots must lie inside the plane.
    #[inline(always)]
    unsafe fn rows(&self, slot0: usize, n: usize, d: usize, buf: &mut [f32]) -> (Lanes, *const u8, usize) {
        debug_assert!(((slot0 + n) * self.plane.num_kv_heads) * self.plane.code_bytes <= self.plane.codes.len());
        let head = (slot0 * self.plane.num_kv_heads + self.kv_head) * self.plane.code_bytes;
        // SAFETY: in bounds per the caller's contract (checked above in debug builds).
        let codes = unsafe { self.plane.codes.as_ptr().add(head) };
        let stride = self.stride();
        let lanes = match self.plane.codec {
            Codec::F32 => return (Lanes::F32, codes, stride),
            Codec::F16 => return (Lanes::F16, codes, stride),
            Codec::Bf16 => return (Lanes::Bf16, codes, stride),
            _ => Lanes::F32,
        };
        let ns = self.plane.n_scales;
        let sc_stride = self.plane.num_kv_heads * ns;
        let scales = &self.plane.scales[(slot0 * self.plane.num_kv_heads + self.kv_head) * ns..];
        debug_assert!(buf.len() >= n * d);
        for t in 0..n {
            let s = &scales[t * sc_stride..t * sc_stride + ns];
            let out = buf[t * d..].as_mut_ptr();
            // SAFETY: row t's codes are code_bytes long inside the plane; out holds d values.
            unsafe {
                let c = codes.add(t * stride);
                match self.plane.codec {
                    Codec::Q8 => decode_q8(c, s, d, out),
                    Codec::Q4 => decode_q4(c, s, d, out),
                    Codec::LloydMax { bits } => decode_lloyd_max(c, bits, s, d, &self.lut, self.levels, out),
                    Codec::F32 | Codec::F16 | Codec::Bf16 => unreachable!("float codecs are read in place"),
                }
            }
        }
        (lanes, buf.as_ptr().cast(), d * 4)
    }
}

/// Length of scale group `g` of a head vector of `d` values.
#[inline(always)]
fn group_len(d: usize, g: usize) -> usize {
    32.min(d - 32 * g)
}

#[inline(always)]
unsafe fn decode_q8(codes: *const u8, scales: &[f16], d: usize, out: *mut f32) {
    unsafe {
        for (g, s) in scales.iter().enumerate() {
            let sv = _mm256_set1_ps(s.to_f32());
            let base = 32 * g;
            let mut c = 0;
            while c < group_len(d, g) {
                let b = _mm_loadl_epi64(codes.add(base + c).cast());
                let x = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(b));
                _mm256_storeu_ps(out.add(base + c), _mm256_mul_ps(x, sv));
                c += 8;
            }
        }
    }
}

#[inline(always)]
unsafe fn decode_q4(codes: *const u8, scales: &[f16], d: usize, out: *mut f32) {
    unsafe {
        let mask = _mm256_set1_epi32(0xF);
        let eight = _mm256_set1_epi32(8);
        for (g, s) in scales.iter().enumerate() {
            let sv = _mm256_set1_ps(s.to_f32());
            let half = group_len(d, g) / 2;
            let (src, dst) = (codes.add(16 * g), out.add(32 * g));
            let mut c = 0;
            while c < half {
                let x = _mm256_cvtepu8_epi32(_mm_loadl_epi64(src.add(c).cast()));
                let lo = _mm256_sub_epi32(_mm256_and_si256(x, mask), eight);
                let hi = _mm256_sub_epi32(_mm256_srli_epi32::<4>(x), eight);
                _mm256_storeu_ps(dst.add(c), _mm256_mul_ps(_mm256_cvtepi32_ps(lo), sv));
                _mm256_storeu_ps(dst.add(half + c), _mm256_mul_ps(_mm256_cvtepi32_ps(hi), sv));
                c += 8;
            }
        }
    }
}

/// Lloyd–Max codes: 8 values of `bits` bits fill exactly `bits` bytes (little-endian stream).
#[inline(always)]
unsafe fn decode_lloyd_max(
    codes: *const u8,
    bits: u8,
    scales: &[f16],
    d: usize,
    lut: &[f32; 16],
    levels: &[f32],
    out: *mut f32,
) {
    unsafe {
        let b = bits as usize;
        let lo_tab = _mm256_loadu_ps(lut.as_ptr());
        let hi_tab = _mm256_loadu_ps(lut.as_ptr().add(8));
        let shifts = _mm256_setr_epi32(
            0,
            b as i32,
            2 * b as i32,
            3 * b as i32,
            4 * b as i32,
            5 * b as i32,
            6 * b as i32,
            7 * b as i32,
        );
        let mask = _mm256_set1_epi32((1 << b) - 1);
        for chunk in 0..d / 8 {
            let src = codes.add(chunk * b);
            let sv = _mm256_set1_ps(scales[chunk / 4].to_f32());
            let lv = if b == 8 {
                let idx = _mm256_cvtepu8_epi32(_mm_loadl_epi64(src.cast()));
                _mm256_i32gather_ps::<4>(levels.as_ptr(), idx)
            } else {
                let mut w = 0u32;
                for i in 0..b {
                    w |= (*src.add(i) as u32) << (8 * i);
                }
                let idx = _mm256_and_si256(_mm256_srlv_epi32(_mm256_set1_epi32(w as i32), shifts), mask);
                let lo = _mm256_permutevar8x32_ps(lo_tab, idx);
                if b == 4 {
                    let hi = _mm256_permutevar8x32_ps(hi_tab, idx);
                    _mm256_blendv_ps(lo, hi, _mm256_castsi256_ps(_mm256_slli_epi32::<28>(idx)))
                } else {
                    lo
                }
            };
            _mm256_storeu_ps(out.add(chunk * 8), _mm256_mul_ps(lv, sv));
        }
    }
}

#[inline(always)]
unsafe fn hsum(v: __m256) -> f32 {
    unsafe {
        let x = _mm_add_ps(_mm256_extractf128_ps::<1>(v), _mm256_castps256_ps128(v));
        let x = _mm_add_ps(x, _mm_movehl_ps(x, x));
        let x = _mm_add_ss(x, _mm_shuffle_ps::<1>(x, x));
        _mm_cvtss_f32(x)
    }
}

#[inline(always)]
unsafe fn hmax(v: __m256) -> f32 {
    unsafe {
        let x = _mm_max_ps(_mm256_extractf128_ps::<1>(v), _mm256_castps256_ps128(v));
        let x = _mm_max_ps(x, _mm_movehl_ps(x, x));
        let x = _mm_max_ss(x, _mm_shuffle_ps::<1>(x, x));
        _mm_cvtss_f32(x)
    }
}

/// `exp(x)` on 8 lanes (Cephes `expf`: range reduction by ln 2, degree-6 polynomial), relative
/// error about 1 ulp on [-87, 88]; inputs are clamped to that range.
#[inline(always)]
pub(crate) unsafe fn exp256(x: __m256) -> __m256 {
    unsafe {
        let x = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(-87.0)), _mm256_set1_ps(88.0));
        let fx = _mm256_round_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(_mm256_mul_ps(
            x,
            _mm256_set1_ps(std::f32::consts::LOG2_E),
        ));
        let x = _mm256_fnmadd_ps(fx, _mm256_set1_ps(0.693_359_4), x);
        let x = _mm256_fnmadd_ps(fx, _mm256_set1_ps(-2.121_944_4e-4), x);
        let mut y = _mm256_set1_ps(1.987_569_1e-4);
        y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(1.398_199_9e-3));
        y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(8.333_452e-3));
        y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(4.166_579_6e-2));
        y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(1.666_666_5e-1));
        y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(5.000_000_1e-1));
        y = _mm256_fmadd_ps(y, _mm256_mul_ps(x, x), _mm256_add_ps(x, _mm256_set1_ps(1.0)));
        let pow2 = _mm256_slli_epi32::<23>(_mm256_add_epi32(_mm256_cvtps_epi32(fx), _mm256_set1_epi32(127)));
        _mm256_mul_ps(y, _mm256_castsi256_ps(pow2))
    }
}

/// Scores of `R` query rows (`q`: `[R, d]`) against `n` key rows; `s`: `[R, TILE]`.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn scores<L: Load8, const R: usize>(
    q: *const f32,
    d: usize,
    k: *const u8,
    stride: usize,
    n: usize,
    s: *mut f32,
) {
    unsafe {
        let mut t = 0;
        while t < n {
            let has_b = t + 1 < n;
            let ka = k.add(t * stride);
            let kb = if has_b { ka.add(stride) } else { ka };
            let mut aa = [_mm256_setzero_ps(); R];
            let mut ab = [_mm256_setzero_ps(); R];
            let mut c = 0;
            while c < d {
                let x = L::load8(ka, c);
                let y = L::load8(kb, c);
                for r in 0..R {
                    let qv = _mm256_loadu_ps(q.add(r * d + c));
                    aa[r] = _mm256_fmadd_ps(qv, x, aa[r]);
                    ab[r] = _mm256_fmadd_ps(qv, y, ab[r]);
                }
                c += 8;
            }
            for r in 0..R {
                *s.add(r * TILE + t) = hsum(aa[r]);
                if has_b {
                    *s.add(r * TILE + t + 1) = hsum(ab[r]);
                }
            }
            t += 2;
        }
    }
}

/// `acc[r] = acc[r]·corr[r] + Σ_t p[r][t]·v_t` for `R` rows; `p`: `[R, TILE]`, `acc`: `[R, d]`.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn accumulate<L: Load8, const R: usize>(
    p: *const f32,
    corr: *const f32,
    v: *const u8,
    stride: usize,
    n: usize,
    d: usize,
    acc: *mut f32,
) {
    unsafe {
        let mut c = 0;
        while c < d {
            let mut a0 = [_mm256_setzero_ps(); R];
            let mut a1 = [_mm256_setzero_ps(); R];
            for r in 0..R {
                let cr = _mm256_set1_ps(*corr.add(r));
                a0[r] = _mm256_mul_ps(_mm256_loadu_ps(acc.add(r * d + c)), cr);
                a1[r] = _mm256_mul_ps(_mm256_loadu_ps(acc.add(r * d + c + 8)), cr);
            }
            for t in 0..n {
                let vp = v.add(t * stride);
                let x = L::load8(vp, c);
                let y = L::load8(vp, c + 8);
                for r in 0..R {
                    let pb = _mm256_broadcast_ss(&*p.add(r * TILE + t));
                    a0[r] = _mm256_fmadd_ps(pb, x, a0[r]);
                    a1[r] = _mm256_fmadd_ps(pb, y, a1[r]);
                }
            }
            for r in 0..R {
                _mm256_storeu_ps(acc.add(r * d + c), a0[r]);
                _mm256_storeu_ps(acc.add(r * d + c + 8), a1[r]);
            }
            c += 16;
        }
    }
}

macro_rules! by_rows {
    ($f:ident, $l:ty, $rows:expr, ($($arg:expr),*)) => {
        match $rows {
            1 => $f::<$l, 1>($($arg),*),
            2 => $f::<$l, 2>($($arg),*),
            3 => $f::<$l, 3>($($arg),*),
            _ => $f::<$l, NR>($($arg),*),
        }
    };
}

macro_rules! by_lanes {
    ($f:ident, $lanes:expr, $rows:expr, ($($arg:expr),*)) => {
        match $lanes {
            Lanes::F32 => by_rows!($f, F32L, $rows, ($($arg),*)),
            Lanes::F16 => by_rows!($f, F16L, $rows, ($($arg),*)),
            Lanes::Bf16 => by_rows!($f, Bf16L, $rows, ($($arg),*)),
        }
    };
}

/// Masks `s[..a]` and `s[b..n8]`, turns scores into probabilities against the new running
/// max and updates `m`, `l`; returns the correction `exp(m_old - m_new)` for the accumulator.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn softmax_row(s: &mut [f32], a: usize, b: usize, n8: usize, m: &mut f32, l: &mut f32) -> f32 {
    unsafe {
        s[..a].fill(f32::NEG_INFINITY);
        s[b..n8].fill(f32::NEG_INFINITY);
        let mut mx = _mm256_set1_ps(f32::NEG_INFINITY);
        for c in (0..n8).step_by(8) {
            mx = _mm256_max_ps(mx, _mm256_loadu_ps(s.as_ptr().add(c)));
        }
        let m_new = m.max(hmax(mx));
        let corr = (*m - m_new).exp(); // 0 on the first tile (m = -inf), 1 when unchanged
        let mv = _mm256_set1_ps(m_new);
        let ninf = _mm256_set1_ps(f32::NEG_INFINITY);
        let mut sum = _mm256_setzero_ps();
        for c in (0..n8).step_by(8) {
            let x = _mm256_loadu_ps(s.as_ptr().add(c));
            let e = _mm256_and_ps(exp256(_mm256_sub_ps(x, mv)), _mm256_cmp_ps::<_CMP_NEQ_OQ>(x, ninf));
            _mm256_storeu_ps(s.as_mut_ptr().add(c), e);
            sum = _mm256_add_ps(sum, e);
        }
        *l = *l * corr + hsum(sum);
        *m = m_new;
        corr
    }
}

/// Processes key positions `[start, end)` (inside the validated read range) for every query
/// row that sees any of them, updating `state` (`[q_len * group]` rows).
///
/// # Safety
/// The CPU must support AVX2, FMA and F16C; the block table must be valid over
/// `[start, end)` (as [`super::validate`] checks); `head_dim` must be a multiple of 16 and at
/// most `MAX_FAST_HEAD_DIM`; buffers sized as documented on [`TileScratch`] and [`RowState`].
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn attend_range(
    inp: &RangeInput,
    start: usize,
    end: usize,
    state: &mut RowState,
    scratch: &mut TileScratch,
) {
    let layer = inp.layer;
    let (d, bs, g) = (layer.head_dim, layer.block_size, inp.group);
    debug_assert!(d % 16 == 0);
    let keys = PlaneReader::new(&layer.keys, inp.kv_head);
    let values = PlaneReader::new(&layer.values, inp.kv_head);
    let mut t0 = start;
    while t0 < end {
        let t1 = end.min((t0 / bs + 1) * bs).min(t0 + TILE);
        let n = t1 - t0;
        let (i0, i1) = inp.bounds.tokens_seeing(t0, t1);
        if i0 == i1 {
            t0 = t1;
            continue;
        }
        let slot0 = inp.table[t0 / bs] as usize * bs + t0 % bs;
        let (r0, r1) = (i0 * g, i1 * g);
        let n8 = n.div_ceil(8) * 8;
        // SAFETY (whole block): slots slot0..slot0+n lie in one valid block; every row pointer
        // below stays within the row-major buffers whose sizes the caller guarantees.
        unsafe {
            let (kl, kp, ks) = keys.rows(slot0, n, d, scratch.kbuf);
            let mut r = r0;
            while r < r1 {
                let nr = NR.min(r1 - r);
                let q = inp.q.as_ptr().add(r * d);
                let s = scratch.scores.as_mut_ptr().add(r * TILE);
                by_lanes!(scores, kl, nr, (q, d, kp, ks, n, s));
                r += nr;
            }
            for r in r0..r1 {
                let (lo, hi) = inp.bounds.keys_of(r / g);
                let a = lo.max(t0) - t0;
                let b = hi.min(t1) - t0;
                debug_assert!(a < b);
                let s = &mut scratch.scores[r * TILE..r * TILE + TILE];
                scratch.corr[r] = softmax_row(s, a, b, n8, &mut state.m[r], &mut state.l[r]);
            }
            let (vl, vp, vs) = values.rows(slot0, n, d, scratch.vbuf);
            let mut r = r0;
            while r < r1 {
                let nr = NR.min(r1 - r);
                let p = scratch.scores.as_ptr().add(r * TILE);
                let corr = scratch.corr.as_ptr().add(r);
                let acc = state.acc.as_mut_ptr().add(r * d);
                by_lanes!(accumulate, vl, nr, (p, corr, vp, vs, n, d, acc));
                r += nr;
            }
        }
        t0 = t1;
    }
}
