//! Choosing one sequence's next token from its logit row after a forward pass, by the step's
//! [`Sampling`] mode (the full host row, the backend's greedy id, or its best top-k entries
//! with the full row fetched on first need), then the grammar, streaming and stop checks.
//! The continuations of an `n > 1` request call it once each on the same row.

use pagekv_model::Forward;

use super::{accept_token, Sampling, Scheduler, MAX_REDUCED_TOP_K};
use crate::constraint::{Constraint, GrammarError};
use crate::sampling::logprobs;
use crate::stop::FinishReason;

/// The step's host logit rows: there for full-row steps, fetched on first need in top-k steps.
pub(super) struct HostRows {
    pub fetched: bool,
    /// Why fetching them failed (every sequence that needed them then fails).
    pub fetch_error: Option<String>,
}

/// Running sequences (by index) the step ended, applied once every row is read.
#[derive(Default)]
pub(super) struct Ended {
    pub done: Vec<(usize, FinishReason)>,
    /// Sequences whose full row could not be fetched (a device error); also in `done`.
    pub failed: Vec<usize>,
    /// Sequences whose grammar could not continue.
    pub grammar_failed: Vec<(usize, GrammarError)>,
}

impl<M: Forward> Scheduler<M> {
    /// Samples running sequence `i`'s next token from logit row `row`, streams it, and records
    /// in `ended` whether that ended the sequence.
    pub(super) fn take_token(&mut self, i: usize, row: usize, rows: &mut HostRows, ended: &mut Ended) {
        let v = self.limits.vocab_size;
        let seq = &mut self.running[i];
        self.counters.sampling_steps += 1;
        let (token, lp) = match self.sampling {
            Sampling::FullRows => {
                let row_logits = &self.model.last_logits()[row * v..(row + 1) * v];
                self.counters.sampled_full_rows += 1;
                let token = match seq.constraint.as_mut() {
                    None => seq.sampler.sample(row_logits, &seq.tokens),
                    Some(c) => match c.apply(row_logits, &mut self.masked_row) {
                        Ok(()) => seq.sampler.sample(&self.masked_row, &seq.tokens),
                        Err(e) => {
                            ended.grammar_failed.push((i, e));
                            return;
                        }
                    },
                };
                // Log-probabilities are of the model's own distribution (the raw row).
                (token, seq.logprobs.map(|n| logprobs(row_logits, token, n)))
            }
            Sampling::Greedy => {
                debug_assert!(seq.needs_only_argmax());
                self.counters.sampled_greedy_rows += 1;
                (self.greedy_ids[row], None)
            }
            Sampling::TopK(k) => {
                let (ids, values) = (&self.greedy_ids[row * k..], &self.top_values[row * k..]);
                let reduced = match seq.reduced_top_k(MAX_REDUCED_TOP_K) {
                    // The first entry is the argmax; a row of NaN has none, and argmax says 0.
                    None => Some(if values[0].is_nan() { 0 } else { ids[0] }),
                    Some(n) => seq.sampler.sample_top_k(&ids[..n + 1], &values[..n + 1]),
                };
                match reduced {
                    Some(token) => {
                        self.counters.sampled_top_k_rows += 1;
                        (token, None)
                    }
                    None => {
                        self.counters.top_k_fallbacks += 1;
                        self.counters.sampled_full_rows += 1;
                        if !rows.fetched && rows.fetch_error.is_none() {
                            match self.model.fetch_logits().map(|l| l.len()) {
                                Ok(n) if n >= self.batch.num_logit_rows() * v => rows.fetched = true,
                                Ok(n) => rows.fetch_error = Some(format!("fetch_logits returned {n} values")),
                                Err(e) => rows.fetch_error = Some(e.to_string()),
                            }
                        }
                        if !rows.fetched {
                            // The step's other sequences go on; this one fails.
                            ended.done.push((i, FinishReason::Stop));
                            ended.failed.push(i);
                            return;
                        }
                        let l = &self.model.last_logits()[row * v..(row + 1) * v];
                        (seq.sampler.sample(l, &seq.tokens), None)
                    }
                }
            }
        };
        self.counters.generated_tokens += 1;
        if let Some(c) = seq.constraint.as_mut() {
            let (time, masks) = c.take_mask_stats();
            self.counters.mask_nanos += time.as_nanos() as u64;
            self.counters.masks += masks;
        }
        // The grammar takes every token but the ones that end the sequence.
        if let (Some(c), false) = (seq.constraint.as_mut(), seq.stop.stop_tokens.contains(&token)) {
            if let Err(e) = c.commit(token) {
                ended.grammar_failed.push((i, e));
                return;
            }
        }
        let reason = accept_token(seq, token, lp, &self.tokenizer, self.limits.context_window);
        // A complete grammar allows nothing more: the output ends here.
        let complete = seq.constraint.as_ref().is_some_and(Constraint::is_finished);
        if let Some(reason) = reason.or(complete.then_some(FinishReason::Stop)) {
            ended.done.push((i, reason));
        }
    }
}
