//! `Sequence`: everything the scheduler keeps about one request — its tokens, its cache while
//! it runs, its sampler and stop state, its block hashes and its event sender.
//!
//! Tokens and cache: `tokens` holds the prompt and every generated token; the cache holds the
//! K/V of `tokens[..computed()]`. A running sequence always has at least one token to compute
//! (the last sampled token, or the rest of the prompt), so one rule drives prefill, decode and
//! recompute after preemption: feed `tokens[computed..]`, as much as the step's budget allows,
//! and sample when the feed reaches the end.
//!
//! Continuations (`n > 1`): the request's first sequence carries the others in `siblings`,
//! without caches, until its prompt is computed; then the scheduler forks its cache into each
//! (copy-on-write, the prompt's blocks shared) and every one samples its first token from the
//! same logit row, with its own sampler, grammar state and stop conditions.

use kvcache::{BlockHash, SequenceCache};
use pagekv_model::tokenizer::StreamDecoder;

use crate::constraint::Constraint;
use crate::sampling::Sampler;
use crate::speculative::DraftLength;
use crate::stop::{StopConditions, StopMatcher};
use crate::stream::EventSender;

pub(crate) struct Sequence {
    /// Engine-unique id (also the key of its bank entry and of its index entries).
    pub id: u64,
    /// `[prompt + generated]`.
    pub tokens: Vec<u32>,
    pub prompt_len: usize,
    /// The K/V of `tokens[..offset]`, while admitted.
    pub cache: Option<SequenceCache>,
    /// `[full blocks known]` chained hashes of `tokens`' full blocks, computed as needed.
    pub hashes: Vec<BlockHash>,
    /// Leading blocks registered in the bank's index under this id.
    pub registered: usize,
    /// The bank entry this admission's prefix came from (dropped if this one extends it).
    pub origin: Option<u64>,
    pub sampler: Sampler,
    /// Stop tokens include the end-of-generation tokens unless the request ignores them.
    pub stop: StopConditions,
    pub matcher: StopMatcher,
    pub decoder: StreamDecoder,
    pub logprobs: Option<usize>,
    /// The grammar the output is held to, if any (its state advances with every token).
    pub constraint: Option<Constraint>,
    /// Tokens sampled so far.
    pub generated: usize,
    /// `[≤ draft tokens]` this step's proposal, fed after the last token (empty: none).
    pub draft: Vec<u32>,
    /// Most tokens this step may draft (set while planning).
    pub draft_max: usize,
    /// The request lets the drafter propose for it.
    pub speculative: bool,
    /// How many tokens to draft, from this sequence's acceptance so far.
    pub draft_length: DraftLength,
    /// Prompt tokens found in the bank at first admission (`None` before it).
    pub cached_tokens: Option<usize>,
    pub out: EventSender,
    /// The request's other continuations, waiting for this one's prompt (empty once forked,
    /// and for `n = 1`).
    pub siblings: Vec<Sequence>,
}

impl Sequence {
    /// True when no client waits for this sequence: its stream and every waiting sibling's
    /// were dropped (a prompt still feeds the siblings whose clients remain).
    pub fn is_cancelled(&self) -> bool {
        self.out.is_cancelled() && self.siblings.iter().all(|s| s.out.is_cancelled())
    }

    /// Tokens whose K/V the cache holds.
    pub fn computed(&self) -> usize {
        self.cache.as_ref().map_or(0, |c| c.offset())
    }

    /// True when this sequence's next token needs nothing but the argmax of its raw logit row:
    /// a plain greedy sampler, no logprobs and no grammar (stop strings and tokens act on the
    /// chosen id).
    pub fn needs_only_argmax(&self) -> bool {
        self.sampler.is_raw_argmax() && self.logprobs.is_none() && self.constraint.is_none()
    }

    /// `Some(top_k)` when this sequence's next token can be drawn from its row's best
    /// `top_k + 1` entries (`Sampler::sample_top_k`; no logprobs, which need the whole row, and
    /// no grammar, whose mask may forbid every one of those entries).
    pub fn reduced_top_k(&self, max_k: usize) -> Option<usize> {
        (self.logprobs.is_none() && self.constraint.is_none()).then(|| self.sampler.reduced_top_k(max_k)).flatten()
    }

    /// True when this step only decodes: the last sampled token is all there is to feed.
    pub fn decoding(&self) -> bool {
        self.generated > 0 && self.pending() == 1
    }

    /// Tokens still to feed.
    pub fn pending(&self) -> usize {
        self.tokens.len() - self.computed()
    }

    /// Extends `hashes` to the first `blocks` full blocks of `tokens`.
    pub fn ensure_hashes(&mut self, blocks: usize, block_size: usize, identity: u64) {
        debug_assert!(blocks * block_size <= self.tokens.len());
        while self.hashes.len() < blocks {
            let i = self.hashes.len();
            let parent = self.hashes.last().copied();
            let h = BlockHash::chain(parent, &self.tokens[i * block_size..(i + 1) * block_size], identity);
            self.hashes.push(h);
        }
    }
}
