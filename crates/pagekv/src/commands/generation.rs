//! The single-user generation loop shared by `run` and `chat`: prefill (reusing the cached
//! prefix), then sample, stream and stop.

use std::time::Instant;

use anyhow::Result;
use clap::Args;
use pagekv_engine::sampling::{Sampler, SamplingParams, DEFAULT_SEED};
use pagekv_engine::stop::{FinishReason, StopMatcher};
use pagekv_engine::Generator;
use pagekv_model::tokenizer::{StreamDecoder, Tokenizer};

/// Sampling and stopping flags.
#[derive(Args, Debug, Clone)]
pub struct SamplingArgs {
    /// Most tokens to generate.
    #[arg(long, short = 'n', default_value_t = 256)]
    pub max_tokens: usize,
    /// Softmax temperature; 0 = greedy.
    #[arg(long, default_value_t = 0.8)]
    pub temperature: f32,
    /// Keep the K most likely tokens (0 = off).
    #[arg(long, default_value_t = 40)]
    pub top_k: usize,
    /// Nucleus sampling mass (1 = off).
    #[arg(long, default_value_t = 0.95)]
    pub top_p: f32,
    /// Drop tokens less likely than P × the most likely one (0 = off).
    #[arg(long, default_value_t = 0.05)]
    pub min_p: f32,
    /// llama.cpp repeat penalty over the last --penalty-last-n tokens (1 = off).
    #[arg(long, default_value_t = 1.0)]
    pub repeat_penalty: f32,
    /// OpenAI presence penalty (0 = off).
    #[arg(long, default_value_t = 0.0, allow_hyphen_values = true)]
    pub presence_penalty: f32,
    /// OpenAI frequency penalty (0 = off).
    #[arg(long, default_value_t = 0.0, allow_hyphen_values = true)]
    pub frequency_penalty: f32,
    /// Tokens the penalties look back at.
    #[arg(long, default_value_t = 64)]
    pub penalty_last_n: usize,
    /// Seed of the sampler (same seed, same output) [env: PAGEKV_SEED].
    #[arg(long, env = "PAGEKV_SEED", hide_env = true)]
    pub seed: Option<u64>,
    /// Stop when this text appears (repeatable); it is not printed.
    #[arg(long)]
    pub stop: Vec<String>,
}

impl SamplingArgs {
    pub fn params(&self) -> SamplingParams {
        SamplingParams {
            temperature: self.temperature,
            top_k: self.top_k,
            top_p: self.top_p,
            min_p: self.min_p,
            repetition_penalty: self.repeat_penalty,
            presence_penalty: self.presence_penalty,
            frequency_penalty: self.frequency_penalty,
            penalty_last_n: self.penalty_last_n,
            seed: self.seed.unwrap_or(DEFAULT_SEED),
        }
    }
}

/// Figures of one generation.
#[derive(Clone, Debug, Default)]
pub struct GenerationStats {
    pub prompt_tokens: usize,
    pub reused_tokens: usize,
    pub generated: usize,
    pub prefill_s: f64,
    pub decode_s: f64,
    pub finish: Option<FinishReason>,
}

impl GenerationStats {
    pub fn summary(&self) -> String {
        let computed = self.prompt_tokens - self.reused_tokens;
        let pp = computed as f64 / self.prefill_s.max(1e-9);
        let tg = self.generated.saturating_sub(1) as f64 / self.decode_s.max(1e-9);
        format!(
            "prompt {} tokens ({} reused, {} computed, {:.1} tok/s), generated {} tokens ({:.1} tok/s), finish: {}",
            self.prompt_tokens,
            self.reused_tokens,
            computed,
            pp,
            self.generated,
            tg,
            self.finish.map_or("error", |f| f.as_str())
        )
    }
}

/// Generates after `prompt`, calling `emit` with each piece of text ready to show. The
/// generated tokens stay in the generator's cache (the next chat turn reuses them).
pub fn generate<M: pagekv_model::Forward>(
    generator: &mut Generator<M>,
    tokenizer: &Tokenizer,
    prompt: &[u32],
    sampling: &SamplingArgs,
    mut emit: impl FnMut(&str) -> Result<()>,
) -> Result<GenerationStats> {
    let mut sampler = Sampler::new(sampling.params())?;
    let mut stop = StopMatcher::new(&sampling.stop);
    let mut decoder = StreamDecoder::new(true);
    let mut history = prompt.to_vec();
    let mut stats = GenerationStats { prompt_tokens: prompt.len(), ..Default::default() };
    if sampling.max_tokens == 0 {
        stats.finish = Some(FinishReason::Length);
        return Ok(stats);
    }

    let t0 = Instant::now();
    let (prefill, logits) = generator.prefill(prompt)?;
    stats.reused_tokens = prefill.reused;
    let mut token = sampler.sample(logits, &history);
    stats.prefill_s = t0.elapsed().as_secs_f64();
    let t1 = Instant::now();
    loop {
        stats.generated += 1;
        history.push(token);
        if tokenizer.is_eot(token) {
            stats.finish = Some(FinishReason::Stop);
            break;
        }
        let out = stop.push(&decoder.push(tokenizer, token)?);
        emit(&out.text)?;
        if out.finish.is_some() {
            stats.finish = out.finish;
            break;
        }
        if stats.generated >= sampling.max_tokens {
            stats.finish = Some(FinishReason::Length);
            break;
        }
        let logits = generator.step(token)?;
        token = sampler.sample(logits, &history);
    }
    if !stop.stopped() {
        let tail = decoder.finish();
        let out = stop.push(&tail);
        emit(&out.text)?;
        emit(&stop.flush())?;
    }
    // The last sampled token is not in the cache yet; the next turn's prompt will carry it.
    stats.decode_s = t1.elapsed().as_secs_f64();
    Ok(stats)
}
