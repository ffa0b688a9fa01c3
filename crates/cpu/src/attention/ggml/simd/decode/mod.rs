//! The split decode of `super` (every sequence `q_len` 1, fewer (sequence, kv head) units than
//! the threads can share): one parallel region per call, cut into `S` **shares** (1, 2 or 4)
//! by 16-position blocks aligned to absolute positions, block `b` in share `b mod S`. Since
//! ggml's `V·p` lane of position `t` is `t mod 64`, block `b` feeds lane group `b mod 4`, so a
//! share owns whole lanes: its positions' scores, probabilities and `V·p` lanes never leave it,
//! and no sum is split (each lane's FMA chain runs over its positions in order in one share).
//! Each share reads its blocks' keys and values for every kv head at once (a block's rows are
//! contiguous), the next blocks prefetched.
//!
//! Four phases, each with one item per share; an item is claimed by whichever thread comes
//! first (its own share first), and a phase starts when every item of the one before is done,
//! so a thread never waits for an item nobody runs (one thread alone runs them all):
//!
//! 1. scores of the share's blocks (every row of every kv head of every sequence) and their
//!    maximum per row;
//! 2. `expf(score − max)` with the maximum over the shares, and each block's `reduce16` sum;
//! 3. the denominator (the block sums in f64, in block order, as `softmax_row` adds them), the
//!    probabilities rounded to f16, and `V·p` of the share's lanes: positions in tiles of
//!    [`TILE_POSITIONS`], within a tile lane by lane with the lane's accumulators in registers
//!    (loaded and stored once per tile), the next tile's rows prefetched; with 2 shares, a row
//!    within one tile sums each pair of lanes `l`, `l + 32` in registers straight into the
//!    fold's first level ([`lane_pairs`]);
//! 4. the fold of the 64 lanes (`(l + (l+32)) + ((l+16) + (l+48))`, then `reduce16`) for a
//!    share of the rows, reading every share's lanes.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use super::call::{block_keys, prepare_queries, row, score_block, Call};
use super::lanes::{Lanes16, YmmPair, Zmm};
use crate::attention::group::QueryBounds;
use crate::attention::workspace::AlignedF32;
use kvcache::PlaneView;

pub(super) mod values;

/// Most shares a call is cut into.
pub(super) const MAX_SHARES: usize = 4;
/// Phases of a call (see the module docs).
const PHASES: usize = 4;
/// Positions per `V·p` tile (a multiple of 64, at least 128 so every lane's first position lies
/// in the first tile). 1024 positions of SmolLM2's 3 kv heads: 384 KB of values, half per
/// share on 2 threads, in L2 with the next tile's (measured at 4096 positions, KV from DRAM:
/// 256, 512 and 1024 within ~4 %, 1024 best; a row of at most one tile takes `lane_pairs`).
const TILE_POSITIONS: usize = 1024;
/// Own blocks ahead whose keys the score phase prefetches.
const PREFETCH_BLOCKS: usize = 2;

/// Claims and completions of the phases' items.
#[derive(Default)]
pub(super) struct PhaseSync {
    claimed: [[AtomicBool; MAX_SHARES]; PHASES],
    done: [AtomicUsize; PHASES],
}

impl PhaseSync {
    fn reset(&self) {
        for phase in &self.claimed {
            for c in phase {
                c.store(false, Ordering::Relaxed);
            }
        }
        for d in &self.done {
            d.store(0, Ordering::Relaxed);
        }
    }
}

/// Buffers of one share.
#[derive(Default)]
pub(super) struct ShareBuffers {
    /// `[rows, head_dim]` f16-rounded queries of every row.
    q: AlignedF32,
    /// `[16, head_dim]` one block's staged keys.
    kf: AlignedF32,
    /// `[group, 256]` one block's partial vectors.
    xs: AlignedF32,
    /// `[rows, pstride]` scores, then exponentials, then probabilities of the share's blocks.
    probs: AlignedF32,
    /// `[64 / S, rows, head_dim]` the share's lane accumulators.
    acc: AlignedF32,
    /// `[16, rows, head_dim]` with 2 shares: the share's two lane groups added (the first
    /// level of the fold), the part of the lanes another share's fold reads.
    part: AlignedF32,
    /// `[2, 64 / S, TILE_POSITIONS / 64]` value row addresses of a tile and the next.
    list: Vec<usize>,
}

/// Buffers of the split decode, reused across calls.
#[derive(Default)]
pub(super) struct DecodeWorkspace {
    shares: Vec<ShareBuffers>,
    /// `[S, rows]` each share's maximum score per row.
    maxes: AlignedF32,
    /// `[rows, bstride]` each block's `reduce16` of its exponentials.
    sums: AlignedF32,
    sync: PhaseSync,
}

#[derive(Clone, Copy)]
struct SharePtrs {
    q: *mut f32,
    kf: *mut f32,
    xs: *mut f32,
    probs: *mut f32,
    acc: *mut f32,
    part: *mut f32,
    list: *mut usize,
}

/// What every item of a call reads.
pub(super) struct Decode<'a> {
    c: &'a Call<'a>,
    shares: usize,
    /// `num_seqs · num_heads`: row `r` is (sequence `r / num_heads`, head `r % num_heads`).
    rows: usize,
    pstride: usize,
    bstride: usize,
    ptrs: [SharePtrs; MAX_SHARES],
    maxes: *mut f32,
    sums: *mut f32,
    sync: &'a PhaseSync,
}

// SAFETY: the pointers are buffers of the workspace, borrowed mutably for the call; the phases
// write disjoint parts of them (each share its own buffers, its own `maxes` row and its own
// blocks of `sums`; the fold its own output rows) and read others' only after the phase that
// wrote them is done (Release / Acquire on the phase counters).
unsafe impl Sync for Decode<'_> {}

/// How many shares a call with `threads` threads is cut into.
pub(super) fn shares_for(threads: usize, max_read: usize) -> usize {
    match threads {
        0 | 1 => 1,
        2 | 3 => 2,
        _ if max_read >= 256 => 4,
        _ => 2,
    }
}

/// Share `s`'s own blocks of a sequence reading blocks `b0..b1`: `j0..j1`, block `s + S·j`.
#[inline(always)]
fn own_blocks(s: usize, shares: usize, b0: usize, b1: usize) -> (usize, usize) {
    ((b0 + shares - 1 - s) / shares, (b1 + shares - 1 - s) / shares)
}

impl<'a> Decode<'a> {
    /// The decode of `c` (every `q_len` 1) in `shares` shares, buffers from `ws`.
    pub(super) fn new(c: &'a Call<'a>, shares: usize, max_read: usize, ws: &'a mut DecodeWorkspace) -> Decode<'a> {
        let (d, g) = (c.d, c.group);
        let rows = c.p.num_seqs * c.p.num_heads;
        let max_blocks = max_read.div_ceil(16) + 1;
        let pstride = (max_blocks.div_ceil(shares) + 1) * 16;
        let bstride = max_blocks + 1;
        let lanes = 64 / shares;
        while ws.shares.len() < shares {
            ws.shares.push(ShareBuffers::default());
        }
        let null = SharePtrs {
            q: std::ptr::null_mut(),
            kf: std::ptr::null_mut(),
            xs: std::ptr::null_mut(),
            probs: std::ptr::null_mut(),
            acc: std::ptr::null_mut(),
            part: std::ptr::null_mut(),
            list: std::ptr::null_mut(),
        };
        let mut ptrs = [null; MAX_SHARES];
        for (sb, ptr) in ws.shares.iter_mut().zip(ptrs.iter_mut()).take(shares) {
            sb.q.ensure(rows * d);
            sb.kf.ensure(16 * d);
            sb.xs.ensure(g * 256);
            sb.probs.ensure(rows * pstride);
            sb.acc.ensure(lanes * rows * d);
            if shares == 2 {
                sb.part.ensure(16 * rows * d);
            }
            let list = 2 * lanes * (TILE_POSITIONS / 64);
            if sb.list.len() < list {
                sb.list.resize(list, 0);
            }
            *ptr = SharePtrs {
                q: sb.q.as_mut_ptr(),
                kf: sb.kf.as_mut_ptr(),
                xs: sb.xs.as_mut_ptr(),
                probs: sb.probs.as_mut_ptr(),
                acc: sb.acc.as_mut_ptr(),
                part: sb.part.as_mut_ptr(),
                list: sb.list.as_mut_ptr(),
            };
        }
        ws.maxes.ensure(shares * rows);
        ws.sums.ensure(rows * bstride);
        ws.sync.reset();
        Decode {
            c,
            shares,
            rows,
            pstride,
            bstride,
            ptrs,
            maxes: ws.maxes.as_mut_ptr(),
            sums: ws.sums.as_mut_ptr(),
            sync: &ws.sync,
        }
    }

    /// Runs the phases' items, share `preferred`'s first in each, waiting for each phase to
    /// finish before the next; `item(phase, share)` runs one.
    pub(super) fn run_phases(&self, preferred: usize, item: impl Fn(usize, usize)) {
        let n = self.shares;
        for phase in 0..PHASES {
            for k in 0..n {
                let s = (preferred + k) % n;
                let flag = &self.sync.claimed[phase][s];
                if !flag.load(Ordering::Relaxed) && !flag.swap(true, Ordering::AcqRel) {
                    item(phase, s);
                    self.sync.done[phase].fetch_add(1, Ordering::Release);
                }
            }
            let mut spins = 0u32;
            while self.sync.done[phase].load(Ordering::Acquire) != n {
                spins += 1;
                if spins < 4000 {
                    std::hint::spin_loop();
                } else {
                    std::thread::yield_now();
                }
            }
        }
    }
}

/// The rows (kv head 0) of positions `t0..t0 + 16` (`t0` a multiple of 16); positions outside
/// `u0..u1` (non-empty, inside the block) get `u0`'s row. A pool block holds `bs` consecutive
/// positions, so the rows come in runs of `min(bs, 16)` consecutive slots.
#[inline(always)]
fn block_rows(plane: &PlaneView, table: &[u32], bs: usize, t0: usize, u0: usize, u1: usize) -> [*const u16; 16] {
    let first = row(plane, table, bs, 0, u0);
    let mut rows = [first; 16];
    let step = plane.num_kv_heads * plane.code_bytes / 2;
    let run = bs.min(16);
    let mut j = 0;
    while j < 16 {
        let (a, b) = ((t0 + j).max(u0), (t0 + j + run).min(u1));
        if a < b {
            let base = row(plane, table, bs, 0, a);
            for (k, r) in rows[a - t0..b - t0].iter_mut().enumerate() {
                *r = base.wrapping_add(k * step);
            }
        }
        j += run;
    }
    rows
}

/// Prefetches the rows (every kv head, `row_bytes`) of positions `t0..t1` inside one
/// 16-position block, run by run of consecutive slots.
#[inline(always)]
fn prefetch_rows(plane: &PlaneView, table: &[u32], bs: usize, t0: usize, t1: usize, row_bytes: usize) {
    let mut t = t0;
    while t < t1 {
        let end = ((t / bs + 1) * bs).min(t1);
        prefetch(row(plane, table, bs, 0, t).cast(), (end - t) * row_bytes);
        t = end;
    }
}

/// Prefetches the `bytes` from `p` (a line per 64 bytes) into L2: `prefetcht1` (measured at
/// 4096 positions with the KV from DRAM, 2 threads: ~300 µs per call against ~475 with
/// `prefetcht0`, which fills L1 with lines needed later; `prefetchnta` ~465).
#[inline(always)]
fn prefetch(p: *const u8, bytes: usize) {
    use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T1};
    let mut o = 0;
    while o < bytes {
        // SAFETY: prefetching never faults.
        unsafe { _mm_prefetch::<_MM_HINT_T1>(p.wrapping_add(o).cast()) };
        o += 64;
    }
}

/// Phase 1: scores of share `s`'s blocks, every row; its maximum per row into `maxes`.
#[inline(always)]
pub(super) unsafe fn scores<V: DecodeScores>(dec: &Decode, s: usize, _max_nv: usize) {
    let (c, n) = (dec.c, dec.shares);
    let (d, g, hkv) = (c.d, c.group, c.layer.num_kv_heads);
    let sp = dec.ptrs[s];
    let (layer, p) = (c.layer, c.p);
    let row_bytes = hkv * layer.keys.code_bytes;
    // SAFETY (whole body): buffers sized by `Decode::new`; this share alone writes them.
    unsafe {
        for seq in 0..p.num_seqs {
            let (lo, hi) = QueryBounds::of(p, seq).keys_of(0);
            let (j0, j1) = own_blocks(s, n, lo / 16, hi.div_ceil(16));
            let table = p.block_tables[seq];
            for kv in 0..hkv {
                prepare_queries::<V>(c, seq, kv, 0, 1, sp.q.add((seq * p.num_heads + kv * g) * d));
            }
            for j in j0..j1 {
                let t0 = 16 * (s + n * j);
                // The keys of the own block PREFETCH_BLOCKS ahead, every kv head.
                let ahead = t0 + 16 * n * PREFETCH_BLOCKS;
                prefetch_rows(&layer.keys, table, layer.block_size, ahead.max(lo), (ahead + 16).min(hi), row_bytes);
                let probs = sp.probs.add(16 * (j - j0));
                if V::FAST64 && d == 64 {
                    // Positions outside lo..hi read a valid row; their scores are masked.
                    let (u0, u1) = (t0.max(lo), (t0 + 16).min(hi));
                    let rows = block_rows(&layer.keys, table, layer.block_size, t0, u0, u1);
                    for kv in 0..hkv {
                        let r0 = seq * p.num_heads + kv * g;
                        let krows = rows.map(|r| r.add(kv * d));
                        let dst = |h: usize| probs.add((r0 + h) * dec.pstride);
                        V::block64(&krows, sp.q.add(r0 * d), g, p.scale, dst);
                        if u0 > t0 || u1 < t0 + 16 {
                            for h in 0..g {
                                for jj in 0..16 {
                                    if !(u0..u1).contains(&(t0 + jj)) {
                                        *dst(h).add(jj) = f32::NEG_INFINITY;
                                    }
                                }
                            }
                        }
                    }
                    continue;
                }
                for kv in 0..hkv {
                    let r0 = seq * p.num_heads + kv * g;
                    let keys = block_keys::<V>(c, seq, kv, t0, lo, hi, false, sp.kf);
                    let dst = |h: usize| probs.add((r0 + h) * dec.pstride);
                    score_block::<V>(c, &keys, false, sp.q.add(r0 * d), sp.xs, t0, lo, hi, dst);
                }
            }
            for r in seq * p.num_heads..(seq + 1) * p.num_heads {
                let mut m = V::splat(f32::NEG_INFINITY);
                let pr = sp.probs.add(r * dec.pstride);
                for k in 0..j1 - j0 {
                    m = m.max(V::load(pr.add(16 * k)));
                }
                *dec.maxes.add(s * dec.rows + r) = m.max_lane();
            }
        }
    }
}

/// Phase 2: `expf(score − max)` of share `s`'s blocks with every share's maximum, each block's
/// `reduce16` into `sums`; then the first value tile's rows prefetched.
#[inline(always)]
pub(super) unsafe fn exponentials<V: Lanes16>(dec: &Decode, s: usize, _max_nv: usize) {
    let (c, n) = (dec.c, dec.shares);
    let p = c.p;
    let sp = dec.ptrs[s];
    // SAFETY: phase 1 is done; this share writes its own blocks and their sums.
    unsafe {
        for seq in 0..p.num_seqs {
            let (lo, hi) = QueryBounds::of(p, seq).keys_of(0);
            let (b0, b1) = (lo / 16, hi.div_ceil(16));
            let (j0, j1) = own_blocks(s, n, b0, b1);
            for r in seq * p.num_heads..(seq + 1) * p.num_heads {
                let mut m = f32::NEG_INFINITY;
                for k in 0..n {
                    m = m.max(*dec.maxes.add(k * dec.rows + r));
                }
                let neg_max = V::splat(-m);
                let pr = sp.probs.add(r * dec.pstride);
                let sums = dec.sums.add(r * dec.bstride);
                for j in j0..j1 {
                    let at = pr.add(16 * (j - j0));
                    let e = V::load(at).add(neg_max).expf();
                    e.store(at);
                    *sums.add(s + n * j - b0) = e.reduce();
                }
            }
            // The values of the first tile's own positions, every kv head.
            let (layer, table) = (c.layer, p.block_tables[seq]);
            let row_bytes = layer.num_kv_heads * layer.values.code_bytes;
            let w0 = lo & !63;
            for j in j0..j1 {
                let t0 = 16 * (s + n * j);
                if t0 >= w0 + TILE_POSITIONS {
                    break;
                }
                prefetch_rows(&layer.values, table, layer.block_size, t0.max(lo), (t0 + 16).min(hi), row_bytes);
            }
        }
    }
}

/// One lane of one tile: `acc_h[c] (+)= Σ_k v_k[c] · p_h[k · step]` by FMA in order of `k`
/// for `NH` heads (`p_h = p + h · pstride`, `acc_h = acc + h · astride`) and `NV` vectors of 16
/// dimensions, from 0 (`load` false) or from `acc`. `rows[k]`: the lane's `k`-th value row
/// address (read from element `off`).
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn lane_tile<V: Lanes16, const NH: usize, const NV: usize>(
    rows: *const usize,
    off: usize,
    count: usize,
    p: *const f32,
    pstride: usize,
    step: usize,
    acc: *mut f32,
    astride: usize,
    load: bool,
) {
    unsafe {
        let mut a = [[V::zero(); NV]; NH];
        if load {
            for (h, a) in a.iter_mut().enumerate() {
                for (c, a) in a.iter_mut().enumerate() {
                    *a = V::load(acc.add(h * astride + 16 * c));
                }
            }
        }
        for k in 0..count {
            let row = (*rows.add(k) as *const u16).add(off);
            let mut x = [V::zero(); NV];
            for (c, xc) in x.iter_mut().enumerate() {
                *xc = V::load_f16(row.add(16 * c));
            }
            for (h, a) in a.iter_mut().enumerate() {
                let w = V::splat(*p.add(h * pstride + k * step));
                for (a, &xc) in a.iter_mut().zip(&x) {
                    *a = V::fma(xc, w, *a);
                }
            }
        }
        for (h, a) in a.iter().enumerate() {
            for (c, a) in a.iter().enumerate() {
                a.store(acc.add(h * astride + 16 * c));
            }
        }
    }
}

/// 16-float vectors of output dimensions one tile pass takes: 4 or 2 where the register budget
/// (`max_nv`) and the `left` vectors still to do allow, else 1.
fn vectors_per_pass(max_nv: usize, left: usize) -> usize {
    if max_nv >= 4 && left >= 4 {
        4
    } else if max_nv >= 2 && left >= 2 {
        2
    } else {
        1
    }
}

/// [`lane_tile`] for `heads` heads and `16·nvec` dimensions, in passes of at most 4 heads ×
/// `max_nv` vectors.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn lane_tiles<V: Lanes16>(
    max_nv: usize,
    heads: usize,
    rows: *const usize,
    off: usize,
    nvec: usize,
    count: usize,
    p: *const f32,
    pstride: usize,
    step: usize,
    acc: *mut f32,
    astride: usize,
    load: bool,
) {
    let mut h0 = 0;
    while h0 < heads {
        let nh = (heads - h0).min(4);
        let mut c0 = 0;
        while c0 < nvec {
            let nv = vectors_per_pass(max_nv, nvec - c0);
            // SAFETY: forwarded contract.
            unsafe {
                let (off, p, acc) = (off + 16 * c0, p.add(h0 * pstride), acc.add(h0 * astride + 16 * c0));
                macro_rules! go {
                    ($($nh:literal, $nv:literal);*) => {
                        match (nh, nv) {
                            $(($nh, $nv) => lane_tile::<V, $nh, $nv>(rows, off, count, p, pstride, step, acc, astride, load),)*
                            _ => unreachable!("passes are 1..=4 heads × 1, 2 or 4 vectors"),
                        }
                    };
                }
                go!(1, 1; 2, 1; 3, 1; 4, 1; 1, 2; 2, 2; 3, 2; 4, 2; 1, 4; 2, 4; 3, 4; 4, 4);
            }
            c0 += nv;
        }
        h0 += nh;
    }
}

/// Two lanes' sums for `NH` heads and `NV` vectors of 16 dimensions, each `Σ_k v_k · p_h[k ·
/// step]` by FMA in order of `k` from 0 as [`lane_tile`] takes it, then added (first lane
/// first): `out_h ← a_h + b_h` (`out_h = out + h · astride`). `lanes[i]`: (row addresses,
/// count, `p` of the lane's first position, head 0; head `h` at `+ h · pstride`).
#[inline(always)]
unsafe fn lane_pair<V: Lanes16, const NH: usize, const NV: usize>(
    off: usize,
    lanes: &[(*const usize, usize, *const f32); 2],
    pstride: usize,
    step: usize,
    out: *mut f32,
    astride: usize,
) {
    unsafe {
        let mut a = [[[V::zero(); NV]; NH]; 2];
        for (ai, &(rows, count, p)) in a.iter_mut().zip(lanes) {
            for k in 0..count {
                let row = (*rows.add(k) as *const u16).add(off);
                let mut x = [V::zero(); NV];
                for (c, xc) in x.iter_mut().enumerate() {
                    *xc = V::load_f16(row.add(16 * c));
                }
                for (h, a) in ai.iter_mut().enumerate() {
                    let w = V::splat(*p.add(h * pstride + k * step));
                    for (a, &xc) in a.iter_mut().zip(&x) {
                        *a = V::fma(xc, w, *a);
                    }
                }
            }
        }
        let [first, second] = a;
        for (h, (x, y)) in first.iter().zip(&second).enumerate() {
            for (c, (x, y)) in x.iter().zip(y).enumerate() {
                x.add(*y).store(out.add(h * astride + 16 * c));
            }
        }
    }
}

/// [`lane_pair`] for `heads` heads and `16·nvec` dimensions, in passes that keep both lanes'
/// accumulators in registers (`max_nv` as for [`lane_tiles`]; 3 heads × 4 vectors or 4 × 2 on
/// AVX-512).
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn lane_pairs<V: Lanes16>(
    max_nv: usize,
    heads: usize,
    off: usize,
    nvec: usize,
    lanes: [(*const usize, usize, *const f32); 2],
    pstride: usize,
    step: usize,
    out: *mut f32,
    astride: usize,
) {
    let mut h0 = 0;
    while h0 < heads {
        let nh = (heads - h0).min(if max_nv >= 4 { 3 } else { 4 });
        let mut c0 = 0;
        while c0 < nvec {
            let nv = vectors_per_pass(max_nv, nvec - c0);
            // SAFETY: forwarded contract.
            unsafe {
                let off = off + 16 * c0;
                let ln = lanes.map(|(r, c, p)| (r, c, p.wrapping_add(h0 * pstride)));
                let out = out.add(h0 * astride + 16 * c0);
                macro_rules! go {
                    ($($nh:literal, $nv:literal);*) => {
                        match (nh, nv) {
                            $(($nh, $nv) => lane_pair::<V, $nh, $nv>(off, &ln, pstride, step, out, astride),)*
                            _ => unreachable!("passes are 1..=4 heads × 1, 2 or 4 vectors"),
                        }
                    };
                }
                go!(1, 1; 2, 1; 3, 1; 4, 1; 1, 2; 2, 2; 3, 2; 4, 2; 1, 4; 2, 4; 3, 4);
            }
            c0 += nv;
        }
        h0 += nh;
    }
}

/// The decode scores of one block (16 positions, `head_dim` 64) for the heads sharing its keys,
/// where an instruction set has a kernel for it that keeps every partial sum in registers.
pub(super) trait DecodeScores: Lanes16 {
    /// Whether [`Self::block64`] is implemented.
    const FAST64: bool;
    /// `out(h)[j] = scale · (q_h · k_j)` in `ggml_vec_dot_f16`'s order for heads `h < g` (`q`:
    /// `[g, 64]` f16-rounded queries), `rows[j]`: position `j`'s f16 key row.
    unsafe fn block64(rows: &[*const u16; 16], q: *const f32, g: usize, scale: f32, out: impl Fn(usize) -> *mut f32);
}

impl DecodeScores for YmmPair {
    const FAST64: bool = false;
    unsafe fn block64(_: &[*const u16; 16], _: *const f32, _: usize, _: f32, _: impl Fn(usize) -> *mut f32) {
        unreachable!("FAST64 is false")
    }
}

impl DecodeScores for Zmm {
    const FAST64: bool = true;
    #[inline(always)]
    unsafe fn block64(rows: &[*const u16; 16], q: *const f32, g: usize, scale: f32, out: impl Fn(usize) -> *mut f32) {
        let mut h0 = 0;
        while h0 < g {
            let nh = (g - h0).min(3);
            let o = |h: usize| out(h0 + h);
            // SAFETY: forwarded contract.
            unsafe {
                let q = q.add(h0 * 64);
                match nh {
                    1 => block64_pass::<1>(rows, q, scale, o),
                    2 => block64_pass::<2>(rows, q, scale, o),
                    _ => block64_pass::<3>(rows, q, scale, o),
                }
            }
            h0 += nh;
        }
    }
}

/// [`DecodeScores::block64`] for `H` heads on AVX-512: each position's partial vector
/// `(a0 + a2) + (a1 + a3)` (`a_c = q_c·k_c`, exact; `a0 + a2` taken by one FMA, which rounds
/// the exact product plus `a2` once, as the add of the exact product does), then the four
/// levels of [`Lanes16::reduce_transposed`]'s tree (the same shuffles and adds on the same
/// operands, so the same bits), written as a tree of calls so that each level is taken as
/// soon as its two operands exist and few vectors are live (straight-line code after inlining).
#[inline(always)]
unsafe fn block64_pass<const H: usize>(
    rows: &[*const u16; 16],
    q: *const f32,
    scale: f32,
    out: impl Fn(usize) -> *mut f32,
) {
    use std::arch::x86_64::*;
    unsafe {
        let z = _mm512_setzero_ps();
        let mut qv = [[z; 4]; H];
        for (h, qh) in qv.iter_mut().enumerate() {
            for (c, qc) in qh.iter_mut().enumerate() {
                *qc = _mm512_loadu_ps(q.add(h * 64 + 16 * c));
            }
        }
        let (a, b) = (tree_w::<H>(rows, &qv, 0), tree_w::<H>(rows, &qv, 1));
        let idx = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
        let sc = _mm512_set1_ps(scale);
        for h in 0..H {
            let s = _mm512_add_ps(_mm512_shuffle_ps::<0x88>(a[h], b[h]), _mm512_shuffle_ps::<0xDD>(a[h], b[h]));
            _mm512_storeu_ps(out(h), _mm512_mul_ps(_mm512_permutexvar_ps(idx, s), sc));
        }
    }
}

/// Position `j`'s partial vector for each head (see [`block64_pass`]).
#[inline(always)]
unsafe fn tree_x<const H: usize>(
    rows: &[*const u16; 16],
    qv: &[[std::arch::x86_64::__m512; 4]; H],
    j: usize,
) -> [std::arch::x86_64::__m512; H] {
    use std::arch::x86_64::*;
    unsafe {
        let z = _mm512_setzero_ps();
        let row = rows[j];
        let mut k = [z; 4];
        for (c, kc) in k.iter_mut().enumerate() {
            *kc = _mm512_cvtph_ps(_mm256_loadu_si256(row.add(16 * c).cast()));
        }
        let mut x = [z; H];
        for (xh, q) in x.iter_mut().zip(qv) {
            let a2 = _mm512_fmadd_ps(q[2], k[2], z);
            let a3 = _mm512_fmadd_ps(q[3], k[3], z);
            *xh = _mm512_add_ps(_mm512_fmadd_ps(q[0], k[0], a2), _mm512_fmadd_ps(q[1], k[1], a3));
        }
        x
    }
}

/// Level 1 of the tree: positions `2k`, `2k + 1`.
#[inline(always)]
unsafe fn tree_y<const H: usize>(
    rows: &[*const u16; 16],
    qv: &[[std::arch::x86_64::__m512; 4]; H],
    k: usize,
) -> [std::arch::x86_64::__m512; H] {
    use std::arch::x86_64::*;
    unsafe {
        let (a, b) = (tree_x::<H>(rows, qv, 2 * k), tree_x::<H>(rows, qv, 2 * k + 1));
        let mut y = a;
        for h in 0..H {
            y[h] = _mm512_add_ps(_mm512_shuffle_f32x4::<0x44>(a[h], b[h]), _mm512_shuffle_f32x4::<0xEE>(a[h], b[h]));
        }
        y
    }
}

/// Level 2: positions `4m … 4m + 3`.
#[inline(always)]
unsafe fn tree_z<const H: usize>(
    rows: &[*const u16; 16],
    qv: &[[std::arch::x86_64::__m512; 4]; H],
    m: usize,
) -> [std::arch::x86_64::__m512; H] {
    use std::arch::x86_64::*;
    unsafe {
        let (a, b) = (tree_y::<H>(rows, qv, 2 * m), tree_y::<H>(rows, qv, 2 * m + 1));
        let mut z = a;
        for h in 0..H {
            z[h] = _mm512_add_ps(_mm512_shuffle_f32x4::<0x88>(a[h], b[h]), _mm512_shuffle_f32x4::<0xDD>(a[h], b[h]));
        }
        z
    }
}

/// Level 3: positions `8r … 8r + 7`.
#[inline(always)]
unsafe fn tree_w<const H: usize>(
    rows: &[*const u16; 16],
    qv: &[[std::arch::x86_64::__m512; 4]; H],
    r: usize,
) -> [std::arch::x86_64::__m512; H] {
    use std::arch::x86_64::*;
    unsafe {
        let (a, b) = (tree_z::<H>(rows, qv, 2 * r), tree_z::<H>(rows, qv, 2 * r + 1));
        let mut w = a;
        for h in 0..H {
            w[h] = _mm512_add_ps(_mm512_shuffle_ps::<0x44>(a[h], b[h]), _mm512_shuffle_ps::<0xEE>(a[h], b[h]));
        }
        w
    }
}
