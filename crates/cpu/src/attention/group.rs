//! One work item's query side: which keys each query token sees ([`QueryBounds`]), the query
//! rows of a (sequence, kv head) group prepared for the kernels (scaled, rotated), the online
//! softmax state they accumulate, and the final write of the output rows.
//!
//! Rows of a group are ordered `row = token * G + h` (`G = num_heads / num_kv_heads`, query
//! head `kv_head * G + h`), so the rows active on a key tile are one contiguous range.

use std::ops::Range;

use kvcache::LayerView;

use super::params::AttentionParams;
use super::queries::{int8_key_offset, int8_lane_floats, int8_queries, quantize_query};

/// Visibility of one sequence's query tokens (see the module docs of `attention`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QueryBounds {
    /// Keys in the cache (`context_len`).
    pub context: usize,
    pub q_len: usize,
    pub causal: bool,
    pub window: Option<usize>,
}

impl QueryBounds {
    pub fn of(p: &AttentionParams, seq: usize) -> QueryBounds {
        QueryBounds { context: p.context_lens[seq], q_len: p.q_len, causal: p.causal, window: p.sliding_window }
    }

    /// Keys `[lo, hi)` query token `i` sees. `lo` and `hi` never decrease with `i`.
    #[inline]
    pub fn keys_of(&self, i: usize) -> (usize, usize) {
        let pos = self.context - self.q_len + i;
        let hi = if self.causal { pos + 1 } else { self.context };
        let lo = match self.window {
            Some(w) => (pos + 1).saturating_sub(w),
            None => 0,
        };
        (lo, hi)
    }

    /// Keys any query token sees: `[lo of token 0, context)`; the only positions read.
    pub fn read_range(&self) -> std::ops::Range<usize> {
        self.keys_of(0).0..self.context
    }

    /// Query tokens `[i0, i1)` that see at least one key of `[t0, t1)`.
    #[inline]
    pub fn tokens_seeing(&self, t0: usize, t1: usize) -> (usize, usize) {
        // hi(i) > t0 holds on a suffix, lo(i) < t1 on a prefix (both monotone).
        let mut i0 = 0;
        while i0 < self.q_len && self.keys_of(i0).1 <= t0 {
            i0 += 1;
        }
        let mut i1 = self.q_len;
        while i1 > i0 && self.keys_of(i1 - 1).0 >= t1 {
            i1 -= 1;
        }
        (i0, i1)
    }
}

/// Copies the query rows of kv heads `heads` into `q` (`[heads.len(), q_len * G, head_dim]`),
/// multiplied by `scale`, rotated for rotated formats and rounded to int8 for integer-coded
/// keys ([`int8_queries`]); with `lanes` (`[heads.len(), q_len * G, int8_lane_floats(d)]`), also
/// lays the int8 rows out for the integer K·Q kernel.
pub(crate) fn prepare_queries(
    layer: &LayerView,
    p: &AttentionParams,
    seq: usize,
    heads: Range<usize>,
    q: &mut [f32],
    mut lanes: Option<&mut [f32]>,
) {
    let d = layer.head_dim;
    let g = p.num_heads / layer.num_kv_heads;
    let rows = p.q_len * g;
    debug_assert_eq!(q.len(), heads.len() * rows * d);
    let int8 = int8_queries(layer.format);
    debug_assert!(int8 || lanes.is_none());
    let offset = int8_key_offset(layer.format);
    for (hi, kv_head) in heads.enumerate() {
        for i in 0..p.q_len {
            for h in 0..g {
                let src = ((seq * p.q_len + i) * p.num_heads + kv_head * g + h) * d;
                let row = hi * rows + i * g + h;
                let dst = &mut q[row * d..(row + 1) * d];
                for (o, x) in dst.iter_mut().zip(&p.queries[src..src + d]) {
                    *o = x * p.scale;
                }
                if let Some(r) = layer.rotation {
                    r.apply(dst);
                }
                if int8 {
                    match lanes.as_deref_mut() {
                        Some(lanes) => {
                            let lf = int8_lane_floats(d);
                            let out = &mut lanes[row * lf..(row + 1) * lf];
                            // SAFETY: lanes exist only on the integer route (`simd::int8_keys`),
                            // which requires AVX-512F/BW/VL; `out` is one row's lanes.
                            #[cfg(target_arch = "x86_64")]
                            unsafe {
                                super::simd::int8::query_lanes(dst, offset, out)
                            };
                            #[cfg(not(target_arch = "x86_64"))]
                            unreachable!("int8 lanes on a CPU without the integer route: {}", out.len());
                        }
                        None => quantize_query(dst, None),
                    }
                }
            }
        }
    }
}

/// Most query rows (over all its kv heads) a task takes, so its queries and row states stay
/// in L1/L2 (64 rows of head_dim 128: 32 KiB each).
pub(crate) const MAX_TASK_ROWS: usize = 64;

/// How a task set splits the kv heads: tasks of `per` consecutive heads, `chunks` of them per
/// (sequence, partition) unit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct HeadChunks {
    pub per: usize,
    pub chunks: usize,
}

impl HeadChunks {
    /// As few chunks as keep a task within [`MAX_TASK_ROWS`] rows and give at least
    /// `min_tasks` tasks over `units` units (where the heads allow it): fewer chunks means
    /// more of each block read together.
    pub fn plan(num_kv_heads: usize, rows_per_head: usize, units: usize, min_tasks: usize) -> HeadChunks {
        let for_rows = (num_kv_heads * rows_per_head).div_ceil(MAX_TASK_ROWS);
        let for_tasks = min_tasks.div_ceil(units.max(1));
        let chunks = for_rows.max(for_tasks).clamp(1, num_kv_heads);
        let per = num_kv_heads.div_ceil(chunks);
        HeadChunks { per, chunks: num_kv_heads.div_ceil(per) }
    }

    /// The heads of chunk `i`.
    pub fn heads(&self, i: usize, num_kv_heads: usize) -> Range<usize> {
        i * self.per..num_kv_heads.min((i + 1) * self.per)
    }
}

/// Online-softmax state of `rows` query rows: running max, running sum, unnormalized output.
pub(crate) struct RowState<'a> {
    /// `[rows]`
    pub m: &'a mut [f32],
    /// `[rows]`
    pub l: &'a mut [f32],
    /// `[rows, head_dim]`
    pub acc: &'a mut [f32],
}

/// The row states of consecutive kv heads: one region of [`HeadStates::region`] floats per
/// head, `m [rows] | l [rows] | pad | acc [rows, d] | pad`, `acc` and every region starting on
/// a cache line (the partitioned path's partials have the same layout, so a task's heads are
/// one slice of them).
pub(crate) struct HeadStates<'a> {
    /// `[heads, region(rows, d)]`
    pub buf: &'a mut [f32],
    pub rows: usize,
    pub d: usize,
}

impl<'a> HeadStates<'a> {
    /// Offset of `acc` in a region.
    pub fn acc_offset(rows: usize) -> usize {
        (2 * rows).next_multiple_of(16)
    }

    /// Floats per head.
    pub fn region(rows: usize, d: usize) -> usize {
        Self::acc_offset(rows) + (rows * d).next_multiple_of(16)
    }

    /// `(m, l, acc)` of one region.
    pub fn parts(region: &[f32], rows: usize, d: usize) -> (&[f32], &[f32], &[f32]) {
        let at = Self::acc_offset(rows);
        (&region[..rows], &region[rows..2 * rows], &region[at..at + rows * d])
    }

    /// Running max -inf, sum 0, output 0 for every row.
    pub fn reset(&mut self) {
        let per = Self::region(self.rows, self.d);
        for region in self.buf.chunks_exact_mut(per) {
            region[..self.rows].fill(f32::NEG_INFINITY);
            region[self.rows..].fill(0.0);
        }
    }

    /// The state of head `i` (counted from the first head of the slice).
    pub fn head(&mut self, i: usize) -> RowState<'_> {
        let (rows, d) = (self.rows, self.d);
        let region = &mut self.buf[i * Self::region(rows, d)..(i + 1) * Self::region(rows, d)];
        let (ml, acc) = region.split_at_mut(Self::acc_offset(rows));
        let (m, l) = ml.split_at_mut(rows);
        RowState { m, l: &mut l[..rows], acc: &mut acc[..rows * d] }
    }
}

impl RowState<'_> {
    /// Folds the partial state of one range of keys — `region`, laid out as a [`HeadStates`]
    /// region — into this running state: `M = max(m, m_p)`, `l ← l·e^(m−M) + l_p·e^(m_p−M)`,
    /// `acc ← acc·e^(m−M) + acc_p·e^(m_p−M)`; rows the partial saw no key of are skipped.
    ///
    /// Both fast paths cut a sequence's keys into the same partitions (`partition_size`
    /// positions, aligned to absolute positions) and fold their partials in position order
    /// with this one function, so a row's result does not depend on which path the router
    /// picked — and so not on what the call was batched with. Folding into an empty state
    /// copies the partial exactly (`e^(−∞) = 0`, `e^0 = 1`).
    pub fn fold(&mut self, region: &[f32], rows: usize, d: usize) {
        let (pm, pl, pacc) = HeadStates::parts(region, rows, d);
        for row in 0..rows {
            if pl[row] == 0.0 {
                continue;
            }
            let big_m = self.m[row].max(pm[row]);
            let (a, b) = ((self.m[row] - big_m).exp(), (pm[row] - big_m).exp());
            self.l[row] = self.l[row] * a + pl[row] * b;
            let out = &mut self.acc[row * d..(row + 1) * d];
            for (o, p) in out.iter_mut().zip(&pacc[row * d..(row + 1) * d]) {
                *o = *o * a + p * b;
            }
            self.m[row] = big_m;
        }
    }
}

/// Writes `acc / l` (un-rotated) of every row to its place in `out`
/// (`[num_seqs, q_len, num_heads, head_dim]`, passed as a raw pointer because work items of
/// one call write disjoint rows of it concurrently).
///
/// # Safety
/// `out` must point to the call's output buffer, valid for writes of its full length, and no
/// other thread may write this (seq, kv_head) group's rows meanwhile.
pub(crate) unsafe fn write_output(
    layer: &LayerView,
    p: &AttentionParams,
    seq: usize,
    kv_head: usize,
    l: &[f32],
    acc: &mut [f32],
    out: *mut f32,
) {
    let d = layer.head_dim;
    let g = p.num_heads / layer.num_kv_heads;
    for i in 0..p.q_len {
        for h in 0..g {
            let row = i * g + h;
            let o = &mut acc[row * d..(row + 1) * d];
            // Every query sees at least its own key (validated), so l > 0.
            debug_assert!(l[row] > 0.0, "row {row} saw no key");
            let inv = 1.0 / l[row];
            for v in o.iter_mut() {
                *v *= inv;
            }
            if let Some(r) = layer.rotation {
                r.apply_inverse(o);
            }
            let dst = ((seq * p.q_len + i) * p.num_heads + kv_head * g + h) * d;
            // SAFETY: dst + d ≤ out's length (validated shapes); rows are disjoint per group.
            unsafe { std::ptr::copy_nonoverlapping(o.as_ptr(), out.add(dst), d) };
        }
    }
}
