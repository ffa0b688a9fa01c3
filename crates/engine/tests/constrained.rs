//! Constrained decoding through the engine, over the tiny synthetic model (no file needed):
//! every constrained output is in its grammar whatever the sampler (greedy, temperature 1,
//! top-k, penalties), in batches that mix constrained and free requests, through preemption
//! and the session bank; `max_tokens` cuts a constrained output with `Length`, a stop string
//! still ends it, a grammar that does not compile is an error of `submit`, and free requests
//! batched with constrained ones get exactly the tokens they get alone.

use std::time::Duration;

use pagekv_engine::{
    Engine, EngineError, Event, FinishReason, GenerationRequest, Grammar, GrammarError, RequestStream, SamplingParams,
};

mod common;

use common::{engine_config, tiny_model, tokenizer};

/// Six words among ` w3` … ` w9` (one token each: ids 3 to 9).
const SIX_WORDS: &str = "( w[3-9]){6}";

#[derive(Debug)]
struct Outcome {
    tokens: Vec<u32>,
    finish: FinishReason,
    stop_sequence: Option<String>,
}

fn collect(mut s: RequestStream) -> Result<Outcome, EngineError> {
    let mut tokens = Vec::new();
    loop {
        match s.recv_timeout(Duration::from_secs(120)).expect("an event within 2 minutes") {
            Event::Token { id, .. } => tokens.push(id),
            Event::Done { finish_reason, stop_sequence, .. } => {
                return Ok(Outcome { tokens, finish: finish_reason, stop_sequence })
            }
            Event::Error(e) => return Err(e),
        }
    }
}

/// A prompt of `n` word tokens that starts like every other prompt of these tests.
fn prompt(n: usize, salt: u32) -> Vec<u32> {
    (0..n as u32).map(|i| 10 + (i * 7 + if i < 16 { 0 } else { salt }) % 80).collect()
}

fn constrained(prompt: Vec<u32>, sampling: SamplingParams) -> GenerationRequest {
    let mut r = GenerationRequest::new(prompt, 40);
    r.sampling = sampling;
    r.grammar = Some(Grammar::Regex(SIX_WORDS.into()));
    r
}

fn assert_six_words(o: &Outcome, what: &str) {
    assert_eq!(o.finish, FinishReason::Stop, "{what}: the finished grammar ends the output: {o:?}");
    assert_eq!(o.tokens.len(), 6, "{what}: {o:?}");
    assert!(o.tokens.iter().all(|t| (3..=9).contains(t)), "{what}: {o:?}");
}

#[test]
fn constrained_outputs_follow_the_grammar_beside_free_requests_through_preemption() {
    let samplers = [
        SamplingParams { temperature: 0.0, ..SamplingParams::default() },
        SamplingParams { temperature: 1.0, seed: 1, ..SamplingParams::default() },
        SamplingParams { temperature: 1.0, seed: 2, top_k: 3, ..SamplingParams::default() },
        SamplingParams { temperature: 0.8, seed: 3, top_p: 0.9, min_p: 0.05, ..SamplingParams::default() },
        SamplingParams {
            temperature: 1.0,
            seed: 4,
            frequency_penalty: 1.5,
            presence_penalty: 0.5,
            ..SamplingParams::default()
        },
    ];
    let free = |salt: u32| {
        let mut r = GenerationRequest::new(prompt(36, salt), 30);
        r.ignore_eos = true;
        r
    };
    // Alone, on a roomy pool: the free requests' reference tokens.
    let roomy = Engine::start(tiny_model(11, "tiny-constrained"), tokenizer(), engine_config(256, true)).unwrap();
    let alone: Vec<Vec<u32>> =
        (0..3).map(|s| collect(roomy.handle().submit(free(s)).unwrap()).unwrap().tokens).collect();
    roomy.shutdown(Duration::from_secs(5));

    // Together on a pool too small for all of them: preemption, recompute, bank reuse.
    let engine = Engine::start(tiny_model(11, "tiny-constrained"), tokenizer(), engine_config(20, true)).unwrap();
    let h = engine.handle();
    let mut streams = Vec::new();
    for (i, s) in samplers.iter().enumerate() {
        streams.push((format!("sampler {i}"), h.submit(constrained(prompt(30, i as u32), *s)).unwrap()));
        streams.push((format!("free {i}"), h.submit(free(i as u32 % 3)).unwrap()));
    }
    for (what, s) in streams {
        let o = collect(s).unwrap();
        if let Some(i) = what.strip_prefix("free ") {
            let i: usize = i.parse().unwrap();
            assert_eq!(o.tokens, alone[i % 3], "{what}: a free request is untouched by its neighbours");
        } else {
            assert_six_words(&o, &what);
        }
    }
    let m = h.metrics();
    assert!(m.preemptions > 0, "the run exercised preemption: {m:?}");
    // A second round reuses the banked prompts: the grammar state is the sequence's, not the cache's.
    for (i, s) in samplers.iter().enumerate() {
        let o = collect(h.submit(constrained(prompt(30, i as u32), *s)).unwrap()).unwrap();
        assert_six_words(&o, &format!("again, sampler {i}"));
    }
    assert!(h.metrics().bank_hits > m.bank_hits, "the second round hit the bank");
    engine.shutdown(Duration::from_secs(5));
}

#[test]
fn max_tokens_stop_strings_and_bad_grammars() {
    let engine = Engine::start(tiny_model(11, "tiny-constrained"), tokenizer(), engine_config(64, true)).unwrap();
    let h = engine.handle();
    let sampling = SamplingParams { temperature: 1.0, seed: 9, ..SamplingParams::default() };

    let mut r = constrained(prompt(10, 0), sampling);
    r.stop.max_tokens = 3;
    let o = collect(h.submit(r).unwrap()).unwrap();
    assert_eq!(o.finish, FinishReason::Length, "a cut-off output ends on length: {o:?}");
    assert_eq!(o.tokens.len(), 3);
    assert!(o.tokens.iter().all(|t| (3..=9).contains(t)), "{o:?}");

    let mut r = GenerationRequest::new(prompt(10, 0), 40);
    r.sampling = sampling;
    r.grammar = Some(Grammar::Regex(" w4 w5 w6 w7".into()));
    r.stop.stop_strings = vec![" w6".into()];
    let o = collect(h.submit(r).unwrap()).unwrap();
    assert_eq!((o.finish, o.stop_sequence.as_deref()), (FinishReason::Stop, Some(" w6")), "{o:?}");
    assert_eq!(o.tokens, [4, 5, 6]);

    let mut r = GenerationRequest::new(prompt(10, 0), 40);
    r.grammar = Some(Grammar::JsonSchema { schema: serde_json::json!({"type": 5}), strict: true });
    match h.submit(r) {
        Err(EngineError::Grammar(GrammarError::Invalid(m))) => assert!(!m.is_empty()),
        other => panic!("expected an invalid grammar, got {:?}", other.map(|_| "a stream")),
    }
    let m = h.metrics();
    assert_eq!(m.blocks_used, 0, "{m:?}");
    engine.shutdown(Duration::from_secs(5));
}

/// A SentencePiece vocabulary (space prefix, no token for a bare ` w`): the mask of the first
/// word is exactly its seven tokens — forced text is not tokenized through the space prefix.
#[test]
fn a_sentencepiece_vocabulary_masks_exactly() {
    let tok = tokenizer();
    let compiler = pagekv_engine::GrammarCompiler::new(tok.clone(), tok.vocab_size());
    let mut c = compiler.compile(&Grammar::Regex(SIX_WORDS.into())).unwrap();
    let mut out = Vec::new();
    c.apply(&vec![0.0; tok.vocab_size()], &mut out).unwrap();
    let allowed: Vec<u32> = (0..out.len() as u32).filter(|&i| out[i as usize] == 0.0).collect();
    assert_eq!(allowed, (3..=9).collect::<Vec<u32>>());
}
