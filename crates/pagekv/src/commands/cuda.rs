//! Subcommands on the CUDA device (feature `cuda`): the attention benchmark of
//! `pagekv-cuda` (decode over scattered pages, every format, with read/copy roofline rows).

use anyhow::Result;

/// `pagekv bench attention --device cuda:N`.
#[cfg(feature = "cuda")]
pub fn bench_attention(
    device: usize,
    json_out: bool,
    formats: Option<&str>,
    shapes: Option<&str>,
    runs: usize,
) -> Result<()> {
    use pagekv_cuda::bench::{bench_attention, BenchConfig};
    use pagekv_cuda::CudaDevice;

    let dev = CudaDevice::new(device)?;
    let mut cfg = BenchConfig { runs: runs.max(1), ..Default::default() };
    if let Some(f) = formats {
        cfg.formats = super::parse_formats(f)?;
    }
    if let Some(s) = shapes {
        cfg.cases = super::parse_shapes(s)?;
    }
    let rows = bench_attention(&dev, &cfg)?;
    if json_out {
        for r in &rows {
            println!("{}", r.to_json());
        }
    } else {
        println!(
            "CUDA decode attention, {} q heads / {} kv heads × {}, block {} (median of {} runs)",
            cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, cfg.block_size, cfg.runs
        );
        println!(
            "{:<14} {:<12} {:>6} {:>8} {:>10} {:>12} {:>8}",
            "impl", "format", "batch", "context", "µs", "KV bytes", "GB/s"
        );
        for r in &rows {
            println!(
                "{:<14} {:<12} {:>6} {:>8} {:>10.1} {:>12} {:>8.0}",
                r.impl_name,
                r.format,
                r.batch,
                r.context,
                r.ms * 1e3,
                r.kv_bytes,
                r.gbps
            );
        }
    }
    Ok(())
}

/// `pagekv bench attention --device cuda:N` in a build without CUDA.
#[cfg(not(feature = "cuda"))]
pub fn bench_attention(
    _device: usize,
    _json: bool,
    _formats: Option<&str>,
    _shapes: Option<&str>,
    _runs: usize,
) -> Result<()> {
    anyhow::bail!("this pagekv was built without CUDA; rebuild with `cargo build --release -p pagekv --features cuda`")
}
