//! The partitioned path (split-K, "flash decoding"): each sequence's read range is cut at
//! multiples of `partition_size` positions; one task per (sequence, kv head, partition) runs
//! the same tile kernel as the primitive path over its partition and leaves a partial state
//! `(m, l, acc)` per query row; a second parallel step merges the partials of each
//! (sequence, kv head) exactly:
//! `M = max_j m_j`, `L = Σ_j l_j·e^(m_j−M)`, `o = Σ_j acc_j·e^(m_j−M) / L`.
//! It keeps every thread busy when sequences × kv heads are fewer than the threads.

use kvcache::LayerView;

use super::group::{prepare_queries, write_output, QueryBounds, RowState};
use super::workspace::{SyncPtr, Workspace};
use super::{AttentionParams, KernelIsa};
use crate::threadpool::ThreadPool;

/// `out` (`[num_seqs, q_len, num_heads, head_dim]`) ← attention of `p` over `layer`;
/// returns the number of partitions processed. Shapes and block tables validated; the CPU
/// runs `isa` (checked by the caller).
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
    let per_task = rows * (d + 2); // m [rows], l [rows], acc [rows, d]

    ws.seq_tasks.clear();
    ws.seq_parts.clear();
    let mut tasks = 0;
    for seq in 0..p.num_seqs {
        let r = QueryBounds::of(p, seq).read_range();
        let parts = r.end.div_ceil(psize) - r.start / psize;
        ws.seq_tasks.push(tasks);
        ws.seq_parts.push(parts);
        tasks += parts * hkv;
    }
    ws.seq_tasks.push(tasks);
    if ws.partials.len() < tasks * per_task {
        ws.partials.resize(tasks * per_task, 0.0);
    }
    ws.prepare(pool.n_threads(), rows, d);
    let partials = SyncPtr::new(ws.partials.as_mut_ptr());
    let ws = &*ws;

    #[cfg(target_arch = "x86_64")]
    pool.run(tasks, |task, thread| {
        use super::tile::{attend_range, RangeInput};
        let seq = ws.seq_tasks.partition_point(|&first| first <= task) - 1;
        let local = task - ws.seq_tasks[seq];
        let parts = ws.seq_parts[seq];
        let (kv_head, j) = (local / parts, local % parts);
        let bounds = QueryBounds::of(p, seq);
        let range = bounds.read_range();
        let first = (range.start / psize + j) * psize;
        let (start, end) = (first.max(range.start), (first + psize).min(range.end));
        // SAFETY: one task per thread index at a time; the reference dies with the task.
        let scratch = unsafe { ws.thread(thread) };
        let (q, _, mut tile) = scratch.split(rows, d);
        prepare_queries(layer, p, seq, kv_head, q);
        // SAFETY: task `task` owns partials[task * per_task ..][..per_task] exclusively.
        let mine = unsafe { std::slice::from_raw_parts_mut(partials.get().add(task * per_task), per_task) };
        let (m, rest) = mine.split_at_mut(rows);
        let (l, acc) = rest.split_at_mut(rows);
        let mut state = RowState { m, l, acc };
        state.reset();
        let inp = RangeInput { layer, kv_head, table: p.block_tables[seq], bounds, group, q };
        // SAFETY: CPU checked by the caller; block table validated over the read range, which
        // contains [start, end); buffers sized by `prepare` and `split`.
        unsafe { attend_range(isa, &inp, start, end, &mut state, &mut tile) };
    });

    let out = SyncPtr::new(out.as_mut_ptr());
    pool.run(p.num_seqs * hkv, |task, thread| {
        let (seq, kv_head) = (task / hkv, task % hkv);
        let parts = ws.seq_parts[seq];
        let first_task = ws.seq_tasks[seq] + kv_head * parts;
        // SAFETY: the partition tasks finished (the pool returned); merge tasks only read.
        let all = unsafe { std::slice::from_raw_parts(partials.get().add(first_task * per_task), parts * per_task) };
        // SAFETY: one task per thread index at a time.
        let scratch = unsafe { ws.thread(thread) };
        let (_, state, _) = scratch.split(rows, d);
        merge(all, parts, rows, d, state.l, state.acc);
        // SAFETY: each merge task writes only its own (seq, kv_head) output rows.
        unsafe { write_output(layer, p, seq, kv_head, state.l, state.acc, out.get()) };
    });
    tasks
}

/// Merges `parts` partial states (`[parts, rows * (d + 2)]`: m, l, acc) into `l` (`[rows]`)
/// and `acc` (`[rows, d]`), both relative to the common max.
fn merge(all: &[f32], parts: usize, rows: usize, d: usize, l: &mut [f32], acc: &mut [f32]) {
    let per = rows * (d + 2);
    for row in 0..rows {
        let m_of = |j: usize| all[j * per + row];
        let big_m = (0..parts).map(m_of).fold(f32::NEG_INFINITY, f32::max);
        let out = &mut acc[row * d..(row + 1) * d];
        out.fill(0.0);
        let mut total = 0.0f32;
        for j in 0..parts {
            let base = j * per;
            let (m, lj) = (all[base + row], all[base + rows + row]);
            if lj == 0.0 {
                continue; // this partition held no key of this row
            }
            let w = (m - big_m).exp();
            total += lj * w;
            let part = &all[base + 2 * rows + row * d..base + 2 * rows + (row + 1) * d];
            for (o, a) in out.iter_mut().zip(part) {
                *o += a * w;
            }
        }
        l[row] = total;
    }
}
