//! The engine over a [`Forward`] backend that is not the CPU `Model` and whose pages are not
//! host pages: [`OffHost`] keeps the K/V in a memory of its own (a host pool the engine never
//! sees, standing in for a device), and the pool the engine owns stores nothing — it only
//! forwards block copies to the backend and counts any other use. So these tests prove that the
//! scheduler, the session bank and preemption use the model only through `Forward` and the pages
//! only through `PageStore::copy_block` (never `write` or `read` on the host), and that they
//! behave exactly as over the CPU model: same tokens, same prefix reuse, same preemptions.
//!
//! The model is a tiny synthetic llama (random f32 weights, 2 layers) written with
//! `GgufWriter`, with a small SentencePiece-style vocabulary: no file is needed.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use kvcache::{CacheConfig, HostPages, KvPool, PageGeometry, PageStore};
use pagekv_engine::{Engine, EngineConfig, EngineError, Event, FinishReason, GenerationRequest, RequestStream, Usage};
use pagekv_model::{Batch, Forward, Model, ModelConfig, ModelError};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

mod common;
#[path = "../../model/tests/tiny_mtp/mod.rs"]
mod tiny_mtp;

use common::{engine_config, tokenizer, VOCAB};

/// The tiny model of these tests.
fn tiny_model() -> Model {
    common::tiny_model(7, "tiny-offhost")
}

/// What the engine did to the pages of [`OffHostPages`].
#[derive(Default)]
struct PageLog {
    /// Block copies not yet applied to the backend's own pages.
    copies: Vec<(u32, u32)>,
    copies_total: usize,
    /// Host writes and reads through `PageStore` (the engine must make none).
    writes: usize,
    reads: AtomicUsize,
}

/// The engine's pool's pages: nothing is stored here; the K/V live in [`OffHost`].
struct OffHostPages {
    geometry: PageGeometry,
    log: Arc<Mutex<PageLog>>,
}

impl PageStore for OffHostPages {
    fn geometry(&self) -> &PageGeometry {
        &self.geometry
    }

    fn write(&mut self, _layer: usize, _slots: &[u32], _keys: &[f32], _values: &[f32]) {
        self.log.lock().unwrap().writes += 1;
    }

    fn copy_block(&mut self, src: u32, dst: u32) {
        let mut log = self.log.lock().unwrap();
        log.copies.push((src, dst));
        log.copies_total += 1;
    }

    fn read(&self, _layer: usize, _slot: u32, keys: &mut [f32], values: &mut [f32]) {
        self.log.lock().unwrap().reads.fetch_add(1, Ordering::Relaxed);
        keys.fill(f32::NAN);
        values.fill(f32::NAN);
    }
}

/// A backend with memory of its own: the CPU model over a private host pool, which the
/// engine's block tables index. `fail_at`: the forward with that index (from 0) fails.
struct OffHost {
    model: Model,
    /// The K/V, `None` until the first forward (its geometry is the engine's pool's).
    own: Option<KvPool<HostPages>>,
    log: Arc<Mutex<PageLog>>,
    forwards: Arc<AtomicUsize>,
    /// Calls of `ensure_path_invariance` (the engine makes one, before its first step).
    invariance_asked: Arc<AtomicUsize>,
    fail_at: Option<usize>,
}

impl Forward for OffHost {
    type Pages = OffHostPages;

    fn config(&self) -> &ModelConfig {
        &self.model.config
    }

    fn new_pool(&self, cache: CacheConfig) -> Result<KvPool<OffHostPages>, ModelError> {
        let pages = OffHostPages { geometry: kvcache::geometry_of(&cache), log: self.log.clone() };
        Ok(KvPool::with_store(cache, pages)?)
    }

    fn forward(&mut self, batch: &Batch, pool: &mut KvPool<OffHostPages>) -> Result<&[f32], ModelError> {
        let n = self.forwards.fetch_add(1, Ordering::Relaxed);
        if self.fail_at == Some(n) {
            return Err(ModelError::Device("injected failure".into()));
        }
        if self.own.is_none() {
            self.own = Some(KvPool::new(pool.config().clone())?);
        }
        let own = self.own.as_mut().expect("made above");
        for (src, dst) in std::mem::take(&mut self.log.lock().unwrap().copies) {
            own.pages_mut().copy_block(src, dst);
        }
        self.model.forward(batch, own)
    }

    fn last_logits(&self) -> &[f32] {
        self.model.last_logits()
    }

    fn ensure_path_invariance(&mut self) {
        assert_eq!(self.forwards.load(Ordering::Relaxed), 0, "asked before the first step");
        self.invariance_asked.fetch_add(1, Ordering::Relaxed);
        self.model.ensure_path_invariance();
    }

    fn weight_bytes_per_token(&self) -> usize {
        self.model.weight_bytes_per_token()
    }

    fn device_label(&self) -> String {
        "off-host test backend".into()
    }
}

struct Handles {
    log: Arc<Mutex<PageLog>>,
    forwards: Arc<AtomicUsize>,
    invariance_asked: Arc<AtomicUsize>,
}

/// The engine over [`OffHost`], the model built on the scheduler thread.
fn off_host_engine(config: EngineConfig, fail_at: Option<usize>) -> (Engine, Handles) {
    let log = Arc::new(Mutex::new(PageLog::default()));
    let forwards = Arc::new(AtomicUsize::new(0));
    let invariance_asked = Arc::new(AtomicUsize::new(0));
    let (l, f, i) = (log.clone(), forwards.clone(), invariance_asked.clone());
    let build =
        move || Ok(OffHost { model: tiny_model(), own: None, log: l, forwards: f, invariance_asked: i, fail_at });
    (Engine::start_with(build, tokenizer(), config).unwrap(), Handles { log, forwards, invariance_asked })
}

#[derive(Debug, Clone, PartialEq)]
struct Outcome {
    tokens: Vec<u32>,
    finish: FinishReason,
    usage: Usage,
}

fn collect(mut s: RequestStream) -> Result<Outcome, EngineError> {
    let mut tokens = Vec::new();
    loop {
        match s.recv_timeout(Duration::from_secs(120)).expect("an event within 2 minutes") {
            Event::Token { id, .. } => tokens.push(id),
            Event::Done { finish_reason, usage, .. } => return Ok(Outcome { tokens, finish: finish_reason, usage }),
            Event::Error(e) => return Err(e),
        }
    }
}

/// Greedy requests, `ignore_eos` so every one runs to its length: prompts that share a
/// 24-token prefix (3 blocks of 8), and distinct ones.
fn requests() -> Vec<GenerationRequest> {
    let mut rng = StdRng::seed_from_u64(3);
    let mut id = || rng.gen_range(3..VOCAB as u32);
    let prefix: Vec<u32> = (0..24).map(|_| id()).collect();
    let mut out = Vec::new();
    for i in 0..10 {
        let mut prompt = if i % 2 == 0 { prefix.clone() } else { Vec::new() };
        prompt.extend((0..5 + 3 * i).map(|_| id()));
        let mut r = GenerationRequest::new(prompt, 12 + i);
        r.ignore_eos = true;
        out.push(r);
    }
    out
}

/// Runs `reqs` one after another on `engine` (the bank then serves the shared prefix), then
/// all of them at once (the pool may have to preempt).
fn drive(engine: &Engine, reqs: &[GenerationRequest]) -> (Vec<Outcome>, Vec<Outcome>) {
    let h = engine.handle();
    let serial = reqs.iter().map(|r| collect(h.submit(r.clone()).unwrap()).unwrap()).collect();
    let streams: Vec<RequestStream> = reqs.iter().map(|r| h.submit(r.clone()).unwrap()).collect();
    let together = streams.into_iter().map(|s| collect(s).unwrap()).collect();
    (serial, together)
}

#[test]
fn the_engine_over_an_off_host_backend_matches_the_cpu_model() {
    let reqs = requests();
    // A pool so small that ten sequences at once do not fit: preemption and bank eviction.
    let blocks = 24;
    let cpu = Engine::start(tiny_model(), tokenizer(), engine_config(blocks, true)).unwrap();
    let (want_serial, want_together) = drive(&cpu, &reqs);
    let cpu_metrics = cpu.handle().metrics();
    cpu.shutdown(Duration::from_secs(5));

    let (engine, handles) = off_host_engine(engine_config(blocks, true), None);
    assert_eq!(engine.handle().info().device, "off-host test backend");
    let (serial, together) = drive(&engine, &reqs);
    let m = engine.handle().metrics();
    engine.shutdown(Duration::from_secs(5));

    assert_eq!(serial, want_serial, "one at a time");
    // All at once, prefix hits depend on arrival order; the tokens do not.
    let tokens = |o: &[Outcome]| o.iter().map(|x| x.tokens.clone()).collect::<Vec<_>>();
    assert_eq!(tokens(&together), tokens(&want_together), "all at once");
    for (o, r) in together.iter().zip(&reqs) {
        assert_eq!((o.finish, o.tokens.len()), (FinishReason::Length, r.stop.max_tokens));
    }
    // The bank served the shared prefix (3 blocks) to the later prompts that carry it.
    assert!(serial[2..].iter().step_by(2).all(|o| o.usage.cached_tokens == 24), "{serial:?}");
    // (How many preemptions depends on when the scheduler sees each submission.)
    for x in [&m, &cpu_metrics] {
        assert!(x.bank_hits > 0 && x.preemptions > 0, "the run exercised the bank and preemption: {x:?}");
    }
    assert!(handles.forwards.load(Ordering::Relaxed) as u64 >= m.steps);
    // The engine asked for path-invariant numerics once, before its first step.
    assert_eq!(handles.invariance_asked.load(Ordering::Relaxed), 1);
    let log = handles.log.lock().unwrap();
    assert_eq!((log.writes, log.reads.load(Ordering::Relaxed)), (0, 0), "the engine touched pages on the host");
    assert_eq!(m.blocks_used, 0, "every block went back to the pool or the bank");
}

#[test]
fn a_failing_forward_ends_its_requests_with_an_error_and_frees_their_blocks() {
    let (engine, _handles) = off_host_engine(engine_config(64, false), Some(2));
    let h = engine.handle();
    let mut r = GenerationRequest::new(vec![5, 6, 7, 8], 20);
    r.ignore_eos = true;
    let e = collect(h.submit(r.clone()).unwrap()).unwrap_err();
    assert!(matches!(&e, EngineError::Forward(m) if m.contains("injected failure")), "{e}");
    // The engine goes on: the next request runs to its end.
    let ok = collect(h.submit(r).unwrap()).unwrap();
    assert_eq!(ok.tokens.len(), 20);
    let m = h.metrics();
    assert_eq!((m.requests_failed, m.requests_finished, m.blocks_used), (1, 1, 0), "{m:?}");
    engine.shutdown(Duration::from_secs(5));
}

#[test]
fn a_model_that_cannot_be_built_is_an_error_of_start() {
    let build = || -> Result<OffHost, ModelError> { Err(ModelError::Device("no such device".into())) };
    let e = Engine::start_with(build, tokenizer(), engine_config(16, true)).err().expect("start fails");
    assert_eq!(e.to_string(), "cannot start the model: device: no such device");
}

/// Multi-token decoding over the off-host backend: drafting, verification (a logit row per
/// drafted position) and the rollback of rejected positions use the backend only through
/// `Forward` and the pages only through block bookkeeping, and give the tokens of plain
/// decoding on the CPU model.
#[test]
fn drafting_over_an_off_host_backend_keeps_the_cpu_models_tokens() {
    // Prompts that repeat themselves, so the n-gram drafter has something to propose.
    let reqs: Vec<GenerationRequest> = requests()
        .into_iter()
        .map(|mut r| {
            let again = r.prompt.clone();
            r.prompt.extend(again);
            r.stop.max_tokens += 20;
            r
        })
        .collect();
    let blocks = 64;
    let cpu = Engine::start(tiny_model(), tokenizer(), engine_config(blocks, true)).unwrap();
    let (want, _) = drive(&cpu, &reqs);
    cpu.shutdown(Duration::from_secs(5));

    let mut config = engine_config(blocks, true);
    config.speculative =
        pagekv_engine::SpeculativeConfig { mode: pagekv_engine::DraftMode::Ngram, ngram_min: 1, ..Default::default() };
    let (engine, handles) = off_host_engine(config, None);
    let (serial, together) = drive(&engine, &reqs);
    let m = engine.handle().metrics();
    engine.shutdown(Duration::from_secs(5));
    let tokens = |o: &[Outcome]| o.iter().map(|x| x.tokens.clone()).collect::<Vec<_>>();
    assert_eq!(tokens(&serial), tokens(&want), "one at a time, with drafts");
    assert_eq!(tokens(&together), tokens(&want), "all at once, with drafts");
    assert!(m.draft_steps > 0 && m.draft_accepted_tokens > 0, "drafts were verified and kept: {m:?}");
    let log = handles.log.lock().unwrap();
    assert_eq!((log.writes, log.reads.load(Ordering::Relaxed)), (0, 0), "the engine touched pages on the host");
    assert_eq!(m.blocks_used, 0);
}

#[test]
fn an_mtp_drafter_over_a_backend_without_hidden_states_is_refused_at_start() {
    // OffHost does not hand out hidden states (`Forward::hands_out_hidden` is false, as on CUDA).
    let t = tiny_mtp::tiny_mtp("llama", 1, tiny_mtp::Kind::Random, 1, None);
    let file = t.file.clone();
    let mtp = pagekv_engine::MtpModel::new("tiny-mtp", move || {
        Model::from_file(file, pagekv_cpu::attention::AttentionConfig::default())
    });
    let mut config = engine_config(64, false);
    config.speculative =
        pagekv_engine::SpeculativeConfig { mode: pagekv_engine::DraftMode::Mtp(mtp), ..Default::default() };
    let (l, f, i) = (Default::default(), Default::default(), Default::default());
    let build =
        move || Ok(OffHost { model: tiny_model(), own: None, log: l, forwards: f, invariance_asked: i, fail_at: None });
    let e = Engine::start_with(build, tokenizer(), config).err().expect("refused");
    assert!(matches!(e, EngineError::Config(_)), "{e:?}");
    let msg = e.to_string();
    assert!(
        msg.contains("mtp drafter needs the model's hidden states") && msg.contains("off-host test backend"),
        "{msg}"
    );
}

#[test]
fn an_mtp_drafter_for_a_model_without_nextn_layers_is_refused_at_start() {
    let mtp = pagekv_engine::MtpModel::new("tiny", || Ok(tiny_model()));
    let mut config = engine_config(64, false);
    config.speculative =
        pagekv_engine::SpeculativeConfig { mode: pagekv_engine::DraftMode::Mtp(mtp), ..Default::default() };
    let e = Engine::start(tiny_model(), tokenizer(), config).err().expect("refused");
    let msg = e.to_string();
    assert!(
        msg.contains("MTP drafter: ")
            && msg.contains("has no next-token-prediction layers (llama.nextn_predict_layers is 0 or absent)"),
        "{msg}"
    );
}
