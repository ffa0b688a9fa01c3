//! Flags shared by the subcommands and their `PAGEKV_*` variables.
//!
//! Every setting is a flag and a variable; the flag wins. Flags are validated by clap (its
//! error names the flag and lists the accepted values) and then exported into the process
//! environment before any configuration is read, so the libraries read one source — the
//! variables — with their own checks (whose errors name the variable).

use std::path::PathBuf;

use clap::Args;

/// The model and every setting of the runtime under it.
#[derive(Args, Debug, Clone)]
pub struct ModelArgs {
    /// A known model's name (`pagekv models` lists them; fetched once) or a GGUF file
    /// (default: smollm2-135m) [env: PAGEKV_MODEL].
    #[arg(long, short = 'm', value_name = "NAME|FILE", env = "PAGEKV_MODEL", hide_env = true)]
    pub model: Option<String>,
    /// Chat template file (Jinja) replacing the model's.
    #[arg(long, value_name = "FILE")]
    pub chat_template: Option<PathBuf>,
    #[command(flatten)]
    pub cache: CacheArgs,
    #[command(flatten)]
    pub runtime: RuntimeArgs,
}

impl ModelArgs {
    /// Exports the flags as `PAGEKV_*` variables (before any thread or config exists).
    pub fn export(&self) {
        self.cache.export();
        self.runtime.export();
    }
}

/// KV cache settings (crate `kvcache`).
#[derive(Args, Clone, Debug, Default)]
pub struct CacheArgs {
    /// KV storage format [env: PAGEKV_KV_QUANT].
    #[arg(long, value_name = "FORMAT", value_parser = ["off", "f32", "f16", "bf16", "q8", "q4", "q4r", "turbo"])]
    pub kv_quant: Option<String>,
    /// Turbo key bits: 2, 3, 4 or 8 [env: PAGEKV_TURBO_K_BITS].
    #[arg(long, value_name = "BITS", value_parser = ["2", "3", "4", "8"])]
    pub turbo_k_bits: Option<String>,
    /// Turbo value bits: 2, 3, 4 or 8 [env: PAGEKV_TURBO_V_BITS].
    #[arg(long, value_name = "BITS", value_parser = ["2", "3", "4", "8"])]
    pub turbo_v_bits: Option<String>,
    /// Grow a sequence's cache block by block as tokens arrive (`--dynamic-kv` or
    /// `--dynamic-kv=0|1`) [env: PAGEKV_DYNAMIC_KV].
    #[arg(long, value_name = "BOOL", num_args = 0..=1, default_missing_value = "1",
          value_parser = ["0", "1", "true", "false", "on", "off", "yes", "no"])]
    pub dynamic_kv: Option<String>,
    /// Most tokens a sequence may hold (default: the model's context length) [env: PAGEKV_CONTEXT_WINDOW].
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..))]
    pub context_window: Option<u64>,
    /// Tokens per block: 8, 16 or 32 [env: PAGEKV_BLOCK_SIZE].
    #[arg(long, value_name = "N", value_parser = ["8", "16", "32"])]
    pub block_size: Option<String>,
    /// Blocks in the pool [env: PAGEKV_NUM_BLOCKS].
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..))]
    pub num_blocks: Option<u64>,
    /// Attention sees only the last N tokens; older blocks return to the pool [env: PAGEKV_SLIDING_WINDOW].
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..))]
    pub sliding_window: Option<u64>,
    /// Print block tables on growth, trim and fork [env: PAGEKV_DEBUG_BLOCKS].
    #[arg(long)]
    pub debug_blocks: bool,
}

/// Kernel and device settings.
#[derive(Args, Clone, Debug, Default)]
pub struct RuntimeArgs {
    /// Attention path [env: PAGEKV_ATTN_IMPL].
    #[arg(long, value_name = "IMPL", value_parser = ["auto", "reference", "primitive", "partitioned"])]
    pub attn_impl: Option<String>,
    /// Attention numerics on the CPU: auto (ggml for an f16 KV cache, fast for the other formats
    /// and in the server), fast (the kernels' own rounding, the same however a token was
    /// batched or cached) or ggml (llama.cpp's, step by step; f16 KV cache only)
    /// [env: PAGEKV_ATTN_NUMERICS; default auto].
    #[arg(long, value_name = "NUMERICS", value_parser = ["auto", "fast", "ggml"])]
    pub attn_numerics: Option<String>,
    /// Tokens per partition of the partitioned attention path [env: PAGEKV_PARTITION_SIZE].
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..))]
    pub partition_size: Option<u64>,
    /// Worker threads (default: the CPU's cores) [env: PAGEKV_THREADS].
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..=1024))]
    pub threads: Option<u64>,
    /// Device: cpu or cuda[:N] [env: PAGEKV_DEVICE].
    #[arg(long, value_name = "DEVICE")]
    pub device: Option<String>,
}

impl CacheArgs {
    /// Exports the given flags as their variables.
    pub fn export(&self) {
        set("PAGEKV_KV_QUANT", self.kv_quant.clone());
        set("PAGEKV_TURBO_K_BITS", self.turbo_k_bits.clone());
        set("PAGEKV_TURBO_V_BITS", self.turbo_v_bits.clone());
        set("PAGEKV_DYNAMIC_KV", self.dynamic_kv.clone());
        set("PAGEKV_CONTEXT_WINDOW", self.context_window.map(|v| v.to_string()));
        set("PAGEKV_BLOCK_SIZE", self.block_size.clone());
        set("PAGEKV_NUM_BLOCKS", self.num_blocks.map(|v| v.to_string()));
        set("PAGEKV_SLIDING_WINDOW", self.sliding_window.map(|v| v.to_string()));
        if self.debug_blocks {
            set("PAGEKV_DEBUG_BLOCKS", Some("1".into()));
        }
    }
}

impl RuntimeArgs {
    /// Exports the given flags as their variables.
    pub fn export(&self) {
        set("PAGEKV_ATTN_IMPL", self.attn_impl.clone());
        set("PAGEKV_ATTN_NUMERICS", self.attn_numerics.clone());
        set("PAGEKV_PARTITION_SIZE", self.partition_size.map(|v| v.to_string()));
        set("PAGEKV_THREADS", self.threads.map(|v| v.to_string()));
        set("PAGEKV_DEVICE", self.device.clone());
    }
}

fn set(name: &str, value: Option<String>) {
    if let Some(v) = value {
        // Called from `main` before any other thread exists.
        std::env::set_var(name, v);
    }
}

/// Where the model runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Device {
    Cpu,
    Cuda(usize),
}

impl Device {
    /// Reads `PAGEKV_DEVICE` (`cpu`, `cuda`, `cuda:N`; default `cpu`).
    pub fn from_env() -> anyhow::Result<Device> {
        match crate::config::env_lookup("PAGEKV_DEVICE") {
            Some(v) if !v.trim().is_empty() => Device::parse(v.trim()),
            _ => Ok(Device::Cpu),
        }
    }

    pub fn parse(v: &str) -> anyhow::Result<Device> {
        let bad = || {
            anyhow::anyhow!("invalid device {v:?} (--device / PAGEKV_DEVICE): accepted values are cpu, cuda, cuda:N")
        };
        match v {
            "cpu" => Ok(Device::Cpu),
            "cuda" => Ok(Device::Cuda(0)),
            _ => {
                let n = v.strip_prefix("cuda:").ok_or_else(bad)?;
                n.parse().map(Device::Cuda).map_err(|_| bad())
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn devices_parse_and_bad_ones_name_the_flag() {
        assert_eq!(Device::parse("cpu").unwrap(), Device::Cpu);
        assert_eq!(Device::parse("cuda").unwrap(), Device::Cuda(0));
        assert_eq!(Device::parse("cuda:3").unwrap(), Device::Cuda(3));
        for bad in ["gpu", "cuda:", "cuda:x", "CPU", "cuda:-1"] {
            let e = Device::parse(bad).unwrap_err().to_string();
            assert!(e.contains("PAGEKV_DEVICE") && e.contains("cuda:N"), "{e}");
        }
    }
}
