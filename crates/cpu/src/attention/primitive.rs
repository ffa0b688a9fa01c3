//! The primitive path: one pass over each sequence's visible pages, tile by tile. A task is a
//! (sequence, run of kv heads): for each tile it serves every query row of each of its heads
//! (`q_len × num_heads / num_kv_heads` rows per head) with dequantization fused into the dot
//! products and an online softmax, then writes its output rows. Heads are split only as far
//! as needed to give every thread work ([`HeadChunks::plan`]), so blocks are read whole.

use kvcache::LayerView;

use super::group::{prepare_queries, write_output, HeadChunks, QueryBounds};
use super::isa::KernelIsa;
use super::params::AttentionParams;
use super::workspace::{SyncPtr, Workspace};
use crate::threadpool::ThreadPool;

/// Tasks per thread the primitive path aims for: one, since splitting a sequence's heads
/// further costs more in memory locality than it gains in balance (1×32768 f16: 4 tasks of 2
/// heads 55-65 cpu-ns per token and head, 2 tasks of 4 heads below; the router sends such
/// shapes to the partitioned path anyway).
const TASKS_PER_THREAD: usize = 1;

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
        use super::simd::{attend_range, int8_keys};
        use super::tile::RangeInput;
        let (d, hkv) = (layer.head_dim, layer.num_kv_heads);
        let group = p.num_heads / hkv;
        let rows = p.q_len * group;
        let chunks = HeadChunks::plan(hkv, rows, p.num_seqs, TASKS_PER_THREAD * pool.n_threads());
        let int8 = int8_keys(isa, layer);
        ws.prepare(pool.n_threads(), chunks.per, rows, d);
        let ws = &*ws;
        let out = SyncPtr::new(out.as_mut_ptr());
        pool.run(p.num_seqs * chunks.chunks, |task, thread| {
            let (seq, chunk) = (task / chunks.chunks, task % chunks.chunks);
            let heads = chunks.heads(chunk, hkv);
            // SAFETY: one task per thread index at a time; the reference dies with the task.
            let scratch = unsafe { ws.thread(thread) };
            let (q, lanes, mut states, mut tile) = scratch.split(heads.len(), rows, d);
            let mut lanes = int8.then_some(lanes);
            prepare_queries(layer, p, seq, heads.clone(), q, lanes.as_deref_mut());
            states.reset();
            let bounds = QueryBounds::of(p, seq);
            let table = p.block_tables[seq];
            let inp =
                RangeInput { layer, heads: heads.clone(), table, bounds, group, q, lanes: lanes.as_deref(), origin: 0 };
            let range = bounds.read_range();
            // SAFETY: the caller checked the CPU and validated shapes and the block table over
            // the read range; buffers come from `split` with the documented sizes. Each task
            // writes only its own (seq, kv head) output rows.
            unsafe {
                attend_range(isa, &inp, range.start, range.end, &mut states, &mut tile);
                for (hi, kv_head) in heads.enumerate() {
                    let state = states.head(hi);
                    write_output(layer, p, seq, kv_head, state.l, state.acc, out.get());
                }
            }
        });
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = (isa, pool, ws);
        super::reference::attention(layer, p, out);
    }
}
