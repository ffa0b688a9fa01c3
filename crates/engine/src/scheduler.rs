//! The scheduler: the one thread that owns the model, the pool, every sequence and the
//! session bank. It uses the model only through [`Forward`] (one `forward` per step, then the
//! host logits of the rows it asked for), and the pool only through block bookkeeping
//! (`SequenceCache`, `BlockPool`): it never reads pages, so they may live on a device. Each step:
//!
//! 1. `reap_cancelled`: streams dropped by their clients give up their sequences (blocks go
//!    to the bank, where they are reclaimable at once).
//! 2. `schedule_running`: running sequences, oldest first, each get `min(pending, budget)`
//!    tokens (a decode is 1, a prefill chunk more) under `max_batch_tokens`. Blocks come from
//!    the free list, then from the bank's cached blocks (LRU, tail first), then by preempting
//!    the most recently admitted sequence (its blocks go to the bank, it goes back to the front
//!    of the queue and is recomputed later, keeping its sampler state).
//! 3. `admit`: if nothing was preempted, queued requests are admitted in order while there is
//!    budget, a sequence slot and blocks for their first chunk (plus a small watermark). A
//!    prompt prefix found in the bank is shared by reference and not computed.
//! 4. `execute`: one `Batch` for every planned sequence, one forward, then for every sequence
//!    whose feed reached its end: sample, stream the token, check the stop conditions. When
//!    every sequence that samples in the step needs only the argmax of its row (plain greedy,
//!    no penalty, no logprobs), the forward is `Forward::forward_greedy`: the backend returns
//!    one id per row and the `[rows, vocab]` logits never reach the host (on a GPU, no
//!    device-to-host copy of the vocabulary per token). The ids go through the same acceptance
//!    path as sampled tokens, and are the same tokens (`argmax` is the greedy sampler's rule).
//!    Likewise, when every sampling sequence is plain greedy or draws with top-k (at most
//!    `MAX_REDUCED_TOP_K`, no penalty, no logprobs), the forward is `Forward::forward_top_k`
//!    with the largest `top_k + 1`: each sampler draws from its row's best entries with the
//!    same result and RNG use as from the full row (`Sampler::sample_top_k`), and the rare row
//!    those entries cannot decide is sampled from `Forward::fetch_logits`.
//!    `PAGEKV_DEV_REDUCED_SAMPLING=0` turns both off (every step reads the full rows).
//!    When the drafter reads the model's hidden states (`Drafter::wants_hidden`: `mtp`), the
//!    batch asks for those of every token fed to a sequence that may draft (`Batch::keep_hidden`),
//!    and after the forward each such sequence's kept positions go to `Drafter::computed`
//!    (`after_forward`, `verify_draft`); other steps and sequences ask for none.
//!
//! Planning takes no block; it counts the blocks it promises (`Budget::promised`), so the
//! appends it then opens cannot fail for lack of blocks. Every request ends exactly once, with
//! `Done` or `Error`; a preempted request is requeued, never dropped nor duplicated.
//!
//! Beside this file: `draft.rs` (draft lengths, proposals, verification), `fork.rs` (the
//! continuations of `n > 1`), `sample.rs` (taking a sampled token), `report.rs` (metrics).

mod draft;
mod fork;
mod report;
mod sample;

use std::collections::VecDeque;
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use kvcache::{KvPool, PageStore, SequenceCache};
use pagekv_model::tokenizer::Tokenizer;
use pagekv_model::{Batch, Forward, Logits};

use crate::bank::{fork_prefix, SessionBank};
use crate::constraint::{Constraint, GrammarError};
use crate::metrics::EngineMetrics;
use crate::request::{EngineError, Event, Usage};
use crate::sampling::TokenLogprobs;
use crate::sequence::Sequence;
use crate::speculative::{Drafter, SpeculativeConfig};
use crate::stop::FinishReason;
use crate::stream::EventSender;
use fork::{cache_blocks_needed, cache_fit_tokens, requests_in};
use sample::{Ended, HostRows};

/// What the handles send the scheduler.
pub(crate) enum Command {
    Submit(Box<Sequence>),
    /// Stop accepting; finish what is in flight until `deadline`, then fail the rest.
    Shutdown {
        deadline: Instant,
    },
}

/// Fixed facts the scheduler works with.
pub(crate) struct Limits {
    pub max_batch_tokens: usize,
    pub max_seqs: usize,
    pub context_window: usize,
    pub block_size: usize,
    pub vocab_size: usize,
    /// Folded into every block hash: model, KV format, block size.
    pub identity: u64,
    /// Free blocks kept back when admitting next to running sequences (their next decodes).
    pub watermark: usize,
    /// Steps whose samplers need only the argmax take the backend's greedy ids
    /// (`PAGEKV_DEV_REDUCED_SAMPLING`, on by default).
    pub reduced_sampling: bool,
    /// Draft lengths and costs (the drafter itself is the scheduler's `drafter`).
    pub speculative: SpeculativeConfig,
}

#[derive(Default)]
struct Counters {
    preemptions: u64,
    submitted: u64,
    finished: u64,
    cancelled: u64,
    failed: u64,
    prompt_tokens: u64,
    computed_tokens: u64,
    generated_tokens: u64,
    steps: u64,
    sampled_full_rows: u64,
    sampled_greedy_rows: u64,
    sampled_top_k_rows: u64,
    top_k_fallbacks: u64,
    sampling_steps: u64,
    draft_steps: u64,
    draft_tokens: u64,
    draft_accepted: u64,
    /// Continuations forked from a request's computed prompt (`n > 1`).
    forks: u64,
    /// Grammar masks computed, and the time spent computing them.
    masks: u64,
    mask_nanos: u64,
}

/// Largest `top_k` a step may ask the backend for (`Forward::forward_top_k`); larger ones read
/// the full rows.
pub(crate) const MAX_REDUCED_TOP_K: usize = 64;

/// How the tokens of a step are chosen.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Sampling {
    /// `Forward::forward`: every sampling sequence's sampler reads its full host row.
    FullRows,
    /// `Forward::forward_greedy`: every sampling sequence takes the backend's argmax.
    Greedy,
    /// `Forward::forward_top_k` with `k` entries a row: every sampling sequence is plain
    /// greedy (the first entry) or draws from its best `top_k + 1 <= k` entries.
    TopK(usize),
}

/// Tokens and blocks handed out in the step being planned.
struct Budget {
    tokens: usize,
    promised_blocks: usize,
}

pub(crate) struct Scheduler<M: Forward> {
    model: M,
    tokenizer: Arc<Tokenizer>,
    /// The blocks and their pages, in the model's memory (host or device).
    pool: KvPool<M::Pages>,
    /// An empty sequence whose reservation covers the context window: every new sequence is a
    /// fork of it, so appends take exactly the blocks their tokens need (no growth spurts).
    template: SequenceCache,
    bank: SessionBank,
    /// Admitted sequences, oldest admission first.
    running: Vec<Sequence>,
    waiting: VecDeque<Sequence>,
    /// `(index into running, tokens)` of the step being planned.
    plan: Vec<(usize, usize)>,
    batch: Batch,
    /// How the planned step's tokens are chosen (set by `execute`).
    sampling: Sampling,
    /// `[logit rows]` the backend's greedy ids of the step, when `sampling` is `Greedy`.
    greedy_ids: Vec<u32>,
    /// `[logit rows, k]` the backend's best entries of each row, when `sampling` is `TopK(k)`.
    top_values: Vec<f32>,
    /// `[vocab]` a constrained sequence's logit row with the tokens its grammar forbids at −∞.
    masked_row: Vec<f32>,
    /// Proposes draft tokens for decoding sequences (`None`: one token per step).
    drafter: Option<Box<dyn Drafter>>,
    /// `[tokens]` a drafted sequence's feed: its last token, then its draft.
    feed: Vec<u32>,
    /// Whether the planned step asks the forward for the hidden states of the sequences that
    /// may draft (the drafter reads them, `Drafter::wants_hidden`).
    hidden: bool,
    /// Final events of the step, sent after the metrics are published, so a client that sees
    /// its request end also sees the metrics of that end.
    finals: Vec<(EventSender, Event)>,
    limits: Limits,
    counters: Counters,
    metrics: Arc<Mutex<EngineMetrics>>,
    rx: Receiver<Command>,
    shutdown: Option<Instant>,
}

impl<M: Forward> Scheduler<M> {
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        model: M,
        tokenizer: Arc<Tokenizer>,
        pool: KvPool<M::Pages>,
        template: SequenceCache,
        bank: SessionBank,
        limits: Limits,
        metrics: Arc<Mutex<EngineMetrics>>,
        rx: Receiver<Command>,
        drafter: Option<Box<dyn Drafter>>,
    ) -> Scheduler<M> {
        Scheduler {
            model,
            tokenizer,
            pool,
            template,
            bank,
            running: Vec::new(),
            waiting: VecDeque::new(),
            plan: Vec::new(),
            batch: Batch::default(),
            sampling: Sampling::FullRows,
            greedy_ids: Vec::new(),
            top_values: Vec::new(),
            masked_row: Vec::new(),
            drafter,
            feed: Vec::new(),
            hidden: false,
            finals: Vec::new(),
            limits,
            counters: Counters::default(),
            metrics,
            rx,
            shutdown: None,
        }
    }

    /// The thread's body: wait for work, step while there is some, until shut down.
    pub fn run(mut self) {
        // Gauges are right from the start (pool size, free blocks), not only after a first step.
        self.publish_metrics();
        loop {
            if !self.receive() {
                break;
            }
            if let Some(deadline) = self.shutdown {
                if Instant::now() >= deadline || (self.running.is_empty() && self.waiting.is_empty()) {
                    break;
                }
            }
            self.step();
            self.publish();
            if self.plan.is_empty() && self.shutdown.is_none() {
                // Nothing could run (queued requests waiting for blocks only others can
                // free): wait for a command rather than spin.
                if let Ok(c) = self.rx.recv_timeout(Duration::from_millis(10)) {
                    self.handle(c);
                }
            }
        }
        self.fail_all(EngineError::ShutDown);
        self.bank.clear(&mut self.pool);
        self.publish();
    }

    /// Publishes the metrics, then sends the step's final events.
    fn publish(&mut self) {
        self.publish_metrics();
        for (out, event) in self.finals.drain(..) {
            out.send(event);
        }
    }

    /// Takes pending commands; blocks while there is nothing to do. Returns false when every
    /// handle is gone and nothing is in flight.
    fn receive(&mut self) -> bool {
        let idle = self.running.is_empty() && self.waiting.is_empty();
        if idle && self.shutdown.is_none() {
            let now = Instant::now();
            let cmd = match self.bank.next_expiry(now) {
                Some(wait) => match self.rx.recv_timeout(wait + Duration::from_millis(1)) {
                    Ok(c) => Some(c),
                    Err(RecvTimeoutError::Timeout) => None,
                    Err(RecvTimeoutError::Disconnected) => return false,
                },
                None => match self.rx.recv() {
                    Ok(c) => Some(c),
                    Err(_) => return false,
                },
            };
            if let Some(c) = cmd {
                self.handle(c);
            }
            self.bank.enforce_limits(&mut self.pool, Instant::now());
        }
        loop {
            match self.rx.try_recv() {
                Ok(c) => self.handle(c),
                Err(std::sync::mpsc::TryRecvError::Empty) => break,
                Err(std::sync::mpsc::TryRecvError::Disconnected) => {
                    // No handle left: nobody can submit; finish what is in flight.
                    if self.shutdown.is_none() {
                        self.shutdown = Some(Instant::now() + Duration::from_secs(3600 * 24 * 365));
                    }
                    break;
                }
            }
        }
        self.publish();
        true
    }

    fn handle(&mut self, cmd: Command) {
        match cmd {
            Command::Submit(seq) => {
                self.counters.submitted += requests_in([&*seq]) as u64;
                self.counters.prompt_tokens += seq.prompt_len as u64;
                self.waiting.push_back(*seq);
            }
            Command::Shutdown { deadline } => {
                self.shutdown = Some(self.shutdown.map_or(deadline, |d| d.min(deadline)));
            }
        }
    }

    fn step(&mut self) {
        self.reap_cancelled();
        self.bank.enforce_limits(&mut self.pool, Instant::now());
        self.plan.clear();
        let mut budget = Budget { tokens: self.limits.max_batch_tokens, promised_blocks: 0 };
        let preempted = self.schedule_running(&mut budget);
        if !preempted {
            self.admit(&mut budget);
        }
        if !self.plan.is_empty() {
            self.execute();
        }
        #[cfg(debug_assertions)]
        self.check_invariants();
    }

    fn free_blocks(&self) -> usize {
        self.pool.blocks().num_free()
    }

    /// Gives the running sequences their tokens for this step; returns whether any was
    /// preempted.
    fn schedule_running(&mut self, budget: &mut Budget) -> bool {
        let mut preempted = false;
        let mut i = 0;
        while i < self.running.len() && budget.tokens > 0 {
            let mut t = self.running[i].pending().min(budget.tokens);
            debug_assert!(t > 0, "a running sequence always has a token to feed");
            let mut pool_full = false;
            loop {
                let need = blocks_needed(&self.running[i], t, &self.pool);
                if self.free_blocks() >= budget.promised_blocks + need {
                    break;
                }
                if self.bank.evict_block(&mut self.pool) {
                    continue;
                }
                if i + 1 < self.running.len() || i > 0 {
                    // Preempt the most recently admitted: a newer one, or this one if it is
                    // the newest and older ones hold the blocks.
                    let victim = self.running.pop().expect("non-empty");
                    let was_self = self.running.len() == i;
                    self.preempt(victim);
                    preempted = true;
                    if was_self {
                        t = 0;
                        break;
                    }
                    continue;
                }
                // Alone and the pool is exhausted: feed what fits, or end the sequence.
                let spare = self.free_blocks() - budget.promised_blocks;
                let fit = fit_tokens(&self.running[i], spare, &self.pool);
                if fit == 0 {
                    pool_full = true;
                    break;
                }
                t = t.min(fit);
            }
            if pool_full {
                let seq = self.running.remove(i);
                self.finish(seq, FinishReason::Length);
                continue;
            }
            if t == 0 {
                break;
            }
            budget.promised_blocks += blocks_needed(&self.running[i], t, &self.pool);
            budget.tokens -= t;
            self.plan.push((i, t));
            self.allow_draft(i, budget);
            i += 1;
        }
        self.draft();
        preempted
    }

    /// Admits queued requests in order while they fit.
    fn admit(&mut self, budget: &mut Budget) {
        let bs = self.limits.block_size;
        while !self.waiting.is_empty() && self.running.len() < self.limits.max_seqs && budget.tokens > 0 {
            let mut seq = self.waiting.pop_front().expect("non-empty");
            let (cache, origin, own) = self.find_cache(&mut seq);
            let computed = cache.offset();
            let mut t = (seq.tokens.len() - computed).min(budget.tokens);
            let mut need = cache_blocks_needed(&cache, t, &self.pool);
            let watermark = if self.running.is_empty() { 0 } else { self.limits.watermark };
            let wanted = budget.promised_blocks + need + watermark;
            while self.free_blocks() < wanted && self.bank.evict_block(&mut self.pool) {}
            if self.free_blocks() < wanted && self.running.is_empty() {
                // Alone with every other block reclaimed (a recomputed sequence longer than a
                // step's worth of the pool): feed what fits, or end it if nothing does.
                let spare = self.free_blocks() - budget.promised_blocks;
                let fit = cache_fit_tokens(&cache, t, spare, &self.pool);
                if fit == 0 {
                    seq.cache = Some(cache);
                    self.finish(seq, FinishReason::Length);
                    continue;
                }
                t = fit;
                need = cache_blocks_needed(&cache, t, &self.pool);
            } else if self.free_blocks() < wanted {
                // Not now: give the cache back and keep the queue's order.
                if own {
                    seq.ensure_hashes(computed / bs, bs, self.limits.identity);
                    self.bank.insert(&mut self.pool, seq.id, cache, &seq.tokens[..computed], &seq.hashes);
                } else {
                    cache.release(&mut self.pool);
                }
                self.waiting.push_front(seq);
                break;
            }
            if seq.cached_tokens.is_none() {
                seq.cached_tokens = Some(computed);
                if computed > 0 {
                    self.bank.counters.hits += 1;
                    self.bank.counters.hit_tokens += computed as u64;
                } else {
                    self.bank.counters.misses += 1;
                }
            }
            let full = computed / bs;
            seq.ensure_hashes(full, bs, self.limits.identity);
            self.bank.register(seq.id, &seq.hashes[..full], 0);
            seq.registered = full;
            seq.origin = origin;
            seq.cache = Some(cache);
            budget.promised_blocks += need;
            budget.tokens -= t;
            self.running.push(seq);
            self.plan.push((self.running.len() - 1, t));
        }
    }

    /// The cache a sequence starts from: its own banked cache (after a preemption), else a
    /// fork of the deepest indexed prefix of its tokens, else an empty one. Returns the cache,
    /// the bank entry it came from, and whether it was the sequence's own.
    fn find_cache(&mut self, seq: &mut Sequence) -> (SequenceCache, Option<u64>, bool) {
        let bs = self.limits.block_size;
        if self.bank.enabled() {
            if let Some(own) = self.bank.take(seq.id) {
                match self.template.resume(&mut self.pool, own) {
                    Ok(cache) => return (cache, None, true),
                    Err(e) => debug_assert!(false, "a sequence's own prefix resumes: {e}"),
                }
            }
            // At least one token is always computed: its logits are needed.
            let blocks = (seq.tokens.len() - 1) / bs;
            seq.ensure_hashes(blocks, bs, self.limits.identity);
            if let Some((holder, n)) = self.bank.lookup(&seq.hashes[..blocks]) {
                let running = self.running.iter().find(|r| r.id == holder.id);
                let fork = match running {
                    Some(r) => r.cache.as_ref().and_then(|c| fork_prefix(c, &mut self.pool, n * bs)),
                    None => self.bank.start_from(&mut self.pool, &self.template, holder.id, n),
                };
                if let Some(c) = fork {
                    let origin = if running.is_none() { Some(holder.id) } else { None };
                    return (c, origin, false);
                }
            }
        }
        let empty = self.template.fork(&mut self.pool).expect("forking an empty sequence takes no block");
        (empty, None, false)
    }

    /// Runs the planned step: one batch, one forward, then sampling and streaming.
    fn execute(&mut self) {
        self.batch.clear();
        self.batch.sliding_window = self.template.attention_window(None);
        self.hidden = self.drafter.as_ref().is_some_and(|d| d.wants_hidden());
        let mut result = Ok(());
        let mut all_argmax = true;
        // The largest top-k + 1 of the step's samplers, while all of them are reducible.
        let mut top_k = Some(0usize);
        for &(i, t) in &self.plan {
            let seq = &mut self.running[i];
            let only_argmax = seq.needs_only_argmax();
            let reduced_k = if only_argmax { Some(1) } else { seq.reduced_top_k(MAX_REDUCED_TOP_K).map(|k| k + 1) };
            let cache = seq.cache.as_mut().expect("running sequences hold a cache");
            let start = cache.offset();
            if let Err(e) = cache.begin_append(&mut self.pool, t) {
                result = Err(e.to_string());
                break;
            }
            let drafted = !seq.draft.is_empty();
            // A drafted sequence reads its rows on the host unless it only needs their argmax.
            let reduced_k = if drafted && !only_argmax { None } else { reduced_k };
            let samples = start + t == seq.tokens.len() + seq.draft.len();
            all_argmax &= !samples || only_argmax;
            if samples {
                top_k = top_k.zip(reduced_k).map(|(a, b)| a.max(b));
            }
            let logits = match (samples, drafted) {
                (false, _) => Logits::None,
                (true, false) => Logits::Last,
                // One row per position: the last token's scores the first draft token, …,
                // the last draft token's gives the token after a fully accepted draft.
                (true, true) => Logits::All,
            };
            self.feed.clear();
            self.feed.extend_from_slice(&seq.tokens[start..]);
            self.feed.extend_from_slice(&seq.draft);
            debug_assert!(!drafted || (samples && start + 1 == seq.tokens.len()), "drafts follow a decode");
            self.batch.push_groups(&self.feed[..t], start + t, cache.pending_slots(), cache.block_tables(), logits);
            if self.hidden && seq.speculative {
                // Every fed position's hidden state: the drafter's cache follows the sequence's.
                self.batch.keep_hidden();
            }
        }
        // A step with no logit row (prefill chunks only) copies nothing either way.
        self.sampling = match top_k {
            _ if !self.limits.reduced_sampling || self.batch.num_logit_rows() == 0 => Sampling::FullRows,
            _ if all_argmax => Sampling::Greedy,
            Some(k) => Sampling::TopK(k),
            None => Sampling::FullRows,
        };
        if result.is_ok() {
            // The grammar masks of the sequences that sample in this step are computed on a
            // worker thread while the forward pass runs (a step without one spawns nothing).
            let mut constraints: Vec<&mut Constraint> = Vec::new();
            for (i, seq) in self.running.iter_mut().enumerate() {
                let planned = self.plan.iter().find(|&&(p, _)| p == i).map(|&(_, t)| t);
                let samples = planned.is_some_and(|t| seq.computed() + t == seq.tokens.len());
                if let (true, Some(c)) = (samples, seq.constraint.as_mut()) {
                    constraints.push(c);
                }
            }
            let (model, batch, pool) = (&mut self.model, &self.batch, &mut self.pool);
            let (greedy_ids, top_values) = (&mut self.greedy_ids, &mut self.top_values);
            let sampling = self.sampling;
            let mut forward = || match sampling {
                Sampling::FullRows => model.forward(batch, pool).map(|_| ()),
                Sampling::Greedy => model.forward_greedy(batch, pool, greedy_ids),
                Sampling::TopK(k) => model.forward_top_k(batch, pool, k, greedy_ids, top_values),
            };
            result = if constraints.is_empty() {
                forward()
            } else {
                std::thread::scope(|s| {
                    let masks = s.spawn(move || constraints.into_iter().for_each(|c| c.compute_mask()));
                    let r = forward();
                    // A panicking mask leaves its constraint without a mask: `apply` recomputes it.
                    let _ = masks.join();
                    r
                })
            }
            .map_err(|e| e.to_string());
        }
        self.counters.steps += 1;
        match result {
            Ok(()) => self.after_forward(),
            Err(msg) => {
                let mut idx: Vec<usize> = self.plan.iter().map(|&(i, _)| i).collect();
                idx.sort_unstable_by(|a, b| b.cmp(a));
                for i in idx {
                    let seq = self.running.remove(i);
                    self.fail(seq, EngineError::Forward(msg.clone()));
                }
            }
        }
    }

    /// Commits the appends, registers newly full blocks, samples where the feed reached the end.
    fn after_forward(&mut self) {
        let bs = self.limits.block_size;
        // The host rows: there for full-row steps, fetched on first need in top-k steps.
        let mut rows = HostRows { fetched: self.sampling == Sampling::FullRows, fetch_error: None };
        debug_assert!(match self.sampling {
            Sampling::FullRows => true,
            Sampling::Greedy => self.greedy_ids.len() == self.batch.num_logit_rows(),
            Sampling::TopK(k) => {
                self.greedy_ids.len() == self.batch.num_logit_rows() * k
                    && self.top_values.len() == self.greedy_ids.len()
            }
        });
        let mut row = 0;
        // The next row of the forward's hidden states (`Forward::last_hidden`).
        let mut hidden_row = 0;
        let mut ended = Ended::default();
        for pi in 0..self.plan.len() {
            let (i, t) = self.plan[pi];
            let seq = &mut self.running[i];
            let cache = seq.cache.as_mut().expect("running sequences hold a cache");
            let start = cache.offset();
            cache.commit_append(&mut self.pool);
            self.counters.computed_tokens += t as u64;
            let hidden = (self.hidden && seq.speculative).then_some(hidden_row);
            hidden_row += if hidden.is_some() { t } else { 0 };
            if !seq.draft.is_empty() {
                let drafted_rows = seq.draft.len() + 1;
                if let Some(reason) = self.verify_draft(i, row, hidden, &mut ended) {
                    ended.done.push((i, reason));
                }
                row += drafted_rows;
                continue;
            }
            let seq = &mut self.running[i];
            if let (Some(d), Some(r)) = (self.drafter.as_mut(), hidden) {
                let h = self.model.config().hidden;
                d.computed(seq.id, &seq.tokens, start, &self.model.last_hidden()[r * h..(r + t) * h]);
            }
            let cache = seq.cache.as_mut().expect("running sequences hold a cache");
            let offset = cache.offset();
            let full = offset / bs;
            if full > seq.registered {
                seq.ensure_hashes(full, bs, self.limits.identity);
                self.bank.register(seq.id, &seq.hashes[..full], seq.registered);
                seq.registered = full;
            }
            if offset == seq.tokens.len() {
                // A request's first continuation forks the others here, once its prompt is
                // computed: all of them sample from this row.
                let siblings = self.fork_siblings(i);
                self.take_token(i, row, &mut rows, &mut ended);
                for c in siblings {
                    self.take_token(c, row, &mut rows, &mut ended);
                }
                row += 1;
            }
        }
        let Ended { done, failed, grammar_failed } = ended;
        let mut ended: Vec<(usize, Option<FinishReason>)> = done.into_iter().map(|(i, r)| (i, Some(r))).collect();
        ended.extend(grammar_failed.iter().map(|&(i, _)| (i, None)));
        ended.sort_unstable_by_key(|d| std::cmp::Reverse(d.0));
        for (i, reason) in ended {
            let seq = self.running.remove(i);
            let Some(reason) = reason else {
                let e = grammar_failed.iter().find(|g| g.0 == i).map(|g| g.1.clone());
                let e = e.unwrap_or_else(|| GrammarError::Decoding("unknown".into()));
                self.fail(seq, EngineError::Grammar(e));
                continue;
            };
            if failed.contains(&i) {
                let msg = rows.fetch_error.clone().unwrap_or_default();
                self.fail(seq, EngineError::Forward(format!("cannot fetch the logits: {msg}")));
            } else {
                self.finish(seq, reason);
            }
        }
    }

    /// Ends a sequence normally: flushes held text, sends `Done`, banks its cache.
    fn finish(&mut self, mut seq: Sequence, reason: FinishReason) {
        // Continuations still waiting for this prompt end with it, without a token.
        for sibling in std::mem::take(&mut seq.siblings) {
            self.finish(sibling, reason);
        }
        let rest = seq.decoder.finish();
        let o = seq.matcher.push(&rest);
        let mut text = o.text;
        if !seq.matcher.stopped() {
            text.push_str(&seq.matcher.flush());
        }
        let finish_reason = if seq.matcher.stopped() { FinishReason::Stop } else { reason };
        let usage = Usage {
            prompt_tokens: seq.prompt_len,
            cached_tokens: seq.cached_tokens.unwrap_or(0),
            completion_tokens: seq.generated,
        };
        let stop_sequence = seq.matcher.matched().map(str::to_string);
        self.counters.finished += 1;
        self.bank_sequence(&mut seq);
        self.finals.push((seq.out, Event::Done { finish_reason, usage, text, stop_sequence }));
    }

    /// Ends a sequence with an error; its blocks are released (their contents may be partial).
    fn fail(&mut self, mut seq: Sequence, err: EngineError) {
        for sibling in std::mem::take(&mut seq.siblings) {
            self.fail(sibling, err.clone());
        }
        self.counters.failed += 1;
        if let Some(d) = self.drafter.as_mut() {
            d.release(seq.id);
        }
        self.bank.forget(seq.id, &seq.hashes[..seq.registered.min(seq.hashes.len())]);
        if let Some(mut cache) = seq.cache.take() {
            cache.cancel_append();
            cache.release(&mut self.pool);
        }
        self.finals.push((seq.out, Event::Error(err)));
    }

    /// Moves a sequence's cache into the bank (or releases it when the bank is off).
    fn bank_sequence(&mut self, seq: &mut Sequence) {
        if let Some(d) = self.drafter.as_mut() {
            d.release(seq.id);
        }
        let Some(cache) = seq.cache.take() else { return };
        let bs = self.limits.block_size;
        let offset = cache.offset();
        seq.ensure_hashes(offset / bs, bs, self.limits.identity);
        self.bank.insert(&mut self.pool, seq.id, cache, &seq.tokens[..offset], &seq.hashes);
        if let Some(origin) = seq.origin.take() {
            if origin != seq.id {
                self.bank.drop_if_prefix_of(&mut self.pool, origin, &seq.tokens[..offset]);
            }
        }
    }

    /// Sends a running sequence back to the front of the queue; its blocks go to the bank.
    fn preempt(&mut self, mut seq: Sequence) {
        seq.draft.clear();
        seq.draft_max = 0;
        self.bank_sequence(&mut seq);
        self.counters.preemptions += 1;
        self.waiting.push_front(seq);
    }

    /// Drops the sequences whose clients went away.
    fn reap_cancelled(&mut self) {
        let mut i = 0;
        while i < self.running.len() {
            if self.running[i].is_cancelled() {
                let mut seq = self.running.remove(i);
                self.bank_sequence(&mut seq);
                self.counters.cancelled += requests_in([&seq]) as u64;
            } else {
                i += 1;
            }
        }
        let before = requests_in(&self.waiting);
        self.waiting.retain(|s| !s.is_cancelled());
        self.counters.cancelled += (before - requests_in(&self.waiting)) as u64;
    }

    /// Fails every request in flight (shutdown).
    fn fail_all(&mut self, err: EngineError) {
        while let Some(seq) = self.running.pop() {
            self.fail(seq, err.clone());
        }
        while let Some(seq) = self.waiting.pop_front() {
            self.fail(seq, err.clone());
        }
    }

    /// Pool and bank bookkeeping agree (debug builds, after every step).
    #[cfg(debug_assertions)]
    fn check_invariants(&self) {
        self.pool.blocks().check_invariants();
        let running = &self.running;
        self.bank.check_index(|id| running.iter().find(|s| s.id == id).map(|s| s.computed() / self.limits.block_size));
        for s in &self.running {
            let c = s.cache.as_ref().expect("running sequences hold a cache");
            assert!(c.offset() < s.tokens.len(), "sequence {} has nothing to compute", s.id);
            for table in c.block_tables() {
                assert_eq!(table.len(), c.offset().div_ceil(self.limits.block_size), "blocks beyond need");
            }
            if let Some(d) = self.drafter.as_ref() {
                d.check_sequence(s.id, c.offset()).unwrap_or_else(|e| panic!("drafter out of step: {e}"));
            }
        }
    }
}

/// New blocks `seq` needs to feed `t` more tokens over every layer group (copies of shared
/// blocks included).
fn blocks_needed<S: PageStore>(seq: &Sequence, t: usize, pool: &KvPool<S>) -> usize {
    cache_blocks_needed(seq.cache.as_ref().expect("running sequences hold a cache"), t, pool)
}

/// Tokens `seq` can feed with `spare` more blocks.
fn fit_tokens<S: PageStore>(seq: &Sequence, spare: usize, pool: &KvPool<S>) -> usize {
    let cache = seq.cache.as_ref().expect("running sequences hold a cache");
    cache_fit_tokens(cache, seq.pending(), spare, pool)
}

/// Appends the chosen `token` (with its logprobs, when asked for), streams it, and says whether
/// the sequence is done. The same path whether the token was sampled from a full row or is the
/// backend's greedy choice.
fn accept_token(
    seq: &mut Sequence,
    token: u32,
    lp: Option<TokenLogprobs>,
    tokenizer: &Tokenizer,
    context_window: usize,
) -> Option<FinishReason> {
    seq.tokens.push(token);
    seq.generated += 1;
    if seq.stop.stop_tokens.contains(&token) {
        return Some(FinishReason::Stop);
    }
    // A token the tokenizer does not know (a padded vocabulary) prints nothing.
    let piece = seq.decoder.push(tokenizer, token).unwrap_or_default();
    let o = seq.matcher.push(&piece);
    seq.out.send(Event::Token { id: token, text: o.text, logprobs: lp });
    if o.finish.is_some() {
        return Some(FinishReason::Stop);
    }
    if seq.generated >= seq.stop.max_tokens || seq.tokens.len() > context_window {
        return Some(FinishReason::Length);
    }
    None
}
