//! Routing (the ggml route included), configuration, counters, input errors and the fallback
//! warning of `Attention::forward`.

mod attention_common;

use std::process::Command;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;

use attention_common::{build, rel_error, Case};
use kvcache::{AttentionRoute, CacheCounters, FallbackReason, KvFormat, NULL_BLOCK};
use pagekv_cpu::attention::ggml::GgmlSteps;
use pagekv_cpu::attention::{
    round_to_cache, router, Attention, AttentionConfig, AttentionError, AttentionParams, AttnImpl, AttnNumerics,
    IsaChoice, KernelIsa, RouterConfig, ATTN_IMPL_ENV, ATTN_ISA_ENV, ATTN_NUMERICS_ENV, PARTITION_SIZE_ENV,
    PARTITION_THRESHOLD_ENV,
};
use pagekv_cpu::threadpool::ThreadPool;

fn case(format: KvFormat, head_dim: usize, context: usize, q_len: usize) -> Case {
    Case {
        format,
        head_dim,
        num_kv_heads: 2,
        group: 4,
        q_len,
        causal: true,
        contexts: Case::pair(context, q_len),
        window: None,
        block_size: 16,
        partition_size: 512,
        seed: 42,
    }
}

fn config(impl_: AttnImpl) -> AttentionConfig {
    AttentionConfig { impl_, ..AttentionConfig::default() }
}

#[test]
fn env_values_are_parsed_and_bad_ones_list_the_accepted_values() {
    let env = |pairs: &'static [(&'static str, &'static str)]| {
        move |k: &str| pairs.iter().find(|(n, _)| *n == k).map(|(_, v)| v.to_string())
    };
    let c = AttentionConfig::from_lookup(env(&[
        (ATTN_IMPL_ENV, "Partitioned"),
        (PARTITION_SIZE_ENV, "256"),
        (PARTITION_THRESHOLD_ENV, "2048"),
    ]))
    .unwrap();
    assert_eq!(c.impl_, AttnImpl::Partitioned);
    assert_eq!(c.router, RouterConfig { partition_size: 256, partition_threshold: 2048 });
    assert_eq!(AttentionConfig::from_lookup(env(&[])).unwrap(), AttentionConfig::default());
    let err = AttentionConfig::from_lookup(env(&[(ATTN_IMPL_ENV, "fast")])).unwrap_err().to_string();
    for word in ["fast", "auto", "reference", "primitive", "partitioned"] {
        assert!(err.contains(word), "{err}");
    }
    let err = AttentionConfig::from_lookup(env(&[(PARTITION_SIZE_ENV, "0")])).unwrap_err().to_string();
    assert!(err.contains(PARTITION_SIZE_ENV) && err.contains("positive"), "{err}");

    let numerics = |v: &'static str| {
        AttentionConfig::from_lookup(move |k: &str| (k == ATTN_NUMERICS_ENV).then(|| v.to_string())).map(|c| c.numerics)
    };
    assert_eq!(numerics("fast"), Ok(AttnNumerics::Fast));
    assert_eq!(numerics(" GGML "), Ok(AttnNumerics::Ggml(GgmlSteps::ALL)));
    assert_eq!(numerics("Auto"), Ok(AttnNumerics::Auto));
    assert_eq!(AttentionConfig::default().numerics, AttnNumerics::Auto);
    for n in [AttnNumerics::Auto, AttnNumerics::Fast, AttnNumerics::Ggml(GgmlSteps::ALL)] {
        assert_eq!(AttnNumerics::parse(n.name()), Ok(n));
    }
    let e = numerics("exact").unwrap_err().to_string();
    assert!(e.contains(ATTN_NUMERICS_ENV) && e.contains("\"exact\"") && e.contains("auto, fast, ggml"), "{e}");
    assert!(AttnNumerics::parse("").is_err());
}

#[test]
fn isa_is_parsed_and_a_pinned_isa_serves_the_call_or_falls_back_as_unsupported_cpu() {
    let lookup = |v: &'static str| move |k: &str| (k == ATTN_ISA_ENV).then(|| v.to_string());
    assert_eq!(AttentionConfig::from_lookup(lookup("AVX2")).unwrap().isa, IsaChoice::Only(KernelIsa::Avx2));
    assert_eq!(AttentionConfig::from_lookup(lookup("avx512")).unwrap().isa, IsaChoice::Only(KernelIsa::Avx512));
    assert_eq!(AttentionConfig::from_lookup(lookup(" auto ")).unwrap().isa, IsaChoice::Auto);
    let err = AttentionConfig::from_lookup(lookup("sse")).unwrap_err().to_string();
    for word in ["sse", ATTN_ISA_ENV, "auto", "avx2", "avx512"] {
        assert!(err.contains(word), "{err}");
    }
    assert_eq!(IsaChoice::Auto.resolve(), KernelIsa::detect());

    let pool = Arc::new(ThreadPool::new(2));
    let c = case(KvFormat::F16, 128, 300, 1);
    let built = build(&c);
    let tables = built.tables();
    let layer = built.pages.layer(0);
    let p = built.params(&c, &tables);
    for isa in KernelIsa::ALL {
        let counters = CacheCounters::default();
        let cfg =
            AttentionConfig { impl_: AttnImpl::Primitive, isa: IsaChoice::Only(isa), ..AttentionConfig::default() };
        let mut out = vec![f32::NAN; built.queries.len()];
        let route = Attention::new(cfg, pool.clone()).forward(&layer, &p, &counters, &mut out).unwrap();
        let fallbacks = counters.fallbacks[FallbackReason::UnsupportedCpu as usize].load(Relaxed);
        if isa.is_available() {
            assert_eq!((route, fallbacks), (AttentionRoute::Primitive, 0), "{isa:?}");
        } else {
            assert_eq!((route, fallbacks), (AttentionRoute::Reference, 1), "{isa:?}");
        }
        assert!(out.iter().all(|x| x.is_finite()), "{isa:?}: output not written");
    }
}

#[test]
fn override_is_honoured_and_routes_partitions_and_decoded_tokens_are_counted() {
    let pool = Arc::new(ThreadPool::new(2));
    let c = case(KvFormat::Q8, 64, 1000, 1);
    let built = build(&c);
    let tables = built.tables();
    let layer = built.pages.layer(0);
    let p = built.params(&c, &tables);
    let counters = CacheCounters::default();
    let mut out = vec![0f32; built.queries.len()];
    for (impl_, route) in [
        (AttnImpl::Reference, AttentionRoute::Reference),
        (AttnImpl::Primitive, AttentionRoute::Primitive),
        (AttnImpl::Partitioned, AttentionRoute::Partitioned),
    ] {
        let got = Attention::new(config(impl_), pool.clone()).forward(&layer, &p, &counters, &mut out).unwrap();
        assert_eq!(got, route);
    }
    for route in AttentionRoute::ALL {
        // A q8 cache is never served by the ggml route.
        let want = (route != AttentionRoute::Ggml) as u64;
        assert_eq!(counters.attention_calls[route as usize].load(Relaxed), want, "{route:?}");
    }
    // Contexts 1000 and 501: partitions of 512 at multiples of 512 → 2 + 1, per kv head.
    assert_eq!(counters.partitions.load(Relaxed), 3 * 2);
    // Three calls, each decoding (1000 + 501) positions × 2 kv heads.
    assert_eq!(counters.dequantized_tokens.load(Relaxed), 3 * 1501 * 2);
    assert!(counters.fallbacks.iter().all(|f| f.load(Relaxed) == 0));
}

/// The ggml route is one of the router's routes: counted with the others, taken by `ggml`
/// numerics and by `auto` for an f16 cache the SIMD kernel serves (unless a setting picks among
/// the fast kernels), with its shares counted as partitions; `ggml` over another format is an
/// error naming the setting.
#[test]
fn ggml_is_a_route_chosen_by_the_numerics_and_counted() {
    let pool = Arc::new(ThreadPool::new(2));
    let c = case(KvFormat::F16, 64, 1000, 1);
    let built = build(&c);
    let tables = built.tables();
    let layer = built.pages.layer(0);
    let p = built.params(&c, &tables);
    let simd = KernelIsa::detect().is_some();
    let ggml = AttnNumerics::Ggml(GgmlSteps::ALL);
    let auto_route = if simd { AttentionRoute::Ggml } else { AttentionRoute::Primitive };
    let counters = CacheCounters::default();
    let mut out = vec![0f32; built.queries.len()];
    for (config, route) in [
        (AttentionConfig { numerics: AttnNumerics::Fast, ..config(AttnImpl::Reference) }, AttentionRoute::Reference),
        (AttentionConfig { numerics: AttnNumerics::Fast, ..config(AttnImpl::Auto) }, AttentionRoute::Primitive),
        (
            AttentionConfig { numerics: AttnNumerics::Fast, ..config(AttnImpl::Partitioned) },
            AttentionRoute::Partitioned,
        ),
        (AttentionConfig { numerics: ggml, ..config(AttnImpl::Partitioned) }, AttentionRoute::Ggml),
        (AttentionConfig::default(), auto_route),
        // A path picked among the fast kernels: `auto` runs it.
        (config(AttnImpl::Primitive), AttentionRoute::Primitive),
    ] {
        let mut attn = Attention::new(config, pool.clone());
        let numerics = attn.numerics_for(KvFormat::F16, 64);
        let got = attn.forward(&layer, &p, &counters, &mut out).unwrap();
        assert_eq!(got, route, "{config:?}");
        assert_eq!(numerics == ggml, route == AttentionRoute::Ggml, "{config:?}: {numerics:?}");
        assert_eq!(
            attn.numerics_for(KvFormat::Q8, 64),
            if config.numerics == ggml { ggml } else { AttnNumerics::Fast }
        );
    }
    let calls = |r: AttentionRoute| counters.attention_calls[r as usize].load(Relaxed);
    assert_eq!(calls(AttentionRoute::Ggml), 1 + simd as u64);
    assert_eq!(calls(AttentionRoute::Reference) + calls(AttentionRoute::Primitive), 3 + !simd as u64);
    assert!(counters.fallbacks.iter().all(|f| f.load(Relaxed) == 0));
    // Two sequences × 2 kv heads on 2 threads: the SIMD ggml kernel splits the decode rows.
    if simd {
        assert!(counters.partitions.load(Relaxed) > 0);
    }

    let c = case(KvFormat::Q8, 64, 100, 1);
    let built = build(&c);
    let tables = built.tables();
    let mut attn = Attention::new(AttentionConfig { numerics: ggml, ..AttentionConfig::default() }, pool);
    let e = attn.forward(&built.pages.layer(0), &built.params(&c, &tables), &counters, &mut out).unwrap_err();
    let e = e.to_string();
    assert!(e.contains(ATTN_NUMERICS_ENV) && e.contains("f16 KV cache") && e.contains("q8"), "{e}");
}

/// Under the fast numerics the queries are rounded to the K cache's precision before the call
/// (as ggml's K·Q sees them); under ggml's they are left to its kernels.
#[test]
fn queries_are_prepared_for_the_numerics_that_serve_the_layer() {
    let pool = Arc::new(ThreadPool::new(1));
    let c = case(KvFormat::F16, 64, 20, 1);
    let built = build(&c);
    let layer = built.pages.layer(0);
    let q: Vec<f32> = (0..64).map(|i| (i as f32 * 0.731).sin() * 3.3 + 1e-3).collect();
    let mut rounded = q.clone();
    round_to_cache(KvFormat::F16, &mut rounded);
    assert_ne!(rounded, q);
    for (numerics, want) in [(AttnNumerics::Fast, &rounded), (AttnNumerics::Ggml(GgmlSteps::ALL), &q)] {
        let attn = Attention::new(AttentionConfig { numerics, ..AttentionConfig::default() }, pool.clone());
        let mut got = q.clone();
        attn.prepare_queries(&layer, &mut got);
        assert_eq!(&got, want, "{numerics:?}");
    }
}

#[test]
fn auto_partitions_few_long_sequences_and_not_many_or_short_ones() {
    let c = case(KvFormat::F16, 64, 4096, 1);
    let built = build(&c);
    let tables = built.tables();
    let layer = built.pages.layer(0);
    let mut p = AttentionParams {
        num_seqs: 1,
        block_tables: &tables[..1],
        context_lens: &built.context_lens[..1],
        ..built.params(&c, &tables)
    };
    let cfg = RouterConfig::default();
    // 1 sequence × 2 kv heads, 4096 tokens: partitioned on 4 threads (two would idle), primitive
    // on 2 (one kv head per thread).
    assert_eq!(router::choose(&layer, &p, 4, &cfg), AttentionRoute::Partitioned);
    assert_eq!(router::choose(&layer, &p, 2, &cfg), AttentionRoute::Primitive);
    // A short window makes the read range short: primitive.
    p.sliding_window = Some(100);
    assert_eq!(router::choose(&layer, &p, 4, &cfg), AttentionRoute::Primitive);
    p.sliding_window = None;
    // A threshold above the context: primitive.
    let high = RouterConfig { partition_threshold: 8192, ..cfg };
    assert_eq!(router::choose(&layer, &p, 4, &high), AttentionRoute::Primitive);
    // Tasks that do not spread evenly (2 kv heads on 3 threads: busy 2/3 of the call):
    // partitioned; on 2 threads each takes one: primitive.
    assert_eq!(router::choose(&layer, &p, 3, &cfg), AttentionRoute::Partitioned);
    // Many sequences fill the threads: primitive.
    let tables16: Vec<&[u32]> = vec![tables[0]; 16];
    let ctx16 = vec![built.context_lens[0]; 16];
    let queries16: Vec<f32> = built.queries.iter().cycle().take(built.queries.len() * 8).copied().collect();
    p.num_seqs = 16;
    p.block_tables = &tables16;
    p.context_lens = &ctx16;
    p.queries = &queries16;
    assert_eq!(router::choose(&layer, &p, 4, &cfg), AttentionRoute::Primitive);
    // 15 sequences × 2 kv heads on 4 threads: 30 tasks, busy 30/32 of the call: primitive; 3
    // sequences (6 tasks, busy 6/8): partitioned.
    p.num_seqs = 15;
    assert_eq!(router::choose(&layer, &p, 4, &cfg), AttentionRoute::Primitive);
    p.num_seqs = 3;
    assert_eq!(router::choose(&layer, &p, 4, &cfg), AttentionRoute::Partitioned);
}

#[test]
fn bad_input_is_an_error_not_a_panic() {
    let pool = Arc::new(ThreadPool::new(2));
    let c = case(KvFormat::F16, 64, 40, 1);
    let built = build(&c);
    let tables = built.tables();
    let layer = built.pages.layer(0);
    let good = built.params(&c, &tables);
    let counters = CacheCounters::default();
    let mut attn = Attention::new(config(AttnImpl::Primitive), pool);
    let mut out = vec![0f32; built.queries.len()];
    assert!(attn.forward(&layer, &good, &counters, &mut out).is_ok());

    let mut short_out = vec![0f32; 3];
    assert!(matches!(attn.forward(&layer, &good, &counters, &mut short_out), Err(AttentionError::Shape { .. })));
    let p = AttentionParams { num_heads: 5, ..good };
    assert!(matches!(attn.forward(&layer, &p, &counters, &mut out), Err(AttentionError::HeadGroup { .. })));
    let p = AttentionParams { sliding_window: Some(0), ..good };
    assert_eq!(attn.forward(&layer, &p, &counters, &mut out), Err(AttentionError::ZeroWindow));
    let long = [built.context_lens[0] + 100, built.context_lens[1]];
    let p = AttentionParams { context_lens: &long, ..good };
    assert!(matches!(attn.forward(&layer, &p, &counters, &mut out), Err(AttentionError::BlockTableShort { .. })));
    let mut nulled = built.tables[0].clone();
    nulled[1] = NULL_BLOCK;
    let t2: Vec<&[u32]> = vec![&nulled, tables[1]];
    let p = AttentionParams { block_tables: &t2, ..good };
    assert!(matches!(attn.forward(&layer, &p, &counters, &mut out), Err(AttentionError::BadBlock { .. })));
    // The same NULL block is fine once a window keeps it out of reach (40 tokens, W = 8).
    let p = AttentionParams { block_tables: &t2, sliding_window: Some(8), ..good };
    assert!(attn.forward(&layer, &p, &counters, &mut out).is_ok());
    let mut wild = built.tables[0].clone();
    wild[0] = 1_000_000;
    let t3: Vec<&[u32]> = vec![&wild, tables[1]];
    let p = AttentionParams { block_tables: &t3, ..good };
    assert!(matches!(attn.forward(&layer, &p, &counters, &mut out), Err(AttentionError::BadBlock { .. })));
    let zero = [0usize, built.context_lens[1]];
    let p = AttentionParams { context_lens: &zero, ..good };
    assert!(matches!(attn.forward(&layer, &p, &counters, &mut out), Err(AttentionError::ContextTooShort { .. })));
}

/// Exact attention in f64 over the original (unquantized) K/V of `built`.
fn exact(built: &attention_common::Built, c: &Case) -> Vec<f32> {
    let (d, hkv, g) = (c.head_dim, c.num_kv_heads, c.group);
    let h = hkv * g;
    let mut out = vec![0f32; built.queries.len()];
    for seq in 0..2 {
        let ctx = built.context_lens[seq];
        for i in 0..c.q_len {
            let pos = ctx - c.q_len + i;
            for head in 0..h {
                let kvh = head / g;
                let q = &built.queries[((seq * c.q_len + i) * h + head) * d..][..d];
                let scores: Vec<f64> = (0..=pos)
                    .map(|t| {
                        let k = &built.keys[seq][(t * hkv + kvh) * d..][..d];
                        q.iter().zip(k).map(|(a, b)| *a as f64 * *b as f64).sum::<f64>() / (d as f64).sqrt()
                    })
                    .collect();
                let m = scores.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                let w: Vec<f64> = scores.iter().map(|s| (s - m).exp()).collect();
                let sum: f64 = w.iter().sum();
                let o = &mut out[((seq * c.q_len + i) * h + head) * d..][..d];
                for (j, o) in o.iter_mut().enumerate() {
                    let acc: f64 = (0..=pos).map(|t| w[t] * built.values[seq][(t * hkv + kvh) * d + j] as f64).sum();
                    *o = (acc / sum) as f32;
                }
            }
        }
    }
    out
}

#[test]
fn f16_and_bf16_storage_stay_close_to_exact_attention() {
    let pool = Arc::new(ThreadPool::new(2));
    for (format, bound) in [(KvFormat::F32, 1e-5), (KvFormat::F16, 2e-3), (KvFormat::Bf16, 2e-2)] {
        let c = case(format, 64, 300, 7);
        let built = build(&c);
        let tables = built.tables();
        let layer = built.pages.layer(0);
        let p = built.params(&c, &tables);
        let want = exact(&built, &c);
        let mut out = vec![f32::NAN; want.len()];
        Attention::new(config(AttnImpl::Primitive), pool.clone())
            .forward(&layer, &p, &CacheCounters::default(), &mut out)
            .unwrap();
        let err = rel_error(&out, &want, c.head_dim);
        eprintln!("{}: relative error vs exact f64 attention over the f32 inputs: {err:e}", format.name());
        assert!(err <= bound, "{}: {err:e} > {bound:e}", format.name());
    }
}

const CHILD_ENV: &str = "PAGEKV_TEST_FALLBACK_CHILD";

/// Runs in a child process (see below): three fallbacks for one reason, one for another.
#[test]
fn fallback_child() {
    if std::env::var(CHILD_ENV).is_err() {
        return; // only meaningful inside `fallback_warns_once_per_reason_and_counts_every_call`
    }
    let pool = Arc::new(ThreadPool::new(2));
    // head_dim 24: a valid cache geometry the fast kernels do not serve.
    let c = case(KvFormat::F16, 24, 50, 3);
    let built = build(&c);
    let tables = built.tables();
    let layer = built.pages.layer(0);
    let p = built.params(&c, &tables);
    let counters = CacheCounters::default();
    let mut want = vec![f32::NAN; built.queries.len()];
    Attention::new(config(AttnImpl::Reference), pool.clone()).forward(&layer, &p, &counters, &mut want).unwrap();
    for impl_ in [AttnImpl::Primitive, AttnImpl::Partitioned, AttnImpl::Auto] {
        let mut out = vec![f32::NAN; want.len()];
        let route = Attention::new(config(impl_), pool.clone()).forward(&layer, &p, &counters, &mut out).unwrap();
        assert_eq!(route, AttentionRoute::Reference);
        assert_eq!(out, want);
    }
    assert_eq!(counters.fallbacks[FallbackReason::UnsupportedHeadDim as usize].load(Relaxed), 3);
    assert_eq!(counters.attention_calls[AttentionRoute::Reference as usize].load(Relaxed), 4);
    eprintln!("child done");
}

#[test]
fn fallback_warns_once_per_reason_and_counts_every_call() {
    let exe = std::env::current_exe().unwrap();
    let out = Command::new(exe)
        .args(["--exact", "fallback_child", "--nocapture", "--test-threads=1"])
        .env(CHILD_ENV, "1")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "child failed:\n{stderr}\n{}", String::from_utf8_lossy(&out.stdout));
    assert!(stderr.contains("child done"), "{stderr}");
    let warnings = stderr.lines().filter(|l| l.contains("falls back to the reference path")).count();
    assert_eq!(warnings, 1, "{stderr}");
    assert!(stderr.contains("unsupported_head_dim") && stderr.contains("head_dim 24"), "{stderr}");
}
