//! `Engine` and `EngineHandle`: the public face of the scheduler thread.
//!
//! `Engine::start` runs one scheduler thread (`scheduler.rs`), the only owner of the model, the
//! pool and every sequence; the model is any [`Forward`] backend (the CPU `Model` with host
//! pages, a GPU model with device pages). [`Engine::start_with`] builds the model on that
//! thread (a GPU model stays on the thread that made it); the pool is built there too, with
//! `Forward::new_pool`, so it lives in the model's memory. Clients talk to it through cloneable [`EngineHandle`]s:
//! [`EngineHandle::submit`] validates a request on the caller's thread (bad input is refused
//! there, with a typed error; its grammar, if any, is compiled there) and returns its [`RequestStream`]; [`EngineHandle::metrics`]
//! reads the snapshot the scheduler publishes after every step.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{self, Receiver, Sender};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use kvcache::{SequenceCache, SequencePolicy};
use pagekv_model::tokenizer::{StreamDecoder, Tokenizer};
use pagekv_model::{Forward, ModelError};

use crate::bank::SessionBank;
use crate::config::{EngineConfig, EngineInfo};
use crate::constraint::{Constraint, GrammarCompiler};
use crate::metrics::EngineMetrics;
use crate::request::{EngineError, GenerationRequest, MAX_CHOICES, MAX_TOP_LOGPROBS};
use crate::sampling::{Sampler, SamplingParams};
use crate::scheduler::{Command, Limits, Scheduler};
use crate::sequence::Sequence;
use crate::speculative::{DraftMode, DraftPool};
use crate::stop::StopMatcher;
use crate::stream::{channel, RequestStream};

/// A running engine. Dropping it shuts the scheduler down at once (requests in flight end
/// with [`EngineError::ShutDown`]); [`Engine::shutdown`] gives them a grace period.
pub struct Engine {
    handle: EngineHandle,
    thread: Option<JoinHandle<()>>,
}

/// A cheap, cloneable, thread-safe way to submit requests and read metrics.
#[derive(Clone)]
pub struct EngineHandle {
    tx: Sender<Command>,
    info: Arc<EngineInfo>,
    metrics: Arc<Mutex<EngineMetrics>>,
    next_id: Arc<AtomicU64>,
    accepting: Arc<AtomicBool>,
    /// Compiles requests' grammars (its parser factory is built on the first one).
    grammars: Arc<GrammarCompiler>,
}

impl Engine {
    /// Starts the scheduler thread over `model` with a pool built from `config`. The model is
    /// asked for path-invariant numerics first ([`Forward::ensure_path_invariance`]): batching,
    /// the session bank and preemption rely on a token's K/V not depending on how it was computed.
    pub fn start<M>(model: M, tokenizer: Arc<Tokenizer>, config: EngineConfig) -> Result<Engine, EngineError>
    where
        M: Forward + Send + 'static,
    {
        Engine::start_with(move || Ok(model), tokenizer, config)
    }

    /// Starts the scheduler thread and builds the model on it with `build`, then the pool
    /// (`Forward::new_pool`: host or device pages) from `config`. For backends whose model and
    /// pages must stay on the thread that made them (a CUDA model: its context, stream and
    /// captured graphs), or are not `Send`. Returns once the model and pool exist; an error of
    /// `build` is [`EngineError::Model`], one of the pool [`EngineError::Config`].
    pub fn start_with<M, F>(build: F, tokenizer: Arc<Tokenizer>, config: EngineConfig) -> Result<Engine, EngineError>
    where
        M: Forward + 'static,
        F: FnOnce() -> Result<M, ModelError> + Send + 'static,
    {
        if config.max_batch_tokens == 0 || config.max_seqs == 0 {
            return Err(EngineError::Config("max_batch_tokens and max_seqs must be at least 1".into()));
        }
        config.speculative.validate().map_err(|e| EngineError::Config(e.to_string()))?;
        let metrics = Arc::new(Mutex::new(EngineMetrics::default()));
        let grammar_tokenizer = tokenizer.clone();
        let (tx, rx) = mpsc::channel();
        let (ready_tx, ready_rx) = mpsc::sync_channel::<Result<EngineInfo, EngineError>>(1);
        let scheduler_metrics = metrics.clone();
        let thread = std::thread::Builder::new()
            .name("pagekv-scheduler".into())
            .spawn(move || {
                // Batching, the session bank and preemption must not change a request's tokens.
                let model = match build() {
                    Ok(mut m) => {
                        m.ensure_path_invariance();
                        m
                    }
                    Err(e) => {
                        let _ = ready_tx.send(Err(EngineError::Model(e.to_string())));
                        return;
                    }
                };
                match assemble(model, tokenizer, &config, scheduler_metrics, rx) {
                    Ok((scheduler, info)) => {
                        let _ = ready_tx.send(Ok(info));
                        scheduler.run();
                    }
                    Err(e) => {
                        let _ = ready_tx.send(Err(e));
                    }
                }
            })
            .map_err(|e| EngineError::Config(format!("cannot start the scheduler thread: {e}")))?;
        let info = match ready_rx.recv() {
            Ok(Ok(info)) => info,
            Ok(Err(e)) => {
                let _ = thread.join();
                return Err(e);
            }
            Err(_) => {
                let _ = thread.join();
                return Err(EngineError::Model("the scheduler thread panicked while starting".into()));
            }
        };
        let grammars = Arc::new(GrammarCompiler::new(grammar_tokenizer, info.vocab_size));
        let handle = EngineHandle {
            tx,
            grammars,
            info: Arc::new(info),
            metrics,
            next_id: Arc::new(AtomicU64::new(1)),
            accepting: Arc::new(AtomicBool::new(true)),
        };
        Ok(Engine { handle, thread: Some(thread) })
    }

    pub fn handle(&self) -> EngineHandle {
        self.handle.clone()
    }

    /// Stops accepting requests, lets those in flight finish for up to `grace`, ends the rest
    /// with [`EngineError::ShutDown`], and joins the scheduler thread.
    pub fn shutdown(mut self, grace: Duration) {
        self.stop(grace);
    }

    fn stop(&mut self, grace: Duration) {
        self.handle.accepting.store(false, Ordering::Release);
        let _ = self.handle.tx.send(Command::Shutdown { deadline: Instant::now() + grace });
        if let Some(t) = self.thread.take() {
            if t.join().is_err() {
                tracing::error!("the scheduler thread panicked");
            }
        }
    }
}

/// The scheduler over `model`: the pool (in the model's memory), the template sequence, the
/// bank and the limits, and the facts a handle reports. Runs on the scheduler thread.
fn assemble<M: Forward>(
    model: M,
    tokenizer: Arc<Tokenizer>,
    config: &EngineConfig,
    metrics: Arc<Mutex<EngineMetrics>>,
    rx: Receiver<Command>,
) -> Result<(Scheduler<M>, EngineInfo), EngineError> {
    let mc = model.config();
    let mut cache = config.cache.clone();
    cache.num_layers = mc.num_layers;
    cache.num_kv_heads = mc.num_kv_heads;
    cache.head_dim = mc.head_dim;
    let context_window = *cache.context_window.get_or_insert(mc.context_length);
    if cache.sliding_window.is_none() {
        cache.sliding_window = mc.sliding_window;
    }
    // Layers with their own window get their own block tables (when the backend reads them).
    cache.hybrid &= model.reads_layer_groups();
    cache.set_layer_windows(&mc.layer_windows).map_err(|e| EngineError::Config(e.to_string()))?;
    // Drafts are trimmed back after verification: with a drafter, windowed groups keep what a
    // query up to `draft_tokens` positions back reaches, so the trim leaves every window whole
    // (a sliding group holds up to ⌈draft_tokens / block_size⌉ blocks more).
    let drafting = config.speculative.mode != DraftMode::Off;
    let policy = SequencePolicy {
        dynamic_growth: false,
        context_window: Some(context_window),
        sliding_window: cache.sliding_window,
        debug_blocks: cache.debug_blocks,
        trim_margin: if drafting { config.speculative.draft_tokens } else { 0 },
    };
    let pool = model.new_pool(cache.clone()).map_err(|e| EngineError::Config(e.to_string()))?;
    let bs = cache.block_size;
    // The template reserves the whole window (or pool) and holds no block.
    let reserve = context_window.min(cache.num_blocks * bs);
    let template = SequenceCache::reserving(&pool, policy, reserve);
    let (codes, scales) = pool.geometry().block_bytes_by_category();
    let block_bytes = codes + scales;
    let mut bank_config = config.bank.clone();
    if cache.sliding_window.is_some() {
        // Blocks before the window are reclaimed: prefixes cannot be shared.
        bank_config.enabled = false;
    }
    let identity = identity(&model, &cache.format.name(), bs, cache.rotation_seed);
    let info = EngineInfo {
        model_name: mc.name.clone(),
        context_window,
        vocab_size: mc.vocab_size,
        block_size: bs,
        num_blocks: cache.num_blocks,
        block_bytes,
        kv_format: cache.format.name(),
        max_batch_tokens: config.max_batch_tokens,
        max_seqs: config.max_seqs,
        eos_tokens: tokenizer.eot_ids().to_vec(),
        device: model.device_label(),
    };
    let limits = Limits {
        max_batch_tokens: config.max_batch_tokens,
        max_seqs: config.max_seqs,
        context_window,
        block_size: bs,
        vocab_size: mc.vocab_size,
        identity,
        watermark: (cache.num_blocks / 100).max(1),
        reduced_sampling: config.reduced_sampling,
        speculative: config.speculative.clone(),
    };
    let bank = SessionBank::new(bank_config, cache.num_blocks, bs, block_bytes);
    let draft_pool = DraftPool { block_size: bs, num_blocks: cache.num_blocks, context_window };
    let what = match config.speculative.mode {
        DraftMode::Mtp(_) => "MTP drafter",
        _ => "draft model",
    };
    let drafter = config.speculative.drafter(draft_pool).map_err(|e| EngineError::Model(format!("{what}: {e}")))?;
    if drafter.as_ref().is_some_and(|d| d.wants_hidden()) && !model.hands_out_hidden() {
        return Err(EngineError::Config(format!(
            "the {} drafter needs the model's hidden states, which the {} backend does not hand out",
            config.speculative.mode.name(),
            model.device_label()
        )));
    }
    let scheduler = Scheduler::new(model, tokenizer, pool, template, bank, limits, metrics, rx, drafter);
    Ok((scheduler, info))
}

impl Drop for Engine {
    fn drop(&mut self) {
        self.stop(Duration::ZERO);
    }
}

impl EngineHandle {
    /// Validates `request` and queues it. Errors name the violated limit; a request that
    /// passes will run to `Done` (or fail with a forward error or at shutdown).
    pub fn submit(&self, request: GenerationRequest) -> Result<RequestStream, EngineError> {
        let mut streams = self.submit_n(request, 1)?;
        debug_assert_eq!(streams.len(), 1);
        streams.pop().ok_or(EngineError::ShutDown)
    }

    /// Validates `request` and queues `n` continuations of it (`1..=MAX_CHOICES`), one stream
    /// each, in order. The prompt is computed once; then its cache is forked `n − 1` times
    /// (copy-on-write: the prompt's blocks are shared) and each continuation samples on its own:
    /// continuation `i` seeds its sampler with `seed + i` (the same tokens as a plain request
    /// with that seed, so temperature 0 gives `n` equal outputs and sampling `n` different,
    /// reproducible ones) and has its own grammar state, stop conditions, `max_tokens`,
    /// logprobs and finish. Dropping a stream cancels its continuation only.
    pub fn submit_n(&self, request: GenerationRequest, n: usize) -> Result<Vec<RequestStream>, EngineError> {
        if !self.accepting.load(Ordering::Acquire) {
            return Err(EngineError::ShutDown);
        }
        if !(1..=MAX_CHOICES).contains(&n) {
            return Err(EngineError::InvalidChoices { got: n, max: MAX_CHOICES });
        }
        self.validate(&request)?;
        Sampler::new(request.sampling)?;
        // Compiled here, on the caller's thread: a bad grammar is this call's error. Compiled
        // once; the other continuations start from copies.
        let constraint = request.grammar.as_ref().map(|g| self.grammars.compile(g)).transpose()?;
        let first_id = self.next_id.fetch_add(n as u64, Ordering::Relaxed);
        let mut stop = request.stop.clone();
        if !request.ignore_eos {
            stop.stop_tokens.extend_from_slice(&self.info.eos_tokens);
        }
        let mut streams = Vec::with_capacity(n);
        let mut sequences = Vec::with_capacity(n);
        for i in 0..n {
            let id = first_id + i as u64;
            let (out, stream) = channel(id);
            let sampling = SamplingParams { seed: request.sampling.seed.wrapping_add(i as u64), ..request.sampling };
            let constraint = constraint.as_ref().map(Constraint::fork);
            sequences.push(Sequence {
                id,
                prompt_len: request.prompt.len(),
                // The continuations' token lists start when they are forked (a copy of the prompt).
                tokens: if i == 0 { request.prompt.clone() } else { Vec::new() },
                cache: None,
                hashes: Vec::new(),
                registered: 0,
                origin: None,
                sampler: Sampler::new(sampling)?,
                matcher: StopMatcher::new(&stop.stop_strings),
                stop: stop.clone(),
                decoder: StreamDecoder::new(true),
                logprobs: request.logprobs,
                constraint,
                generated: 0,
                draft: Vec::new(),
                draft_max: 0,
                speculative: request.speculative,
                draft_length: Default::default(),
                cached_tokens: None,
                out,
                siblings: Vec::new(),
            });
            streams.push(stream);
        }
        let mut first = sequences.remove(0);
        first.siblings = sequences;
        self.tx.send(Command::Submit(Box::new(first))).map_err(|_| EngineError::ShutDown)?;
        Ok(streams)
    }

    /// Checks a request against the engine's limits without submitting it.
    pub fn validate(&self, r: &GenerationRequest) -> Result<(), EngineError> {
        let info = &self.info;
        let n = r.prompt.len();
        if n == 0 {
            return Err(EngineError::EmptyPrompt);
        }
        if n > info.context_window {
            return Err(EngineError::PromptTooLong { prompt_tokens: n, context_window: info.context_window });
        }
        let needed_blocks = n.div_ceil(info.block_size);
        if needed_blocks > info.num_blocks {
            return Err(EngineError::PromptExceedsPool {
                prompt_tokens: n,
                needed_blocks,
                pool_blocks: info.num_blocks,
            });
        }
        if let Some((position, &id)) = r.prompt.iter().enumerate().find(|(_, &t)| t as usize >= info.vocab_size) {
            return Err(EngineError::TokenOutOfRange { id, position, vocab: info.vocab_size });
        }
        if r.stop.max_tokens == 0 {
            return Err(EngineError::ZeroMaxTokens);
        }
        if let Some(got) = r.logprobs.filter(|&n| n > MAX_TOP_LOGPROBS) {
            return Err(EngineError::TooManyLogprobs { got, max: MAX_TOP_LOGPROBS });
        }
        r.sampling.validate()?;
        Ok(())
    }

    /// The snapshot published after the last step.
    pub fn metrics(&self) -> EngineMetrics {
        self.metrics.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    pub fn info(&self) -> &EngineInfo {
        &self.info
    }
}

/// 64-bit identity of what a block's K/V depend on besides its tokens: the model (name,
/// shape, weight bytes, the device and weight type it runs on), the KV format and the block
/// size. FNV-1a: stable across runs.
fn identity<M: Forward>(model: &M, format: &str, block_size: usize, rotation_seed: u64) -> u64 {
    let c = model.config();
    let key = format!(
        "{}|{}|{}|{}|{}|{}|{}|{}|{}|{}|{}|{}",
        c.name,
        c.arch_name,
        c.num_layers,
        c.hidden,
        c.num_kv_heads,
        c.head_dim,
        c.vocab_size,
        model.weight_bytes_per_token(),
        model.device_label(),
        format,
        block_size,
        rotation_seed
    );
    key.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| (h ^ b as u64).wrapping_mul(0x0000_0100_0000_01b3))
}
