//! The primitive path: one pass over each sequence's visible pages, tile by tile. A task is a
//! (sequence, run of kv heads): for each tile it serves every query row of each of its heads
//! (`q_len × num_heads / num_kv_heads` rows per head) with dequantization fused into the dot
//! products and an online softmax, then writes its output rows. Heads are split only as far
//! as needed to give every thread work ([`HeadChunks::plan`]), so blocks are read whole. A
//! context longer than one partition (`partition_size`) is summed partition by partition and
//! the partials folded as the partitioned path folds them: the two paths give the same bits.

use kvcache::LayerView;

use super::group::{prepare_queries, write_output, HeadChunks, HeadStates, QueryBounds};
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
    partition_size: usize,
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
        let psize = partition_size.max(1);
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
            let (q, lanes, mut states, mut partial, mut tile) = scratch.split(heads.len(), rows, d);
            let mut lanes = int8.then_some(lanes);
            prepare_queries(layer, p, seq, heads.clone(), q, lanes.as_deref_mut());
            states.reset();
            let bounds = QueryBounds::of(p, seq);
            let table = p.block_tables[seq];
            let lanes = lanes.as_deref();
            let range = bounds.read_range();
            // The partitioned path's partitions, each from a fresh state folded in order (see
            // `RowState::fold`); a range inside one partition accumulates straight into the
            // row states, which folding into an empty state would only copy.
            let (first, last) = (range.start / psize, range.end.div_ceil(psize));
            // SAFETY: the caller checked the CPU and validated shapes and the block table over
            // the read range; buffers come from `split` with the documented sizes. Each task
            // writes only its own (seq, kv head) output rows.
            unsafe {
                for part in first..last {
                    let origin = part * psize;
                    let (start, end) = (origin.max(range.start), (origin + psize).min(range.end));
                    let inp = RangeInput { layer, heads: heads.clone(), table, bounds, group, q, lanes, origin };
                    if last - first == 1 {
                        attend_range(isa, &inp, start, end, &mut states, &mut tile);
                    } else {
                        partial.reset();
                        attend_range(isa, &inp, start, end, &mut partial, &mut tile);
                        let per = HeadStates::region(rows, d);
                        for hi in 0..heads.len() {
                            states.head(hi).fold(&partial.buf[hi * per..(hi + 1) * per], rows, d);
                        }
                    }
                }
                for (hi, kv_head) in heads.enumerate() {
                    let state = states.head(hi);
                    write_output(layer, p, seq, kv_head, state.l, state.acc, out.get());
                }
            }
        });
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = (partition_size, isa, pool, ws);
        super::reference::attention(layer, p, out);
    }
}
