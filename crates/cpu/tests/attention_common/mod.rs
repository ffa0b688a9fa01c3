//! The one helper of the attention tests: builds a scattered paged cache with fresh random
//! K/V for a case and runs it through every route — reference, primitive, partitioned, `auto`
//! and ggml — comparing each with its scalar reference: the fast paths with
//! `attention::reference` (within [`bound`]), the ggml route with `ggml::attention` (bit for
//! bit), and that scalar ggml kernel with `attention::reference` (within f16 rounding).

#![allow(dead_code)]

use std::sync::Arc;

use kvcache::{AttentionRoute, CacheCounters, HostPages, KvFormat, PageGeometry, PageStore, NULL_BLOCK};
use pagekv_cpu::attention::ggml::{self, GgmlAttention, GgmlKernel, GgmlSteps};
use pagekv_cpu::attention::{
    Attention, AttentionConfig, AttentionParams, AttnImpl, AttnNumerics, IsaChoice, KernelIsa, RouterConfig,
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
#[derive(Clone, Debug)]
pub struct Case {
    pub format: KvFormat,
    pub head_dim: usize,
    pub num_kv_heads: usize,
    /// Query heads per kv head.
    pub group: usize,
    pub q_len: usize,
    pub causal: bool,
    /// `[num_seqs]` context of each sequence (each at least `q_len`).
    pub contexts: Vec<usize>,
    pub window: Option<usize>,
    pub block_size: usize,
    pub partition_size: usize,
    pub seed: u64,
}

impl Case {
    /// An f16 case (the cache the ggml route serves) of sequences with `contexts`: causal for
    /// a prefill, no window, blocks of 16, partitions of 512.
    pub fn f16(head_dim: usize, kv_heads: usize, group: usize, q_len: usize, contexts: Vec<usize>, seed: u64) -> Case {
        Case {
            format: KvFormat::F16,
            head_dim,
            num_kv_heads: kv_heads,
            group,
            q_len,
            causal: q_len > 1,
            contexts,
            window: None,
            block_size: 16,
            partition_size: 512,
            seed,
        }
    }

    /// Two sequences: `context`, and `context / 2 + q_len` (capped at `context`).
    pub fn pair(context: usize, q_len: usize) -> Vec<usize> {
        vec![context, (context / 2 + q_len).min(context)]
    }
}

/// Relative error bound of a fast path against the reference over the same pages.
pub fn bound(format: KvFormat) -> f32 {
    match format {
        KvFormat::F32 | KvFormat::F16 | KvFormat::Bf16 => 1e-5,
        _ => 1e-4,
    }
}

/// Relative error bound of the ggml numerics (every step on) against the reference: f16
/// queries and f16 probabilities, each a relative 2^-11 at most.
pub const GGML_BOUND: f32 = 5e-3;

/// A built case: pages, tables, queries; keeps the original K/V for storage-error checks.
pub struct Built {
    pub pages: HostPages,
    pub tables: Vec<Vec<u32>>,
    pub context_lens: Vec<usize>,
    /// `[num_seqs, q_len, num_heads, head_dim]`
    pub queries: Vec<f32>,
    pub num_heads: usize,
    /// `[seq][pos, kv_head, head_dim]` original keys and values.
    pub keys: Vec<Vec<f32>>,
    pub values: Vec<Vec<f32>>,
}

impl Built {
    /// The block tables as the call takes them.
    pub fn tables(&self) -> Vec<&[u32]> {
        self.tables.iter().map(|t| t.as_slice()).collect()
    }

    /// The call of `case` over every sequence (`tables` from [`Self::tables`]), scale
    /// `1/sqrt(head_dim)`.
    pub fn params<'a>(&'a self, case: &Case, tables: &'a [&'a [u32]]) -> AttentionParams<'a> {
        AttentionParams {
            queries: &self.queries,
            num_seqs: self.context_lens.len(),
            q_len: case.q_len,
            num_heads: self.num_heads,
            block_tables: tables,
            context_lens: &self.context_lens,
            scale: 1.0 / (case.head_dim as f32).sqrt(),
            sliding_window: case.window,
            causal: case.causal,
        }
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
    let contexts = &case.contexts;
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
    for &ctx in contexts {
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
    let queries = (0..contexts.len() * case.q_len * num_heads * d).map(|_| 3.0 * normal(&mut rng)).collect();
    Built { pages, tables, context_lens: contexts.clone(), queries, num_heads, keys, values }
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

/// Asserts equal bit patterns, naming the first difference.
pub fn assert_bits(got: &[f32], want: &[f32], what: &str) {
    assert_eq!(got.len(), want.len());
    if let Some(i) = (0..got.len()).find(|&i| got[i].to_bits() != want[i].to_bits()) {
        let diff = (0..got.len()).filter(|&i| got[i].to_bits() != want[i].to_bits()).count();
        panic!("{what}: {diff} of {} outputs differ; first at {i}: {} vs {} (reference)", got.len(), got[i], want[i]);
    }
}

/// A fast-numerics configuration: this path, instruction set and partition size.
pub fn fast_config(impl_: AttnImpl, isa: IsaChoice, partition_size: usize) -> AttentionConfig {
    AttentionConfig {
        numerics: AttnNumerics::Fast,
        impl_,
        router: RouterConfig { partition_size, partition_threshold: DEFAULT_PARTITION_THRESHOLD },
        isa,
    }
}

/// The ggml numerics (every step) on this instruction set.
pub fn ggml_config(isa: IsaChoice) -> AttentionConfig {
    AttentionConfig { numerics: AttnNumerics::Ggml(GgmlSteps::ALL), isa, ..AttentionConfig::default() }
}

/// What [`check_case`] saw.
#[derive(Debug, Default)]
pub struct Checked {
    /// Worst relative error of a fast path against the reference.
    pub worst: f32,
    /// Worst relative error of the ggml numerics against the reference (f16 cases).
    pub worst_ggml: f32,
    /// Partitions counted by each ggml-route call (0: whole rows; more: a split decode row).
    pub ggml_partitions: Vec<u64>,
}

/// Runs `case` through every route on `pool` and every instruction set this CPU runs: the
/// reference; primitive, partitioned and (decode) `auto` against it within [`bound`]; for an
/// f16 cache the scalar ggml kernel against it within [`GGML_BOUND`], the ggml route (twice on
/// one operator: the second call reuses dirty buffers) against the scalar ggml kernel bit for
/// bit, and the default numerics (`auto`), which must equal one of the two.
pub fn check_case(case: &Case, pool: &Arc<ThreadPool>) -> Checked {
    let built = build(case);
    let tables = built.tables();
    let p = built.params(case, &tables);
    let layer = built.pages.layer(0);
    let counters = CacheCounters::default();
    let run = |config: AttentionConfig, calls: usize| -> Vec<(Vec<f32>, AttentionRoute, u64)> {
        let mut attn = Attention::new(config, pool.clone());
        (0..calls)
            .map(|_| {
                let mut out = vec![f32::NAN; built.queries.len()];
                let parts = counters.partitions.load(std::sync::atomic::Ordering::Relaxed);
                let route = attn.forward(&layer, &p, &counters, &mut out).unwrap_or_else(|e| panic!("{case:?}: {e}"));
                let parts = counters.partitions.load(std::sync::atomic::Ordering::Relaxed) - parts;
                (out, route, parts)
            })
            .collect()
    };
    let (reference, route, _) =
        run(fast_config(AttnImpl::Reference, IsaChoice::Auto, case.partition_size), 1).remove(0);
    assert_eq!(route, AttentionRoute::Reference);
    assert!(reference.iter().all(|x| x.is_finite()), "{case:?}: reference output not finite");
    let mut impls = vec![
        (AttnImpl::Primitive, Some(AttentionRoute::Primitive)),
        (AttnImpl::Partitioned, Some(AttentionRoute::Partitioned)),
    ];
    if case.q_len == 1 {
        impls.push((AttnImpl::Auto, None));
    }
    let mut checked = Checked::default();
    for isa in isas() {
        for &(impl_, expect) in &impls {
            let (out, route, _) = run(fast_config(impl_, IsaChoice::Only(isa), case.partition_size), 1).remove(0);
            if let Some(expect) = expect {
                assert_eq!(route, expect, "{case:?}: {impl_:?}/{isa:?} served by {route:?}");
            }
            let err = rel_error(&out, &reference, case.head_dim);
            assert!(
                err <= bound(case.format),
                "{case:?}: {impl_:?}/{isa:?} relative error {err:e} > {:e}",
                bound(case.format)
            );
            checked.worst = checked.worst.max(err);
        }
    }
    if case.format != KvFormat::F16 {
        return checked;
    }
    let mut ggml_ref = vec![f32::NAN; built.queries.len()];
    ggml::attention(&layer, &p, GgmlSteps::ALL, &mut ggml_ref).unwrap_or_else(|e| panic!("{case:?}: {e}"));
    let err = rel_error(&ggml_ref, &reference, case.head_dim);
    assert!(err <= GGML_BOUND, "{case:?}: scalar ggml relative error {err:e} > {GGML_BOUND:e}");
    checked.worst_ggml = err;
    for isa in isas() {
        for (call, (out, route, parts)) in run(ggml_config(IsaChoice::Only(isa)), 2).into_iter().enumerate() {
            assert_eq!(route, AttentionRoute::Ggml, "{case:?}");
            assert_bits(
                &out,
                &ggml_ref,
                &format!("{case:?}: ggml on {isa:?}, {} threads, call {call}", pool.n_threads()),
            );
            checked.ggml_partitions.push(parts);
        }
        // The route above ran the SIMD kernel wherever it serves the head size (else the
        // comparison would be the scalar kernel against itself).
        let mut kernel = GgmlAttention::new(GgmlSteps::ALL, pool.clone()).with_isa(Some(isa));
        if kernel.serves_fast(KvFormat::F16, case.head_dim) {
            let mut out = vec![f32::NAN; built.queries.len()];
            let served = kernel.forward(&layer, &p, &mut out).unwrap_or_else(|e| panic!("{case:?}: {e}"));
            assert_ne!(served, GgmlKernel::Scalar, "{case:?}: the SIMD kernel did not serve it");
            assert_bits(&out, &ggml_ref, &format!("{case:?}: ggml kernel on {isa:?}"));
        }
    }
    let (out, route, _) = run(AttentionConfig::default(), 1).remove(0);
    match route {
        AttentionRoute::Ggml => assert_bits(&out, &ggml_ref, &format!("{case:?}: auto numerics")),
        _ => assert!(rel_error(&out, &reference, case.head_dim) <= bound(case.format), "{case:?}: auto numerics"),
    }
    checked
}

/// The full matrix for one format: window {off, on} × GQA × q_len × context, head_dim
/// cycling through [`HEAD_DIMS`], block size through {16, 8, 32}, partition size through
/// {512, 48} (48 cuts inside blocks), every route of [`check_case`]. q_len 64 runs causal (as
/// prefill: min(64, context)), q_len 7 alternates causal and not; context 3000 × q_len 64 only
/// for GQA 4 (cost).
pub fn check_format(format: KvFormat) {
    let pool = Arc::new(ThreadPool::new(2));
    let mut index = 0u64;
    let (mut worst, mut worst_ggml) = (0f32, 0f32);
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
                        causal: q_len == 64.min(context) || index.is_multiple_of(2),
                        contexts: Case::pair(context, q_len),
                        window: window.then_some((context / 3).max(1) + (index as usize % 5)),
                        block_size: [16, 8, 32][index as usize % 3],
                        partition_size: if index.is_multiple_of(2) { 512 } else { 48 },
                        seed: index * 7919 + format.name().len() as u64,
                    };
                    let checked = check_case(&case, &pool);
                    worst = worst.max(checked.worst);
                    worst_ggml = worst_ggml.max(checked.worst_ggml);
                    cases += 1;
                }
            }
        }
    }
    let isas: Vec<&str> = isas().iter().map(KernelIsa::name).collect();
    let ggml = if format == KvFormat::F16 { format!(" (ggml numerics: {worst_ggml:e})") } else { String::new() };
    eprintln!("{}: {cases} cases on {isas:?}, worst relative error {worst:e}{ggml}", format.name());
}
