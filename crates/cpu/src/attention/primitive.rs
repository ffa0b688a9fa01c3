//! The primitive path: one task per (sequence, kv head). The task reads the visible pages of
//! its kv head once, tile by tile, and serves every query row of the group from each tile
//! (`q_len × num_heads / num_kv_heads` rows), with dequantization fused into the dot products
//! and an online softmax; then it writes its output rows. Tasks spread over the pool's threads.

use kvcache::LayerView;

use super::group::{prepare_queries, write_output, QueryBounds};
use super::workspace::{SyncPtr, Workspace};
use super::{AttentionParams, KernelIsa};
use crate::threadpool::ThreadPool;

/// `out` (`[num_seqs, q_len, num_heads, head_dim]`) ← attention of `p` over `layer`.
/// Shapes and block tables validated; the CPU runs `isa` (checked by the caller).
pub(crate) fn attention(
    layer: &LayerView,
    p: &AttentionParams,
    isa: KernelIsa,
    pool: &ThreadPool,
    ws: &mut Workspace,
    out: &mut [f32],
) {
    #[cfg(target_arch = "x86_64")]
    {
        use super::tile::{attend_range, RangeInput};
        let (d, hkv) = (layer.head_dim, layer.num_kv_heads);
        let group = p.num_heads / hkv;
        let rows = p.q_len * group;
        ws.prepare(pool.n_threads(), rows, d);
        let ws = &*ws;
        let out = SyncPtr::new(out.as_mut_ptr());
        pool.run(p.num_seqs * hkv, |task, thread| {
            let (seq, kv_head) = (task / hkv, task % hkv);
            // SAFETY: one task per thread index at a time; the reference dies with the task.
            let scratch = unsafe { ws.thread(thread) };
            let (q, mut state, mut tile) = scratch.split(rows, d);
            prepare_queries(layer, p, seq, kv_head, q);
            state.reset();
            let bounds = QueryBounds::of(p, seq);
            let inp = RangeInput { layer, kv_head, table: p.block_tables[seq], bounds, group, q };
            let range = bounds.read_range();
            // SAFETY: the caller checked the CPU and validated shapes and the block table over
            // the read range; buffers come from `split` with the documented sizes. Each task
            // writes only its own (seq, kv_head) output rows.
            unsafe {
                attend_range(isa, &inp, range.start, range.end, &mut state, &mut tile);
                write_output(layer, p, seq, kv_head, state.l, state.acc, out.get());
            }
        });
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = (isa, pool, ws);
        super::reference::attention(layer, p, out);
    }
}
