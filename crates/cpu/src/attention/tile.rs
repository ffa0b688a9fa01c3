//! The tile driver shared by every instruction set: [`run`] processes a range of key positions
//! of one (sequence, kv head) for every query row that sees any of them, updating the rows'
//! online-softmax state.
//!
//! The range is walked in *tiles* of up to [`TILE`] consecutive positions, which may span
//! blocks: each token's stored K and V rows are located once per tile through the block table
//! (one division per block touched, not per token), quantized group scales are converted to
//! f32, and the next tile's rows are prefetched into L2 while this one is computed. Per tile, for each
//! block of up to four query rows (`q_len × G` rows, `G = num_heads / num_kv_heads`, ordered
//! `token · G + h`):
//! 1. [`TileOps::scores`]: `sc[t][r] = q_r · k_t`, keys decoded in registers and shared by the
//!    block's rows; the query is already scaled and, for rotated formats, rotated.
//! 2. [`softmax::update`]: per-row visibility masks (causal, window, tile end), tile max,
//!    `exp`, running max/sum of the four rows at once.
//! 3. [`TileOps::accumulate`]: `acc = acc·corr + Σ_t p_t·v_t`, quantized value scales folded
//!    into the weights ([`softmax::scale_weights`]).
//!
//! `sc` holds one row block's scores, then probabilities, as `[token][4]`: a 256-bit vector is
//! two tokens × four rows, a 512-bit one four tokens.

use std::arch::x86_64::*;

use half::f16;
use kvcache::{LayerView, PlaneView};

use super::group::{QueryBounds, RowState};
use super::softmax;
use super::KernelIsa;

/// Most key positions per tile.
pub const TILE: usize = 32;

/// Most scale groups per head vector.
pub const MAX_GROUPS: usize = super::MAX_FAST_HEAD_DIM / 32;

/// Floats of a `sc` buffer: `[TILE + 4][4]` (kernels may compute up to three tokens past a
/// tile's end, in whole vectors).
pub const SC_LEN: usize = (TILE + 4) * 4;

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

/// Per-thread tile buffers (f32).
pub(crate) struct TileScratch<'a> {
    /// `[SC_LEN]` scores, then probabilities, of one row block: `[token][4]`.
    pub sc: &'a mut [f32],
    /// `[TILE, MAX_GROUPS]` key group scales of the tile.
    pub kscale: &'a mut [f32],
    /// `[TILE, MAX_GROUPS]` value group scales of the tile.
    pub vscale: &'a mut [f32],
    /// `[TILE, MAX_GROUPS, 4]` probabilities × value scales.
    pub w: &'a mut [f32],
}

impl TileScratch<'_> {
    /// Floats each buffer needs, in field order.
    pub const LENS: [usize; 4] = [SC_LEN, TILE * MAX_GROUPS, TILE * MAX_GROUPS, TILE * MAX_GROUPS * 4];
}

/// Per-row visible token range `[a, b)` inside a tile for the four rows of a block (empty,
/// `a = b = 0`, for rows past the block's end or rows that see nothing of the tile).
#[derive(Clone, Copy, Debug)]
pub(crate) struct RowRanges {
    pub a: [i32; 4],
    pub b: [i32; 4],
}

/// One instruction set's QK and PV kernels for one (key codec, value codec) pair.
pub(crate) trait TileOps {
    /// Keys carry per-group scales: `scores` reads `kscale`.
    const K_SCALED: bool;
    /// Values carry per-group scales: `accumulate` reads weights per group.
    const V_SCALED: bool;

    /// `sc[t][r] = q_r · k_t` for tokens `t0 .. t1` and `rows ≤ 4` rows (`q`: `[rows, d]`),
    /// computed in whole vectors from `t0`, so up to three tokens past `t1` may be written
    /// (with garbage); lanes of rows `rows..4` are written as 0. `kscale`: `[TILE, MAX_GROUPS]`.
    ///
    /// # Safety
    /// The instruction set is available; `krows[t0..t1]` are stored key rows of head_dim `d`
    /// (a multiple of 16, at most `MAX_FAST_HEAD_DIM`); `t1 ≤ TILE`; `sc` holds [`SC_LEN`].
    #[allow(clippy::too_many_arguments)]
    unsafe fn scores(
        &self,
        rows: usize,
        krows: &[*const u8; TILE],
        kscale: &[f32],
        t0: usize,
        t1: usize,
        q: *const f32,
        d: usize,
        sc: *mut f32,
    );

    /// `acc[r] = acc[r]·corr[r] + Σ_t w_t[r]·v_t` over tokens `t0 .. t1` for `rows ≤ 4` rows
    /// (`acc`: `[rows, d]`). Weight of token `t`, row `r`, value group `g`: `w[t·wt + 4g + r]`
    /// for scaled codecs, `w[t·wt + r]` otherwise.
    ///
    /// # Safety
    /// The instruction set is available; `vrows[t0..t1]` are stored value rows of head_dim `d`;
    /// `w` and `acc` sized as documented.
    #[allow(clippy::too_many_arguments)]
    unsafe fn accumulate(
        &self,
        rows: usize,
        vrows: &[*const u8; TILE],
        t0: usize,
        t1: usize,
        w: *const f32,
        wt: usize,
        corr: &[f32; 4],
        d: usize,
        acc: *mut f32,
    );
}

/// Where one plane's rows of one kv head are.
#[derive(Clone, Copy)]
struct PlaneRows<'a> {
    plane: &'a PlaneView<'a>,
    kv_head: usize,
}

impl PlaneRows<'_> {
    /// Index of (slot, kv head) among the plane's head vectors.
    #[inline(always)]
    fn head_index(&self, slot: usize) -> usize {
        slot * self.plane.num_kv_heads + self.kv_head
    }

    /// First code byte of `slot`'s row.
    ///
    /// # Safety
    /// `slot` lies inside the plane.
    #[inline(always)]
    unsafe fn row(&self, slot: usize) -> *const u8 {
        debug_assert!((self.head_index(slot) + 1) * self.plane.code_bytes <= self.plane.codes.len());
        // SAFETY: in bounds per the contract.
        unsafe { self.plane.codes.as_ptr().add(self.head_index(slot) * self.plane.code_bytes) }
    }

    /// Converts `slot`'s f16 group scales into `out` (`[n_scales]`).
    ///
    /// # Safety
    /// F16C available; `slot` inside the plane.
    #[inline(always)]
    unsafe fn scales(&self, slot: usize, out: &mut [f32]) {
        let ns = self.plane.n_scales;
        let src = &self.plane.scales[self.head_index(slot) * ns..][..ns];
        let out = &mut out[..ns];
        // SAFETY: 4 halves (8 bytes) read per full quad, inside `src`; F16C per the contract.
        unsafe {
            let mut i = 0;
            while i + 4 <= ns {
                let h = _mm_loadl_epi64(src.as_ptr().add(i).cast());
                _mm_storeu_ps(out.as_mut_ptr().add(i), _mm_cvtph_ps(h));
                i += 4;
            }
            for (o, s) in out[i..].iter_mut().zip(&src[i..]) {
                *o = f16_to_f32(*s);
            }
        }
    }

    /// Prefetches the codes and scales of `n` consecutive slots from `slot0`.
    #[inline(always)]
    fn prefetch(&self, slot0: usize, n: usize) {
        let (cb, ns) = (self.plane.code_bytes, self.plane.n_scales);
        let stride = self.plane.num_kv_heads * cb;
        let first = self.head_index(slot0);
        debug_assert!((first + (n - 1) * self.plane.num_kv_heads + 1) * cb <= self.plane.codes.len());
        // The addresses lie inside the rows (checked above in debug builds); a prefetch is a
        // hint and cannot fault anyway.
        let codes = self.plane.codes.as_ptr().wrapping_add(first * cb);
        let scales = self.plane.scales.as_ptr().wrapping_add(first * ns);
        for t in 0..n {
            let row = codes.wrapping_add(t * stride);
            // SAFETY: prefetches cannot fault.
            unsafe {
                let mut off = 0;
                while off < cb {
                    _mm_prefetch::<_MM_HINT_T1>(row.wrapping_add(off).cast());
                    off += 64;
                }
                _mm_prefetch::<_MM_HINT_T1>(row.wrapping_add(cb - 1).cast());
                if ns > 0 {
                    _mm_prefetch::<_MM_HINT_T1>(scales.wrapping_add(t * self.plane.num_kv_heads * ns).cast());
                }
            }
        }
    }
}

/// One f16 value with F16C.
#[inline(always)]
unsafe fn f16_to_f32(h: f16) -> f32 {
    // SAFETY: F16C per the caller.
    unsafe { _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(h.to_bits() as i32))) }
}

/// Processes key positions `[start, end)` of one (sequence, kv head) for every query row that
/// sees any of them with `isa`'s kernels (see [`run`]).
///
/// # Safety
/// As [`run`], with `isa` available on this CPU.
pub(crate) unsafe fn attend_range(
    isa: KernelIsa,
    inp: &RangeInput,
    start: usize,
    end: usize,
    state: &mut RowState,
    scratch: &mut TileScratch,
) {
    // SAFETY: forwarded contract.
    unsafe {
        match isa {
            KernelIsa::Avx2 => super::avx2::attend_range(inp, start, end, state, scratch),
            KernelIsa::Avx512 => super::avx512::attend_range(inp, start, end, state, scratch),
        }
    }
}

/// Calls `f(t, slot0, len)` for each run of consecutive slots holding positions `t0 .. t1`
/// (`t` counts from `t0`): one run per block touched, one division per run.
#[inline(always)]
fn for_each_run(table: &[u32], bs: usize, t0: usize, t1: usize, mut f: impl FnMut(usize, usize, usize)) {
    let mut pos = t0;
    while pos < t1 {
        let (blk, off) = (pos / bs, pos % bs);
        let len = (bs - off).min(t1 - pos);
        f(pos - t0, table[blk] as usize * bs + off, len);
        pos += len;
    }
}

/// Processes key positions `[start, end)` (inside the validated read range) for every query
/// row that sees any of them, updating `state` (`[q_len * group]` rows) with `ops`' kernels.
///
/// # Safety
/// AVX2, FMA, F16C and `ops`' instruction set are available; the block table is valid over
/// `[start, end)` (as [`super::validate`] checks); `head_dim` is a multiple of 16 and at most
/// `MAX_FAST_HEAD_DIM`; `ops` matches the layer's codecs; buffers sized as documented on
/// [`TileScratch`] and [`RowState`].
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn run<T: TileOps>(
    ops: &T,
    inp: &RangeInput,
    start: usize,
    end: usize,
    state: &mut RowState,
    scratch: &mut TileScratch,
) {
    let layer = inp.layer;
    let (d, bs, g) = (layer.head_dim, layer.block_size, inp.group);
    debug_assert!(d % 16 == 0 && d <= super::MAX_FAST_HEAD_DIM);
    let ng = d.div_ceil(32);
    let keys = PlaneRows { plane: &layer.keys, kv_head: inp.kv_head };
    let values = PlaneRows { plane: &layer.values, kv_head: inp.kv_head };
    let mut krows = [std::ptr::null::<u8>(); TILE];
    let mut vrows = [std::ptr::null::<u8>(); TILE];
    let mut t0 = start;
    while t0 < end {
        let t1 = end.min(t0 + TILE);
        let n = t1 - t0;
        let (i0, i1) = inp.bounds.tokens_seeing(t0, t1);
        if i0 == i1 {
            t0 = t1;
            continue;
        }
        // SAFETY (whole tile): every position of [start, end) maps to a valid slot (validated
        // block table); kernels read rows through krows/vrows[..n] and the scratch buffers,
        // sized as documented; state rows r0..r1 exist.
        unsafe {
            for_each_run(inp.table, bs, t0, t1, |t, slot0, len| {
                for j in 0..len {
                    let slot = slot0 + j;
                    krows[t + j] = keys.row(slot);
                    vrows[t + j] = values.row(slot);
                    if T::K_SCALED {
                        keys.scales(slot, &mut scratch.kscale[(t + j) * MAX_GROUPS..]);
                    }
                    if T::V_SCALED {
                        values.scales(slot, &mut scratch.vscale[(t + j) * MAX_GROUPS..]);
                    }
                }
            });
            for_each_run(inp.table, bs, t1, end.min(t1 + TILE), |_, slot0, len| {
                keys.prefetch(slot0, len);
                values.prefetch(slot0, len);
            });
            let (r0, r1) = (i0 * g, i1 * g);
            let mut block = r0;
            while block < r1 {
                let nr = 4.min(r1 - block);
                let rows = block..block + nr;
                block += nr;
                let mut ranges = RowRanges { a: [0; 4], b: [0; 4] };
                let (mut lo, mut hi) = (n, 0);
                for j in 0..nr {
                    let (klo, khi) = inp.bounds.keys_of((rows.start + j) / g);
                    let a = klo.max(t0).min(t1) - t0;
                    let b = khi.min(t1).max(t0) - t0;
                    if a < b {
                        ranges.a[j] = a as i32;
                        ranges.b[j] = b as i32;
                        lo = lo.min(a);
                        hi = hi.max(b);
                    }
                }
                if lo >= hi {
                    continue;
                }
                let mut m = [f32::NEG_INFINITY; 4];
                let mut l = [0f32; 4];
                m[..nr].copy_from_slice(&state.m[rows.clone()]);
                l[..nr].copy_from_slice(&state.l[rows.clone()]);
                let sc = scratch.sc.as_mut_ptr();
                let q = inp.q.as_ptr().add(rows.start * d);
                ops.scores(nr, &krows, scratch.kscale, lo, hi, q, d, sc);
                let corr = softmax::update(sc, lo, hi, &ranges, &mut m, &mut l);
                state.m[rows.clone()].copy_from_slice(&m[..nr]);
                state.l[rows.clone()].copy_from_slice(&l[..nr]);
                let (w, wt) = if T::V_SCALED {
                    softmax::scale_weights(sc, scratch.vscale, MAX_GROUPS, ng, lo, hi, scratch.w);
                    (scratch.w.as_ptr(), ng * 4)
                } else {
                    (sc.cast_const(), 4)
                };
                let acc = state.acc.as_mut_ptr().add(rows.start * d);
                ops.accumulate(nr, &vrows, lo, hi, w, wt, &corr, d, acc);
            }
        }
        t0 = t1;
    }
}
