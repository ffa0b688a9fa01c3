//! One work item's query side: which keys each query token sees ([`QueryBounds`]), the query
//! rows of a (sequence, kv head) group prepared for the kernels (scaled, rotated), the online
//! softmax state they accumulate, and the final write of the output rows.
//!
//! Rows of a group are ordered `row = token * G + h` (`G = num_heads / num_kv_heads`, query
//! head `kv_head * G + h`), so the rows active on a key tile are one contiguous range.

use kvcache::LayerView;

use super::AttentionParams;

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

/// Copies the group's query rows into `q` (`[q_len * G, head_dim]`), multiplied by `scale`
/// and rotated for rotated formats.
pub(crate) fn prepare_queries(layer: &LayerView, p: &AttentionParams, seq: usize, kv_head: usize, q: &mut [f32]) {
    let d = layer.head_dim;
    let g = p.num_heads / layer.num_kv_heads;
    debug_assert_eq!(q.len(), p.q_len * g * d);
    for i in 0..p.q_len {
        for h in 0..g {
            let src = ((seq * p.q_len + i) * p.num_heads + kv_head * g + h) * d;
            let dst = &mut q[(i * g + h) * d..(i * g + h + 1) * d];
            for (o, x) in dst.iter_mut().zip(&p.queries[src..src + d]) {
                *o = x * p.scale;
            }
            if let Some(r) = layer.rotation {
                r.apply(dst);
            }
        }
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

impl RowState<'_> {
    pub fn reset(&mut self) {
        self.m.fill(f32::NEG_INFINITY);
        self.l.fill(0.0);
        self.acc.fill(0.0);
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
