//! The ggml route over the shapes its SIMD kernel cuts in different ways, through the one
//! attention test helper (`attention_common::check_case`: the SIMD kernel on every instruction
//! set bit for bit against the scalar ggml kernel, twice on one operator, and every other route
//! against its reference): fresh random pages with the blocks scattered, pools of 1, 2 and 3
//! threads (so both ways of cutting a call run), decode and prefill, contexts around every
//! block and lane boundary, GQA 1/3/4/8, head_dim 48 to 256, windows on and off, several
//! sequences per call. And a sequence's result does not depend on what it is batched with
//! (per-sequence summation order), on both kernels.

mod attention_common;

use std::sync::Arc;

use attention_common::{assert_bits, build, check_case, isas, Case};
use kvcache::{AttentionRoute, CacheCounters};
use pagekv_cpu::attention::ggml::{self, GgmlAttention, GgmlKernel, GgmlSteps};
use pagekv_cpu::attention::{Attention, AttentionConfig, AttentionParams, AttnNumerics};
use pagekv_cpu::threadpool::ThreadPool;

#[test]
fn simd_kernel_is_bit_identical_to_the_scalar_reference() {
    let pools: Vec<Arc<ThreadPool>> = [1, 2, 3].map(|n| Arc::new(ThreadPool::new(n))).into();
    let contexts = [1, 15, 16, 17, 63, 64, 65, 511, 513, 3000];
    let head_dims = [64, 128, 80, 96, 48, 256];
    let block_sizes = [16, 8, 32];
    let mut partitions = Vec::new();
    let mut index = 0usize;
    for window in [None, Some(40)] {
        for group in [1, 3, 4, 8] {
            for q_len in [1, 7, 37] {
                for &context in &contexts {
                    // Long prefills only for one group size (the references are slow).
                    if q_len > 1 && context == 3000 && group != 4 {
                        continue;
                    }
                    index += 1;
                    let q_len = q_len.min(context);
                    // Several sequences: this context, a shorter one, and (every other case) a
                    // third.
                    let contexts = if index.is_multiple_of(2) {
                        vec![context, (context / 2).max(q_len)]
                    } else {
                        vec![context, (context / 2).max(q_len), (context / 3 + 5).max(q_len)]
                    };
                    let c = Case {
                        causal: q_len > 1 || index.is_multiple_of(3),
                        window: window.map(|w: usize| w + index % 7),
                        block_size: block_sizes[index % 3],
                        partition_size: if index.is_multiple_of(2) { 512 } else { 48 },
                        ..Case::f16(
                            head_dims[index % head_dims.len()],
                            1 + index % 3,
                            group,
                            q_len,
                            contexts,
                            1000 + index as u64,
                        )
                    };
                    for pool in &pools {
                        partitions.extend(check_case(&c, pool).ggml_partitions);
                    }
                }
            }
        }
    }
    // Both ways of cutting a call ran: whole rows (no partitions) and split decode rows.
    assert!(partitions.contains(&0) && partitions.iter().any(|&n| n > 0));
}

#[test]
fn simd_kernel_matches_on_model_shapes() {
    // SmolLM2-135M (9 heads over 3 kv heads, head_dim 64) and a Llama-3-8B-like layer (32 over
    // 8, head_dim 128): one decoding sequence at contexts the bench uses, 4 batched, a prefill.
    let pools: Vec<Arc<ThreadPool>> = [1, 2, 4].map(|n| Arc::new(ThreadPool::new(n))).into();
    let mut seed = 5000;
    for (head_dim, kv_heads, group) in [(64, 3, 3), (128, 8, 4)] {
        for (q_len, contexts) in
            [(1, vec![128]), (1, vec![4096]), (1, vec![700, 33, 1500, 64]), (1, vec![2049; 9]), (100, vec![1100])]
        {
            seed += 1;
            let c = Case::f16(head_dim, kv_heads, group, q_len, contexts, seed);
            for pool in &pools {
                check_case(&c, pool);
            }
        }
    }
}

/// A sequence's rows from a batched call equal its rows from a call of its own, bit for bit,
/// on the SIMD kernel (every ISA) and on the scalar one.
#[test]
fn a_sequence_does_not_depend_on_its_batch_neighbours() {
    let pool = Arc::new(ThreadPool::new(2));
    for (q_len, contexts, seed) in
        [(1, vec![300, 17, 4000, 64, 65], 1), (1, vec![129, 2000], 2), (6, vec![300, 40, 900], 3)]
    {
        let c = Case::f16(64, 3, 3, q_len, contexts.clone(), seed);
        let b = build(&c);
        let tables = b.tables();
        let p = b.params(&c, &tables);
        let layer = b.pages.layer(0);
        let row = q_len * c.num_kv_heads * c.group * c.head_dim;
        let mut kernels: Vec<(String, GgmlAttention)> = isas()
            .into_iter()
            .map(|isa| (format!("{isa:?}"), GgmlAttention::new(GgmlSteps::ALL, pool.clone()).with_isa(Some(isa))))
            .collect();
        kernels.push(("scalar".into(), GgmlAttention::new(GgmlSteps::ALL, pool.clone()).with_isa(None)));
        for (name, kernel) in &mut kernels {
            let mut batched = vec![f32::NAN; b.queries.len()];
            kernel.forward(&layer, &p, &mut batched).unwrap();
            for s in 0..contexts.len() {
                let alone_p = AttentionParams {
                    queries: &b.queries[s * row..(s + 1) * row],
                    num_seqs: 1,
                    block_tables: &tables[s..s + 1],
                    context_lens: &contexts[s..s + 1],
                    ..p
                };
                let mut alone = vec![f32::NAN; row];
                kernel.forward(&layer, &alone_p, &mut alone).unwrap();
                assert_bits(&batched[s * row..(s + 1) * row], &alone, &format!("{name}: sequence {s} of {contexts:?}"));
            }
        }
    }
}

/// Ablation steps and head sizes the SIMD kernel does not take run on the scalar kernel, on the
/// thread pool with the same bits as on one thread, and still count as the ggml route.
#[test]
fn other_steps_and_odd_head_dims_take_the_scalar_kernel() {
    let pool = Arc::new(ThreadPool::new(2));
    for (head_dim, steps) in [(64, GgmlSteps { expf: false, ..GgmlSteps::ALL }), (40, GgmlSteps::ALL)] {
        let c = Case { causal: false, ..Case::f16(head_dim, 2, 2, 1, vec![300], 9) };
        let b = build(&c);
        let tables = b.tables();
        let p = b.params(&c, &tables);
        let layer = b.pages.layer(0);
        let mut want = vec![f32::NAN; b.queries.len()];
        ggml::attention(&layer, &p, steps, &mut want).unwrap();
        let mut got = vec![f32::NAN; b.queries.len()];
        let kernel = GgmlAttention::new(steps, pool.clone()).forward(&layer, &p, &mut got).unwrap();
        assert_eq!(kernel, GgmlKernel::Scalar, "head_dim {head_dim}, {steps:?}");
        assert_bits(&got, &want, &format!("head_dim {head_dim}"));
        let config = AttentionConfig { numerics: AttnNumerics::Ggml(steps), ..AttentionConfig::default() };
        let counters = CacheCounters::default();
        let route = Attention::new(config, pool.clone()).forward(&layer, &p, &counters, &mut got).unwrap();
        assert_eq!(route, AttentionRoute::Ggml);
        assert_bits(&got, &want, &format!("head_dim {head_dim}, through the router"));
        assert!(counters.fallbacks.iter().all(|f| f.load(std::sync::atomic::Ordering::Relaxed) == 0));
    }
}
