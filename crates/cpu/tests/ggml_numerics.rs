//! The ggml numerics themselves: how far each rounding step takes them from the reference,
//! that every step can be switched, the summation orders they reproduce (`reduce16`, the two
//! dot-product orders, the softmax sum), which calls the SIMD kernel serves, and the errors of
//! the scalar kernel.

mod attention_common;

use std::sync::Arc;

use attention_common::{assert_bits, build, rel_error, Case};
use kvcache::KvFormat;
use pagekv_cpu::attention::ggml::{
    attention, dot_tinyblas, dot_vec_f16, reduce16, softmax_sum, GgmlAttention, GgmlKernel, GgmlSteps,
};
use pagekv_cpu::attention::{reference, AttentionError, ATTN_NUMERICS_ENV};
use pagekv_cpu::threadpool::ThreadPool;

/// Head sizes, GQA, decode and prefill, windows on and off, and one call of short contexts.
fn cases() -> Vec<Case> {
    let mut v = Vec::new();
    for (head_dim, hkv, group) in [(64, 3, 3), (80, 2, 1), (128, 1, 4), (96, 2, 2)] {
        for (q_len, causal) in [(1, false), (7, true), (33, true)] {
            for window in [None, Some(40)] {
                v.push(Case { causal, window, ..Case::f16(head_dim, hkv, group, q_len, vec![300, 41 + q_len], 0) });
            }
        }
    }
    v.push(Case { causal: false, ..Case::f16(64, 1, 2, 1, vec![1, 17, 64, 65], 0) });
    v
}

/// Runs `c` (with `seed`) through the reference and the scalar ggml kernel with `steps`;
/// asserts the pooled scalar kernel computes the same bits; returns the worst relative error
/// of the ggml numerics against the reference.
fn ggml_error(c: &Case, steps: GgmlSteps, seed: u64) -> f32 {
    let c = Case { seed, ..c.clone() };
    let b = build(&c);
    let tables = b.tables();
    let p = b.params(&c, &tables);
    let layer = b.pages.layer(0);
    let mut want = vec![f32::NAN; b.queries.len()];
    reference::attention(&layer, &p, &mut want);
    let mut got = vec![f32::NAN; b.queries.len()];
    attention(&layer, &p, steps, &mut got).unwrap();
    let mut pooled = vec![f32::NAN; b.queries.len()];
    GgmlAttention::new(steps, Arc::new(ThreadPool::new(2))).forward(&layer, &p, &mut pooled).unwrap();
    assert_bits(&pooled, &got, "pooled ggml kernel");
    rel_error(&got, &want, c.head_dim)
}

#[test]
fn ggml_numerics_stay_within_f16_rounding_of_the_reference() {
    // With every step on, the error is that of f16 queries and f16 probabilities (each a
    // relative 2^-11 at most; measured up to 1.8e-3 of the head's largest output); the
    // summation orders add f32 rounding only.
    let mut worst = 0f32;
    for (i, c) in cases().iter().enumerate() {
        let e = ggml_error(c, GgmlSteps::ALL, 100 + i as u64);
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
        let e = ggml_error(c, steps, 200 + i as u64);
        assert!(e < 3e-6, "case {i}: {e}");
        let e2 = ggml_error(c, GgmlSteps::NONE, 300 + i as u64);
        assert!(e2 < 1.5e-6, "case {i} (no step): {e2}");
    }
}

#[test]
fn every_step_changes_some_output_bits() {
    // A step whose switch changes nothing would be a step the ablation cannot measure.
    let c = Case { seed: 7, ..cases()[2].clone() }; // head_dim 64, q_len 7, causal
    let b = build(&c);
    let tables = b.tables();
    let p = b.params(&c, &tables);
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

/// `serves_fast` (what `auto` follows) holds exactly for unrotated f16 caches of a head size
/// the SIMD kernel takes, with every step on and an instruction set for it.
#[test]
fn serves_fast_needs_f16_a_simd_head_size_every_step_and_an_isa() {
    let pool = ThreadPool::global().unwrap();
    let mut g = GgmlAttention::new(GgmlSteps::ALL, pool);
    let simd = g.isa().is_some();
    assert_eq!(g.serves_fast(KvFormat::F16, 64), simd);
    assert_eq!(g.serves_fast(KvFormat::F16, 128), simd);
    assert_eq!(g.serves_fast(KvFormat::F16, 512), simd);
    for (format, head_dim) in [(KvFormat::F16, 40), (KvFormat::F16, 528), (KvFormat::Q8, 64), (KvFormat::F32, 64)] {
        assert!(!g.serves_fast(format, head_dim), "{format:?} head_dim {head_dim}");
    }
    // What it promises holds: the SIMD kernel serves such a cache.
    if simd {
        let c = Case { causal: false, ..Case::f16(64, 1, 2, 1, vec![40], 3) };
        let b = build(&c);
        let tables = b.tables();
        let mut out = vec![0f32; b.queries.len()];
        let kernel = g.forward(&b.pages.layer(0), &b.params(&c, &tables), &mut out).unwrap();
        assert_ne!(kernel, GgmlKernel::Scalar);
    }
    let scalar = GgmlAttention::new(GgmlSteps::ALL, pool).with_isa(None);
    assert!(!scalar.serves_fast(KvFormat::F16, 64));
    let ablated = GgmlAttention::new(GgmlSteps::NONE, pool);
    assert!(!ablated.serves_fast(KvFormat::F16, 64));
}

#[test]
fn other_formats_and_bad_shapes_are_errors() {
    let run = |format: KvFormat, queries: Option<usize>| {
        let c = Case { format, causal: false, ..Case::f16(64, 1, 1, 1, vec![20], 1) };
        let b = build(&c);
        let tables = b.tables();
        let mut p = b.params(&c, &tables);
        p.queries = &b.queries[..queries.unwrap_or(b.queries.len())];
        let mut out = vec![0f32; 64];
        attention(&b.pages.layer(0), &p, GgmlSteps::ALL, &mut out)
    };
    let e = run(KvFormat::Q8, None).unwrap_err().to_string();
    assert!(e.contains(ATTN_NUMERICS_ENV) && e.contains("f16 KV cache") && e.contains("q8"), "{e}");
    assert!(run(KvFormat::F16, None).is_ok());
    assert!(matches!(run(KvFormat::F16, Some(63)), Err(AttentionError::Shape { what: "queries", .. })));
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
