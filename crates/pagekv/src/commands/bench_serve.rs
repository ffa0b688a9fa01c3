//! `pagekv bench serve`: the server in-process (engine, adapter and HTTP server, as `pagekv
//! serve` builds them) on 127.0.0.1, driven by streaming clients on loopback (tokio tasks
//! reading SSE over hyper).
//!
//! Rows:
//! - one per client count (`--clients`, default 1, 8, 32): every client streams one
//!   `/v1/completions` request of `--prompt-tokens` distinct tokens for up to `--max-tokens`
//!   tokens, all at once. Output tokens/s in total (tokens reported by `usage` ÷ wall time from
//!   the first request to the last `[DONE]`), time to first token and inter-token latency
//!   (p50/p99, as the clients see them), and pool utilization: live tokens ÷ token slots of
//!   the blocks running sequences hold (the same ratio in bytes: every slot is the same size),
//!   summed over snapshots of the engine taken every 10 ms while anything runs;
//! - `batching`: output tokens/s at 8 clients ÷ at 1 client;
//! - `session_bank`: a `--prefix-tokens` prompt prefix shared by two requests that generate
//!   one token each: time to first token of the first (a miss: computes the whole prompt) and
//!   of the second (a hit: takes the prefix from the bank), median over `--prefix-runs` fresh
//!   prefixes, and their ratio.
//!
//! - `json_schema` (with `--json-schema FILE`): every client-count row runs twice, free then
//!   with every request carrying `response_format: json_schema` (strict) with that schema;
//!   the constrained row's output tokens/s ÷ the free row's, and the engine's grammar-mask time
//!   per constrained token (`pagekv_grammar_mask_seconds_total` ÷ `pagekv_grammar_masks_total`
//!   over the row). `crates/pagekv/src/commands/workloads/person.schema.json` is an example.
//!
//! `--device cuda[:N]` (feature `cuda`) runs the engine over the GPU model, as `pagekv serve`
//! does. Prompts are token ids (the completions API takes them), so lengths are exact; each starts
//! with a tag of its own, so no two rows share a block and the bank serves only the prefix row.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context, Result};
use bytes::Bytes;
use clap::Args;
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;
use pagekv_engine::{BankConfig, Engine, EngineConfig, EngineHandle};
use pagekv_model::tokenizer::Tokenizer;
use pagekv_server::{Server, ServerConfig};
use serde_json::{json, Value};
use tokio::net::TcpStream;

use super::bench::round;
use crate::device::Device;
use crate::engine_backend::EngineBackend;
use crate::load::{cache_config, load};
use crate::settings::{ModelArgs, SpeculativeArgs};

#[derive(Args, Debug)]
pub struct BenchServeArgs {
    /// One JSON object per row.
    #[arg(long)]
    pub json: bool,
    /// Comma-separated numbers of concurrent streaming clients.
    #[arg(long, default_value = "1,8,32")]
    pub clients: String,
    /// Prompt tokens of each client's request.
    #[arg(long, default_value_t = 64, value_parser = clap::value_parser!(u64).range(8..))]
    pub prompt_tokens: u64,
    /// Tokens each client asks for (the model may stop earlier at its end-of-text token).
    #[arg(long, default_value_t = 128, value_parser = clap::value_parser!(u64).range(2..))]
    pub max_tokens: u64,
    /// Length of the shared prefix of the session-bank row (0 skips the row).
    #[arg(long, default_value_t = 2000)]
    pub prefix_tokens: u64,
    /// Fresh prefixes measured in the session-bank row; the median is reported.
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u64).range(1..))]
    pub prefix_runs: u64,
    /// Most tokens in one forward step (as `pagekv serve`).
    #[arg(long, default_value_t = 512, value_parser = clap::value_parser!(u64).range(1..))]
    pub max_batch_tokens: u64,
    /// Most sequences running at once (as `pagekv serve`).
    #[arg(long, default_value_t = 64, value_parser = clap::value_parser!(u64).range(1..))]
    pub max_seqs: u64,
    /// A JSON Schema file: each client-count row also runs constrained to it
    /// (`response_format: json_schema`), and the constrained/free throughput is reported.
    #[arg(long, value_name = "FILE")]
    pub json_schema: Option<std::path::PathBuf>,
    #[command(flatten)]
    pub model: ModelArgs,
    #[command(flatten)]
    pub speculative: SpeculativeArgs,
}

/// Text the prompts are cut from (cycled as needed), after a per-request tag.
const PROSE: &str = "The harbour town woke slowly. Fishing boats came in with the tide, and the \
    market filled with voices, baskets and the smell of bread. An old clockmaker opened his \
    shutters, wound the great clock above his door, and watched the gulls circle the lighthouse. \
    Children ran along the sea wall, counting ships on the horizon, while their teachers called \
    them back to lessons about rivers, mountains and the long roads that joined one city to \
    another. By noon the wind had turned, clouds gathered over the hills, and the first drops of \
    rain darkened the stones of the square.";

/// What one streaming client saw.
struct ClientRun {
    /// Request sent → first token chunk.
    ttft: Duration,
    /// Gaps between consecutive token chunks.
    gaps: Vec<Duration>,
    /// `usage.completion_tokens`.
    completion_tokens: usize,
    /// `usage.prompt_tokens_details.cached_tokens`.
    cached_tokens: usize,
}

/// One client-count row.
struct Row {
    clients: usize,
    output_tokens: usize,
    wall: Duration,
    ttft: Vec<Duration>,
    gaps: Vec<Duration>,
    /// Σ live tokens and Σ slots of used blocks over the engine snapshots taken while running.
    live_tokens: u64,
    slots: u64,
    preemptions: u64,
    /// The requests carried the `--json-schema` schema.
    constrained: bool,
    /// Grammar masks the engine computed during the row, and the seconds it spent on them.
    masks: u64,
    mask_seconds: f64,
}

pub fn run(a: BenchServeArgs) -> Result<()> {
    let device = super::run::device()?;
    let clients: Vec<usize> =
        a.clients
            .split(',')
            .map(|c| {
                c.trim().parse::<usize>().ok().filter(|&c| c > 0 && c <= 1024).with_context(|| {
                    format!("invalid client count {c:?} in --clients: expected numbers from 1 to 1024")
                })
            })
            .collect::<Result<_>>()?;
    let schema: Option<Arc<Value>> = match &a.json_schema {
        None => None,
        Some(path) => {
            let text = std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
            let v: Value = serde_json::from_str(&text)
                .with_context(|| format!("--json-schema {}: not a JSON document", path.display()))?;
            ensure!(v.is_object(), "--json-schema {}: a JSON Schema is an object", path.display());
            Some(Arc::new(v))
        }
    };
    let loaded = load(a.model.model.as_deref(), a.model.chat_template.as_deref())?;
    // Measure the steady state: the weights' background copy into huge pages complete.
    loaded.model.weights.wait_until_resident();
    let mut cache = cache_config(&loaded.model)?;
    if let Device::Cuda(_) = device {
        cache = super::cuda::gpu_cache(cache);
    }
    let window = cache.context_window.unwrap_or(loaded.model.config.context_length);
    let (prompt_tokens, max_tokens, prefix) =
        (a.prompt_tokens as usize, a.max_tokens as usize, a.prefix_tokens as usize);
    ensure!(
        prompt_tokens + max_tokens <= window,
        "--prompt-tokens {prompt_tokens} + --max-tokens {max_tokens} exceed the context window {window}"
    );
    ensure!(prefix + 64 <= window, "--prefix-tokens {prefix} (+ 64) exceeds the context window {window}");
    let config = EngineConfig {
        cache,
        max_batch_tokens: a.max_batch_tokens as usize,
        max_seqs: a.max_seqs as usize,
        bank: BankConfig::default(),
        reduced_sampling: crate::config::reduced_sampling()?,
        speculative: a.speculative.config(device, &loaded.tokenizer, &loaded.model)?,
    };
    let model_id = model_id(&loaded.path);
    let tokenizer = Arc::new(loaded.tokenizer);
    let prompts = Prompts::new(tokenizer.clone())?;
    let engine = match device {
        Device::Cpu => Engine::start(loaded.model, tokenizer.clone(), config)?,
        Device::Cuda(n) => {
            Engine::start_with(super::cuda::gpu_model_builder(n, loaded.model, false)?, tokenizer.clone(), config)?
        }
    };
    let handle = engine.handle();
    let info = handle.info().clone();
    let backend = Arc::new(EngineBackend::new(engine.handle(), tokenizer, loaded.template, model_id.clone()));
    let threads = crate::config::env_lookup("PAGEKV_THREADS").and_then(|t| t.parse::<usize>().ok());
    let threads = threads.unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));

    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
    let result = runtime.block_on(async {
        let server_config = ServerConfig {
            host: "127.0.0.1".into(),
            port: 0,
            api_key: None,
            max_body_bytes: 16 << 20,
            grace_period: Duration::ZERO,
            request_timeout: None,
            served_model_names: Vec::new(),
        };
        let server = Server::bind(server_config, backend).await?;
        let addr = server.local_addr()?;
        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
        let serving = tokio::spawn(server.run(async move {
            let _ = stop_rx.await;
        }));
        let shape = Shape { prompt_tokens, max_tokens, schema };
        let measured = measure(addr, &handle, &prompts, &clients, &shape, prefix, a.prefix_runs as usize).await;
        let _ = stop_tx.send(());
        let _ = serving.await;
        measured
    });
    engine.shutdown(Duration::ZERO);
    let (rows, bank) = result?;

    let common = json!({
        "bench": "serve",
        "model": model_id,
        "device": info.device,
        "kv_format": info.kv_format,
        "block_size": info.block_size,
        "num_blocks": info.num_blocks,
        "max_batch_tokens": info.max_batch_tokens,
        "threads": threads,
    });
    let with_common = |mut v: Value| {
        if let (Some(o), Some(c)) = (v.as_object_mut(), common.as_object()) {
            for (k, x) in c {
                o.insert(k.clone(), x.clone());
            }
        }
        v
    };
    let rate = |r: &Row| r.output_tokens as f64 / r.wall.as_secs_f64().max(1e-9);
    // `(clients, constrained ÷ free tok/s, mask µs per constrained token)` per client count.
    // (clients, whole-run throughput ratio, decode-rate ratio, mask µs per token). The whole-run
    // ratio carries each request's prefill, so a constrained run whose outputs end sooner (a
    // closed JSON object) pays it over fewer tokens; the decode-rate ratio (mean inter-token gap,
    // free over constrained) is the per-token cost of the constraint alone.
    let schema_rows: Vec<(usize, f64, f64, Option<f64>)> = rows
        .iter()
        .filter(|r| r.constrained)
        .filter_map(|c| {
            let free = rows.iter().find(|f| !f.constrained && f.clients == c.clients)?;
            let mask_us = (c.masks > 0).then(|| c.mask_seconds * 1e6 / c.masks as f64);
            let decode = mean_secs(&free.gaps) / mean_secs(&c.gaps).max(1e-12);
            Some((c.clients, rate(c) / rate(free).max(1e-9), decode, mask_us))
        })
        .collect();
    let (rows, constrained): (Vec<Row>, Vec<Row>) = rows.into_iter().partition(|r| !r.constrained);
    let ratio_8_1 = match (rows.iter().find(|r| r.clients == 1), rows.iter().find(|r| r.clients == 8)) {
        (Some(one), Some(eight)) => Some(rate(eight) / rate(one).max(1e-9)),
        _ => None,
    };
    if a.json {
        for r in rows.iter().chain(&constrained) {
            println!(
                "{}",
                with_common(json!({
                    "row": if r.constrained { "clients_json_schema" } else { "clients" },
                    "clients": r.clients,
                    "prompt_tokens": prompt_tokens,
                    "max_tokens": max_tokens,
                    "output_tokens": r.output_tokens,
                    "wall_s": round(r.wall.as_secs_f64(), 3),
                    "output_tok_s": round(rate(r), 2),
                    "ttft_p50_ms": ms(percentile(&r.ttft, 50.0)),
                    "ttft_p99_ms": ms(percentile(&r.ttft, 99.0)),
                    "itl_p50_ms": ms(percentile(&r.gaps, 50.0)),
                    "itl_p99_ms": ms(percentile(&r.gaps, 99.0)),
                    "pool_utilization": utilization(r).map(|u| round(u, 4)),
                    "preemptions": r.preemptions,
                }))
            );
        }
        if let Some(x) = ratio_8_1 {
            println!("{}", with_common(json!({"row": "batching", "throughput_8_vs_1": round(x, 3)})));
        }
        for &(clients, ratio, decode, mask_us) in &schema_rows {
            println!(
                "{}",
                with_common(json!({
                    "row": "json_schema",
                    "clients": clients,
                    "constrained_vs_free": round(ratio, 3),
                    "decode_rate_vs_free": round(decode, 3),
                    "mask_us_per_token": mask_us.map(|m| round(m, 2)),
                }))
            );
        }
        if let Some(b) = &bank {
            println!(
                "{}",
                with_common(json!({
                    "row": "session_bank",
                    "prefix_tokens": prefix,
                    "runs": b.miss.len(),
                    "ttft_miss_ms": ms(median(&b.miss)),
                    "ttft_hit_ms": ms(median(&b.hit)),
                    "hit_speedup": round(median(&b.miss).as_secs_f64() / median(&b.hit).as_secs_f64().max(1e-9), 2),
                    "cached_tokens": b.cached_tokens,
                }))
            );
        }
        return Ok(());
    }
    println!(
        "pagekv serve in-process, {model_id} on {}, KV {} ({} blocks of {}), {threads} threads; {prompt_tokens}-token prompts, up to {max_tokens} tokens each",
        info.device, info.kv_format, info.num_blocks, info.block_size
    );
    println!(
        "{:>8} {:>8} {:>10} {:>10} {:>10} {:>10} {:>10} {:>8} {:>8}",
        "clients", "tokens", "tok/s", "TTFT p50", "TTFT p99", "ITL p50", "ITL p99", "pool", "preempt"
    );
    for r in rows.iter().chain(&constrained) {
        println!(
            "{:>8} {:>8} {:>10.1} {:>8.1}ms {:>8.1}ms {:>8.1}ms {:>8.1}ms {:>7.1}% {:>8}{}",
            r.clients,
            r.output_tokens,
            rate(r),
            ms(percentile(&r.ttft, 50.0)),
            ms(percentile(&r.ttft, 99.0)),
            ms(percentile(&r.gaps, 50.0)),
            ms(percentile(&r.gaps, 99.0)),
            utilization(r).unwrap_or(f64::NAN) * 100.0,
            r.preemptions,
            if r.constrained { "  json_schema" } else { "" }
        );
    }
    if let Some(x) = ratio_8_1 {
        println!("throughput at 8 clients / 1 client: {x:.2}x");
    }
    for &(clients, ratio, decode, mask_us) in &schema_rows {
        let mask = mask_us.map_or("no mask computed".to_string(), |m| format!("{m:.1} µs mask time per token"));
        println!(
            "json_schema at {clients} clients: {ratio:.2}x the free throughput (prefill included), {decode:.2}x its decode rate (inter-token gaps), {mask}"
        );
    }
    if let Some(b) = &bank {
        println!(
            "session bank, {prefix}-token shared prefix (median of {}): TTFT miss {:.1} ms, hit {:.1} ms ({:.1}x), {} tokens cached",
            b.miss.len(),
            ms(median(&b.miss)),
            ms(median(&b.hit)),
            median(&b.miss).as_secs_f64() / median(&b.hit).as_secs_f64().max(1e-9),
            b.cached_tokens
        );
    }
    Ok(())
}

/// TTFTs of bank misses and hits over a shared prefix.
struct BankRow {
    miss: Vec<Duration>,
    hit: Vec<Duration>,
    /// Cached tokens the last hit reported.
    cached_tokens: usize,
}

/// What every client-count row's requests look like.
struct Shape {
    prompt_tokens: usize,
    max_tokens: usize,
    /// `--json-schema`: each row also runs constrained to it.
    schema: Option<Arc<Value>>,
}

async fn measure(
    addr: SocketAddr,
    engine: &EngineHandle,
    prompts: &Prompts,
    clients: &[usize],
    shape: &Shape,
    prefix: usize,
    prefix_runs: usize,
) -> Result<(Vec<Row>, Option<BankRow>)> {
    // Warm-up: weights paged in, threads started (and the grammar's vocabulary trie built).
    stream_completion(addr, &prompts.make("warm-up", 32), 4, None).await?;
    if let Some(schema) = &shape.schema {
        stream_completion(addr, &prompts.make("warm-up schema", 32), 4, Some(schema.clone())).await?;
    }
    let mut rows = Vec::new();
    for (row, &n) in clients.iter().enumerate() {
        // Free, then constrained at the same client count (each row with prompts of its own).
        rows.push(client_row(addr, engine, prompts, 2 * row, n, shape, None).await?);
        if let Some(schema) = &shape.schema {
            rows.push(client_row(addr, engine, prompts, 2 * row + 1, n, shape, Some(schema.clone())).await?);
        }
    }
    let bank = if prefix > 0 { Some(bank_row(addr, prompts, prefix, prefix_runs).await?) } else { None };
    Ok((rows, bank))
}

async fn client_row(
    addr: SocketAddr,
    engine: &EngineHandle,
    prompts: &Prompts,
    row: usize,
    n: usize,
    shape: &Shape,
    schema: Option<Arc<Value>>,
) -> Result<Row> {
    let (prompt_tokens, max_tokens, constrained) = (shape.prompt_tokens, shape.max_tokens, schema.is_some());
    let before = engine.metrics();
    let running = Arc::new(AtomicBool::new(true));
    let sampler = {
        let (engine, running) = (engine.clone(), running.clone());
        tokio::spawn(async move {
            let (mut live, mut slots) = (0u64, 0u64);
            while running.load(Ordering::Relaxed) {
                let m = engine.metrics();
                if m.running > 0 {
                    live += m.live_tokens as u64;
                    slots += (m.blocks_used * m.block_size) as u64;
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            (live, slots)
        })
    };
    let start = Instant::now();
    let tasks: Vec<_> = (0..n)
        .map(|i| {
            let prompt = prompts.make(&format!("row {row} client {i}"), prompt_tokens);
            let schema = schema.clone();
            tokio::spawn(async move { stream_completion(addr, &prompt, max_tokens, schema).await })
        })
        .collect();
    let mut runs = Vec::with_capacity(n);
    for t in tasks {
        runs.push(t.await.context("client task panicked")??);
    }
    let wall = start.elapsed();
    running.store(false, Ordering::Relaxed);
    let (live_tokens, slots) = sampler.await.context("sampler task panicked")?;
    let after = engine.metrics();
    Ok(Row {
        clients: n,
        output_tokens: runs.iter().map(|r| r.completion_tokens).sum(),
        wall,
        ttft: runs.iter().map(|r| r.ttft).collect(),
        gaps: runs.iter().flat_map(|r| r.gaps.iter().copied()).collect(),
        live_tokens,
        slots,
        preemptions: after.preemptions - before.preemptions,
        constrained,
        masks: after.masks_computed - before.masks_computed,
        mask_seconds: after.mask_seconds - before.mask_seconds,
    })
}

async fn bank_row(addr: SocketAddr, prompts: &Prompts, prefix: usize, runs: usize) -> Result<BankRow> {
    let mut row = BankRow { miss: Vec::new(), hit: Vec::new(), cached_tokens: 0 };
    for run in 0..runs {
        let shared = prompts.make(&format!("shared prefix {run}"), prefix);
        let with_question = |q: &str| {
            let mut p = shared.clone();
            p.extend(prompts.words(q));
            p
        };
        // One token each: the first token is the answer, nothing waits behind it.
        let miss = stream_completion(addr, &with_question(" First question: what happened at noon?"), 1, None).await?;
        ensure!(miss.cached_tokens == 0, "the miss found {} cached tokens", miss.cached_tokens);
        let hit = stream_completion(addr, &with_question(" Second question: who wound the clock?"), 1, None).await?;
        ensure!(hit.cached_tokens > 0, "the second request over the shared prefix found nothing in the bank");
        row.miss.push(miss.ttft);
        row.hit.push(hit.ttft);
        row.cached_tokens = hit.cached_tokens;
    }
    Ok(row)
}

/// Builds token-id prompts of exact lengths.
struct Prompts {
    bos: Option<u32>,
    prose: Vec<u32>,
    tokenizer: Arc<Tokenizer>,
}

impl Prompts {
    fn new(tokenizer: Arc<Tokenizer>) -> Result<Prompts> {
        let prose = tokenizer.encode(PROSE, false)?;
        ensure!(!prose.is_empty(), "the tokenizer produced no tokens for the prompt text");
        Ok(Prompts { bos: tokenizer.bos_id(), prose, tokenizer })
    }

    /// `[BOS] "Request {tag}." prose…`, exactly `len` tokens (or the tag alone if longer).
    fn make(&self, tag: &str, len: usize) -> Vec<u32> {
        let mut ids: Vec<u32> = self.bos.into_iter().collect();
        ids.extend(self.words(&format!("Request {tag}.")));
        let mut prose = self.prose.iter().cycle();
        while ids.len() < len {
            ids.push(*prose.next().expect("cycle of a non-empty list"));
        }
        ids.truncate(len.max(1));
        ids
    }

    fn words(&self, text: &str) -> Vec<u32> {
        self.tokenizer.encode(text, false).unwrap_or_default()
    }
}

/// Streams one `/v1/completions` request over a fresh loopback connection, constrained to
/// `schema` (`response_format: json_schema`, strict) when there is one.
async fn stream_completion(
    addr: SocketAddr,
    prompt: &[u32],
    max_tokens: usize,
    schema: Option<Arc<Value>>,
) -> Result<ClientRun> {
    let mut body = json!({
        "prompt": prompt,
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream": true,
        "stream_options": {"include_usage": true},
    });
    if let Some(schema) = schema {
        body["response_format"] =
            json!({"type": "json_schema", "json_schema": {"name": "bench", "schema": &*schema, "strict": true}});
    }
    let body = body.to_string();
    let sent = Instant::now();
    let stream = TcpStream::connect(addr).await.context("connect to the server")?;
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream)).await?;
    tokio::spawn(async move {
        let _ = conn.await;
    });
    let request = hyper::Request::builder()
        .method("POST")
        .uri("/v1/completions")
        .header("host", addr.to_string())
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(body)))?;
    let response = sender.send_request(request).await?;
    let status = response.status();
    let mut body = response.into_body();
    if !status.is_success() {
        let text = body.collect().await.map(|b| b.to_bytes()).unwrap_or_default();
        bail!("the server answered {status}: {}", String::from_utf8_lossy(&text));
    }
    let mut buffer = String::new();
    let mut arrivals: Vec<Instant> = Vec::new();
    let mut usage: Option<Value> = None;
    let mut done = false;
    while !done {
        let Some(frame) = body.frame().await else { bail!("the stream ended without data: [DONE]") };
        let Ok(data) = frame?.into_data() else { continue };
        let now = Instant::now();
        buffer.push_str(std::str::from_utf8(&data).context("SSE is not UTF-8")?);
        while let Some(end) = buffer.find("\n\n") {
            let event: String = buffer.drain(..end + 2).collect();
            for line in event.lines() {
                let Some(data) = line.strip_prefix("data: ") else { continue };
                if data == "[DONE]" {
                    done = true;
                    continue;
                }
                let v: Value = serde_json::from_str(data).context("SSE data is not JSON")?;
                if v["usage"].is_object() {
                    usage = Some(v["usage"].clone());
                }
                // A token chunk: a choice without a finish reason.
                if v["choices"].get(0).is_some_and(|c| c["finish_reason"].is_null()) {
                    arrivals.push(now);
                }
            }
        }
    }
    let usage = usage.context("no usage in the stream")?;
    let first = *arrivals.first().context("the stream carried no token")?;
    Ok(ClientRun {
        ttft: first - sent,
        gaps: arrivals.windows(2).map(|w| w[1] - w[0]).collect(),
        completion_tokens: usage["completion_tokens"].as_u64().unwrap_or(0) as usize,
        cached_tokens: usage["prompt_tokens_details"]["cached_tokens"].as_u64().unwrap_or(0) as usize,
    })
}

fn utilization(r: &Row) -> Option<f64> {
    (r.slots > 0).then(|| r.live_tokens as f64 / r.slots as f64)
}

/// Nearest-rank percentile (zero for an empty list).
fn percentile(values: &[Duration], p: f64) -> Duration {
    if values.is_empty() {
        return Duration::ZERO;
    }
    let mut v = values.to_vec();
    v.sort_unstable();
    let rank = ((p / 100.0) * v.len() as f64).ceil().max(1.0) as usize;
    v[rank.min(v.len()) - 1]
}

/// Mean of `gaps` in seconds (0 for none).
fn mean_secs(gaps: &[Duration]) -> f64 {
    if gaps.is_empty() {
        return 0.0;
    }
    gaps.iter().map(Duration::as_secs_f64).sum::<f64>() / gaps.len() as f64
}

fn median(values: &[Duration]) -> Duration {
    percentile(values, 50.0)
}

fn ms(d: Duration) -> f64 {
    round(d.as_secs_f64() * 1e3, 2)
}

/// The file name without `.gguf` (as `pagekv serve` names the model).
fn model_id(path: &std::path::Path) -> String {
    let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_else(|| "model".into());
    name.strip_suffix(".gguf").unwrap_or(&name).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_rank_percentiles() {
        let ms = |v: &[u64]| v.iter().map(|&x| Duration::from_millis(x)).collect::<Vec<_>>();
        let v = ms(&[40, 10, 30, 20, 50, 60, 70, 80, 90, 100]);
        assert_eq!(percentile(&v, 50.0), Duration::from_millis(50));
        assert_eq!(percentile(&v, 99.0), Duration::from_millis(100));
        assert_eq!(percentile(&v, 10.0), Duration::from_millis(10));
        assert_eq!(percentile(&ms(&[7]), 99.0), Duration::from_millis(7));
        assert_eq!(percentile(&[], 50.0), Duration::ZERO);
    }
}
