//! Multi-token decoding: a drafter proposes a few tokens, the model scores them all in the
//! sequence's next step, and the longest prefix the model agrees with is kept.
//!
//! - [`SpeculativeConfig`]: which drafter, the most tokens a step drafts, the n-gram lengths and
//!   the cost model of the adaptive draft length; validated once ([`SpeculativeConfig::validate`]).
//! - [`Drafter`] (this file): the seam a proposer plugs into. One call per step proposes for every
//!   decoding sequence at once, so a proposer that runs a model batches its work; `accepted` and
//!   `release` keep a stateful proposer in step with what the target model kept.
//! - [`ngram`]: prompt lookup — the longest recent suffix that occurred earlier in the sequence
//!   proposes the tokens that followed it. No model, no state.
//! - [`ModelDrafter`] (`model.rs`): a smaller model with the target's vocabulary, over its own
//!   pool.
//! - [`MtpDrafter`] (`mtp.rs`): the target's own next-token-prediction layer, fed with the
//!   target's last hidden states ([`Drafter::computed`]), over its own one-layer pool.
//! - [`DraftLength`] (`length.rs`): each sequence's draft length from its recent acceptance.
//!
//! The scheduler (`scheduler.rs`) feeds `[last token, draft…]` as one chunk with a logit row per
//! position and accepts with [`crate::Sampler::verify`] row by row: greedy keeps a draft token
//! while it is the argmax; sampling keeps draft token `x` with probability `p(x)` (the drafter's
//! `q` is one-hot) and otherwise draws from `p` without `x`, so the output follows the model's
//! own distribution exactly. The rejected positions are trimmed from the cache in the same step.

mod length;
mod model;
mod mtp;
pub mod ngram;

pub use length::DraftLength;
pub use model::ModelDrafter;
pub use mtp::{MtpDrafter, MtpModel};
pub use ngram::NgramDrafter;

use std::sync::{Arc, Mutex};

use pagekv_model::{Forward, ModelError};
use thiserror::Error;

/// Most tokens one step may draft for a sequence (`--draft-tokens`).
pub const MAX_DRAFT_TOKENS: usize = 32;

/// Which proposer drafts.
#[derive(Clone, Debug, PartialEq)]
pub enum DraftMode {
    /// No drafting: one token per sequence per step.
    Off,
    /// Prompt lookup over the sequence's own tokens.
    Ngram,
    /// A smaller model with the same vocabulary ([`ModelDrafter`]).
    Model(DraftModel),
    /// The target's next-token-prediction layer ([`MtpDrafter`]).
    Mtp(MtpModel),
}

impl DraftMode {
    pub fn name(&self) -> String {
        match self {
            DraftMode::Off => "off".into(),
            DraftMode::Ngram => "ngram".into(),
            DraftMode::Model(m) => format!("draft:{}", m.name),
            DraftMode::Mtp(_) => "mtp".into(),
        }
    }
}

/// What a drafter's pool is sized from: the engine's block size, blocks and context window.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DraftPool {
    pub block_size: usize,
    pub num_blocks: usize,
    pub context_window: usize,
}

pub(crate) type BuildDrafter = dyn Fn(DraftPool) -> Result<Box<dyn Drafter>, ModelError> + Send + Sync;

/// A draft model to be built on the scheduler thread (a GPU model must live on the thread that
/// runs it). Compared and printed by name.
#[derive(Clone)]
pub struct DraftModel {
    pub name: String,
    build: Arc<BuildDrafter>,
}

impl DraftModel {
    /// A draft model made by `make` when the engine starts (once: an engine started a second
    /// time from the same configuration gets an error).
    pub fn new<D, F>(name: &str, make: F) -> DraftModel
    where
        D: Forward + 'static,
        F: FnOnce() -> Result<D, ModelError> + Send + 'static,
    {
        let make = Mutex::new(Some(make));
        let label = name.to_string();
        let build = move |p: DraftPool| -> Result<Box<dyn Drafter>, ModelError> {
            let make = make.lock().unwrap_or_else(|e| e.into_inner()).take();
            let make = make.ok_or_else(|| ModelError::Invalid(format!("draft model {label} was already used")))?;
            let d = ModelDrafter::new(label.clone(), make()?, p.num_blocks, p.block_size, p.context_window)?;
            Ok(Box::new(d))
        };
        DraftModel { name: name.to_string(), build: Arc::new(build) }
    }
}

impl std::fmt::Debug for DraftModel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "DraftModel({})", self.name)
    }
}

impl PartialEq for DraftModel {
    fn eq(&self, other: &Self) -> bool {
        self.name == other.name
    }
}

/// Multi-token decoding settings.
#[derive(Clone, Debug, PartialEq)]
pub struct SpeculativeConfig {
    pub mode: DraftMode,
    /// Most tokens drafted per sequence and step, `1..=MAX_DRAFT_TOKENS` (`--draft-tokens`).
    pub draft_tokens: usize,
    /// Shortest and longest suffix the n-gram drafter matches (`min ≥ 1`, `min ≤ max`).
    pub ngram_min: usize,
    pub ngram_max: usize,
    /// What one more token in a sequence's step costs, as a fraction of a one-token step. The
    /// adaptive draft length drafts `k` tokens when the expected tokens per step,
    /// `1 + α + … + α^k`, bought at `1 + cost × k`, beat every other `k`. Memory-bound steps
    /// (a GPU, a large model on few cores) have a small cost; compute-bound ones a larger one.
    pub token_cost: f32,
}

impl Default for SpeculativeConfig {
    fn default() -> Self {
        SpeculativeConfig { mode: DraftMode::Off, draft_tokens: 8, ngram_min: 2, ngram_max: 5, token_cost: 0.1 }
    }
}

/// A speculative setting out of range.
#[derive(Clone, Debug, PartialEq, Error)]
pub enum SpeculativeError {
    #[error("draft tokens must be in 1..={MAX_DRAFT_TOKENS}, got {0}")]
    DraftTokens(usize),
    #[error("n-gram lengths must satisfy 1 <= min <= max <= 64, got min {min}, max {max}")]
    NgramRange { min: usize, max: usize },
    #[error("the draft token cost must be a finite value in [0, 4], got {0}")]
    TokenCost(f32),
}

impl SpeculativeConfig {
    pub fn validate(&self) -> Result<(), SpeculativeError> {
        if self.draft_tokens == 0 || self.draft_tokens > MAX_DRAFT_TOKENS {
            return Err(SpeculativeError::DraftTokens(self.draft_tokens));
        }
        if self.ngram_min == 0 || self.ngram_min > self.ngram_max || self.ngram_max > 64 {
            return Err(SpeculativeError::NgramRange { min: self.ngram_min, max: self.ngram_max });
        }
        if !(self.token_cost.is_finite() && (0.0..=4.0).contains(&self.token_cost)) {
            return Err(SpeculativeError::TokenCost(self.token_cost));
        }
        Ok(())
    }

    /// The drafter this configuration asks for, `None` when drafting is off. Runs on the
    /// scheduler thread; `pool` sizes a draft model's cache.
    pub fn drafter(&self, pool: DraftPool) -> Result<Option<Box<dyn Drafter>>, ModelError> {
        match &self.mode {
            DraftMode::Off => Ok(None),
            DraftMode::Ngram => Ok(Some(Box::new(NgramDrafter::new(self.ngram_min, self.ngram_max)))),
            DraftMode::Model(m) => (m.build)(pool).map(Some),
            DraftMode::Mtp(m) => (m.build)(pool).map(Some),
        }
    }
}

/// One sequence's request to a drafter.
pub struct DraftRequest<'a> {
    /// The sequence (engine-unique id).
    pub id: u64,
    /// `[prompt + generated]` every token so far; the last one is the token this step feeds.
    pub tokens: &'a [u32],
    /// Most tokens to propose (at least 1).
    pub max: usize,
    /// Where the proposal goes (empty on entry; at most `max` tokens; empty = no proposal).
    pub draft: &'a mut Vec<u32>,
}

/// A proposer of draft tokens.
pub trait Drafter {
    /// `ngram`, `draft:NAME`, …: what `/metrics` and `run -v` call it.
    fn name(&self) -> String;
    /// Proposes up to `r.max` tokens after `r.tokens` for every request.
    fn propose(&mut self, requests: &mut [DraftRequest<'_>]);
    /// Sequence `id` kept `tokens` (its whole sequence after this step's verification).
    fn accepted(&mut self, _id: u64, _tokens: &[u32]) {}
    /// Sequence `id` left the running set (finished, failed, cancelled or preempted).
    fn release(&mut self, _id: u64) {}
    /// Whether the drafter reads the target's last hidden states ([`Drafter::computed`]): the
    /// scheduler then asks the forward for those of every token it feeds to a sequence that
    /// may draft (`Forward::hands_out_hidden` must hold; the engine refuses to start otherwise).
    fn wants_hidden(&self) -> bool {
        false
    }
    /// The target computed and kept positions `start..start + rows` of sequence `id`, whose
    /// tokens so far are `tokens` (the whole prompt during prefill); `hidden` (`[rows, hidden]`)
    /// is their last hidden states, before the final norm. Called after every step that fed the
    /// sequence (prompt chunks, decode steps; after a verification only the kept positions,
    /// before [`Drafter::accepted`]), when [`Drafter::wants_hidden`].
    fn computed(&mut self, _id: u64, _tokens: &[u32], _start: usize, _hidden: &[f32]) {}
    /// Blocks of the drafter's own pool in use (`EngineMetrics::draft_blocks_used`).
    fn blocks_in_use(&self) -> usize {
        0
    }
    /// Checks that the drafter's state of sequence `id` follows a target cache holding `offset`
    /// positions, between steps (the scheduler's debug-build invariants).
    fn check_sequence(&self, _id: u64, _offset: usize) -> Result<(), String> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn settings_out_of_range_are_refused() {
        let ok = SpeculativeConfig { mode: DraftMode::Ngram, ..SpeculativeConfig::default() };
        assert_eq!(ok.validate(), Ok(()));
        for k in [0, 33] {
            let c = SpeculativeConfig { draft_tokens: k, ..ok.clone() };
            assert_eq!(c.validate(), Err(SpeculativeError::DraftTokens(k)));
        }
        assert!(SpeculativeConfig { ngram_min: 0, ..ok.clone() }.validate().is_err());
        assert!(SpeculativeConfig { ngram_min: 4, ngram_max: 3, ..ok.clone() }.validate().is_err());
        assert!(SpeculativeConfig { token_cost: f32::NAN, ..ok.clone() }.validate().is_err());
        assert!(SpeculativeConfig { token_cost: -0.1, ..ok }.validate().is_err());
    }
}
