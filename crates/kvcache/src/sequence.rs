//! `SequenceCache`: the request-sized cache of one sequence over a shared [`KvPool`].
//!
//! It holds one block table per layer group ([`crate::LayerGroups`]; logical block `i` →
//! physical block id, or [`NULL_BLOCK`] once a sliding window has reclaimed it), `offset`
//! (tokens stored in every layer), the reservation and the growth/window policy. Positions are
//! contiguous from 0; the slot of position `p` in group `g` is
//! `table_g[p / block_size] * block_size + p % block_size`. A one-group cache (every model
//! with one attention type) is exactly the cache without groups.
//!
//! Invariants (per group, see `group_table.rs`; a sliding group also frees what its window
//! left when an append commits, so it holds at most `⌈W / block_size⌉ + 1` blocks between
//! steps):
//! - `table[..first_live]` are `NULL_BLOCK`, `table[first_live..]` are real blocks this
//!   sequence holds one reference on; `table.len() * block_size ≥ offset`;
//! - block tables only grow at the end; reclamation only nulls entries at the front;
//! - `allocated_blocks() ≤ reserved` unless growth raised `reserved` (a grow event);
//! - a block written to has a single reference (copy-on-write otherwise).
//!
//! Mutations follow "plan, then apply": [`SequenceCache::begin_append`] computes a plan
//! (reclaim, copy-on-write, new blocks, for every group) without touching anything, checks it
//! against the policy and the pool, and only then applies it — a refused append leaves
//! everything as it was.
//!
//! Appends for T tokens go layer by layer (the forward pass computes layer `l`'s K/V after
//! layer `l-1`'s attention): layer 0 opens the step, every layer writes the same T tokens in
//! order, and the last layer commits (`offset += T`). Between, [`SequenceCache::context_len`]
//! tells attention how many tokens each layer holds.

use std::fmt;
use std::sync::Arc;

use crate::error::{CacheError, CapacityReason};
use crate::group_table::{GroupPlan, GroupTable};
use crate::groups::{GroupKind, LayerGroups};
use crate::kv_pool::KvPool;
use crate::pages::PageStore;
use crate::policy::SequencePolicy;
use crate::pool::NULL_BLOCK;
use crate::stats::CacheCounters;

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

/// The cache of one sequence. See the module docs for the invariants.
#[derive(Debug)]
pub struct SequenceCache {
    /// `[groups]` one block table per layer group.
    groups: Vec<GroupTable>,
    /// Which group and page plane each layer uses (shared with the pool).
    layout: Arc<LayerGroups>,
    offset: usize,
    /// Positions `[.., valid_end)` hold written tokens in blocks held since they were written
    /// (`valid_end ≥ offset`); a snapshot may be restored up to here.
    valid_end: usize,
    pending: Option<Pending>,
    policy: SequencePolicy,
    grow_events: u64,
    block_size: usize,
    num_layers: usize,
    /// `num_kv_heads × head_dim` values per token per layer.
    row_len: usize,
    /// `[groups][pending.len]` slots of the open append.
    slots: Vec<u32>,
}

impl SequenceCache {
    /// A sequence reserving room for `reserve_tokens` tokens (rounded up to whole blocks) in
    /// every group — a sliding group at most its window's `⌈W / block_size⌉ + 1` blocks —
    /// taken from the pool now.
    pub fn new<S: PageStore>(
        pool: &mut KvPool<S>,
        policy: SequencePolicy,
        reserve_tokens: usize,
    ) -> Result<SequenceCache, CacheError> {
        let mut seq = SequenceCache::reserving(pool, policy, reserve_tokens);
        let needed = seq.groups.iter().map(|g| g.reserved).sum();
        let free = pool.blocks().num_free();
        let mut ids = pool.blocks_mut().allocate_many(needed).ok_or(CacheError::PoolExhausted { needed, free })?;
        for g in seq.groups.iter_mut().rev() {
            g.table = ids.split_off(ids.len() - g.reserved);
        }
        Ok(seq)
    }

    /// A sequence holding no block yet that may take `reserve_tokens` tokens' worth of blocks
    /// per group (a sliding group: at most its window's) without a grow event — the engine's
    /// template, forked for each request.
    pub fn reserving<S: PageStore>(pool: &KvPool<S>, policy: SequencePolicy, reserve_tokens: usize) -> SequenceCache {
        let g = pool.geometry();
        let (bs, row) = (g.block_size, g.num_kv_heads * g.head_dim);
        let layout = pool.groups().clone();
        let n = reserve_tokens.div_ceil(bs);
        let groups = layout
            .kinds()
            .iter()
            .map(|&kind| {
                let reserved = kind.window().map_or(n, |w| n.min(LayerGroups::sliding_cap(w, bs)));
                GroupTable { table: Vec::new(), first_live: 0, reserved, kind }
            })
            .collect();
        SequenceCache {
            groups,
            num_layers: layout.num_layers(),
            layout,
            offset: 0,
            valid_end: 0,
            pending: None,
            policy,
            grow_events: 0,
            block_size: bs,
            row_len: row,
            slots: Vec::new(),
        }
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
        let num_layers = pool.groups().num_layers();
        let per_layer = offset * g.num_kv_heads * g.head_dim;
        let expected = num_layers * per_layer;
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

    /// Token slots of the blocks held, over every group: `allocated_blocks × block_size`.
    pub fn capacity(&self) -> usize {
        self.allocated_blocks() * self.block_size
    }

    /// Blocks this sequence holds a reference on, over every group.
    pub fn allocated_blocks(&self) -> usize {
        self.groups.iter().map(GroupTable::allocated).sum()
    }

    /// `[groups]` blocks held in each group.
    pub fn group_blocks(&self) -> impl Iterator<Item = usize> + '_ {
        self.groups.iter().map(GroupTable::allocated)
    }

    /// Blocks the sequence may hold before it must grow (the largest group's reservation).
    pub fn reserved_blocks(&self) -> usize {
        self.groups.iter().map(|g| g.reserved).max().unwrap_or(0)
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

    /// The layer groups this sequence's tables follow.
    pub fn layer_groups(&self) -> &LayerGroups {
        &self.layout
    }

    pub fn num_groups(&self) -> usize {
        self.groups.len()
    }

    /// First position still resident in every group (positions before it were reclaimed by a
    /// window in at least one group).
    pub fn live_start(&self) -> usize {
        (0..self.groups.len()).map(|g| self.group_live_start(g)).max().unwrap_or(0)
    }

    /// First position still resident in `group`.
    pub fn group_live_start(&self, group: usize) -> usize {
        (self.groups[group].first_live * self.block_size).min(self.offset)
    }

    /// `[logical blocks]` physical ids of group 0 (the only group of a one-group cache);
    /// `NULL_BLOCK` marks reclaimed blocks, which kernels never index because the window
    /// keeps them out of reach.
    pub fn block_table(&self) -> &[u32] {
        &self.groups[0].table
    }

    /// `[logical blocks]` physical ids of `group`.
    pub fn group_table(&self, group: usize) -> &[u32] {
        &self.groups[group].table
    }

    /// `[groups][logical blocks]` every group's table, in group order.
    pub fn block_tables(&self) -> impl Iterator<Item = &[u32]> + '_ {
        self.groups.iter().map(|g| g.table.as_slice())
    }

    /// Blocks (over all groups) that hold the sequence's tokens `[0, offset)`: not the ones a
    /// sliding group has freed, nor the reserved tail growth took beyond the tokens. Times the
    /// pool's bytes per block, the KV the tokens keep resident.
    pub fn blocks_holding_tokens(&self) -> usize {
        let used = self.offset.div_ceil(self.block_size);
        self.block_tables().map(|t| t[..used.min(t.len())].iter().filter(|&&b| b != NULL_BLOCK).count()).sum()
    }

    /// Slot of position `pos` in group 0 (must be resident).
    pub fn slot(&self, pos: usize) -> u32 {
        self.group_slot(0, pos)
    }

    /// Slot of position `pos` in `group` (must be resident).
    pub fn group_slot(&self, group: usize, pos: usize) -> u32 {
        let b = self.groups[group].table[pos / self.block_size];
        debug_assert_ne!(b, NULL_BLOCK, "position {pos} was reclaimed in group {group}");
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

    /// Positions a query at the newest token of `layer` sees under `window` (narrowed by the
    /// layer's group window): `[start, context_len)`.
    pub fn visible_range(&self, layer: usize, window: Option<usize>) -> std::ops::Range<usize> {
        let end = self.context_len(layer);
        let (g, _) = self.layout.locate(layer);
        let window = match (self.attention_window(window), self.groups[g].kind.window()) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        let start = match window {
            Some(w) => end.saturating_sub(w),
            None => 0,
        };
        start.max(self.group_live_start(g))..end
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
        if keys.len() != values.len() || keys.is_empty() || !keys.len().is_multiple_of(self.row_len) {
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
    /// shared blocks about to be written, takes new blocks (growing if allowed), in every
    /// group. Refused appends change nothing.
    pub fn begin_append<S: PageStore>(&mut self, pool: &mut KvPool<S>, t: usize) -> Result<(), CacheError> {
        if let Some(p) = self.pending {
            return Err(CacheError::AppendInProgress { done: p.next_layer, num_layers: self.num_layers });
        }
        let plans = match self.plan_append(pool, t) {
            Ok(plans) => plans,
            Err(e) => {
                CacheCounters::add(&pool.counters().capacity_errors, 1);
                return Err(e);
            }
        };
        let (p0, bs) = (self.offset, self.block_size);
        let mut grew = false;
        for (g, plan) in self.groups.iter_mut().zip(&plans) {
            grew |= g.apply(pool, plan);
            debug_assert!(g.table.len() * bs >= p0 + t);
        }
        if grew {
            self.grow_events += 1;
            CacheCounters::add(&pool.counters().grow_events, 1);
            self.debug_print("grow");
        }
        self.slots.clear();
        for g in 0..self.groups.len() {
            for pos in p0..p0 + t {
                let slot = self.group_slot(g, pos);
                self.slots.push(slot);
            }
        }
        // Copy-on-write above: every block this append writes is this sequence's alone, so a
        // fork sharing the rest of the tables never sees the write.
        debug_assert_eq!(self.copy_on_write_blocks(pool, t), 0, "an append writes into a shared block");
        self.pending = Some(Pending { start: p0, len: t, next_layer: 0 });
        Ok(())
    }

    /// Slots of the open append, `[groups][T]` (group after group; `[T]` for one group), for
    /// kernels that write the pages themselves (the engine path: `begin_append`, kernels write
    /// every layer, `commit_append`).
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
        let (g, plane) = self.layout.locate(layer);
        let (_, pages, counters) = pool.parts_mut();
        pages.write(plane, &self.slots[g * p.len..(g + 1) * p.len], keys, values);
        CacheCounters::add(&counters.appends, 1);
        p.next_layer += 1;
        self.pending = Some(p);
        if p.next_layer == self.num_layers {
            self.commit_append(pool);
        }
        Ok(())
    }

    /// Commits the open append: `offset += T`; sliding groups then free the blocks no later
    /// query can reach. Called by the last `write_layer`, or by the engine after its kernels
    /// wrote every layer through [`Self::pending_slots`].
    pub fn commit_append<S: PageStore>(&mut self, pool: &mut KvPool<S>) {
        if let Some(p) = self.pending.take() {
            self.offset = p.start + p.len;
            self.valid_end = self.valid_end.max(self.offset);
            CacheCounters::add(&pool.counters().tokens_written, p.len as u64);
            for g in self.groups.iter_mut().filter(|g| g.is_sliding()) {
                g.reclaim_window(
                    pool,
                    self.offset,
                    self.policy.trim_margin,
                    self.policy.sliding_window,
                    self.block_size,
                );
            }
        }
    }

    /// Abandons the open append: `offset` stays; blocks taken for it stay reserved.
    pub fn cancel_append(&mut self) {
        self.pending = None;
    }

    /// Blocks an append of `t` tokens takes from the pool beyond the tables' ends, over every
    /// group (what the scheduler admits by; growth beyond need and copy-on-write are not
    /// counted). A sliding group's reclaim happens at the previous commit, so it frees nothing
    /// here: this never underestimates.
    pub fn blocks_needed(&self, t: usize) -> usize {
        let end = (self.offset + t).div_ceil(self.block_size);
        self.groups.iter().map(|g| end.saturating_sub(g.table.len())).sum()
    }

    /// The most tokens an append can take with `spare` blocks from the pool
    /// ([`Self::blocks_needed`] `≤ spare`): the tables' slack plus `spare × block_size` for
    /// one group.
    pub fn tokens_fitting(&self, spare: usize) -> usize {
        // blocks_needed grows with t: binary search up to the one-group bound.
        let (mut lo, mut hi) = (0usize, self.slack_tokens() + spare * self.block_size);
        while lo < hi {
            let mid = (lo + hi).div_ceil(2);
            if self.blocks_needed(mid) <= spare {
                lo = mid;
            } else {
                hi = mid - 1;
            }
        }
        lo
    }

    /// Tokens the sequence can append without taking a block from the pool: the slack of its
    /// tables' last blocks (the smallest over groups).
    pub fn slack_tokens(&self) -> usize {
        self.groups.iter().map(|g| (g.table.len() * self.block_size).saturating_sub(self.offset)).min().unwrap_or(0)
    }

    /// Whether [`Self::trim`] can cut the sequence back to `pos` tokens: they are held, and
    /// every sliding group still holds the window of a query at `pos`.
    pub fn can_cut_to(&self, pos: usize) -> bool {
        pos <= self.offset && pos >= self.live_start() && self.holds_windows_at(pos)
    }

    /// Rolls back the last `n` tokens; blocks left wholly past the new end go back to the pool.
    /// A sliding group must still hold the window of the new end.
    pub fn trim<S: PageStore>(&mut self, pool: &mut KvPool<S>, n: usize) -> Result<(), CacheError> {
        self.ensure_idle()?;
        let stored = self.offset - self.live_start();
        let end = self.offset.saturating_sub(n);
        if n > stored || !self.holds_windows_at(end) {
            return Err(CacheError::TrimTooFar { requested: n, stored });
        }
        self.offset = end;
        let bs = self.block_size;
        let blocks = pool.blocks_mut();
        for g in &mut self.groups {
            let keep = end.div_ceil(bs).max(g.first_live);
            g.release_from(blocks, keep);
            self.valid_end = self.valid_end.min(keep * bs);
        }
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
    /// past what is held (blocks since trimmed away, or never written), before the window's
    /// reclaimed start, or where a sliding group no longer holds the window is an error.
    /// Tokens written since the snapshot at positions below its offset stay as written.
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
        if snap.offset < self.live_start() || !self.holds_windows_at(snap.offset) {
            return Err(CacheError::Restore {
                offset: snap.offset,
                reason: format!("positions before {} were reclaimed", self.live_start()),
            });
        }
        self.offset = snap.offset;
        Ok(())
    }

    /// Blocks shared with another holder (reference count above 1) that appending `t` tokens
    /// would copy first: a planning aid for schedulers that promise blocks before appending
    /// (a fork's partly filled last block is the usual one).
    pub fn copy_on_write_blocks<S: PageStore>(&self, pool: &KvPool<S>, t: usize) -> usize {
        if t == 0 {
            return 0;
        }
        let bs = self.block_size;
        let blocks = pool.blocks();
        self.groups
            .iter()
            .map(|g| {
                let first = (self.offset / bs).max(g.first_live);
                let end = (self.offset + t).div_ceil(bs).min(g.table.len());
                g.table.get(first..end).map_or(0, |written| {
                    written.iter().filter(|&&b| b != NULL_BLOCK && blocks.ref_count(b) > 1).count()
                })
            })
            .sum()
    }

    /// A second sequence with the same tokens: blocks holding tokens are shared by reference
    /// count (copied only when either sequence writes into one), the empty reserved tail is
    /// allocated fresh so the fork has the same capacity.
    pub fn fork<S: PageStore>(&self, pool: &mut KvPool<S>) -> Result<SequenceCache, CacheError> {
        self.ensure_idle()?;
        let used_of = |g: &GroupTable| self.offset.div_ceil(self.block_size).max(g.first_live);
        let fresh: usize = self.groups.iter().map(|g| g.table.len().saturating_sub(used_of(g))).sum();
        let free = pool.blocks().num_free();
        let mut new_blocks =
            pool.blocks_mut().allocate_many(fresh).ok_or(CacheError::PoolExhausted { needed: fresh, free })?;
        let mut groups = Vec::with_capacity(self.groups.len());
        let mut valid_end = self.valid_end;
        for g in &self.groups {
            let used = used_of(g);
            let n = g.table.len().saturating_sub(used);
            let rest = new_blocks.split_off(n);
            groups.push(g.fork(pool.blocks_mut(), used, std::mem::replace(&mut new_blocks, rest)));
            valid_end = valid_end.min(used * self.block_size);
        }
        CacheCounters::add(&pool.counters().forks, 1);
        let fork =
            SequenceCache { groups, layout: self.layout.clone(), valid_end, slots: Vec::new(), pending: None, ..*self };
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
        for g in &mut self.groups {
            g.reclaim_window(pool, self.offset, self.policy.trim_margin, window, self.block_size);
        }
        Ok(())
    }

    /// Returns every block to the pool, tail first (so the tail is reallocated first), group
    /// after group from the last.
    pub fn release<S: PageStore>(mut self, pool: &mut KvPool<S>) {
        for g in self.groups.iter_mut().rev() {
            g.release_from(pool.blocks_mut(), 0);
        }
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
        let (g, plane) = self.layout.locate(layer);
        let end = self.context_len(layer);
        let live = self.group_live_start(g);
        if positions.start > positions.end || positions.start < live || positions.end > end {
            return Err(CacheError::NotResident {
                start: positions.start,
                end: positions.end,
                live_start: live,
                offset: end,
            });
        }
        let n = positions.len() * self.row_len;
        let (mut k, mut v) = (vec![0.0; n], vec![0.0; n]);
        for (i, pos) in positions.enumerate() {
            let r = i * self.row_len..(i + 1) * self.row_len;
            pool.pages().read(plane, self.group_slot(g, pos), &mut k[r.clone()], &mut v[r]);
        }
        Ok((k, v))
    }

    /// `[groups]` each sliding group's window (`None` for the others): what a continuation
    /// from a position must still hold (see [`Self::can_cut_to`]).
    pub(crate) fn sliding_windows(&self) -> Vec<Option<usize>> {
        self.groups.iter().map(|g| g.window(self.policy.sliding_window).filter(|_| g.is_sliding())).collect()
    }

    /// A sequence with this one's policy and reservation holding the first `tokens` tokens of a
    /// prefix's `[groups][blocks]` tables (checked by the caller: `crate::prefix`); `take` is
    /// called on every block it keeps (a windowed group keeps only what a query at `tokens`
    /// reaches).
    pub(crate) fn adopt(&self, tables: &[Vec<u32>], tokens: usize, mut take: impl FnMut(u32)) -> SequenceCache {
        let bs = self.block_size;
        let used = tokens.div_ceil(bs);
        let groups = self
            .groups
            .iter()
            .enumerate()
            .map(|(g, t)| {
                let table = &tables[g][..used];
                let live = table.iter().take_while(|&&b| b == NULL_BLOCK).count();
                let mut gt = GroupTable { table: table.to_vec(), first_live: 0, reserved: t.reserved, kind: t.kind };
                let start = gt.first_reachable(tokens, self.policy.sliding_window, bs).max(live).min(used);
                gt.table[..start].fill(NULL_BLOCK);
                gt.table[start..].iter().for_each(|&b| take(b));
                gt.first_live = start;
                gt
            })
            .collect();
        let seq = SequenceCache {
            groups,
            layout: self.layout.clone(),
            offset: tokens,
            valid_end: tokens,
            pending: None,
            grow_events: 0,
            slots: Vec::new(),
            ..*self
        };
        seq.debug_print("start from prefix");
        seq
    }

    fn ensure_idle(&self) -> Result<(), CacheError> {
        match self.pending {
            Some(p) => Err(CacheError::AppendInProgress { done: p.next_layer, num_layers: self.num_layers }),
            None => Ok(()),
        }
    }

    /// Whether every sliding group holds the window of a query at `pos`.
    fn holds_windows_at(&self, pos: usize) -> bool {
        self.groups.iter().all(|g| g.holds_window_at(pos, self.policy.sliding_window, self.block_size))
    }

    fn plan_append<S: PageStore>(&self, pool: &KvPool<S>, t: usize) -> Result<Vec<GroupPlan>, CacheError> {
        let (p0, end) = (self.offset, self.offset + t);
        let policy = &self.policy;
        if policy.sliding_window.is_none() {
            if let Some(c) = policy.context_window {
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
        let mut plans = Vec::with_capacity(self.groups.len());
        for g in &self.groups {
            let plan = g.plan(blocks, p0, t, self.block_size, policy).map_err(|available| CacheError::Capacity {
                required: t,
                available,
                reason: CapacityReason::GrowthDisabled,
            })?;
            plans.push(plan);
        }
        let minimum: usize = plans.iter().map(|p| p.new_blocks + p.copy_on_write.len()).sum();
        let free = blocks.num_free() + plans.iter().map(|p| p.freed_by_reclaim).sum::<usize>();
        // Growth takes what the pool can spare beyond every group's minimum.
        let mut spare = free.saturating_sub(minimum);
        for p in &mut plans {
            let extra = p.growth_extra.min(spare);
            p.new_blocks += extra;
            spare -= extra;
        }
        let needed: usize = plans.iter().map(|p| p.new_blocks + p.copy_on_write.len()).sum();
        if needed > free {
            return Err(CacheError::PoolExhausted { needed, free });
        }
        Ok(plans)
    }

    fn debug_print(&self, event: &str) {
        if self.policy.debug_blocks {
            eprintln!("[pagekv blocks] {event}: {self}");
        }
    }
}

/// ASCII block table: `offset=37 cap=48 |  3:16 |  7:16 |  9: 5 | 12: 0 |`, reclaimed as
/// `  --  `; with several groups, one line per group after the header
/// (`full  |...|` or `w512  |...|`).
impl fmt::Display for SequenceCache {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "offset={} cap={} reserved={} grows={} |",
            self.offset,
            self.capacity(),
            self.reserved_blocks(),
            self.grow_events
        )?;
        if let [only] = self.groups.as_slice() {
            return only.fmt_table(f, self.offset, self.block_size);
        }
        for (i, g) in self.groups.iter().enumerate() {
            match g.kind {
                GroupKind::Full => write!(f, "\n  g{i} full |")?,
                GroupKind::Sliding { window } => write!(f, "\n  g{i} w{window} |")?,
            }
            g.fmt_table(f, self.offset, self.block_size)?;
        }
        Ok(())
    }
}
