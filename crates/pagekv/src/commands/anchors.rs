//! What the benchmarks measure pagekv against in the same run: llama.cpp's own `llama-bench`
//! on the same file ([`llama_bench`], `bench decode`), its prompt lookup and draft speculation
//! ([`llama_speculation`], `bench speculative`), and this machine's streaming-read bandwidth
//! ([`stream_read_gbps`]), from which a decode step's memory roofline follows.

use std::path::Path;
use std::process::Command;
use std::time::Instant;

use anyhow::{bail, Context, Result};
use pagekv_cpu::quant::hugepage::HugePageBuf;
use pagekv_cpu::threadpool::ThreadPool;

/// llama-bench's prompt and decode tokens/s at one context.
pub struct LlamaBenchRow {
    pub pp: f64,
    pub tg: f64,
}

/// Runs `llama-bench` twice on `model` with `threads` threads and `runs` repetitions: prompt
/// processing of `context` tokens (`-p context -n 0`), and decoding `decode_tokens` tokens after
/// a `context`-token prefix (`-p 0 -n decode_tokens -d context`, the prefix untimed), with its
/// default KV cache (f16). Returns llama-bench's mean tokens/s of each.
pub fn llama_bench(
    bin: &Path,
    model: &Path,
    threads: usize,
    context: usize,
    decode_tokens: usize,
    runs: usize,
) -> Result<LlamaBenchRow> {
    let one = |args: &[String]| -> Result<f64> {
        let out = Command::new(bin)
            .args(["-m", &model.display().to_string(), "-t", &threads.to_string(), "-r", &runs.to_string()])
            .args(["-o", "json"])
            .args(args)
            .env("LD_LIBRARY_PATH", library_path(bin))
            .output()
            .with_context(|| format!("cannot run {}", bin.display()))?;
        if !out.status.success() {
            let err = String::from_utf8_lossy(&out.stderr);
            bail!("{} {} failed ({}): {}", bin.display(), args.join(" "), out.status, err.lines().last().unwrap_or(""));
        }
        let rows: serde_json::Value =
            serde_json::from_slice(&out.stdout).with_context(|| format!("{} printed no JSON result", bin.display()))?;
        rows.as_array()
            .and_then(|r| r.first())
            .and_then(|r| r["avg_ts"].as_f64())
            .with_context(|| format!("llama-bench JSON without avg_ts: {rows}"))
    };
    let pp = one(&["-p".into(), context.to_string(), "-n".into(), "0".into()])?;
    let tg = one(&["-p".into(), "0".into(), "-n".into(), decode_tokens.to_string(), "-d".into(), context.to_string()])?;
    Ok(LlamaBenchRow { pp, tg })
}

/// Bytes of the buffer [`stream_read_gbps`] reads: larger than any cache.
const STREAM_BYTES: usize = 1 << 30;

/// Streaming-read bandwidth in GB/s with `pool`'s threads: the median of 5 passes summing a
/// 1 GiB huge-page buffer (written once first), split in 2 MiB pieces over the threads, as a
/// decode step reads its weights. A model small enough to stay partly in the last-level cache
/// (SmolLM2's 96 MB on a CPU with a large one) can decode above this roofline.
pub fn stream_read_gbps(pool: &ThreadPool) -> Result<f64> {
    const PIECE: usize = 2 << 20;
    let mut buf = HugePageBuf::zeroed(STREAM_BYTES).context("cannot allocate the bandwidth probe's buffer")?;
    for (i, chunk) in buf.as_mut_slice().chunks_mut(4096).enumerate() {
        chunk[0] = i as u8;
    }
    let data = buf.as_slice();
    let mut passes = Vec::new();
    let total = std::sync::atomic::AtomicU64::new(0);
    for _ in 0..5 {
        let t = Instant::now();
        pool.run(STREAM_BYTES / PIECE, |i, _| {
            // The buffer is 2 MiB-aligned, so its pieces are whole aligned u64 words.
            let words: &[u64] = bytemuck::cast_slice(&data[i * PIECE..(i + 1) * PIECE]);
            // Eight independent lanes (vector adds) so the adds keep up with the loads.
            let mut lanes = [0u64; 8];
            for c in words.chunks_exact(8) {
                for k in 0..8 {
                    lanes[k] = lanes[k].wrapping_add(c[k]);
                }
            }
            // Published, so the reads cannot be optimized away.
            total.fetch_add(lanes.iter().fold(0u64, |a, b| a.wrapping_add(*b)), std::sync::atomic::Ordering::Relaxed);
        });
        passes.push(STREAM_BYTES as f64 / t.elapsed().as_secs_f64() / 1e9);
    }
    std::hint::black_box(total.into_inner());
    passes.sort_by(f64::total_cmp);
    Ok(passes[passes.len() / 2])
}

/// What one run of llama.cpp's `llama-lookup` or `llama-speculative` reported.
pub struct SpeculationAnchor {
    /// Its decode tokens/s (`decoded N tokens in X seconds, speed: Y t/s`).
    pub tok_s: f64,
    pub tokens: usize,
    pub drafted: u64,
    pub accepted: u64,
}

/// Runs llama.cpp's prompt lookup (`llama-lookup`, `draft` = `None`) or draft speculation
/// (`llama-speculative -md draft`) on `prompt` (rendered text, given as a file) greedily with
/// `threads` threads, `max_tokens` tokens and at most `draft_tokens` draft tokens per step, and
/// reads its summary lines.
pub fn llama_speculation(
    bin: &Path,
    model: &Path,
    draft: Option<&Path>,
    prompt: &str,
    threads: usize,
    max_tokens: usize,
    draft_tokens: usize,
) -> Result<SpeculationAnchor> {
    let file = std::env::temp_dir().join(format!("pagekv-anchor-prompt-{}.txt", std::process::id()));
    std::fs::write(&file, prompt).with_context(|| format!("cannot write {}", file.display()))?;
    let mut cmd = Command::new(bin);
    cmd.args(["-m", &model.display().to_string(), "-f", &file.display().to_string()])
        .args(["-t", &threads.to_string(), "--temp", "0", "-n", &max_tokens.to_string(), "-c", "4096", "-s", "1"])
        .args(["--spec-draft-n-max", &draft_tokens.to_string()])
        .env("LD_LIBRARY_PATH", library_path(bin));
    if let Some(d) = draft {
        cmd.args(["-md", &d.display().to_string()]);
    }
    let out = cmd.output().with_context(|| format!("cannot run {}", bin.display()));
    let _ = std::fs::remove_file(&file);
    let out = out?;
    let log = String::from_utf8_lossy(&out.stderr);
    if !out.status.success() {
        bail!("{} failed ({}): {}", bin.display(), out.status, log.lines().last().unwrap_or(""));
    }
    // `… decoded  134 tokens in   70.382 seconds, speed:    1.904 t/s`
    let decoded = log
        .lines()
        .find_map(|l| l.split_once("decoded ").map(|(_, rest)| rest.to_string()))
        .with_context(|| format!("{} printed no `decoded … t/s` line", bin.display()))?;
    let tokens = decoded.split_whitespace().next().and_then(|n| n.parse().ok());
    let tok_s = decoded.split_once("speed:").and_then(|(_, s)| s.split_whitespace().next()?.parse().ok());
    // `… n_drafted    = 144`
    let counter = |name: &str| {
        log.lines().find_map(|l| {
            let (_, rest) = l.split_once(name)?;
            rest.trim_start().strip_prefix('=')?.trim().parse::<u64>().ok()
        })
    };
    match (tokens, tok_s, counter("n_drafted"), counter("n_accept")) {
        (Some(tokens), Some(tok_s), Some(drafted), Some(accepted)) => {
            Ok(SpeculationAnchor { tok_s, tokens, drafted, accepted })
        }
        _ => bail!("cannot read {}'s summary (decoded, n_drafted, n_accept): {decoded}", bin.display()),
    }
}

/// `LD_LIBRARY_PATH` with the directory of a llama.cpp tool first (its shared libraries lie
/// beside it).
fn library_path(bin: &Path) -> String {
    let lib_dir = bin.parent().unwrap_or(Path::new("."));
    match std::env::var_os("LD_LIBRARY_PATH") {
        Some(p) if !p.is_empty() => format!("{}:{}", lib_dir.display(), p.to_string_lossy()),
        _ => lib_dir.display().to_string(),
    }
}
