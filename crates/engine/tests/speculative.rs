//! Multi-token decoding with the n-gram drafter, a draft model and a model's own
//! next-token-prediction (MTP) layer, through the engine:
//! - greedy output with drafts is token for token the output without, on the default model, for
//!   512-token generations, alone and batched with 15 other sequences;
//! - sampled output follows the same distribution: the first three tokens of 20,000 seeded
//!   runs of a tiny model pass a chi-square test against 20,000 runs without drafts (8,000
//!   each under a grammar, whose mask each drafted row is verified against);
//! - with a JSON-schema grammar, greedy output with n-gram drafts (cut to what the grammar
//!   accepts) is token for token the constrained output without, on the default model;
//! - rollback: every step leaves each sequence exactly the blocks its offset needs (checked
//!   after every step in debug builds, which tests are), a preempted drafting sequence resumes
//!   with identical output, a cancelled one frees everything.
//!
//! - MTP: greedy output with `mtp` drafts is the output without, for 512-token generations alone
//!   and batched (with sequences that do not draft), on a tiny model whose MTP layer predicts
//!   what the model will say (more than 90 % of the drafts kept) and on a random one; sampled
//!   output passes the same chi-square test; drafting sequences survive preemption and
//!   cancellation, and every block of the MTP pool comes back; driven step by step, the MTP
//!   drafter's cache holds exactly the target's kept positions after every step (drafted entries
//!   trimmed, pending hidden states counted), and a long prompt's are fed before they pile up.
//!
//! The default model's test needs SmolLM2 (skipped when absent, failed when
//! `PAGEKV_REQUIRE_MODEL=1`).

mod common;
#[path = "../../model/tests/tiny_mtp/mod.rs"]
mod tiny_mtp;

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use common::{engine_config, tiny_model, tokenizer};
use kvcache::CacheConfig;
use pagekv_cpu::attention::AttentionConfig;
use pagekv_engine::{
    DraftMode, DraftModel, Engine, EngineConfig, EngineMetrics, Event, GenerationRequest, Grammar, MtpModel,
    RequestStream, SamplingParams, SpeculativeConfig,
};
use pagekv_model::tokenizer::Tokenizer;
use pagekv_model::Model;

/// One engine at a time: the thread pool is shared by the process and the machine is small.
static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

fn ngram(draft_tokens: usize) -> SpeculativeConfig {
    SpeculativeConfig { mode: DraftMode::Ngram, draft_tokens, ngram_min: 1, ngram_max: 4, ..Default::default() }
}

/// The ids of a finished request's tokens.
fn tokens(mut s: RequestStream) -> Vec<u32> {
    let mut out = Vec::new();
    loop {
        match s.recv_timeout(Duration::from_secs(600)).expect("an event within 10 minutes") {
            Event::Token { id, .. } => out.push(id),
            Event::Done { .. } => return out,
            Event::Error(e) => panic!("request failed: {e}"),
        }
    }
}

fn wait_for(h: &pagekv_engine::EngineHandle, what: &str, cond: impl Fn(&EngineMetrics) -> bool) {
    let start = Instant::now();
    while !cond(&h.metrics()) {
        assert!(start.elapsed() < Duration::from_secs(60), "timed out waiting for {what}: {:?}", h.metrics());
        std::thread::sleep(Duration::from_millis(5));
    }
}

#[test]
fn greedy_with_ngram_drafts_equals_greedy_without_on_the_default_model() {
    greedy_identity_on_the_default_model(|_| ngram(8), 2, true);
}

#[test]
fn greedy_with_a_draft_model_equals_greedy_without_on_the_default_model() {
    // The default model drafting for itself (another copy, its own cache and pool).
    let draft = |path: &std::path::Path| {
        let path = path.to_path_buf();
        let model = DraftModel::new("smollm2", move || Model::load(&path, AttentionConfig::default()));
        SpeculativeConfig { mode: DraftMode::Model(model), draft_tokens: 6, ..Default::default() }
    };
    // Its drafts are its own greedy choices: (nearly) every one is kept.
    greedy_identity_on_the_default_model(draft, 1, false);
}

/// The default model at `path` in an engine with `speculative` drafting (1024 blocks, a
/// 1024-token window, 256 tokens a step, no session bank), and its tokenizer.
fn default_model_engine(path: &std::path::Path, speculative: SpeculativeConfig) -> (Engine, Arc<Tokenizer>) {
    let model = Model::load(path, AttentionConfig::default()).unwrap();
    let tok = Arc::new(Tokenizer::from_gguf(model.weights.file().metadata()).unwrap());
    let c = &model.config;
    let mut cache = CacheConfig::new(c.num_layers, c.num_kv_heads, c.head_dim);
    cache.num_blocks = 1024;
    cache.context_window = Some(1024);
    let mut config = EngineConfig::new(cache);
    config.max_batch_tokens = 256;
    config.bank.enabled = false;
    config.speculative = speculative;
    (Engine::start(model, tok.clone(), config).unwrap(), tok)
}

/// Sixteen chat prompts, 512 greedy tokens each: without drafts (batched), with `speculative`'s
/// drafts alone (the first `alone` prompts) and batched, all identical; some drafts are kept (and,
/// when `rejections`, some are rejected).
fn greedy_identity_on_the_default_model(
    speculative: impl Fn(&std::path::Path) -> SpeculativeConfig,
    alone: usize,
    rejections: bool,
) {
    let _g = serial();
    let Some(path) = pagekv_testkit::dev::default_model("speculative") else { return };
    let (engine, tok) = default_model_engine(&path, speculative(&path));
    let h = engine.handle();
    let topics = [
        "List the planets of the solar system in order.",
        "Write a Python function that reverses a string.",
        "Explain how a hash map works.",
        "Count from one to thirty in words.",
        "Describe the water cycle.",
        "Write a short poem about the sea.",
        "What is a binary search tree?",
        "Give three tips for learning to cook.",
        "Explain recursion with an example.",
        "Name the days of the week in French.",
        "How does a bicycle stay upright?",
        "Write a SQL query that counts rows per day.",
        "What causes the seasons?",
        "Summarize the plot of Hamlet.",
        "Write a Rust struct for a 2D point with a distance method.",
        "Why do cats purr?",
    ];
    let requests: Vec<GenerationRequest> = topics
        .iter()
        .map(|t| {
            let prompt = format!("<|im_start|>user\n{t}<|im_end|>\n<|im_start|>assistant\n");
            let mut r = GenerationRequest::new(tok.encode(&prompt, true).unwrap(), 512);
            r.ignore_eos = true;
            r
        })
        .collect();
    let plain = |r: &GenerationRequest| GenerationRequest { speculative: false, ..r.clone() };
    // The reference: all sixteen batched without drafts (batching is known not to change tokens).
    let streams: Vec<RequestStream> = requests.iter().map(|r| h.submit(plain(r)).unwrap()).collect();
    let reference: Vec<Vec<u32>> = streams.into_iter().map(tokens).collect();
    assert!(reference.iter().all(|t| t.len() == 512));
    assert_eq!(h.metrics().draft_steps, 0, "requests without drafting draft nothing");
    // Alone, with drafts.
    for (i, r) in requests.iter().enumerate().take(alone) {
        assert_eq!(tokens(h.submit(r.clone()).unwrap()), reference[i], "request {i} alone with drafts");
    }
    let alone = h.metrics();
    assert!(alone.draft_accepted_tokens > 0, "drafts were accepted: {alone:?}");
    // All sixteen batched, with drafts.
    let streams: Vec<RequestStream> = requests.iter().map(|r| h.submit(r.clone()).unwrap()).collect();
    for (i, (s, want)) in streams.into_iter().zip(&reference).enumerate() {
        assert_eq!(&tokens(s), want, "request {i} batched with drafts");
    }
    let m = h.metrics();
    let (drafted, accepted) =
        (m.draft_tokens - alone.draft_tokens, m.draft_accepted_tokens - alone.draft_accepted_tokens);
    assert!(accepted > 0 && accepted <= drafted, "drafts kept: {accepted} of {drafted}");
    assert!(!rejections || accepted < drafted, "no draft was rejected: {accepted} of {drafted}");
    assert_eq!((m.running, m.blocks_used), (0, 0));
    assert_eq!(m.blocks_free, m.blocks_total, "every block is back");
    eprintln!(
        "default model, 16 × 512 tokens batched: {drafted} drafted, {accepted} accepted, {:.2} tokens per step",
        m.generated_tokens as f64 / m.sampling_steps as f64
    );
}

/// The tiny model's prompt: `base`, a 3-token continuation `c`, a separator and `base` again,
/// so the n-gram drafter proposes `c` for the first three tokens. `c` is the model's greedy
/// continuation (under `grammar`) of the repeated `base` itself, found by iterating from its
/// continuation of `base` alone a few times (the second `base` sees more context than the first).
fn repeating_prompt(engine: &Engine, grammar: Option<Grammar>) -> Vec<u32> {
    let base: Vec<u32> = vec![5, 17, 42, 9, 33, 61];
    let greedy = |prompt: Vec<u32>| {
        let r = GenerationRequest { speculative: false, grammar: grammar.clone(), ..GenerationRequest::new(prompt, 3) };
        tokens(engine.handle().submit(r).unwrap())
    };
    let with = |c: &[u32]| [&base[..], c, &[70], &base[..]].concat();
    let mut c = greedy(base.clone());
    for _ in 0..3 {
        c = greedy(with(&c));
    }
    with(&c)
}

/// Chi-square critical value at p = 0.001 for `df` degrees of freedom (Wilson–Hilferty).
fn critical(df: usize) -> f64 {
    let k = df as f64;
    let z = 3.0902;
    k * (1.0 - 2.0 / (9.0 * k) + z * (2.0 / (9.0 * k)).sqrt()).powi(3)
}

/// Two-sample chi-square homogeneity statistic over the outcomes of `a` and `b`; outcomes seen
/// fewer than 10 times in both together are pooled into one cell. Returns it and its degrees of
/// freedom.
fn homogeneity(a: &HashMap<Vec<u32>, u64>, b: &HashMap<Vec<u32>, u64>) -> (f64, usize) {
    let mut cells: Vec<(u64, u64)> = Vec::new();
    let mut rare = (0u64, 0u64);
    let mut keys: Vec<&Vec<u32>> = a.keys().chain(b.keys()).collect();
    keys.sort();
    keys.dedup();
    for k in keys {
        let (x, y) = (a.get(k).copied().unwrap_or(0), b.get(k).copied().unwrap_or(0));
        if x + y < 10 {
            rare = (rare.0 + x, rare.1 + y);
        } else {
            cells.push((x, y));
        }
    }
    if rare.0 + rare.1 > 0 {
        cells.push(rare);
    }
    let (na, nb) = (a.values().sum::<u64>() as f64, b.values().sum::<u64>() as f64);
    let x2 = cells
        .iter()
        .map(|&(x, y)| {
            let t = (x + y) as f64;
            let (ea, eb) = (t * na / (na + nb), t * nb / (na + nb));
            (x as f64 - ea).powi(2) / ea + (y as f64 - eb).powi(2) / eb
        })
        .sum();
    (x2, cells.len() - 1)
}

/// The tiny model of `seed` drafting: a draft model over the same vocabulary.
fn draft_model(seed: u64, draft_tokens: usize) -> SpeculativeConfig {
    let model = DraftModel::new("tiny-draft", move || Ok(tiny_model(seed, "tiny-draft")));
    SpeculativeConfig { mode: DraftMode::Model(model), draft_tokens, ..Default::default() }
}

#[test]
fn sampled_tokens_with_ngram_drafts_follow_the_distribution_without() {
    sampled_tokens_follow_the_distribution_without(tiny_model(11, "tiny-spec"), ngram(4), None, 20_000);
}

#[test]
fn sampled_tokens_with_draft_model_drafts_follow_the_distribution_without() {
    // The target itself as the draft model: its greedy drafts are often, not always, sampled.
    sampled_tokens_follow_the_distribution_without(tiny_model(11, "tiny-spec"), draft_model(11, 4), None, 20_000);
}

#[test]
fn sampled_tokens_with_mtp_drafts_follow_the_distribution_without() {
    // The MTP layer predicts the model's likeliest token after next; with a small margin the model
    // samples it often, not always.
    let (target, mtp) = mtp_models(tiny_mtp::Kind::Predictable { logit_scale: 3.0 }, 4);
    sampled_tokens_follow_the_distribution_without(target, mtp, None, 20_000);
}

#[test]
fn sampled_constrained_tokens_with_ngram_drafts_follow_the_distribution_without() {
    // Any three words (the tiny vocabulary's tokens are " w3" … ): drafts from the prompt are
    // valid, and every row is masked (the special tokens go).
    let grammar = Some(Grammar::Regex("( w[0-9]+){3}".into()));
    sampled_tokens_follow_the_distribution_without(tiny_model(11, "tiny-spec"), ngram(4), grammar, 8_000);
}

fn sampled_tokens_follow_the_distribution_without(
    target: Model,
    speculative: SpeculativeConfig,
    grammar: Option<Grammar>,
    runs: u64,
) {
    let _g = serial();
    let mut config = engine_config(4096, true);
    config.speculative = speculative;
    let engine = Engine::start(target, tokenizer(), config).unwrap();
    let prompt = repeating_prompt(&engine, grammar.clone());
    let h = engine.handle();
    // Warm enough that drafts are often rejected, cool enough that they are often kept.
    let params = SamplingParams {
        temperature: 0.7,
        top_k: 0,
        top_p: 0.97,
        min_p: 0.0,
        repetition_penalty: 1.1,
        ..SamplingParams::default()
    };
    let mut counts = [HashMap::new(), HashMap::new()];
    for (which, speculative) in [false, true].into_iter().enumerate() {
        // In waves of 256 requests, so the queue stays short and many sequences share each step.
        for wave in 0..runs.div_ceil(256) {
            let streams: Vec<RequestStream> = (wave * 256..((wave + 1) * 256).min(runs))
                .map(|i| {
                    let mut r = GenerationRequest::new(prompt.clone(), 3);
                    r.ignore_eos = true;
                    r.speculative = speculative;
                    r.grammar = grammar.clone();
                    r.sampling = SamplingParams { seed: i + (which as u64) * 1_000_000, ..params };
                    h.submit(r).unwrap()
                })
                .collect();
            for s in streams {
                *counts[which].entry(tokens(s)).or_insert(0u64) += 1;
            }
        }
    }
    let m = h.metrics();
    let (kept, rejected) = (m.draft_accepted_tokens, m.draft_tokens - m.draft_accepted_tokens);
    let least = runs / 20;
    assert!(kept > least && rejected > least, "drafts were kept ({kept}) and rejected ({rejected})");
    let (x2, df) = homogeneity(&counts[0], &counts[1]);
    assert!(df >= 3, "the outcomes vary ({df} degrees of freedom)");
    assert!(x2 < critical(df), "chi-square {x2:.1} over {df} df ≥ {:.1} (p < 0.001)", critical(df));
    eprintln!(
        "{} outcomes, chi-square {x2:.1} over {df} df (critical {:.1}); {} drafted, {} kept",
        counts[0].len(),
        critical(df),
        m.draft_tokens,
        m.draft_accepted_tokens
    );
}

#[test]
fn constrained_greedy_with_ngram_drafts_equals_constrained_greedy_without_on_the_default_model() {
    let _g = serial();
    let Some(path) = pagekv_testkit::dev::default_model("speculative") else { return };
    let (engine, tok) = default_model_engine(&path, ngram(8));
    let h = engine.handle();
    // Repeated keys: the n-gram drafter proposes them, the grammar cuts what it would not take.
    let schema = serde_json::json!({
        "type": "object",
        "properties": {"people": {"type": "array", "minItems": 4, "maxItems": 4, "items": {
            "type": "object",
            "properties": {"name": {"type": "string"}, "age": {"type": "integer"}, "city": {"type": "string"}},
            "required": ["name", "age", "city"], "additionalProperties": false}}},
        "required": ["people"], "additionalProperties": false
    });
    let topics = ["four friends", "four scientists", "four painters"];
    let mut drafted_total = 0;
    for t in topics {
        let prompt =
            format!("<|im_start|>user\nList {t} with name, age and city as JSON.<|im_end|>\n<|im_start|>assistant\n");
        let mut r = GenerationRequest::new(tok.encode(&prompt, true).unwrap(), 400);
        r.grammar = Some(Grammar::JsonSchema { schema: schema.clone(), strict: true });
        let before = h.metrics();
        let plain = tokens(h.submit(GenerationRequest { speculative: false, ..r.clone() }).unwrap());
        assert_eq!(h.metrics().draft_steps, before.draft_steps, "no drafts without speculation");
        let drafted = tokens(h.submit(r).unwrap());
        assert_eq!(drafted, plain, "{t}: constrained output with drafts");
        let text = tok.decode(&drafted, true).unwrap();
        let v: serde_json::Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{t}: {e}: {text}"));
        assert_eq!(v["people"].as_array().map(Vec::len), Some(4), "{text}");
        drafted_total += h.metrics().draft_accepted_tokens - before.draft_accepted_tokens;
    }
    let m = h.metrics();
    assert!(drafted_total > 0, "constrained sequences kept drafts: {m:?}");
    assert_eq!((m.running, m.blocks_used), (0, 0));
    eprintln!(
        "constrained, 3 prompts: {} drafted, {} kept, {:.2} tokens per step",
        m.draft_tokens,
        m.draft_accepted_tokens,
        m.generated_tokens as f64 / m.sampling_steps as f64
    );
}

#[test]
fn ngram_drafting_sequences_survive_preemption_and_cancellation() {
    survive_preemption_and_cancellation(ngram(8));
}

#[test]
fn draft_model_sequences_survive_preemption_and_cancellation() {
    // A draft model unlike the target: its drafts are mostly rejected, and each rejection rolls
    // back both caches.
    survive_preemption_and_cancellation(draft_model(6, 4));
    // The target itself as the draft model: drafts are kept.
    survive_preemption_and_cancellation(draft_model(5, 8));
}

#[test]
fn mtp_drafting_sequences_survive_preemption_and_cancellation() {
    // Drafts kept (the predictable MTP layer) and mostly rejected (a random one): both roll back
    // the MTP caches with the target's.
    for kind in [tiny_mtp::Kind::Predictable { logit_scale: 8.0 }, tiny_mtp::Kind::Random] {
        let target = || mtp_models(kind, 8).0;
        survive_preemption_and_cancellation_of(&target, mtp_models(kind, 8).1);
    }
}

fn survive_preemption_and_cancellation(speculative: SpeculativeConfig) {
    survive_preemption_and_cancellation_of(&|| tiny_model(5, "tiny-spec"), speculative);
}

fn survive_preemption_and_cancellation_of(target: &dyn Fn() -> Model, speculative: SpeculativeConfig) {
    let _g = serial();
    // The reference: plenty of blocks, no drafting.
    let prompts: Vec<Vec<u32>> = (0..6u32).map(|i| (0..40).map(|j| 3 + (i * 7 + j % (5 + i)) % 90).collect()).collect();
    let request = |p: &Vec<u32>, speculative: bool| {
        let mut r = GenerationRequest::new(p.clone(), 120);
        r.ignore_eos = true;
        r.speculative = speculative;
        r
    };
    let engine = Engine::start(target(), tokenizer(), engine_config(512, false)).unwrap();
    let h = engine.handle();
    let reference: Vec<Vec<u32>> = prompts.iter().map(|p| tokens(h.submit(request(p, false)).unwrap())).collect();
    drop(engine);
    // Room for about three sequences of 160 tokens (blocks of 8): the newest are preempted and
    // recomputed while they draft.
    let mut config = engine_config(64, true);
    config.speculative = speculative;
    let engine = Engine::start(target(), tokenizer(), config).unwrap();
    let h = engine.handle();
    let streams: Vec<RequestStream> = prompts.iter().map(|p| h.submit(request(p, true)).unwrap()).collect();
    for (i, (s, want)) in streams.into_iter().zip(&reference).enumerate() {
        assert_eq!(&tokens(s), want, "request {i} with drafts and preemption");
    }
    let m = h.metrics();
    assert!(m.preemptions > 0, "the pool was short: {m:?}");
    assert!(m.draft_steps > 0, "drafts were verified: {m:?}");
    // Cancel drafting requests in flight: every block they held comes back.
    let streams: Vec<RequestStream> = prompts.iter().map(|p| h.submit(request(p, true)).unwrap()).collect();
    let before = h.metrics().draft_steps;
    wait_for(&h, "drafting steps", |m| m.draft_steps > before + 20 && m.running > 0);
    drop(streams);
    wait_for(&h, "cancellation", |m| m.running == 0 && m.waiting == 0 && m.blocks_used == 0);
    let m = h.metrics();
    assert_eq!(m.blocks_free + m.blocks_cached, m.blocks_total, "nothing held but the bank: {m:?}");
    assert_eq!(m.draft_blocks_used, 0, "the drafter's pool is empty again: {m:?}");
}

/// The tiny MTP model of `kind` (llama, one nextn layer) as the target, and its MTP layer
/// drafting up to `draft_tokens` (a second copy over the same file, as the binary loads it).
fn mtp_models(kind: tiny_mtp::Kind, draft_tokens: usize) -> (Model, SpeculativeConfig) {
    let t = tiny_mtp::tiny_mtp("llama", 21, kind, 1, None);
    let target = Model::from_file(t.file.clone(), AttentionConfig::default()).unwrap();
    let file = t.file.clone();
    let mtp = MtpModel::new("tiny-mtp", move || Model::from_file(file, AttentionConfig::default()));
    (target, SpeculativeConfig { mode: DraftMode::Mtp(mtp), draft_tokens, ..Default::default() })
}

#[test]
fn greedy_with_mtp_drafts_equals_greedy_without() {
    // Predictable: the MTP layer's drafts are the model's own choices; random: mostly not.
    // (kind, least share of drafts kept, least drafts: a random layer's drafts are soon rejected
    // and its sequences draft only the adaptive length's probes).
    let kinds = [(tiny_mtp::Kind::Predictable { logit_scale: 8.0 }, 0.9, 2000), (tiny_mtp::Kind::Random, 0.0, 200)];
    for (kind, least, least_drafts) in kinds {
        let _g = serial();
        let (target, speculative) = mtp_models(kind, 6);
        let mut config = engine_config(2048, false);
        config.cache.context_window = Some(1024);
        config.max_batch_tokens = 256;
        config.speculative = speculative;
        let engine = Engine::start(target, tokenizer(), config).unwrap();
        let h = engine.handle();
        let prompts: Vec<Vec<u32>> =
            (0..12u32).map(|i| (0..10 + 3 * i).map(|j| 3 + (i * 11 + j * 7 + j * j) % 93).collect()).collect();
        let request = |p: &Vec<u32>, speculative: bool| {
            let mut r = GenerationRequest::new(p.clone(), 512);
            r.ignore_eos = true;
            r.speculative = speculative;
            r
        };
        let streams: Vec<RequestStream> = prompts.iter().map(|p| h.submit(request(p, false)).unwrap()).collect();
        let reference: Vec<Vec<u32>> = streams.into_iter().map(tokens).collect();
        assert!(reference.iter().all(|t| t.len() == 512));
        assert_eq!(h.metrics().draft_steps, 0, "requests without drafting draft nothing");
        for (i, p) in prompts.iter().enumerate().take(2) {
            assert_eq!(tokens(h.submit(request(p, true)).unwrap()), reference[i], "{kind:?}: request {i} alone");
        }
        // Batched: the even ones draft, the odd ones do not (their rows ask for no hidden states).
        let streams: Vec<RequestStream> =
            prompts.iter().enumerate().map(|(i, p)| h.submit(request(p, i % 2 == 0)).unwrap()).collect();
        for (i, (s, want)) in streams.into_iter().zip(&reference).enumerate() {
            assert_eq!(&tokens(s), want, "{kind:?}: request {i} batched");
        }
        let m = h.metrics();
        assert_eq!(m.drafter.as_deref(), Some("mtp"));
        let rate = m.draft_accepted_tokens as f64 / m.draft_tokens as f64;
        assert!(m.draft_tokens > least_drafts, "{kind:?}: drafting happened: {m:?}");
        assert!(rate >= least, "{kind:?}: {} of {} drafts kept", m.draft_accepted_tokens, m.draft_tokens);
        assert_eq!((m.running, m.blocks_used, m.draft_blocks_used), (0, 0, 0), "{kind:?}: every block is back");
        eprintln!(
            "{kind:?}: {} drafted, {} kept ({:.1} %), {:.2} tokens per step",
            m.draft_tokens,
            m.draft_accepted_tokens,
            100.0 * rate,
            m.generated_tokens as f64 / m.sampling_steps as f64
        );
    }
}

/// One target step over `cache`: feeds `feed` with `logits`, asking for every position's hidden
/// state; returns the greedy token of each logit row and the hidden states (`[feed, hidden]`).
fn target_step(
    target: &mut Model,
    pool: &mut kvcache::KvPool,
    cache: &mut kvcache::SequenceCache,
    feed: &[u32],
    logits: pagekv_model::Logits,
) -> (Vec<u32>, Vec<f32>) {
    cache.begin_append(pool, feed.len()).unwrap();
    let mut b = pagekv_model::Batch::default();
    b.push(feed, cache.offset() + feed.len(), cache.pending_slots(), cache.block_table(), logits);
    b.keep_hidden();
    let rows = target.forward(&b, pool).unwrap();
    let ids = rows.chunks_exact(tiny_mtp::VOCAB).map(pagekv_model::backend::argmax).collect();
    cache.commit_append(pool);
    (ids, target.last_hidden()[..feed.len() * tiny_mtp::HIDDEN].to_vec())
}

#[test]
fn the_mtp_cache_holds_exactly_the_kept_positions_after_every_step() {
    use pagekv_engine::speculative::{DraftRequest, Drafter, MtpDrafter};
    use pagekv_model::Logits;
    let h = tiny_mtp::HIDDEN;
    for kind in [tiny_mtp::Kind::Predictable { logit_scale: 8.0 }, tiny_mtp::Kind::Random] {
        let t = tiny_mtp::tiny_mtp("llama", 21, kind, 1, None);
        let mut target = Model::from_file(t.file.clone(), AttentionConfig::default()).unwrap();
        target.set_attn_numerics(pagekv_cpu::attention::AttnNumerics::Fast);
        let drafter_model = Model::from_file(t.file.clone(), AttentionConfig::default()).unwrap();
        let mut d = MtpDrafter::new(drafter_model, 64, 8, 1024).unwrap();
        let mut cc = CacheConfig::new(tiny_mtp::LAYERS, tiny_mtp::KV_HEADS, tiny_mtp::HEAD_DIM);
        cc.block_size = 8;
        cc.num_blocks = 256;
        let mut pool = kvcache::KvPool::new(cc).unwrap();
        let policy = kvcache::SequencePolicy {
            dynamic_growth: true,
            context_window: Some(1024),
            sliding_window: None,
            debug_blocks: false,
            trim_margin: 0,
        };
        let mut cache = kvcache::SequenceCache::new(&mut pool, policy, 0).unwrap();
        let id = 7;
        let mut tokens: Vec<u32> = (0..21u32).map(|j| 3 + (j * 13) % 90).collect();
        // The prompt in chunks of 8: each chunk's hidden states wait in the drafter.
        let prompt = tokens.clone();
        for (c, chunk) in prompt.chunks(8).enumerate() {
            let start = cache.offset();
            let last = start + chunk.len() == prompt.len();
            let (ids, hidden) =
                target_step(&mut target, &mut pool, &mut cache, chunk, if last { Logits::Last } else { Logits::None });
            d.computed(id, &prompt, start, &hidden);
            assert_eq!(d.state(id), Some((0, cache.offset(), 0)), "{kind:?}: chunk {c} waits, nothing fed");
            d.check_sequence(id, cache.offset()).unwrap();
            if last {
                tokens.push(ids[0]);
            }
        }
        let (mut drafted, mut kept) = (0, 0);
        for step in 0..40 {
            let before = cache.offset();
            let mut draft = Vec::new();
            d.propose(&mut [DraftRequest { id, tokens: &tokens, max: 4, draft: &mut draft }]);
            assert_eq!(draft.len(), 4, "{kind:?} step {step}: a full draft");
            // Every kept position is fed, then one entry per chained draft token after the first.
            assert_eq!(d.state(id), Some((before + draft.len() - 1, 0, 0)), "{kind:?} step {step}");
            let feed = [&tokens[tokens.len() - 1..], &draft[..]].concat();
            let (ids, hidden) = target_step(&mut target, &mut pool, &mut cache, &feed, Logits::All);
            let accepted = draft.iter().zip(&ids).take_while(|(a, b)| a == b).count();
            cache.trim(&mut pool, draft.len() - accepted).unwrap();
            tokens.extend_from_slice(&draft[..accepted]);
            tokens.push(ids[accepted]);
            (drafted, kept) = (drafted + draft.len(), kept + accepted);
            d.computed(id, &tokens, before, &hidden[..(accepted + 1) * h]);
            d.accepted(id, &tokens);
            // The drafted entries are gone; the kept positions' hidden states wait.
            assert_eq!(d.state(id), Some((before, accepted + 1, 0)), "{kind:?} step {step}: {accepted} kept");
            assert_eq!(cache.offset(), tokens.len() - 1);
            d.check_sequence(id, cache.offset()).unwrap();
        }
        match kind {
            tiny_mtp::Kind::Random => assert!(kept < drafted / 2, "{kind:?}: {kept} of {drafted} kept"),
            _ => assert_eq!(kept, drafted, "{kind:?}: every draft is the model's own choice"),
        }
        assert!(d.blocks_used() > 0);
        d.release(id);
        assert_eq!((d.blocks_used(), d.state(id)), (0, None), "{kind:?}: release frees every block");
        // Positions the drafter did not see (a bank hit, a resumed preemption): the cache starts
        // over from the first one it is given.
        d.computed(id, &tokens, 30, &vec![0.5; 3 * h]);
        assert_eq!(d.state(id), Some((0, 3, 30)));
        d.check_sequence(id, 33).unwrap();
        assert!(d.check_sequence(id, 34).is_err(), "a drafter out of step is reported");
        d.computed(id, &tokens, 40, &vec![0.5; h]);
        assert_eq!(d.state(id), Some((0, 1, 40)), "a gap starts it over again");
        d.release(id);
        assert_eq!(d.blocks_used(), 0);
    }
}

#[test]
fn a_long_prompts_hidden_states_are_fed_before_they_pile_up() {
    use pagekv_engine::speculative::{DraftRequest, Drafter, MtpDrafter};
    use pagekv_model::Logits;
    let t = tiny_mtp::tiny_mtp("llama", 21, tiny_mtp::Kind::Predictable { logit_scale: 8.0 }, 1, None);
    let mut target = Model::from_file(t.file.clone(), AttentionConfig::default()).unwrap();
    target.set_attn_numerics(pagekv_cpu::attention::AttnNumerics::Fast);
    let mut d =
        MtpDrafter::new(Model::from_file(t.file.clone(), AttentionConfig::default()).unwrap(), 256, 8, 1024).unwrap();
    let mut cc = CacheConfig::new(tiny_mtp::LAYERS, tiny_mtp::KV_HEADS, tiny_mtp::HEAD_DIM);
    cc.block_size = 8;
    cc.num_blocks = 256;
    let mut pool = kvcache::KvPool::new(cc).unwrap();
    let policy = kvcache::SequencePolicy {
        dynamic_growth: true,
        context_window: Some(1024),
        sliding_window: None,
        debug_blocks: false,
        trim_margin: 0,
    };
    let mut cache = kvcache::SequenceCache::new(&mut pool, policy, 0).unwrap();
    let id = 3;
    let mut tokens: Vec<u32> = (0..700u32).map(|j| 3 + (j * 29 + j / 7) % 90).collect();
    let prompt = tokens.clone();
    // (cache offset, pending) after each chunk of 256: the second chunk makes 512 wait, and all
    // but the last are fed at once; the rest wait for the proposal.
    let want = [(0, 256), (511, 1), (511, 189)];
    for (c, chunk) in prompt.chunks(256).enumerate() {
        let start = cache.offset();
        let last = start + chunk.len() == prompt.len();
        let (ids, hidden) =
            target_step(&mut target, &mut pool, &mut cache, chunk, if last { Logits::Last } else { Logits::None });
        d.computed(id, &prompt, start, &hidden);
        let (offset, pending, _) = d.state(id).unwrap();
        assert_eq!((offset, pending), want[c], "chunk {c}");
        d.check_sequence(id, cache.offset()).unwrap();
        if last {
            tokens.push(ids[0]);
        }
    }
    let mut draft = Vec::new();
    d.propose(&mut [DraftRequest { id, tokens: &tokens, max: 3, draft: &mut draft }]);
    // Every prompt position fed, two chained entries; the drafts are the model's next choices.
    assert_eq!(d.state(id), Some((700 + 2, 0, 0)));
    let feed = [&tokens[tokens.len() - 1..], &draft[..]].concat();
    let (ids, _) = target_step(&mut target, &mut pool, &mut cache, &feed, Logits::All);
    assert_eq!(draft[..], ids[..3], "the drafts are the target's greedy tokens");
    d.release(id);
    assert_eq!(d.blocks_used(), 0);
}
