//! Multi-token decoding in the scheduler: how many tokens each running sequence may draft this
//! step ([`Scheduler::allow_draft`]), the drafter's proposals ([`Scheduler::draft`]), and the
//! verification of a drafted sequence's rows after the forward pass
//! ([`Scheduler::verify_draft`]), which trims the rejected positions from its cache. A sequence
//! with a grammar drafts too: its draft is cut to what the grammar accepts before it is fed, and
//! each row is verified against the grammar's mask at that position (the state after the
//! tokens kept before it), so the kept tokens are exactly what plain constrained decoding draws.

use pagekv_model::Forward;

use super::sample::Ended;
use super::{accept_token, blocks_needed, Budget, Sampling, Scheduler};
use crate::constraint::Constraint;
use crate::sampling::logprobs;
use crate::speculative::DraftRequest;
use crate::stop::FinishReason;

impl<M: Forward> Scheduler<M> {
    /// Sets how many tokens running sequence `i`, planned to decode one token, may draft this
    /// step: its adaptive length, within its `max_tokens`, the context window, the step's token
    /// budget and the free blocks (drafts never evict nor preempt). Takes that from `budget`.
    pub(super) fn allow_draft(&mut self, i: usize, budget: &mut Budget) {
        let seq = &mut self.running[i];
        seq.draft.clear();
        seq.draft_max = 0;
        if self.drafter.is_none() || !seq.speculative || !seq.decoding() {
            return;
        }
        let spec = &self.limits.speculative;
        let mut k = seq.draft_length.next(spec.draft_tokens, spec.token_cost);
        // A step emits at most k + 1 tokens; positions up to tokens.len() + k are written.
        k = k
            .min(seq.stop.max_tokens.saturating_sub(seq.generated + 1))
            .min(self.limits.context_window.saturating_sub(seq.tokens.len()))
            .min(budget.tokens);
        let base = blocks_needed(seq, 1, &self.pool);
        let spare = self.pool.blocks().num_free().saturating_sub(budget.promised_blocks);
        while k > 0 && blocks_needed(seq, 1 + k, &self.pool) - base > spare {
            k -= 1;
        }
        budget.tokens -= k;
        budget.promised_blocks += blocks_needed(seq, 1 + k, &self.pool) - base;
        seq.draft_max = k;
    }

    /// Asks the drafter for every sequence allowed a draft this step, and widens their planned
    /// feeds by what it proposed (tokens it did not use stay unspent this step).
    pub(super) fn draft(&mut self) {
        let Some(drafter) = self.drafter.as_mut() else { return };
        let mut requests: Vec<DraftRequest<'_>> = self
            .running
            .iter_mut()
            .filter(|s| s.draft_max > 0)
            .map(|s| DraftRequest { id: s.id, tokens: &s.tokens, max: s.draft_max, draft: &mut s.draft })
            .collect();
        if requests.is_empty() {
            return;
        }
        drafter.propose(&mut requests);
        drop(requests);
        let vocab = self.limits.vocab_size;
        for (i, t) in self.plan.iter_mut() {
            let seq = &mut self.running[*i];
            // A draft model's vocabulary may be padded past the model's: such ids end a draft.
            let valid = seq.draft.iter().position(|&d| d as usize >= vocab).unwrap_or(seq.draft.len());
            seq.draft.truncate(seq.draft_max.min(valid));
            if let Some(c) = seq.constraint.as_mut() {
                // Only what the grammar accepts, and no stop token (the grammar never takes one).
                let stop = seq.draft.iter().position(|d| seq.stop.stop_tokens.contains(d)).unwrap_or(seq.draft.len());
                seq.draft.truncate(stop);
                let ok = c.valid_prefix(&seq.draft);
                seq.draft.truncate(ok);
            }
            *t += seq.draft.len();
        }
    }

    /// Accepts the longest prefix of running sequence `i`'s draft that its sampler keeps
    /// (`Sampler::verify`, row by row from logit row `row`: the row of its last token scores the
    /// first draft token), then the model's own token after it; trims the rejected positions
    /// from the cache and registers the blocks that are now full. Returns why the sequence
    /// ended, if it did (a stop token or string, `max_tokens`, the context window), which may be
    /// in the middle of its draft. Drafted sequences sample from full rows unless they need only
    /// the argmax (`execute`); one with a grammar masks each row and advances its grammar by
    /// each token taken (a grammar that cannot continue goes to `ended`). With `hidden` (the
    /// first of its rows of the forward's hidden states), the drafter gets the kept positions'.
    pub(super) fn verify_draft(
        &mut self,
        i: usize,
        row: usize,
        hidden: Option<usize>,
        ended: &mut Ended,
    ) -> Option<FinishReason> {
        let v = self.limits.vocab_size;
        let seq = &mut self.running[i];
        // The position of the fed last token: the first of the step's.
        let start = seq.tokens.len() - 1;
        let draft = std::mem::take(&mut seq.draft);
        let mut accepted = 0;
        let mut reason = None;
        for (j, &proposed) in draft.iter().chain(std::iter::once(&u32::MAX)).enumerate() {
            let r = row + j;
            let last = j == draft.len();
            let (token, lp) = match self.sampling {
                Sampling::Greedy => {
                    self.counters.sampled_greedy_rows += 1;
                    (self.greedy_ids[r], None)
                }
                Sampling::TopK(k) => {
                    // Only argmax samplers draft in top-k steps: the first entry is the argmax.
                    self.counters.sampled_top_k_rows += 1;
                    (if self.top_values[r * k].is_nan() { 0 } else { self.greedy_ids[r * k] }, None)
                }
                Sampling::FullRows => {
                    self.counters.sampled_full_rows += 1;
                    let l = &self.model.last_logits()[r * v..(r + 1) * v];
                    // The grammar's mask at this position (computed beside the forward pass for
                    // the first row, here for the others).
                    let masked: &[f32] = match seq.constraint.as_mut() {
                        None => l,
                        Some(c) => match c.apply(l, &mut self.masked_row) {
                            Ok(()) => &self.masked_row,
                            Err(e) => {
                                ended.grammar_failed.push((i, e));
                                break;
                            }
                        },
                    };
                    let token = match last {
                        true => seq.sampler.sample(masked, &seq.tokens),
                        false => seq.sampler.verify(masked, &seq.tokens, proposed).0,
                    };
                    // Log-probabilities are of the model's own distribution (the raw row).
                    (token, seq.logprobs.map(|n| logprobs(l, token, n)))
                }
            };
            if let Some(c) = seq.constraint.as_mut() {
                let (time, masks) = c.take_mask_stats();
                self.counters.mask_nanos += time.as_nanos() as u64;
                self.counters.masks += masks;
                // The grammar takes every token but the ones that end the sequence.
                if !seq.stop.stop_tokens.contains(&token) {
                    if let Err(e) = c.commit(token) {
                        ended.grammar_failed.push((i, e));
                        break;
                    }
                }
            }
            let kept = !last && token == proposed;
            accepted += kept as usize;
            self.counters.generated_tokens += 1;
            reason = accept_token(seq, token, lp, &self.tokenizer, self.limits.context_window);
            // A complete grammar allows nothing more: the output ends here.
            let complete = seq.constraint.as_ref().is_some_and(Constraint::is_finished);
            reason = reason.or(complete.then_some(FinishReason::Stop));
            if reason.is_some() || !kept {
                break;
            }
        }
        self.counters.sampling_steps += 1;
        self.counters.draft_steps += 1;
        self.counters.draft_tokens += draft.len() as u64;
        self.counters.draft_accepted += accepted as u64;
        seq.draft_length.record(draft.len(), accepted);
        // The cache holds the fed last token and every draft token; the rejected ones go (their
        // emptied blocks back to the pool) before any block of theirs is registered.
        let cache = seq.cache.as_mut().expect("running sequences hold a cache");
        if accepted < draft.len() {
            cache.trim(&mut self.pool, draft.len() - accepted).expect("an idle cache trims back what it just wrote");
        }
        let full = cache.offset() / self.limits.block_size;
        debug_assert!(cache.offset() <= seq.tokens.len());
        if full > seq.registered {
            seq.ensure_hashes(full, self.limits.block_size, self.limits.identity);
            self.bank.register(seq.id, &seq.hashes[..full], seq.registered);
            seq.registered = full;
        }
        if let Some(d) = self.drafter.as_mut() {
            if let Some(r) = hidden {
                // The last token and the kept draft tokens: the positions the cache keeps.
                let h = self.model.config().hidden;
                d.computed(seq.id, &seq.tokens, start, &self.model.last_hidden()[r * h..(r + accepted + 1) * h]);
            }
            d.accepted(seq.id, &seq.tokens);
        }
        seq.draft = draft;
        seq.draft.clear();
        reason
    }
}
