//! `SamplingParams`: what a request asks of the sampler, and `validate`, which turns every
//! out-of-range or non-finite value into a typed [`SamplingError`] before a sampler is built.

use serde::{Deserialize, Serialize};
use thiserror::Error;

/// The seed a request gets when it names none (reproducible, not random per process).
pub const DEFAULT_SEED: u64 = 0xC0FF_EE00_5EED;

/// How the next token is chosen from a row of logits.
///
/// Order of application (the order of Hugging Face and vLLM, which OpenAI's semantics follow):
/// penalties → temperature → top-k → top-p → min-p → draw. llama.cpp applies temperature last;
/// top-k is unaffected by the difference, top-p and min-p see the tempered distribution here.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct SamplingParams {
    /// Softmax temperature; `0` = greedy (argmax, lowest index on ties, no randomness).
    pub temperature: f32,
    /// Keep only the `top_k` most likely tokens; `0` = off.
    pub top_k: usize,
    /// Nucleus: keep the smallest set of most likely tokens whose mass reaches `top_p`;
    /// `1` = off. Must lie in `(0, 1]`.
    pub top_p: f32,
    /// Keep tokens whose probability is at least `min_p` × the most likely one's; `0` = off.
    /// Must lie in `[0, 1]`.
    pub min_p: f32,
    /// llama.cpp's repeat penalty: the logit of every token seen in the last `penalty_last_n`
    /// tokens is divided by it when positive and multiplied by it when not; `1` = off. Must be
    /// positive.
    pub repetition_penalty: f32,
    /// OpenAI's presence penalty: subtracted once from the logit of every token seen in the
    /// window. In `[-2, 2]`; `0` = off.
    pub presence_penalty: f32,
    /// OpenAI's frequency penalty: subtracted from a token's logit once per occurrence in the
    /// window. In `[-2, 2]`; `0` = off.
    pub frequency_penalty: f32,
    /// How many of the most recent tokens the penalties look at; `0` disables the penalties,
    /// `usize::MAX` means the whole history.
    pub penalty_last_n: usize,
    /// Seed of the sampler's own random number generator.
    pub seed: u64,
}

impl Default for SamplingParams {
    /// Greedy, no filters, no penalties.
    fn default() -> Self {
        SamplingParams {
            temperature: 0.0,
            top_k: 0,
            top_p: 1.0,
            min_p: 0.0,
            repetition_penalty: 1.0,
            presence_penalty: 0.0,
            frequency_penalty: 0.0,
            penalty_last_n: 64,
            seed: DEFAULT_SEED,
        }
    }
}

/// A sampling parameter outside its domain. `param` is the field's name, as a server would
/// report it.
#[derive(Clone, Debug, PartialEq, Error)]
pub enum SamplingError {
    #[error("{param} must be a finite number, got {value}")]
    NotFinite { param: &'static str, value: f32 },
    #[error("temperature must be >= 0, got {0}")]
    NegativeTemperature(f32),
    #[error("top_p must be in (0, 1], got {0}")]
    TopPOutOfRange(f32),
    #[error("min_p must be in [0, 1], got {0}")]
    MinPOutOfRange(f32),
    #[error("repetition_penalty must be > 0, got {0}")]
    NonPositiveRepetitionPenalty(f32),
    #[error("{param} must be in [-2, 2], got {value}")]
    PenaltyOutOfRange { param: &'static str, value: f32 },
}

impl SamplingParams {
    /// Greedy decoding (the default).
    pub fn greedy() -> Self {
        SamplingParams::default()
    }

    /// Checks every field against its domain; the first violation is returned.
    pub fn validate(&self) -> Result<(), SamplingError> {
        let floats = [
            ("temperature", self.temperature),
            ("top_p", self.top_p),
            ("min_p", self.min_p),
            ("repetition_penalty", self.repetition_penalty),
            ("presence_penalty", self.presence_penalty),
            ("frequency_penalty", self.frequency_penalty),
        ];
        for (param, value) in floats {
            if !value.is_finite() {
                return Err(SamplingError::NotFinite { param, value });
            }
        }
        if self.temperature < 0.0 {
            return Err(SamplingError::NegativeTemperature(self.temperature));
        }
        if !(self.top_p > 0.0 && self.top_p <= 1.0) {
            return Err(SamplingError::TopPOutOfRange(self.top_p));
        }
        if !(0.0..=1.0).contains(&self.min_p) {
            return Err(SamplingError::MinPOutOfRange(self.min_p));
        }
        if self.repetition_penalty <= 0.0 {
            return Err(SamplingError::NonPositiveRepetitionPenalty(self.repetition_penalty));
        }
        for (param, value) in
            [("presence_penalty", self.presence_penalty), ("frequency_penalty", self.frequency_penalty)]
        {
            if !(-2.0..=2.0).contains(&value) {
                return Err(SamplingError::PenaltyOutOfRange { param, value });
            }
        }
        Ok(())
    }

    /// True when temperature is 0: the draw is an argmax and the RNG is never used.
    pub fn is_greedy(&self) -> bool {
        self.temperature == 0.0
    }

    /// True when some penalty changes logits.
    pub fn has_penalties(&self) -> bool {
        self.penalty_last_n > 0
            && (self.repetition_penalty != 1.0 || self.presence_penalty != 0.0 || self.frequency_penalty != 0.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_is_valid_and_greedy() {
        let p = SamplingParams::default();
        assert_eq!(p.validate(), Ok(()));
        assert!(p.is_greedy());
        assert!(!p.has_penalties());
    }

    #[test]
    fn each_bad_value_has_its_error() {
        let base = SamplingParams::default();
        let cases: Vec<(SamplingParams, SamplingError)> = vec![
            (
                SamplingParams { temperature: f32::NAN, ..base },
                SamplingError::NotFinite { param: "temperature", value: f32::NAN },
            ),
            (SamplingParams { temperature: -0.5, ..base }, SamplingError::NegativeTemperature(-0.5)),
            (SamplingParams { top_p: 0.0, ..base }, SamplingError::TopPOutOfRange(0.0)),
            (SamplingParams { top_p: 1.5, ..base }, SamplingError::TopPOutOfRange(1.5)),
            (SamplingParams { min_p: -0.1, ..base }, SamplingError::MinPOutOfRange(-0.1)),
            (SamplingParams { min_p: 1.1, ..base }, SamplingError::MinPOutOfRange(1.1)),
            (SamplingParams { repetition_penalty: 0.0, ..base }, SamplingError::NonPositiveRepetitionPenalty(0.0)),
            (
                SamplingParams { presence_penalty: 2.5, ..base },
                SamplingError::PenaltyOutOfRange { param: "presence_penalty", value: 2.5 },
            ),
            (
                SamplingParams { frequency_penalty: f32::INFINITY, ..base },
                SamplingError::NotFinite { param: "frequency_penalty", value: f32::INFINITY },
            ),
        ];
        for (p, want) in cases {
            let got = p.validate().unwrap_err();
            // NaN != NaN: compare the messages, which carry the parameter and the value.
            assert_eq!(got.to_string(), want.to_string());
        }
    }

    #[test]
    fn edges_are_accepted() {
        let base = SamplingParams::default();
        for p in [
            SamplingParams { top_p: 1.0, min_p: 1.0, ..base },
            SamplingParams { top_p: 1e-6, min_p: 0.0, temperature: 100.0, ..base },
            SamplingParams { presence_penalty: -2.0, frequency_penalty: 2.0, repetition_penalty: 1e-3, ..base },
        ] {
            assert_eq!(p.validate(), Ok(()));
        }
    }

    #[test]
    fn serde_fills_missing_fields_with_defaults() {
        let p: SamplingParams = serde_json::from_str(r#"{"temperature": 0.7, "seed": 5}"#).unwrap();
        assert_eq!(p, SamplingParams { temperature: 0.7, seed: 5, ..SamplingParams::default() });
    }
}
