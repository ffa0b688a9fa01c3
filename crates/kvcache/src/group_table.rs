//! `GroupTable`: the block table of one layer group within a sequence, and what an append
//! must do to it (planned without side effects, then applied).
//!
//! Invariants (per group):
//! - `table[..first_live]` are `NULL_BLOCK`, `table[first_live..]` are real blocks the
//!   sequence holds one reference on; `table.len() * block_size ≥ offset`;
//! - the table only grows at the end; reclamation only nulls entries at the front;
//! - a sliding group ([`GroupKind::Sliding`]) holds at most `⌈W / block_size⌉ + 1` blocks
//!   between steps (`⌈W / block_size⌉ + ⌈m / block_size⌉ + 1` with the policy's trim margin `m`): it reclaims before an append and again when the append commits. It keeps
//!   what a query at the start of its last block reaches (not just one at the newest
//!   position: the bound is the same), so the sequence can still be cut back to that block
//!   boundary — which is where the session bank forks a prefix.

use crate::groups::GroupKind;
use crate::kv_pool::KvPool;
use crate::pages::PageStore;
use crate::policy::SequencePolicy;
use crate::pool::{BlockPool, NULL_BLOCK};
use crate::stats::CacheCounters;

/// One group's blocks.
#[derive(Clone, Debug)]
pub(crate) struct GroupTable {
    /// `[logical blocks]` physical block id, `NULL_BLOCK` for reclaimed ones.
    pub(crate) table: Vec<u32>,
    pub(crate) first_live: usize,
    /// Blocks the group may hold without a grow event (full groups; a sliding group is bounded
    /// by its window instead).
    pub(crate) reserved: usize,
    pub(crate) kind: GroupKind,
}

/// What an append does to one group; computed without side effects.
#[derive(Debug, Default)]
pub(crate) struct GroupPlan {
    /// Logical blocks to reclaim (a front range `[first_live, reclaim_to)`).
    pub(crate) reclaim_to: usize,
    /// Logical blocks shared with others that this append writes into.
    pub(crate) copy_on_write: Vec<usize>,
    /// New blocks to push onto the table.
    pub(crate) new_blocks: usize,
    /// Whether the reservation grows (a grow event).
    pub(crate) grows: bool,
    /// Blocks the reclaim returns to the pool (held by no one else).
    pub(crate) freed_by_reclaim: usize,
    /// The most blocks growth would like beyond `new_blocks`, if the pool can give them.
    pub(crate) growth_extra: usize,
}

impl GroupTable {
    /// Blocks held.
    pub(crate) fn allocated(&self) -> usize {
        self.table.len() - self.first_live
    }

    /// The window that frees this group's blocks: its own (sliding groups), narrowed by the
    /// sequence's whole-sequence window `seq_window`.
    pub(crate) fn window(&self, seq_window: Option<usize>) -> Option<usize> {
        match (self.kind.window(), seq_window) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    pub(crate) fn is_sliding(&self) -> bool {
        matches!(self.kind, GroupKind::Sliding { .. })
    }

    /// First logical block a query at `pos` (or later) can reach under window `w`.
    pub(crate) fn reclaimable_before(&self, pos: usize, w: usize, bs: usize) -> usize {
        ((pos + 1).saturating_sub(w) / bs).min(self.table.len())
    }

    /// The position whose reach bounds what a reclaim at `offset` frees: `offset` itself for
    /// a whole-sequence window (as ever), the start of its block for a sliding group.
    fn reclaim_pos(&self, offset: usize, bs: usize) -> usize {
        if self.is_sliding() {
            offset / bs * bs
        } else {
            offset
        }
    }

    /// First logical block a continuation from `offset` keeps: what a reclaim at `offset`
    /// leaves (0 without a window).
    pub(crate) fn first_reachable(&self, offset: usize, seq_window: Option<usize>, bs: usize) -> usize {
        self.window(seq_window).map_or(0, |w| self.reclaimable_before(self.reclaim_pos(offset, bs), w, bs))
    }

    /// Whether a sliding group still holds the whole window of a query at `pos` (the tokens
    /// `[pos + 1 - W, pos)`), so the sequence can continue from `pos`. Full groups: always.
    pub(crate) fn holds_window_at(&self, pos: usize, seq_window: Option<usize>, bs: usize) -> bool {
        match (self.is_sliding(), self.window(seq_window)) {
            (true, Some(w)) => self.first_live <= (pos + 1).saturating_sub(w) / bs,
            _ => true,
        }
    }

    /// Plans an append of positions `[p0, p0 + t)`. `Err(available)`: the reservation is
    /// full and growth is off; `available` tokens would still fit.
    pub(crate) fn plan(
        &self,
        blocks: &BlockPool,
        p0: usize,
        t: usize,
        bs: usize,
        policy: &SequencePolicy,
    ) -> Result<GroupPlan, usize> {
        let (seq_window, dynamic_growth, context_window) =
            (policy.sliding_window, policy.dynamic_growth, policy.context_window);
        let end = p0 + t;
        let mut plan = GroupPlan { reclaim_to: self.first_live, ..GroupPlan::default() };
        if let Some(w) = self.window(seq_window) {
            let pos = self.reclaim_pos(p0.saturating_sub(policy.trim_margin), bs);
            plan.reclaim_to = self.reclaimable_before(pos, w, bs).max(self.first_live);
        }
        let reclaimed = plan.reclaim_to - self.first_live;
        plan.freed_by_reclaim =
            self.table[self.first_live..plan.reclaim_to].iter().filter(|&&b| blocks.ref_count(b) == 1).count();
        let needed_len = end.div_ceil(bs);
        for b in (p0 / bs).max(plan.reclaim_to)..needed_len.min(self.table.len()) {
            if blocks.ref_count(self.table[b]) > 1 {
                plan.copy_on_write.push(b);
            }
        }
        let need_new = needed_len.saturating_sub(self.table.len());
        let held_after = self.allocated() - reclaimed;
        plan.new_blocks = need_new;
        if !self.is_sliding() && held_after + need_new > self.reserved {
            if !dynamic_growth {
                let slack = self.table.len() * bs - p0;
                return Err(slack + self.reserved.saturating_sub(held_after) * bs);
            }
            plan.grows = true;
            if seq_window.is_none() {
                // About 1.5x the current count, at least what is needed, capped by the
                // context window; the caller caps it by what the pool can give.
                let target = (self.allocated() * 3).div_ceil(2).max(held_after + need_new);
                let mut extra = target - held_after;
                if let Some(c) = context_window {
                    extra = extra.min(c.div_ceil(bs).saturating_sub(self.table.len()));
                }
                plan.growth_extra = extra.saturating_sub(need_new);
            }
        }
        Ok(plan)
    }

    /// Applies a plan (checked against the pool by the caller). Returns whether it grew.
    pub(crate) fn apply<S: PageStore>(&mut self, pool: &mut KvPool<S>, plan: &GroupPlan) -> bool {
        self.reclaim(pool, plan.reclaim_to);
        let (blocks, pages, counters) = pool.parts_mut();
        for &b in &plan.copy_on_write {
            let old = self.table[b];
            let new = blocks.allocate().expect("planned against free blocks");
            pages.copy_block(old, new);
            blocks.release(old);
            self.table[b] = new;
            CacheCounters::add(&counters.cow_copies, 1);
        }
        for _ in 0..plan.new_blocks {
            self.table.push(blocks.allocate().expect("planned against free blocks"));
        }
        if plan.grows {
            self.reserved = self.reserved.max(self.allocated());
        }
        plan.grows
    }

    /// Frees logical blocks `[first_live, to)`.
    pub(crate) fn reclaim<S: PageStore>(&mut self, pool: &mut KvPool<S>, to: usize) {
        if to <= self.first_live {
            return;
        }
        let (blocks, _, counters) = pool.parts_mut();
        for b in self.first_live..to {
            blocks.release(self.table[b]);
            self.table[b] = NULL_BLOCK;
        }
        CacheCounters::add(&counters.reclaimed_blocks, (to - self.first_live) as u64);
        self.first_live = to;
    }

    /// Frees what no query at `offset − margin` or later can reach under the group's window
    /// (if any): a trim of up to `margin` tokens keeps the window whole.
    pub(crate) fn reclaim_window<S: PageStore>(
        &mut self,
        pool: &mut KvPool<S>,
        offset: usize,
        margin: usize,
        seq_window: Option<usize>,
        bs: usize,
    ) {
        if let Some(w) = self.window(seq_window) {
            let to = self.reclaimable_before(self.reclaim_pos(offset.saturating_sub(margin), bs), w, bs);
            self.reclaim(pool, to);
        }
    }

    /// Frees logical blocks `[keep, len)`, tail first, and truncates the table.
    pub(crate) fn release_from(&mut self, blocks: &mut BlockPool, keep: usize) {
        while self.table.len() > keep {
            let b = self.table.pop().expect("len > keep");
            if b != NULL_BLOCK {
                blocks.release(b);
            }
        }
        self.first_live = self.first_live.min(self.table.len());
    }

    /// The table of a fork holding the first `used` logical blocks shared and `fresh` new
    /// blocks after them (the caller took references and blocks).
    pub(crate) fn fork(&self, blocks: &mut BlockPool, used: usize, fresh: Vec<u32>) -> GroupTable {
        let mut table = Vec::with_capacity(self.table.len());
        for &b in &self.table[..used.min(self.table.len())] {
            if b != NULL_BLOCK {
                blocks.retain(b);
            }
            table.push(b);
        }
        table.extend(fresh);
        GroupTable { table, ..self.clone_meta() }
    }

    fn clone_meta(&self) -> GroupTable {
        GroupTable { table: Vec::new(), first_live: self.first_live, reserved: self.reserved, kind: self.kind }
    }

    /// `|  3:16 |  7:16 |  9: 5 |`, reclaimed blocks as `  --  `.
    pub(crate) fn fmt_table(&self, f: &mut std::fmt::Formatter<'_>, offset: usize, bs: usize) -> std::fmt::Result {
        for (i, &b) in self.table.iter().enumerate() {
            let filled = offset.saturating_sub(i * bs).min(bs);
            if b == NULL_BLOCK {
                write!(f, "  --  |")?;
            } else {
                write!(f, "{b:>4}:{filled:>2}|")?;
            }
        }
        Ok(())
    }
}
