//! The adaptive draft length of one sequence.
//!
//! Each drafted token is a trial: kept or not. `α`, an exponential moving average of those
//! trials, estimates the chance that the next draft token is kept given the previous one was.
//! With `k` drafted tokens a step yields `1 + α + … + α^k` tokens on average and costs
//! `1 + cost × k` single-token steps, so the sequence drafts the `k` that maximizes their
//! ratio. When that is 0, drafting stops costing anything; every `PROBE_EVERY`-th step still
//! drafts `PROBE_TOKENS` so that a sequence entering a repetitive stretch is noticed.
//!
//! Everything here depends only on the sequence's own tokens, so the draft lengths, and with
//! them a seeded sampler's draws, are the same on every run.

/// Weight of one new trial in `α`.
const RATE: f32 = 0.1;
/// `α` before any trial: a first draft of about two tokens at a small cost.
const INITIAL_ALPHA: f32 = 0.6;
const PROBE_EVERY: u32 = 8;
const PROBE_TOKENS: usize = 2;

#[derive(Clone, Debug, PartialEq)]
pub struct DraftLength {
    alpha: f32,
    /// Steps since the last draft while the best length was 0.
    idle: u32,
}

impl Default for DraftLength {
    fn default() -> Self {
        DraftLength { alpha: INITIAL_ALPHA, idle: 0 }
    }
}

impl DraftLength {
    /// The estimated chance that a draft token is kept.
    pub fn acceptance(&self) -> f32 {
        self.alpha
    }

    /// Tokens to draft this step, at most `max`, when one more token in a step costs `cost`
    /// of a one-token step.
    pub fn next(&mut self, max: usize, cost: f32) -> usize {
        let k = best_length(self.alpha, max, cost);
        if k > 0 || max == 0 {
            self.idle = 0;
            return k;
        }
        self.idle += 1;
        if self.idle >= PROBE_EVERY {
            self.idle = 0;
            return PROBE_TOKENS.min(max);
        }
        0
    }

    /// A step drafted `drafted` tokens and the model kept the first `accepted` of them.
    pub fn record(&mut self, drafted: usize, accepted: usize) {
        debug_assert!(accepted <= drafted);
        for _ in 0..accepted {
            self.alpha += RATE * (1.0 - self.alpha);
        }
        if accepted < drafted {
            self.alpha -= RATE * self.alpha;
        }
    }
}

/// The `k` in `0..=max` maximizing `(1 + α + … + α^k) / (1 + cost × k)` (the smallest on ties).
fn best_length(alpha: f32, max: usize, cost: f32) -> usize {
    let (mut best, mut best_rate) = (0, 1.0f32);
    let (mut expected, mut term) = (1.0f32, 1.0f32);
    for k in 1..=max {
        term *= alpha;
        expected += term;
        let rate = expected / (1.0 + cost * k as f32);
        if rate > best_rate {
            (best, best_rate) = (k, rate);
        }
    }
    best
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn length_follows_acceptance_and_cost() {
        assert_eq!(best_length(0.0, 8, 0.1), 0);
        assert_eq!(best_length(0.99, 8, 0.0), 8);
        assert!(best_length(0.9, 16, 0.1) >= 6);
        assert!(best_length(0.9, 16, 0.5) < best_length(0.9, 16, 0.1));
        assert_eq!(best_length(0.5, 8, 1.0), 0, "a token costing a whole step never pays");
        assert_eq!(best_length(0.9, 3, 0.0), 3, "capped by max");
    }

    #[test]
    fn rejection_stops_drafting_and_probing_resumes_it() {
        let mut d = DraftLength::default();
        let k0 = d.next(8, 0.1);
        assert!(k0 >= 1);
        for _ in 0..40 {
            d.record(2, 0);
        }
        assert!(d.acceptance() < 0.05);
        let ks: Vec<usize> = (0..16).map(|_| d.next(8, 0.1)).collect();
        assert_eq!(ks.iter().filter(|&&k| k > 0).count(), 2, "{ks:?}");
        assert!(ks.iter().all(|&k| k == 0 || k == PROBE_TOKENS));
        for _ in 0..40 {
            d.record(4, 4);
        }
        assert!(d.acceptance() > 0.95);
        assert_eq!(d.next(8, 0.1), 8);
    }
}
