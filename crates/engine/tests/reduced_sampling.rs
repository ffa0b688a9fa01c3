//! The scheduler's reduced sampling (`Forward::forward_greedy` for steps whose samplers need only
//! the argmax, `Forward::forward_top_k` for steps whose samplers draw with top-k), over
//! [`Counting`]: a backend that wraps the CPU model, counts the logit rows it hands out as full
//! host rows, greedy ids and top-k entries, and poisons its host logits after a reduced step
//! until `fetch_logits` (so a scheduler that read them unasked would sample garbage). Its logits are made coarse (many
//! exact ties) with NaN at fixed ids, so the greedy sampler's tie and NaN rule is exercised on
//! both paths.
//!
//! The tests prove that the greedy path is taken exactly when every sampling sequence of a step
//! is plain greedy (no penalty, no logprobs; stop strings and tokens allowed), the top-k path
//! when they draw with a small top-k and no penalty or logprobs, and that the
//! events (ids, text, logprobs, finish reason, stop string, usage) are the same with it as with
//! `EngineConfig::reduced_sampling` off, which reads every full row.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use kvcache::{CacheConfig, HostPages, KvPool};
use pagekv_engine::{Engine, EngineError, EngineMetrics, Event, GenerationRequest, RequestStream, SamplingParams};
use pagekv_model::backend::{argmax, top_k};
use pagekv_model::{Batch, Forward, Model, ModelConfig, ModelError};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

mod common;

use common::{engine_config, tokenizer, VOCAB};

/// The tiny model of these tests.
fn tiny_model() -> Model {
    common::tiny_model(11, "tiny-reduced")
}

/// Logit rows handed out by [`Counting`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Rows {
    /// Rows returned on the host by `forward`.
    full: usize,
    /// Rows returned as ids by `forward_greedy`.
    greedy: usize,
    /// Rows returned as best entries by `forward_top_k`, and `fetch_logits` calls after one.
    top_k: usize,
    fetches: usize,
}

/// The CPU model, with coarse logits (rounded to 1/2: exact ties everywhere) and NaN at every
/// 13th id; counts rows; after `forward_greedy` its host logits are NaN.
struct Counting {
    model: Model,
    /// `[rows, vocab]` the transformed logits of the last step.
    logits: Vec<f32>,
    /// `[rows, vocab]` the real logits while `logits` is poisoned (until `fetch_logits`).
    hidden: Vec<f32>,
    rows: Arc<Mutex<Rows>>,
}

impl Counting {
    fn step(&mut self, batch: &Batch, pool: &mut KvPool<HostPages>) -> Result<usize, ModelError> {
        let raw = self.model.forward(batch, pool)?;
        self.logits.clear();
        self.logits.extend(raw.iter().enumerate().map(|(i, &l)| {
            if (i % VOCAB) % 13 == 5 {
                f32::NAN
            } else {
                (l * 2.0).round() / 2.0
            }
        }));
        Ok(batch.num_logit_rows())
    }
}

impl Forward for Counting {
    type Pages = HostPages;

    fn config(&self) -> &ModelConfig {
        &self.model.config
    }

    fn new_pool(&self, cache: CacheConfig) -> Result<KvPool<HostPages>, ModelError> {
        Ok(KvPool::new(cache)?)
    }

    fn forward(&mut self, batch: &Batch, pool: &mut KvPool<HostPages>) -> Result<&[f32], ModelError> {
        let rows = self.step(batch, pool)?;
        self.rows.lock().unwrap().full += rows;
        Ok(&self.logits)
    }

    fn last_logits(&self) -> &[f32] {
        &self.logits
    }

    fn forward_greedy(
        &mut self,
        batch: &Batch,
        pool: &mut KvPool<HostPages>,
        ids: &mut Vec<u32>,
    ) -> Result<(), ModelError> {
        let rows = self.step(batch, pool)?;
        self.rows.lock().unwrap().greedy += rows;
        ids.clear();
        ids.extend(self.logits.chunks_exact(VOCAB).map(argmax));
        // Like a GPU backend, the logits do not reach the host: whoever reads them gets NaN.
        self.logits.fill(f32::NAN);
        Ok(())
    }

    fn forward_top_k(
        &mut self,
        batch: &Batch,
        pool: &mut KvPool<HostPages>,
        k: usize,
        ids: &mut Vec<u32>,
        values: &mut Vec<f32>,
    ) -> Result<(), ModelError> {
        let rows = self.step(batch, pool)?;
        self.rows.lock().unwrap().top_k += rows;
        ids.clear();
        values.clear();
        for row in self.logits.chunks_exact(VOCAB) {
            top_k(row, k, ids, values);
        }
        self.hidden.clone_from(&self.logits);
        self.logits.fill(f32::NAN);
        Ok(())
    }

    fn fetch_logits(&mut self) -> Result<&[f32], ModelError> {
        if self.logits.iter().all(|l| l.is_nan()) {
            self.rows.lock().unwrap().fetches += 1;
            self.logits.clone_from(&self.hidden);
        }
        Ok(&self.logits)
    }

    fn weight_bytes_per_token(&self) -> usize {
        self.model.weight_bytes_per_token()
    }

    fn device_label(&self) -> String {
        "counting test backend".into()
    }
}

/// An engine over [`Counting`] with reduced sampling on or off.
fn start(reduced: bool) -> Result<(Engine, Arc<Mutex<Rows>>), EngineError> {
    let rows = Arc::new(Mutex::new(Rows::default()));
    let r = rows.clone();
    let mut config = engine_config(64, true);
    config.reduced_sampling = reduced;
    let engine = Engine::start(
        Counting { model: tiny_model(), logits: Vec::new(), hidden: Vec::new(), rows: r },
        tokenizer(),
        config,
    );
    Ok((engine?, rows))
}

fn events(mut s: RequestStream) -> Vec<Event> {
    let mut out = Vec::new();
    loop {
        let e = s.recv_timeout(Duration::from_secs(120)).expect("an event within 2 minutes");
        let last = !matches!(e, Event::Token { .. });
        out.push(e);
        if last {
            return out;
        }
    }
}

fn prompt(seed: u64, len: usize) -> Vec<u32> {
    let mut rng = StdRng::seed_from_u64(seed);
    (0..len).map(|_| rng.gen_range(3..VOCAB as u32)).collect()
}

/// Which reduced form of its logit row a request's sampler can take.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Path {
    Greedy,
    TopK,
    Full,
}

/// One request of each kind, and the path its steps take when it runs alone.
fn kinds() -> Vec<(&'static str, GenerationRequest, Path)> {
    let base = |seed: u64| {
        let mut r = GenerationRequest::new(prompt(seed, 6 + seed as usize * 3), 14);
        r.ignore_eos = true;
        r
    };
    let greedy = SamplingParams::greedy();
    let with = |seed: u64, f: &dyn Fn(&mut GenerationRequest)| {
        let mut r = base(seed);
        f(&mut r);
        r
    };
    vec![
        ("greedy", base(1), Path::Greedy),
        // The stop string is the text of the greedy run's 5th token (found below), so it fires.
        ("greedy, stop string", base(2), Path::Greedy),
        ("greedy, stop token and eos", with(3, &|r| r.ignore_eos = false), Path::Greedy),
        (
            "greedy, penalty window 0",
            with(4, &|r| r.sampling = SamplingParams { repetition_penalty: 1.3, penalty_last_n: 0, ..greedy }),
            Path::Greedy,
        ),
        ("greedy, logprobs", with(5, &|r| r.logprobs = Some(3)), Path::Full),
        ("greedy, logprob of the token only", with(6, &|r| r.logprobs = Some(0)), Path::Full),
        (
            "greedy, repetition penalty",
            with(7, &|r| r.sampling = SamplingParams { repetition_penalty: 1.3, ..greedy }),
            Path::Full,
        ),
        (
            "greedy, presence penalty",
            with(8, &|r| r.sampling = SamplingParams { presence_penalty: 0.5, ..greedy }),
            Path::Full,
        ),
        (
            "greedy, frequency penalty",
            with(9, &|r| r.sampling = SamplingParams { frequency_penalty: -0.5, ..greedy }),
            Path::Full,
        ),
        ("sampled", with(10, &|r| r.sampling = SamplingParams { temperature: 0.8, seed: 3, ..greedy }), Path::Full),
        (
            "sampled, top-k",
            with(11, &|r| r.sampling = SamplingParams { temperature: 1.2, top_k: 5, top_p: 0.9, seed: 4, ..greedy }),
            Path::TopK,
        ),
        // Coarse logits and a cold temperature: tempered ties across the boundary, fallbacks.
        (
            "sampled, top-k, cold",
            with(12, &|r| r.sampling = SamplingParams { temperature: 0.05, top_k: 3, min_p: 0.1, seed: 5, ..greedy }),
            Path::TopK,
        ),
        (
            "sampled, top-k 64",
            with(13, &|r| r.sampling = SamplingParams { temperature: 0.9, top_k: 64, seed: 6, ..greedy }),
            Path::TopK,
        ),
        (
            "sampled, top-k 65",
            with(14, &|r| r.sampling = SamplingParams { temperature: 0.9, top_k: 65, seed: 7, ..greedy }),
            Path::Full,
        ),
        (
            "sampled, top-k, penalty",
            with(15, &|r| {
                r.sampling = SamplingParams { temperature: 0.9, top_k: 8, presence_penalty: 0.3, seed: 8, ..greedy }
            }),
            Path::Full,
        ),
        (
            "sampled, top-k, logprobs",
            with(16, &|r| {
                r.sampling = SamplingParams { temperature: 0.9, top_k: 8, seed: 9, ..greedy };
                r.logprobs = Some(2)
            }),
            Path::Full,
        ),
    ]
}

/// `kinds()` with the stop string and stop token filled in from a first greedy run, so that
/// they fire mid-generation.
fn requests(engine: &Engine) -> Vec<(&'static str, GenerationRequest, Path)> {
    let mut ks = kinds();
    let h = engine.handle();
    for (name, r, _) in ks.iter_mut() {
        if name.contains("stop string") || name.contains("stop token") {
            let first = events(h.submit(r.clone()).unwrap());
            let ids: Vec<u32> =
                first.iter().filter_map(|e| if let Event::Token { id, .. } = e { Some(*id) } else { None }).collect();
            if name.contains("stop string") {
                r.stop.stop_strings = vec![format!("w{}", ids[4])];
            } else {
                r.stop.stop_tokens = vec![ids[6]];
            }
        }
    }
    ks
}

fn rows_and_metrics(engine: &Engine, rows: &Arc<Mutex<Rows>>) -> (Rows, EngineMetrics) {
    (*rows.lock().unwrap(), engine.handle().metrics())
}

#[test]
fn the_greedy_path_is_taken_exactly_when_every_sampler_needs_only_the_argmax() {
    let (engine, rows) = start(true).unwrap();
    let reqs = requests(&engine);
    let h = engine.handle();
    let mut fallbacks = 0;
    for (name, r, path) in &reqs {
        let (before, m0) = rows_and_metrics(&engine, &rows);
        let ev = events(h.submit(r.clone()).unwrap());
        let (after, m1) = rows_and_metrics(&engine, &rows);
        let generated = ev.iter().filter(|e| matches!(e, Event::Token { .. })).count() as u64;
        let stopped_on_token =
            matches!(ev.last(), Some(Event::Done { usage, .. }) if usage.completion_tokens as u64 > generated);
        let sampled = generated + stopped_on_token as u64;
        assert!(sampled > 0, "{name}");
        let d = |a: usize, b: usize| (a - b) as u64;
        let (full, greedy, top) =
            (d(after.full, before.full), d(after.greedy, before.greedy), d(after.top_k, before.top_k));
        let (mf, mg, mt) = (
            m1.sampled_full_rows - m0.sampled_full_rows,
            m1.sampled_greedy_rows - m0.sampled_greedy_rows,
            m1.sampled_top_k_rows - m0.sampled_top_k_rows,
        );
        let fb = m1.top_k_fallbacks - m0.top_k_fallbacks;
        match path {
            Path::Greedy => assert_eq!((full, greedy, top, mf, mg, mt), (0, sampled, 0, 0, sampled, 0), "{name}"),
            Path::Full => assert_eq!((full, greedy, top, mf, mg, mt), (sampled, 0, 0, sampled, 0, 0), "{name}"),
            Path::TopK => {
                assert_eq!((full, greedy, top, mg), (0, 0, sampled, 0), "{name}");
                // Rows the best entries could not decide were sampled from fetched logits.
                assert_eq!((mt + fb, mf), (sampled, fb), "{name}");
                assert_eq!(d(after.fetches, before.fetches), fb, "{name}: one fetch per undecided step");
                fallbacks += fb;
            }
        }
    }
    assert!(fallbacks > 0, "the cold top-k request exercised the fallback");
    // All at once: a step with any full-row sampler reads full rows; the others take ids.
    let streams: Vec<RequestStream> = reqs.iter().map(|(_, r, _)| h.submit(r.clone()).unwrap()).collect();
    streams.into_iter().for_each(|s| drop(events(s)));
    let m = h.metrics();
    assert_eq!(m.sampled_full_rows + m.sampled_greedy_rows + m.sampled_top_k_rows, m.generated_tokens);
    engine.shutdown(Duration::from_secs(5));

    // Off: no greedy id is ever asked for.
    let (engine, rows) = start(false).unwrap();
    for (_, r, _) in kinds().into_iter().take(4) {
        drop(events(engine.handle().submit(r).unwrap()));
    }
    let (r, m) = rows_and_metrics(&engine, &rows);
    assert_eq!((r.greedy, r.top_k, m.sampled_greedy_rows, m.sampled_top_k_rows), (0, 0, 0, 0));
    assert_eq!(r.full as u64, m.generated_tokens);
    engine.shutdown(Duration::from_secs(5));
}

/// Every request's events, one at a time and then all at once.
fn run_all(reduced: bool) -> (Vec<Vec<Event>>, Vec<Vec<Event>>, Rows) {
    let (engine, rows) = start(reduced).unwrap();
    let reqs = requests(&engine);
    let h = engine.handle();
    let serial = reqs.iter().map(|(_, r, _)| events(h.submit(r.clone()).unwrap())).collect();
    // Only the plain-greedy ones together: every step of this run may take the greedy path.
    let together_reqs: Vec<&GenerationRequest> = reqs.iter().filter(|k| k.2 == Path::Greedy).map(|k| &k.1).collect();
    let streams: Vec<RequestStream> = together_reqs.iter().map(|r| h.submit((*r).clone()).unwrap()).collect();
    let before = *rows.lock().unwrap();
    let together = streams.into_iter().map(events).collect();
    let after = *rows.lock().unwrap();
    // Then everything at once: steps mix the paths.
    let streams: Vec<RequestStream> = reqs.iter().map(|(_, r, _)| h.submit(r.clone()).unwrap()).collect();
    let mixed: Vec<Vec<Event>> = streams.into_iter().map(events).collect();
    let mut together: Vec<Vec<Event>> = together;
    together.extend(mixed);
    engine.shutdown(Duration::from_secs(5));
    (serial, together, Rows { full: after.full - before.full, greedy: after.greedy - before.greedy, ..Rows::default() })
}

#[test]
fn events_are_identical_with_and_without_the_greedy_path() {
    let (want_serial, want_together, off) = run_all(false);
    let (serial, together, on) = run_all(true);
    assert_eq!(serial, want_serial, "one at a time");
    // (Steps that began before `before` was read may have read either way; the rest are greedy.)
    assert_eq!(together, want_together, "all at once");
    assert_eq!(off.greedy, 0);
    assert!(on.greedy > 0, "{on:?}");
    // The stop string and the stop token fired, so their acceptance was exercised on both paths.
    let done = |e: &[Event]| e.last().cloned();
    assert!(matches!(done(&serial[1]), Some(Event::Done { stop_sequence: Some(_), .. })), "{:?}", done(&serial[1]));
    assert!(serial[2].len() < 15, "the stop token ended the request early");
}
