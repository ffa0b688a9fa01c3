//! The fast form of ggml-numerics attention (its scalar reference is `../reference.rs`):
//! the same rounding, step for step and bit for bit, vectorized (AVX-512 or AVX2, chosen at
//! run time) and threaded. The scalar `ggml::attention` stays the reference; the tests compare
//! the two on every shape they serve, bit patterns and all.
//!
//! Order of every sum is fixed by ggml (see `ggml`'s module docs); what this module chooses is
//! only how the work is cut, and no cut splits a sum:
//!
//! - **Whole** (prefill, and decode when there are enough (sequence, kv head) units): one task
//!   per (sequence, kv head, run of up to [`MAX_TASK_TOKENS`] query tokens) computes its rows'
//!   scores block by block (16 positions aligned to absolute positions; each block's keys are
//!   staged once for every row that sees it), their softmax, then `V·p` with the value rows
//!   listed lane-major once for the run, and writes the rows.
//! - **Shares** (decode, fewer units than the threads can share evenly, at least
//!   [`SPLIT_MIN_POSITIONS`] positions): one parallel region per call ([`decode`]); the
//!   16-position blocks are dealt to 2 or 4 shares so that each share owns whole `V·p` lanes,
//!   and four phases (scores, `expf`, probabilities and `V·p`, fold) run with one item per share,
//!   claimed by whichever thread comes first.
//!
//! A Whole decode row of at least [`POSITION_ORDER_MIN`] positions takes `V·p` in position order
//! ([`values_positions`]: lane accumulators in L1, pages read front to back, rows prefetched)
//! instead of lane by lane (accumulators in registers, every 64th row): same sums, same bits.
//!
//! The decode order (`ggml_vec_dot_f16`, 64 lanes) serves a sequence whose `q_len` is 1, the
//! tinyBLAS order (16 lanes) one with several query tokens: per sequence, so a sequence's result
//! does not depend on what it is batched with.
//!
//! Only f16 caches with `head_dim % 16 == 0` (≤ [`MAX_FAST_HEAD_DIM`]) are served here (the
//! caller falls back to the scalar kernel otherwise).

mod call;
mod decode;
mod kernels;
mod lanes;

use std::cell::UnsafeCell;

use kvcache::LayerView;

use self::call::{block_keys, prepare_queries, row, score_block, Call, Plan};
use self::kernels::{fold_lanes, lane_passes, list_rows, position_pass, softmax_row};
use self::lanes::{Lanes16, YmmPair, Zmm};
use crate::attention::group::QueryBounds;
use crate::attention::isa::{KernelIsa, MAX_FAST_HEAD_DIM};
use crate::attention::params::AttentionParams;
use crate::attention::workspace::{AlignedF32, SyncPtr};
use crate::threadpool::ThreadPool;

/// Tasks per thread a call is cut into at least, where it can be.
const TASKS_PER_THREAD: usize = 2;
/// Query tokens per task at most (a task's scores are `tokens × group × positions` floats).
const MAX_TASK_TOKENS: usize = 16;
/// A decode row is split over threads only from this many positions read (measured: at 128
/// and 192 positions a split call and a whole one cost about the same on 2 threads).
const SPLIT_MIN_POSITIONS: usize = 64;
/// A decode row's `V·p` walks positions in order (see [`values_positions`]) from this many
/// positions; shorter rows take the lane passes (accumulators in registers).
const POSITION_ORDER_MIN: usize = 512;
/// Floats of lane accumulators a position-order pass keeps (24 KB: inside a 32 KB L1d).
const POSITION_ACC_FLOATS: usize = 6144;

/// Whether this module serves `layer` (the caller checked format and steps).
pub(crate) fn serves(layer: &LayerView) -> bool {
    serves_head_dim(layer.head_dim)
}

/// Whether this module serves heads of `head_dim`.
pub(crate) fn serves_head_dim(head_dim: usize) -> bool {
    head_dim.is_multiple_of(16) && head_dim <= MAX_FAST_HEAD_DIM
}

/// Buffers of one pool thread.
#[derive(Default)]
struct Scratch {
    /// `[rows, head_dim]` f16-rounded queries of the task's rows.
    q: AlignedF32,
    /// `[16, head_dim]` one block's keys (staged f32).
    kf: AlignedF32,
    /// `[group, 16, 16]` one block's partial vectors (see `block_partials`).
    xs: AlignedF32,
    /// `[rows, stride]` scores, then probabilities, from the task's first block.
    sc: AlignedF32,
    /// `[lanes, group, dims]` lane accumulators of one query token.
    lanes: AlignedF32,
    /// `[lanes, positions / lanes]` addresses of the value rows, lane-major.
    rows: Vec<usize>,
}

struct Slot(UnsafeCell<Scratch>);

// SAFETY: a slot is reached only through `GgmlWorkspace::thread`, whose contract gives each
// concurrently running task a distinct thread index.
unsafe impl Sync for Slot {}

/// Buffers reused across calls (the decode step allocates nothing once they have grown).
#[derive(Default)]
pub(crate) struct GgmlWorkspace {
    threads: Vec<Slot>,
    /// The split decode's buffers.
    decode: decode::DecodeWorkspace,
}

impl GgmlWorkspace {
    fn prepare(&mut self, n_threads: usize, rows: usize, d: usize, stride: usize, lanes: usize, group: usize) {
        while self.threads.len() < n_threads {
            self.threads.push(Slot(UnsafeCell::new(Scratch::default())));
        }
        for slot in &mut self.threads {
            let s = slot.0.get_mut();
            s.q.ensure(rows * d);
            s.kf.ensure(16 * d);
            s.xs.ensure(group * 256);
            s.sc.ensure(rows * stride);
            s.lanes.ensure(lanes * group * d);
            if s.rows.len() < stride + 2 * lanes {
                s.rows.resize(stride + 2 * lanes, 0);
            }
        }
    }

    /// # Safety
    /// No other live reference to this thread's scratch (one task per thread index at a time;
    /// the reference dies with the task).
    #[allow(clippy::mut_from_ref)]
    unsafe fn thread(&self, thread: usize) -> &mut Scratch {
        // SAFETY: per the contract, this is the only reference to the slot.
        unsafe { &mut *self.threads[thread].0.get() }
    }
}

/// How a call of `p` over `hkv` kv heads on `threads` threads reading up to `max_read`
/// positions per sequence is cut.
fn plan(p: &AttentionParams, hkv: usize, threads: usize, max_read: usize) -> Plan {
    let units = p.num_seqs * hkv;
    let want = (TASKS_PER_THREAD * threads).div_ceil(units);
    if p.q_len == 1 && threads > 1 && units < 2 * TASKS_PER_THREAD * threads && max_read >= SPLIT_MIN_POSITIONS {
        return Plan::Shares { shares: decode::shares_for(threads, max_read) };
    }
    let runs = want.clamp(p.q_len.div_ceil(MAX_TASK_TOKENS), p.q_len);
    let tokens = p.q_len.div_ceil(runs);
    Plan::Whole { runs: p.q_len.div_ceil(tokens), tokens }
}

/// `out` (`[num_seqs, q_len, num_heads, head_dim]`) ← ggml-numerics attention of `p` over the
/// f16 `layer`, on `isa` (available on this CPU); shapes and blocks validated, [`serves`] true.
/// Returns the partitions (sequence, kv head, share) when decode rows were split over threads,
/// `None` when every task took whole rows.
pub(crate) fn attention(
    isa: KernelIsa,
    layer: &LayerView,
    p: &AttentionParams,
    pool: &ThreadPool,
    ws: &mut GgmlWorkspace,
    out: &mut [f32],
) -> Option<usize> {
    let (d, hkv) = (layer.head_dim, layer.num_kv_heads);
    let group = p.num_heads / hkv;
    let max_read = (0..p.num_seqs).map(|s| QueryBounds::of(p, s).read_range().len()).max().unwrap_or(0);
    let threads = pool.n_threads();
    let plan = plan(p, hkv, threads, max_read);
    let vec_dot = p.q_len == 1;
    let lanes = if vec_dot { 64 } else { 16 };
    let call = Call { layer, p, d, group, vec_dot, lanes, plan, out: SyncPtr::new(out.as_mut_ptr()) };
    let units = p.num_seqs * hkv;
    match plan {
        Plan::Whole { runs, tokens } => {
            // Blocks start up to 15 positions before a range and end up to 15 after it.
            let stride = (max_read + 32).next_multiple_of(16);
            ws.prepare(threads, tokens * group, d, stride, lanes, group);
            let ws = &*ws;
            pool.run(units * runs, |task, thread| {
                // SAFETY: one task per thread index at a time; the reference dies with the task.
                let scratch = unsafe { ws.thread(thread) };
                // SAFETY: `isa` is available (caller); shapes and blocks validated; scratch
                // sized by `prepare`; tasks write disjoint rows.
                unsafe { run_task(isa, &call, task, scratch) };
            });
            None
        }
        Plan::Shares { shares } => {
            let dec = decode::Decode::new(&call, shares, max_read, &mut ws.decode);
            pool.run(shares.min(threads), |task, _thread| {
                dec.run_phases(task, |phase, share| {
                    // SAFETY: `isa` is available (caller); shapes and blocks validated; the
                    // phases run in order, one item per share (`run_phases`).
                    unsafe { run_decode_item(isa, &dec, phase, share) }
                })
            });
            Some(units * shares)
        }
    }
}

/// Runs one task of a [`Plan::Whole`] call with `isa`'s kernels.
///
/// # Safety
/// As [`run_whole`], with `isa` available on this CPU.
unsafe fn run_task(isa: KernelIsa, c: &Call, task: usize, s: &mut Scratch) {
    // SAFETY: forwarded contract.
    unsafe {
        match isa {
            KernelIsa::Avx512 => task_avx512(c, task, s),
            KernelIsa::Avx2 => task_avx2(c, task, s),
        }
    }
}

#[target_feature(enable = "avx512f,avx512vl,avx2,fma,f16c")]
unsafe fn task_avx512(c: &Call, task: usize, s: &mut Scratch) {
    // SAFETY: forwarded contract; AVX-512 enabled here. 4 vectors per pass: 4 heads × 4
    // vectors of accumulators and 4 of values fit the 32 registers.
    unsafe { run_whole::<Zmm>(c, task, s, 4) }
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn task_avx2(c: &Call, task: usize, s: &mut Scratch) {
    // SAFETY: forwarded contract; AVX2 enabled here. One 16-lane vector (2 registers) per
    // pass: 4 heads' accumulators and the values take 10 of the 16 registers.
    unsafe { run_whole::<YmmPair>(c, task, s, 1) }
}

/// Runs item (`phase`, `share`) of a [`Plan::Shares`] call with `isa`'s kernels.
///
/// # Safety
/// As [`decode::item`], with `isa` available on this CPU.
unsafe fn run_decode_item(isa: KernelIsa, dec: &decode::Decode, phase: usize, share: usize) {
    // SAFETY: forwarded contract.
    unsafe {
        match isa {
            KernelIsa::Avx512 => decode_avx512(dec, phase, share),
            KernelIsa::Avx2 => decode_avx2(dec, phase, share),
        }
    }
}

/// One `#[target_feature]` function per ISA and phase (so profiles tell the phases apart), and
/// the ISA's dispatcher `$dispatch(dec, phase, share)` over them, phases in [`decode`]'s order.
macro_rules! decode_phases {
    ($dispatch:ident, $features:literal, $v:ty, $max_nv:literal,
     [$scores:ident, $exponentials:ident, $values:ident, $fold:ident]) => {
        decode_phases!(@phase $features, $v, $max_nv, $scores => decode::scores);
        decode_phases!(@phase $features, $v, $max_nv, $exponentials => decode::exponentials);
        decode_phases!(@phase $features, $v, $max_nv, $values => decode::values::values);
        decode_phases!(@phase $features, $v, $max_nv, $fold => decode::values::fold);

        unsafe fn $dispatch(dec: &decode::Decode, phase: usize, share: usize) {
            // SAFETY: forwarded contract.
            unsafe {
                match phase {
                    0 => $scores(dec, share),
                    1 => $exponentials(dec, share),
                    2 => $values(dec, share),
                    _ => $fold(dec, share),
                }
            }
        }
    };
    (@phase $features:literal, $v:ty, $max_nv:literal, $name:ident => $($phase:ident)::+) => {
        #[target_feature(enable = $features)]
        unsafe fn $name(dec: &decode::Decode, share: usize) {
            // SAFETY: forwarded contract; the ISA enabled here (register budget as the
            // whole tasks').
            unsafe { $($phase)::+::<$v>(dec, share, $max_nv) }
        }
    };
}

decode_phases!(
    decode_avx512,
    "avx512f,avx512vl,avx2,fma,f16c",
    Zmm,
    4,
    [scores_avx512, exponentials_avx512, values_avx512, fold_avx512]
);
decode_phases!(decode_avx2, "avx2,fma,f16c", YmmPair, 1, [scores_avx2, exponentials_avx2, values_avx2, fold_avx2]);

/// Task `task` of a [`Plan::Whole`] call.
///
/// # Safety
/// `check` passed for the call; the scratch was prepared for it; the ISA of `V` is enabled;
/// no other task writes this task's rows.
#[inline(always)]
unsafe fn run_whole<V: Lanes16>(c: &Call, task: usize, s: &mut Scratch, max_nv: usize) {
    let hkv = c.layer.num_kv_heads;
    let Plan::Whole { runs, tokens } = c.plan else { unreachable!("whole tasks run only under their plan") };
    let (unit, run) = (task / runs, task % runs);
    let i0 = run * tokens;
    // SAFETY: forwarded contract.
    unsafe { whole::<V>(c, unit / hkv, unit % hkv, i0, (i0 + tokens).min(c.p.q_len), s, max_nv) };
}

/// Whole: query tokens `i0..i1` of (`seq`, `kv_head`), every step.
#[inline(always)]
unsafe fn whole<V: Lanes16>(
    c: &Call,
    seq: usize,
    kv_head: usize,
    i0: usize,
    i1: usize,
    s: &mut Scratch,
    max_nv: usize,
) {
    let (d, g) = (c.d, c.group);
    let bounds = QueryBounds::of(c.p, seq);
    let (u0, u1) = (bounds.keys_of(i0).0, bounds.keys_of(i1 - 1).1);
    let base = u0 & !15;
    let stride = (u1 - base).next_multiple_of(16);
    let (q, kf, xs, sc) = (s.q.as_mut_ptr(), s.kf.as_mut_ptr(), s.xs.as_mut_ptr(), s.sc.as_mut_ptr());
    // Several tokens share each block's keys: stage them once as f32.
    let staged = i1 - i0 > 1;
    // SAFETY (whole body): buffers sized by `prepare` for `tokens × group` rows of `stride`
    // (≤ the call's stride) floats; rows of `out` belong to this task.
    unsafe {
        prepare_queries::<V>(c, seq, kv_head, i0, i1, q);
        for b in 0..stride / 16 {
            let t0 = base + 16 * b;
            let keys = block_keys::<V>(c, seq, kv_head, t0, u0, u1, staged, kf);
            for i in i0..i1 {
                let (lo, hi) = bounds.keys_of(i);
                if hi <= t0 || lo >= t0 + 16 {
                    continue;
                }
                let r0 = (i - i0) * g;
                let dst = |h: usize| sc.add((r0 + h) * stride + 16 * b);
                score_block::<V>(c, &keys, staged, q.add(r0 * d), xs, t0, lo, hi, dst);
            }
        }
        for i in i0..i1 {
            let (lo, hi) = bounds.keys_of(i);
            let (b0, b1) = ((lo - base) / 16, (hi - base).div_ceil(16));
            for h in 0..g {
                let row = sc.add(((i - i0) * g + h) * stride + 16 * b0);
                softmax_row::<V>(row, row, b1 - b0);
            }
        }
        let s0 = u0 - u0 % c.lanes;
        let ns = (u1 - s0).div_ceil(c.lanes);
        let (layer, table) = (c.layer, c.p.block_tables[seq]);
        let vrow = |t: usize| row(&layer.values, table, layer.block_size, kv_head, t);
        if c.vec_dot && u1 - u0 >= POSITION_ORDER_MIN {
            // q_len 1: one token, keys u0..u1.
            list_rows(vrow, u0, u1, u0, 1, u1 - u0, s.rows.as_mut_ptr());
            let out = |h: usize| c.out.get().add(((seq * c.p.q_len + i0) * c.p.num_heads + kv_head * g + h) * d);
            values_positions::<V>(c, u0, u1, 0, d, s, sc.add(u0 - base), stride, out);
            return;
        }
        list_rows(vrow, u0, u1, s0, c.lanes, ns, s.rows.as_mut_ptr());
        for i in i0..i1 {
            let (lo, hi) = bounds.keys_of(i);
            let probs = |h: usize| sc.add(((i - i0) * g + h) * stride).cast_const();
            let out = |h: usize| c.out.get().add(((seq * c.p.q_len + i) * c.p.num_heads + kv_head * g + h) * d);
            values_row::<V>(c, lo, hi, base, s0, ns, 0, d, s, probs, out, max_nv);
        }
    }
}

/// `V·p` of one query token (keys `lo..hi`) over the dimensions `d0..d1` of the listed rows: lane passes
/// into `s.lanes`, then the fold into `out(h) + d0` for each head `h` of the group. `probs(h)`
/// is head `h`'s probability row from position `base`.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn values_row<V: Lanes16>(
    c: &Call,
    lo: usize,
    hi: usize,
    base: usize,
    s0: usize,
    ns: usize,
    d0: usize,
    d1: usize,
    s: &mut Scratch,
    probs: impl Fn(usize) -> *const f32,
    out: impl Fn(usize) -> *mut f32,
    max_nv: usize,
) {
    let (g, nl, dc) = (c.group, c.lanes, d1 - d0);
    let acc = s.lanes.as_mut_ptr();
    let list = s.rows.as_ptr();
    // SAFETY: `acc` holds `[lanes, group, dc]`; staged rows and probabilities cover `lo..hi`.
    unsafe {
        for h0 in (0..g).step_by(4) {
            let nh = (g - h0).min(4);
            for l in 0..nl {
                let first = lo + (l + nl - lo % nl) % nl;
                let mut dst = [std::ptr::null_mut::<f32>(); 4];
                for (k, d) in dst.iter_mut().enumerate().take(nh) {
                    *d = acc.add((l * g + h0 + k) * dc);
                }
                if first >= hi {
                    // A lane no position reaches stays 0, as the reference's.
                    for &d in &dst[..nh] {
                        std::ptr::write_bytes(d, 0, dc);
                    }
                    continue;
                }
                let count = (hi - first).div_ceil(nl);
                let mut pp = [std::ptr::null::<f32>(); 4];
                for (k, p) in pp.iter_mut().enumerate().take(nh) {
                    *p = probs(h0 + k).add(first - base);
                }
                let v = list.add(l * ns + (first - s0) / nl);
                lane_passes::<V>(max_nv, nh, v, d0, dc, count, &pp, nl, &dst);
            }
        }
        for h in 0..g {
            fold_lanes::<V>(acc.add(h * dc), g * dc, nl, dc / 16, out(h).add(d0));
        }
    }
}

/// `V·p` of one decode token (64 lanes, keys `lo..hi`, value rows listed in position order in
/// `s.rows`) over the dimensions `d0..d1`, in chunks of 32 dimensions where their
/// `[64, group, 32]` lane accumulators fit [`POSITION_ACC_FLOATS`] (group ≤ 3), else of 16 (L1
/// still holds them up to group 8): [`position_pass`] over the positions, then the fold
/// into `out(h) + chunk start` for each head `h`. `probs + h · pstride`: head `h`'s probability
/// at `lo`.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn values_positions<V: Lanes16>(
    c: &Call,
    lo: usize,
    hi: usize,
    d0: usize,
    d1: usize,
    s: &mut Scratch,
    probs: *const f32,
    pstride: usize,
    out: impl Fn(usize) -> *mut f32,
) {
    debug_assert!(c.vec_dot && c.lanes == 64);
    let g = c.group;
    let nv = if 64 * g * 32 <= POSITION_ACC_FLOATS { 2 } else { 1 };
    let acc = s.lanes.as_mut_ptr();
    let list = s.rows.as_ptr();
    let mut col = d0;
    // SAFETY: `acc` holds `[64, group, head_dim]` ≥ `[64, group, 16·n]` floats; the list and
    // the probabilities cover `lo..hi`; `out(h)` rows of head_dim floats belong to this task.
    unsafe {
        while col < d1 {
            let n = if nv == 2 && col + 32 <= d1 { 2 } else { 1 };
            std::ptr::write_bytes(acc, 0, 64 * g * 16 * n);
            if n == 2 {
                position_pass::<V, 2>(list, col, hi - lo, lo, probs, pstride, g, acc);
            } else {
                position_pass::<V, 1>(list, col, hi - lo, lo, probs, pstride, g, acc);
            }
            for h in 0..g {
                fold_lanes::<V>(acc.add(h * 16 * n), g * 16 * n, 64, n, out(h).add(col));
            }
            col += 16 * n;
        }
    }
}
