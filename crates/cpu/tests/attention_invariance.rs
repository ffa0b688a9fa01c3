//! Shape invariance of the primitive fast path: a query's output must not depend on how many
//! queries share its call. Drafted decoding verifies k+1 tokens in one causal call (q_len k+1)
//! where plain decoding runs each of them alone (q_len 1); greedy outputs are identical only
//! if every row of the chunk equals, bit for bit, the same query run alone over the same pages.
//! Cases cover the head shapes that broke it (head_dim 128, six query heads per kv head: a
//! block of four rows mixes heads of different positions) and SmolLM2's (64, group 3), with
//! heads of very different score scales.

mod attention_common;

use std::sync::Arc;

use attention_common::{assert_bits, build, fast_config, isas, Case};
use kvcache::{CacheCounters, KvFormat};
use pagekv_cpu::attention::{Attention, AttnImpl, IsaChoice};
use pagekv_cpu::threadpool::ThreadPool;

/// Runs `case` (one sequence, causal chunk of `q_len`) through the primitive path, then each
/// of its queries alone at its own context over the same pages, and compares bit patterns.
fn check_chunk_equals_single(case: &Case, pool: &Arc<ThreadPool>) {
    check_chunk_equals_single_on(case, pool, AttnImpl::Primitive);
}

/// [`check_chunk_equals_single`] on the path `imp`.
fn check_chunk_equals_single_on(case: &Case, pool: &Arc<ThreadPool>, imp: AttnImpl) {
    assert_eq!(case.contexts.len(), 1);
    let mut built = build(case);
    // Real models' heads differ in scale by orders of magnitude (Qwen's reach scores in the
    // hundreds): every third head's queries ×25, so its running max keeps rising tile after
    // tile (new max, rescale) while its neighbours' stays put (correction exactly 1).
    let d = case.head_dim;
    for (i, q) in built.queries.chunks_mut(d).enumerate() {
        if i % 3 == 1 {
            q.iter_mut().for_each(|x| *x *= 25.0);
        }
    }
    let tables = built.tables();
    let layer = built.pages.layer(0);
    let counters = CacheCounters::default();
    let row = built.num_heads * case.head_dim;
    for isa in isas() {
        let config = fast_config(imp, IsaChoice::Only(isa), case.partition_size);
        let mut attn = Attention::new(config, pool.clone());
        let p = built.params(case, &tables);
        let mut chunk = vec![f32::NAN; built.queries.len()];
        attn.forward(&layer, &p, &counters, &mut chunk).unwrap_or_else(|e| panic!("{case:?}: {e}"));
        let context = case.contexts[0];
        for j in 0..case.q_len {
            // Query j of the chunk sits at position context - q_len + j: alone, its context
            // ends there.
            let alone_context = [context - case.q_len + j + 1];
            let mut single = p;
            single.queries = &built.queries[j * row..(j + 1) * row];
            single.q_len = 1;
            single.causal = false;
            single.context_lens = &alone_context;
            let mut out = vec![f32::NAN; row];
            attn.forward(&layer, &single, &counters, &mut out).unwrap_or_else(|e| panic!("{case:?}: {e}"));
            assert_bits(
                &out,
                &chunk[j * row..(j + 1) * row],
                &format!("{case:?}: {isa:?}, query {j} alone vs in the chunk"),
            );
        }
    }
}

#[test]
fn a_query_gives_the_same_bits_alone_and_in_a_verification_chunk() {
    let pool = Arc::new(ThreadPool::new(2));
    let mut seed = 11;
    for format in [KvFormat::F16, KvFormat::Q8, KvFormat::F32] {
        // (head_dim, kv heads, group, q_len, context): Qwen2.5-1.5B, Qwen2.5-0.5B-like,
        // SmolLM2, and an odd group.
        for (d, hkv, group, q_len, context) in
            [(128, 2, 6, 9, 300), (64, 2, 7, 5, 97), (64, 3, 3, 9, 200), (128, 1, 5, 4, 33), (256, 1, 4, 9, 120)]
        {
            seed += 1;
            let mut case = Case::f16(d, hkv, group, q_len, vec![context], seed);
            case.format = format;
            check_chunk_equals_single(&case, &pool);
        }
    }
}

/// With a sliding window the chunk's read range starts at its first query's window, the
/// queries alone at their own: tiles sit on a fixed grid (from 0, or from the partition's
/// start) and every row block computes from the tile's first column, so each query's sums are
/// the same either way — Gemma 3's local layers (head_dim 256, window 512) verifying drafts past
/// the window, and SmolLM2's shape with a window that is not a multiple of the tile, on the
/// primitive path and on partitions that are and are not multiples of the tile.
#[test]
fn a_windowed_query_gives_the_same_bits_alone_and_in_a_verification_chunk() {
    let pool = Arc::new(ThreadPool::new(2));
    let mut seed = 101;
    for format in [KvFormat::F16, KvFormat::Q8] {
        for (d, hkv, group, q_len, context, window) in
            [(256, 1, 4, 9, 700, 512), (64, 3, 3, 9, 300, 100), (128, 2, 6, 5, 97, 45)]
        {
            for (imp, psize) in [(AttnImpl::Primitive, 512), (AttnImpl::Partitioned, 128), (AttnImpl::Partitioned, 100)]
            {
                seed += 1;
                let mut case = Case::f16(d, hkv, group, q_len, vec![context], seed);
                case.format = format;
                case.window = Some(window);
                case.partition_size = psize;
                check_chunk_equals_single_on(&case, &pool, imp);
            }
        }
    }
}

/// The router picks the primitive or the partitioned path from the call's shape — how many
/// sequences share it, how many threads there are — so both must give a query the same bits:
/// each sums a sequence's keys partition by partition and folds the partials in the same order.
/// Contexts of several partitions (and one), decode and verification chunks, windows, partition
/// sizes that are and are not tile multiples, q8 (integer K·Q) and f16 and q4r, 1 and 2 threads.
#[test]
fn the_primitive_and_partitioned_paths_give_the_same_bits() {
    let pools = [Arc::new(ThreadPool::new(1)), Arc::new(ThreadPool::new(2))];
    let mut seed = 401;
    for format in [KvFormat::F16, KvFormat::Q8, KvFormat::Q4 { rotate: true }] {
        for (d, hkv, group, q_len, context, window, psize) in [
            (64, 3, 3, 1, 1300, None, 512),
            (128, 2, 6, 9, 1100, None, 256),
            (64, 3, 3, 5, 900, Some(300), 100),
            (256, 1, 4, 1, 700, Some(512), 512),
            (128, 2, 6, 1, 200, None, 512),
        ] {
            seed += 1;
            let mut case = Case::f16(d, hkv, group, q_len, vec![context], seed);
            case.format = format;
            case.window = window;
            case.partition_size = psize;
            let built = build(&case);
            let tables = built.tables();
            let layer = built.pages.layer(0);
            let counters = CacheCounters::default();
            let p = built.params(&case, &tables);
            for pool in &pools {
                for isa in isas() {
                    let run = |imp| {
                        let mut attn = Attention::new(fast_config(imp, IsaChoice::Only(isa), psize), pool.clone());
                        let mut out = vec![f32::NAN; built.queries.len()];
                        attn.forward(&layer, &p, &counters, &mut out).unwrap_or_else(|e| panic!("{case:?}: {e}"));
                        out
                    };
                    let (primitive, partitioned) = (run(AttnImpl::Primitive), run(AttnImpl::Partitioned));
                    let what = format!("{case:?}: {isa:?}, {} threads", pool.n_threads());
                    assert_bits(&primitive, &partitioned, &format!("{what}: primitive vs partitioned"));
                }
            }
        }
    }
}
