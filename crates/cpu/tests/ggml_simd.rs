//! The SIMD ggml-numerics kernel (`GgmlAttention` with an instruction set) against the scalar
//! reference (`ggml::attention`), bit for bit: fresh random pages with the blocks scattered
//! (spare blocks hold large values), outputs poisoned with NaN, every instruction set this CPU
//! runs, pools of 1, 2 and 3 threads (so both ways of cutting a call run), decode and prefill,
//! contexts around every block and lane boundary, GQA 1/3/4/8, head_dim 16 to 256, windows on
//! and off, several sequences per call. And a sequence's result does not depend on what it is
//! batched with (per-sequence summation order), on both kernels.

use std::sync::Arc;

use kvcache::{AttentionRoute, CacheCounters, HostPages, KvFormat, PageGeometry, PageStore, NULL_BLOCK};
use pagekv_cpu::attention::ggml::{self, GgmlAttention, GgmlSteps};
use pagekv_cpu::attention::{AttentionParams, KernelIsa};
use pagekv_cpu::threadpool::ThreadPool;
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use rand_distr::StandardNormal;

/// One call: sequences with these contexts, `q_len` query tokens each.
#[derive(Clone, Debug)]
struct Case {
    head_dim: usize,
    kv_heads: usize,
    group: usize,
    q_len: usize,
    contexts: Vec<usize>,
    causal: bool,
    window: Option<usize>,
    block_size: usize,
    seed: u64,
}

struct Built {
    pages: HostPages,
    tables: Vec<Vec<u32>>,
    queries: Vec<f32>,
}

fn normal(rng: &mut StdRng) -> f32 {
    rng.sample::<f32, _>(StandardNormal)
}

/// Scattered pages: each sequence's blocks at random places of a pool twice as large, spare
/// blocks full of large values, blocks wholly before every window replaced by `NULL_BLOCK`.
fn build(c: &Case) -> Built {
    let mut rng = StdRng::seed_from_u64(c.seed);
    let (bs, row) = (c.block_size, c.kv_heads * c.head_dim);
    let needed: usize = c.contexts.iter().map(|x| x.div_ceil(bs)).sum();
    let num_blocks = 2 * needed + 3;
    let geometry = PageGeometry {
        num_layers: 1,
        num_blocks,
        block_size: bs,
        num_kv_heads: c.kv_heads,
        head_dim: c.head_dim,
        format: KvFormat::F16,
        rotation_seed: 0,
    };
    let mut pages = HostPages::new(geometry);
    let mut ids: Vec<u32> = (0..num_blocks as u32).collect();
    ids.shuffle(&mut rng);
    for &b in &ids[needed..] {
        let slots: Vec<u32> = (0..bs as u32).map(|i| b * bs as u32 + i).collect();
        let junk: Vec<f32> = (0..bs * row).map(|_| 1e3 * normal(&mut rng)).collect();
        pages.write(0, &slots, &junk, &junk);
    }
    let mut next = 0;
    let mut tables = Vec::new();
    for &ctx in &c.contexts {
        let mut table = ids[next..next + ctx.div_ceil(bs)].to_vec();
        next += table.len();
        let k: Vec<f32> = (0..ctx * row).map(|_| normal(&mut rng)).collect();
        let v: Vec<f32> = (0..ctx * row).map(|_| normal(&mut rng)).collect();
        let slots: Vec<u32> = (0..ctx).map(|p| table[p / bs] * bs as u32 + (p % bs) as u32).collect();
        pages.write(0, &slots, &k, &v);
        if let Some(w) = c.window {
            let lo = (ctx - c.q_len + 1).saturating_sub(w);
            for entry in table.iter_mut().take(lo / bs) {
                *entry = NULL_BLOCK;
            }
        }
        tables.push(table);
    }
    let n = c.contexts.len() * c.q_len * c.kv_heads * c.group * c.head_dim;
    // Queries ~ 3·N(0,1): peaky softmax, outputs O(1).
    let queries = (0..n).map(|_| 3.0 * normal(&mut rng)).collect();
    Built { pages, tables, queries }
}

fn params<'a>(c: &'a Case, b: &'a Built, tables: &'a [&'a [u32]]) -> AttentionParams<'a> {
    AttentionParams {
        queries: &b.queries,
        num_seqs: c.contexts.len(),
        q_len: c.q_len,
        num_heads: c.kv_heads * c.group,
        block_tables: tables,
        context_lens: &c.contexts,
        scale: 1.0 / (c.head_dim as f32).sqrt(),
        sliding_window: c.window,
        causal: c.causal,
    }
}

/// The instruction sets this CPU runs (AVX2 at least is expected; none fails the test).
fn isas() -> Vec<KernelIsa> {
    let isas: Vec<KernelIsa> = KernelIsa::ALL.into_iter().filter(KernelIsa::is_available).collect();
    assert!(!isas.is_empty(), "this CPU runs neither AVX2+FMA+F16C nor AVX-512");
    isas
}

/// Asserts equal bit patterns, naming the first difference.
fn assert_bits(got: &[f32], want: &[f32], what: &str) {
    assert_eq!(got.len(), want.len());
    if let Some(i) = (0..got.len()).find(|&i| got[i].to_bits() != want[i].to_bits()) {
        let diff = (0..got.len()).filter(|&i| got[i].to_bits() != want[i].to_bits()).count();
        panic!("{what}: {diff} of {} outputs differ; first at {i}: {} vs {} (reference)", got.len(), got[i], want[i]);
    }
}

/// Runs `c` through the scalar reference and the SIMD kernel on every ISA and pool; returns
/// the routes the SIMD kernel took.
fn check(c: &Case, pools: &[Arc<ThreadPool>]) -> Vec<AttentionRoute> {
    let b = build(c);
    let tables: Vec<&[u32]> = b.tables.iter().map(|t| t.as_slice()).collect();
    let p = params(c, &b, &tables);
    let layer = b.pages.layer(0);
    let mut want = vec![f32::NAN; b.queries.len()];
    ggml::attention(&layer, &p, GgmlSteps::ALL, &mut want).unwrap();
    assert!(want.iter().all(|x| x.is_finite()), "{c:?}: reference not finite");
    let mut routes = Vec::new();
    for isa in isas() {
        for pool in pools {
            let kernel = GgmlAttention::new(GgmlSteps::ALL, pool.clone()).with_isa(Some(isa));
            let counters = CacheCounters::default();
            // Twice on one operator: the second call reuses (dirty) buffers.
            for call in 0..2 {
                let mut got = vec![f32::NAN; b.queries.len()];
                let route = kernel.forward(&layer, &p, &counters, &mut got).unwrap();
                assert_ne!(route, AttentionRoute::Reference, "{c:?}: the SIMD kernel did not serve it");
                let what = format!("{c:?} on {isa:?}, {} threads, call {call}", pool.n_threads());
                assert_bits(&got, &want, &what);
                routes.push(route);
            }
        }
    }
    routes
}

#[test]
fn simd_kernel_is_bit_identical_to_the_scalar_reference() {
    let pools: Vec<Arc<ThreadPool>> = [1, 2, 3].map(|n| Arc::new(ThreadPool::new(n))).into();
    let contexts = [1, 15, 16, 17, 63, 64, 65, 511, 513, 3000];
    let head_dims = [64, 128, 80, 96, 48, 256];
    let block_sizes = [16, 8, 32];
    let mut routes = Vec::new();
    let mut index = 0usize;
    for window in [None, Some(40)] {
        for group in [1, 3, 4, 8] {
            for q_len in [1, 7, 37] {
                for &context in &contexts {
                    // Long prefills only for one group size (the reference is slow).
                    if q_len > 1 && context == 3000 && group != 4 {
                        continue;
                    }
                    index += 1;
                    let q_len = q_len.min(context);
                    let c = Case {
                        head_dim: head_dims[index % head_dims.len()],
                        kv_heads: 1 + index % 3,
                        group,
                        q_len,
                        // Several sequences: this context, a shorter one, and (every other case)
                        // a third.
                        contexts: if index.is_multiple_of(2) {
                            vec![context, (context / 2).max(q_len)]
                        } else {
                            vec![context, (context / 2).max(q_len), (context / 3 + 5).max(q_len)]
                        },
                        causal: q_len > 1 || index.is_multiple_of(3),
                        window: window.map(|w: usize| w + index % 7),
                        block_size: block_sizes[index % 3],
                        seed: 1000 + index as u64,
                    };
                    routes.extend(check(&c, &pools));
                }
            }
        }
    }
    // Both ways of cutting a call ran.
    assert!(routes.contains(&AttentionRoute::Primitive) && routes.contains(&AttentionRoute::Partitioned));
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
            let c = Case {
                head_dim,
                kv_heads,
                group,
                q_len,
                contexts,
                causal: q_len > 1,
                window: None,
                block_size: 16,
                seed,
            };
            check(&c, &pools);
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
        let c = Case {
            head_dim: 64,
            kv_heads: 3,
            group: 3,
            q_len,
            contexts: contexts.clone(),
            causal: q_len > 1,
            window: None,
            block_size: 16,
            seed,
        };
        let b = build(&c);
        let tables: Vec<&[u32]> = b.tables.iter().map(|t| t.as_slice()).collect();
        let p = params(&c, &b, &tables);
        let layer = b.pages.layer(0);
        let row = q_len * c.kv_heads * c.group * c.head_dim;
        let mut kernels: Vec<(String, GgmlAttention)> = isas()
            .into_iter()
            .map(|isa| (format!("{isa:?}"), GgmlAttention::new(GgmlSteps::ALL, pool.clone()).with_isa(Some(isa))))
            .collect();
        kernels.push(("scalar".into(), GgmlAttention::new(GgmlSteps::ALL, pool.clone()).with_isa(None)));
        for (name, kernel) in &kernels {
            let counters = CacheCounters::default();
            let mut batched = vec![f32::NAN; b.queries.len()];
            kernel.forward(&layer, &p, &counters, &mut batched).unwrap();
            for s in 0..contexts.len() {
                let alone_p = AttentionParams {
                    queries: &b.queries[s * row..(s + 1) * row],
                    num_seqs: 1,
                    block_tables: &tables[s..s + 1],
                    context_lens: &contexts[s..s + 1],
                    ..p
                };
                let mut alone = vec![f32::NAN; row];
                kernel.forward(&layer, &alone_p, &counters, &mut alone).unwrap();
                assert_bits(&batched[s * row..(s + 1) * row], &alone, &format!("{name}: sequence {s} of {contexts:?}"));
            }
        }
    }
}

#[test]
fn other_steps_and_odd_head_dims_take_the_scalar_kernel() {
    let pool = Arc::new(ThreadPool::new(2));
    for (head_dim, steps) in [(64, GgmlSteps { expf: false, ..GgmlSteps::ALL }), (40, GgmlSteps::ALL)] {
        let c = Case {
            head_dim,
            kv_heads: 2,
            group: 2,
            q_len: 1,
            contexts: vec![300],
            causal: false,
            window: None,
            block_size: 16,
            seed: 9,
        };
        let b = build(&c);
        let tables: Vec<&[u32]> = b.tables.iter().map(|t| t.as_slice()).collect();
        let p = params(&c, &b, &tables);
        let layer = b.pages.layer(0);
        let mut want = vec![f32::NAN; b.queries.len()];
        ggml::attention(&layer, &p, steps, &mut want).unwrap();
        let mut got = vec![f32::NAN; b.queries.len()];
        let route =
            GgmlAttention::new(steps, pool.clone()).forward(&layer, &p, &CacheCounters::default(), &mut got).unwrap();
        assert_eq!(route, AttentionRoute::Reference, "head_dim {head_dim}, {steps:?}");
        assert_bits(&got, &want, &format!("head_dim {head_dim}"));
    }
}
