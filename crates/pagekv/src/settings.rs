//! Flags shared by the subcommands and their `PAGEKV_*` variables.
//!
//! Every setting is a flag and a variable; the flag wins. clap reads both (`env = …`) and
//! validates them (its error names the flag and lists the accepted values); the values are then
//! handed to [`crate::config`], the one place the libraries' typed configuration is built from.

use std::path::PathBuf;

use clap::Args;

use crate::device::Device;

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

/// KV cache settings (crate `kvcache`).
#[derive(Args, Clone, Debug, Default)]
pub struct CacheArgs {
    /// KV storage format [env: PAGEKV_KV_QUANT].
    #[arg(long, value_name = "FORMAT", env = "PAGEKV_KV_QUANT", hide_env = true,
          value_parser = ["off", "f32", "f16", "bf16", "q8", "q4", "q4r", "turbo"])]
    pub kv_quant: Option<String>,
    /// Turbo key bits: 2, 3, 4 or 8 [env: PAGEKV_TURBO_K_BITS].
    #[arg(long, value_name = "BITS", env = "PAGEKV_TURBO_K_BITS", hide_env = true, value_parser = ["2", "3", "4", "8"])]
    pub turbo_k_bits: Option<String>,
    /// Turbo value bits: 2, 3, 4 or 8 [env: PAGEKV_TURBO_V_BITS].
    #[arg(long, value_name = "BITS", env = "PAGEKV_TURBO_V_BITS", hide_env = true, value_parser = ["2", "3", "4", "8"])]
    pub turbo_v_bits: Option<String>,
    /// Grow a sequence's cache block by block as tokens arrive (`--dynamic-kv` or
    /// `--dynamic-kv=0|1`) [env: PAGEKV_DYNAMIC_KV].
    #[arg(long, value_name = "BOOL", num_args = 0..=1, default_missing_value = "1",
          env = "PAGEKV_DYNAMIC_KV", hide_env = true, value_parser = crate::config::parse_bool)]
    pub dynamic_kv: Option<bool>,
    /// Most tokens a sequence may hold (default: the model's context length) [env: PAGEKV_CONTEXT_WINDOW].
    #[arg(long, value_name = "N", env = "PAGEKV_CONTEXT_WINDOW", hide_env = true,
          value_parser = clap::value_parser!(u64).range(1..))]
    pub context_window: Option<u64>,
    /// Tokens per block: 8, 16 or 32 [env: PAGEKV_BLOCK_SIZE].
    #[arg(long, value_name = "N", env = "PAGEKV_BLOCK_SIZE", hide_env = true, value_parser = ["8", "16", "32"])]
    pub block_size: Option<String>,
    /// Blocks in the pool [env: PAGEKV_NUM_BLOCKS].
    #[arg(long, value_name = "N", env = "PAGEKV_NUM_BLOCKS", hide_env = true,
          value_parser = clap::value_parser!(u64).range(1..))]
    pub num_blocks: Option<u64>,
    /// Attention sees only the last N tokens; older blocks return to the pool [env: PAGEKV_SLIDING_WINDOW].
    #[arg(long, value_name = "N", env = "PAGEKV_SLIDING_WINDOW", hide_env = true,
          value_parser = clap::value_parser!(u64).range(1..))]
    pub sliding_window: Option<u64>,
    /// Print block tables on growth, trim and fork (`--debug-blocks` or `--debug-blocks=0|1`)
    /// [env: PAGEKV_DEBUG_BLOCKS].
    #[arg(long, value_name = "BOOL", num_args = 0..=1, default_missing_value = "1",
          env = "PAGEKV_DEBUG_BLOCKS", hide_env = true, value_parser = crate::config::parse_bool)]
    pub debug_blocks: Option<bool>,
    /// Layers with their own sliding window (Gemma 3) get block tables that free what the
    /// window left; off: one table for every layer, windows by masking alone (`--hybrid-kv=0|1`)
    /// [env: PAGEKV_HYBRID_KV].
    #[arg(long, value_name = "BOOL", num_args = 0..=1, default_missing_value = "1",
          env = "PAGEKV_HYBRID_KV", hide_env = true, value_parser = crate::config::parse_bool)]
    pub hybrid_kv: Option<bool>,
}

/// Kernel and device settings.
#[derive(Args, Clone, Debug, Default)]
pub struct RuntimeArgs {
    /// Attention path [env: PAGEKV_ATTN_IMPL].
    #[arg(long, value_name = "IMPL", env = "PAGEKV_ATTN_IMPL", hide_env = true,
          value_parser = ["auto", "reference", "primitive", "partitioned"])]
    pub attn_impl: Option<String>,
    /// Attention numerics on the CPU: auto (ggml for an f16 KV cache, fast for the other formats
    /// and in the server), fast (the kernels' own rounding, the same however a token was
    /// batched or cached) or ggml (llama.cpp's, step by step; f16 KV cache only)
    /// [env: PAGEKV_ATTN_NUMERICS; default auto].
    #[arg(long, value_name = "NUMERICS", env = "PAGEKV_ATTN_NUMERICS", hide_env = true,
          value_parser = ["auto", "fast", "ggml"])]
    pub attn_numerics: Option<String>,
    /// Tokens per partition of the partitioned attention path [env: PAGEKV_PARTITION_SIZE].
    #[arg(long, value_name = "N", env = "PAGEKV_PARTITION_SIZE", hide_env = true,
          value_parser = clap::value_parser!(u64).range(1..))]
    pub partition_size: Option<u64>,
    /// Worker threads (default: the CPU's cores) [env: PAGEKV_THREADS].
    #[arg(long, value_name = "N", env = "PAGEKV_THREADS", hide_env = true,
          value_parser = |v: &str| pagekv_cpu::threadpool::parse_thread_count(v).map_err(|e| e.to_string()))]
    pub threads: Option<usize>,
    /// Device: cpu or cuda[:N] [env: PAGEKV_DEVICE].
    #[arg(long, value_name = "DEVICE", env = "PAGEKV_DEVICE", hide_env = true, value_parser = Device::parse)]
    pub device: Option<Device>,
    /// GPU kernels whose result for a token does not depend on the other tokens of its step:
    /// greedy output with drafts (--speculative) or in any batch equals the output alone, bit
    /// for bit, at some cost in speed (the CPU's kernels are batch-invariant already)
    /// [env: PAGEKV_BATCH_INVARIANT; default off].
    #[arg(long, value_name = "BOOL", num_args = 0..=1, default_missing_value = "1",
          env = "PAGEKV_BATCH_INVARIANT", hide_env = true, value_parser = crate::config::parse_bool)]
    pub batch_invariant: Option<bool>,
}

/// Multi-token decoding (crate `pagekv-engine`, module `speculative`).
#[derive(Args, Clone, Debug, Default)]
pub struct SpeculativeArgs {
    /// Draft tokens and verify them in one step: off, ngram (prompt lookup), draft:MODEL (a
    /// smaller model with the same vocabulary; a registry name or a GGUF file) or mtp (the
    /// model's own next-token-prediction layers, CPU only) [env: PAGEKV_SPECULATIVE; default off].
    #[arg(long, value_name = "MODE", env = "PAGEKV_SPECULATIVE", hide_env = true, value_parser = Speculative::parse)]
    pub speculative: Option<Speculative>,
    /// Most tokens drafted per step, 1 to 32 (each sequence adapts below it to its acceptance)
    /// [env: PAGEKV_DRAFT_TOKENS; default 8].
    #[arg(long, value_name = "K", env = "PAGEKV_DRAFT_TOKENS", hide_env = true, value_parser = parse_draft_tokens)]
    pub draft_tokens: Option<usize>,
    /// Shortest suffix the ngram drafter matches [env: PAGEKV_NGRAM_MIN; default 2].
    #[arg(long, value_name = "N", env = "PAGEKV_NGRAM_MIN", hide_env = true,
          value_parser = clap::value_parser!(u64).range(1..=64))]
    pub ngram_min: Option<u64>,
    /// Longest suffix the ngram drafter matches [env: PAGEKV_NGRAM_MAX; default 5].
    #[arg(long, value_name = "N", env = "PAGEKV_NGRAM_MAX", hide_env = true,
          value_parser = clap::value_parser!(u64).range(1..=64))]
    pub ngram_max: Option<u64>,
}

/// `--speculative`'s value.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Speculative {
    Off,
    Ngram,
    /// A draft model: a registry name or a file.
    Draft(String),
    /// The model's next-token-prediction layers.
    Mtp,
}

impl Speculative {
    pub fn parse(v: &str) -> anyhow::Result<Speculative> {
        match v.trim() {
            "off" => Ok(Speculative::Off),
            "ngram" => Ok(Speculative::Ngram),
            "mtp" => Ok(Speculative::Mtp),
            other => match other.strip_prefix("draft:") {
                Some(m) if !m.trim().is_empty() => Ok(Speculative::Draft(m.trim().to_string())),
                _ => anyhow::bail!(
                    "invalid speculative mode {v:?} (--speculative / PAGEKV_SPECULATIVE): accepted values are off, ngram, draft:MODEL, mtp"
                ),
            },
        }
    }
}

fn parse_draft_tokens(v: &str) -> Result<usize, String> {
    let max = pagekv_engine::MAX_DRAFT_TOKENS;
    match v.trim().parse::<usize>() {
        Ok(k) if (1..=max).contains(&k) => Ok(k),
        _ => Err(format!(
            "invalid draft length {v:?} (--draft-tokens / PAGEKV_DRAFT_TOKENS): accepted values are 1 to {max}"
        )),
    }
}

impl SpeculativeArgs {
    /// The engine's settings for `model` with tokenizer `target` on `device` (a draft model is
    /// loaded and checked against it here; `mtp` checks that the model has the layers).
    pub fn config(
        &self,
        device: Device,
        target: &pagekv_model::tokenizer::Tokenizer,
        model: &pagekv_model::Model,
    ) -> anyhow::Result<pagekv_engine::SpeculativeConfig> {
        use pagekv_engine::{DraftMode, SpeculativeConfig};
        let d = SpeculativeConfig::default();
        let mode = match self.speculative.clone().unwrap_or(Speculative::Off) {
            Speculative::Off => DraftMode::Off,
            Speculative::Ngram => DraftMode::Ngram,
            Speculative::Draft(m) => DraftMode::Model(crate::load::draft_model(&m, target, device)?),
            Speculative::Mtp => DraftMode::Mtp(crate::load::mtp_model(model, device)?),
        };
        let c = SpeculativeConfig {
            mode,
            draft_tokens: self.draft_tokens.unwrap_or(d.draft_tokens),
            ngram_min: self.ngram_min.map_or(d.ngram_min, |n| n as usize),
            ngram_max: self.ngram_max.map_or(d.ngram_max, |n| n as usize),
            token_cost: crate::config::draft_token_cost(device.draft_token_cost())?,
        };
        c.validate().map_err(|e| anyhow::anyhow!("{e} (--ngram-min / --ngram-max)"))?;
        Ok(c)
    }
}

impl CacheArgs {
    /// The given settings as `(variable, value)` pairs.
    pub fn given(&self) -> Vec<(&'static str, String)> {
        let mut v = Vec::new();
        given(&mut v, "PAGEKV_KV_QUANT", self.kv_quant.clone());
        given(&mut v, "PAGEKV_TURBO_K_BITS", self.turbo_k_bits.clone());
        given(&mut v, "PAGEKV_TURBO_V_BITS", self.turbo_v_bits.clone());
        given(&mut v, "PAGEKV_DYNAMIC_KV", self.dynamic_kv.map(bool_text));
        given(&mut v, "PAGEKV_CONTEXT_WINDOW", self.context_window.map(|n| n.to_string()));
        given(&mut v, "PAGEKV_BLOCK_SIZE", self.block_size.clone());
        given(&mut v, "PAGEKV_NUM_BLOCKS", self.num_blocks.map(|n| n.to_string()));
        given(&mut v, "PAGEKV_SLIDING_WINDOW", self.sliding_window.map(|n| n.to_string()));
        given(&mut v, "PAGEKV_DEBUG_BLOCKS", self.debug_blocks.map(bool_text));
        given(&mut v, "PAGEKV_HYBRID_KV", self.hybrid_kv.map(bool_text));
        v
    }
}

impl RuntimeArgs {
    /// The given settings as `(variable, value)` pairs.
    pub fn given(&self) -> Vec<(&'static str, String)> {
        let mut v = Vec::new();
        given(&mut v, "PAGEKV_ATTN_IMPL", self.attn_impl.clone());
        given(&mut v, "PAGEKV_ATTN_NUMERICS", self.attn_numerics.clone());
        given(&mut v, "PAGEKV_PARTITION_SIZE", self.partition_size.map(|n| n.to_string()));
        given(&mut v, "PAGEKV_THREADS", self.threads.map(|n| n.to_string()));
        given(&mut v, "PAGEKV_DEVICE", self.device.map(|d| d.to_string()));
        given(&mut v, "PAGEKV_BATCH_INVARIANT", self.batch_invariant.map(bool_text));
        v
    }

    /// Hands the settings to [`crate::config`] (once, before any configuration is built).
    pub fn install(&self) -> anyhow::Result<()> {
        crate::config::install(self.given())
    }
}

impl ModelArgs {
    /// Hands the model's and the runtime's settings to [`crate::config`] (once, before any
    /// configuration is built).
    pub fn install(&self) -> anyhow::Result<()> {
        let mut v = self.cache.given();
        v.extend(self.runtime.given());
        crate::config::install(v)
    }
}

fn given(into: &mut Vec<(&'static str, String)>, name: &'static str, value: Option<String>) {
    if let Some(value) = value {
        into.push((name, value));
    }
}

fn bool_text(b: bool) -> String {
    if b { "1" } else { "0" }.to_string()
}
