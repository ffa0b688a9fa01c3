//! `pagekv bench decode`: prompt-processing and decode tokens/s of a model at short and long
//! context, per KV format, on the threads given (`--threads` / `PAGEKV_THREADS`).
//!
//! For each (format, context), `--runs` times: prefill `context` tokens of real text into an
//! empty cache (timed: pp tok/s), then decode `--decode-tokens` tokens greedily (timed: tg
//! tok/s); each figure is the median of its runs. Each pagekv row also gives the
//! decode rate as a fraction of the memory roofline (weights plus the K/V each layer's window
//! reads) and the KV the prompt keeps resident (`KV MiB`: the blocks holding its tokens, so a
//! hybrid cache's freed sliding-window blocks are not counted). With `--llama-cpp PYTHON`, the
//! same shapes are measured with llama-cpp-python (that interpreter must have it installed) in
//! the same run, for a like-for-like comparison; `--llama-cpp-kv` picks llama.cpp's KV types
//! (f16 as llama-cpp-python sets it up by default, or with flash attention, or q8_0 / q4_0 —
//! quantized V needs llama.cpp's flash attention), one row per type and context, so a pagekv
//! format can be compared with llama.cpp's nearest one. `--device cuda` runs
//! `bench_decode_cuda.rs`.

use std::path::PathBuf;
use std::process::Command;
use std::time::Instant;

use anyhow::{bail, Context, Result};
use clap::{Args, ValueEnum};
use kvcache::KvFormat;
use pagekv_engine::sampling::argmax;
use pagekv_engine::Generator;
use serde_json::json;

use super::bench::round;
use crate::load::{cache_config, load};
use crate::settings::ModelArgs;

/// Tokens of the untimed warm-up prefill (and decode steps) before the first row.
const WARMUP_TOKENS: usize = 16;

#[derive(Args, Debug)]
pub struct DecodeArgs {
    #[arg(long)]
    pub json: bool,
    /// Comma-separated contexts (prompt tokens before decoding).
    #[arg(long, default_value = "128,4096")]
    pub contexts: String,
    /// Comma-separated KV formats (default: f16,q8,q4r,turbo; --kv-quant picks one).
    #[arg(long)]
    pub formats: Option<String>,
    /// Tokens decoded per run.
    #[arg(long, default_value_t = 64)]
    pub decode_tokens: usize,
    /// Runs per row, medians reported: on the CPU each run prefills the context and decodes
    /// after it; on the GPU the context is prefilled once and each run decodes after it.
    #[arg(long, default_value_t = 3)]
    pub runs: usize,
    /// Text the prompts are cut from (repeated as needed).
    #[arg(long, default_value = "/usr/share/common-licenses/Apache-2.0")]
    pub text: PathBuf,
    /// Also measure llama.cpp through this Python interpreter's llama-cpp-python.
    #[arg(long, value_name = "PYTHON")]
    pub llama_cpp: Option<PathBuf>,
    /// Also measure llama.cpp's own `llama-bench` (this binary) on the same file: after each
    /// f16 row, its prompt processing of that context and its decoding after that context.
    #[arg(long, value_name = "PATH")]
    pub llama_bench: Option<PathBuf>,
    /// llama.cpp KV cache types to measure with --llama-cpp, comma-separated.
    #[arg(long, value_enum, value_delimiter = ',', default_value = "f16")]
    pub llama_cpp_kv: Vec<LlamaCppKv>,
    /// Sequences decoded together (--device cuda; each prefilled with the same context).
    #[arg(long, default_value_t = 1)]
    pub batch: usize,
    /// Also time steps that feed T tokens per sequence with a logit row each — the step that
    /// verifies T − 1 drafted tokens — against the one-token step (--device cuda; 2 to 33).
    #[arg(long, value_name = "T", value_parser = clap::value_parser!(u64).range(2..=33))]
    pub verify_tokens: Option<u64>,
    #[command(flatten)]
    pub model: ModelArgs,
}

/// A llama.cpp KV cache setup for `--llama-cpp-kv`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum LlamaCppKv {
    /// f16 K and V, flash attention as llama-cpp-python's default leaves it.
    F16,
    /// f16 K and V with flash attention on.
    #[value(name = "f16-fa")]
    F16Fa,
    /// q8_0 K and V (flash attention on, as llama.cpp requires for a quantized V).
    #[value(name = "q8_0")]
    Q8_0,
    /// q4_0 K and V (flash attention on).
    #[value(name = "q4_0")]
    Q4_0,
}

impl LlamaCppKv {
    fn name(self) -> &'static str {
        match self {
            Self::F16 => "f16",
            Self::F16Fa => "f16-fa",
            Self::Q8_0 => "q8_0",
            Self::Q4_0 => "q4_0",
        }
    }

    /// `{name, type_k, type_v, flash_attn}` for the Python side; types are ggml's enum values
    /// (`GGML_TYPE_F16` 1, `Q4_0` 2, `Q8_0` 8); `flash_attn` null keeps the library's default.
    fn spec(self) -> serde_json::Value {
        let (ty, fa) = match self {
            Self::F16 => (1, None),
            Self::F16Fa => (1, Some(true)),
            Self::Q8_0 => (8, Some(true)),
            Self::Q4_0 => (2, Some(true)),
        };
        json!({"name": self.name(), "type_k": ty, "type_v": ty, "flash_attn": fa})
    }
}

impl DecodeArgs {
    /// `--contexts` as positive token counts.
    pub fn context_list(&self) -> Result<Vec<usize>> {
        self.contexts
            .split(',')
            .map(|c| {
                c.trim()
                    .parse::<usize>()
                    .ok()
                    .filter(|&c| c > 0)
                    .with_context(|| format!("invalid context {c:?} in --contexts"))
            })
            .collect()
    }
}

/// `pagekv bench decode` on the CPU (`--device cuda` runs [`super::bench_decode_cuda::run`]).
pub fn run(a: DecodeArgs) -> Result<()> {
    if a.model.model.as_ref().is_some_and(|m| m.starts_with("synthetic:")) {
        bail!("synthetic models run on the GPU only: add --device cuda");
    }
    if a.verify_tokens.is_some() {
        bail!("--verify-tokens needs --device cuda (on the CPU, `bench speculative` times verification steps)");
    }
    if a.batch != 1 {
        bail!("--batch {} needs --device cuda (the CPU bench decodes one sequence)", a.batch);
    }
    let contexts = a.context_list()?;
    if a.decode_tokens == 0 || a.runs == 0 {
        bail!("--decode-tokens and --runs must be positive");
    }
    if a.llama_cpp.is_none() && a.llama_cpp_kv != [LlamaCppKv::F16] {
        bail!("--llama-cpp-kv needs --llama-cpp PYTHON");
    }
    let text = std::fs::read_to_string(&a.text).with_context(|| format!("cannot read {}", a.text.display()))?;
    let loaded = load(a.model.model.as_deref(), None)?;
    // Measure the steady state: the weights' background copy into huge pages complete.
    loaded.model.weights.wait_until_resident();
    let base = cache_config(&loaded.model)?;
    let formats = match (&a.formats, &a.model.cache.kv_quant) {
        (Some(list), _) => super::parse_formats(list)?,
        (None, Some(_)) => vec![base.format],
        (None, None) => vec![KvFormat::F16, KvFormat::Q8, KvFormat::Q4 { rotate: true }, KvFormat::TURBO_DEFAULT],
    };
    let max_ctx = *contexts.iter().max().unwrap_or(&1);
    let limit = loaded.model.config.context_length;
    if max_ctx + a.decode_tokens > limit {
        bail!("context {max_ctx} + {} decoded tokens exceeds the model's context length {limit}", a.decode_tokens);
    }
    let text_ids = loaded.tokenizer.encode(&text, false)?;
    if text_ids.is_empty() {
        bail!("{} holds no text", a.text.display());
    }
    let prompt: Vec<u32> = text_ids.iter().copied().cycle().take(max_ctx).collect();
    let pool = pagekv_cpu::threadpool::ThreadPool::global()?;
    let threads = pool.n_threads();
    let model_name = loaded.path.file_name().map(|f| f.to_string_lossy().into_owned()).unwrap_or_default();
    let gbps = super::anchors::stream_read_gbps(pool)?;
    let weight_bytes = loaded.model.weight_bytes_per_token();
    // The decode roofline at a context: every weight byte and every cached K/V byte attention
    // reads read once. A layer with a sliding window (per layer, as Gemma 3's local ones, or the
    // model's) reads only its window's positions.
    let windows: Vec<Option<usize>> = (0..loaded.model.config.num_layers)
        .map(|l| loaded.model.config.layer_windows.get(l).copied().flatten().or(loaded.model.config.sliding_window))
        .collect();
    let kv_read = move |ctx: usize, kv_bytes_per_token: usize| -> usize {
        let per_layer = kv_bytes_per_token / windows.len();
        windows.iter().map(|w| ctx.min(w.unwrap_or(usize::MAX)) * per_layer).sum()
    };
    let roofline =
        |ctx: usize, kv_bytes_per_token: usize| gbps * 1e9 / (weight_bytes + kv_read(ctx, kv_bytes_per_token)) as f64;
    let mut model = loaded.model;
    if !a.json {
        println!(
            "{model_name}, {threads} threads, {} decoded tokens per run, median of {} runs",
            a.decode_tokens, a.runs
        );
        println!(
            "weights read per token {:.1} MB; streaming read {gbps:.1} GB/s in this run; roofline at context 0: {:.1} tok/s",
            weight_bytes as f64 / 1e6,
            roofline(0, 0)
        );
        println!(
            "{:<12} {:<12} {:>8} {:>10} {:>10} {:>10} {:>8}",
            "engine", "format", "context", "pp tok/s", "tg tok/s", "roofline", "KV MiB"
        );
    }
    let f16_kv = KvFormat::F16.bytes_per_token(base.num_kv_heads, base.head_dim) * base.num_layers;
    let anchor = |ctx: usize| -> Result<()> {
        if let Some(bin) = &a.llama_bench {
            let r = super::anchors::llama_bench(bin, &loaded.path, threads, ctx, a.decode_tokens, a.runs)?;
            let row = Row {
                engine: "llama-bench",
                format: "f16",
                numerics: None,
                ctx,
                pp: r.pp,
                tg: r.tg,
                roofline: Some(r.tg / roofline(ctx, f16_kv)),
                kv_mib: None,
            };
            print_row(a.json, &row, threads, &model_name);
        }
        Ok(())
    };
    let measures_f16 = formats.contains(&KvFormat::F16);
    for (i, format) in formats.into_iter().enumerate() {
        let mut cfg = base.clone();
        cfg.format = format;
        cfg.dynamic_growth = true;
        cfg.num_blocks = cfg.num_blocks.max((max_ctx + a.decode_tokens).div_ceil(cfg.block_size) + 1);
        let numerics = model.attn_numerics_for(format).name();
        let cfg_bytes_per_token = cfg.bytes_per_token();
        let mut g = Generator::new(model, cfg)?;
        if i == 0 {
            // Untimed warm-up: the process's first forward steps touch the weights, the
            // thread pool and the kernels' buffers for the first time, which made the first
            // row measured run slow (pp at 128 about a third of the same row measured later).
            g.prefill(&prompt[..contexts[0].min(WARMUP_TOKENS)])?;
            let mut token = 0;
            for _ in 0..WARMUP_TOKENS.min(a.decode_tokens) {
                token = argmax(g.step(token)?);
            }
        }
        for &ctx in &contexts {
            // Each run prefills the prompt into an empty cache and decodes after it, as
            // llama-bench repeats both its prompt and its generation test `-r` times.
            let (mut pp, mut tg, mut kv_mib) = (Vec::new(), Vec::new(), 0.0);
            for _ in 0..a.runs {
                g.reset()?;
                let t = Instant::now();
                let (_, logits) = g.prefill(&prompt[..ctx])?;
                let mut token = argmax(logits);
                pp.push(ctx as f64 / t.elapsed().as_secs_f64());
                let (codes, scales) = g.pool().geometry().block_bytes_by_category();
                kv_mib = (g.sequence().blocks_holding_tokens() * (codes + scales)) as f64 / (1 << 20) as f64;
                let t = Instant::now();
                for _ in 0..a.decode_tokens {
                    token = argmax(g.step(token)?);
                }
                tg.push(a.decode_tokens as f64 / t.elapsed().as_secs_f64());
            }
            pp.sort_by(f64::total_cmp);
            tg.sort_by(f64::total_cmp);
            let row = Row {
                engine: "pagekv",
                format: &format.name(),
                numerics: Some(numerics),
                ctx,
                pp: pp[pp.len() / 2],
                tg: tg[tg.len() / 2],
                roofline: Some(tg[tg.len() / 2] / roofline(ctx, cfg_bytes_per_token)),
                kv_mib: Some(kv_mib),
            };
            print_row(a.json, &row, threads, &model_name);
            if format == KvFormat::F16 {
                anchor(ctx)?;
            }
        }
        model = g.into_model();
    }
    if !measures_f16 {
        for &ctx in &contexts {
            anchor(ctx)?;
        }
    }
    if let Some(python) = &a.llama_cpp {
        let path = crate::registry::resolve(a.model.model.as_deref())?;
        let kv: Vec<_> = a.llama_cpp_kv.iter().map(|k| k.spec()).collect();
        for row in llama_cpp(python, &path, &prompt, &contexts, &kv, a.decode_tokens, a.runs, threads)? {
            let row = Row {
                engine: "llama.cpp",
                format: &row.kv,
                numerics: None,
                ctx: row.context,
                pp: row.pp,
                tg: row.tg,
                roofline: None,
                kv_mib: None,
            };
            print_row(a.json, &row, threads, &model_name);
        }
    }
    Ok(())
}

/// One measured row: engine, KV format, the CPU attention numerics it ran (pagekv only),
/// context, prompt and decode tokens/s, and decode as a fraction of the memory roofline.
struct Row<'a> {
    engine: &'a str,
    format: &'a str,
    numerics: Option<&'a str>,
    ctx: usize,
    pp: f64,
    tg: f64,
    roofline: Option<f64>,
    /// KV the prompt's tokens keep resident (pagekv only): the blocks holding them.
    kv_mib: Option<f64>,
}

fn print_row(json_out: bool, r: &Row, threads: usize, model: &str) {
    if json_out {
        println!(
            "{}",
            json!({"engine": r.engine, "format": r.format, "attn_numerics": r.numerics, "context": r.ctx, "pp_tokens_per_s": round(r.pp, 1), "tg_tokens_per_s": round(r.tg, 1), "roofline_fraction": r.roofline.map(|f| round(f, 3)), "kv_resident_mib": r.kv_mib.map(|m| round(m, 1)), "threads": threads, "model": model})
        );
    } else {
        let (engine, format, ctx, pp, tg) = (r.engine, r.format, r.ctx, r.pp, r.tg);
        let roof = r.roofline.map(|f| format!("{:.0} %", 100.0 * f)).unwrap_or_default();
        let kv = r.kv_mib.map(|m| format!("{m:.1}")).unwrap_or_default();
        println!("{engine:<12} {format:<12} {ctx:>8} {pp:>10.1} {tg:>10.1} {roof:>10} {kv:>8}");
    }
}

/// One llama.cpp row: KV setup, context, prompt and decode tokens/s.
struct LlamaCppRow {
    kv: String,
    context: usize,
    pp: f64,
    tg: f64,
}

/// The llama-cpp-python side: same prompt tokens, same decode length, greedy, for each KV setup
/// in `kv` (`LlamaCppKv::spec`).
#[allow(clippy::too_many_arguments)]
fn llama_cpp(
    python: &PathBuf,
    model: &std::path::Path,
    prompt: &[u32],
    contexts: &[usize],
    kv: &[serde_json::Value],
    decode_tokens: usize,
    runs: usize,
    threads: usize,
) -> Result<Vec<LlamaCppRow>> {
    let input = json!({
        "model": model.display().to_string(), "prompt": prompt, "contexts": contexts, "kv": kv,
        "decode_tokens": decode_tokens, "runs": runs, "threads": threads,
    });
    let script = include_str!("llama_cpp_bench.py");
    let out = Command::new(python)
        .arg("-c")
        .arg(script)
        .arg(input.to_string())
        .output()
        .with_context(|| format!("cannot run {}", python.display()))?;
    if !out.status.success() {
        bail!(
            "llama-cpp-python benchmark failed: {}",
            String::from_utf8_lossy(&out.stderr).lines().last().unwrap_or("")
        );
    }
    let mut rows = Vec::new();
    for line in String::from_utf8_lossy(&out.stdout).lines().filter(|l| l.starts_with('{')) {
        let v: serde_json::Value = serde_json::from_str(line)?;
        let get = |k: &str| v[k].as_f64().with_context(|| format!("llama.cpp row without {k}: {line}"));
        let kv = v["kv"].as_str().with_context(|| format!("llama.cpp row without kv: {line}"))?.to_string();
        rows.push(LlamaCppRow { kv, context: get("context")? as usize, pp: get("pp")?, tg: get("tg")? });
    }
    Ok(rows)
}
