//! Stop conditions: stop strings, stop tokens and the token budget, and [`StopMatcher`], which
//! watches the decoded text as it streams out.
//!
//! The matcher is fed the text of each new token. It returns what can be shown now and holds
//! back the longest tail that could still grow into a stop string, so a stop string that spans
//! several tokens is never emitted, not even in part. When several stop strings could match,
//! the one that completes first in the text wins (the earliest end; at the same end, the longer
//! one) — the only rule a streaming matcher can follow without waiting for text that may never
//! come, and one that does not depend on how the text was cut into pieces.

use serde::{Deserialize, Serialize};

/// Why a generation ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum FinishReason {
    /// A stop string or stop token (including end-of-generation tokens) was produced.
    Stop,
    /// `max_tokens` was reached (or the context window was full).
    Length,
}

impl FinishReason {
    /// The OpenAI `finish_reason` string.
    pub fn as_str(self) -> &'static str {
        match self {
            FinishReason::Stop => "stop",
            FinishReason::Length => "length",
        }
    }
}

/// When to end a generation.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct StopConditions {
    /// Text that ends the generation; it is not emitted. Empty strings are ignored.
    pub stop_strings: Vec<String>,
    /// Token ids that end the generation (besides the model's end-of-generation tokens, which
    /// the engine adds); the token's text is not emitted.
    pub stop_tokens: Vec<u32>,
    /// Most tokens to generate.
    pub max_tokens: usize,
}

impl Default for StopConditions {
    fn default() -> Self {
        StopConditions { stop_strings: Vec::new(), stop_tokens: Vec::new(), max_tokens: 256 }
    }
}

impl StopConditions {
    /// Checks a freshly sampled token, `generated` being the number of tokens generated
    /// including this one: `Stop` if it is a stop token (its text is then not emitted),
    /// `Length` if the budget is now spent (its text is emitted), `None` otherwise.
    pub fn check_token(&self, token: u32, generated: usize) -> Option<FinishReason> {
        if self.stop_tokens.contains(&token) {
            Some(FinishReason::Stop)
        } else if generated >= self.max_tokens {
            Some(FinishReason::Length)
        } else {
            None
        }
    }
}

/// What one piece of text released.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct StopOutput {
    /// Text safe to emit now (on a match: everything before the stop string not yet emitted).
    pub text: String,
    /// `Some(Stop)` once a stop string matched; nothing after it is ever emitted.
    pub finish: Option<FinishReason>,
}

/// Streaming stop-string matcher.
#[derive(Clone, Debug)]
pub struct StopMatcher {
    /// Non-empty stop strings.
    stops: Vec<String>,
    /// Text received but not yet emitted: always a (possibly empty) proper prefix of some stop
    /// string, or empty when there are no stop strings.
    held: String,
    /// Index into `stops` of the string that matched, once one has.
    matched: Option<usize>,
}

impl StopMatcher {
    pub fn new(stop_strings: &[String]) -> StopMatcher {
        let stops = stop_strings.iter().filter(|s| !s.is_empty()).cloned().collect();
        StopMatcher { stops, held: String::new(), matched: None }
    }

    /// Whether a stop string has matched.
    pub fn stopped(&self) -> bool {
        self.matched.is_some()
    }

    /// The stop string that matched (Anthropic's `stop_sequence`, vLLM's `stop_reason`).
    pub fn matched(&self) -> Option<&str> {
        self.matched.map(|i| self.stops[i].as_str())
    }

    /// Feeds the next piece of decoded text.
    pub fn push(&mut self, piece: &str) -> StopOutput {
        if self.stopped() {
            return StopOutput { text: String::new(), finish: Some(FinishReason::Stop) };
        }
        if self.stops.is_empty() {
            return StopOutput { text: piece.to_string(), finish: None };
        }
        self.held.push_str(piece);
        // Earliest-ending match; `held` had none before this piece, so any match ends in it.
        let mut best: Option<(usize, usize, usize)> = None; // (end, start, index in stops)
        for (i, s) in self.stops.iter().enumerate() {
            if let Some(start) = self.held.find(s.as_str()) {
                let end = start + s.len();
                if best.is_none_or(|(e, st, _)| end < e || (end == e && start < st)) {
                    best = Some((end, start, i));
                }
            }
        }
        if let Some((_, start, i)) = best {
            self.held.truncate(start);
            self.matched = Some(i);
            return StopOutput { text: std::mem::take(&mut self.held), finish: Some(FinishReason::Stop) };
        }
        let keep = self.longest_partial_suffix();
        let text = self.held[..self.held.len() - keep].to_string();
        self.held.drain(..self.held.len() - keep);
        StopOutput { text, finish: None }
    }

    /// Ends the stream without a stop-string match (stop token, length): returns the held-back
    /// text, which can now be emitted.
    pub fn flush(&mut self) -> String {
        std::mem::take(&mut self.held)
    }

    /// Length in bytes of the longest suffix of `held` that is a proper prefix of a stop
    /// string. Such a suffix starts at a char boundary: it equals the start of a valid string.
    fn longest_partial_suffix(&self) -> usize {
        let h = self.held.as_bytes();
        let mut best = 0;
        for s in &self.stops {
            let s = s.as_bytes();
            let max = (s.len() - 1).min(h.len());
            for n in (best + 1..=max).rev() {
                if h[h.len() - n..] == s[..n] {
                    best = n;
                    break;
                }
            }
        }
        debug_assert!(self.held.is_char_boundary(self.held.len() - best));
        best
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(stops: &[&str], pieces: &[&str]) -> (Vec<String>, Option<FinishReason>) {
        let stops: Vec<String> = stops.iter().map(|s| s.to_string()).collect();
        let mut m = StopMatcher::new(&stops);
        let mut out = Vec::new();
        for p in pieces {
            let o = m.push(p);
            out.push(o.text);
            if o.finish.is_some() {
                return (out, o.finish);
            }
        }
        out.push(m.flush());
        (out, None)
    }

    #[test]
    fn holds_back_a_possible_start_and_releases_it_on_mismatch() {
        let (out, fin) = run(&["</s>"], &["Hello <", "/", "x>", " ok"]);
        assert_eq!(out, vec!["Hello ", "", "</x>", " ok", ""]);
        assert_eq!(fin, None);
    }

    #[test]
    fn stop_across_tokens_is_never_emitted() {
        let (out, fin) = run(&["</s>"], &["Hi <", "/s", "> tail"]);
        assert_eq!(out, vec!["Hi ", "", ""]);
        assert_eq!(fin, Some(FinishReason::Stop));
    }

    #[test]
    fn earliest_end_wins() {
        // "bc" completes before "abcd" could.
        let (out, _) = run(&["abcd", "bc"], &["xa", "b", "c", "d"]);
        assert_eq!(out.concat(), "xa");
        let stops = vec!["abcd".to_string(), "bc".to_string()];
        let mut m = StopMatcher::new(&stops);
        assert_eq!(m.matched(), None);
        for p in ["xa", "b", "c"] {
            m.push(p);
        }
        assert_eq!(m.matched(), Some("bc"));
        // Same end: the longer (earlier start) wins.
        let (out, _) = run(&["cd", "abcd"], &["xab", "cd"]);
        assert_eq!(out.concat(), "x");
    }

    #[test]
    fn multibyte_and_empty_stops() {
        let (out, fin) = run(&["", "é!"], &["caf", "é", "!"]);
        assert_eq!(out.concat(), "caf");
        assert_eq!(fin, Some(FinishReason::Stop));
        // Empty stop strings are dropped, so the index still names the matched one.
        let stops = vec![String::new(), "é!".to_string()];
        let mut m = StopMatcher::new(&stops);
        m.push("café!");
        assert_eq!(m.matched(), Some("é!"));
        let (out, fin) = run(&[""], &["a", "b"]);
        assert_eq!(out, vec!["a", "b", ""]);
        assert_eq!(fin, None);
    }

    #[test]
    fn check_token() {
        let c = StopConditions { stop_strings: vec![], stop_tokens: vec![2], max_tokens: 3 };
        assert_eq!(c.check_token(2, 1), Some(FinishReason::Stop));
        assert_eq!(c.check_token(5, 2), None);
        assert_eq!(c.check_token(5, 3), Some(FinishReason::Length));
        assert_eq!(c.check_token(2, 3), Some(FinishReason::Stop));
    }
}
