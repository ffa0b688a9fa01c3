//! Runs `pagekv_cpu::attention::bench::bench_attention` and prints one line per row
//! (until the `pagekv bench attention --json` command exists).
//!
//! `cargo run --release -p pagekv-cpu --example attention_bench -- [shapes] [formats] [impls] [runs]`
//! e.g. `-- 1x4096,16x4096 f16,q8 primitive,partitioned 5`; `all` (or nothing) keeps the defaults.
//! `PAGEKV_DEV_ATTN_ISA=avx2|avx512`, `PAGEKV_PARTITION_SIZE` and `PAGEKV_THREADS` are honoured;
//! `PAGEKV_BENCH_KV_HEADS=n` measures n kv heads (4 query heads each) instead of 8,
//! `PAGEKV_BENCH_GROUP=g` g query heads per kv head, `PAGEKV_BENCH_HEAD_DIM=d` head_dim d.

use kvcache::KvFormat;
use pagekv_cpu::attention::bench::{bench_attention, BenchConfig};
use pagekv_cpu::attention::{AttnImpl, IsaChoice, ATTN_ISA_ENV};
use pagekv_cpu::threadpool::ThreadPool;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mut cfg = BenchConfig::default();
    let arg = |i: usize| args.get(i).filter(|a| a.as_str() != "all");
    if let Some(s) = arg(0) {
        cfg.shapes = s
            .split(',')
            .map(|x| {
                let (b, c) = x.split_once('x').ok_or("shape is BATCHxCONTEXT")?;
                Ok::<_, Box<dyn std::error::Error>>((b.parse()?, c.parse()?))
            })
            .collect::<Result<_, _>>()?;
    }
    if let Some(s) = arg(1) {
        cfg.formats = s
            .split(',')
            .map(|f| {
                if f.starts_with("turbo") && f != "turbo" {
                    parse_turbo(f)
                } else {
                    Ok(KvFormat::parse(f, KvFormat::F16)?)
                }
            })
            .collect::<Result<_, Box<dyn std::error::Error>>>()?;
    }
    if let Some(s) = arg(2) {
        cfg.impls = s.split(',').map(AttnImpl::parse).collect::<Result<_, _>>()?;
    }
    if let Some(s) = arg(3) {
        cfg.runs = s.parse()?;
    }
    if let Ok(v) = std::env::var("PAGEKV_PARTITION_SIZE") {
        cfg.partition_size = v.parse()?;
    }
    if let Ok(v) = std::env::var("PAGEKV_BENCH_KV_HEADS") {
        cfg.num_kv_heads = v.parse()?;
        cfg.num_heads = 4 * cfg.num_kv_heads;
    }
    if let Ok(v) = std::env::var("PAGEKV_BENCH_GROUP") {
        cfg.num_heads = v.parse::<usize>()? * cfg.num_kv_heads;
    }
    if let Ok(v) = std::env::var("PAGEKV_BENCH_HEAD_DIM") {
        cfg.head_dim = v.parse()?;
    }
    if let Ok(v) = std::env::var(ATTN_ISA_ENV) {
        cfg.isa = IsaChoice::parse(&v)?;
    }
    let pool = ThreadPool::global()?;
    println!(
        "{:<12} {:<11} {:>5} {:>7} {:>10} {:>12} {:>8} {:>10}",
        "impl", "format", "batch", "context", "ms", "kv_bytes", "GB/s", "cpu_ms"
    );
    for r in bench_attention(&cfg, pool)? {
        println!(
            "{:<12} {:<11} {:>5} {:>7} {:>10.4} {:>12} {:>8.2} {:>10.5}",
            r.impl_, r.format, r.batch, r.context, r.ms, r.kv_bytes, r.gbps, r.cpu_ms
        );
    }
    Ok(())
}

/// `turbo-kXvY`.
fn parse_turbo(f: &str) -> Result<KvFormat, Box<dyn std::error::Error>> {
    let rest = f.trim_start_matches("turbo-k");
    let (k, v) = rest.split_once('v').ok_or("turbo format is turbo-kXvY")?;
    Ok(KvFormat::Turbo { k_bits: k.parse()?, v_bits: v.parse()? })
}
