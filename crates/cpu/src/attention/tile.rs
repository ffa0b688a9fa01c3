//! The tile driver shared by every instruction set: [`run`] processes a range of key positions
//! of one sequence for a range of its kv heads, updating the online-softmax state of every
//! query row that sees any of them.
//!
//! The range is walked in *tiles* of up to [`TILE`] consecutive positions, which may span
//! blocks: each tile's slots are located once through the block table (one division per block
//! touched, not per token) and serve every head, whose rows follow each other in the pages.
//! Per tile and head: the head's quantized group scales are converted to f32, the scales of
//! the next tile prefetched, and for each block of up to four query rows (`q_len × G` rows,
//! `G = num_heads / num_kv_heads`, ordered `token · G + h`):
//! 1. [`TileOps::scores`]: `sc[t][r] = q_r · k_t`, keys decoded in registers and shared by the
//!    block's rows; the query is already scaled and, for rotated formats, rotated. It
//!    prefetches the next tile's key rows as it goes ([`NextRows`]).
//! 2. [`softmax::update`]: per-row visibility masks (causal, window, tile end), `exp`, running
//!    max/sum of the four rows at once, one pass while the running max holds.
//! 3. [`TileOps::accumulate`]: `acc = acc·corr + Σ_t p_t·v_t`, quantized value scales folded
//!    into the weights ([`softmax::scale_weights`]); prefetches the next value rows.
//!
//! `sc` holds one row block's scores and `p` their probabilities, as `[token][4]`: a 256-bit
//! vector is two tokens × four rows.

use std::arch::x86_64::*;

use half::f16;
use kvcache::format::turbo_sub;
use kvcache::{LayerView, PlaneView};

use std::ops::Range;

use super::group::{HeadStates, QueryBounds};
use super::queries::int8_lane_floats;
use super::softmax::{self, RowRanges};

/// Most key positions per tile.
pub const TILE: usize = 32;

/// Most scale groups per head vector.
pub const MAX_GROUPS: usize = super::MAX_FAST_HEAD_DIM / 32;

/// Most value scales per head vector: sub-scaled values have one per 8.
pub const MAX_VALUE_GROUPS: usize = super::MAX_FAST_HEAD_DIM / turbo_sub::SUB;

/// Floats of a `sc` buffer: `[TILE + 4][4]` (kernels may compute up to three tokens past a
/// tile's end, in whole vectors).
pub const SC_LEN: usize = (TILE + 4) * 4;

/// One work item's inputs: a sequence and a range of its kv heads.
pub(crate) struct RangeInput<'a> {
    pub layer: &'a LayerView<'a>,
    /// The kv heads served, consecutive.
    pub heads: Range<usize>,
    /// The sequence's block table (validated over the read range).
    pub table: &'a [u32],
    pub bounds: QueryBounds,
    /// Query rows per query token (`num_heads / num_kv_heads`).
    pub group: usize,
    /// `[heads.len(), q_len * group, head_dim]` scaled (and rotated, and for integer-coded keys
    /// int8-rounded) queries.
    pub q: &'a [f32],
    /// `[heads.len(), q_len * group, int8_lane_floats(head_dim)]` their int8 lanes, when the
    /// kernels compute K·Q in integers ([`super::simd::int8_keys`]).
    pub lanes: Option<&'a [f32]>,
    /// The position tiles are counted from (0, or the partition's first position): tiles are
    /// `[origin + k·TILE, origin + (k + 1)·TILE)` whatever range a call reads, so a query's
    /// tiles — and its sums — do not depend on which other queries share the call.
    pub origin: usize,
}

/// Per-thread tile buffers (f32).
pub(crate) struct TileScratch<'a> {
    /// `[SC_LEN]` scores of one row block: `[token][4]`.
    pub sc: &'a mut [f32],
    /// `[SC_LEN]` their probabilities.
    pub p: &'a mut [f32],
    /// `[TILE, MAX_GROUPS]` key group scales of the tile.
    pub kscale: &'a mut [f32],
    /// `[TILE, MAX_VALUE_GROUPS]` value group scales of the tile (of 32 values, or of 8 for
    /// sub-scaled values).
    pub vscale: &'a mut [f32],
    /// `[TILE, MAX_GROUPS, 4]` probabilities × value group scales (values scaled per 32).
    pub w: &'a mut [f32],
}

impl TileScratch<'_> {
    /// Floats each buffer needs, in field order.
    pub const LENS: [usize; 5] = [SC_LEN, SC_LEN, TILE * MAX_GROUPS, TILE * MAX_VALUE_GROUPS, TILE * MAX_GROUPS * 4];
}

/// One instruction set's QK and PV kernels for one (key codec, value codec) pair.
pub(crate) trait TileOps {
    /// Keys carry per-group scales: `scores` reads `kscale`.
    const K_SCALED: bool;
    /// Values carry per-group scales: `accumulate` reads weights per group.
    const V_SCALED: bool;
    /// Values carry a scale per 8 instead, `D · q` (`kvcache::format::turbo_sub`), which
    /// `accumulate` multiplies into the decoded values.
    const V_SUB_SCALED: bool;

    /// `sc[t][r] = q_r · k_t` for tokens `t0 .. t1` and `rows ≤ 4` rows (`q`: `[rows, d]`;
    /// `lanes`: their int8 lanes `[rows, int8_lane_floats(d)]` for integer kernels, else null),
    /// computed in whole vectors from `t0`, so up to three tokens past `t1` may be written
    /// (with garbage); lanes of rows `rows..4` are written as 0. `kscale`: `[TILE, MAX_GROUPS]`.
    /// Prefetches `next`'s rows at the positions it reads.
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
        lanes: *const f32,
        d: usize,
        sc: *mut f32,
        next: &NextRows,
    );

    /// `acc[r] = acc[r]·corr[r] + Σ_t w_t[r]·v_t` over tokens `t0 .. t1` for `rows ≤ 4` rows
    /// (`acc`: `[rows, d]`). Weight of token `t`, row `r`, value group `g` of 32: `w[t·wt + 4g +
    /// r]` for scaled codecs, `w[t·wt + r]` for unscaled and sub-scaled ones; the latter multiply
    /// their decoded values by `vscale` (`[TILE, MAX_VALUE_GROUPS]`, the tokens' `D · q` per 8
    /// values). Prefetches `next`'s rows at the same positions, pass by pass.
    ///
    /// # Safety
    /// The instruction set is available; `vrows[t0..t1]` are stored value rows of head_dim `d`;
    /// `w` and `acc` sized as documented.
    #[allow(clippy::too_many_arguments)]
    unsafe fn accumulate(
        &self,
        rows: usize,
        vrows: &[*const u8; TILE],
        vscale: *const f32,
        t0: usize,
        t1: usize,
        w: *const f32,
        wt: usize,
        corr: &[f32; 4],
        d: usize,
        acc: *mut f32,
        next: &NextRows,
    );
}

/// Where one plane's head vectors are: head vector `slot · num_kv_heads + kv_head`.
#[derive(Clone, Copy)]
struct PlaneRows<'a> {
    plane: &'a PlaneView<'a>,
}

impl PlaneRows<'_> {
    /// Index of (slot, kv head) among the plane's head vectors.
    #[inline(always)]
    fn head_index(&self, slot: usize, kv_head: usize) -> usize {
        slot * self.plane.num_kv_heads + kv_head
    }

    /// First code byte of the row of (`slot`, `kv_head`).
    ///
    /// # Safety
    /// `slot` lies inside the plane and `kv_head` is one of its heads.
    #[inline(always)]
    unsafe fn row(&self, slot: usize, kv_head: usize) -> *const u8 {
        let i = self.head_index(slot, kv_head);
        debug_assert!((i + 1) * self.plane.code_bytes <= self.plane.codes.len());
        // SAFETY: in bounds per the contract.
        unsafe { self.plane.codes.as_ptr().add(i * self.plane.code_bytes) }
    }

    /// First group scale of (`slot`, `kv_head`); the heads of a slot follow each other, so the
    /// next head's scales are `n_scales` further.
    #[inline(always)]
    fn scale_row(&self, slot: usize, kv_head: usize) -> *const f16 {
        let i = self.head_index(slot, kv_head);
        debug_assert!((i + 1) * self.plane.n_scales <= self.plane.scales.len());
        self.plane.scales.as_ptr().wrapping_add(i * self.plane.n_scales)
    }

    /// Prefetches into L2 the scales of kv heads `heads` in `slots` (one slot's heads are
    /// contiguous: a line or two per slot, not one prefetch per head). Codes are prefetched by
    /// the kernels, see [`NextRows`].
    #[inline(always)]
    fn prefetch_scales(&self, slots: &[usize], heads: &Range<usize>) {
        let ns = self.plane.n_scales;
        if ns == 0 || heads.is_empty() {
            return;
        }
        let bytes = heads.len() * ns * 2;
        for &slot in slots {
            let at = self.scale_row(slot, heads.start).cast::<u8>();
            let mut off = 0;
            // SAFETY (loop): prefetches are hints and cannot fault.
            while off < bytes {
                unsafe { _mm_prefetch::<_MM_HINT_T1>(at.wrapping_add(off).cast()) };
                off += 64;
            }
            unsafe { _mm_prefetch::<_MM_HINT_T1>(at.wrapping_add(bytes - 1).cast()) };
        }
    }

    /// The code rows of `kv_head` in `slots`, for prefetching.
    #[inline(always)]
    fn next_rows(&self, slots: &[usize], kv_head: usize) -> NextRows {
        let mut rows = [std::ptr::null::<u8>(); TILE];
        let cb = self.plane.code_bytes;
        for (r, &slot) in rows.iter_mut().zip(slots) {
            let i = self.head_index(slot, kv_head);
            debug_assert!((i + 1) * cb <= self.plane.codes.len());
            *r = self.plane.codes.as_ptr().wrapping_add(i * cb);
        }
        NextRows { rows, n: slots.len(), bytes: cb }
    }
}

/// One f16 value with F16C.
#[inline(always)]
unsafe fn f16_to_f32(h: f16) -> f32 {
    // SAFETY: F16C per the caller.
    unsafe { _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(h.to_bits() as i32))) }
}

/// `out[t · MAX_GROUPS + i] = rows[t][i]` as f32, for `i < ns` and every `t` of `rows`: one
/// head's group scales of a tile's tokens, each token's `ns` halves at `rows[t]`.
///
/// # Safety
/// F16C available; each `rows[t]` points to `ns` readable halves; `out` holds
/// `rows.len() · MAX_GROUPS` floats and `ns ≤ MAX_GROUPS`.
#[inline(always)]
unsafe fn convert_scales(rows: &[*const f16], ns: usize, out: &mut [f32]) {
    debug_assert!(ns <= MAX_GROUPS && out.len() >= rows.len() * MAX_GROUPS);
    let o = out.as_mut_ptr();
    // SAFETY: reads stay inside each row's `ns` halves (whole runs of 8, 4 or 2, then single
    // halves); writes inside `out` (caller's contract).
    unsafe {
        // The common group counts (head_dim 64, 128, 256) get a loop of their own: a scale
        // row in one load, one conversion and one store, no inner loop per token.
        match ns {
            2 => {
                for (t, &r) in rows.iter().enumerate() {
                    let pair = _mm_cvtsi32_si128(r.cast::<i32>().read_unaligned());
                    _mm_storel_pd(o.add(t * MAX_GROUPS).cast(), _mm_castps_pd(_mm_cvtph_ps(pair)));
                }
                return;
            }
            4 => {
                for (t, &r) in rows.iter().enumerate() {
                    _mm_storeu_ps(o.add(t * MAX_GROUPS), _mm_cvtph_ps(_mm_loadl_epi64(r.cast())));
                }
                return;
            }
            8 => {
                for (t, &r) in rows.iter().enumerate() {
                    _mm256_storeu_ps(o.add(t * MAX_GROUPS), _mm256_cvtph_ps(_mm_loadu_si128(r.cast())));
                }
                return;
            }
            _ => {}
        }
        for (t, &r) in rows.iter().enumerate() {
            let mut i = 0;
            while i + 8 <= ns {
                _mm256_storeu_ps(o.add(t * MAX_GROUPS + i), _mm256_cvtph_ps(_mm_loadu_si128(r.add(i).cast())));
                i += 8;
            }
            while i + 4 <= ns {
                _mm_storeu_ps(o.add(t * MAX_GROUPS + i), _mm_cvtph_ps(_mm_loadl_epi64(r.add(i).cast())));
                i += 4;
            }
            while i + 2 <= ns {
                let pair = _mm_cvtsi32_si128(r.add(i).cast::<i32>().read_unaligned());
                _mm_storel_pd(o.add(t * MAX_GROUPS + i).cast(), _mm_castps_pd(_mm_cvtph_ps(pair)));
                i += 2;
            }
            while i < ns {
                *o.add(t * MAX_GROUPS + i) = f16_to_f32(*r.add(i));
                i += 1;
            }
        }
    }
}

/// `out[t · MAX_VALUE_GROUPS + j] = D · q_j` of the sub-scaled head vector whose scale slots
/// start at `rows[t]`, for its `subs` sub-groups (`kvcache::format::turbo_sub`: slot 0 is `D`,
/// slot `1 + j/4` holds `q_j` at bits `4·(j % 4)`); the products are exact.
///
/// # Safety
/// F16C available; each `rows[t]` points to `1 + ceil(subs/4)` readable slots; `out` holds
/// `rows.len() · MAX_VALUE_GROUPS` floats and `subs ≤ MAX_VALUE_GROUPS`.
#[inline(always)]
unsafe fn expand_sub_scales(rows: &[*const f16], subs: usize, out: &mut [f32]) {
    debug_assert!(subs <= MAX_VALUE_GROUPS && out.len() >= rows.len() * MAX_VALUE_GROUPS);
    let o = out.as_mut_ptr();
    // SAFETY: reads stay inside each row's slots (8 multipliers are 4 whole bytes), writes
    // inside `out` (caller's contract); AVX2 + F16C per the caller.
    unsafe {
        let shifts = _mm256_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28);
        let nibble = _mm256_set1_epi32(0xF);
        for (t, &r) in rows.iter().enumerate() {
            let dv = f16_to_f32(*r);
            let d8 = _mm256_set1_ps(dv);
            let qs = r.add(1).cast::<u8>();
            let at = o.add(t * MAX_VALUE_GROUPS);
            let mut j = 0;
            while j + 8 <= subs {
                let word = _mm256_set1_epi32(qs.add(j / 2).cast::<i32>().read_unaligned());
                let q = _mm256_and_si256(_mm256_srlv_epi32(word, shifts), nibble);
                _mm256_storeu_ps(at.add(j), _mm256_mul_ps(_mm256_cvtepi32_ps(q), d8));
                j += 8;
            }
            if j < subs {
                // The last sub-groups (head_dim not a multiple of 64) through the reference.
                let slots = std::slice::from_raw_parts(r, turbo_sub::scale_slots(8 * subs));
                for j in j..subs {
                    *at.add(j) = turbo_sub::sub_scale(slots, j);
                }
            }
        }
    }
}

/// The next tile's stored rows of one kv head and plane, for the kernels to prefetch into L2
/// as they consume the current tile's: QK prefetches each next row whole when it reads the
/// row at the same position, PV the part of it matching the pass it is in. Spread like this,
/// the prefetches keep pace with the reads; issued in bursts (a head's next rows at once) they
/// overflow the miss queues and stall the core.
pub(crate) struct NextRows {
    /// `[TILE]` first code byte of each next row; `rows[..n]` valid.
    pub rows: [*const u8; TILE],
    pub n: usize,
    /// Code bytes of a row.
    pub bytes: usize,
}

impl NextRows {
    /// Prefetches the 64-byte lines of row `t` that start in `[from, to)` of it (offsets
    /// relative to the row start; the last line also when `to` is the row's end), if `t` is one
    /// of the next rows.
    #[inline(always)]
    pub fn lines(&self, t: usize, from: usize, to: usize) {
        if t >= self.n {
            return;
        }
        // SAFETY: t < n ≤ TILE; prefetches are hints and cannot fault.
        unsafe {
            let row = *self.rows.get_unchecked(t);
            let mut off = from.next_multiple_of(64);
            while off < to {
                _mm_prefetch::<_MM_HINT_T1>(row.wrapping_add(off).cast());
                off += 64;
            }
            if to == self.bytes {
                _mm_prefetch::<_MM_HINT_T1>(row.wrapping_add(self.bytes - 1).cast());
            }
        }
    }

    /// Prefetches all of row `t`.
    #[inline(always)]
    pub fn row(&self, t: usize) {
        self.lines(t, 0, self.bytes);
    }
}

/// Moves every row pointer one head vector (`bytes`) on.
#[inline(always)]
fn advance(rows: &mut [*const u8], bytes: usize) {
    for r in rows {
        *r = r.wrapping_add(bytes);
    }
}

/// `slots[t]` ← the slot holding position `t0 + t`, for `t0 .. t1` (one division per block).
#[inline(always)]
fn slots_of(table: &[u32], bs: usize, t0: usize, t1: usize, slots: &mut [usize]) {
    debug_assert!(t1 - t0 <= slots.len());
    let mut pos = t0;
    while pos < t1 {
        let (blk, off) = (pos / bs, pos % bs);
        let len = (bs - off).min(t1 - pos);
        let first = table[blk] as usize * bs + off;
        for (j, s) in slots[pos - t0..pos - t0 + len].iter_mut().enumerate() {
            *s = first + j;
        }
        pos += len;
    }
}

/// Processes key positions `[start, end)` (inside the validated read range) of every kv head
/// in `inp.heads` for every query row that sees any of them, updating `states` (one region per
/// head, `q_len * group` rows each) with `ops`' kernels.
///
/// Tiles are the outer loop and heads the inner one: a tile's heads share its blocks, so each
/// block (`[block_size, num_kv_heads, code_bytes]`) is read whole and at once — pages stay in
/// the TLB, and the L2 prefetches of the next tile (issued head by head, spread over the tile's
/// work) cover contiguous memory.
///
/// Inlined into a caller compiled for `ops`' instruction set (at least AVX2 + FMA + F16C), so
/// the kernels inline into the tile loop.
///
/// # Safety
/// AVX2, FMA, F16C and `ops`' instruction set are available; the block table is valid over
/// `[start, end)` (as [`super::validate`] checks); `head_dim` is a multiple of 16 and at most
/// `MAX_FAST_HEAD_DIM`; `ops` matches the layer's codecs; buffers sized as documented on
/// [`TileScratch`] and [`HeadStates`].
#[inline(always)]
pub(crate) unsafe fn run<T: TileOps>(
    ops: &T,
    inp: &RangeInput,
    start: usize,
    end: usize,
    states: &mut HeadStates,
    scratch: &mut TileScratch,
) {
    let layer = inp.layer;
    let (d, bs, g) = (layer.head_dim, layer.block_size, inp.group);
    debug_assert!(d % 16 == 0 && d <= super::MAX_FAST_HEAD_DIM);
    let rows_per_head = inp.bounds.q_len * g;
    debug_assert_eq!(states.rows, rows_per_head);
    // Value scale groups of 32 per head vector (weights per group), and sub-groups of 8.
    let (ng, subs) = (d.div_ceil(32), d / 8);
    let keys = PlaneRows { plane: &layer.keys };
    let values = PlaneRows { plane: &layer.values };
    let mut krows = [std::ptr::null::<u8>(); TILE];
    let mut vrows = [std::ptr::null::<u8>(); TILE];
    // Group scales of the tile's tokens, like `krows` / `vrows` (scaled codecs only).
    let mut ksrows = [std::ptr::null::<f16>(); TILE];
    let mut vsrows = [std::ptr::null::<f16>(); TILE];
    let (kns, vns) = (layer.keys.n_scales, layer.values.n_scales);
    let (mut slots, mut next) = ([0usize; TILE], [0usize; TILE]);
    // The first tile starts on the tile grid. Its positions before `start` lie before every
    // query's window (with a window, the read range starts at the first query's): they are
    // masked for every row and may be reclaimed, so they repeat `start`'s slot.
    debug_assert!(inp.origin <= start);
    let first = inp.origin + (start - inp.origin) / TILE * TILE;
    slots_of(inp.table, bs, start, end.min(first + TILE), &mut slots[start - first..]);
    let lead = slots[start - first];
    slots[..start - first].fill(lead);
    let mut t0 = first;
    while t0 < end {
        let t1 = end.min(t0 + TILE);
        let n = t1 - t0;
        let n_next = end.min(t1 + TILE) - t1;
        slots_of(inp.table, bs, t1, t1 + n_next, &mut next);
        let (i0, i1) = inp.bounds.tokens_seeing(t0, t1);
        // Row pointers of the first head; each further head's rows follow its predecessor's by
        // one head vector.
        let next_slots = &next[..n_next];
        let mut next_k = keys.next_rows(next_slots, inp.heads.start);
        let mut next_v = values.next_rows(next_slots, inp.heads.start);
        for (t, &slot) in slots[..n].iter().enumerate() {
            // SAFETY: every slot of the tile is valid (validated block table).
            unsafe {
                krows[t] = keys.row(slot, inp.heads.start);
                vrows[t] = values.row(slot, inp.heads.start);
            }
            if T::K_SCALED {
                ksrows[t] = keys.scale_row(slot, inp.heads.start);
            }
            if T::V_SCALED {
                vsrows[t] = values.scale_row(slot, inp.heads.start);
            }
        }
        if T::K_SCALED {
            keys.prefetch_scales(next_slots, &inp.heads);
        }
        if T::V_SCALED {
            values.prefetch_scales(next_slots, &inp.heads);
        }
        let (kcb, vcb) = (layer.keys.code_bytes, layer.values.code_bytes);
        for hi in 0..inp.heads.len() {
            if hi > 0 {
                advance(&mut krows[..n], kcb);
                advance(&mut vrows[..n], vcb);
                advance(&mut next_k.rows[..n_next], kcb);
                advance(&mut next_v.rows[..n_next], vcb);
                if T::K_SCALED {
                    for r in &mut ksrows[..n] {
                        *r = r.wrapping_add(kns);
                    }
                }
                if T::V_SCALED {
                    for r in &mut vsrows[..n] {
                        *r = r.wrapping_add(vns);
                    }
                }
            }
            let no_rows = NextRows { rows: [std::ptr::null(); TILE], n: 0, bytes: 0 };
            // Next rows the first row block's kernels do not reach: prefetched here.
            let (mut done_lo, mut done_hi) = (0, 0);
            if i0 == i1 {
                for t in 0..n_next {
                    next_k.row(t);
                    next_v.row(t);
                }
                continue;
            }
            // SAFETY (whole head): every slot of the tile is valid (validated block table);
            // kernels read rows through krows/vrows[..n] and the scratch buffers, sized as
            // documented; the head's state holds rows r0..r1.
            unsafe {
                if T::K_SCALED {
                    convert_scales(&ksrows[..n], kns, scratch.kscale);
                }
                if T::V_SUB_SCALED {
                    expand_sub_scales(&vsrows[..n], subs, scratch.vscale);
                } else if T::V_SCALED {
                    convert_scales(&vsrows[..n], vns, scratch.vscale);
                }
                let state = states.head(hi);
                let q_head = inp.q.as_ptr().add(hi * rows_per_head * d);
                let hi_rows = hi * rows_per_head;
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
                    // From the tile's first column for every row block: a row's scores and sums
                    // then run over the same columns (its masked ones add exact zeros) whether
                    // or not a row with an earlier window start shares its block.
                    lo = 0;
                    let mut m = [f32::NEG_INFINITY; 4];
                    let mut l = [0f32; 4];
                    for j in 0..nr {
                        m[j] = state.m[rows.start + j];
                        l[j] = state.l[rows.start + j];
                    }
                    let first = done_hi == 0;
                    if first {
                        (done_lo, done_hi) = (lo, hi);
                    }
                    let sc = scratch.sc.as_mut_ptr();
                    let q = q_head.add(rows.start * d);
                    let lanes = match inp.lanes {
                        Some(l) => l.as_ptr().add((hi_rows + rows.start) * int8_lane_floats(d)),
                        None => std::ptr::null(),
                    };
                    let next = if first { &next_k } else { &no_rows };
                    ops.scores(nr, &krows, scratch.kscale, lo, hi, q, lanes, d, sc, next);
                    let pr = scratch.p.as_mut_ptr();
                    let corr = softmax::update(sc, pr, lo, hi, &ranges, &mut m, &mut l);
                    for j in 0..nr {
                        state.m[rows.start + j] = m[j];
                        state.l[rows.start + j] = l[j];
                    }
                    let (w, wt) = if T::V_SCALED && !T::V_SUB_SCALED {
                        softmax::scale_weights(pr, scratch.vscale, MAX_GROUPS, ng, lo, hi, scratch.w);
                        (scratch.w.as_ptr(), ng * 4)
                    } else {
                        (pr.cast_const(), 4)
                    };
                    let acc = state.acc.as_mut_ptr().add(rows.start * d);
                    let vs = scratch.vscale.as_ptr();
                    ops.accumulate(
                        nr,
                        &vrows,
                        vs,
                        lo,
                        hi,
                        w,
                        wt,
                        &corr,
                        d,
                        acc,
                        if first { &next_v } else { &no_rows },
                    );
                }
            }
            for t in (0..done_lo).chain(done_hi..n_next) {
                next_k.row(t);
                next_v.row(t);
            }
        }
        std::mem::swap(&mut slots, &mut next);
        t0 = t1;
    }
}
