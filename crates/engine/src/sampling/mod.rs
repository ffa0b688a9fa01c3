//! Sampling: from one row of logits to one token id.
//!
//! - [`SamplingParams`] / [`SamplingError`] (`params.rs`): what a request asks for, validated.
//! - [`Sampler`]: a request's sampler with its own seeded RNG (`StdRng`, ChaCha12: the same
//!   seed gives the same tokens on every run). It keeps its scratch buffers between calls, so
//!   `sample` allocates nothing after the first call.
//! - penalties (`penalties.rs`), then temperature, top-k, top-p, min-p and the draw, here.
//! - [`logprobs`] (`logprobs.rs`): log-softmax of the raw logits for OpenAI `logprobs`.
//! - Reduced inputs: [`Sampler::is_raw_argmax`] (the token is the row's argmax) and
//!   [`Sampler::reduced_top_k`] / [`Sampler::sample_top_k`] (the token is drawn from the row's
//!   best `top_k + 1` entries, with exactly the result and RNG use of [`Sampler::sample`] on the
//!   full row, or `None` when those entries cannot decide it and the full row is needed).

mod logprobs;
mod params;
mod penalties;

pub use logprobs::{logprobs, TokenLogprobs};
pub use params::{SamplingError, SamplingParams, DEFAULT_SEED};

use penalties::Penalties;
use rand::{rngs::StdRng, Rng, SeedableRng};
use std::cmp::Ordering;

/// One request's sampler.
pub struct Sampler {
    params: SamplingParams,
    rng: StdRng,
    penalties: Penalties,
    /// `[vocab]` the logits after penalties.
    work: Vec<f32>,
    /// `[live candidates]` `(token, tempered logit)`; after top-k / top-p, most likely first.
    candidates: Vec<(u32, f32)>,
}

/// Candidate order: higher logit first, lower id first among equals (a total order: NaN never
/// reaches the candidates).
fn by_logit_desc(a: &(u32, f32), b: &(u32, f32)) -> Ordering {
    b.1.total_cmp(&a.1).then(a.0.cmp(&b.0))
}

/// Index of the largest logit, the lowest index among equals; NaN is skipped, and a row with
/// no comparable value gives 0. The model crate's rule, which every backend's on-device greedy
/// choice follows too.
pub use pagekv_model::backend::argmax;

impl Sampler {
    /// A sampler for `params` (validated here) seeded with `params.seed`.
    pub fn new(params: SamplingParams) -> Result<Sampler, SamplingError> {
        params.validate()?;
        Ok(Sampler {
            params,
            rng: StdRng::seed_from_u64(params.seed),
            penalties: Penalties::default(),
            work: Vec::new(),
            candidates: Vec::new(),
        })
    }

    pub fn params(&self) -> &SamplingParams {
        &self.params
    }

    /// True when [`Sampler::sample`] is the [`argmax`] of the raw row whatever the history:
    /// greedy with no penalty (the RNG is never drawn from). The scheduler then takes the
    /// backend's greedy choice instead of the full row (`Forward::forward_greedy`).
    pub fn is_raw_argmax(&self) -> bool {
        self.params.is_greedy() && !self.params.has_penalties()
    }

    /// `Some(top_k)` when [`Sampler::sample_top_k`] can stand in for [`Sampler::sample`]: a
    /// sampled (not greedy) choice with top-k on, at most `max_k`, and no penalty (which would
    /// change logits outside the best entries).
    pub fn reduced_top_k(&self, max_k: usize) -> Option<usize> {
        let p = &self.params;
        let k = p.top_k;
        (!p.is_greedy() && !p.has_penalties() && k > 0 && k <= max_k).then_some(k)
    }

    /// [`Sampler::sample`] from a row's best entries instead of the row: `ids` / `values` are the
    /// row's best `top_k + 1` entries in `pagekv_model::backend::top_k`'s order and padding.
    /// Returns the token `sample` would return on the full row, having drawn from the RNG
    /// exactly as it would; or `None`, having drawn nothing, when these entries cannot decide
    /// it (fewer than `top_k + 1` non-NaN values in the row, a temperature whose inverse is not
    /// finite, or tempered values equal across the `top_k` boundary) — then call `sample`.
    ///
    /// Why the result is the same: tempering (`l * (1/T)`, `1/T` finite and positive) never
    /// reverses the order of two values, so every entry outside these `k + 1` has a tempered
    /// value at most the smallest here. When the `k`-th best tempered value here is strictly
    /// greater than the `k + 1`-th, the full row's top-`k` candidates are exactly the best `k`
    /// here, sorted by the same total order (tempered value, then id), so top-p, min-p and the
    /// draw see the same list.
    pub fn sample_top_k(&mut self, ids: &[u32], values: &[f32]) -> Option<u32> {
        let k = self.params.top_k;
        debug_assert!(self.reduced_top_k(usize::MAX).is_some(), "a reducible sampler");
        debug_assert_eq!((ids.len(), values.len()), (k + 1, k + 1));
        let inv_t = 1.0 / self.params.temperature;
        if !inv_t.is_finite() || values.iter().any(|v| v.is_nan()) {
            return None;
        }
        self.candidates.clear();
        self.candidates.extend(ids.iter().zip(values).map(|(&i, &l)| (i, l * inv_t)));
        let max = self.candidates.iter().map(|c| c.1).fold(f32::NEG_INFINITY, f32::max);
        if !max.is_finite() {
            // `sample` falls back to the argmax of the raw row: the first entry.
            return Some(ids[0]);
        }
        self.candidates.sort_unstable_by(by_logit_desc);
        // Written as a negation on purpose: a NaN pair is "not strictly greater" too.
        #[allow(clippy::neg_cmp_op_on_partial_ord)]
        if !(self.candidates[k - 1].1 > self.candidates[k].1) {
            return None;
        }
        self.candidates.truncate(k);
        self.top_p(true);
        self.min_p();
        Some(self.draw())
    }

    /// Chooses the next token from `logits` (`[vocab]`, raw model output), `history` being the
    /// tokens so far (prompt and generated) for the penalties.
    pub fn sample(&mut self, logits: &[f32], history: &[u32]) -> u32 {
        match self.filter(logits, history) {
            Some(token) => token,
            None => self.draw(),
        }
    }

    /// Speculative verification of a drafted token `draft` whose proposer was certain of it
    /// (its distribution `q` is one-hot): returns the token to emit and whether it is `draft`.
    /// Greedy: `draft` if it is the argmax, else the argmax. Sampled: `draft` with probability
    /// `p(draft)` under this sampler's distribution `p` (penalties, temperature, top-k, top-p,
    /// min-p applied as in [`Sampler::sample`]), else a draw from `p` with `draft` removed and
    /// renormalized — the standard rejection rule with `q = δ(draft)`, so the emitted token is
    /// distributed exactly as `sample`'s. Draws from the RNG only where a choice is random.
    pub fn verify(&mut self, logits: &[f32], history: &[u32], draft: u32) -> (u32, bool) {
        if let Some(token) = self.filter(logits, history) {
            return (token, token == draft);
        }
        let max = self.candidates.iter().map(|c| c.1).fold(f32::NEG_INFINITY, f32::max);
        let z: f64 = self.candidates.iter().map(|c| ((c.1 - max) as f64).exp()).sum();
        let Some(at) = self.candidates.iter().position(|c| c.0 == draft) else {
            return (self.draw(), false);
        };
        let p = ((self.candidates[at].1 - max) as f64).exp() / z;
        if self.candidates.len() == 1 || self.rng.gen::<f64>() < p {
            return (draft, true);
        }
        self.candidates.remove(at);
        (self.draw(), false)
    }

    /// Penalties, then greedy (`Some(argmax)`), or temperature, top-k, top-p and min-p into
    /// `candidates` (`None`: draw from them).
    fn filter(&mut self, logits: &[f32], history: &[u32]) -> Option<u32> {
        debug_assert!(!logits.is_empty(), "empty logits row");
        let logits: &[f32] = if self.params.has_penalties() && !history.is_empty() {
            self.work.clear();
            self.work.extend_from_slice(logits);
            self.penalties.apply(&self.params, &mut self.work, history);
            &self.work
        } else {
            logits
        };
        if self.params.is_greedy() {
            return Some(argmax(logits));
        }
        let inv_t = 1.0 / self.params.temperature;
        self.candidates.clear();
        self.candidates
            .extend(logits.iter().enumerate().filter(|(_, l)| !l.is_nan()).map(|(i, &l)| (i as u32, l * inv_t)));
        let max = self.candidates.iter().map(|c| c.1).fold(f32::NEG_INFINITY, f32::max);
        if !max.is_finite() {
            // All impossible (or +inf, which softmax cannot weigh): fall back to the argmax.
            return Some(argmax(logits));
        }
        let sorted = self.top_k();
        self.top_p(sorted);
        self.min_p();
        None
    }

    /// Keeps the `top_k` best candidates, sorted. Returns whether the candidates are sorted.
    fn top_k(&mut self) -> bool {
        let k = self.params.top_k;
        if k == 0 || k >= self.candidates.len() {
            return false;
        }
        self.candidates.select_nth_unstable_by(k - 1, by_logit_desc);
        self.candidates.truncate(k);
        self.candidates.sort_unstable_by(by_logit_desc);
        true
    }

    /// Keeps the smallest most-likely prefix whose probability mass reaches `top_p` (at least
    /// one token). Sorts only as much as needed: the best `n` candidates are selected and sorted,
    /// doubling `n` until their mass (over the full normalizer) reaches `top_p`.
    fn top_p(&mut self, mut sorted: bool) {
        let p = self.params.top_p as f64;
        if p >= 1.0 {
            return;
        }
        let max = self.candidates.iter().map(|c| c.1).fold(f32::NEG_INFINITY, f32::max);
        let z: f64 = self.candidates.iter().map(|c| ((c.1 - max) as f64).exp()).sum();
        let mut n = 64usize;
        loop {
            let len = self.candidates.len();
            if !sorted {
                if n < len {
                    self.candidates.select_nth_unstable_by(n - 1, by_logit_desc);
                    self.candidates[..n].sort_unstable_by(by_logit_desc);
                } else {
                    self.candidates.sort_unstable_by(by_logit_desc);
                    sorted = true;
                }
            }
            let head = n.min(len);
            let mut cum = 0.0f64;
            for (i, c) in self.candidates[..head].iter().enumerate() {
                cum += ((c.1 - max) as f64).exp() / z;
                if cum >= p {
                    self.candidates.truncate(i + 1);
                    return;
                }
            }
            if head == len {
                // Rounding left the total just under p: keep everything.
                return;
            }
            n *= 2;
        }
    }

    /// Drops candidates less likely than `min_p` × the most likely one, i.e. whose logit is
    /// below `max + ln(min_p)`. The most likely candidate always stays.
    fn min_p(&mut self) {
        let m = self.params.min_p;
        if m <= 0.0 {
            return;
        }
        let max = self.candidates.iter().map(|c| c.1).fold(f32::NEG_INFINITY, f32::max);
        let floor = max + m.ln();
        self.candidates.retain(|c| c.1 >= floor);
        debug_assert!(!self.candidates.is_empty());
    }

    /// Draws from the softmax of the remaining candidates.
    fn draw(&mut self) -> u32 {
        debug_assert!(!self.candidates.is_empty());
        let max = self.candidates.iter().map(|c| c.1).fold(f32::NEG_INFINITY, f32::max);
        let z: f64 = self.candidates.iter().map(|c| ((c.1 - max) as f64).exp()).sum();
        let u = self.rng.gen::<f64>() * z;
        let mut cum = 0.0f64;
        for c in &self.candidates {
            cum += ((c.1 - max) as f64).exp();
            if u < cum {
                return c.0;
            }
        }
        // u landed on the rounding gap at the top: the last candidate with any mass.
        self.candidates.iter().rev().find(|c| c.1 > f32::NEG_INFINITY).map_or(self.candidates[0].0, |c| c.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(temperature: f32) -> SamplingParams {
        SamplingParams { temperature, ..SamplingParams::default() }
    }

    #[test]
    fn argmax_ties_and_nan() {
        assert_eq!(argmax(&[1.0, 3.0, 3.0, -1.0]), 1);
        assert_eq!(argmax(&[f32::NAN, 2.0, f32::NAN, 2.0]), 1);
        assert_eq!(argmax(&[f32::NEG_INFINITY, f32::NEG_INFINITY]), 0);
        assert_eq!(argmax(&[]), 0);
    }

    #[test]
    fn invalid_params_are_refused() {
        assert!(Sampler::new(SamplingParams { top_p: 0.0, ..params(1.0) }).is_err());
    }

    #[test]
    fn top_p_keeps_the_nucleus() {
        // Probabilities ∝ e^l: [0.5, 0.25, 0.125, 0.125] for logits ln of those.
        let logits: Vec<f32> = [0.5f32, 0.25, 0.125, 0.125].iter().map(|p| p.ln()).collect();
        for (top_p, keep) in [(0.5f32, 1usize), (0.6, 2), (0.75, 2), (0.8, 3), (1.0, 4)] {
            let mut s = Sampler::new(SamplingParams { top_p, ..params(1.0) }).unwrap();
            s.candidates = logits.iter().enumerate().map(|(i, &l)| (i as u32, l)).collect();
            s.top_p(false);
            assert_eq!(s.candidates.len(), keep, "top_p {top_p}");
        }
    }

    #[test]
    fn top_p_over_a_large_vocab_equals_full_sort() {
        use rand::{rngs::StdRng, Rng, SeedableRng};
        let mut rng = StdRng::seed_from_u64(3);
        for _ in 0..20 {
            let logits: Vec<f32> = (0..5000).map(|_| rng.gen_range(-4.0..4.0f32)).collect();
            let top_p = rng.gen_range(0.05..0.99f32);
            let mut s = Sampler::new(SamplingParams { top_p, ..params(1.0) }).unwrap();
            s.candidates = logits.iter().enumerate().map(|(i, &l)| (i as u32, l)).collect();
            s.top_p(false);
            // Reference: full sort, cumulative mass.
            let mut all: Vec<(u32, f32)> = logits.iter().enumerate().map(|(i, &l)| (i as u32, l)).collect();
            all.sort_by(by_logit_desc);
            let z: f64 = all.iter().map(|c| (c.1 as f64).exp()).sum();
            let mut cum = 0.0;
            let keep = all.iter().position(|c| {
                cum += (c.1 as f64).exp() / z;
                cum >= top_p as f64
            });
            let keep = keep.map_or(all.len(), |i| i + 1);
            assert!(s.candidates.len().abs_diff(keep) <= 1, "{} vs {keep}", s.candidates.len());
            let n = s.candidates.len().min(keep);
            assert_eq!(s.candidates[..n], all[..n]);
        }
    }

    /// `sample_top_k` (falling back to `sample` on `None`) and `sample` on the full row, from
    /// two samplers with one seed, give the same token at every step of long runs over rows with
    /// ties, signed zeros, infinities, NaN and values that temper to equal or infinite ones.
    #[test]
    fn sampling_from_the_top_k_entries_equals_sampling_from_the_row() {
        use pagekv_model::backend::top_k;
        use rand::{rngs::StdRng, Rng, SeedableRng};
        let mut rng = StdRng::seed_from_u64(21);
        let specials = [0.0f32, -0.0, f32::INFINITY, f32::NEG_INFINITY, f32::NAN, 3.0e38, -3.0e38, 1e-40, -1e-40];
        let (mut reduced_runs, mut fallbacks) = (0usize, 0usize);
        for case in 0..300 {
            let vocab = rng.gen_range(2..400usize);
            let params = SamplingParams {
                temperature: [0.7f32, 1.0, 1.3, 1e-3, 1e-40, 50.0][case % 6],
                top_k: rng.gen_range(1..vocab.min(40) + 1),
                top_p: if rng.gen_bool(0.5) { 1.0 } else { rng.gen_range(0.05..1.0) },
                min_p: if rng.gen_bool(0.5) { 0.0 } else { rng.gen_range(0.0..0.5) },
                seed: case as u64,
                ..SamplingParams::default()
            };
            let mut full = Sampler::new(params).unwrap();
            let mut reduced = Sampler::new(params).unwrap();
            let k = reduced.reduced_top_k(usize::MAX).expect("reducible");
            for step in 0..20 {
                let special = rng.gen_range(0.0..0.3f64);
                let coarse = rng.gen_bool(0.3);
                let row: Vec<f32> = (0..vocab)
                    .map(|_| {
                        if rng.gen_bool(special) {
                            specials[rng.gen_range(0..specials.len())]
                        } else if coarse {
                            (rng.gen_range(-6.0f32..6.0) * 2.0).round() / 2.0
                        } else {
                            rng.gen_range(-6.0f32..6.0)
                        }
                    })
                    .collect();
                let want = full.sample(&row, &[]);
                let (mut ids, mut values) = (Vec::new(), Vec::new());
                top_k(&row, k + 1, &mut ids, &mut values);
                let got = match reduced.sample_top_k(&ids, &values) {
                    Some(t) => {
                        reduced_runs += 1;
                        t
                    }
                    None => {
                        fallbacks += 1;
                        reduced.sample(&row, &[])
                    }
                };
                assert_eq!(got, want, "case {case} step {step} {params:?}");
            }
            // The RNGs were drawn from the same number of times.
            assert_eq!(full.rng.gen::<u64>(), reduced.rng.gen::<u64>(), "case {case}");
        }
        assert!(
            reduced_runs > 3000 && fallbacks > 100,
            "both paths ran: {reduced_runs} reduced, {fallbacks} fallbacks"
        );
    }

    #[test]
    fn no_allocation_after_first_call() {
        let logits: Vec<f32> = (0..1000).map(|i| ((i * 37 % 101) as f32) / 10.0).collect();
        let mut s = Sampler::new(SamplingParams {
            temperature: 0.8,
            top_k: 50,
            top_p: 0.9,
            min_p: 0.05,
            repetition_penalty: 1.1,
            ..SamplingParams::default()
        })
        .unwrap();
        let history = [1u32, 2, 3, 500];
        s.sample(&logits, &history);
        let caps = (s.work.capacity(), s.candidates.capacity(), s.work.as_ptr(), s.candidates.as_ptr());
        for _ in 0..50 {
            s.sample(&logits, &history);
        }
        assert_eq!(caps, (s.work.capacity(), s.candidates.capacity(), s.work.as_ptr(), s.candidates.as_ptr()));
    }
    /// Two-sample chi-square statistic of two count vectors over the same categories (the
    /// categories both leave empty are skipped); returns it and its degrees of freedom.
    fn chi_square(a: &[u64], b: &[u64]) -> (f64, usize) {
        let (na, nb) = (a.iter().sum::<u64>() as f64, b.iter().sum::<u64>() as f64);
        let (mut x2, mut cells) = (0.0, 0);
        for (&x, &y) in a.iter().zip(b) {
            let total = (x + y) as f64;
            if total == 0.0 {
                continue;
            }
            cells += 1;
            let (ea, eb) = (total * na / (na + nb), total * nb / (na + nb));
            x2 += (x as f64 - ea).powi(2) / ea + (y as f64 - eb).powi(2) / eb;
        }
        (x2, cells.max(1) - 1)
    }

    /// `verify` with any draft emits tokens distributed as `sample`'s: 20,000 seeded runs of
    /// each over rows, settings and drafts of every kind (the draft the most likely token, an
    /// unlikely one, one outside the top-k, one with probability 0) pass a chi-square test of
    /// homogeneity (p ≥ 0.001; critical values for up to 7 degrees of freedom).
    #[test]
    fn verify_emits_the_samplers_distribution() {
        const CRITICAL: [f64; 8] = [0.0, 10.83, 13.82, 16.27, 18.47, 20.52, 22.46, 24.32];
        let row = [2.0f32, 1.5, 1.4, 0.3, -0.5, -1.0, f32::NEG_INFINITY, -3.0];
        let settings = [
            SamplingParams { temperature: 1.0, top_k: 0, top_p: 1.0, min_p: 0.0, ..SamplingParams::default() },
            SamplingParams { temperature: 0.7, top_k: 4, top_p: 0.9, min_p: 0.0, ..SamplingParams::default() },
            SamplingParams { temperature: 1.3, top_k: 0, top_p: 1.0, min_p: 0.1, ..SamplingParams::default() },
            SamplingParams {
                temperature: 1.0,
                repetition_penalty: 1.3,
                top_k: 0,
                top_p: 1.0,
                min_p: 0.0,
                ..SamplingParams::default()
            },
        ];
        let history = [0u32, 3];
        for (si, params) in settings.iter().enumerate() {
            for draft in [0u32, 2, 5, 6] {
                let (mut plain, mut drafted) = ([0u64; 8], [0u64; 8]);
                let mut kept = 0;
                for seed in 0..20_000u64 {
                    let p = SamplingParams { seed, ..*params };
                    plain[Sampler::new(p).unwrap().sample(&row, &history) as usize] += 1;
                    let (token, accepted) = Sampler::new(SamplingParams { seed: seed ^ 0x5eed_0000_0000, ..p })
                        .unwrap()
                        .verify(&row, &history, draft);
                    assert_eq!(accepted, token == draft);
                    kept += accepted as usize;
                    drafted[token as usize] += 1;
                }
                let (x2, df) = chi_square(&plain, &drafted);
                assert!(x2 < CRITICAL[df], "setting {si} draft {draft}: chi-square {x2:.2} over {df} df");
                assert_eq!(plain[6] + drafted[6], 0, "a token of probability 0 is never emitted");
                if draft == 6 {
                    assert_eq!(kept, 0);
                }
            }
        }
        // Greedy: the argmax, kept when it is the draft.
        let mut g = Sampler::new(SamplingParams { temperature: 0.0, ..SamplingParams::default() }).unwrap();
        assert_eq!(g.verify(&row, &[], 0), (0, true));
        assert_eq!(g.verify(&row, &[], 1), (0, false));
    }
}
