//! Subcommands on the CUDA device (feature `cuda`): the attention benchmark of
//! `pagekv-cuda` (decode over scattered pages, every format, with read/copy roofline rows) and
//! `pagekv run` on the GPU model (`pagekv_model::cuda::CudaModel`). Without the feature each is
//! one clear error. `bench decode --device cuda` is in `bench_decode_cuda.rs`.

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

/// The weight type of the GPU model: `PAGEKV_CUDA_WEIGHTS` (`bf16`, the default, or `f32`).
#[cfg(feature = "cuda")]
pub(crate) fn weight_dtype() -> Result<pagekv_cuda::DType> {
    match std::env::var("PAGEKV_CUDA_WEIGHTS") {
        Ok(v) if !v.trim().is_empty() => {
            Ok(pagekv_cuda::DType::parse(v.trim()).map_err(|e| anyhow::anyhow!("PAGEKV_CUDA_WEIGHTS: {e}"))?)
        }
        _ => Ok(pagekv_cuda::DType::Bf16),
    }
}

/// The KV format on the GPU: bf16 unless `--kv-quant` / `PAGEKV_KV_QUANT` says otherwise.
#[cfg(feature = "cuda")]
fn gpu_cache(mut cfg: kvcache::CacheConfig) -> kvcache::CacheConfig {
    if std::env::var("PAGEKV_KV_QUANT").map_or(true, |v| v.trim().is_empty()) {
        cfg.format = kvcache::KvFormat::Bf16;
    }
    cfg
}

/// `pagekv run --device cuda:N`: the loaded model's weights moved to the GPU, then the same
/// generation loop as on the CPU.
#[cfg(feature = "cuda")]
pub fn run_model(
    device: usize,
    model: pagekv_model::Model,
    tok: &pagekv_model::tokenizer::Tokenizer,
    ids: &[u32],
    sampling: &super::generation::SamplingArgs,
    verbose: bool,
) -> Result<()> {
    use std::io::Write;

    use pagekv_cuda::CudaDevice;
    use pagekv_engine::Generator;
    use pagekv_model::cuda::CudaModel;
    use pagekv_model::Forward;

    let cache = gpu_cache(crate::load::cache_config(&model)?);
    let dev = CudaDevice::new(device)?;
    let gpu_model = CudaModel::from_model(&model, dev, weight_dtype()?)?;
    drop(model);
    let mut generator = Generator::new(gpu_model, cache)?;
    let mut out = std::io::stdout().lock();
    let stats = super::generation::generate(&mut generator, tok, ids, sampling, |s| {
        out.write_all(s.as_bytes())?;
        out.flush()?;
        Ok(())
    })?;
    writeln!(out)?;
    if verbose {
        eprintln!("pagekv: {}", generator.model().device_label());
        eprintln!("pagekv: {}", stats.summary());
        eprintln!("pagekv: {}", super::cache_summary(generator.pool()));
    }
    Ok(())
}

/// `pagekv run --device cuda` in a build without CUDA.
#[cfg(not(feature = "cuda"))]
pub fn run_model(
    _device: usize,
    _model: pagekv_model::Model,
    _tok: &pagekv_model::tokenizer::Tokenizer,
    _ids: &[u32],
    _sampling: &super::generation::SamplingArgs,
    _verbose: bool,
) -> Result<()> {
    anyhow::bail!("this pagekv was built without CUDA; rebuild with `cargo build --release -p pagekv --features cuda`")
}
