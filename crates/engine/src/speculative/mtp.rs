//! The next-token-prediction drafter (`mtp`): the target model's own MTP layer
//! (`pagekv_model::Model::forward_mtp`, DeepSeek-V3 / GLM-4.5 / Qwen3-Next `nextn` tensors)
//! drafts from the target's last hidden states, over its own paged cache.
//!
//! Entry `e` of a sequence's MTP cache holds the K/V of the MTP layer at target position
//! `base + e`, built from the target's hidden state there and the token after it (`base` is the
//! first position the target computed for this drafter: 0 for a fresh prompt, the hit point of a
//! prompt that started from the session bank or a resumed preemption; positions before it stay
//! out of the MTP cache, which drafts less well but never changes the output). The hidden states
//! arrive through [`Drafter::computed`] after every step that fed the sequence — each prompt
//! chunk, each decode step, and after a verification only the kept positions — and wait as
//! `pending` rows until the next proposal, which feeds them (in chunks, batched over the
//! sequences) and gets the first draft token from the last one; a long prompt's are fed as soon
//! as [`CATCH_UP_TOKENS`] wait (all but the last, whose next token is not sampled yet), so they do
//! not pile up (`[prompt, hidden]` f32) until the first proposal. Each
//! further draft token chains: the MTP layer's own output plays the hidden state for the entry
//! of the token just drafted. Those chained entries are speculative: they are trimmed before any
//! new hidden state is fed, so after every step the cache holds exactly the entries built from
//! the target's kept hidden states (its offset plus the pending rows is the target's).
//!
//! Drafting is greedy (a one-hot `q`), so verification is exact as for every drafter. The pool
//! has one layer ([`MTP_POOL_LAYERS`]) of the target's KV geometry; a sequence it cannot hold is
//! not drafted for that step.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use kvcache::{CacheConfig, KvPool, SequenceCache, SequencePolicy};
use pagekv_model::backend::argmax;
use pagekv_model::llama::MTP_POOL_LAYERS;
use pagekv_model::{Batch, Forward, Logits, Model, ModelError};

use super::{BuildDrafter, DraftPool, DraftRequest, Drafter};

/// Most MTP entries one catch-up forward feeds.
const CATCH_UP_TOKENS: usize = 512;

/// A model's MTP layer, built on the scheduler thread when the engine starts. Compared and
/// printed by the model's name.
#[derive(Clone)]
pub struct MtpModel {
    pub name: String,
    pub(super) build: Arc<BuildDrafter>,
}

impl MtpModel {
    /// The MTP layer of the model `make` loads (once: an engine started a second time from the
    /// same configuration gets an error). A model without next-token-prediction layers is
    /// refused when the engine starts.
    pub fn new<F>(name: &str, make: F) -> MtpModel
    where
        F: FnOnce() -> Result<Model, ModelError> + Send + 'static,
    {
        let make = Mutex::new(Some(make));
        let label = name.to_string();
        let build = move |p: DraftPool| -> Result<Box<dyn Drafter>, ModelError> {
            let make = make.lock().unwrap_or_else(|e| e.into_inner()).take();
            let make = make.ok_or_else(|| ModelError::Invalid(format!("MTP model {label} was already used")))?;
            Ok(Box::new(MtpDrafter::new(make()?, p.num_blocks, p.block_size, p.context_window)?))
        };
        MtpModel { name: name.to_string(), build: Arc::new(build) }
    }
}

impl std::fmt::Debug for MtpModel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "MtpModel({})", self.name)
    }
}

impl PartialEq for MtpModel {
    fn eq(&self, other: &Self) -> bool {
        self.name == other.name
    }
}

/// The drafter over a model's first MTP layer.
pub struct MtpDrafter {
    model: Model,
    pool: KvPool,
    policy: SequencePolicy,
    seqs: HashMap<u64, MtpSeq>,
    batch: Batch,
    /// `[batch tokens, hidden]` the hidden state each token of the batch is combined with.
    hidden_in: Vec<f32>,
}

/// One sequence's MTP state.
struct MtpSeq {
    cache: SequenceCache,
    /// The target position of the cache's entry 0.
    base: usize,
    /// Entries at the end of the cache built from drafted tokens (trimmed before anything new).
    spec: usize,
    /// `[pending rows, hidden]` the target's hidden states of the positions after the cache's
    /// target-built entries, not fed yet.
    pending: Vec<f32>,
}

impl MtpSeq {
    /// Entries built from the target's hidden states.
    fn fed(&self) -> usize {
        self.cache.offset() - self.spec
    }
}

impl MtpDrafter {
    /// A drafter running `model`'s first MTP layer over a pool of `num_blocks` blocks of
    /// `block_size` tokens, sequences up to `context_window` entries.
    pub fn new(
        mut model: Model,
        num_blocks: usize,
        block_size: usize,
        context_window: usize,
    ) -> Result<MtpDrafter, ModelError> {
        let c = &model.config;
        if !model.has_mtp() {
            return Err(ModelError::Invalid(format!(
                "{} has no next-token-prediction layers ({}.nextn_predict_layers is 0 or absent)",
                c.name, c.arch_name
            )));
        }
        let mut cache = CacheConfig::new(MTP_POOL_LAYERS, c.num_kv_heads, c.head_dim);
        cache.num_blocks = num_blocks;
        cache.block_size = block_size;
        cache.context_window = Some(context_window);
        let policy = SequencePolicy {
            dynamic_growth: true,
            context_window: Some(context_window),
            sliding_window: None,
            debug_blocks: false,
            trim_margin: 0,
        };
        // A sequence's drafts must not depend on what else is drafted in the step.
        model.ensure_path_invariance();
        let pool = KvPool::new(cache)?;
        Ok(MtpDrafter { model, pool, policy, seqs: HashMap::new(), batch: Batch::default(), hidden_in: Vec::new() })
    }

    /// The blocks of the MTP pool in use (tests: every one comes back on release).
    pub fn blocks_used(&self) -> usize {
        let b = self.pool.blocks();
        b.num_blocks() - b.num_free()
    }

    /// `(cache offset, pending rows, base)` of sequence `id`'s MTP state, if it has one.
    pub fn state(&self, id: u64) -> Option<(usize, usize, usize)> {
        let h = self.model.config.hidden;
        self.seqs.get(&id).map(|s| (s.cache.offset(), s.pending.len() / h, s.base))
    }

    /// Drops the speculative entries of `id`'s cache; on a failed trim the state goes.
    fn settle(&mut self, id: u64) {
        let Some(s) = self.seqs.get_mut(&id) else { return };
        if s.spec == 0 {
            return;
        }
        if s.cache.trim(&mut self.pool, s.spec).is_ok() {
            s.spec = 0;
        } else if let Some(s) = self.seqs.remove(&id) {
            // Cannot happen for an idle cache trimming what it holds; start over if it does.
            s.cache.release(&mut self.pool);
        }
    }

    /// Runs the batch; on an error every member's state is dropped (rebuilt from the next
    /// hidden states) and no proposal is made for them.
    fn run(&mut self, members: &[(usize, u64)]) -> bool {
        match self.model.forward_mtp(&self.batch, &mut self.pool, &self.hidden_in) {
            Ok(_) => {
                for &(_, id) in members {
                    let s = self.seqs.get_mut(&id).expect("a member has state");
                    s.cache.commit_append(&mut self.pool);
                }
                true
            }
            Err(e) => {
                tracing::warn!("MTP drafter: forward failed, not drafting this step: {e}");
                for &(_, id) in members {
                    if let Some(mut s) = self.seqs.remove(&id) {
                        s.cache.cancel_append();
                        s.cache.release(&mut self.pool);
                    }
                }
                false
            }
        }
    }

    /// Once [`CATCH_UP_TOKENS`] hidden states wait (a long prompt's), feeds those whose next
    /// token is known, all but the last, in forwards of at most that many entries: a prompt's
    /// hidden states do not pile up until its first proposal. (Shorter waits are fed by the
    /// proposal, batched over the sequences.) A full pool leaves them waiting.
    fn feed_long_pending(&mut self, id: u64, tokens: &[u32]) {
        let h = self.model.config.hidden;
        loop {
            let Some(s) = self.seqs.get_mut(&id) else { return };
            let pending = s.pending.len() / h;
            // Entry `fed` pairs the hidden state at `base + fed` with the token after it.
            let first = s.base + s.fed() + 1;
            if pending < CATCH_UP_TOKENS {
                return;
            }
            let known = tokens.len().saturating_sub(first).min(pending - 1);
            if known == 0 {
                return;
            }
            let t = known.min(CATCH_UP_TOKENS);
            if s.cache.begin_append(&mut self.pool, t).is_err() {
                return;
            }
            self.batch.clear();
            self.hidden_in.clear();
            let len = s.cache.offset() + t;
            self.batch.push(
                &tokens[first..first + t],
                len,
                s.cache.pending_slots(),
                s.cache.block_table(),
                Logits::None,
            );
            self.hidden_in.extend(s.pending.drain(..t * h));
            if !self.run(&[(0, id)]) {
                return;
            }
        }
    }

    /// The greedy token and the MTP output of logit row `row` of the last forward.
    fn row(&self, row: usize, out: &mut [f32]) -> u32 {
        let (h, v) = (self.model.config.hidden, self.model.config.vocab_size);
        out.copy_from_slice(&self.model.last_hidden()[row * h..(row + 1) * h]);
        argmax(&self.model.last_logits()[row * v..(row + 1) * v])
    }
}

impl Drafter for MtpDrafter {
    fn name(&self) -> String {
        "mtp".into()
    }

    fn wants_hidden(&self) -> bool {
        true
    }

    fn propose(&mut self, requests: &mut [DraftRequest<'_>]) {
        let h = self.model.config.hidden;
        // `[requests, hidden]` each drafting request's last MTP output: the next chained `h`.
        let mut chain = vec![0.0f32; requests.len() * h];
        // The requests whose MTP state is in step with the target: every position but the last
        // token's computed, at least one hidden state not fed yet.
        let mut live: Vec<usize> = Vec::new();
        for (ri, r) in requests.iter().enumerate() {
            self.settle(r.id);
            let Some(s) = self.seqs.get(&r.id) else { continue };
            let pending = s.pending.len() / h;
            if pending > 0 && s.base + s.fed() + pending + 1 == r.tokens.len() {
                live.push(ri);
            }
        }
        // Feed the pending hidden states; the last chunk of each gives its first draft token.
        let mut pending: Vec<usize> = live.clone();
        while !pending.is_empty() {
            self.batch.clear();
            self.hidden_in.clear();
            let mut members: Vec<(usize, u64)> = Vec::new();
            let mut budget = CATCH_UP_TOKENS;
            let mut next = Vec::new();
            for &ri in &pending {
                let r = &requests[ri];
                let s = self.seqs.get_mut(&r.id).expect("live requests have state");
                let rest = s.pending.len() / h;
                if budget == 0 {
                    next.push(ri);
                    continue;
                }
                let t = rest.min(budget);
                if s.cache.begin_append(&mut self.pool, t).is_err() {
                    // The MTP pool is full: no draft for this sequence this step.
                    live.retain(|&x| x != ri);
                    continue;
                }
                budget -= t;
                let last = t == rest;
                // Entry e pairs the hidden state at base + e with the token after it.
                let first = s.base + s.fed() + 1;
                let logits = if last { Logits::Last } else { Logits::None };
                let len = s.cache.offset() + t;
                self.batch.push(
                    &r.tokens[first..first + t],
                    len,
                    s.cache.pending_slots(),
                    s.cache.block_table(),
                    logits,
                );
                self.hidden_in.extend(s.pending.drain(..t * h));
                members.push((ri, r.id));
                if !last {
                    next.push(ri);
                }
            }
            if members.is_empty() {
                break;
            }
            if self.run(&members) {
                let mut row = 0;
                for &(ri, id) in &members {
                    if self.seqs[&id].pending.is_empty() {
                        let token = self.row(row, &mut chain[ri * h..(ri + 1) * h]);
                        requests[ri].draft.push(token);
                        row += 1;
                    }
                }
            } else {
                live.retain(|ri| !members.iter().any(|m| m.0 == *ri));
                next.retain(|ri| !members.iter().any(|m| m.0 == *ri));
            }
            pending = next;
        }
        // Chain: each drafted token with the MTP output before it, one batched step per token.
        loop {
            self.batch.clear();
            self.hidden_in.clear();
            let mut members: Vec<(usize, u64)> = Vec::new();
            for &ri in &live {
                let r = &requests[ri];
                if r.draft.is_empty() || r.draft.len() >= r.max {
                    continue;
                }
                let s = self.seqs.get_mut(&r.id).expect("live requests have state");
                if s.cache.begin_append(&mut self.pool, 1).is_err() {
                    continue;
                }
                let token = *r.draft.last().expect("non-empty");
                let len = s.cache.offset() + 1;
                self.batch.push(&[token], len, s.cache.pending_slots(), s.cache.block_table(), Logits::Last);
                self.hidden_in.extend_from_slice(&chain[ri * h..(ri + 1) * h]);
                s.spec += 1;
                members.push((ri, r.id));
            }
            if members.is_empty() || !self.run(&members) {
                break;
            }
            for (row, &(ri, _)) in members.iter().enumerate() {
                let token = self.row(row, &mut chain[ri * h..(ri + 1) * h]);
                requests[ri].draft.push(token);
            }
        }
    }

    fn computed(&mut self, id: u64, tokens: &[u32], start: usize, hidden: &[f32]) {
        let h = self.model.config.hidden;
        debug_assert_eq!(hidden.len() % h, 0);
        self.settle(id);
        let in_step = self.seqs.get(&id).is_some_and(|s| s.base + s.fed() + s.pending.len() / h == start);
        if !in_step {
            // A new sequence, or one whose positions moved under the drafter (a resumed or
            // forked cache): its MTP cache starts over at `start`.
            if let Some(s) = self.seqs.remove(&id) {
                s.cache.release(&mut self.pool);
            }
            let Ok(cache) = SequenceCache::new(&mut self.pool, self.policy, 0) else { return };
            self.seqs.insert(id, MtpSeq { cache, base: start, spec: 0, pending: Vec::new() });
        }
        let s = self.seqs.get_mut(&id).expect("made above");
        s.pending.extend_from_slice(hidden);
        self.feed_long_pending(id, tokens);
    }

    fn accepted(&mut self, id: u64, _tokens: &[u32]) {
        self.settle(id);
    }

    fn release(&mut self, id: u64) {
        if let Some(s) = self.seqs.remove(&id) {
            s.cache.release(&mut self.pool);
        }
    }

    fn blocks_in_use(&self) -> usize {
        self.blocks_used()
    }

    /// Between steps a sequence's MTP cache holds only entries built from the target's kept
    /// hidden states, and with the pending rows it reaches the target's offset.
    fn check_sequence(&self, id: u64, offset: usize) -> Result<(), String> {
        let Some(s) = self.seqs.get(&id) else { return Ok(()) };
        let pending = s.pending.len() / self.model.config.hidden;
        if s.spec != 0 || s.base + s.cache.offset() + pending != offset {
            return Err(format!(
                "sequence {id}: MTP cache of {} entries ({} drafted) from position {} with {pending} pending, target at {offset}",
                s.cache.offset(),
                s.spec,
                s.base
            ));
        }
        Ok(())
    }
}
