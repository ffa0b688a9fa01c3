//! The session bank: K/V of finished (and preempted, and cancelled) sequences kept for reuse,
//! and the prefix index over them and over the running sequences.
//!
//! Each full block of a sequence is named by a chained hash, `BlockHash::chain(parent, block
//! tokens, identity)`, where `identity` folds in the model, the KV format and the block size,
//! so equal hashes mean equal K/V. The index maps a hash to one holder — a sequence id and a
//! logical block — that holds that block: a running sequence (the scheduler owns it) or an
//! entry here. A new prompt walks its hashes until the first miss; the deepest hit's holder
//! is forked and trimmed to the hit, so the new sequence shares those blocks by reference and
//! computes only the rest.
//!
//! An entry is a [`PrefixBlocks`]: per layer group, the bare block ids of its tokens, holding
//! one reference on each; a new sequence starts from it with `SequenceCache::start_from` (its
//! own after a preemption with `SequenceCache::resume`). Blocks
//! whose every reference is held by bank entries are *cached*: reclaimable on demand (the
//! bank counts its own references per block to tell). Eviction takes the least recently used
//! entry whose tail block is cached and drops that one block (a sequence's tail goes before
//! its head, so shared prefixes live longest), until a block is actually freed; byte budgets
//! and TTLs evict the same way. Blocks a running sequence also holds are never counted as
//! cached nor evicted for room (that would free nothing).
//!
//! With a hybrid cache (layer groups, `kvcache::LayerGroups`) an entry holds every group's
//! table: a full group's whole prefix, a sliding group's last window. A prefix is reused only
//! where every sliding group still holds the window before the hit (`start_from` refuses
//! otherwise, and the prompt is recomputed): the next turn of the same conversation, whose
//! prompt extends everything the entry held, always is; a hit further back is not.
//!
//! The bank touches only block bookkeeping (tables, reference counts, forks, trims), never
//! the pages, so it serves any [`PageStore`] (host or device pages) alike.
//!
//! Invariant: every index key points to a holder that holds that block (`(id, i)` with
//! `i < full blocks held`); keys are removed when their holder drops the block.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use kvcache::{BlockHash, KvPool, PageStore, PrefixBlocks, SequenceCache};

use crate::config::BankConfig;

/// Where a block can be found: a sequence id (running or banked) and a logical block.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Holder {
    pub id: u64,
    pub block: usize,
}

/// Counters the bank keeps (exported through `EngineMetrics`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct BankCounters {
    /// New requests that found at least one block of their prompt.
    pub hits: u64,
    /// New requests that found none.
    pub misses: u64,
    /// Prompt tokens taken from the bank instead of computed.
    pub hit_tokens: u64,
    /// Blocks dropped from the bank (pool pressure, byte budget, TTL).
    pub evicted_blocks: u64,
    /// Entries dropped whole because their TTL passed.
    pub expired_entries: u64,
}

struct Entry {
    blocks: PrefixBlocks,
    /// `[blocks.tokens()]` the tokens whose K/V it holds.
    tokens: Vec<u32>,
    /// `[full blocks]` chained hashes of `tokens`' full blocks.
    hashes: Vec<BlockHash>,
    /// LRU order: larger = more recent.
    tick: u64,
    last_used: Instant,
}

pub(crate) struct SessionBank {
    config: BankConfig,
    block_size: usize,
    block_bytes: usize,
    entries: HashMap<u64, Entry>,
    index: HashMap<BlockHash, Holder>,
    /// `[num_blocks]` references the entries hold on each block.
    bank_refs: Vec<u32>,
    tick: u64,
    pub counters: BankCounters,
}

impl SessionBank {
    pub fn new(config: BankConfig, num_blocks: usize, block_size: usize, block_bytes: usize) -> SessionBank {
        SessionBank {
            config,
            block_size,
            block_bytes,
            entries: HashMap::new(),
            index: HashMap::new(),
            bank_refs: vec![0; num_blocks],
            tick: 0,
            counters: BankCounters::default(),
        }
    }

    pub fn enabled(&self) -> bool {
        self.config.enabled
    }

    pub fn num_entries(&self) -> usize {
        self.entries.len()
    }

    /// Points `hashes[from..]` (blocks `from..` of sequence `id`) at `id`; a hash already
    /// indexed moves to the newest holder.
    pub fn register(&mut self, id: u64, hashes: &[BlockHash], from: usize) {
        if !self.config.enabled {
            return;
        }
        for (i, &h) in hashes.iter().enumerate().skip(from) {
            self.index.insert(h, Holder { id, block: i });
        }
    }

    /// Removes the keys of `hashes` that point to `id` (it no longer holds those blocks).
    pub fn forget(&mut self, id: u64, hashes: &[BlockHash]) {
        for h in hashes {
            if self.index.get(h).is_some_and(|x| x.id == id) {
                self.index.remove(h);
            }
        }
    }

    /// The deepest indexed block along `hashes` (a prompt's chain): its holder and the number
    /// of leading blocks found. Stops at the first miss: a chain hash names its whole prefix.
    pub fn lookup(&self, hashes: &[BlockHash]) -> Option<(Holder, usize)> {
        let mut best = None;
        for (i, h) in hashes.iter().enumerate() {
            match self.index.get(h) {
                Some(&holder) => {
                    debug_assert_eq!(holder.block, i, "a chain hash names one logical position");
                    best = Some((holder, i + 1));
                }
                None => break,
            }
        }
        best
    }

    /// Banks a sequence's cache. `tokens` are the tokens whose K/V it holds
    /// (`cache.offset()` of them) and `hashes` its full blocks' hashes (at least that many).
    pub fn insert<S: PageStore>(
        &mut self,
        pool: &mut KvPool<S>,
        id: u64,
        cache: SequenceCache,
        tokens: &[u32],
        hashes: &[BlockHash],
    ) {
        debug_assert_eq!(tokens.len(), cache.offset());
        let full = tokens.len() / self.block_size;
        debug_assert!(hashes.len() >= full);
        if !self.config.enabled || cache.offset() == 0 {
            self.forget(id, hashes);
            cache.release(pool);
            return;
        }
        self.forget(id, &hashes[full..]);
        self.register(id, &hashes[..full], 0);
        let blocks = cache.into_prefix(pool);
        self.count_refs(&blocks, true);
        self.tick += 1;
        let entry = Entry {
            blocks,
            tokens: tokens.to_vec(),
            hashes: hashes[..full].to_vec(),
            tick: self.tick,
            last_used: Instant::now(),
        };
        if let Some(old) = self.entries.insert(id, entry) {
            debug_assert!(false, "sequence {id} banked twice");
            old.blocks.release(pool);
        }
    }

    /// Drops entry `origin` if its tokens are a prefix of `tokens` (a later turn of the same
    /// conversation now holds all it held).
    pub fn drop_if_prefix_of<S: PageStore>(&mut self, pool: &mut KvPool<S>, origin: u64, tokens: &[u32]) {
        if self.entries.get(&origin).is_some_and(|e| tokens.starts_with(&e.tokens)) {
            self.remove(pool, origin);
        }
    }

    /// Takes entry `id` out of the bank (a preempted sequence coming back for its own blocks).
    pub fn take(&mut self, id: u64) -> Option<PrefixBlocks> {
        let e = self.entries.remove(&id)?;
        self.count_refs(&e.blocks, false);
        // The keys stay: they point to `id`, which is about to run again and holds the blocks.
        Some(e.blocks)
    }

    /// A new sequence (`template`'s policy) sharing entry `id`'s first `blocks` blocks; the
    /// entry becomes most recent. `None` where a sliding window no longer holds what a
    /// continuation from there reaches.
    pub fn start_from<S: PageStore>(
        &mut self,
        pool: &mut KvPool<S>,
        template: &SequenceCache,
        id: u64,
        blocks: usize,
    ) -> Option<SequenceCache> {
        let e = self.entries.get_mut(&id)?;
        self.tick += 1;
        e.tick = self.tick;
        e.last_used = Instant::now();
        template.start_from(pool, &e.blocks, blocks * self.block_size).ok()
    }

    /// Releases entry `id` whole.
    pub fn remove<S: PageStore>(&mut self, pool: &mut KvPool<S>, id: u64) {
        if let Some(e) = self.entries.remove(&id) {
            for h in &e.hashes {
                if self.index.get(h).is_some_and(|x| x.id == id) {
                    self.index.remove(h);
                }
            }
            self.count_refs(&e.blocks, false);
            e.blocks.release(pool);
        }
    }

    /// Frees one cached block: trims the tail block of the least recently used entry whose
    /// tail is cached, again until a block actually returns to the pool (a block two entries
    /// share is freed when the second lets go). Returns false when no block can be freed.
    pub fn evict_block<S: PageStore>(&mut self, pool: &mut KvPool<S>) -> bool {
        loop {
            let victim = self
                .entries
                .iter()
                .filter(|(_, e)| e.blocks.tables().any(|t| t.last().is_some_and(|&b| self.is_cached(b, pool))))
                .min_by_key(|(_, e)| e.tick)
                .map(|(&id, _)| id);
            let Some(id) = victim else { return false };
            let free = pool.blocks().num_free();
            self.trim_tail_block(pool, id);
            if pool.blocks().num_free() > free {
                self.counters.evicted_blocks += 1;
                return true;
            }
        }
    }

    /// Drops entries unused for longer than the TTL, and evicts cached blocks while the bank's
    /// cached bytes exceed the budget.
    pub fn enforce_limits<S: PageStore>(&mut self, pool: &mut KvPool<S>, now: Instant) {
        if let Some(ttl) = self.config.ttl {
            let expired: Vec<u64> =
                self.entries.iter().filter(|(_, e)| now.duration_since(e.last_used) > ttl).map(|(&id, _)| id).collect();
            for id in expired {
                let free = pool.blocks().num_free();
                self.remove(pool, id);
                self.counters.evicted_blocks += (pool.blocks().num_free() - free) as u64;
                self.counters.expired_entries += 1;
            }
        }
        if let Some(max) = self.config.max_bytes {
            let mut cached = self.cached_blocks(pool);
            while cached * self.block_bytes > max && self.evict_block(pool) {
                cached -= 1;
            }
        }
    }

    /// Blocks held by the bank alone (reclaimable).
    pub fn cached_blocks<S: PageStore>(&self, pool: &KvPool<S>) -> usize {
        (0..self.bank_refs.len() as u32).filter(|&b| self.is_cached(b, pool)).count()
    }

    /// Blocks that two or more running sequences hold (the continuations of one prompt, a
    /// prefix hit on a running sequence); the bank's own references do not count.
    pub fn shared_blocks<S: PageStore>(&self, pool: &KvPool<S>) -> usize {
        let blocks = pool.blocks();
        (0..self.bank_refs.len() as u32).filter(|&b| blocks.ref_count(b) >= 2 + self.bank_refs[b as usize]).count()
    }

    /// Whether every reference on block `b` is a bank entry's.
    fn is_cached<S: PageStore>(&self, b: u32, pool: &KvPool<S>) -> bool {
        b != kvcache::NULL_BLOCK && {
            let n = self.bank_refs[b as usize];
            n > 0 && n == pool.blocks().ref_count(b)
        }
    }

    /// Counts (or uncounts) the bank's reference on every block of every group of `blocks`.
    fn count_refs(&mut self, blocks: &PrefixBlocks, add: bool) {
        for b in blocks.blocks() {
            let n = &mut self.bank_refs[b as usize];
            if add {
                *n += 1;
            } else {
                debug_assert!(*n > 0, "block {b} not counted");
                *n -= 1;
            }
        }
    }

    /// Time until the oldest entry expires (for the scheduler's idle wait).
    pub fn next_expiry(&self, now: Instant) -> Option<Duration> {
        let ttl = self.config.ttl?;
        self.entries.values().map(|e| (e.last_used + ttl).saturating_duration_since(now)).min()
    }

    /// Releases every entry (shutdown).
    pub fn clear<S: PageStore>(&mut self, pool: &mut KvPool<S>) {
        let ids: Vec<u64> = self.entries.keys().copied().collect();
        for id in ids {
            self.remove(pool, id);
        }
    }

    fn trim_tail_block<S: PageStore>(&mut self, pool: &mut KvPool<S>, id: u64) {
        let bs = self.block_size;
        let Some(e) = self.entries.get_mut(&id) else { return };
        let Ok(released) = e.blocks.trim_tail_block(pool) else {
            // A sliding group would lose its window: the entry goes whole.
            self.remove(pool, id);
            return;
        };
        for b in released {
            self.bank_refs[b as usize] -= 1;
        }
        e.tokens.truncate(e.blocks.tokens());
        if e.hashes.len() > e.tokens.len() / bs {
            let h = e.hashes.pop().expect("checked");
            if self.index.get(&h).is_some_and(|x| x.id == id) {
                self.index.remove(&h);
            }
        }
        if e.tokens.is_empty() {
            self.remove(pool, id);
        }
    }

    /// Checks the module invariant against the holders' block counts, and the per-block
    /// reference counts against the entries (`full_blocks(id)`,
    /// `None` for an unknown id). Tests and debug builds.
    #[cfg(any(test, debug_assertions))]
    pub fn check_index(&self, running_full_blocks: impl Fn(u64) -> Option<usize>) {
        for (h, x) in &self.index {
            let held = self.entries.get(&x.id).map(|e| e.hashes.len()).or_else(|| running_full_blocks(x.id));
            let held = held.unwrap_or_else(|| panic!("hash {h:?} points to unknown sequence {}", x.id));
            assert!(x.block < held, "hash {h:?} points to block {} of {} which holds {held}", x.block, x.id);
            if let Some(e) = self.entries.get(&x.id) {
                assert_eq!(e.hashes[x.block], *h, "entry {} block {} has another hash", x.id, x.block);
            }
        }
        let mut refs = vec![0u32; self.bank_refs.len()];
        for e in self.entries.values() {
            for b in e.blocks.blocks() {
                refs[b as usize] += 1;
            }
        }
        assert_eq!(refs, self.bank_refs, "per-block bank references disagree with the entries");
    }
}

/// A fork of `cache` trimmed to its first `tokens` tokens (a block boundary): the new cache
/// shares those blocks by reference and holds nothing else.
pub(crate) fn fork_prefix<S: PageStore>(
    cache: &SequenceCache,
    pool: &mut KvPool<S>,
    tokens: usize,
) -> Option<SequenceCache> {
    debug_assert!(tokens <= cache.offset());
    let mut fork = cache.fork(pool).ok()?;
    if fork.trim(pool, fork.offset() - tokens).is_err() {
        fork.release(pool);
        return None;
    }
    Some(fork)
}

#[cfg(test)]
mod tests {
    use super::*;
    use kvcache::{CacheConfig, SequencePolicy};

    const BS: usize = 8;

    fn pool(blocks: usize) -> KvPool {
        let mut c = CacheConfig::new(1, 1, 8);
        c.block_size = BS;
        c.num_blocks = blocks;
        KvPool::new(c).unwrap()
    }

    fn block_bytes(pool: &KvPool) -> usize {
        let (a, b) = pool.geometry().block_bytes_by_category();
        a + b
    }

    fn bank(pool: &KvPool, config: BankConfig) -> SessionBank {
        SessionBank::new(config, pool.blocks().num_blocks(), BS, block_bytes(pool))
    }

    fn policy() -> SequencePolicy {
        SequencePolicy {
            dynamic_growth: true,
            context_window: None,
            sliding_window: None,
            debug_blocks: false,
            trim_margin: 0,
        }
    }

    /// The engine's template: the policy, no block.
    fn template(pool: &KvPool) -> SequenceCache {
        SequenceCache::reserving(pool, policy(), 0)
    }

    /// A sequence starting from entry `id`'s first `blocks` blocks.
    fn start(b: &mut SessionBank, p: &mut KvPool, id: u64, blocks: usize) -> Option<SequenceCache> {
        let t = template(p);
        b.start_from(p, &t, id, blocks)
    }

    /// A sequence holding `tokens` (K/V pages are not written: only bookkeeping is tested).
    fn cache_with(pool: &mut KvPool, tokens: &[u32]) -> SequenceCache {
        let mut c = SequenceCache::new(pool, policy(), 0).unwrap();
        if !tokens.is_empty() {
            c.begin_append(pool, tokens.len()).unwrap();
            c.commit_append(pool);
            c.trim(pool, 0).unwrap(); // drop the growth's spare blocks: hold exactly what is used
        }
        c
    }

    fn hashes(tokens: &[u32]) -> Vec<BlockHash> {
        let mut out: Vec<BlockHash> = Vec::new();
        for chunk in tokens.chunks_exact(BS) {
            out.push(BlockHash::chain(out.last().copied(), chunk, 42));
        }
        out
    }

    fn toks(seed: u32, n: usize) -> Vec<u32> {
        (0..n as u32).map(|i| seed * 1000 + i).collect()
    }

    fn put(b: &mut SessionBank, pool: &mut KvPool, id: u64, tokens: &[u32]) -> Vec<u32> {
        let c = cache_with(pool, tokens);
        let table = c.block_table().to_vec();
        b.insert(pool, id, c, tokens, &hashes(tokens));
        table
    }

    fn no_running(_: u64) -> Option<usize> {
        None
    }

    #[test]
    fn lookup_finds_the_deepest_prefix_and_forks_share_blocks() {
        let mut p = pool(32);
        let mut b = bank(&p, BankConfig::default());
        let a = toks(1, 30); // 3 full blocks + 6 tokens
        let table = put(&mut b, &mut p, 1, &a);
        assert_eq!(table.len(), 4);
        b.check_index(no_running);
        // A prompt sharing 2 blocks and then diverging.
        let mut q = a[..20].to_vec();
        q.extend(toks(9, 20));
        let (holder, n) = b.lookup(&hashes(&q)).unwrap();
        assert_eq!((holder, n), (Holder { id: 1, block: 1 }, 2));
        let fork = start(&mut b, &mut p, 1, n).unwrap();
        assert_eq!(fork.offset(), 16);
        assert_eq!(fork.block_table(), &table[..2]);
        assert_eq!(p.blocks().ref_count(table[0]), 2);
        assert_eq!(p.blocks().ref_count(table[2]), 1);
        // Only bank-only blocks are cached.
        assert_eq!(b.cached_blocks(&p), 2);
        // Another model/format identity never matches.
        let other: Vec<BlockHash> = vec![BlockHash::chain(None, &a[..BS], 43)];
        assert_eq!(b.lookup(&other), None);
        assert_eq!(b.lookup(&hashes(&toks(5, 16))), None);
        fork.release(&mut p);
        p.blocks().check_invariants();
    }

    #[test]
    fn eviction_is_lru_and_tail_first_and_skips_shared_blocks() {
        let mut p = pool(32);
        let mut b = bank(&p, BankConfig::default());
        let older = put(&mut b, &mut p, 1, &toks(1, 20)); // blocks: 8 + 8 + 4
        let newer = put(&mut b, &mut p, 2, &toks(2, 16));
        // A running sequence shares the newer entry's first block.
        let running = start(&mut b, &mut p, 2, 1).unwrap(); // now entry 2 is the most recent
        let mut freed = Vec::new();
        loop {
            let before = p.blocks().free_order();
            if !b.evict_block(&mut p) {
                break;
            }
            let after = p.blocks().free_order();
            assert_eq!(after.len(), before.len() + 1, "each eviction frees exactly one block");
            freed.push(*after.last().unwrap());
            b.check_index(no_running);
        }
        // Entry 1 tail first, then entry 2's unshared tail; entry 2's shared head stays.
        assert_eq!(freed, vec![older[2], older[1], older[0], newer[1]]);
        assert_eq!(b.counters.evicted_blocks, 4);
        assert_eq!(b.num_entries(), 1, "entry 1 is gone, entry 2 keeps its shared block");
        assert_eq!(b.cached_blocks(&p), 0);
        let h = hashes(&toks(2, 16));
        assert_eq!(b.lookup(&h), Some((Holder { id: 2, block: 0 }, 1)), "the shared block is still found");
        running.release(&mut p);
        assert!(b.evict_block(&mut p), "once the runner is gone the block is reclaimable");
        assert_eq!(b.num_entries(), 0);
        assert_eq!(b.lookup(&h), None);
        assert_eq!(p.blocks().num_free(), 32);
    }

    #[test]
    fn byte_budget_and_ttl() {
        let mut p = pool(32);
        let bb = block_bytes(&p);
        let mut b = bank(&p, BankConfig { enabled: true, max_bytes: Some(3 * bb), ttl: None });
        put(&mut b, &mut p, 1, &toks(1, 24));
        put(&mut b, &mut p, 2, &toks(2, 24));
        assert_eq!(b.cached_blocks(&p), 6);
        b.enforce_limits(&mut p, Instant::now());
        assert_eq!(b.cached_blocks(&p), 3);
        assert_eq!(b.lookup(&hashes(&toks(1, 24))), None, "the least recently used entry went first");
        assert_eq!(b.lookup(&hashes(&toks(2, 24))).unwrap().1, 3);

        let mut t = bank(&p, BankConfig { enabled: true, max_bytes: None, ttl: Some(Duration::from_secs(60)) });
        put(&mut t, &mut p, 3, &toks(3, 16));
        let now = Instant::now();
        assert!(t.next_expiry(now).unwrap() <= Duration::from_secs(60));
        t.enforce_limits(&mut p, now);
        assert_eq!(t.num_entries(), 1, "not expired yet");
        t.enforce_limits(&mut p, now + Duration::from_secs(61));
        assert_eq!((t.num_entries(), t.counters.expired_entries, t.counters.evicted_blocks), (0, 1, 2));
        b.clear(&mut p);
        assert_eq!(p.blocks().num_free(), 32);
    }

    #[test]
    fn a_later_turn_replaces_the_entry_it_extends() {
        let mut p = pool(32);
        let mut b = bank(&p, BankConfig::default());
        let turn1 = toks(1, 20);
        put(&mut b, &mut p, 1, &turn1);
        let mut turn2 = turn1.clone();
        turn2.extend(toks(2, 12));
        let mut c = start(&mut b, &mut p, 1, 2).unwrap();
        c.begin_append(&mut p, turn2.len() - 16).unwrap();
        c.commit_append(&mut p);
        c.trim(&mut p, 0).unwrap();
        b.insert(&mut p, 2, c, &turn2, &hashes(&turn2));
        b.drop_if_prefix_of(&mut p, 1, &turn2);
        assert_eq!(b.num_entries(), 1);
        b.check_index(no_running);
        assert_eq!(b.lookup(&hashes(&turn2)).unwrap(), (Holder { id: 2, block: 3 }, 4));
        // An unrelated entry is not dropped.
        put(&mut b, &mut p, 3, &toks(3, 8));
        b.drop_if_prefix_of(&mut p, 3, &turn2);
        assert_eq!(b.num_entries(), 2);
        // Every block is held exactly once: entry 1's partial block was returned.
        assert_eq!(p.blocks().num_used(), 4 + 1);
    }

    #[test]
    fn disabled_bank_releases_at_once() {
        let mut p = pool(8);
        let mut b = bank(&p, BankConfig { enabled: false, ..BankConfig::default() });
        put(&mut b, &mut p, 1, &toks(1, 20));
        assert_eq!((b.num_entries(), p.blocks().num_free()), (0, 8));
        assert_eq!(b.lookup(&hashes(&toks(1, 20))), None);
    }

    #[test]
    fn a_block_two_entries_share_is_cached_and_freed_when_both_let_go() {
        let mut p = pool(16);
        let mut b = bank(&p, BankConfig::default());
        let a = toks(1, 16);
        let table = put(&mut b, &mut p, 1, &a);
        // Entry 2 = entry 1's first block + one more block of its own.
        let mut c = start(&mut b, &mut p, 1, 1).unwrap();
        c.begin_append(&mut p, 8).unwrap();
        c.commit_append(&mut p);
        c.trim(&mut p, 0).unwrap();
        let mut two = a[..8].to_vec();
        two.extend(toks(2, 8));
        let own = c.block_table()[1];
        b.insert(&mut p, 2, c, &two, &hashes(&two));
        assert_eq!(p.blocks().ref_count(table[0]), 2);
        assert_eq!(b.cached_blocks(&p), 3, "the shared block is held by the bank alone");
        // LRU: entry 1 (tail, then its head which entry 2 still holds), then entry 2.
        let mut freed = Vec::new();
        while b.evict_block(&mut p) {
            freed.push(*p.blocks().free_order().last().unwrap());
        }
        assert_eq!(freed, vec![table[1], own, table[0]]);
        assert_eq!((b.num_entries(), b.cached_blocks(&p), p.blocks().num_free()), (0, 0, 16));
    }
}
