//! `pagekv bench speculative`: multi-token decoding against plain decoding, in one run, on one
//! model.
//!
//! 1. The verification cost (CPU): the time of one step that feeds `t` tokens with a logit row
//!    each (what verifying `t - 1` draft tokens costs) against a one-token step, at the first
//!    prompt's context; medians of 5.
//! 2. The workload (`edit`: code edits that return their input with a small change; `chat`: free
//!    answers), each prompt rendered with the model's chat template and generated greedily through
//!    the engine, plain and with drafts alternately (`--runs` pairs). Decode tokens/s is
//!    `(generated − 1) / (last token − first token)`; the outputs of the two must be identical
//!    (an error otherwise; on a GPU without `--batch-invariant` a reported difference, see
//!    [`Identity`]).
//! 3. With `--batch N`: N requests (the prompts in turn) at once, plain and then with drafts;
//!    every request's output must equal its prompt's output alone; tokens/s of the whole batch
//!    (all generated tokens over the time from the first submission to the last result).
//! 4. With `--llama-lookup` / `--llama-speculative`, llama.cpp's own prompt lookup and draft
//!    speculation on the same rendered prompts, model and thread count (`commands/anchors.rs`).

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context, Result};
use clap::Args;
use pagekv_engine::sampling::SamplingParams;
use pagekv_engine::{EngineMetrics, Event, GenerationRequest, Generator, SpeculativeConfig};
use pagekv_model::template::ChatMessage;
use serde_json::json;

use super::anchors::{llama_speculation, SpeculationAnchor};
use super::bench::round;
use super::generation::{DraftStats, SingleUser};
use crate::device::Device;
use crate::load::{cache_config, load};
use crate::settings::{ModelArgs, Speculative, SpeculativeArgs};

/// The built-in prompt sets: `(name, user message)`.
const EDIT: [(&str, &str); 3] = [
    ("edit1", include_str!("workloads/edit1.txt")),
    ("edit2", include_str!("workloads/edit2.txt")),
    ("edit3", include_str!("workloads/edit3.txt")),
];
const CHAT: [(&str, &str); 3] = [
    ("chat1", include_str!("workloads/chat1.txt")),
    ("chat2", include_str!("workloads/chat2.txt")),
    ("chat3", include_str!("workloads/chat3.txt")),
];
/// The system message of every workload prompt.
const SYSTEM: &str = "You are a helpful assistant.";

#[derive(Args, Debug)]
pub struct BenchSpeculativeArgs {
    /// Prompt set: edit (code edits that return their input with a small change) or chat (free
    /// answers).
    #[arg(long, default_value = "edit", value_parser = ["edit", "chat"])]
    pub workload: String,
    /// Most tokens generated per prompt (greedy; the model's end token ends it earlier).
    #[arg(long, default_value_t = 256, value_parser = clap::value_parser!(u64).range(2..=8192))]
    pub max_tokens: u64,
    /// Plain / speculative pairs per prompt, alternating which goes first; medians reported.
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u64).range(1..=20))]
    pub runs: u64,
    /// Tokens per step of the verification-cost table (comma-separated; CPU only; empty skips it).
    #[arg(long, default_value = "1,2,3,5,9,17")]
    pub step_tokens: String,
    /// llama.cpp's `llama-lookup`: its prompt lookup on the same prompts, after pagekv's rows.
    #[arg(long, value_name = "PATH")]
    pub llama_lookup: Option<PathBuf>,
    /// llama.cpp's `llama-speculative`: draft speculation with the same draft model (needs
    /// `--speculative draft:MODEL`).
    #[arg(long, value_name = "PATH")]
    pub llama_speculative: Option<PathBuf>,
    /// Also run this many requests at once (the prompts in turn), plain and with drafts; 1: only
    /// one at a time.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..=256))]
    pub batch: u64,
    /// One JSON object per row.
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub model: ModelArgs,
    /// Drafting settings (default here: `--speculative ngram`).
    #[command(flatten)]
    pub speculative: SpeculativeArgs,
}

/// One generation's figures.
struct Gen {
    tokens: Vec<u32>,
    decode_tps: f64,
    drafts: Option<DraftStats>,
}

pub fn run(mut a: BenchSpeculativeArgs) -> Result<()> {
    let device = super::run::device()?;
    if a.speculative.speculative.is_none() {
        a.speculative.speculative = Some(Speculative::Ngram);
    }
    if a.speculative.speculative == Some(Speculative::Off) {
        bail!("--speculative off: nothing to compare; use ngram or draft:MODEL");
    }
    let step_tokens: Vec<usize> = a
        .step_tokens
        .split(',')
        .filter(|s| !s.trim().is_empty())
        .map(|s| s.trim().parse::<usize>().ok().filter(|&t| (1..=512).contains(&t)))
        .collect::<Option<_>>()
        .with_context(|| format!("invalid --step-tokens {:?}: comma-separated counts in 1..=512", a.step_tokens))?;
    let loaded = load(a.model.model.as_deref(), a.model.chat_template.as_deref())?;
    ensure!(
        loaded.template.origin() != pagekv_model::template::TemplateOrigin::Missing,
        "{} has no chat template: the workloads are chat prompts (give --chat-template)",
        loaded.path.display()
    );
    loaded.model.weights.wait_until_resident();
    let spec = a.speculative.config(device, &loaded.tokenizer, &loaded.model)?;
    let threads = pagekv_cpu::threadpool::ThreadPool::global()?.n_threads();
    let tok = Arc::new(loaded.tokenizer);
    let set: &[(&str, &str)] = if a.workload == "edit" { &EDIT } else { &CHAT };
    let prompts: Vec<(&str, String, Vec<u32>)> = set
        .iter()
        .map(|&(name, user)| {
            let text =
                loaded.template.render(&[ChatMessage::new("system", SYSTEM), ChatMessage::new("user", user)], true)?;
            let ids = tok.encode(&text, true)?;
            Ok((name, text, ids))
        })
        .collect::<Result<_>>()?;
    let cache = cache_config(&loaded.model)?;
    let mut model = loaded.model;
    if !a.json {
        println!(
            "bench speculative: {} ({}), {} workload, {} threads, greedy, up to {} tokens, {} with ≤ {} draft tokens",
            loaded.path.display(),
            device,
            a.workload,
            threads,
            a.max_tokens,
            mode_name(&a.speculative),
            spec.draft_tokens
        );
    }
    if device == Device::Cpu && !step_tokens.is_empty() {
        // The numerics the engine runs drafting with (path-invariant: `auto` becomes `fast`,
        // K-quant products in the row-invariant order).
        pagekv_model::Forward::ensure_path_invariance(&mut model);
        let (m, rows) = step_costs(model, cache.clone(), &prompts[0].2, &step_tokens)?;
        model = m;
        print_step_costs(&rows, a.json);
    }
    let user = SingleUser::start_with_slots(model, tok.clone(), cache, device, spec.clone(), a.batch as usize)?;
    let mut table = Vec::new();
    let mut alone = Vec::new();
    let mut identity = Identity::new(device)?;
    for (name, _, ids) in &prompts {
        let (mut plain, mut drafted) = (Vec::new(), Vec::new());
        for run in 0..a.runs {
            for speculative in [run % 2 == 1, run % 2 == 0] {
                let g = generate(&user, ids.clone(), a.max_tokens as usize, speculative)?;
                if speculative {
                    drafted.push(g)
                } else {
                    plain.push(g)
                }
            }
        }
        let same = plain.iter().chain(&drafted).all(|g| g.tokens == plain[0].tokens);
        identity.check(same, || format!("{name}: greedy output with drafts differs from the output without"))?;
        alone.push(plain[0].tokens.clone());
        table.push(Row::new(name, &plain, &drafted));
    }
    print_rows(&table, a.json, &mode_name(&a.speculative), &identity);
    if a.batch > 1 {
        identity.differing.clear();
        let batch: Vec<Vec<u32>> = (0..a.batch as usize).map(|i| prompts[i % prompts.len()].2.clone()).collect();
        let max = a.max_tokens as usize;
        let plain = generate_batch(&user, &batch, max, false)?;
        let drafted = generate_batch(&user, &batch, max, true)?;
        for (i, (p, d)) in plain.outputs.iter().zip(&drafted.outputs).enumerate() {
            let name = prompts[i % prompts.len()].0;
            let n = a.batch;
            identity.check(*p == alone[i % prompts.len()], || {
                format!("request {i} ({name}) of {n}: greedy output batched differs from the output alone")
            })?;
            identity.check(p == d, || {
                format!(
                    "request {i} ({name}) of {n}: greedy output batched with drafts differs from the output without"
                )
            })?;
        }
        print_batch(a.batch, &plain, &drafted, a.json, &mode_name(&a.speculative), &identity);
    }
    run_anchors(&a, &loaded.path, &prompts, &spec, threads)?;
    Ok(())
}

fn mode_name(s: &SpeculativeArgs) -> String {
    match &s.speculative {
        Some(Speculative::Draft(m)) => format!("draft:{m}"),
        Some(Speculative::Ngram) | None => "ngram".into(),
        Some(Speculative::Off) => "off".into(),
        Some(Speculative::Mtp) => "mtp".into(),
    }
}

/// Generates greedily after `prompt` and times the decode.
fn generate(user: &SingleUser, prompt: Vec<u32>, max_tokens: usize, speculative: bool) -> Result<Gen> {
    let mut r = GenerationRequest::new(prompt, max_tokens);
    r.sampling = SamplingParams { temperature: 0.0, ..SamplingParams::default() };
    r.speculative = speculative;
    let before = user.metrics();
    let mut stream = user.handle().submit(r)?;
    let (mut tokens, mut first, mut last) = (Vec::new(), None, Instant::now());
    loop {
        match stream.recv() {
            Some(Event::Token { id, .. }) => {
                last = Instant::now();
                first.get_or_insert(last);
                tokens.push(id);
            }
            Some(Event::Done { .. }) => break,
            Some(Event::Error(e)) => return Err(e.into()),
            None => bail!("the engine ended the generation without a result"),
        }
    }
    let span = first.map_or(Duration::ZERO, |f| last - f).as_secs_f64();
    let decode_tps = tokens.len().saturating_sub(1) as f64 / span.max(1e-9);
    let after: EngineMetrics = user.metrics();
    Ok(Gen { tokens, decode_tps, drafts: DraftStats::between(&before, &after).filter(|_| speculative) })
}

/// The identity checks of a run. Greedy output with drafts, or batched, must equal the output
/// alone without drafts: a difference is an error, except on a GPU without `--batch-invariant`,
/// whose kernels sum a token differently with other tokens beside it — there each difference
/// is reported (and the figures are still printed).
struct Identity {
    strict: bool,
    /// What differed (only when not strict).
    differing: Vec<String>,
}

impl Identity {
    fn new(device: Device) -> Result<Identity> {
        let strict = device == Device::Cpu || crate::config::batch_invariant()?;
        Ok(Identity { strict, differing: Vec::new() })
    }

    fn check(&mut self, same: bool, what: impl FnOnce() -> String) -> Result<()> {
        match (same, self.strict) {
            (true, _) => Ok(()),
            (false, true) => bail!("{}", what()),
            (false, false) => {
                let w = what();
                eprintln!("warning: {w} (a GPU without --batch-invariant)");
                self.differing.push(w);
                Ok(())
            }
        }
    }

    /// The summary's words on identity.
    fn summary(&self) -> String {
        match self.differing.len() {
            0 => "outputs identical".into(),
            n => format!("{n} outputs DIFFER (a GPU without --batch-invariant; see the warnings)"),
        }
    }
}

/// A batch of requests run at once: each one's tokens, and the batch's figures.
struct BatchGen {
    outputs: Vec<Vec<u32>>,
    tokens_per_s: f64,
    drafts: Option<DraftStats>,
}

/// Submits every prompt of `batch` at once (greedy, `max_tokens` each) and waits for all.
fn generate_batch(user: &SingleUser, batch: &[Vec<u32>], max_tokens: usize, speculative: bool) -> Result<BatchGen> {
    let before = user.metrics();
    let t0 = Instant::now();
    let streams = batch
        .iter()
        .map(|p| {
            let mut r = GenerationRequest::new(p.clone(), max_tokens);
            r.sampling = SamplingParams { temperature: 0.0, ..SamplingParams::default() };
            r.speculative = speculative;
            Ok(user.handle().submit(r)?)
        })
        .collect::<Result<Vec<_>>>()?;
    let mut outputs = Vec::with_capacity(batch.len());
    for mut stream in streams {
        let mut tokens = Vec::new();
        loop {
            match stream.recv() {
                Some(Event::Token { id, .. }) => tokens.push(id),
                Some(Event::Done { .. }) => break,
                Some(Event::Error(e)) => return Err(e.into()),
                None => bail!("the engine ended a generation without a result"),
            }
        }
        outputs.push(tokens);
    }
    let secs = t0.elapsed().as_secs_f64();
    let total: usize = outputs.iter().map(Vec::len).sum();
    let after = user.metrics();
    Ok(BatchGen {
        outputs,
        tokens_per_s: total as f64 / secs.max(1e-9),
        drafts: DraftStats::between(&before, &after).filter(|_| speculative),
    })
}

fn print_batch(n: u64, plain: &BatchGen, drafted: &BatchGen, json_out: bool, mode: &str, identity: &Identity) {
    let d = drafted.drafts.clone().unwrap_or_default();
    let acceptance = d.accepted as f64 / d.drafted.max(1) as f64;
    let per_step = d.generated as f64 / d.steps.max(1) as f64;
    let speedup = drafted.tokens_per_s / plain.tokens_per_s;
    if json_out {
        let v = json!({
            "batch": n, "mode": mode, "plain_tok_s": round(plain.tokens_per_s, 2),
            "speculative_tok_s": round(drafted.tokens_per_s, 2), "speedup": round(speedup, 3),
            "acceptance": round(acceptance, 3), "tokens_per_step": round(per_step, 2),
            "differing_outputs": identity.differing.len(),
        });
        println!("{v}");
        return;
    }
    println!(
        "batch of {n} at once (whole-batch tok/s, prefill included): plain {:.1}, {mode} {:.1}, {:.2}x; \
         {:.1} % of drafts kept, {:.2} tokens per sequence step; {} (against each prompt alone)",
        plain.tokens_per_s,
        drafted.tokens_per_s,
        speedup,
        100.0 * acceptance,
        per_step,
        identity.summary()
    );
}

/// One prompt's medians.
struct Row {
    name: String,
    tokens: usize,
    plain_tps: f64,
    spec_tps: f64,
    acceptance: f64,
    mean_accepted: f64,
    tokens_per_step: f64,
}

impl Row {
    fn new(name: &str, plain: &[Gen], drafted: &[Gen]) -> Row {
        let d = drafted[0].drafts.clone().unwrap_or_default();
        Row {
            name: name.into(),
            tokens: plain[0].tokens.len(),
            plain_tps: median(plain.iter().map(|g| g.decode_tps).collect()),
            spec_tps: median(drafted.iter().map(|g| g.decode_tps).collect()),
            acceptance: d.accepted as f64 / d.drafted.max(1) as f64,
            mean_accepted: d.accepted as f64 / d.draft_steps.max(1) as f64,
            tokens_per_step: d.generated as f64 / d.steps.max(1) as f64,
        }
    }
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    match v.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => v[n / 2],
        n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
}

fn print_rows(rows: &[Row], json_out: bool, mode: &str, identity: &Identity) {
    if json_out {
        for r in rows {
            let v = json!({
                "prompt": r.name, "mode": mode, "tokens": r.tokens,
                "plain_tok_s": round(r.plain_tps, 2), "speculative_tok_s": round(r.spec_tps, 2),
                "speedup": round(r.spec_tps / r.plain_tps, 3), "acceptance": round(r.acceptance, 3),
                "mean_accepted": round(r.mean_accepted, 2), "tokens_per_step": round(r.tokens_per_step, 2),
                "identical": !identity.differing.iter().any(|w| w.starts_with(&format!("{}:", r.name))),
            });
            println!("{v}");
        }
        return;
    }
    println!(
        "{:<8} {:>7} {:>12} {:>12} {:>8} {:>9} {:>10} {:>11}",
        "prompt",
        "tokens",
        "plain tok/s",
        format!("{mode} tok/s"),
        "speedup",
        "accepted",
        "mean kept",
        "tokens/step"
    );
    for r in rows {
        println!(
            "{:<8} {:>7} {:>12.2} {:>12.2} {:>7.2}x {:>8.1}% {:>10.2} {:>11.2}",
            r.name,
            r.tokens,
            r.plain_tps,
            r.spec_tps,
            r.spec_tps / r.plain_tps,
            100.0 * r.acceptance,
            r.mean_accepted,
            r.tokens_per_step
        );
    }
    let speedups: Vec<f64> = rows.iter().map(|r| r.spec_tps / r.plain_tps).collect();
    println!("median speedup {:.2}x ({} with and without drafts)", median(speedups), identity.summary());
}

/// A step of `t` tokens with a logit row each, against a one-token step.
struct StepCost {
    tokens: usize,
    ms: f64,
}

/// Times steps of each size in `sizes` after `prompt` (medians of 5; the cache is trimmed back
/// after each) and gives the model back.
fn step_costs(
    model: pagekv_model::Model,
    cache: kvcache::CacheConfig,
    prompt: &[u32],
    sizes: &[usize],
) -> Result<(pagekv_model::Model, Vec<StepCost>)> {
    let mut g = Generator::new(model, cache)?;
    g.prefill(prompt)?;
    let mut rows = Vec::new();
    for &t in sizes {
        let feed: Vec<u32> = prompt.iter().cycle().take(t).copied().collect();
        let mut times = Vec::new();
        for _ in 0..6 {
            let t0 = Instant::now();
            g.score(&feed)?;
            times.push(t0.elapsed().as_secs_f64() * 1e3);
            g.prefill(prompt)?;
        }
        // The first of each size warms its buffers.
        rows.push(StepCost { tokens: t, ms: median(times[1..].to_vec()) });
    }
    Ok((g.into_model(), rows))
}

fn print_step_costs(rows: &[StepCost], json_out: bool) {
    let base = rows.iter().find(|r| r.tokens == 1).map_or(f64::NAN, |r| r.ms);
    if json_out {
        for r in rows {
            println!(
                "{}",
                json!({"step_tokens": r.tokens, "step_ms": round(r.ms, 3), "vs_one_token": round(r.ms / base, 3)})
            );
        }
        return;
    }
    println!("verification cost: a step of t tokens, each with a logit row, against one token (medians of 5)");
    println!("{:>8} {:>10} {:>10} {:>16}", "tokens", "ms", "vs 1", "per extra token");
    for r in rows {
        let per = if r.tokens > 1 { format!("{:.3}", (r.ms / base - 1.0) / (r.tokens - 1) as f64) } else { "-".into() };
        println!("{:>8} {:>10.2} {:>10.2} {:>16}", r.tokens, r.ms, r.ms / base, per);
    }
}

/// llama.cpp's prompt lookup and draft speculation on the same rendered prompts.
fn run_anchors(
    a: &BenchSpeculativeArgs,
    model: &std::path::Path,
    prompts: &[(&str, String, Vec<u32>)],
    spec: &SpeculativeConfig,
    threads: usize,
) -> Result<()> {
    let draft = match &a.speculative.speculative {
        Some(Speculative::Draft(m)) => Some(crate::registry::resolve(Some(m))?),
        _ => None,
    };
    let tools = [
        ("llama-lookup", a.llama_lookup.as_ref(), None),
        ("llama-speculative", a.llama_speculative.as_ref(), draft.as_deref()),
    ];
    for (label, bin, draft) in tools {
        let Some(bin) = bin else { continue };
        if label == "llama-speculative" && draft.is_none() {
            bail!("--llama-speculative needs the draft model: give --speculative draft:MODEL");
        }
        let mut rows: Vec<(String, SpeculationAnchor)> = Vec::new();
        for (name, text, _) in prompts {
            let r = llama_speculation(bin, model, draft, text, threads, a.max_tokens as usize, spec.draft_tokens)?;
            rows.push((name.to_string(), r));
        }
        if a.json {
            for (name, r) in &rows {
                let v = json!({"prompt": name, "anchor": label, "tok_s": round(r.tok_s, 2),
                               "drafted": r.drafted, "accepted": r.accepted, "tokens": r.tokens});
                println!("{v}");
            }
        } else {
            println!("{label} (llama.cpp, same prompts, -t {threads}, --temp 0, -n {}):", a.max_tokens);
            for (name, r) in &rows {
                println!(
                    "{:<8} {:>7} {:>12.2} tok/s, drafted {}, accepted {} ({:.1} %)",
                    name,
                    r.tokens,
                    r.tok_s,
                    r.drafted,
                    r.accepted,
                    100.0 * r.accepted as f64 / r.drafted.max(1) as f64
                );
            }
        }
    }
    Ok(())
}
