//! `SequenceCache`: the request-sized cache of one sequence over a shared [`KvPool`].
//!
//! It holds the block table (logical block `i` → physical block id, or [`NULL_BLOCK`] once a
//! sliding window has reclaimed it), `offset` (tokens stored in every layer), the reservation
//! and the growth/window policy. Positions are contiguous from 0; the slot of position `p` is
//! `table[p / block_size] * block_size + p % block_size`.
//!
//! Invariants:
//! - `table[..first_live]` are `NULL_BLOCK`, `table[first_live..]` are real blocks this
//!   sequence holds one reference on; `table.len() * block_size ≥ offset`;
//! - block tables only grow at the end; reclamation only nulls entries at the front;
//! - `allocated_blocks() ≤ reserved` unless growth raised `reserved` (a grow event);
//! - a block written to has a single reference (copy-on-write otherwise) and no prefix hash.
//!
//! Mutations follow "plan, then apply": [`SequenceCache::begin_append`] computes a plan
//! (reclaim, copy-on-write, new blocks) without touching anything, checks it against the
//! policy and the pool, and only then applies it — a refused append leaves everything as it was.
//!
//! Appends for T tokens go layer by layer (the forward pass computes layer `l`'s K/V after
//! layer `l-1`'s attention): layer 0 opens the step, every layer writes the same T tokens in
//! order, and the last layer commits (`offset += T`). Between, [`SequenceCache::context_len`]
//! tells attention how many tokens each layer holds.

use std::fmt;

use crate::error::{CacheError, CapacityReason};
use crate::kv_pool::KvPool;
use crate::pages::PageStore;
use crate::pool::NULL_BLOCK;
use crate::stats::CacheCounters;

/// Growth and window policy of one sequence.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SequencePolicy {
    /// Take more blocks when an append does not fit the reservation.
    pub dynamic_growth: bool,
    /// Without a sliding window: the most positions the sequence may hold.
    pub context_window: Option<usize>,
    /// Attention sees at most the last W tokens; blocks no future window reaches are freed.
    pub sliding_window: Option<usize>,
    /// Print the block table on growth, trim and fork.
    pub debug_blocks: bool,
}

impl SequencePolicy {
    pub fn from_config(c: &crate::CacheConfig) -> SequencePolicy {
        SequencePolicy {
            dynamic_growth: c.dynamic_growth,
            context_window: c.context_window,
            sliding_window: c.sliding_window,
            debug_blocks: c.debug_blocks,
        }
    }
}

/// Offset and geometry of a sequence, to roll back to later.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Snapshot {
    pub offset: usize,
    pub block_size: usize,
    pub num_layers: usize,
    pub row_len: usize,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Pending {
    start: usize,
    len: usize,
    next_layer: usize,
}

/// What an append of T tokens must do before writing; computed without side effects.
#[derive(Debug, Default)]
struct AppendPlan {
    /// Logical blocks to reclaim (a front range).
    reclaim_to: usize,
    /// Logical blocks shared with others that this append writes into.
    copy_on_write: Vec<usize>,
    /// New blocks to push onto the table.
    new_blocks: usize,
    /// Whether the reservation grows (a grow event).
    grows: bool,
}

/// The cache of one sequence. See the module docs for the invariants.
#[derive(Debug)]
pub struct SequenceCache {
    /// `[logical blocks]` physical block id, `NULL_BLOCK` for reclaimed ones.
    table: Vec<u32>,
    first_live: usize,
    offset: usize,
    /// Positions `[.., valid_end)` hold written tokens in blocks held since they were written
    /// (`valid_end ≥ offset`); a snapshot may be restored up to here.
    valid_end: usize,
    /// Blocks the sequence may hold without a grow event.
    reserved: usize,
    pending: Option<Pending>,
    policy: SequencePolicy,
    grow_events: u64,
    block_size: usize,
    num_layers: usize,
    /// `num_kv_heads × head_dim` values per token per layer.
    row_len: usize,
    /// `[pending.len]` slots of the open append.
    slots: Vec<u32>,
}

impl SequenceCache {
    /// A sequence reserving room for `reserve_tokens` tokens (rounded up to whole blocks),
    /// taken from the pool now.
    pub fn new<S: PageStore>(
        pool: &mut KvPool<S>,
        policy: SequencePolicy,
        reserve_tokens: usize,
    ) -> Result<SequenceCache, CacheError> {
        let g = pool.geometry();
        let (bs, layers, row) = (g.block_size, g.num_layers, g.num_kv_heads * g.head_dim);
        let n = reserve_tokens.div_ceil(bs);
        let free = pool.blocks().num_free();
        let table = pool.blocks_mut().allocate_many(n).ok_or(CacheError::PoolExhausted { needed: n, free })?;
        Ok(SequenceCache {
            table,
            first_live: 0,
            offset: 0,
            valid_end: 0,
            reserved: n,
            pending: None,
            policy,
            grow_events: 0,
            block_size: bs,
            num_layers: layers,
            row_len: row,
            slots: Vec::new(),
        })
    }

    /// Builds a sequence holding `offset` tokens imported from contiguous arrays:
    /// `keys`/`values` are `[num_layers, offset, num_kv_heads, head_dim]`.
    pub fn from_dense<S: PageStore>(
        pool: &mut KvPool<S>,
        policy: SequencePolicy,
        keys: &[f32],
        values: &[f32],
        offset: usize,
    ) -> Result<SequenceCache, CacheError> {
        let g = pool.geometry();
        let per_layer = offset * g.num_kv_heads * g.head_dim;
        let expected = g.num_layers * per_layer;
        for (what, got) in [("from_dense keys", keys.len()), ("from_dense values", values.len())] {
            if got != expected {
                return Err(CacheError::Shape { what, expected, got });
            }
        }
        let mut seq = SequenceCache::new(pool, policy, offset)?;
        if offset == 0 {
            return Ok(seq);
        }
        if let Err(e) = seq.begin_append(pool, offset) {
            seq.release(pool);
            return Err(e);
        }
        for layer in 0..seq.num_layers {
            let r = layer * per_layer..(layer + 1) * per_layer;
            seq.write_layer(pool, layer, &keys[r.clone()], &values[r])?;
        }
        Ok(seq)
    }

    /// Tokens stored in every layer.
    pub fn offset(&self) -> usize {
        self.offset
    }

    /// Token slots of the blocks held: `allocated_blocks × block_size`.
    pub fn capacity(&self) -> usize {
        self.allocated_blocks() * self.block_size
    }

    /// Blocks this sequence holds a reference on.
    pub fn allocated_blocks(&self) -> usize {
        self.table.len() - self.first_live
    }

    /// Blocks the sequence may hold before it must grow.
    pub fn reserved_blocks(&self) -> usize {
        self.reserved
    }

    pub fn grow_events(&self) -> u64 {
        self.grow_events
    }

    pub fn policy(&self) -> &SequencePolicy {
        &self.policy
    }

    pub fn block_size(&self) -> usize {
        self.block_size
    }

    /// First position still resident (positions before it were reclaimed by the window).
    pub fn live_start(&self) -> usize {
        (self.first_live * self.block_size).min(self.offset)
    }

    /// `[logical blocks]` physical ids; `NULL_BLOCK` marks reclaimed blocks, which kernels
    /// never index because the window keeps them out of reach.
    pub fn block_table(&self) -> &[u32] {
        &self.table
    }

    /// Slot of position `pos` (must be resident).
    pub fn slot(&self, pos: usize) -> u32 {
        let b = self.table[pos / self.block_size];
        debug_assert_ne!(b, NULL_BLOCK, "position {pos} was reclaimed");
        b * self.block_size as u32 + (pos % self.block_size) as u32
    }

    /// Tokens layer `layer` holds now: `offset`, plus the open append's tokens once that
    /// layer has written them. Attention for layer `l` reads `[.., context_len(l))`.
    pub fn context_len(&self, layer: usize) -> usize {
        match self.pending {
            Some(p) if layer < p.next_layer => p.start + p.len,
            _ => self.offset,
        }
    }

    /// The window attention should use for a call asking for `requested`: the smaller of the
    /// request and the sequence's window (reclaimed tokens can never be seen again).
    pub fn attention_window(&self, requested: Option<usize>) -> Option<usize> {
        match (requested, self.policy.sliding_window) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// Positions a query at the newest token sees under `window`: `[start, context_len)`.
    pub fn visible_range(&self, layer: usize, window: Option<usize>) -> std::ops::Range<usize> {
        let end = self.context_len(layer);
        let start = match self.attention_window(window) {
            Some(w) => end.saturating_sub(w),
            None => 0,
        };
        start.max(self.live_start())..end
    }

    /// Appends T tokens to `layer`: `keys`/`values` are `[T, num_kv_heads, head_dim]`. Layer 0
    /// opens the step (taking blocks as needed), layers must follow in order with the same T,
    /// the last one commits. Writes into the pages and returns nothing.
    pub fn append<S: PageStore>(
        &mut self,
        pool: &mut KvPool<S>,
        layer: usize,
        keys: &[f32],
        values: &[f32],
    ) -> Result<(), CacheError> {
        if keys.len() != values.len() || keys.is_empty() || keys.len() % self.row_len != 0 {
            return Err(CacheError::Shape { what: "append keys/values", expected: self.row_len, got: keys.len() });
        }
        let t = keys.len() / self.row_len;
        if self.pending.is_none() {
            if layer != 0 {
                return Err(CacheError::LayerOrder { layer, expected: 0, expected_tokens: t });
            }
            self.begin_append(pool, t)?;
        }
        self.write_layer(pool, layer, keys, values)
    }

    /// Opens an append of `t` tokens: reclaims what the window no longer reaches, copies
    /// shared blocks about to be written, takes new blocks (growing if allowed). Refused
    /// appends change nothing.
    pub fn begin_append<S: PageStore>(&mut self, pool: &mut KvPool<S>, t: usize) -> Result<(), CacheError> {
        if let Some(p) = self.pending {
            return Err(CacheError::AppendInProgress { done: p.next_layer, num_layers: self.num_layers });
        }
        let plan = match self.plan_append(pool, t) {
            Ok(plan) => plan,
            Err(e) => {
                CacheCounters::add(&pool.counters().capacity_errors, 1);
                return Err(e);
            }
        };
        self.apply(pool, plan);
        let start = self.offset;
        self.slots.clear();
        for pos in start..start + t {
            self.slots.push(self.slot(pos));
        }
        self.pending = Some(Pending { start, len: t, next_layer: 0 });
        Ok(())
    }

    /// Slots of the open append, `[T]`, for kernels that write the pages themselves
    /// (the engine path: `begin_append`, kernels write every layer, `commit_append`).
    pub fn pending_slots(&self) -> &[u32] {
        if self.pending.is_some() {
            &self.slots
        } else {
            &[]
        }
    }

    /// Writes the open append's tokens into `layer` (the next layer in order).
    pub fn write_layer<S: PageStore>(
        &mut self,
        pool: &mut KvPool<S>,
        layer: usize,
        keys: &[f32],
        values: &[f32],
    ) -> Result<(), CacheError> {
        let Some(mut p) = self.pending else {
            return Err(CacheError::LayerOrder { layer, expected: 0, expected_tokens: 0 });
        };
        if layer >= self.num_layers {
            return Err(CacheError::LayerOutOfRange { layer, num_layers: self.num_layers });
        }
        if layer != p.next_layer {
            return Err(CacheError::LayerOrder { layer, expected: p.next_layer, expected_tokens: p.len });
        }
        let n = p.len * self.row_len;
        for (what, got) in [("keys", keys.len()), ("values", values.len())] {
            if got != n {
                return Err(CacheError::Shape { what, expected: n, got });
            }
        }
        let (_, pages, counters) = pool.parts_mut();
        pages.write(layer, &self.slots, keys, values);
        CacheCounters::add(&counters.appends, 1);
        p.next_layer += 1;
        self.pending = Some(p);
        if p.next_layer == self.num_layers {
            self.commit_append(pool);
        }
        Ok(())
    }

    /// Commits the open append: `offset += T`. Called by the last `write_layer`, or by the
    /// engine after its kernels wrote every layer through [`Self::pending_slots`].
    pub fn commit_append<S: PageStore>(&mut self, pool: &mut KvPool<S>) {
        if let Some(p) = self.pending.take() {
            self.offset = p.start + p.len;
            self.valid_end = self.valid_end.max(self.offset);
            CacheCounters::add(&pool.counters().tokens_written, p.len as u64);
        }
    }

    /// Abandons the open append: `offset` stays; blocks taken for it stay reserved.
    pub fn cancel_append(&mut self) {
        self.pending = None;
    }

    /// Rolls back the last `n` tokens; blocks left wholly past the new end go back to the pool.
    pub fn trim<S: PageStore>(&mut self, pool: &mut KvPool<S>, n: usize) -> Result<(), CacheError> {
        self.ensure_idle()?;
        let stored = self.offset - self.live_start();
        if n > stored {
            return Err(CacheError::TrimTooFar { requested: n, stored });
        }
        self.offset -= n;
        let keep = self.offset.div_ceil(self.block_size).max(self.first_live);
        self.release_from(pool, keep);
        self.valid_end = self.valid_end.min(keep * self.block_size);
        let c = pool.counters();
        CacheCounters::add(&c.trims, 1);
        CacheCounters::add(&c.trimmed_tokens, n as u64);
        self.debug_print("trim");
        Ok(())
    }

    /// Offset and geometry, to [`Self::restore`] later.
    pub fn snapshot(&self) -> Snapshot {
        Snapshot {
            offset: self.offset,
            block_size: self.block_size,
            num_layers: self.num_layers,
            row_len: self.row_len,
        }
    }

    /// Returns to a snapshot's offset. The positions up to it must still be held: restoring
    /// past what is held (blocks since trimmed away, or never written) or before the window's
    /// reclaimed start is an error. Tokens written since the snapshot at positions below its
    /// offset stay as written.
    pub fn restore(&mut self, snap: &Snapshot) -> Result<(), CacheError> {
        self.ensure_idle()?;
        if (snap.block_size, snap.num_layers, snap.row_len) != (self.block_size, self.num_layers, self.row_len) {
            return Err(CacheError::Geometry(format!(
                "snapshot {snap:?} vs block_size {} layers {} row {}",
                self.block_size, self.num_layers, self.row_len
            )));
        }
        if snap.offset > self.valid_end {
            return Err(CacheError::Restore {
                offset: snap.offset,
                reason: format!("past capacity: only positions up to {} are still held", self.valid_end),
            });
        }
        if snap.offset < self.live_start() {
            return Err(CacheError::Restore {
                offset: snap.offset,
                reason: format!("positions before {} were reclaimed", self.live_start()),
            });
        }
        self.offset = snap.offset;
        Ok(())
    }

    /// A second sequence with the same tokens: blocks holding tokens are shared by reference
    /// count (copied only when either sequence writes into one), the empty reserved tail is
    /// allocated fresh so the fork has the same capacity.
    pub fn fork<S: PageStore>(&self, pool: &mut KvPool<S>) -> Result<SequenceCache, CacheError> {
        self.ensure_idle()?;
        let used = self.offset.div_ceil(self.block_size).max(self.first_live);
        let fresh = self.table.len().saturating_sub(used);
        let free = pool.blocks().num_free();
        let new_blocks =
            pool.blocks_mut().allocate_many(fresh).ok_or(CacheError::PoolExhausted { needed: fresh, free })?;
        let mut table = Vec::with_capacity(self.table.len());
        for &b in &self.table[..used.min(self.table.len())] {
            if b != NULL_BLOCK {
                pool.blocks_mut().retain(b);
            }
            table.push(b);
        }
        table.extend(new_blocks);
        CacheCounters::add(&pool.counters().forks, 1);
        let valid_end = self.valid_end.min(used * self.block_size);
        let fork = SequenceCache { table, valid_end, slots: Vec::new(), pending: None, ..*self };
        fork.debug_print("fork");
        Ok(fork)
    }

    /// Changes the configured sliding window; a smaller one frees what it no longer reaches.
    pub fn set_sliding_window<S: PageStore>(
        &mut self,
        pool: &mut KvPool<S>,
        window: Option<usize>,
    ) -> Result<(), CacheError> {
        self.ensure_idle()?;
        self.policy.sliding_window = window;
        if let Some(w) = window {
            let reclaim_to = self.reclaimable_before(self.offset, w);
            self.reclaim(pool, reclaim_to);
        }
        Ok(())
    }

    /// Returns every block to the pool, tail first (so the tail is evicted first from the
    /// prefix cache).
    pub fn release<S: PageStore>(mut self, pool: &mut KvPool<S>) {
        self.release_from(pool, 0);
    }

    /// Decoded K and V of `layer` at `positions` (`[len, num_kv_heads, head_dim]` each).
    /// For tests and diagnostics only: it allocates and decodes — never use it on the hot
    /// path, where kernels read the pages directly.
    pub fn gather<S: PageStore>(
        &self,
        pool: &KvPool<S>,
        layer: usize,
        positions: std::ops::Range<usize>,
    ) -> Result<(Vec<f32>, Vec<f32>), CacheError> {
        if layer >= self.num_layers {
            return Err(CacheError::LayerOutOfRange { layer, num_layers: self.num_layers });
        }
        let end = self.context_len(layer);
        if positions.start > positions.end || positions.start < self.live_start() || positions.end > end {
            return Err(CacheError::NotResident {
                start: positions.start,
                end: positions.end,
                live_start: self.live_start(),
                offset: end,
            });
        }
        let n = positions.len() * self.row_len;
        let (mut k, mut v) = (vec![0.0; n], vec![0.0; n]);
        for (i, pos) in positions.enumerate() {
            let r = i * self.row_len..(i + 1) * self.row_len;
            pool.pages().read(layer, self.slot(pos), &mut k[r.clone()], &mut v[r]);
        }
        Ok((k, v))
    }

    fn ensure_idle(&self) -> Result<(), CacheError> {
        match self.pending {
            Some(p) => Err(CacheError::AppendInProgress { done: p.next_layer, num_layers: self.num_layers }),
            None => Ok(()),
        }
    }

    /// First logical block a query at `pos` (or later) can reach under window `w`.
    fn reclaimable_before(&self, pos: usize, w: usize) -> usize {
        ((pos + 1).saturating_sub(w) / self.block_size).min(self.table.len())
    }

    fn plan_append<S: PageStore>(&self, pool: &KvPool<S>, t: usize) -> Result<AppendPlan, CacheError> {
        let bs = self.block_size;
        let (p0, end) = (self.offset, self.offset + t);
        if self.policy.sliding_window.is_none() {
            if let Some(c) = self.policy.context_window {
                if end > c {
                    return Err(CacheError::Capacity {
                        required: t,
                        available: c.saturating_sub(p0),
                        reason: CapacityReason::ContextWindow,
                    });
                }
            }
        }
        let blocks = pool.blocks();
        let mut plan = AppendPlan { reclaim_to: self.first_live, ..AppendPlan::default() };
        if let Some(w) = self.policy.sliding_window {
            plan.reclaim_to = self.reclaimable_before(p0, w).max(self.first_live);
        }
        let reclaimed = plan.reclaim_to - self.first_live;
        let freed_by_reclaim =
            self.table[self.first_live..plan.reclaim_to].iter().filter(|&&b| blocks.ref_count(b) == 1).count();
        let needed_len = end.div_ceil(bs);
        for b in (p0 / bs).max(plan.reclaim_to)..needed_len.min(self.table.len()) {
            if blocks.ref_count(self.table[b]) > 1 {
                plan.copy_on_write.push(b);
            }
        }
        let need_new = needed_len.saturating_sub(self.table.len());
        let held_after = self.allocated_blocks() - reclaimed;
        plan.new_blocks = need_new;
        if held_after + need_new > self.reserved {
            if !self.policy.dynamic_growth {
                let slack = self.table.len() * bs - p0;
                let available = slack + self.reserved.saturating_sub(held_after) * bs;
                return Err(CacheError::Capacity { required: t, available, reason: CapacityReason::GrowthDisabled });
            }
            plan.grows = true;
            if self.policy.sliding_window.is_none() {
                // About 1.5x the current count, at least what is needed, capped by the
                // context window and by what the pool can give.
                let target = (self.allocated_blocks() * 3).div_ceil(2).max(held_after + need_new);
                let mut extra = target - held_after;
                if let Some(c) = self.policy.context_window {
                    extra = extra.min(c.div_ceil(bs).saturating_sub(self.table.len()));
                }
                let spare = (blocks.num_free() + freed_by_reclaim).saturating_sub(plan.copy_on_write.len());
                plan.new_blocks = extra.min(spare).max(need_new);
            }
        }
        let needed_from_pool = plan.new_blocks + plan.copy_on_write.len();
        let free = blocks.num_free() + freed_by_reclaim;
        if needed_from_pool > free {
            return Err(CacheError::PoolExhausted { needed: needed_from_pool, free });
        }
        Ok(plan)
    }

    fn apply<S: PageStore>(&mut self, pool: &mut KvPool<S>, plan: AppendPlan) {
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
        // Blocks about to be written lose any prefix hash: their contents change.
        let first_written = (self.offset / self.block_size).max(self.first_live);
        for &b in &self.table[first_written..] {
            blocks.unregister(b);
        }
        for _ in 0..plan.new_blocks {
            self.table.push(blocks.allocate().expect("planned against free blocks"));
        }
        if plan.grows {
            self.reserved = self.reserved.max(self.allocated_blocks());
            self.grow_events += 1;
            CacheCounters::add(&counters.grow_events, 1);
            self.debug_print("grow");
        }
        debug_assert!(self.table.len() * self.block_size >= self.offset);
    }

    /// Frees logical blocks `[first_live, to)`.
    fn reclaim<S: PageStore>(&mut self, pool: &mut KvPool<S>, to: usize) {
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

    /// Frees logical blocks `[keep, len)`, tail first, and truncates the table.
    fn release_from<S: PageStore>(&mut self, pool: &mut KvPool<S>, keep: usize) {
        let blocks = pool.blocks_mut();
        while self.table.len() > keep {
            let b = self.table.pop().expect("len > keep");
            if b != NULL_BLOCK {
                blocks.release(b);
            }
        }
        self.first_live = self.first_live.min(self.table.len());
    }

    fn debug_print(&self, event: &str) {
        if self.policy.debug_blocks {
            eprintln!("[pagekv blocks] {event}: {self}");
        }
    }
}

/// ASCII block table: `offset=37 cap=48 |  3:16 |  7:16 |  9: 5 | 12: 0 |`, reclaimed as ` -- `.
impl fmt::Display for SequenceCache {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "offset={} cap={} reserved={} grows={} |",
            self.offset,
            self.capacity(),
            self.reserved,
            self.grow_events
        )?;
        for (i, &b) in self.table.iter().enumerate() {
            let filled = self.offset.saturating_sub(i * self.block_size).min(self.block_size);
            if b == NULL_BLOCK {
                write!(f, "  --  |")?;
            } else {
                write!(f, "{b:>4}:{filled:>2}|")?;
            }
        }
        Ok(())
    }
}
