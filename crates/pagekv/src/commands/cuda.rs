//! The CUDA device for the subcommands (feature `cuda`): the attention benchmark of
//! `pagekv-cuda` (decode over scattered pages, every format, with read/copy roofline rows),
//! `pagekv run` on the GPU model (`pagekv_model::cuda::CudaModel`), and [`GpuModel`] with the
//! functions that open the device and build it, which `chat`, `serve` and `eval` use to run the
//! same code over the GPU. Without the feature each is one clear error ([`NO_CUDA`]) and
//! [`GpuModel`] is an uninhabited stand-in, so the commands carry no `cfg` of their own.
//! `bench decode --device cuda` is in `bench_decode_cuda.rs`.

use anyhow::Result;
use pagekv_model::{Model, ModelError};

/// What every CUDA subcommand says in a build without the `cuda` feature.
pub const NO_CUDA: &str =
    "this pagekv was built without CUDA; rebuild with `cargo build --release -p pagekv --features cuda`";

/// Fails with [`NO_CUDA`] in a build without the feature (before any model is loaded).
pub fn require_build() -> Result<()> {
    if cfg!(feature = "cuda") {
        Ok(())
    } else {
        anyhow::bail!(NO_CUDA)
    }
}

/// Checks that GPU `device` can be used — a build with CUDA, a driver, such a device — before
/// any model is loaded: each failure is one clear error.
pub fn check_device(device: usize) -> Result<()> {
    require_build()?;
    let count = pagekv_cuda::probe()?;
    if device >= count {
        return Err(pagekv_cuda::CudaError::NoDevice { ordinal: device, count }.into());
    }
    Ok(())
}

/// Opens GPU `device` with the run's CUDA tuning ([`crate::config::cuda_tuning`]).
#[cfg(feature = "cuda")]
pub(crate) fn open_device(device: usize) -> Result<std::sync::Arc<pagekv_cuda::CudaDevice>> {
    Ok(pagekv_cuda::CudaDevice::new(device, crate::config::cuda_tuning()?)?)
}

/// The GPU model of this build: [`pagekv_model::cuda::CudaModel`].
#[cfg(feature = "cuda")]
pub type GpuModel = pagekv_model::cuda::CudaModel;

/// The GPU model of a build without CUDA: no value exists ([`gpu_model_builder`] fails first).
#[cfg(not(feature = "cuda"))]
pub enum GpuModel {}

#[cfg(not(feature = "cuda"))]
impl pagekv_model::Forward for GpuModel {
    type Pages = kvcache::HostPages;

    fn config(&self) -> &pagekv_model::ModelConfig {
        match *self {}
    }

    fn new_pool(&self, _: kvcache::CacheConfig) -> Result<kvcache::KvPool, ModelError> {
        match *self {}
    }

    fn forward(&mut self, _: &pagekv_model::Batch, _: &mut kvcache::KvPool) -> Result<&[f32], ModelError> {
        match *self {}
    }

    fn last_logits(&self) -> &[f32] {
        match *self {}
    }

    fn weight_bytes_per_token(&self) -> usize {
        match *self {}
    }

    fn device_label(&self) -> String {
        match *self {}
    }
}

/// Opens GPU `device` now (no driver, no such device: one clear error before anything else
/// happens) and returns what builds the GPU model from `model`'s weights — to be called on the
/// thread that will run it (the engine's scheduler thread: `Engine::start_with`). The weights
/// stay in their GGUF types (`PAGEKV_DEV_CUDA_WEIGHTS`), f32 with `exact_weights`.
#[cfg(feature = "cuda")]
pub fn gpu_model_builder(
    device: usize,
    model: Model,
    exact_weights: bool,
) -> Result<impl FnOnce() -> Result<GpuModel, ModelError> + Send + 'static> {
    let dev = open_device(device)?;
    let format = if exact_weights { pagekv_cuda::DType::F32.into() } else { weight_format()? };
    Ok(move || {
        // The device's context becomes this thread's for its lifetime (every later call, the
        // cuBLAS handle and graph captures included, runs here).
        dev.bind().map_err(|e| ModelError::Device(e.to_string()))?;
        let gpu = GpuModel::from_model(&model, dev, format);
        drop(model);
        gpu
    })
}

/// [`NO_CUDA`] in a build without the feature.
#[cfg(not(feature = "cuda"))]
pub fn gpu_model_builder(
    _device: usize,
    _model: Model,
    _exact_weights: bool,
) -> Result<impl FnOnce() -> Result<GpuModel, ModelError> + Send + 'static> {
    require_build()?;
    Ok(|| unreachable!("no GPU model without CUDA"))
}

/// The GPU model built on this thread (`chat`, `eval`: one sequence, no engine thread).
pub fn gpu_model(device: usize, model: Model, exact_weights: bool) -> Result<GpuModel> {
    Ok(gpu_model_builder(device, model, exact_weights)?()?)
}

/// Total memory of GPU `device` in bytes (`--kv-memory` fractions on the GPU).
#[cfg(feature = "cuda")]
pub fn device_memory(device: usize) -> Result<usize> {
    Ok(open_device(device)?.memory()?.1)
}

/// [`NO_CUDA`] in a build without the feature.
#[cfg(not(feature = "cuda"))]
pub fn device_memory(_device: usize) -> Result<usize> {
    require_build()?;
    unreachable!("require_build fails without CUDA")
}

/// `pagekv bench attention --device cuda:N`.
#[cfg(feature = "cuda")]
pub fn bench_attention(device: usize, json_out: bool, opts: &super::AttentionOpts<'_>) -> Result<()> {
    use pagekv_cuda::bench::{bench_attention, BenchConfig};

    let mut cfg = BenchConfig { runs: opts.runs.max(1), programmatic: opts.programmatic, ..Default::default() };
    if let Some(ms) = opts.cooldown_ms {
        cfg.cooldown_ms = ms;
    }
    if let Some(f) = opts.formats {
        cfg.formats = super::parse_formats(f)?;
    }
    if let Some(s) = opts.shapes {
        cfg.cases = super::parse_shapes(s)?;
    }
    if let Some(i) = opts.impls {
        cfg.routes = cuda_routes(i)?;
    }
    let dev = open_device(device)?;
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
            "{:<14} {:<12} {:>6} {:>8} {:>10} {:>12} {:>8} {:>6}",
            "impl", "format", "batch", "context", "µs", "KV bytes", "GB/s", "MHz"
        );
        for r in &rows {
            println!(
                "{:<14} {:<12} {:>6} {:>8} {:>10.1} {:>12} {:>8.0} {:>6.0}",
                r.impl_name,
                r.format,
                r.batch,
                r.context,
                r.ms * 1e3,
                r.kv_bytes,
                r.gbps,
                r.sm_mhz
            );
        }
    }
    Ok(())
}

/// The CUDA benchmark's routes named by `--impls`.
#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
fn cuda_routes(list: &str) -> Result<Vec<&'static str>> {
    list.split(',')
        .map(|s| match s.trim() {
            "primitive" => Ok("primitive"),
            "partitioned" => Ok("partitioned"),
            "stream-k" => Ok("stream-k"),
            other => anyhow::bail!("--impls {other:?}: on --device cuda one of primitive, partitioned, stream-k"),
        })
        .collect()
}

/// `pagekv bench attention --device cuda:N` in a build without CUDA.
#[cfg(not(feature = "cuda"))]
pub fn bench_attention(_device: usize, _json: bool, _opts: &super::AttentionOpts<'_>) -> Result<()> {
    anyhow::bail!(NO_CUDA)
}

/// The weight format of the GPU model: `PAGEKV_DEV_CUDA_WEIGHTS` (`gguf`, the default: matrices
/// stay in their GGUF types where the GPU has kernels for them; `bf16` or `f32`: dequantized).
#[cfg(feature = "cuda")]
pub(crate) fn weight_format() -> Result<pagekv_model::cuda::GpuWeights> {
    use pagekv_model::cuda::GpuWeights;
    match crate::config::env_lookup("PAGEKV_DEV_CUDA_WEIGHTS") {
        Some(v) if !v.trim().is_empty() => {
            GpuWeights::parse(v.trim()).map_err(|e| anyhow::anyhow!("PAGEKV_DEV_CUDA_WEIGHTS: {e}"))
        }
        _ => Ok(GpuWeights::Gguf),
    }
}

/// The KV format on the GPU: bf16 unless `--kv-quant` / `PAGEKV_KV_QUANT` says otherwise.
pub fn gpu_cache(mut cfg: kvcache::CacheConfig) -> kvcache::CacheConfig {
    if crate::config::env_lookup("PAGEKV_KV_QUANT").is_none_or(|v| v.trim().is_empty()) {
        cfg.format = kvcache::KvFormat::Bf16;
    }
    cfg
}
