//! What the scheduler reports after each step: one [`EngineMetrics`] snapshot of its queues, the
//! pool and the bank, its counters and the drafter's, which the handles read.

use pagekv_model::Forward;

use super::Scheduler;
use crate::metrics::EngineMetrics;

impl<M: Forward> Scheduler<M> {
    /// Publishes the engine's gauges and counters for the handles (`/metrics`, `run -v`).
    pub(super) fn publish_metrics(&self) {
        let blocks = self.pool.blocks();
        let cached = self.bank.cached_blocks(&self.pool);
        let free = blocks.num_free();
        let m = EngineMetrics {
            running: self.running.len(),
            waiting: self.waiting.len(),
            blocks_total: blocks.num_blocks(),
            blocks_used: blocks.num_blocks() - free - cached,
            blocks_cached: cached,
            blocks_free: free,
            block_size: self.limits.block_size,
            block_bytes: self.pool.geometry().block_bytes_by_category().0
                + self.pool.geometry().block_bytes_by_category().1,
            live_tokens: self.running.iter().map(|s| s.computed()).sum(),
            bank_entries: self.bank.num_entries(),
            bank_hits: self.bank.counters.hits,
            bank_misses: self.bank.counters.misses,
            bank_hit_tokens: self.bank.counters.hit_tokens,
            bank_evictions: self.bank.counters.evicted_blocks,
            bank_expired_entries: self.bank.counters.expired_entries,
            preemptions: self.counters.preemptions,
            requests_submitted: self.counters.submitted,
            requests_finished: self.counters.finished,
            requests_cancelled: self.counters.cancelled,
            requests_failed: self.counters.failed,
            prompt_tokens: self.counters.prompt_tokens,
            computed_tokens: self.counters.computed_tokens,
            generated_tokens: self.counters.generated_tokens,
            steps: self.counters.steps,
            sampled_full_rows: self.counters.sampled_full_rows,
            sampled_greedy_rows: self.counters.sampled_greedy_rows,
            sampled_top_k_rows: self.counters.sampled_top_k_rows,
            top_k_fallbacks: self.counters.top_k_fallbacks,
            sampling_steps: self.counters.sampling_steps,
            draft_steps: self.counters.draft_steps,
            draft_tokens: self.counters.draft_tokens,
            draft_accepted_tokens: self.counters.draft_accepted,
            drafter: self.drafter.as_ref().map(|d| d.name()),
            draft_blocks_used: self.drafter.as_ref().map_or(0, |d| d.blocks_in_use()),
            sequence_forks: self.counters.forks,
            blocks_shared: self.bank.shared_blocks(&self.pool),
            masks_computed: self.counters.masks,
            mask_seconds: self.counters.mask_nanos as f64 * 1e-9,
            cache: self.pool.stats(),
            group_blocks: crate::metrics::group_blocks(
                self.template.layer_groups(),
                self.running.iter().filter_map(|s| s.cache.as_ref()),
            ),
        };
        *self.metrics.lock().unwrap_or_else(|e| e.into_inner()) = m;
    }
}
