//! The partitioned path (split-K, "flash decoding"): each sequence's read range is cut at
//! multiples of `partition_size` positions; one task per (sequence, partition, run of kv heads)
//! runs the same tile kernels as the primitive path over its partition and leaves a partial
//! state `(m, l, acc)` per query row; a second parallel step merges the partials of each
//! (sequence, kv head) exactly, folding them in position order ([`RowState::fold`]) — the
//! fold the primitive path applies to the same partitions, so both give the same bits.
//! It keeps every thread busy when sequences × kv heads are fewer than the threads. Heads are
//! split only when partitions alone do not give every thread work ([`HeadChunks::plan`]).

use kvcache::LayerView;

#[cfg(doc)]
use super::group::RowState;
use super::group::{prepare_queries, write_output, HeadChunks, HeadStates, QueryBounds};
use super::isa::KernelIsa;
use super::params::AttentionParams;
use super::workspace::{SyncPtr, Workspace};
use crate::threadpool::ThreadPool;

/// Tasks per thread the partitioned path aims for at least.
const TASKS_PER_THREAD: usize = 4;

/// `out` (`[num_seqs, q_len, num_heads, head_dim]`) ← attention of `p` over `layer`;
/// returns the number of partitions processed per kv head, summed over the kv heads. Shapes
/// and block tables validated; the CPU runs `isa` (checked by the caller).
pub(crate) fn attention(
    layer: &LayerView,
    p: &AttentionParams,
    partition_size: usize,
    isa: KernelIsa,
    pool: &ThreadPool,
    ws: &mut Workspace,
    out: &mut [f32],
) -> usize {
    let psize = partition_size.max(1);
    let (d, hkv) = (layer.head_dim, layer.num_kv_heads);
    let group = p.num_heads / hkv;
    let rows = p.q_len * group;
    let per_head = HeadStates::region(rows, d);

    ws.seq_first_part.clear();
    let mut parts = 0;
    for seq in 0..p.num_seqs {
        let r = QueryBounds::of(p, seq).read_range();
        ws.seq_first_part.push(parts);
        parts += r.end.div_ceil(psize) - r.start / psize;
    }
    ws.seq_first_part.push(parts);
    let chunks = HeadChunks::plan(hkv, rows, parts, TASKS_PER_THREAD * pool.n_threads());
    ws.partials.ensure(parts * hkv * per_head);
    ws.prepare(pool.n_threads(), chunks.per, rows, d);
    let partials = SyncPtr::new(ws.partials.as_mut_ptr());
    #[cfg(target_arch = "x86_64")]
    let int8 = super::simd::int8_keys(isa, layer);
    let ws = &*ws;

    #[cfg(target_arch = "x86_64")]
    pool.run(parts * chunks.chunks, |task, thread| {
        use super::simd::attend_range;
        use super::tile::RangeInput;
        let (part, chunk) = (task / chunks.chunks, task % chunks.chunks);
        let seq = ws.seq_first_part.partition_point(|&first| first <= part) - 1;
        let j = part - ws.seq_first_part[seq];
        let heads = chunks.heads(chunk, hkv);
        let bounds = QueryBounds::of(p, seq);
        let range = bounds.read_range();
        let first = (range.start / psize + j) * psize;
        let (start, end) = (first.max(range.start), (first + psize).min(range.end));
        // SAFETY: one task per thread index at a time; the reference dies with the task.
        let scratch = unsafe { ws.thread(thread) };
        let (q, lanes, _, _, mut tile) = scratch.split(heads.len(), rows, d);
        let mut lanes = int8.then_some(lanes);
        prepare_queries(layer, p, seq, heads.clone(), q, lanes.as_deref_mut());
        // SAFETY: this task owns the partials of (part, heads) exclusively: regions
        // (part · hkv + h) for h in heads, consecutive.
        let mine = unsafe {
            std::slice::from_raw_parts_mut(
                partials.get().add((part * hkv + heads.start) * per_head),
                heads.len() * per_head,
            )
        };
        let mut states = HeadStates { buf: mine, rows, d };
        states.reset();
        let table = p.block_tables[seq];
        let inp = RangeInput { layer, heads, table, bounds, group, q, lanes: lanes.as_deref(), origin: first };
        // SAFETY: CPU checked by the caller; block table validated over the read range, which
        // contains [start, end); buffers sized by `prepare` and `split`.
        unsafe { attend_range(isa, &inp, start, end, &mut states, &mut tile) };
    });

    let out = SyncPtr::new(out.as_mut_ptr());
    pool.run(p.num_seqs * hkv, |task, thread| {
        let (seq, kv_head) = (task / hkv, task % hkv);
        let (first, last) = (ws.seq_first_part[seq], ws.seq_first_part[seq + 1]);
        // SAFETY: the partition tasks finished (the pool returned); merge tasks only read.
        let all = unsafe { std::slice::from_raw_parts(partials.get(), parts * hkv * per_head) };
        // SAFETY: one task per thread index at a time.
        let scratch = unsafe { ws.thread(thread) };
        let (_, _, mut states, _, _) = scratch.split(1, rows, d);
        states.reset();
        let mut state = states.head(0);
        for part in first..last {
            state.fold(&all[(part * hkv + kv_head) * per_head..][..per_head], rows, d);
        }
        // SAFETY: each merge task writes only its own (seq, kv_head) output rows.
        unsafe { write_output(layer, p, seq, kv_head, state.l, state.acc, out.get()) };
    });
    parts * hkv
}
