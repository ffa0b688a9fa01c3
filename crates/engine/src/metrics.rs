//! `EngineMetrics`: a snapshot of the scheduler's state and counters, published after every
//! step for the server's `/metrics` and for tests. Counters only grow; gauges are as of the
//! last step.

use kvcache::{CacheStats, GroupKind, LayerGroups, SequenceCache};

/// Scheduler, pool and session-bank state as of the last step.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct EngineMetrics {
    /// Sequences admitted (holding blocks), and queued.
    pub running: usize,
    pub waiting: usize,
    pub blocks_total: usize,
    /// Blocks referenced by running sequences (shared ones counted once).
    pub blocks_used: usize,
    /// Blocks held by the session bank alone: reusable by a prefix hit, reclaimed on demand.
    pub blocks_cached: usize,
    /// Blocks nobody holds.
    pub blocks_free: usize,
    pub block_size: usize,
    pub block_bytes: usize,
    /// Tokens whose K/V running sequences hold (over `blocks_used × block_size`: pool utilization).
    pub live_tokens: usize,
    pub bank_entries: usize,
    /// New requests that found part of their prompt in the bank, and those that did not.
    pub bank_hits: u64,
    pub bank_misses: u64,
    /// Prompt tokens taken from the bank.
    pub bank_hit_tokens: u64,
    /// Blocks evicted from the bank (pool pressure, byte budget, TTL).
    pub bank_evictions: u64,
    pub bank_expired_entries: u64,
    /// Running sequences sent back to the queue for lack of blocks.
    pub preemptions: u64,
    pub requests_submitted: u64,
    pub requests_finished: u64,
    pub requests_cancelled: u64,
    pub requests_failed: u64,
    /// Prompt tokens of submitted requests.
    pub prompt_tokens: u64,
    /// Tokens fed through the model (prefill, recompute after preemption, decode).
    pub computed_tokens: u64,
    /// Tokens sampled.
    pub generated_tokens: u64,
    /// Forward steps run.
    pub steps: u64,
    /// Tokens sampled from a full logit row on the host (`Forward::forward`), and tokens taken
    /// from the backend's greedy choice (`Forward::forward_greedy`: steps where every sampling
    /// sequence is plain greedy without logprobs; no `[rows, vocab]` copy).
    pub sampled_full_rows: u64,
    pub sampled_greedy_rows: u64,
    /// Tokens drawn from the backend's best `top_k + 1` entries of their row
    /// (`Forward::forward_top_k`), and those of such steps that needed the full row after all
    /// (tempered values tied across the top-k boundary; also counted in `sampled_full_rows`).
    pub sampled_top_k_rows: u64,
    pub top_k_fallbacks: u64,
    /// Sequence-steps that emitted tokens (one per sequence per step that sampled; a drafted
    /// step emits 1 to draft + 1 tokens): `generated_tokens / sampling_steps` is the mean
    /// tokens a sequence gains per step.
    pub sampling_steps: u64,
    /// Sequence-steps that verified a draft, the draft tokens they scored and those kept.
    pub draft_steps: u64,
    pub draft_tokens: u64,
    pub draft_accepted_tokens: u64,
    /// The drafter (`ngram`, …), `None` when drafting is off.
    pub drafter: Option<String>,
    /// Blocks of the drafter's own pool in use (a draft model's or MTP layer's caches).
    pub draft_blocks_used: usize,
    /// Continuations forked from a computed prompt (`n > 1` requests: `n − 1` each).
    pub sequence_forks: u64,
    /// Blocks held by two or more running sequences at once (copy-on-write sharing).
    pub blocks_shared: usize,
    /// Grammar masks computed for constrained sequences (one per constrained token), and the
    /// seconds spent computing them (mostly beside the forward pass, on a worker thread):
    /// `mask_seconds / masks_computed` is the mask time per constrained token.
    pub masks_computed: u64,
    pub mask_seconds: f64,
    /// The pool's own counters (attention calls by route, fallbacks, bytes, formats).
    pub cache: CacheStats,
    /// `[layer groups]` each group's attention type and the block references running
    /// sequences hold in it (one entry for a one-group cache; a block two sequences share
    /// counts twice).
    pub group_blocks: Vec<(GroupKind, usize)>,
}

impl EngineMetrics {
    /// Hits over hits + misses (0 before any request).
    pub fn bank_hit_rate(&self) -> f64 {
        let n = self.bank_hits + self.bank_misses;
        if n == 0 {
            0.0
        } else {
            self.bank_hits as f64 / n as f64
        }
    }

    /// Live tokens over the token slots of the blocks running sequences hold (1 when none).
    pub fn pool_utilization(&self) -> f64 {
        let slots = self.blocks_used * self.block_size;
        if slots == 0 {
            1.0
        } else {
            self.live_tokens as f64 / slots as f64
        }
    }
}

/// `[layer groups]` each group's kind and the blocks `caches` hold in it.
pub(crate) fn group_blocks<'a>(
    groups: &LayerGroups,
    caches: impl Iterator<Item = &'a SequenceCache>,
) -> Vec<(GroupKind, usize)> {
    let mut out: Vec<(GroupKind, usize)> = groups.kinds().iter().map(|&k| (k, 0)).collect();
    for cache in caches {
        for (o, n) in out.iter_mut().zip(cache.group_blocks()) {
            o.1 += n;
        }
    }
    out
}
