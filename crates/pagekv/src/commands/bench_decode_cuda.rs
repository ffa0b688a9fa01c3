//! `pagekv bench decode --device cuda[:N]`: prompt-processing and decode tokens/s of a model on
//! the GPU (`pagekv_model::cuda::CudaModel`), `--batch` sequences decoded together, against the
//! weight-read roofline measured in the same run (every weight matrix read once by a plain
//! streaming kernel: the least time a decode step can take at batch 1).
//!
//! `--model synthetic:llama3-8b` / `synthetic:smollm2` generates random weights of that shape on
//! the device (bf16; with `-q4km`, random blocks in Q4_K_M's types) — for throughput only,
//! labelled "synthetic, not a real model" in every row; its prompts are pseudo-random token ids.
//! A GGUF model is loaded as on the CPU, its weights kept in their GGUF types
//! (`PAGEKV_DEV_CUDA_WEIGHTS`: `gguf` by default, or dequantized to `bf16`/`f32`), and its prompts
//! cut from `--text`.
//!
//! For each (format, context): every sequence is prefilled with `context` tokens (timed: pp
//! tok/s over all sequences), then `--decode-tokens` steps decode one token per sequence
//! greedily, the argmax taken on the GPU (timed: tg tok/s over all sequences); the median over
//! `--runs` decode runs (the sequences are trimmed back to the prompt between runs).

#[cfg(not(feature = "cuda"))]
use super::decode::DecodeArgs;

/// `pagekv bench decode --device cuda` in a build without CUDA.
#[cfg(not(feature = "cuda"))]
pub fn run(_device: usize, _a: DecodeArgs) -> anyhow::Result<()> {
    anyhow::bail!(super::cuda::NO_CUDA)
}

#[cfg(feature = "cuda")]
pub use imp::run;

#[cfg(feature = "cuda")]
mod imp {
    use std::time::Instant;

    use anyhow::{bail, Context, Result};
    use kvcache::{CacheConfig, KvFormat, SequenceCache, SequencePolicy};
    use pagekv_model::cuda::CudaModel;
    use pagekv_model::{Batch, Forward, Logits};
    use serde_json::json;

    use crate::commands::bench::round;
    use crate::commands::decode::DecodeArgs;

    /// Tokens per prefill step.
    const CHUNK: usize = 512;

    pub fn run(device: usize, a: DecodeArgs) -> Result<()> {
        let contexts = a.context_list()?;
        if a.decode_tokens == 0 || a.runs == 0 || a.batch == 0 {
            bail!("--decode-tokens, --runs and --batch must be positive");
        }
        if a.llama_cpp.is_some() {
            bail!("--llama-cpp measures llama.cpp on the CPU: leave it out with --device cuda");
        }
        let max_ctx = *contexts.iter().max().unwrap_or(&1);
        let dev = crate::commands::cuda::open_device(device)?;
        let format = crate::commands::cuda::weight_format()?;
        let explicit = a.model.model.clone();
        let (mut model, prompts, model_name) = match explicit.as_deref().and_then(|m| m.strip_prefix("synthetic:")) {
            Some(name) => {
                let model = CudaModel::synthetic(name, dev, format.product_type(), 1)?;
                let vocab = model.config.vocab_size as u64;
                // Pseudo-random ids, a different prompt per sequence.
                let prompts: Vec<Vec<u32>> = (0..a.batch as u64)
                    .map(|s| (0..max_ctx as u64).map(|i| (splitmix(s << 32 | i) % vocab) as u32).collect())
                    .collect();
                (model, prompts, format!("synthetic:{name} (random weights, not a real model)"))
            }
            None => {
                let text =
                    std::fs::read_to_string(&a.text).with_context(|| format!("cannot read {}", a.text.display()))?;
                let loaded = crate::load::load(a.model.model.as_deref(), None)?;
                let ids = loaded.tokenizer.encode(&text, false)?;
                if ids.is_empty() {
                    bail!("{} holds no text", a.text.display());
                }
                // Sequence s starts s·97 tokens into the text: different prompts, same length.
                let prompts: Vec<Vec<u32>> =
                    (0..a.batch).map(|s| ids.iter().copied().cycle().skip(s * 97).take(max_ctx).collect()).collect();
                let name = loaded.path.file_name().map(|f| f.to_string_lossy().into_owned()).unwrap_or_default();
                (CudaModel::from_model(&loaded.model, dev, format)?, prompts, name)
            }
        };
        let limit = model.config.context_length;
        if max_ctx + a.decode_tokens > limit {
            bail!("context {max_ctx} + {} decoded tokens exceeds the model's context length {limit}", a.decode_tokens);
        }
        let c = model.config.clone();
        let mut base = CacheConfig::new(c.num_layers, c.num_kv_heads, c.head_dim);
        base.format = KvFormat::Bf16;
        base.dynamic_growth = true;
        base.context_window = Some(c.context_length);
        let base = base.with_env_from(crate::config::env_lookup)?;
        let formats = match (&a.formats, &a.model.cache.kv_quant) {
            (Some(list), _) => super::super::parse_formats(list)?,
            (None, Some(_)) => vec![base.format],
            (None, None) => vec![KvFormat::Bf16],
        };
        let read_s = model.weight_read_seconds(20)?;
        let weight_bytes = model.weight_bytes_per_token();
        let roofline = 1.0 / read_s;
        let label = model.device_label();
        if !a.json {
            println!("{model_name} on {label}");
            if model.synthetic_name().is_some() {
                println!("synthetic, not a real model: random weights of the model's shape (throughput only)");
            }
            println!(
                "weights read per decode step {:.2} GB; weight-read roofline {:.1} tok/s ({:.0} GB/s); batch {}, \
                 {} decoded tokens per run, median of {} runs",
                weight_bytes as f64 / 1e9,
                roofline,
                weight_bytes as f64 / read_s / 1e9,
                a.batch,
                a.decode_tokens,
                a.runs
            );
            println!(
                "{:<12} {:<8} {:>6} {:>8} {:>11} {:>11} {:>10} {:>10}",
                "engine", "format", "batch", "context", "pp tok/s", "tg tok/s", "ms/step", "roofline"
            );
        }
        for format in formats {
            let mut cfg = base.clone();
            cfg.format = format;
            let t_max = a.verify_tokens.unwrap_or(1) as usize;
            let per_seq = (max_ctx + a.decode_tokens * t_max).div_ceil(cfg.block_size) + 1;
            cfg.num_blocks = cfg.num_blocks.max(a.batch * per_seq);
            for &ctx in &contexts {
                let (pp, tg) = measure(&mut model, &cfg, &prompts, ctx, a.decode_tokens, a.runs, 1)?;
                let step_ms = 1e3 * a.batch as f64 / tg;
                if let Some(t) = a.verify_tokens.map(|t| t as usize) {
                    let (_, tv) = measure(&mut model, &cfg, &prompts, ctx, a.decode_tokens, a.runs, t)?;
                    let verify_ms = 1e3 * (a.batch * t) as f64 / tv;
                    if a.json {
                        println!(
                            "{}",
                            json!({
                                "engine": "pagekv-cuda", "device": label, "model": model_name,
                                "format": format.name(), "batch": a.batch, "context": ctx,
                                "verify_tokens": t, "verify_ms_per_step": round(verify_ms, 3),
                                "ms_per_step": round(step_ms, 3), "verify_vs_one_token": round(verify_ms / step_ms, 3),
                            })
                        );
                    } else {
                        println!(
                            "{:<12} {:<8} {:>6} {:>8} a step of {t} tokens per sequence (all logit rows): {:.3} ms, {:.2}x the one-token step",
                            "  verify",
                            format.name(),
                            a.batch,
                            ctx,
                            verify_ms,
                            verify_ms / step_ms
                        );
                    }
                }
                let frac = (1e-3 * step_ms).recip() / roofline;
                if a.json {
                    println!(
                        "{}",
                        json!({
                            "engine": "pagekv-cuda", "device": label, "model": model_name,
                            "synthetic": model.synthetic_name().is_some(), "weights": model.weights_name(),
                            "format": format.name(), "batch": a.batch, "context": ctx,
                            "pp_tokens_per_s": round(pp, 1), "tg_tokens_per_s": round(tg, 1),
                            "ms_per_step": round(step_ms, 3), "weight_bytes": weight_bytes,
                            "roofline_tokens_per_s": round(roofline, 1),
                            "steps_per_s_vs_roofline": round(frac, 4),
                        })
                    );
                } else {
                    println!(
                        "{:<12} {:<8} {:>6} {:>8} {:>11.1} {:>11.1} {:>10.3} {:>9.1}%",
                        "pagekv-cuda",
                        format.name(),
                        a.batch,
                        ctx,
                        pp,
                        tg,
                        step_ms,
                        100.0 * frac
                    );
                }
            }
        }
        Ok(())
    }

    /// (pp tok/s, tg tok/s) of `prompts.len()` sequences prefilled with `ctx` tokens each and
    /// decoded together, `step_tokens` tokens per sequence and step (more than one: a logit row
    /// for each, as a verification step; the tokens are the last greedy one repeated — their
    /// values do not change the time); tg is the median over `runs`.
    fn measure(
        model: &mut CudaModel,
        cfg: &CacheConfig,
        prompts: &[Vec<u32>],
        ctx: usize,
        decode: usize,
        runs: usize,
        step_tokens: usize,
    ) -> Result<(f64, f64)> {
        let mut pool = model.new_pool(cfg.clone())?;
        let policy = SequencePolicy::from_config(cfg);
        let mut seqs = Vec::with_capacity(prompts.len());
        for _ in prompts {
            seqs.push(SequenceCache::new(&mut pool, policy, ctx + decode * step_tokens)?);
        }
        let mut batch = Batch::default();
        let mut ids = Vec::new();
        let mut first = Vec::with_capacity(prompts.len());
        let t = Instant::now();
        for (seq, prompt) in seqs.iter_mut().zip(prompts) {
            let chunks = ctx.div_ceil(CHUNK);
            for (i, chunk) in prompt[..ctx].chunks(CHUNK).enumerate() {
                seq.begin_append(&mut pool, chunk.len())?;
                batch.clear();
                batch.sliding_window = seq.attention_window(None);
                let logits = if i + 1 == chunks { Logits::Last } else { Logits::None };
                batch.push(chunk, seq.offset() + chunk.len(), seq.pending_slots(), seq.block_table(), logits);
                model.forward_greedy(&batch, &mut pool, &mut ids)?;
                seq.commit_append(&mut pool);
            }
            first.push(ids[0]);
        }
        let pp = (prompts.len() * ctx) as f64 / t.elapsed().as_secs_f64();
        let mut tg = Vec::with_capacity(runs);
        let mut tokens = first.clone();
        for _ in 0..runs {
            tokens.copy_from_slice(&first);
            let t = Instant::now();
            for _ in 0..decode {
                batch.clear();
                for (seq, &tok) in seqs.iter_mut().zip(&tokens) {
                    seq.begin_append(&mut pool, step_tokens)?;
                    let feed = [tok; 64];
                    let logits = if step_tokens == 1 { Logits::Last } else { Logits::All };
                    let n = seq.offset() + step_tokens;
                    batch.push(&feed[..step_tokens], n, seq.pending_slots(), seq.block_table(), logits);
                }
                batch.sliding_window = seqs[0].attention_window(None);
                model.forward_greedy(&batch, &mut pool, &mut ids)?;
                for seq in seqs.iter_mut() {
                    seq.commit_append(&mut pool);
                }
                for (i, t) in tokens.iter_mut().enumerate() {
                    *t = ids[(i + 1) * step_tokens - 1];
                }
            }
            tg.push((prompts.len() * decode * step_tokens) as f64 / t.elapsed().as_secs_f64());
            for seq in seqs.iter_mut() {
                seq.trim(&mut pool, decode * step_tokens)?;
            }
        }
        for seq in seqs {
            seq.release(&mut pool);
        }
        tg.sort_by(f64::total_cmp);
        Ok((pp, tg[tg.len() / 2]))
    }

    /// SplitMix64: pseudo-random token ids without a generator's state.
    fn splitmix(x: u64) -> u64 {
        let mut z = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
}
