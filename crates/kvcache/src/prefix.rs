//! `PrefixBlocks`: a cached prefix as bare block ids — what the engine's session bank keeps of
//! a finished (or preempted) sequence — and the two ways a sequence starts from one.
//!
//! A prefix holds, per layer group, the block table of its first `tokens` tokens:
//! `[⌈tokens / block_size⌉]` physical ids, [`NULL_BLOCK`] where a sliding window had already
//! reclaimed the block. Its holder owns one pool reference on every other id and gives them
//! back with [`PrefixBlocks::release`] (or hands them to a sequence with
//! [`SequenceCache::resume`]). Nothing here reads or writes pages.
//!
//! Invariants: every table has `⌈tokens / block_size⌉` entries, leading `NULL_BLOCK`s then
//! real blocks; a sliding group's leading nulls never reach into the window of a query at
//! `tokens` (so the prefix can be continued).

use crate::error::CacheError;
use crate::kv_pool::KvPool;
use crate::pages::PageStore;
use crate::pool::NULL_BLOCK;
use crate::sequence::SequenceCache;

/// A cached prefix's block ids (see the module docs).
#[derive(Debug)]
pub struct PrefixBlocks {
    /// `[groups][⌈tokens / block_size⌉]` block ids, `NULL_BLOCK` where a window reclaimed one.
    tables: Vec<Vec<u32>>,
    /// `[groups]` each sliding group's window (`None`: a group a continuation needs nothing of).
    windows: Vec<Option<usize>>,
    tokens: usize,
    block_size: usize,
}

impl PrefixBlocks {
    /// A prefix of `tokens` tokens over `tables`, whose references the caller hands over.
    pub(crate) fn new(tables: Vec<Vec<u32>>, windows: Vec<Option<usize>>, tokens: usize, block_size: usize) -> Self {
        let p = PrefixBlocks { tables, windows, tokens, block_size };
        p.debug_check();
        p
    }

    /// Tokens whose K/V the blocks hold.
    pub fn tokens(&self) -> usize {
        self.tokens
    }

    pub fn block_size(&self) -> usize {
        self.block_size
    }

    /// `[groups]` the block tables, `NULL_BLOCK` where a window reclaimed a block.
    pub fn tables(&self) -> impl Iterator<Item = &[u32]> + '_ {
        self.tables.iter().map(|t| t.as_slice())
    }

    /// Every held block id (nulls skipped), group after group.
    pub fn blocks(&self) -> impl Iterator<Item = u32> + '_ {
        self.tables.iter().flatten().copied().filter(|&b| b != NULL_BLOCK)
    }

    /// Leading reclaimed blocks of `group`.
    pub(crate) fn first_live(&self, group: usize) -> usize {
        self.tables[group].iter().take_while(|&&b| b == NULL_BLOCK).count()
    }

    /// Whether a sequence can continue from position `pos` of this prefix: `pos ≤ tokens`,
    /// and every windowed group still holds the window of a query at `pos`.
    pub fn holds_windows_at(&self, pos: usize) -> bool {
        pos <= self.tokens
            && self.windows.iter().enumerate().all(|(g, w)| match w {
                Some(w) => self.first_live(g) <= (pos + 1).saturating_sub(*w) / self.block_size,
                None => true,
            })
    }

    /// Drops the last logical block (the tokens past the previous block boundary), group by
    /// group, and returns the real block ids whose references it gave back. Refused (nothing
    /// changes) when the prefix is empty or the shorter prefix would lose a window.
    pub fn trim_tail_block<S: PageStore>(&mut self, pool: &mut KvPool<S>) -> Result<Vec<u32>, CacheError> {
        let end = self.tokens.saturating_sub(1) / self.block_size * self.block_size;
        if self.tokens == 0 || !self.holds_windows_at(end) {
            return Err(CacheError::TrimTooFar { requested: self.tokens - end, stored: self.tokens });
        }
        let mut released = Vec::new();
        for table in &mut self.tables {
            while table.len() > end / self.block_size {
                let b = table.pop().expect("len > keep");
                if b != NULL_BLOCK {
                    pool.blocks_mut().release(b);
                    released.push(b);
                }
            }
        }
        self.tokens = end;
        self.debug_check();
        Ok(released)
    }

    /// Returns every reference to the pool, tail first, group after group from the last.
    pub fn release<S: PageStore>(self, pool: &mut KvPool<S>) {
        for table in self.tables.iter().rev() {
            for &b in table.iter().rev().filter(|&&b| b != NULL_BLOCK) {
                pool.blocks_mut().release(b);
            }
        }
    }

    fn debug_check(&self) {
        debug_assert_eq!(self.tables.len(), self.windows.len());
        for (g, table) in self.tables.iter().enumerate() {
            debug_assert_eq!(table.len(), self.tokens.div_ceil(self.block_size), "group {g}: one id per block");
            let live = self.first_live(g);
            debug_assert!(table[live..].iter().all(|&b| b != NULL_BLOCK), "group {g}: nulls only in front");
        }
        debug_assert!(self.holds_windows_at(self.tokens), "a prefix is always continuable");
    }
}

impl SequenceCache {
    /// A new sequence holding the first `tokens` tokens of `prefix` (they are shared: one more
    /// reference on each block; a sliding group takes only what the window at `tokens` reaches),
    /// with this sequence's policy and reservation. `self` is a template holding no block (the
    /// engine's). Fails when `tokens` is past the prefix or where a window was lost.
    pub fn start_from<S: PageStore>(
        &self,
        pool: &mut KvPool<S>,
        prefix: &PrefixBlocks,
        tokens: usize,
    ) -> Result<SequenceCache, CacheError> {
        self.check_prefix(prefix, tokens)?;
        let seq = self.adopt(&prefix.tables, tokens, |b| pool.blocks_mut().retain(b));
        crate::stats::CacheCounters::add(&pool.counters().forks, 1);
        Ok(seq)
    }

    /// A new sequence (this template's policy) holding all of `prefix`, taking over its
    /// references: a preempted sequence resuming from what it had banked.
    pub fn resume<S: PageStore>(
        &self,
        pool: &mut KvPool<S>,
        prefix: PrefixBlocks,
    ) -> Result<SequenceCache, CacheError> {
        if let Err(e) = self.check_prefix(&prefix, prefix.tokens()) {
            prefix.release(pool);
            return Err(e);
        }
        // Blocks the window no longer reaches (the adopted table nulls them) go back now.
        let mut unused = Vec::new();
        let seq = self.adopt(&prefix.tables, prefix.tokens(), |_| ());
        for (g, table) in prefix.tables().enumerate() {
            let live = seq.group_table(g);
            unused
                .extend(table.iter().zip(live).filter(|(&b, &l)| b != NULL_BLOCK && l == NULL_BLOCK).map(|(&b, _)| b));
        }
        for b in unused {
            pool.blocks_mut().release(b);
        }
        // The references moved to `seq`; `prefix` (no `Drop`) goes without releasing them.
        drop(prefix);
        Ok(seq)
    }

    /// The cache's blocks as a bare prefix of its `offset` tokens, keeping their references;
    /// blocks past the last token (growth's spare room) go back to the pool. An open append is
    /// cancelled first (its tokens were never committed).
    pub fn into_prefix<S: PageStore>(mut self, pool: &mut KvPool<S>) -> PrefixBlocks {
        self.cancel_append();
        let (bs, offset) = (self.block_size(), self.offset());
        let windows = self.sliding_windows();
        let mut tables = Vec::with_capacity(self.num_groups());
        for g in 0..self.num_groups() {
            let table = self.group_table(g);
            let keep = offset.div_ceil(bs);
            for &b in table[keep.min(table.len())..].iter().rev().filter(|&&b| b != NULL_BLOCK) {
                pool.blocks_mut().release(b);
            }
            tables.push(table[..keep].to_vec());
        }
        PrefixBlocks::new(tables, windows, offset, bs)
    }

    fn check_prefix(&self, prefix: &PrefixBlocks, tokens: usize) -> Result<(), CacheError> {
        debug_assert_eq!(self.allocated_blocks(), 0, "a template holds no block");
        if prefix.block_size() != self.block_size() || prefix.windows != self.sliding_windows() {
            return Err(CacheError::Geometry(format!(
                "prefix of windows {:?} in blocks of {} vs a sequence of windows {:?} in blocks of {}",
                prefix.windows,
                prefix.block_size(),
                self.sliding_windows(),
                self.block_size()
            )));
        }
        if !prefix.holds_windows_at(tokens) {
            return Err(CacheError::TrimTooFar {
                requested: prefix.tokens().saturating_sub(tokens),
                stored: prefix.tokens(),
            });
        }
        Ok(())
    }
}
