//! `run` and `chat` generate through the engine — the scheduler that serves `serve` — with one
//! sequence at a time: [`SingleUser`] starts it over the CPU or GPU model, and [`generate`]
//! submits one prompt and streams its text. Sampling, penalties, stop strings, `max_tokens` and
//! seeds are the engine's, written once for every front end; the session bank keeps a
//! conversation's blocks between turns, so a chat turn computes only what is new.

use std::sync::Arc;
use std::time::Instant;

use anyhow::{bail, Result};
use clap::Args;
use kvcache::CacheConfig;
use pagekv_cpu::attention::AttnNumerics;
use pagekv_engine::sampling::{SamplingParams, DEFAULT_SEED};
use pagekv_engine::stop::{FinishReason, StopConditions};
use pagekv_engine::{
    BankConfig, DraftMode, Engine, EngineConfig, EngineHandle, EngineMetrics, Event, GenerationRequest,
    SpeculativeConfig,
};
use pagekv_model::tokenizer::Tokenizer;
use pagekv_model::Model;

use crate::device::Device;

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
    /// Multi-token decoding figures of this generation, when a drafter ran.
    pub drafts: Option<DraftStats>,
}

/// What the drafter did for one generation (differences of the engine's counters).
#[derive(Clone, Debug, Default)]
pub struct DraftStats {
    pub drafter: String,
    /// Steps that emitted tokens, and those of them that verified a draft.
    pub steps: u64,
    pub draft_steps: u64,
    pub drafted: u64,
    pub accepted: u64,
    pub generated: u64,
}

impl DraftStats {
    pub fn between(before: &EngineMetrics, after: &EngineMetrics) -> Option<DraftStats> {
        let drafter = after.drafter.clone()?;
        Some(DraftStats {
            drafter,
            steps: after.sampling_steps - before.sampling_steps,
            draft_steps: after.draft_steps - before.draft_steps,
            drafted: after.draft_tokens - before.draft_tokens,
            accepted: after.draft_accepted_tokens - before.draft_accepted_tokens,
            generated: after.generated_tokens - before.generated_tokens,
        })
    }

    pub fn summary(&self) -> String {
        let rate = self.accepted as f64 / self.drafted.max(1) as f64;
        let mean = self.accepted as f64 / self.draft_steps.max(1) as f64;
        let per_step = self.generated as f64 / self.steps.max(1) as f64;
        format!(
            "speculative {}: drafted {} tokens in {} of {} steps, accepted {} ({:.1} %), mean accepted length {:.2}, {:.2} tokens per step",
            self.drafter,
            self.drafted,
            self.draft_steps,
            self.steps,
            self.accepted,
            100.0 * rate,
            mean,
            per_step
        )
    }
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

/// The engine of one user: the scheduler with one sequence slot over the model's pool.
pub struct SingleUser {
    engine: Engine,
}

impl SingleUser {
    /// Starts the engine over `model` on `device` with the pool of `cache`. The attention numerics
    /// the model resolves for the cache's format (`auto`: llama.cpp's rounding on f16) are fixed
    /// before the engine starts, so one user's tokens are the ones `--attn-numerics` asks for —
    /// unless drafting is on, which needs numerics that do not depend on the tokens per step
    /// (`auto` is then the kernels' own rounding, as in `serve`).
    pub fn start(
        model: Model,
        tokenizer: Arc<Tokenizer>,
        cache: CacheConfig,
        device: Device,
        speculative: SpeculativeConfig,
    ) -> Result<SingleUser> {
        SingleUser::start_with_slots(model, tokenizer, cache, device, speculative, 1)
    }

    /// [`Self::start`] with `slots` sequences running at once (`bench speculative --batch`).
    pub fn start_with_slots(
        mut model: Model,
        tokenizer: Arc<Tokenizer>,
        cache: CacheConfig,
        device: Device,
        speculative: SpeculativeConfig,
        slots: usize,
    ) -> Result<SingleUser> {
        let mut config = EngineConfig::new(cache);
        config.speculative = speculative;
        config.max_seqs = slots.max(1);
        config.bank = BankConfig::default();
        config.reduced_sampling = crate::config::reduced_sampling()?;
        let engine = match device {
            Device::Cpu => {
                // llama.cpp's rounding depends on how many tokens a step feeds, so a verification
                // step would not score a draft exactly as plain decoding does: with drafting,
                // `auto` stays for the engine to resolve to the path-invariant numerics.
                let drafting = config.speculative.mode != DraftMode::Off;
                if drafting && matches!(model.attn_numerics(), AttnNumerics::Ggml(_)) {
                    bail!(
                        "--attn-numerics ggml rounds as llama.cpp step by step, which depends on the tokens per step: \
                         it cannot verify drafts exactly; use --attn-numerics fast or auto with --speculative"
                    );
                }
                if !drafting {
                    let numerics = model.attn_numerics_for(config.cache.format);
                    model.set_attn_numerics(numerics);
                }
                Engine::start(model, tokenizer, config)?
            }
            Device::Cuda(n) => {
                config.cache = super::cuda::gpu_cache(config.cache);
                Engine::start_with(super::cuda::gpu_model_builder(n, model, false)?, tokenizer, config)?
            }
        };
        Ok(SingleUser { engine })
    }

    pub fn handle(&self) -> EngineHandle {
        self.engine.handle()
    }

    /// The engine's counters and pool state as of its last step.
    pub fn metrics(&self) -> EngineMetrics {
        self.engine.handle().metrics()
    }

    /// Where the model runs (`cpu`, or the GPU's name).
    pub fn device(&self) -> String {
        self.engine.handle().info().device.clone()
    }
}

/// A generation that ended on `length` before `max_tokens` and before the context window ran
/// out stopped because the pool had no block left for it: that is an error naming the pool,
/// never a silently short answer.
fn check_pool_room(user: &SingleUser, stats: &GenerationStats, max_tokens: usize) -> Result<()> {
    let window = user.handle().info().context_window;
    let held = stats.prompt_tokens + stats.generated;
    if stats.finish == Some(FinishReason::Length) && stats.generated < max_tokens && held < window {
        let m = user.metrics();
        bail!(
            "KV pool exhausted after {} generated tokens: the pool holds {} blocks of {} tokens; raise --num-blocks or --block-size",
            stats.generated,
            m.blocks_total,
            m.block_size
        );
    }
    Ok(())
}

/// Generates after `prompt` through the engine, calling `emit` with each piece of text ready to
/// show; returns the request's figures.
pub fn generate(
    user: &SingleUser,
    prompt: Vec<u32>,
    sampling: &SamplingArgs,
    mut emit: impl FnMut(&str) -> Result<()>,
) -> Result<GenerationStats> {
    let mut stats = GenerationStats { prompt_tokens: prompt.len(), ..Default::default() };
    if sampling.max_tokens == 0 {
        stats.finish = Some(FinishReason::Length);
        return Ok(stats);
    }
    let request = GenerationRequest {
        prompt,
        sampling: sampling.params(),
        stop: StopConditions {
            stop_strings: sampling.stop.clone(),
            max_tokens: sampling.max_tokens,
            ..Default::default()
        },
        logprobs: None,
        ignore_eos: false,
        grammar: None,
        speculative: true,
    };
    let before = user.metrics();
    let t0 = Instant::now();
    let mut stream = user.handle().submit(request)?;
    let mut first: Option<Instant> = None;
    loop {
        match stream.recv() {
            Some(Event::Token { text, .. }) => {
                first.get_or_insert_with(Instant::now);
                emit(&text)?;
            }
            Some(Event::Done { finish_reason, usage, text, .. }) => {
                emit(&text)?;
                let end = Instant::now();
                let first = first.unwrap_or(end);
                stats.reused_tokens = usage.cached_tokens;
                stats.generated = usage.completion_tokens;
                stats.prefill_s = (first - t0).as_secs_f64();
                stats.decode_s = (end - first).as_secs_f64();
                stats.finish = Some(finish_reason);
                // The scheduler publishes its counters before it sends `Done`.
                stats.drafts = DraftStats::between(&before, &user.metrics());
                check_pool_room(user, &stats, sampling.max_tokens)?;
                return Ok(stats);
            }
            Some(Event::Error(e)) => return Err(e.into()),
            None => bail!("the engine ended the generation without a result"),
        }
    }
}
