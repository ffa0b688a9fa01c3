//! Log-probabilities for OpenAI's `logprobs` / `top_logprobs`: the log-softmax of the raw
//! logits (before penalties, temperature and filters), of the chosen token and of the `top_n`
//! most likely ones.

use serde::Serialize;

/// The chosen token's log-probability and the `top_n` most likely alternatives.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct TokenLogprobs {
    pub token: u32,
    pub logprob: f32,
    /// `[min(top_n, vocab)]` `(token, logprob)`, most likely first; equal logits by lower id.
    pub top: Vec<(u32, f32)>,
}

/// Log-softmax of `logits` (`[vocab]`) at `token`, and the `top_n` best entries. A token
/// outside the vocabulary, or a row of non-finite logits, gets `-inf`. NaN logits count as
/// impossible.
pub fn logprobs(logits: &[f32], token: u32, top_n: usize) -> TokenLogprobs {
    let lse = log_sum_exp(logits);
    let lp = |l: f32| -> f32 {
        if l.is_nan() || !lse.is_finite() {
            f32::NEG_INFINITY
        } else {
            (l as f64 - lse) as f32
        }
    };
    let logprob = logits.get(token as usize).map_or(f32::NEG_INFINITY, |&l| lp(l));
    // top_n is small (OpenAI caps it at 20): keep a sorted list by insertion.
    let mut top: Vec<(u32, f32)> = Vec::with_capacity(top_n.min(logits.len()));
    if top_n > 0 {
        for (i, &l) in logits.iter().enumerate() {
            let l = if l.is_nan() { f32::NEG_INFINITY } else { l };
            if top.len() == top_n && l <= top[top_n - 1].1 {
                continue;
            }
            // First position whose logit is strictly smaller: equal logits keep the lower id first.
            let at = top.partition_point(|&(_, x)| x >= l);
            if top.len() == top_n {
                top.pop();
            }
            top.insert(at, (i as u32, l));
        }
    }
    for e in &mut top {
        e.1 = lp(e.1);
    }
    TokenLogprobs { token, logprob, top }
}

/// `ln(sum(exp(logits)))` in f64, ignoring NaN; `-inf` for an empty or all-`-inf` row.
fn log_sum_exp(logits: &[f32]) -> f64 {
    let max = logits.iter().copied().filter(|l| !l.is_nan()).fold(f32::NEG_INFINITY, f32::max);
    if !max.is_finite() {
        return if max == f32::INFINITY { f64::INFINITY } else { f64::NEG_INFINITY };
    }
    let sum: f64 = logits.iter().filter(|l| !l.is_nan()).map(|&l| ((l - max) as f64).exp()).sum();
    max as f64 + sum.ln()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matches_direct_softmax() {
        let logits = [1.0f32, 3.0, -2.0, 3.0, 0.5];
        let z: f64 = logits.iter().map(|&l| (l as f64).exp()).sum();
        let r = logprobs(&logits, 4, 3);
        assert!((r.logprob as f64 - (0.5f64.exp() / z).ln()).abs() < 1e-6);
        let ids: Vec<u32> = r.top.iter().map(|e| e.0).collect();
        assert_eq!(ids, vec![1, 3, 0]);
        for (id, lp) in r.top {
            assert!((lp as f64 - ((logits[id as usize] as f64).exp() / z).ln()).abs() < 1e-6);
        }
        let total: f64 = (0..logits.len()).map(|t| (logprobs(&logits, t as u32, 0).logprob as f64).exp()).sum();
        assert!((total - 1.0).abs() < 1e-6);
    }

    #[test]
    fn edge_cases_do_not_panic() {
        assert_eq!(logprobs(&[0.0, 0.0], 9, 5).logprob, f32::NEG_INFINITY);
        assert_eq!(logprobs(&[0.0, 0.0], 1, 5).top.len(), 2);
        let r = logprobs(&[f32::NAN, 1.0], 0, 1);
        assert_eq!(r.logprob, f32::NEG_INFINITY);
        assert_eq!(r.top, vec![(1, 0.0)]);
        assert!(logprobs(&[], 0, 3).top.is_empty());
    }
}
