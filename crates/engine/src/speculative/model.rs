//! The draft-model drafter: a smaller model with the target's vocabulary runs greedily a few
//! tokens ahead of every decoding sequence, over its own paged cache.
//!
//! Each sequence has a draft cache holding the K/V of the tokens the draft model has seen.
//! A step's proposal first catches the draft cache up with the sequence (after a verification
//! that is the kept draft tokens and the target's own token; at admission the whole prompt, in
//! chunks), which yields the first draft token, then feeds each new draft token back, one
//! batched forward per token for all sequences at once. Drafting is greedy, so the proposal
//! distribution `q` is one-hot and the target's acceptance rule is exact as for the n-gram
//! drafter. After verification the draft cache is trimmed back to the common prefix with what
//! the target kept; a sequence that leaves the running set frees its draft cache.
//!
//! The draft cache lives in a pool of the draft model's own geometry (a block of a smaller model
//! holds fewer bytes than the target's), sized by the caller; when it runs out, the sequences it
//! cannot hold are not drafted for that step.

use std::collections::HashMap;

use kvcache::{CacheConfig, KvPool, SequenceCache, SequencePolicy};
use pagekv_model::{Batch, Forward, Logits, ModelError};

use super::{DraftRequest, Drafter};

/// Most tokens of catch-up in one draft forward.
const CATCH_UP_TOKENS: usize = 512;

/// A drafter over model `D`.
pub struct ModelDrafter<D: Forward> {
    name: String,
    model: D,
    pool: KvPool<D::Pages>,
    policy: SequencePolicy,
    seqs: HashMap<u64, DraftSeq>,
    batch: Batch,
    /// `[logit rows]` the greedy ids of the last forward.
    ids: Vec<u32>,
}

/// One sequence's draft state.
struct DraftSeq {
    cache: SequenceCache,
    /// `[cache offset]` the tokens whose K/V the draft cache holds.
    tokens: Vec<u32>,
}

impl<D: Forward> ModelDrafter<D> {
    /// A drafter running `model` over a pool of `num_blocks` blocks of `block_size` tokens
    /// (geometry from the model), sequences up to `context_window` tokens.
    pub fn new(
        name: String,
        mut model: D,
        num_blocks: usize,
        block_size: usize,
        context_window: usize,
    ) -> Result<ModelDrafter<D>, ModelError> {
        let c = model.config();
        let mut cache = CacheConfig::new(c.num_layers, c.num_kv_heads, c.head_dim);
        cache.num_blocks = num_blocks;
        cache.block_size = block_size;
        cache.context_window = Some(context_window);
        // Draft caches grow block by block as their sequences do, up to the window.
        let policy = SequencePolicy {
            dynamic_growth: true,
            context_window: Some(context_window),
            sliding_window: None,
            debug_blocks: false,
            trim_margin: 0,
        };
        // A sequence's drafts must not depend on what else is drafted in the step.
        model.ensure_path_invariance();
        let pool = model.new_pool(cache)?;
        Ok(ModelDrafter { name, model, pool, policy, seqs: HashMap::new(), batch: Batch::default(), ids: Vec::new() })
    }

    /// Trims `id`'s draft cache back to its common prefix with `tokens`.
    fn rewind(&mut self, id: u64, tokens: &[u32]) {
        let Some(s) = self.seqs.get_mut(&id) else { return };
        // The sequence's last token always stays out: feeding it gives the first draft token.
        let common =
            s.tokens.iter().zip(tokens).take_while(|(a, b)| a == b).count().min(tokens.len().saturating_sub(1));
        if common < s.tokens.len() {
            let n = s.tokens.len() - common;
            if s.cache.trim(&mut self.pool, n).is_err() {
                // Cannot happen for an idle cache trimming what it holds; start over if it does.
                if let Some(s) = self.seqs.remove(&id) {
                    s.cache.release(&mut self.pool);
                }
                return;
            }
            s.tokens.truncate(common);
        }
    }

    /// Runs the batch with one greedy id per logit row; on an error every sequence in it is
    /// dropped (its draft cache rebuilt later) and no proposal is made for them.
    fn run(&mut self, members: &[(usize, u64)]) -> bool {
        match self.model.forward_greedy(&self.batch, &mut self.pool, &mut self.ids) {
            Ok(()) => {
                for &(_, id) in members {
                    let s = self.seqs.get_mut(&id).expect("a member has state");
                    s.cache.commit_append(&mut self.pool);
                }
                true
            }
            Err(e) => {
                tracing::warn!("draft model {}: forward failed, not drafting this step: {e}", self.name);
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
}

impl<D: Forward> Drafter for ModelDrafter<D> {
    fn name(&self) -> String {
        format!("draft:{}", self.name)
    }

    fn propose(&mut self, requests: &mut [DraftRequest<'_>]) {
        // Catch every draft cache up with its sequence; the last chunk of each gives its first
        // draft token. `live`: indices of the requests still drafting.
        let mut live: Vec<usize> = Vec::new();
        for (ri, r) in requests.iter().enumerate() {
            if !self.seqs.contains_key(&r.id) {
                match SequenceCache::new(&mut self.pool, self.policy, 0) {
                    Ok(cache) => {
                        self.seqs.insert(r.id, DraftSeq { cache, tokens: Vec::new() });
                    }
                    Err(_) => continue,
                }
            }
            self.rewind(r.id, r.tokens);
            live.push(ri);
        }
        let mut pending: Vec<usize> = live.clone();
        while !pending.is_empty() {
            self.batch.clear();
            let mut members: Vec<(usize, u64)> = Vec::new();
            let mut budget = CATCH_UP_TOKENS;
            let mut next = Vec::new();
            for &ri in &pending {
                let r = &requests[ri];
                let s = self.seqs.get_mut(&r.id).expect("state was made above");
                let start = s.tokens.len();
                // At least the sequence's last token is new (`rewind` keeps it out).
                let rest = r.tokens.len() - start;
                if budget == 0 {
                    next.push(ri);
                    continue;
                }
                let t = rest.min(budget);
                if s.cache.begin_append(&mut self.pool, t).is_err() {
                    // The draft pool is full: no draft for this sequence this step.
                    live.retain(|&x| x != ri);
                    continue;
                }
                budget -= t;
                let last = t == rest;
                let logits = if last { Logits::Last } else { Logits::None };
                self.batch.push(
                    &r.tokens[start..start + t],
                    start + t,
                    s.cache.pending_slots(),
                    s.cache.block_table(),
                    logits,
                );
                s.tokens.extend_from_slice(&r.tokens[start..start + t]);
                members.push((ri, r.id));
                if !last {
                    next.push(ri);
                }
            }
            if members.is_empty() {
                break;
            }
            if self.run(&members) {
                // The members whose catch-up ended have a logit row each, in batch order.
                let mut row = 0;
                for &(ri, id) in &members {
                    let r = &mut requests[ri];
                    if self.seqs[&id].tokens.len() == r.tokens.len() {
                        r.draft.push(self.ids[row]);
                        row += 1;
                    }
                }
            } else {
                live.retain(|ri| !members.iter().any(|m| m.0 == *ri));
                next.retain(|ri| !members.iter().any(|m| m.0 == *ri));
            }
            pending = next;
        }
        // Feed each new draft token back until every request has its draft.
        loop {
            self.batch.clear();
            let mut members: Vec<(usize, u64)> = Vec::new();
            for &ri in &live {
                let r = &requests[ri];
                if r.draft.is_empty() || r.draft.len() >= r.max {
                    continue;
                }
                let s = self.seqs.get_mut(&r.id).expect("live sequences have state");
                if s.cache.begin_append(&mut self.pool, 1).is_err() {
                    continue;
                }
                let token = *r.draft.last().expect("non-empty");
                let pos = s.tokens.len();
                self.batch.push(&[token], pos + 1, s.cache.pending_slots(), s.cache.block_table(), Logits::Last);
                s.tokens.push(token);
                members.push((ri, r.id));
            }
            if members.is_empty() || !self.run(&members) {
                break;
            }
            for (row, &(ri, _)) in members.iter().enumerate() {
                requests[ri].draft.push(self.ids[row]);
            }
        }
    }

    fn accepted(&mut self, id: u64, tokens: &[u32]) {
        self.rewind(id, tokens);
    }

    fn release(&mut self, id: u64) {
        if let Some(s) = self.seqs.remove(&id) {
            s.cache.release(&mut self.pool);
        }
    }

    fn blocks_in_use(&self) -> usize {
        let b = self.pool.blocks();
        b.num_blocks() - b.num_free()
    }
}
