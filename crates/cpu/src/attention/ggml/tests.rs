//! Tests of the scalar ggml-compatible kernel: its dot-product orders, softmax sum and
//! rounding steps, and the SIMD kernel's bit-identity with it.

use super::*;
use crate::attention::reference;
use kvcache::{HostPages, PageGeometry, PageStore};
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};

struct Case {
    head_dim: usize,
    hkv: usize,
    group: usize,
    q_len: usize,
    contexts: Vec<usize>,
    causal: bool,
    window: Option<usize>,
    format: KvFormat,
}

struct Built {
    pages: HostPages,
    tables: Vec<Vec<u32>>,
    queries: Vec<f32>,
}

const BS: usize = 16;

fn build(c: &Case, seed: u64) -> Built {
    let mut rng = StdRng::seed_from_u64(seed);
    let normal = |rng: &mut StdRng| -> f32 {
        // Box–Muller: a normal sample from two uniforms.
        let (u, v): (f64, f64) = (rng.gen_range(1e-12..1.0), rng.gen());
        ((-2.0 * u.ln()).sqrt() * (std::f64::consts::TAU * v).cos()) as f32
    };
    let needed: usize = c.contexts.iter().map(|x| x.div_ceil(BS)).sum();
    let num_blocks = 2 * needed + 1;
    let geometry = PageGeometry {
        num_layers: 1,
        num_blocks,
        block_size: BS,
        num_kv_heads: c.hkv,
        head_dim: c.head_dim,
        format: c.format,
        rotation_seed: seed,
    };
    let mut pages = HostPages::new(geometry);
    let mut ids: Vec<u32> = (0..num_blocks as u32).collect();
    ids.shuffle(&mut rng);
    let row = c.hkv * c.head_dim;
    // Spare blocks hold large values, so reading a wrong one shows.
    for &b in &ids[needed..] {
        let slots: Vec<u32> = (0..BS as u32).map(|i| b * BS as u32 + i).collect();
        let junk: Vec<f32> = (0..BS * row).map(|_| 1e3 * normal(&mut rng)).collect();
        pages.write(0, &slots, &junk, &junk);
    }
    let mut next = 0;
    let mut tables = Vec::new();
    for &ctx in &c.contexts {
        let table = ids[next..next + ctx.div_ceil(BS)].to_vec();
        next += table.len();
        let k: Vec<f32> = (0..ctx * row).map(|_| normal(&mut rng)).collect();
        let v: Vec<f32> = (0..ctx * row).map(|_| normal(&mut rng)).collect();
        let slots: Vec<u32> = (0..ctx).map(|p| table[p / BS] * BS as u32 + (p % BS) as u32).collect();
        pages.write(0, &slots, &k, &v);
        tables.push(table);
    }
    let n = c.contexts.len() * c.q_len * c.hkv * c.group * c.head_dim;
    // Queries ~ 3·N(0,1): peaky softmax, outputs O(1).
    let queries = (0..n).map(|_| 3.0 * normal(&mut rng)).collect();
    Built { pages, tables, queries }
}

/// Runs `c` through the reference and the ggml kernel with `steps`; returns the worst
/// `‖ggml − ref‖∞ / ‖ref‖∞` over output head vectors.
fn rel_error(c: &Case, steps: GgmlSteps, seed: u64) -> f32 {
    let b = build(c, seed);
    let tables: Vec<&[u32]> = b.tables.iter().map(|t| t.as_slice()).collect();
    let p = AttentionParams {
        queries: &b.queries,
        num_seqs: c.contexts.len(),
        q_len: c.q_len,
        num_heads: c.hkv * c.group,
        block_tables: &tables,
        context_lens: &c.contexts,
        scale: 1.0 / (c.head_dim as f32).sqrt(),
        sliding_window: c.window,
        causal: c.causal,
    };
    let layer = b.pages.layer(0);
    let mut want = vec![f32::NAN; b.queries.len()];
    reference::attention(&layer, &p, &mut want);
    let mut got = vec![f32::NAN; b.queries.len()];
    attention(&layer, &p, steps, &mut got).unwrap();
    // The pooled path computes the same bits.
    let pool = crate::threadpool::ThreadPool::new(2);
    let mut pooled = vec![f32::NAN; b.queries.len()];
    let counters = CacheCounters::default();
    GgmlAttention::new(steps, std::sync::Arc::new(pool)).forward(&layer, &p, &counters, &mut pooled).unwrap();
    assert_eq!(
        got.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
        pooled.iter().map(|x| x.to_bits()).collect::<Vec<_>>()
    );
    let mut worst = 0f32;
    for (a, w) in got.chunks(c.head_dim).zip(want.chunks(c.head_dim)) {
        let scale = w.iter().fold(0f32, |m, x| m.max(x.abs())).max(1e-6);
        let err = a.iter().zip(w).fold(0f32, |m, (x, y)| m.max((x - y).abs()));
        worst = worst.max(if err.is_nan() { f32::INFINITY } else { err / scale });
    }
    worst
}

fn cases() -> Vec<Case> {
    let mut v = Vec::new();
    for (head_dim, hkv, group) in [(64, 3, 3), (80, 2, 1), (128, 1, 4), (96, 2, 2)] {
        for (q_len, causal) in [(1, false), (7, true), (33, true)] {
            for window in [None, Some(40)] {
                v.push(Case {
                    head_dim,
                    hkv,
                    group,
                    q_len,
                    contexts: vec![300, 41 + q_len],
                    causal,
                    window,
                    format: KvFormat::F16,
                });
            }
        }
    }
    v.push(Case {
        head_dim: 64,
        hkv: 1,
        group: 2,
        q_len: 1,
        contexts: vec![1, 17, 64, 65],
        causal: false,
        window: None,
        format: KvFormat::F16,
    });
    v
}

#[test]
fn ggml_numerics_stay_within_f16_rounding_of_the_reference() {
    // With every step on, the error is that of f16 queries and f16 probabilities (each a
    // relative 2^-11 at most; measured up to 1.8e-3 of the head's largest output); the
    // summation orders add f32 rounding only.
    let mut worst = 0f32;
    for (i, c) in cases().iter().enumerate() {
        let e = rel_error(c, GgmlSteps::ALL, 100 + i as u64);
        assert!(e < 5e-3, "case {i} (head_dim {}, q_len {}): {e}", c.head_dim, c.q_len);
        worst = worst.max(e);
    }
    eprintln!("ggml numerics vs reference: worst relative error {worst:.2e}");
    // The f16 steps do show (the queries' rounding moves the scores by up to ~1e-3·|q||k|).
    assert!(worst > 1e-5, "{worst}");
}

#[test]
fn without_the_f16_steps_ggml_numerics_match_the_reference_to_f32_rounding() {
    // Measured up to 1.2e-6 (f32 orders) and 6.4e-7 (no step).
    let steps = GgmlSteps { f16_query: false, f16_probs: false, ..GgmlSteps::ALL };
    for (i, c) in cases().iter().enumerate() {
        let e = rel_error(c, steps, 200 + i as u64);
        assert!(e < 3e-6, "case {i}: {e}");
        let e2 = rel_error(c, GgmlSteps::NONE, 300 + i as u64);
        assert!(e2 < 1.5e-6, "case {i} (no step): {e2}");
    }
}

#[test]
fn every_step_changes_some_output_bits() {
    // A step whose switch changes nothing would be a step the ablation cannot measure.
    let c = &cases()[2]; // head_dim 64, q_len 7, causal
    let b = build(c, 7);
    let tables: Vec<&[u32]> = b.tables.iter().map(|t| t.as_slice()).collect();
    let p = AttentionParams {
        queries: &b.queries,
        num_seqs: c.contexts.len(),
        q_len: c.q_len,
        num_heads: c.hkv * c.group,
        block_tables: &tables,
        context_lens: &c.contexts,
        scale: 0.125,
        sliding_window: None,
        causal: true,
    };
    let layer = b.pages.layer(0);
    let run = |steps: GgmlSteps| {
        let mut o = vec![f32::NAN; b.queries.len()];
        attention(&layer, &p, steps, &mut o).unwrap();
        o
    };
    // The f16 probabilities round away most 1-ulp changes before them, so the other steps
    // are switched against a base without them.
    let without_f16_probs = GgmlSteps { f16_probs: false, ..GgmlSteps::ALL };
    for (k, name) in GgmlSteps::NAMES.iter().enumerate() {
        let base = if *name == "f16_probs" { GgmlSteps::ALL } else { without_f16_probs };
        let mut f = base.flags();
        f[k] = false;
        let (on, off) = (run(base), run(GgmlSteps::from_flags(f)));
        let changed = on.iter().zip(&off).filter(|(a, b)| a.to_bits() != b.to_bits()).count();
        assert!(changed > 0, "switching {name} off changed nothing");
    }
}

#[test]
fn numerics_parse_and_bad_values_list_the_accepted_ones() {
    assert_eq!(AttnNumerics::parse("fast").unwrap(), AttnNumerics::Fast);
    assert_eq!(AttnNumerics::parse(" GGML ").unwrap(), AttnNumerics::Ggml(GgmlSteps::ALL));
    assert_eq!(AttnNumerics::parse("Auto").unwrap(), AttnNumerics::Auto);
    assert_eq!(AttnNumerics::from_lookup(|_| None).unwrap(), AttnNumerics::Auto);
    for n in [AttnNumerics::Auto, AttnNumerics::Fast, AttnNumerics::Ggml(GgmlSteps::ALL)] {
        assert_eq!(AttnNumerics::parse(n.name()).unwrap(), n);
    }
    let e = AttnNumerics::from_lookup(|_| Some("exact".into())).unwrap_err().to_string();
    assert!(e.contains(ATTN_NUMERICS_ENV) && e.contains("\"exact\"") && e.contains("auto, fast, ggml"), "{e}");
    assert!(AttnNumerics::parse("").is_err());
}

/// `serves_fast` (what `auto` follows) holds exactly for unrotated f16 caches of a head size
/// the SIMD kernel takes, with every step on and an instruction set for it.
#[test]
fn serves_fast_needs_f16_a_simd_head_size_every_step_and_an_isa() {
    let pool = crate::threadpool::ThreadPool::global().unwrap();
    let g = GgmlAttention::new(GgmlSteps::ALL, pool);
    let simd = g.isa().is_some();
    assert_eq!(g.serves_fast(KvFormat::F16, 64), simd);
    assert_eq!(g.serves_fast(KvFormat::F16, 128), simd);
    assert_eq!(g.serves_fast(KvFormat::F16, 512), simd);
    for (format, head_dim) in [(KvFormat::F16, 40), (KvFormat::F16, 528), (KvFormat::Q8, 64), (KvFormat::F32, 64)] {
        assert!(!g.serves_fast(format, head_dim), "{format:?} head_dim {head_dim}");
    }
    // What it promises holds: the SIMD kernel serves such a cache (it counts its routes as
    // primitive or partitioned, the scalar kernel as the reference).
    if simd {
        let c = Case {
            head_dim: 64,
            hkv: 1,
            group: 2,
            q_len: 1,
            contexts: vec![40],
            causal: false,
            window: None,
            format: KvFormat::F16,
        };
        let b = build(&c, 3);
        let tables: Vec<&[u32]> = b.tables.iter().map(|t| t.as_slice()).collect();
        let p = AttentionParams {
            queries: &b.queries,
            num_seqs: 1,
            q_len: 1,
            num_heads: 2,
            block_tables: &tables,
            context_lens: &c.contexts,
            scale: 0.125,
            sliding_window: None,
            causal: false,
        };
        let mut out = vec![0f32; 128];
        let route = g.forward(&b.pages.layer(0), &p, &CacheCounters::default(), &mut out).unwrap();
        assert_ne!(route, AttentionRoute::Reference);
    }
    let scalar = GgmlAttention::new(GgmlSteps::ALL, pool).with_isa(None);
    assert!(!scalar.serves_fast(KvFormat::F16, 64));
    let ablated = GgmlAttention::new(GgmlSteps::NONE, pool);
    assert!(!ablated.serves_fast(KvFormat::F16, 64));
}

#[test]
fn other_formats_and_bad_shapes_are_errors() {
    let mut c = Case {
        head_dim: 64,
        hkv: 1,
        group: 1,
        q_len: 1,
        contexts: vec![20],
        causal: false,
        window: None,
        format: KvFormat::Q8,
    };
    let run = |c: &Case, queries: Option<usize>| {
        let b = build(c, 1);
        let tables: Vec<&[u32]> = b.tables.iter().map(|t| t.as_slice()).collect();
        let q = &b.queries[..queries.unwrap_or(b.queries.len())];
        let p = AttentionParams {
            queries: q,
            num_seqs: 1,
            q_len: 1,
            num_heads: 1,
            block_tables: &tables,
            context_lens: &c.contexts,
            scale: 0.125,
            sliding_window: None,
            causal: false,
        };
        let mut out = vec![0f32; 64];
        attention(&b.pages.layer(0), &p, GgmlSteps::ALL, &mut out)
    };
    let e = run(&c, None).unwrap_err().to_string();
    assert!(e.contains(ATTN_NUMERICS_ENV) && e.contains("f16 KV cache") && e.contains("q8"), "{e}");
    c.format = KvFormat::F16;
    assert!(run(&c, None).is_ok());
    assert!(matches!(run(&c, Some(63)), Err(AttentionError::Shape { what: "queries", .. })));
}

#[test]
fn reduce16_folds_halves_pairwise() {
    // 2^24 + 1 + 1: the two ones meet first (lanes 1 and 9) and survive; summed left to
    // right each would be lost to rounding against 2^24.
    let mut x = [0f32; 16];
    x[0] = 16_777_216.0;
    x[1] = 1.0;
    x[9] = 1.0;
    assert_eq!(reduce16(&x), 16_777_218.0);
    assert_eq!(x.iter().sum::<f32>(), 16_777_216.0);
    // Lanes 0 and 8 meet first: 2^24 + 1 is lost, then the lane-1 one.
    let mut y = [0f32; 16];
    y[0] = 16_777_216.0;
    y[8] = 1.0;
    y[4] = 1.0;
    assert_eq!(reduce16(&y), 16_777_216.0);
}

#[test]
fn vec_dot_order_folds_accumulators_before_lanes() {
    // Element i goes to accumulator (i mod 64) / 16; accumulators 0 and 2 are added first.
    let mut a = vec![0f32; 64];
    let b = vec![1f32; 64];
    a[0] = 16_777_216.0;
    a[32] = 1.0; // accumulator 2, lane 0: lost against 2^24
    a[16] = 1.0; // accumulator 1, lane 0
    a[48] = 1.0; // accumulator 3, lane 0: meets the other one first, 2 survives
    assert_eq!(dot_vec_f16(&a, &b), 16_777_218.0);
    // tinyBLAS adds them to lane 0 in order: every one is lost.
    assert_eq!(dot_tinyblas(&a, &b), 16_777_216.0);
    // Leftovers past 64 are added in f64.
    let mut a = vec![0f32; 66];
    a[0] = 16_777_216.0;
    a[64] = 1.0;
    a[65] = 1.0;
    assert_eq!(dot_vec_f16(&a, &[1f32; 66]), 16_777_218.0);
}

#[test]
fn softmax_sum_groups_by_absolute_position() {
    let e = [16_777_216.0f32, 1.0, 1.0];
    // Positions 15, 16, 17: the big value is alone in its group, the ones meet.
    assert_eq!(softmax_sum(&e, 15), 16_777_218.0);
    // Positions 0, 1, 2, one group: z = [2^24, 1, 1, 0], (2^24 + 1) + (1 + 0) loses both.
    assert_eq!(softmax_sum(&e, 0), 16_777_216.0);
}
