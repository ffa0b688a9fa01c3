//! Several continuations of one prompt (`EngineHandle::submit_n`), over the tiny synthetic
//! model (no file needed): the prompt is computed once and forked copy-on-write; greedy
//! continuations are identical, seeded sampled ones distinct, reproducible and equal to plain
//! requests seeded `seed + i`; each has its own grammar state; the prompt's blocks are counted
//! as shared while the continuations run and every block returns afterwards; preemption (bank
//! on and off), cancellation (before and after the fork, of some or all continuations) and
//! drafting keep every continuation's tokens.

use std::time::{Duration, Instant};

use pagekv_engine::{
    DraftMode, Engine, EngineConfig, EngineError, EngineHandle, EngineMetrics, Event, FinishReason, GenerationRequest,
    Grammar, RequestStream, SamplingParams, SpeculativeConfig, MAX_CHOICES,
};

mod common;

use common::{engine_config, tiny_model, tokenizer};

fn start(config: EngineConfig) -> Engine {
    Engine::start(tiny_model(5, "tiny-choices"), tokenizer(), config).unwrap()
}

/// The tokens of a stream and how it ended.
fn collect(mut s: RequestStream) -> (Vec<u32>, FinishReason) {
    let mut tokens = Vec::new();
    loop {
        match s.recv_timeout(Duration::from_secs(120)).expect("an event within 2 minutes") {
            Event::Token { id, .. } => tokens.push(id),
            Event::Done { finish_reason, .. } => return (tokens, finish_reason),
            Event::Error(e) => panic!("request failed: {e}"),
        }
    }
}

fn collect_all(streams: Vec<RequestStream>) -> Vec<Vec<u32>> {
    streams.into_iter().map(|s| collect(s).0).collect()
}

fn wait_for(h: &EngineHandle, what: &str, cond: impl Fn(&EngineMetrics) -> bool) -> EngineMetrics {
    let start = Instant::now();
    loop {
        let m = h.metrics();
        if cond(&m) {
            return m;
        }
        assert!(start.elapsed() < Duration::from_secs(60), "timed out waiting for {what}: {m:?}");
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// 30 prompt tokens: three full blocks of 8 and a partly filled fourth.
fn prompt(salt: u32) -> Vec<u32> {
    (0..30u32).map(|i| 10 + (i * 7 + salt) % 80).collect()
}

fn request(max_tokens: usize, sampling: SamplingParams) -> GenerationRequest {
    let mut r = GenerationRequest::new(prompt(0), max_tokens);
    r.sampling = sampling;
    r.ignore_eos = true;
    r.speculative = false;
    r
}

fn sampled(seed: u64) -> SamplingParams {
    SamplingParams { temperature: 1.0, seed, ..SamplingParams::default() }
}

fn greedy() -> SamplingParams {
    SamplingParams { temperature: 0.0, ..SamplingParams::default() }
}

#[test]
fn greedy_choices_are_identical_and_the_prompt_is_computed_once() {
    let engine = start(engine_config(64, false));
    let h = engine.handle();
    let alone = collect(h.submit(request(12, greedy())).unwrap()).0;
    let before = h.metrics();
    let outs = collect_all(h.submit_n(request(12, greedy()), 4).unwrap());
    assert_eq!(outs, vec![alone.clone(); 4], "every greedy continuation is the plain request's");
    let m = h.metrics();
    // The prompt once, then each continuation feeds back all its tokens but the last.
    assert_eq!(m.computed_tokens - before.computed_tokens, 30 + 4 * 11, "{m:?}");
    assert_eq!(m.sequence_forks, 3);
    assert_eq!((m.requests_submitted, m.requests_finished), (5, 5));
    assert_eq!(m.prompt_tokens - before.prompt_tokens, 30, "the prompt is counted once");
    assert_eq!((m.blocks_free, m.blocks_shared, m.cache.blocks_shared), (64, 0, 0), "every block returned: {m:?}");
    engine.shutdown(Duration::from_secs(5));
}

#[test]
fn seeded_choices_are_distinct_reproducible_and_equal_to_plain_requests_seeded_seed_plus_i() {
    let engine = start(engine_config(128, true));
    let h = engine.handle();
    let outs = collect_all(h.submit_n(request(16, sampled(7)), 4).unwrap());
    for i in 0..4 {
        for j in 0..i {
            assert_ne!(outs[i], outs[j], "continuations {i} and {j} sampled alike: {outs:?}");
        }
    }
    assert_eq!(collect_all(h.submit_n(request(16, sampled(7)), 4).unwrap()), outs, "the same seed, the same outputs");
    for (i, out) in outs.iter().enumerate() {
        let plain = collect(h.submit(request(16, sampled(7 + i as u64))).unwrap()).0;
        assert_eq!(&plain, out, "continuation {i} is the request seeded 7 + {i}");
    }
    engine.shutdown(Duration::from_secs(5));
}

#[test]
fn the_prompt_blocks_are_shared_while_the_choices_run() {
    for bank in [false, true] {
        let engine = start(engine_config(64, bank));
        let h = engine.handle();
        let streams = h.submit_n(request(200, sampled(3)), 4).unwrap();
        // After the fork and the first decode: the three full prompt blocks are held by all
        // four; the partly filled one was copied by the first three that wrote into it.
        let m = wait_for(&h, "four running continuations", |m| m.running == 4 && m.generated_tokens >= 8);
        assert_eq!(m.blocks_shared, 3, "bank {bank}: {m:?}");
        assert!(m.cache.blocks_shared >= 3, "bank {bank}: {m:?}");
        assert!(m.cache.cow_copies >= 3, "bank {bank}: {m:?}");
        let lens: Vec<usize> = streams.into_iter().map(|s| collect(s).0.len()).collect();
        assert_eq!(lens, [200; 4]);
        let m = h.metrics();
        assert_eq!((m.running, m.blocks_used, m.blocks_shared), (0, 0, 0), "bank {bank}: {m:?}");
        assert_eq!(m.blocks_free + m.blocks_cached, 64, "bank {bank}: {m:?}");
        engine.shutdown(Duration::from_secs(5));
    }
}

#[test]
fn choices_keep_their_tokens_through_preemption() {
    // Alone on a roomy pool, then on a pool too small for all four at once.
    let roomy = start(engine_config(128, false));
    let expected = collect_all(roomy.handle().submit_n(request(40, sampled(11)), 4).unwrap());
    roomy.shutdown(Duration::from_secs(5));
    for bank in [false, true] {
        let engine = start(engine_config(18, bank));
        let h = engine.handle();
        let outs = collect_all(h.submit_n(request(40, sampled(11)), 4).unwrap());
        assert_eq!(outs, expected, "bank {bank}");
        let m = h.metrics();
        assert!(m.preemptions > 0, "bank {bank}: the run exercised preemption: {m:?}");
        assert_eq!((m.running, m.waiting, m.blocks_used), (0, 0, 0), "bank {bank}: {m:?}");
        assert_eq!(m.blocks_free + m.blocks_cached, 18, "bank {bank}: {m:?}");
        assert_eq!(m.requests_finished, 4);
        engine.shutdown(Duration::from_secs(5));
    }
}

#[test]
fn cancelling_some_or_all_choices() {
    let engine = start(engine_config(64, false));
    let h = engine.handle();
    let expected = collect_all(h.submit_n(request(200, sampled(5)), 4).unwrap());
    // Two clients leave after their first token; the other two finish with their own tokens.
    let mut streams = h.submit_n(request(200, sampled(5)), 4).unwrap();
    for s in &mut streams[..2] {
        assert!(matches!(s.recv_timeout(Duration::from_secs(60)), Ok(Event::Token { .. })));
    }
    let kept = streams.split_off(2);
    drop(streams);
    assert_eq!(collect_all(kept), expected[2..].to_vec());
    let m = wait_for(&h, "the cancelled continuations reaped", |m| m.requests_cancelled == 2);
    assert_eq!((m.running, m.blocks_free), (0, 64), "{m:?}");
    // Every client leaves: after the fork, and before it (while queued or prefilling).
    let streams = h.submit_n(request(200, sampled(5)), 4).unwrap();
    wait_for(&h, "the continuations forked", |m| m.running == 4);
    drop(streams);
    drop(h.submit_n(request(200, sampled(6)), 4).unwrap());
    let m = wait_for(&h, "every continuation reaped", |m| m.requests_cancelled == 10 && m.running == 0);
    assert_eq!((m.waiting, m.blocks_free, m.requests_failed), (0, 64, 0), "{m:?}");
    assert_eq!(m.requests_submitted, m.requests_finished + m.requests_cancelled, "{m:?}");
    engine.shutdown(Duration::from_secs(5));
}

#[test]
fn each_choice_has_its_own_grammar_and_stops() {
    let engine = start(engine_config(64, true));
    let h = engine.handle();
    let mut r = request(40, sampled(21));
    r.ignore_eos = false;
    r.grammar = Some(Grammar::Regex("( w[3-9]){6}".into()));
    let outs: Vec<(Vec<u32>, FinishReason)> = h.submit_n(r, 4).unwrap().into_iter().map(collect).collect();
    for (tokens, finish) in &outs {
        assert_eq!(*finish, FinishReason::Stop, "{outs:?}");
        assert_eq!(tokens.len(), 6, "{outs:?}");
        assert!(tokens.iter().all(|t| (3..=9).contains(t)), "{outs:?}");
    }
    assert!(outs.iter().any(|o| o.0 != outs[0].0), "sampled continuations differ: {outs:?}");
    let m = h.metrics();
    assert!(m.masks_computed >= 4 * 6 && m.mask_seconds > 0.0, "mask time is measured: {m:?}");
    // max_tokens ends each continuation with Length, on its own.
    let outs: Vec<(Vec<u32>, FinishReason)> =
        h.submit_n(request(3, sampled(2)), 3).unwrap().into_iter().map(collect).collect();
    assert!(outs.iter().all(|(t, f)| t.len() == 3 && *f == FinishReason::Length), "{outs:?}");
    engine.shutdown(Duration::from_secs(5));
}

#[test]
fn drafting_choices_keep_their_tokens() {
    let plain = start(engine_config(128, false));
    let expected = collect_all(plain.handle().submit_n(request(40, greedy()), 3).unwrap());
    plain.shutdown(Duration::from_secs(5));
    let mut config = engine_config(128, false);
    config.speculative =
        SpeculativeConfig { mode: DraftMode::Ngram, draft_tokens: 4, ngram_min: 1, ngram_max: 4, ..Default::default() };
    let engine = start(config);
    let h = engine.handle();
    let mut r = request(40, greedy());
    r.speculative = true;
    assert_eq!(collect_all(h.submit_n(r, 3).unwrap()), expected);
    assert!(h.metrics().draft_steps > 0, "the continuations drafted: {:?}", h.metrics());
    engine.shutdown(Duration::from_secs(5));
}

#[test]
fn n_out_of_range_is_refused() {
    let engine = start(engine_config(16, false));
    let h = engine.handle();
    for n in [0, MAX_CHOICES + 1] {
        match h.submit_n(request(4, greedy()), n) {
            Err(EngineError::InvalidChoices { got, max }) => assert_eq!((got, max), (n, MAX_CHOICES)),
            other => panic!("n = {n}: expected InvalidChoices, got {:?}", other.map(|s| s.len())),
        }
    }
    assert_eq!(h.submit_n(request(4, greedy()), MAX_CHOICES).unwrap().len(), MAX_CHOICES);
    engine.shutdown(Duration::from_secs(5));
}
