//! `pagekv serve`: the OpenAI-compatible server (and Anthropic Messages) over the engine, on
//! the CPU or (`--device cuda[:N]`, feature `cuda`) the GPU: the same engine over the GPU model,
//! its KV pool in device memory (bf16 unless `--kv-quant` says otherwise; a `--kv-memory`
//! fraction is of the GPU's memory there).
//! SIGINT/SIGTERM stop accepting, let in-flight requests finish within `--grace-period`,
//! cancel the rest, and exit 0.

use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use clap::Args;
use pagekv_engine::{BankConfig, Engine, EngineConfig};
use pagekv_server::ServerConfig;

use crate::device::Device;
use crate::engine_backend::EngineBackend;
use crate::load::{cache_config, load};
use crate::settings::{ModelArgs, SpeculativeArgs};

#[derive(Args, Debug, Clone)]
pub struct ServeArgs {
    /// Address to bind.
    #[arg(long, default_value = "127.0.0.1")]
    pub host: String,
    /// Port to bind (0: any free port, printed at start).
    #[arg(long, default_value_t = 8080)]
    pub port: u16,
    /// Require `Authorization: Bearer KEY` on every /v1 route [env: PAGEKV_API_KEY].
    #[arg(long, env = "PAGEKV_API_KEY", hide_env_values = true)]
    pub api_key: Option<String>,
    /// Largest request body accepted (bytes).
    #[arg(long, default_value_t = 4 << 20)]
    pub max_body_bytes: usize,
    /// KV pool size: bytes (`512MiB`, `2GB`, `1000000`) or a fraction of RAM (`0.25`; of the
    /// GPU's memory with --device cuda) [env: PAGEKV_KV_MEMORY]. Default: --num-blocks blocks.
    #[arg(long, env = "PAGEKV_KV_MEMORY", hide_env = true)]
    pub kv_memory: Option<String>,
    /// Most tokens in one forward step (prefill chunks and decodes together).
    #[arg(long, default_value_t = 512, value_parser = clap::value_parser!(u64).range(1..))]
    pub max_batch_tokens: u64,
    /// Most sequences running at once.
    #[arg(long, default_value_t = 64, value_parser = clap::value_parser!(u64).range(1..))]
    pub max_seqs: u64,
    /// Bytes of KV the session bank may keep for prefix reuse (default: as the pool allows).
    #[arg(long)]
    pub session_bank_bytes: Option<String>,
    /// Seconds a session-bank entry stays unused before it is dropped (default: forever).
    #[arg(long)]
    pub session_bank_ttl: Option<f64>,
    /// Turn the session bank off.
    #[arg(long)]
    pub no_session_bank: bool,
    /// Seconds in-flight requests get to finish after SIGINT/SIGTERM.
    #[arg(long, default_value_t = 10.0)]
    pub grace_period: f64,
    /// Seconds a request may run, arrival to last token; past it the request is cancelled and
    /// answered 504 `request_timeout` (0: no limit) [env: PAGEKV_REQUEST_TIMEOUT].
    #[arg(long, env = "PAGEKV_REQUEST_TIMEOUT", hide_env = true, default_value_t = 0.0)]
    pub request_timeout: f64,
    /// Names the model answers to, comma-separated: the first is what /v1/models reports, any
    /// is accepted in requests, `*` accepts every name (default: the model file's stem)
    /// [env: PAGEKV_SERVED_MODEL_NAME].
    #[arg(long, value_name = "NAME[,ALIAS...]", env = "PAGEKV_SERVED_MODEL_NAME", hide_env = true,
          value_delimiter = ',', value_parser = served_model_name)]
    pub served_model_name: Vec<String>,
    #[command(flatten)]
    pub model: ModelArgs,
    #[command(flatten)]
    pub speculative: SpeculativeArgs,
}

/// One `--served-model-name` entry: non-empty, no surrounding spaces kept.
fn served_model_name(s: &str) -> Result<String, String> {
    let name = s.trim();
    if name.is_empty() {
        return Err("a served model name must not be empty".into());
    }
    Ok(name.to_string())
}

pub fn run(a: ServeArgs) -> Result<()> {
    let device = super::run::device()?;
    let loaded = load(a.model.model.as_deref(), a.model.chat_template.as_deref())?;
    let mut cache = cache_config(&loaded.model)?;
    if let Device::Cuda(_) = device {
        cache = super::cuda::gpu_cache(cache);
    }
    if let Some(m) = &a.kv_memory {
        let bytes = match device {
            Device::Cpu => parse_memory(m, "--kv-memory")?,
            Device::Cuda(n) => parse_memory_of(m, "--kv-memory", "the GPU's memory", || super::cuda::device_memory(n))?,
        };
        cache.num_blocks = pagekv_engine::num_blocks_for_bytes(&cache, bytes);
    }
    let bank = BankConfig {
        enabled: !a.no_session_bank,
        max_bytes: a.session_bank_bytes.as_deref().map(|b| parse_memory(b, "--session-bank-bytes")).transpose()?,
        ttl: a.session_bank_ttl.map(|s| seconds(s, "--session-bank-ttl")).transpose()?,
    };
    let config = EngineConfig {
        cache,
        max_batch_tokens: a.max_batch_tokens as usize,
        max_seqs: a.max_seqs as usize,
        bank,
        reduced_sampling: crate::config::reduced_sampling()?,
        speculative: a.speculative.config(device, &loaded.tokenizer, &loaded.model)?,
    };
    let grace = seconds(a.grace_period, "--grace-period")?;
    let request_timeout = Some(seconds(a.request_timeout, "--request-timeout")?).filter(|t| !t.is_zero());
    let model_id = model_id(&loaded.path);
    let tokenizer = Arc::new(loaded.tokenizer);
    let engine = match device {
        Device::Cpu => Engine::start(loaded.model, tokenizer.clone(), config)?,
        Device::Cuda(n) => {
            // The GPU model is built on the engine's thread, which alone runs it.
            let build = super::cuda::gpu_model_builder(n, loaded.model, false)?;
            Engine::start_with(build, tokenizer.clone(), config)?
        }
    };
    let info = engine.handle().info().clone();
    if let Device::Cuda(_) = device {
        eprintln!("pagekv: model on {}", info.device);
    }
    eprintln!(
        "pagekv: model {model_id}: KV {} in {} blocks of {} tokens ({:.1} MiB), context {}, up to {} sequences",
        info.kv_format,
        info.num_blocks,
        info.block_size,
        (info.num_blocks * info.block_bytes) as f64 / (1 << 20) as f64,
        info.context_window,
        info.max_seqs
    );
    let backend = Arc::new(EngineBackend::new(engine.handle(), tokenizer, loaded.template, model_id));
    let server_config = ServerConfig {
        host: a.host,
        port: a.port,
        api_key: a.api_key.filter(|k| !k.is_empty()),
        max_body_bytes: a.max_body_bytes,
        grace_period: grace,
        request_timeout,
        served_model_names: a.served_model_name,
    };
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
    let result = runtime.block_on(async move {
        let server = pagekv_server::Server::bind(server_config, backend).await?;
        eprintln!("pagekv: listening on http://{}", server.local_addr()?);
        server.run(shutdown_signal()).await
    });
    engine.shutdown(grace);
    result.context("server failed")?;
    eprintln!("pagekv: stopped");
    Ok(())
}

/// Resolves on SIGINT or SIGTERM.
async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        _ = ctrl_c => {},
        _ = term => {},
    }
    eprintln!("pagekv: shutting down");
}

/// The file name without `.gguf`.
fn model_id(path: &std::path::Path) -> String {
    let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_else(|| "model".into());
    name.strip_suffix(".gguf").unwrap_or(&name).to_string()
}

fn seconds(s: f64, what: &str) -> Result<Duration> {
    if !(0.0..=1e9).contains(&s) {
        bail!("invalid {what} {s}: expected a non-negative number of seconds");
    }
    Ok(Duration::from_secs_f64(s))
}

/// `1000`, `512KiB`, `512MiB`, `2GiB`, `2GB`, `1.5G`, or a fraction of RAM in (0, 1].
pub fn parse_memory(v: &str, what: &str) -> Result<usize> {
    parse_memory_of(v, what, "RAM", ram_bytes)
}

/// [`parse_memory`] with a fraction taken of `total()` bytes (`whole` names it in errors).
pub fn parse_memory_of(v: &str, what: &str, whole: &str, total: impl FnOnce() -> Result<usize>) -> Result<usize> {
    let bad = || {
        anyhow::anyhow!(
            "invalid {what} {v:?}: expected bytes (e.g. 512MiB, 2GB, 1000000) or a fraction of {whole} in (0, 1]"
        )
    };
    let s = v.trim();
    let split = s.find(|c: char| c.is_ascii_alphabetic()).unwrap_or(s.len());
    let (num, unit) = (s[..split].trim(), s[split..].trim().to_ascii_lowercase());
    let n: f64 = num.parse().map_err(|_| bad())?;
    if !n.is_finite() || n <= 0.0 {
        return Err(bad());
    }
    let mult: f64 = match unit.as_str() {
        "" if n <= 1.0 && num.contains('.') || n < 1.0 => return Ok((total()? as f64 * n) as usize),
        "" | "b" => 1.0,
        "k" | "kb" => 1e3,
        "kib" => 1024.0,
        "m" | "mb" => 1e6,
        "mib" => (1u64 << 20) as f64,
        "g" | "gb" => 1e9,
        "gib" => (1u64 << 30) as f64,
        "t" | "tb" => 1e12,
        "tib" => (1u64 << 40) as f64,
        _ => return Err(bad()),
    };
    let bytes = n * mult;
    if bytes > 1e15 {
        return Err(bad());
    }
    Ok(bytes as usize)
}

/// Total RAM from /proc/meminfo.
fn ram_bytes() -> Result<usize> {
    let info = std::fs::read_to_string("/proc/meminfo").context("cannot read /proc/meminfo for a fraction of RAM")?;
    let kb = info
        .lines()
        .find_map(|l| l.strip_prefix("MemTotal:"))
        .and_then(|r| r.trim().trim_end_matches("kB").trim().parse::<usize>().ok())
        .context("no MemTotal in /proc/meminfo")?;
    Ok(kb * 1024)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn memory_sizes_parse_and_bad_ones_are_errors() {
        assert_eq!(parse_memory("1000", "x").unwrap(), 1000);
        assert_eq!(parse_memory("512MiB", "x").unwrap(), 512 << 20);
        assert_eq!(parse_memory("2GB", "x").unwrap(), 2_000_000_000);
        assert_eq!(parse_memory("1.5 GiB", "x").unwrap(), 3 << 29);
        let ram = ram_bytes().unwrap();
        let quarter = parse_memory("0.25", "x").unwrap();
        assert!(quarter > 0 && quarter <= ram / 4 + 1);
        for bad in ["", "-1", "0", "abc", "12XB", "NaN", "inf", "1e30"] {
            let e = parse_memory(bad, "--kv-memory").unwrap_err().to_string();
            assert!(e.contains("--kv-memory"), "{bad}: {e}");
        }
    }
}
