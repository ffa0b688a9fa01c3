//! Prompt lookup: the n-gram drafter. For the longest `n` in `max..=min` whose last `n` tokens
//! occurred earlier in the sequence, the tokens that followed the most recent earlier occurrence
//! are the draft. Edits, refactors and answers that quote their input repeat long runs of the
//! prompt, so their drafts are mostly accepted; elsewhere there is usually no match, and no
//! match costs nothing.

use super::{DraftRequest, Drafter};

/// The n-gram drafter (stateless: it reads each sequence's tokens as they are).
pub struct NgramDrafter {
    min: usize,
    max: usize,
}

impl NgramDrafter {
    pub fn new(min: usize, max: usize) -> NgramDrafter {
        debug_assert!(min >= 1 && min <= max);
        NgramDrafter { min, max }
    }
}

impl Drafter for NgramDrafter {
    fn name(&self) -> String {
        "ngram".into()
    }

    fn propose(&mut self, requests: &mut [DraftRequest<'_>]) {
        for r in requests {
            lookup(r.tokens, self.min, self.max, r.max, r.draft);
        }
    }
}

/// Appends to `out` up to `k` tokens that followed the most recent earlier occurrence of the
/// longest suffix of `tokens` of length in `min..=max` (nothing when no such suffix recurs).
/// An occurrence must leave at least one token after it; its continuation may run into the
/// suffix itself (a repeating pattern continues).
pub fn lookup(tokens: &[u32], min: usize, max: usize, k: usize, out: &mut Vec<u32>) {
    let len = tokens.len();
    if k == 0 || len < 2 {
        return;
    }
    for n in (min..=max.min(len - 1)).rev() {
        let suffix = &tokens[len - n..];
        // Earlier occurrences start at p with p + n < len (a token follows), p + n ≤ len - 1.
        if let Some(p) = (0..len - n).rev().find(|&p| &tokens[p..p + n] == suffix) {
            let start = p + n;
            let end = (start + k).min(len);
            out.extend_from_slice(&tokens[start..end]);
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn draft(tokens: &[u32], min: usize, max: usize, k: usize) -> Vec<u32> {
        let mut out = Vec::new();
        lookup(tokens, min, max, k, &mut out);
        out
    }

    #[test]
    fn longest_and_most_recent_match_wins() {
        // "1 2 3 9" then "5 2 3 7" then suffix "2 3": the most recent "2 3" is followed by 7.
        let t = [1, 2, 3, 9, 5, 2, 3, 7, 4, 2, 3];
        assert_eq!(draft(&t, 1, 3, 2), vec![7, 4]);
        // With the 3-gram "1 2 3" at the end, the longer match (followed by 9) wins.
        let t = [1, 2, 3, 9, 5, 2, 3, 7, 1, 2, 3];
        assert_eq!(draft(&t, 1, 3, 3), vec![9, 5, 2]);
        // No earlier occurrence of any suffix of length ≥ 2.
        assert!(draft(&[1, 2, 3, 4], 2, 3, 4).is_empty());
        // A repeating pattern continues into the suffix.
        assert_eq!(draft(&[7, 8, 7, 8, 7], 2, 2, 4), vec![8, 7]);
        assert!(draft(&[5], 1, 2, 4).is_empty());
        assert!(draft(&[5, 5, 5], 1, 2, 0).is_empty());
    }

    proptest! {
        /// Against a brute-force statement of the rule over small alphabets.
        #[test]
        fn matches_the_rule(tokens in proptest::collection::vec(0u32..4, 1..40), min in 1usize..4, extra in 0usize..3, k in 1usize..6) {
            let max = min + extra;
            let got = draft(&tokens, min, max, k);
            let len = tokens.len();
            let mut want = Vec::new();
            'n: for n in (min..=max).rev() {
                if n >= len { continue; }
                for p in (0..len - n).rev() {
                    if tokens[p..p + n] == tokens[len - n..] {
                        want = tokens[p + n..(p + n + k).min(len)].to_vec();
                        break 'n;
                    }
                }
            }
            prop_assert_eq!(got, want);
        }
    }
}
