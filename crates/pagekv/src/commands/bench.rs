//! `pagekv bench cache | attention | decode | serve`: measurements printed as a table, or as
//! one JSON object per row with `--json`.

use anyhow::Result;
use kvcache::bench::{bench_cache, CacheBenchConfig};
use pagekv_cpu::attention::bench::{bench_attention, BenchConfig};
use pagekv_cpu::attention::AttnImpl;
use pagekv_cpu::threadpool::ThreadPool;
use serde_json::json;

use crate::commands::{parse_formats, parse_shapes, AttentionOpts};
use crate::device::Device;

/// `pagekv bench cache`.
pub fn cache(json_out: bool, formats: Option<&str>, runs: usize, geometry: (usize, usize, usize)) -> Result<()> {
    let (num_layers, num_kv_heads, head_dim) = geometry;
    if head_dim % 32 != 0 {
        anyhow::bail!("invalid --head-dim {head_dim}: must be a multiple of 32 (the quantization group)");
    }
    let mut cfg = CacheBenchConfig { runs, num_layers, num_kv_heads, head_dim, ..Default::default() };
    if let Some(f) = formats {
        cfg.formats = parse_formats(f)?;
    }
    let rows = bench_cache(&cfg)?;
    if json_out {
        for r in &rows {
            let v = json!({
                "format": r.format,
                "kv_heads": cfg.num_kv_heads,
                "head_dim": cfg.head_dim,
                "bytes_per_token": r.bytes_per_token,
                "scale_bytes_per_token": r.scale_bytes_per_token,
                "ratio_vs_f16": round(r.ratio_vs_f16, 4),
                "append_gbps": round(r.append_gbps_decode.min(r.append_gbps_prefill), 3),
                "append_gbps_decode": round(r.append_gbps_decode, 3),
                "append_gbps_prefill": round(r.append_gbps_prefill, 3),
                "decode_append_us_per_token": round(r.decode_append_us, 3),
                "layers": cfg.num_layers,
            });
            println!("{v}");
        }
        return Ok(());
    }
    println!(
        "KV cache, per layer, {} kv heads × head_dim {}; appends into {} layers (median of {} runs)",
        cfg.num_kv_heads, cfg.head_dim, cfg.num_layers, cfg.runs
    );
    println!(
        "{:<12} {:>10} {:>8} {:>10} {:>13} {:>14} {:>16}",
        "format", "B/token", "scales", "vs f16", "decode GB/s", "prefill GB/s", "µs/token (all L)"
    );
    for r in &rows {
        println!(
            "{:<12} {:>10} {:>8} {:>10.3} {:>13.2} {:>14.2} {:>16.2}",
            r.format,
            r.bytes_per_token,
            r.scale_bytes_per_token,
            r.ratio_vs_f16,
            r.append_gbps_decode,
            r.append_gbps_prefill,
            r.decode_append_us
        );
    }
    Ok(())
}

/// `pagekv bench attention`.
pub fn attention(json_out: bool, device: Device, opts: AttentionOpts<'_>) -> Result<()> {
    if let Device::Cuda(n) = device {
        return crate::commands::cuda::bench_attention(n, json_out, &opts);
    }
    if opts.programmatic {
        anyhow::bail!("--programmatic times GPU kernel launches: use it with --device cuda");
    }
    if opts.cooldown_ms.is_some() {
        anyhow::bail!("--cooldown-ms rests the GPU's power budget between rows: use it with --device cuda");
    }
    let AttentionOpts { formats, shapes, impls, runs, .. } = opts;
    let mut cfg = BenchConfig { runs, ..Default::default() };
    if let Some(f) = formats {
        cfg.formats = parse_formats(f)?;
    }
    if let Some(s) = shapes {
        cfg.shapes = parse_shapes(s)?;
    }
    if let Some(i) = impls {
        cfg.impls = i.split(',').map(|s| AttnImpl::parse(s.trim())).collect::<Result<_, _>>()?;
    }
    let pool = ThreadPool::global()?;
    let rows = bench_attention(&cfg, pool)?;
    if json_out {
        for r in &rows {
            let v = json!({
                "impl": r.impl_, "format": r.format, "batch": r.batch, "context": r.context,
                "ms": round(r.ms, 4), "kv_bytes": r.kv_bytes, "gbps": round(r.gbps, 2),
                "heads": cfg.num_heads, "kv_heads": cfg.num_kv_heads, "head_dim": cfg.head_dim,
                "block_size": cfg.block_size, "threads": pool.n_threads(),
            });
            println!("{v}");
        }
        return Ok(());
    }
    println!(
        "decode attention, {} q heads / {} kv heads × {}, block {}, {} threads (median of {} runs)",
        cfg.num_heads,
        cfg.num_kv_heads,
        cfg.head_dim,
        cfg.block_size,
        pool.n_threads(),
        cfg.runs
    );
    println!(
        "{:<12} {:<12} {:>6} {:>8} {:>10} {:>12} {:>8}",
        "impl", "format", "batch", "context", "ms", "KV bytes", "GB/s"
    );
    for r in &rows {
        println!(
            "{:<12} {:<12} {:>6} {:>8} {:>10.3} {:>12} {:>8.1}",
            r.impl_, r.format, r.batch, r.context, r.ms, r.kv_bytes, r.gbps
        );
    }
    Ok(())
}

pub fn round(x: f64, digits: i32) -> f64 {
    let m = 10f64.powi(digits);
    (x * m).round() / m
}
