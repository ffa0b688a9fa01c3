//! `pagekv eval --text FILE`: teacher-forced over a text, chunked to the context window, once
//! per KV format. Against the f16-KV run on the same text: mean KL divergence
//! KL(P_f16 ‖ P_format), top-1 agreement and Δperplexity. One JSON object per format with
//! `--json`.
//!
//! `--exact-weights` dequantizes every weight matrix to f32 first, so matrix products use f32
//! activations: the quantized kernels' 8-bit activation rounding makes any two KV formats
//! differ by about KL 5e-3 on SmolLM2 (f32 vs f16 KV included), which hides the format's own
//! error; without it the figures are those of the engine as it runs.
//!
//! On the CPU every row runs one attention numerics, so the rows differ in the KV format alone:
//! the default `auto` (llama.cpp's rounding for an f16 cache, the fast kernels' for the others)
//! is scored as `fast`; `--attn-numerics ggml` scores llama.cpp's (f16 rows only).
//!
//! `--device cuda[:N]` (feature `cuda`) scores on the GPU model: the same chunks and formats,
//! the f16 reference run on the GPU too; `--exact-weights` there means f32 weights (and f32
//! activations) instead of bf16.

use std::path::PathBuf;
use std::time::Instant;

use anyhow::{bail, Context, Result};
use clap::Args;
use kvcache::KvFormat;
use pagekv_cpu::attention::AttnNumerics;
use pagekv_engine::sampling::argmax;
use pagekv_engine::Generator;
use pagekv_model::Forward;
use serde_json::json;

use super::bench::round;
use crate::device::Device;
use crate::load::{cache_config, load};
use crate::settings::ModelArgs;

#[derive(Args, Debug)]
pub struct EvalArgs {
    /// Text to score (default: the Apache License 2.0 that Debian machines carry).
    #[arg(long, value_name = "FILE", default_value = "/usr/share/common-licenses/Apache-2.0")]
    pub text: PathBuf,
    /// Comma-separated formats to evaluate (default: every format; --kv-quant picks one).
    #[arg(long)]
    pub formats: Option<String>,
    /// Tokens per chunk (default: the model's context length).
    #[arg(long)]
    pub chunk: Option<usize>,
    /// Score at most this many tokens of the text.
    #[arg(long)]
    pub max_tokens: Option<usize>,
    #[arg(long)]
    pub json: bool,
    /// Dequantize the weights to f32 and multiply with f32 activations (slower; isolates the KV
    /// format's error from the 8-bit activation rounding of the quantized kernels). On the GPU:
    /// f32 weights instead of bf16.
    #[arg(long)]
    pub exact_weights: bool,
    #[command(flatten)]
    pub model: ModelArgs,
}

/// Tokens fed per forward step inside a chunk.
const STEP: usize = 256;

pub fn run(a: EvalArgs) -> Result<()> {
    let device = super::run::device()?;
    let text = std::fs::read_to_string(&a.text).with_context(|| format!("cannot read {}", a.text.display()))?;
    let loaded = load(a.model.model.as_deref(), a.model.chat_template.as_deref())?;
    // Measure the steady state: the weights' background copy into huge pages complete.
    loaded.model.weights.wait_until_resident();
    let mut ids = loaded.tokenizer.encode_with_bos(&text, false)?;
    if let Some(m) = a.max_tokens {
        ids.truncate(m);
    }
    if ids.len() < 2 {
        bail!("the text has fewer than 2 tokens");
    }
    let base_cfg = cache_config(&loaded.model)?;
    let chunk =
        a.chunk.unwrap_or(loaded.model.config.context_length).min(base_cfg.context_window.unwrap_or(usize::MAX)).max(2);
    let formats = match (&a.formats, &a.model.cache.kv_quant) {
        (Some(list), _) => super::parse_formats(list)?,
        (None, Some(_)) => vec![base_cfg.format],
        (None, None) => super::all_formats(),
    };
    let mut model = loaded.model;
    match device {
        Device::Cpu => {
            if a.exact_weights {
                model.weights.dequantize_to_f32().context("--exact-weights")?;
            }
            // One numerics for every row (`auto` would round the f16 reference as llama.cpp
            // does and the other formats as the fast kernels do).
            if model.attn_numerics() == AttnNumerics::Auto {
                model.set_attn_numerics(AttnNumerics::Fast);
            }
            let numerics = model.attn_numerics().name();
            evaluate(model, &a, &ids, &base_cfg, chunk, formats, Some(numerics))
        }
        // On the GPU `--exact-weights` means f32 weights (products with f32 activations).
        Device::Cuda(n) => {
            evaluate(super::cuda::gpu_model(n, model, a.exact_weights)?, &a, &ids, &base_cfg, chunk, formats, None)
        }
    }
}

/// Scores `ids` with every format in `formats` against the f16 reference, and prints the table.
/// `numerics` names the CPU attention numerics (none on the GPU).
fn evaluate<M: Forward>(
    mut model: M,
    a: &EvalArgs,
    ids: &[u32],
    base_cfg: &kvcache::CacheConfig,
    chunk: usize,
    formats: Vec<KvFormat>,
    numerics: Option<&str>,
) -> Result<()> {
    let vocab = model.config().vocab_size;
    // The f16 reference: log-softmax of every scored position, [positions, vocab].
    let (m, base, base_ppl, _) = score(model, base_cfg, KvFormat::F16, ids, chunk, |_, _| {})?;
    model = m;
    let positions = base.len() / vocab;
    if !a.json {
        println!(
            "{} tokens of {}, chunks of {chunk}{}{}; reference f16 KV perplexity {base_ppl:.4}",
            ids.len(),
            a.text.display(),
            if a.exact_weights { ", f32 weights and activations" } else { "" },
            numerics.map(|n| format!(", {n} attention numerics")).unwrap_or_default()
        );
        println!(
            "{:<12} {:>11} {:>9} {:>12} {:>9} {:>8}",
            "format", "perplexity", "Δppl %", "KL(f16‖fmt)", "top-1 %", "tok/s"
        );
    }
    for format in formats {
        let mut kl = 0.0f64;
        let mut agree = 0usize;
        let mut row = 0usize;
        let (m, _, ppl, tok_s) = score(model, base_cfg, format, ids, chunk, |logp: &[f32], _| {
            let b = &base[row * vocab..(row + 1) * vocab];
            kl += b.iter().zip(logp).map(|(&p, &q)| (p as f64).exp() * (p as f64 - q as f64)).sum::<f64>();
            agree += (argmax(b) == argmax(logp)) as usize;
            row += 1;
        })?;
        model = m;
        debug_assert_eq!(row, positions);
        let (kl, top1, dppl) = (kl / positions as f64, agree as f64 / positions as f64, ppl / base_ppl - 1.0);
        if a.json {
            let v = json!({
                "format": format.name(), "tokens": ids.len(), "scored": positions, "chunk": chunk,
                "perplexity": round(ppl, 4), "perplexity_f16": round(base_ppl, 4),
                "delta_ppl_pct": round(dppl * 100.0, 3), "kl_mean": kl, "top1_agreement": round(top1, 5),
                "tokens_per_s": round(tok_s, 1), "text": a.text.display().to_string(),
                "exact_weights": a.exact_weights, "attn_numerics": numerics,
            });
            println!("{v}");
        } else {
            println!(
                "{:<12} {:>11.4} {:>9.3} {:>12.3e} {:>9.2} {:>8.1}",
                format.name(),
                ppl,
                dppl * 100.0,
                kl,
                top1 * 100.0,
                tok_s
            );
        }
    }
    Ok(())
}

/// Scores `ids` with `format`: returns the model back, the log-softmax rows `[scored, vocab]`
/// (kept for the f16 reference run only), the perplexity and tokens/s. `each(logp_row, position)` sees every scored
/// row. A chunk's first token has no prediction; every other token is scored.
fn score<M: Forward>(
    model: M,
    base: &kvcache::CacheConfig,
    format: KvFormat,
    ids: &[u32],
    chunk: usize,
    mut each: impl FnMut(&[f32], usize),
) -> Result<(M, Vec<f32>, f64, f64)> {
    let mut cfg = base.clone();
    cfg.format = format;
    cfg.num_blocks = cfg.num_blocks.max(chunk.div_ceil(cfg.block_size) + 1);
    cfg.dynamic_growth = true;
    let vocab = model.config().vocab_size;
    let keep = format == KvFormat::F16;
    let mut g = Generator::new(model, cfg)?;
    let (mut kept, mut nll, mut n) = (Vec::new(), 0.0f64, 0usize);
    let mut logp = vec![0.0f32; vocab];
    let start = Instant::now();
    for part in ids.chunks(chunk) {
        g.reset()?;
        for (s, step) in part.chunks(STEP).enumerate() {
            let logits = g.score(step)?;
            for (i, row) in logits.chunks_exact(vocab).enumerate() {
                let pos = s * STEP + i;
                let Some(&next) = part.get(pos + 1) else { break };
                log_softmax(row, &mut logp);
                nll -= logp[next as usize] as f64;
                n += 1;
                each(&logp, pos);
                if keep {
                    kept.extend_from_slice(&logp);
                }
            }
        }
    }
    let secs = start.elapsed().as_secs_f64();
    Ok((g.into_model(), kept, (nll / n as f64).exp(), ids.len() as f64 / secs))
}

fn log_softmax(x: &[f32], out: &mut [f32]) {
    let m = x.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let lse = (x.iter().map(|&v| ((v - m) as f64).exp()).sum::<f64>().ln() + m as f64) as f32;
    for (o, &v) in out.iter_mut().zip(x) {
        *o = v - lse;
    }
}
