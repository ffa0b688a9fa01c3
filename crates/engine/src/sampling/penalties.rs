//! Repetition, presence and frequency penalties over the last `penalty_last_n` tokens.
//!
//! llama.cpp's repeat penalty (divide a positive logit, multiply a non-positive one) and
//! OpenAI's presence/frequency penalties (`logit -= count * frequency + (count > 0) * presence`)
//! are applied together, per distinct token of the window, as llama.cpp's `penalties` sampler
//! does. Counting uses a per-vocabulary array kept between calls, so no call after the first
//! allocates.

use super::SamplingParams;

/// Scratch for counting tokens of the penalty window.
#[derive(Default)]
pub(crate) struct Penalties {
    /// `[vocab]` occurrences of each token in the current window; all zero between calls.
    counts: Vec<u32>,
    /// `[distinct tokens of the window]` the ids whose count is non-zero.
    seen: Vec<u32>,
}

impl Penalties {
    /// Penalizes `logits` (`[vocab]`) in place for the tokens of `history`'s last
    /// `params.penalty_last_n` entries. Ids outside the vocabulary are ignored.
    pub(crate) fn apply(&mut self, params: &SamplingParams, logits: &mut [f32], history: &[u32]) {
        if !params.has_penalties() {
            return;
        }
        let vocab = logits.len();
        if self.counts.len() < vocab {
            self.counts.resize(vocab, 0);
        }
        debug_assert!(self.seen.is_empty() && self.counts.iter().all(|&c| c == 0));
        let window = &history[history.len().saturating_sub(params.penalty_last_n)..];
        for &t in window {
            let Some(c) = self.counts.get_mut(t as usize).filter(|_| (t as usize) < vocab) else { continue };
            if *c == 0 {
                self.seen.push(t);
            }
            *c += 1;
        }
        for &t in &self.seen {
            let count = std::mem::take(&mut self.counts[t as usize]);
            let l = &mut logits[t as usize];
            if *l <= 0.0 {
                *l *= params.repetition_penalty;
            } else {
                *l /= params.repetition_penalty;
            }
            *l -= count as f32 * params.frequency_penalty + params.presence_penalty;
        }
        self.seen.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{rngs::StdRng, Rng, SeedableRng};
    use std::collections::HashMap;

    /// The obvious implementation: count with a map, penalize each counted token.
    fn reference(params: &SamplingParams, logits: &mut [f32], history: &[u32]) {
        if !params.has_penalties() {
            return;
        }
        let start = history.len().saturating_sub(params.penalty_last_n);
        let mut counts: HashMap<u32, u32> = HashMap::new();
        for &t in &history[start..] {
            if (t as usize) < logits.len() {
                *counts.entry(t).or_default() += 1;
            }
        }
        for (t, c) in counts {
            let l = logits[t as usize];
            let l = if l <= 0.0 { l * params.repetition_penalty } else { l / params.repetition_penalty };
            // Same grouping as llama.cpp: one subtraction of the summed penalty.
            logits[t as usize] = l - (c as f32 * params.frequency_penalty + params.presence_penalty);
        }
    }

    #[test]
    fn matches_reference_and_touches_only_window_tokens() {
        let mut rng = StdRng::seed_from_u64(7);
        let mut pen = Penalties::default();
        for case in 0..300 {
            let vocab = rng.gen_range(1..200usize);
            let logits: Vec<f32> = (0..vocab).map(|_| rng.gen_range(-8.0..8.0)).collect();
            let hist_len = rng.gen_range(0..120);
            // Some ids outside the vocabulary, which must be ignored.
            let history: Vec<u32> = (0..hist_len).map(|_| rng.gen_range(0..vocab as u32 + 3)).collect();
            let params = SamplingParams {
                repetition_penalty: rng.gen_range(0.5..2.0),
                presence_penalty: rng.gen_range(-2.0..2.0),
                frequency_penalty: rng.gen_range(-2.0..2.0),
                penalty_last_n: [0, 1, 7, 64, usize::MAX][case % 5],
                ..SamplingParams::default()
            };
            let mut got = logits.clone();
            pen.apply(&params, &mut got, &history);
            let mut want = logits.clone();
            reference(&params, &mut want, &history);
            assert_eq!(got, want, "case {case}");
            let window = &history[history.len().saturating_sub(params.penalty_last_n)..];
            for (t, (&g, &l)) in got.iter().zip(&logits).enumerate() {
                if params.penalty_last_n == 0 || !window.contains(&(t as u32)) {
                    assert_eq!(g.to_bits(), l.to_bits(), "token {t} outside the window changed");
                }
            }
        }
    }

    #[test]
    fn exact_values() {
        let params = SamplingParams {
            repetition_penalty: 2.0,
            presence_penalty: 0.5,
            frequency_penalty: 0.25,
            penalty_last_n: 4,
            ..SamplingParams::default()
        };
        let mut logits = vec![4.0, -4.0, 1.0, 3.0, 0.0];
        // Window = [1, 1, 4, 1]; token 3 fell out of it; 2 never appears.
        Penalties::default().apply(&params, &mut logits, &[3, 1, 1, 4, 1]);
        assert_eq!(logits, vec![4.0, -8.0 - 0.75 - 0.5, 1.0, 3.0, 0.0 - 0.25 - 0.5]);
    }
}
