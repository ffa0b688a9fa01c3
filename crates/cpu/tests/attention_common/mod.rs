//! Shared helper of the attention tests: builds a scattered paged cache with fresh random
//! K/V for one case and runs it through every path against the reference.

#![allow(dead_code)]

use std::sync::Arc;

use kvcache::{AttentionRoute, CacheCounters, HostPages, KvFormat, PageGeometry, PageStore, NULL_BLOCK};
use pagekv_cpu::attention::{
    Attention, AttentionConfig, AttentionParams, AttnImpl, IsaChoice, KernelIsa, RouterConfig,
    DEFAULT_PARTITION_THRESHOLD,
};
use pagekv_cpu::threadpool::ThreadPool;
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use rand_distr::StandardNormal;

/// Every KV format the kernels must serve (turbo twice: the default k8v3 and k4v2).
pub const FORMATS: [KvFormat; 8] = [
    KvFormat::F32,
    KvFormat::F16,
    KvFormat::Bf16,
    KvFormat::Q8,
    KvFormat::Q4 { rotate: false },
    KvFormat::Q4 { rotate: true },
    KvFormat::Turbo { k_bits: 8, v_bits: 3 },
    KvFormat::Turbo { k_bits: 4, v_bits: 2 },
];

pub const HEAD_DIMS: [usize; 5] = [64, 80, 96, 128, 256];
pub const GQA: [usize; 4] = [1, 3, 4, 8];
pub const Q_LENS: [usize; 3] = [1, 7, 64];
pub const CONTEXTS: [usize; 7] = [1, 15, 16, 17, 511, 513, 3000];

/// One attention case.
#[derive(Clone, Copy, Debug)]
pub struct Case {
    pub format: KvFormat,
    pub head_dim: usize,
    pub num_kv_heads: usize,
    /// Query heads per kv head.
    pub group: usize,
    pub q_len: usize,
    pub causal: bool,
    /// Context of sequence 0; sequence 1 holds `context / 2 + q_len` (capped at `context`).
    pub context: usize,
    pub window: Option<usize>,
    pub block_size: usize,
    pub partition_size: usize,
    pub seed: u64,
}

/// Relative error bound of a fast path against the reference over the same pages.
pub fn bound(format: KvFormat) -> f32 {
    match format {
        KvFormat::F32 | KvFormat::F16 | KvFormat::Bf16 => 1e-5,
        _ => 1e-4,
    }
}

/// A built case: pages, tables, queries; keeps the original K/V for storage-error checks.
pub struct Built {
    pub pages: HostPages,
    pub tables: Vec<Vec<u32>>,
    pub context_lens: Vec<usize>,
    pub queries: Vec<f32>,
    pub num_heads: usize,
    /// `[seq][pos, kv_head, head_dim]` original keys and values.
    pub keys: Vec<Vec<f32>>,
    pub values: Vec<Vec<f32>>,
}

impl Built {
    pub fn params(&self, case: &Case) -> (Vec<&[u32]>, f32) {
        (self.tables.iter().map(|t| t.as_slice()).collect(), 1.0 / (case.head_dim as f32).sqrt())
    }
}

fn normal(rng: &mut StdRng) -> f32 {
    rng.sample::<f32, _>(StandardNormal)
}

/// Pages with the sequences' blocks scattered over a pool twice as large (spare blocks hold
/// large random values, so reading a wrong block shows), blocks wholly outside every window
/// replaced by `NULL_BLOCK` in the tables.
pub fn build(case: &Case) -> Built {
    let mut rng = StdRng::seed_from_u64(case.seed);
    let (hkv, d, bs) = (case.num_kv_heads, case.head_dim, case.block_size);
    let contexts = [case.context, (case.context / 2 + case.q_len).min(case.context)];
    let needed: usize = contexts.iter().map(|c| c.div_ceil(bs)).sum();
    let num_blocks = 2 * needed + 3;
    let geometry = PageGeometry {
        num_layers: 1,
        num_blocks,
        block_size: bs,
        num_kv_heads: hkv,
        head_dim: d,
        format: case.format,
        rotation_seed: 0x5eed ^ case.seed,
    };
    let mut pages = HostPages::new(geometry);
    let mut ids: Vec<u32> = (0..num_blocks as u32).collect();
    ids.shuffle(&mut rng);
    let row = hkv * d;
    // Spare blocks: large values.
    for &b in &ids[needed..] {
        let slots: Vec<u32> = (0..bs as u32).map(|i| b * bs as u32 + i).collect();
        let junk: Vec<f32> = (0..bs * row).map(|_| 1e3 * normal(&mut rng)).collect();
        pages.write(0, &slots, &junk, &junk);
    }
    let mut next = 0;
    let mut tables = Vec::new();
    let (mut keys, mut values) = (Vec::new(), Vec::new());
    for &ctx in &contexts {
        let n = ctx.div_ceil(bs);
        let mut table = ids[next..next + n].to_vec();
        next += n;
        let k: Vec<f32> = (0..ctx * row).map(|_| normal(&mut rng)).collect();
        let v: Vec<f32> = (0..ctx * row).map(|_| normal(&mut rng)).collect();
        let slots: Vec<u32> = (0..ctx).map(|p| table[p / bs] * bs as u32 + (p % bs) as u32).collect();
        pages.write(0, &slots, &k, &v);
        if let Some(w) = case.window {
            // Token 0's window start: blocks wholly before it are never read.
            let lo = (ctx - case.q_len + 1).saturating_sub(w);
            for entry in table.iter_mut().take(lo / bs) {
                *entry = NULL_BLOCK;
            }
        }
        tables.push(table);
        keys.push(k);
        values.push(v);
    }
    let num_heads = hkv * case.group;
    // Queries ~ 3·N(0,1): peaky enough that softmax outputs are O(1).
    let queries = (0..2 * case.q_len * num_heads * d).map(|_| 3.0 * normal(&mut rng)).collect();
    Built { pages, tables, context_lens: contexts.to_vec(), queries, num_heads, keys, values }
}

/// Max over head vectors of `‖a − b‖∞ / ‖b‖∞`.
pub fn rel_error(a: &[f32], b: &[f32], d: usize) -> f32 {
    let mut worst = 0f32;
    for (ra, rb) in a.chunks(d).zip(b.chunks(d)) {
        let scale = rb.iter().fold(0f32, |m, x| m.max(x.abs())).max(1e-6);
        let err = ra.iter().zip(rb).fold(0f32, |m, (x, y)| m.max((x - y).abs()));
        // NaN (unwritten output) must fail.
        let rel = if err.is_nan() { f32::INFINITY } else { err / scale };
        worst = worst.max(rel);
    }
    worst
}

/// The kernel instruction sets this CPU runs (every one is tested; at least AVX2 is expected
/// on the machines this runs on, and a test that finds none fails rather than passing empty).
pub fn isas() -> Vec<KernelIsa> {
    let isas: Vec<KernelIsa> = KernelIsa::ALL.into_iter().filter(KernelIsa::is_available).collect();
    assert!(!isas.is_empty(), "this CPU runs none of the fast kernels (AVX2+FMA+F16C needed)");
    isas
}

/// Runs `case` through the reference, then primitive, partitioned and auto on every available
/// instruction set; asserts each against the reference within [`bound`]. Returns the worst
/// error seen.
pub fn check_case(case: &Case, pool: &Arc<ThreadPool>) -> f32 {
    let built = build(case);
    let (tables, scale) = built.params(case);
    let layer = built.pages.layer(0);
    let p = AttentionParams {
        queries: &built.queries,
        num_seqs: 2,
        q_len: case.q_len,
        num_heads: built.num_heads,
        block_tables: &tables,
        context_lens: &built.context_lens,
        scale,
        sliding_window: case.window,
        causal: case.causal,
    };
    let counters = CacheCounters::default();
    let config = |impl_, isa| AttentionConfig {
        impl_,
        router: RouterConfig { partition_size: case.partition_size, partition_threshold: DEFAULT_PARTITION_THRESHOLD },
        isa,
    };
    let n = built.queries.len();
    let mut reference = vec![f32::NAN; n];
    let route = Attention::new(config(AttnImpl::Reference, IsaChoice::Auto), pool.clone())
        .forward(&layer, &p, &counters, &mut reference)
        .unwrap_or_else(|e| panic!("{case:?}: {e}"));
    assert_eq!(route, AttentionRoute::Reference);
    assert!(reference.iter().all(|x| x.is_finite()), "{case:?}: reference output not finite");
    let mut impls = vec![
        (AttnImpl::Primitive, Some(AttentionRoute::Primitive)),
        (AttnImpl::Partitioned, Some(AttentionRoute::Partitioned)),
    ];
    if case.q_len == 1 {
        impls.push((AttnImpl::Auto, None));
    }
    let mut worst = 0f32;
    for isa in isas() {
        for &(impl_, expect) in &impls {
            let mut out = vec![f32::NAN; n];
            let route = Attention::new(config(impl_, IsaChoice::Only(isa)), pool.clone())
                .forward(&layer, &p, &counters, &mut out)
                .unwrap_or_else(|e| panic!("{case:?}: {e}"));
            if let Some(expect) = expect {
                assert_eq!(route, expect, "{case:?}: {impl_:?}/{isa:?} served by {route:?}");
            }
            let err = rel_error(&out, &reference, case.head_dim);
            assert!(
                err <= bound(case.format),
                "{case:?}: {impl_:?}/{isa:?} relative error {err:e} > {:e}",
                bound(case.format)
            );
            worst = worst.max(err);
        }
    }
    worst
}

/// The full matrix for one format: window {off, on} × GQA × q_len × context, head_dim
/// cycling through [`HEAD_DIMS`], block size through {16, 8, 32}, partition size through
/// {512, 48} (48 cuts inside blocks). q_len 64 runs causal (as prefill: min(64, context)),
/// q_len 7 alternates causal and not; context 3000 × q_len 64 only for GQA 4 (cost).
pub fn check_format(format: KvFormat) {
    let pool = Arc::new(ThreadPool::new(2));
    let mut index = 0u64;
    let mut worst = 0f32;
    let mut cases = 0;
    for window in [false, true] {
        for &group in &GQA {
            for &q_len in &Q_LENS {
                for &context in &CONTEXTS {
                    if context == 3000 && q_len == 64 && group != 4 {
                        continue;
                    }
                    index += 1;
                    let q_len = q_len.min(context);
                    let case = Case {
                        format,
                        head_dim: HEAD_DIMS[index as usize % HEAD_DIMS.len()],
                        num_kv_heads: 2,
                        group,
                        q_len,
                        causal: q_len == 64.min(context) || index % 2 == 0,
                        context,
                        window: window.then_some((context / 3).max(1) + (index as usize % 5)),
                        block_size: [16, 8, 32][index as usize % 3],
                        partition_size: if index % 2 == 0 { 512 } else { 48 },
                        seed: index * 7919 + format.name().len() as u64,
                    };
                    worst = worst.max(check_case(&case, &pool));
                    cases += 1;
                }
            }
        }
    }
    let isas: Vec<&str> = isas().iter().map(KernelIsa::name).collect();
    eprintln!("{}: {cases} cases on {isas:?}, worst relative error {worst:e}", format.name());
}
