//! The engine over the real default model: batching does not change greedy outputs, pool
//! exhaustion preempts and still completes every request identically, the session bank reuses
//! prompt prefixes (and only computes the rest), cancellation frees blocks, impossible requests
//! are refused up front.
//!
//! Needs /root/.cache/pagekv/models/SmolLM2-135M-Instruct.Q4_1.gguf (or `$PAGEKV_HOME/models/…`):
//! skipped with a message when absent, failed when `PAGEKV_REQUIRE_MODEL=1`.

use std::path::PathBuf;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use kvcache::CacheConfig;
use pagekv_cpu::attention::AttentionConfig;
use pagekv_engine::{
    BankConfig, Engine, EngineConfig, EngineError, Event, FinishReason, GenerationRequest, RequestStream,
    SamplingError, SamplingParams, Usage,
};
use pagekv_model::tokenizer::Tokenizer;
use pagekv_model::Model;

/// One engine at a time: the model's thread pool is shared by the process and the machine is small.
static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

fn model_path() -> Option<PathBuf> {
    let home = std::env::var("PAGEKV_HOME")
        .map(PathBuf::from)
        .unwrap_or_else(|_| PathBuf::from(std::env::var("HOME").unwrap_or_default()).join(".cache/pagekv"));
    let p = home.join("models/SmolLM2-135M-Instruct.Q4_1.gguf");
    if p.exists() {
        return Some(p);
    }
    if std::env::var("PAGEKV_REQUIRE_MODEL").is_ok_and(|v| v == "1") {
        panic!("PAGEKV_REQUIRE_MODEL=1 but the default model is missing at {}", p.display());
    }
    eprintln!("skipped: default model not found at {}", p.display());
    None
}

struct Setup {
    model: Model,
    tokenizer: Arc<Tokenizer>,
}

fn setup() -> Option<Setup> {
    let model = Model::load(&model_path()?, AttentionConfig::default()).unwrap();
    let tokenizer = Arc::new(Tokenizer::from_gguf(model.weights.file().metadata()).unwrap());
    Some(Setup { model, tokenizer })
}

struct Options {
    num_blocks: usize,
    max_batch_tokens: usize,
    max_seqs: usize,
    bank: bool,
    context_window: Option<usize>,
}

impl Default for Options {
    fn default() -> Self {
        Options { num_blocks: 512, max_batch_tokens: 256, max_seqs: 64, bank: false, context_window: Some(2048) }
    }
}

fn engine(o: Options) -> Option<(Engine, Arc<Tokenizer>)> {
    let Setup { model, tokenizer } = setup()?;
    let c = &model.config;
    let mut cache = CacheConfig::new(c.num_layers, c.num_kv_heads, c.head_dim);
    cache.num_blocks = o.num_blocks;
    cache.context_window = o.context_window;
    let mut config = EngineConfig::new(cache);
    config.max_batch_tokens = o.max_batch_tokens;
    config.max_seqs = o.max_seqs;
    config.bank = BankConfig { enabled: o.bank, ..BankConfig::default() };
    Some((Engine::start(model, tokenizer.clone(), config).unwrap(), tokenizer))
}

/// Everything a finished request produced.
#[derive(Debug, Clone, PartialEq)]
struct Outcome {
    tokens: Vec<u32>,
    text: String,
    finish: FinishReason,
    usage: Usage,
    stop_sequence: Option<String>,
}

fn collect(mut stream: RequestStream) -> Outcome {
    let (mut tokens, mut text) = (Vec::new(), String::new());
    loop {
        match stream.recv_timeout(Duration::from_secs(300)).expect("an event within 5 minutes") {
            Event::Token { id, text: t, .. } => {
                tokens.push(id);
                text.push_str(&t);
            }
            Event::Done { finish_reason, usage, text: t, stop_sequence } => {
                text.push_str(&t);
                assert!(stream.recv().is_none(), "nothing after Done");
                return Outcome { tokens, text, finish: finish_reason, usage, stop_sequence };
            }
            Event::Error(e) => panic!("request failed: {e}"),
        }
    }
}

/// Sixteen different prompts of different lengths (3 to ~120 tokens).
fn prompts(tok: &Tokenizer) -> Vec<Vec<u32>> {
    let topics = [
        "The history of the printing press",
        "How bees communicate",
        "Why the sky is blue",
        "A recipe for bread",
        "The rules of chess",
        "Photosynthesis",
        "The French revolution",
        "How a compiler works",
        "Volcanoes",
        "The water cycle",
        "Origami",
        "Black holes",
        "The Roman empire",
        "Jazz music",
        "Tides and the moon",
        "Paging in operating systems",
    ];
    topics
        .iter()
        .enumerate()
        .map(|(i, t)| {
            let filler = " Please explain it simply, step by step, with examples.".repeat(i % 6);
            tok.encode(&format!("{t}.{filler} In short:"), false).unwrap()
        })
        .collect()
}

fn greedy(prompt: Vec<u32>, max_tokens: usize) -> GenerationRequest {
    let mut r = GenerationRequest::new(prompt, max_tokens);
    r.ignore_eos = true;
    r
}

fn wait_for(engine: &Engine, what: &str, cond: impl Fn(&pagekv_engine::EngineMetrics) -> bool) {
    let h = engine.handle();
    let start = Instant::now();
    while !cond(&h.metrics()) {
        assert!(start.elapsed() < Duration::from_secs(60), "timed out waiting for {what}: {:?}", h.metrics());
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Runs each request alone on a fresh engine (bank off): the reference outputs.
fn alone(requests: &[GenerationRequest]) -> Option<Vec<Outcome>> {
    let (e, _) = engine(Options::default())?;
    let h = e.handle();
    Some(requests.iter().map(|r| collect(h.submit(r.clone()).unwrap())).collect())
}

#[test]
fn batched_with_fifteen_others_equals_alone() {
    let _g = serial();
    let Some((probe, tok)) = engine(Options::default()) else { return };
    drop(probe);
    let requests: Vec<GenerationRequest> = prompts(&tok).into_iter().map(|p| greedy(p, 12)).collect();
    let reference = alone(&requests).unwrap();
    // Small step budget: prompts are chunked and mixed with decodes of the others.
    let (e, _) = engine(Options { max_batch_tokens: 96, ..Options::default() }).unwrap();
    let h = e.handle();
    let streams: Vec<RequestStream> = requests.iter().map(|r| h.submit(r.clone()).unwrap()).collect();
    let batched: Vec<Outcome> = streams.into_iter().map(collect).collect();
    for (i, (a, b)) in reference.iter().zip(&batched).enumerate() {
        assert_eq!(a.tokens, b.tokens, "request {i}: batched output differs from alone");
        assert_eq!(a.text, b.text);
        assert_eq!(b.finish, FinishReason::Length);
        assert_eq!(b.usage.completion_tokens, 12);
        assert_eq!(b.usage.prompt_tokens, requests[i].prompt.len());
    }
    let m = h.metrics();
    assert_eq!(m.requests_finished, 16);
    assert!(m.steps < 16 * 13, "requests were batched ({} steps)", m.steps);
    assert_eq!(m.preemptions, 0);
    assert_eq!((m.running, m.waiting, m.blocks_used), (0, 0, 0));
    assert_eq!(m.blocks_free, m.blocks_total, "bank off: every block is back");
    let prompt_total: usize = requests.iter().map(|r| r.prompt.len()).sum();
    assert_eq!(m.computed_tokens as usize, prompt_total + 16 * 11, "each prompt token and each fed-back token once");
}

#[test]
fn pool_exhaustion_preempts_and_completes_every_request_identically() {
    let _g = serial();
    let Some((probe, tok)) = engine(Options::default()) else { return };
    drop(probe);
    let requests: Vec<GenerationRequest> = prompts(&tok).into_iter().take(10).map(|p| greedy(p, 40)).collect();
    let reference = alone(&requests).unwrap();
    let longest = requests.iter().map(|r| r.prompt.len() + 40).max().unwrap();
    // Room for about two and a half of the longest sequences.
    let num_blocks = (longest * 5 / 2).div_ceil(16);
    for bank in [false, true] {
        let (e, _) = engine(Options { num_blocks, bank, ..Options::default() }).unwrap();
        let h = e.handle();
        let streams: Vec<RequestStream> = requests.iter().map(|r| h.submit(r.clone()).unwrap()).collect();
        let outs: Vec<Outcome> = streams.into_iter().map(collect).collect();
        for (i, (a, b)) in reference.iter().zip(&outs).enumerate() {
            assert_eq!(a.tokens, b.tokens, "request {i} (bank {bank}) differs after preemption");
            assert_eq!(a.text, b.text, "request {i} (bank {bank}): streamed text differs");
            assert_eq!(b.usage.completion_tokens, 40);
        }
        let m = h.metrics();
        assert!(m.preemptions > 0, "the pool of {num_blocks} blocks should have run dry: {m:?}");
        assert_eq!(m.requests_finished, requests.len() as u64, "no request lost or duplicated");
        assert_eq!((m.running, m.waiting, m.blocks_used), (0, 0, 0));
        assert_eq!(m.blocks_free + m.blocks_cached, m.blocks_total);
    }
}

#[test]
fn shared_prefix_is_reused_and_only_the_rest_is_computed() {
    let _g = serial();
    let Some((e, tok)) = engine(Options { bank: true, ..Options::default() }) else { return };
    let h = e.handle();
    let system = tok
        .encode(
            "You are a careful assistant. Answer briefly and precisely, cite no sources, and never make things up. \
             Keep every answer under fifty words.",
            false,
        )
        .unwrap();
    let mut p1 = system.clone();
    p1.extend(tok.encode(" Question: what is a volcano? Answer:", false).unwrap());
    let first = collect(h.submit(greedy(p1.clone(), 24)).unwrap());
    assert_eq!(first.usage.cached_tokens, 0);
    let m1 = h.metrics();
    assert_eq!((m1.bank_hits, m1.bank_misses), (0, 1));
    assert!(m1.blocks_cached > 0 && m1.blocks_used == 0, "the finished sequence's blocks are banked: {m1:?}");

    // A different question after the same system prompt.
    let mut p2 = system.clone();
    p2.extend(tok.encode(" Question: why is the sea salty? Answer:", false).unwrap());
    let common = p1.iter().zip(&p2).take_while(|(a, b)| a == b).count();
    let second = collect(h.submit(greedy(p2.clone(), 8)).unwrap());
    let expect_cached = common / 16 * 16;
    assert!(expect_cached >= 16, "the test prompts share at least one block");
    assert_eq!(second.usage.cached_tokens, expect_cached);
    let m2 = h.metrics();
    assert_eq!((m2.bank_hits, m2.bank_misses, m2.bank_hit_tokens), (1, 1, expect_cached as u64));
    assert_eq!(
        m2.computed_tokens - m1.computed_tokens,
        (p2.len() - expect_cached + 7) as u64,
        "only the uncached prompt tokens and the fed-back tokens are computed"
    );

    // The next turn of the first conversation: its prompt, its answer and more.
    let mut p3 = p1.clone();
    p3.extend(&first.tokens);
    p3.extend(tok.encode(" Question: and a geyser? Answer:", false).unwrap());
    let third = collect(h.submit(greedy(p3.clone(), 8)).unwrap());
    // The bank holds p1 + all but the last generated token of the first turn.
    let held = p1.len() + first.tokens.len() - 1;
    assert_eq!(third.usage.cached_tokens, held / 16 * 16);
    assert!(third.usage.cached_tokens > p1.len() / 16 * 16, "the previous answer is reused too");

    // Reused K/V give the same output as a cold run.
    let cold = alone(&[greedy(p2, 8), greedy(p3, 8)]).unwrap();
    assert_eq!(cold[0].tokens, second.tokens);
    assert_eq!(cold[1].tokens, third.tokens);
}

#[test]
fn cancellation_returns_blocks_within_a_step() {
    let _g = serial();
    for bank in [false, true] {
        let Some((e, tok)) = engine(Options { bank, ..Options::default() }) else { return };
        let h = e.handle();
        let p = tok.encode("Write a very long story about a dragon who learns to paint.", false).unwrap();
        let keep = h.submit(greedy(p.clone(), 6)).unwrap();
        let mut s = h.submit(greedy(p, 500)).unwrap();
        for _ in 0..3 {
            assert!(matches!(s.recv(), Some(Event::Token { .. })));
        }
        assert!(h.metrics().blocks_used > 0);
        drop(s);
        let _ = collect(keep);
        wait_for(&e, "the cancelled request to leave", |m| m.running == 0 && m.waiting == 0);
        let m = h.metrics();
        assert_eq!(m.requests_cancelled, 1);
        assert_eq!(m.blocks_used, 0, "{m:?}");
        if bank {
            assert!(m.blocks_cached > 0);
            assert_eq!(m.blocks_free + m.blocks_cached, m.blocks_total);
        } else {
            assert_eq!(m.blocks_free, m.blocks_total);
        }
    }
}

#[test]
fn impossible_and_invalid_requests_are_rejected_up_front() {
    let _g = serial();
    let Some((e, tok)) = engine(Options { num_blocks: 8, context_window: Some(256), ..Options::default() }) else {
        return;
    };
    let h = e.handle();
    let ok = tok.encode("Hello there.", false).unwrap();
    let reject = |r: GenerationRequest| h.submit(r).err().expect("rejected");
    assert_eq!(reject(GenerationRequest::new(vec![], 4)), EngineError::EmptyPrompt);
    assert_eq!(
        reject(GenerationRequest::new(vec![ok[0]; 300], 4)),
        EngineError::PromptTooLong { prompt_tokens: 300, context_window: 256 }
    );
    assert_eq!(
        reject(GenerationRequest::new(vec![ok[0]; 129], 4)),
        EngineError::PromptExceedsPool { prompt_tokens: 129, needed_blocks: 9, pool_blocks: 8 }
    );
    assert_eq!(
        reject(GenerationRequest::new(vec![ok[0], 999_999], 4)),
        EngineError::TokenOutOfRange { id: 999_999, position: 1, vocab: 49152 }
    );
    assert_eq!(reject(GenerationRequest::new(ok.clone(), 0)), EngineError::ZeroMaxTokens);
    let mut r = GenerationRequest::new(ok.clone(), 4);
    r.sampling = SamplingParams { top_p: 0.0, ..SamplingParams::default() };
    assert_eq!(reject(r), EngineError::Sampling(SamplingError::TopPOutOfRange(0.0)));
    let mut r = GenerationRequest::new(ok.clone(), 4);
    r.logprobs = Some(21);
    assert_eq!(reject(r), EngineError::TooManyLogprobs { got: 21, max: 20 });
    // A prompt that fills the whole pool is accepted and ends when the pool is full.
    let full = collect(h.submit(greedy(vec![ok[0]; 120], 50)).unwrap());
    assert_eq!(full.finish, FinishReason::Length);
    assert!(full.usage.completion_tokens >= 1 && full.usage.completion_tokens <= 9, "{:?}", full.usage);
    // And the engine still serves normal requests.
    let out = collect(h.submit(greedy(ok, 3)).unwrap());
    assert_eq!(out.usage.completion_tokens, 3);
    assert_eq!(h.metrics().requests_submitted, 2, "rejected requests never reach the scheduler");
}

#[test]
fn stop_strings_logprobs_and_seeded_sampling_through_the_engine() {
    let _g = serial();
    let Some((e, tok)) = engine(Options { bank: true, ..Options::default() }) else { return };
    let h = e.handle();
    let p = tok.encode("List three colors: red, green,", false).unwrap();
    let base = collect(h.submit(greedy(p.clone(), 16)).unwrap());
    // Stop at a string taken from the middle of the greedy output: the text before it only.
    let cut = base.text.char_indices().nth(base.text.chars().count() / 2).map(|(i, _)| i).unwrap();
    let stop: String = base.text[cut..].chars().take(3).collect();
    let mut r = greedy(p.clone(), 16);
    r.stop.stop_strings = vec![stop.clone()];
    let stopped = collect(h.submit(r).unwrap());
    assert_eq!(stopped.finish, FinishReason::Stop);
    assert_eq!(stopped.stop_sequence.as_deref(), Some(stop.as_str()));
    assert_eq!(stopped.text, base.text[..base.text.find(&stop).unwrap()]);
    assert_eq!(base.stop_sequence, None);
    // Logprobs: the greedy token is the most likely one.
    let mut r = greedy(p.clone(), 4);
    r.logprobs = Some(3);
    let mut s = h.submit(r).unwrap();
    let mut seen = 0;
    while let Some(ev) = s.recv() {
        if let Event::Token { id, logprobs: Some(lp), .. } = ev {
            assert_eq!(lp.token, id);
            assert_eq!(lp.top.len(), 3);
            assert_eq!(lp.top[0].0, id);
            assert!(lp.logprob <= 0.0 && (lp.logprob - lp.top[0].1).abs() < 1e-6);
            seen += 1;
        }
    }
    assert_eq!(seen, 4);
    // Seeded sampling is reproducible, alone or next to another request.
    let sampled = |seed| {
        let mut r = greedy(p.clone(), 12);
        r.sampling = SamplingParams { temperature: 0.9, top_p: 0.95, seed, ..SamplingParams::default() };
        r
    };
    let a = collect(h.submit(sampled(5)).unwrap());
    let other = h.submit(greedy(p.clone(), 12)).unwrap();
    let b = collect(h.submit(sampled(5)).unwrap());
    let _ = collect(other);
    assert_eq!(a.tokens, b.tokens);
}

#[test]
fn shared_prefixes_preemption_and_cancellation_together() {
    let _g = serial();
    let Some((probe, tok)) = engine(Options::default()) else { return };
    drop(probe);
    let system = tok
        .encode("System: you are a terse assistant who answers in one sentence and never repeats the question.", false)
        .unwrap();
    let questions = [
        "What is rust?",
        "What is a monad?",
        "Why do cats purr?",
        "How far is the moon?",
        "What is entropy?",
        "Who built the pyramids?",
        "What is a qubit?",
        "Why is ice slippery?",
        "How do vaccines work?",
        "What is inflation?",
    ];
    let requests: Vec<GenerationRequest> = questions
        .iter()
        .map(|q| {
            let mut p = system.clone();
            p.extend(tok.encode(&format!(" User: {q} Assistant:"), false).unwrap());
            greedy(p, 24)
        })
        .collect();
    let reference = alone(&requests).unwrap();
    let longest = requests.iter().map(|r| r.prompt.len() + 24).max().unwrap();
    let num_blocks = (longest * 3).div_ceil(16);
    let (e, _) = engine(Options { num_blocks, bank: true, max_batch_tokens: 64, ..Options::default() }).unwrap();
    let h = e.handle();
    let mut streams: Vec<Option<RequestStream>> = requests.iter().map(|r| Some(h.submit(r.clone()).unwrap())).collect();
    // Cancel three of them once they have produced a couple of tokens.
    let cancelled = [1usize, 4, 7];
    for &i in &cancelled {
        let mut s = streams[i].take().unwrap();
        for _ in 0..2 {
            assert!(matches!(s.recv(), Some(Event::Token { .. })));
        }
        drop(s);
    }
    for (i, s) in streams.into_iter().enumerate() {
        let Some(s) = s else { continue };
        let out = collect(s);
        assert_eq!(out.tokens, reference[i].tokens, "request {i}");
        assert_eq!(out.text, reference[i].text, "request {i}");
    }
    wait_for(&e, "everything to settle", |m| m.running == 0 && m.waiting == 0);
    let m = h.metrics();
    assert!(m.preemptions > 0, "{m:?}");
    assert!(m.bank_hits > 0, "the shared system prompt was reused: {m:?}");
    assert_eq!(m.requests_finished + m.requests_cancelled, requests.len() as u64);
    assert_eq!(m.requests_cancelled, cancelled.len() as u64);
    assert_eq!(m.blocks_used, 0);
    assert_eq!(m.blocks_free + m.blocks_cached, m.blocks_total);
}
