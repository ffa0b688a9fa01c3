//! Times one attention call of the fast numerics (`Attention`, auto route) against the
//! ggml-numerics kernels (SIMD on each instruction set, and the scalar reference) over an f16
//! cache, decode (one query token per sequence) and a prefill chunk.
//!
//! `cargo run --release -p pagekv-cpu --example ggml_attention_bench -- [contexts] [threads] [reps] [kernel] [q_lens]`
//! e.g. `-- 128,4096 1,2 200` (`kernel`: only the kernels whose name contains it). Shape: SmolLM2-135M (9 query heads over 3 kv heads, head_dim 64);
//! `PAGEKV_BENCH_SHAPE=llama8b` takes 32 over 8, head_dim 128; `one`: 3 over 1, head_dim 64. Prints the best of 15 rounds of
//! `reps` calls (µs per call), wall time and the calling thread's CPU time: on a shared machine
//! the minimum is the least disturbed figure, and with one thread the CPU time leaves out the
//! time other processes held the core.

use std::sync::Arc;
use std::time::Instant;

use kvcache::{CacheCounters, HostPages, KvFormat, PageGeometry, PageStore};
use pagekv_cpu::attention::ggml::{GgmlAttention, GgmlSteps};
use pagekv_cpu::attention::{Attention, AttentionConfig, AttentionParams, AttnNumerics, KernelIsa};
use pagekv_cpu::threadpool::ThreadPool;

/// CPU time of the calling thread, ns (`/proc/thread-self/schedstat`; 0 where unreadable): on a
/// shared machine it counts only the time this thread ran.
fn cpu_ns() -> u64 {
    std::fs::read_to_string("/proc/thread-self/schedstat")
        .ok()
        .and_then(|s| s.split_whitespace().next().and_then(|x| x.parse().ok()))
        .unwrap_or(0)
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let list = |i: usize, default: &str| -> Vec<usize> {
        args.get(i).map_or(default, |s| s.as_str()).split(',').map(|x| x.parse().expect("a number")).collect()
    };
    let contexts = list(0, "128,4096");
    let threads = list(1, "1,2");
    let reps = list(2, "200")[0];
    // Only kernels whose name contains this (e.g. `avx512`, `fast`): for `perf stat`.
    let only = args.get(3).cloned().unwrap_or_default();
    // Query tokens per call: 1 (decode) and a 64-token prefill chunk unless `q_lens` given.
    let q_lens = list(4, "1,64");
    // `PAGEKV_BENCH_LAYERS=n`: n layers of KV, each call on the next one, so that at long
    // contexts the pages come from DRAM as in the model (30 layers at 4096: 94 MB).
    let layers: usize = std::env::var("PAGEKV_BENCH_LAYERS").ok().map_or(1, |s| s.parse().expect("a number"));
    let (hkv, group, d) = match std::env::var("PAGEKV_BENCH_SHAPE").as_deref() {
        Ok("llama8b") => (8, 4, 128),
        Ok("one") => (1, 3, 64),
        _ => (3, 3, 64),
    };
    let bs = 16;
    println!(
        "{:<8} {:>7} {:>7} {:>7} {:<16} {:>10} {:>12}",
        "threads", "context", "q_len", "seqs", "kernel", "us/call", "caller cpu us"
    );
    for &ctx in &contexts {
        let blocks = ctx.div_ceil(bs) + 1;
        let geometry = PageGeometry {
            num_layers: layers,
            num_blocks: blocks,
            block_size: bs,
            num_kv_heads: hkv,
            head_dim: d,
            format: KvFormat::F16,
            rotation_seed: 0,
        };
        let mut pages = HostPages::new(geometry);
        let mut x = 0x2545_f491_4f6c_dd1du64;
        let mut rnd = move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0
        };
        let slots: Vec<u32> = (0..ctx as u32).collect();
        let kv: Vec<f32> = (0..ctx * hkv * d).map(|_| rnd()).collect();
        for l in 0..layers {
            pages.write(l, &slots, &kv, &kv);
        }
        let table: Vec<u32> = (0..blocks as u32).collect();
        let tables = [table.as_slice()];
        let views: Vec<_> = (0..layers).map(|l| pages.layer(l)).collect();
        let mut next_layer = 0usize;
        let mut layer_of_call = move || {
            next_layer = (next_layer + 1) % layers;
            next_layer
        };
        for &n_threads in &threads {
            let pool = Arc::new(ThreadPool::new(n_threads));
            for q_len in q_lens.iter().map(|&q| q.min(ctx)) {
                let queries: Vec<f32> = (0..q_len * hkv * group * d).map(|_| 3.0 * rnd()).collect();
                let lens = [ctx];
                let p = AttentionParams {
                    queries: &queries,
                    num_seqs: 1,
                    q_len,
                    num_heads: hkv * group,
                    block_tables: &tables,
                    context_lens: &lens,
                    scale: 1.0 / (d as f32).sqrt(),
                    sliding_window: None,
                    causal: q_len > 1,
                };
                let mut out = vec![0f32; queries.len()];
                let counters = CacheCounters::default();
                let mut time = |f: &mut dyn FnMut(&mut [f32])| -> (f64, f64) {
                    let (mut best, mut best_cpu) = (f64::INFINITY, f64::INFINITY);
                    let reps = if q_len > 1 { (reps / 20).max(2) } else { reps };
                    for _ in 0..15 {
                        let (t, c) = (Instant::now(), cpu_ns());
                        for _ in 0..reps {
                            f(&mut out);
                        }
                        best = best.min(t.elapsed().as_secs_f64() * 1e6 / reps as f64);
                        best_cpu = best_cpu.min((cpu_ns() - c) as f64 * 1e-3 / reps as f64);
                    }
                    (best, best_cpu)
                };
                if "fast".contains(&only) {
                    let config = AttentionConfig { numerics: AttnNumerics::Fast, ..AttentionConfig::default() };
                    let mut fast = Attention::new(config, pool.clone());
                    let (us, cpu) = time(&mut |o| {
                        fast.forward(&views[layer_of_call()], &p, &counters, o).unwrap();
                    });
                    println!("{n_threads:<8} {ctx:>7} {q_len:>7} {:>7} {:<16} {us:>10.2} {cpu:>12.2}", 1, "fast");
                }
                let mut kernels: Vec<(String, GgmlAttention)> = KernelIsa::ALL
                    .into_iter()
                    .filter(KernelIsa::is_available)
                    .map(|isa| {
                        let k = GgmlAttention::new(GgmlSteps::ALL, pool.clone()).with_isa(Some(isa));
                        (format!("ggml-{}", isa.name()), k)
                    })
                    .collect();
                if ctx <= 512 || q_len == 1 {
                    kernels
                        .push(("ggml-scalar".into(), GgmlAttention::new(GgmlSteps::ALL, pool.clone()).with_isa(None)));
                }
                for (name, k) in kernels.iter_mut().filter(|(name, _)| name.contains(&only)) {
                    let (us, cpu) = time(&mut |o| {
                        k.forward(&views[layer_of_call()], &p, o).unwrap();
                    });
                    println!("{n_threads:<8} {ctx:>7} {q_len:>7} {:>7} {name:<16} {us:>10.2} {cpu:>12.2}", 1);
                }
            }
        }
    }
}
