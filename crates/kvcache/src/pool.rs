//! The block pool: block ids, reference counts, the free queue and the prefix-hash map —
//! nothing else (no bytes, no policy).
//!
//! Invariants (checked by [`BlockPool::check_invariants`] in debug builds and tests):
//! - every block is either *used* (`ref_count ≥ 1`) or *free* (`ref_count = 0`), and a block is
//!   in the free queue exactly when it is free: `used + free = total`;
//! - a free block may still carry a prefix hash (it is *cached*: a later request can revive it
//!   by [`BlockPool::acquire_cached`]); allocation pops the queue's front, evicting that
//!   block's hash, so the least recently freed cached block is evicted first;
//! - the hash map and the per-block hash agree both ways.
//!
//! The free queue is an intrusive doubly linked list over block ids, so allocate, free and
//! reviving a cached block from the middle of the queue are all O(1). Free a sequence's
//! blocks tail first ([`crate::SequenceCache::release`] does) so its tail is evicted first.

use std::collections::HashMap;

/// Sentinel for "no block" in block tables (a reclaimed position) and in the free list.
pub const NULL_BLOCK: u32 = u32::MAX;

/// Identity of a full block's contents: chained over the prefix (see [`BlockHash::chain`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct BlockHash(pub u128);

impl BlockHash {
    /// `hash(parent, tokens, extra)`: `extra` carries the model and format identity, so blocks
    /// of another model or KV format never match.
    pub fn chain(parent: Option<BlockHash>, tokens: &[u32], extra: u64) -> BlockHash {
        // Two independent 64-bit FNV-1a-style mixes finished with SplitMix64: stable across
        // runs and platforms (unlike std's RandomState), 128 bits against accidental collisions.
        let mut a: u64 = 0xcbf2_9ce4_8422_2325 ^ extra;
        let mut b: u64 = 0x6c62_272e_07bb_0142 ^ extra.rotate_left(29);
        let mut feed = |x: u64| {
            a = (a ^ x).wrapping_mul(0x0000_0100_0000_01b3);
            b = crate::format::rotation::splitmix64(b ^ x);
        };
        match parent {
            Some(BlockHash(p)) => {
                feed(p as u64);
                feed((p >> 64) as u64);
            }
            None => feed(0x5eed),
        }
        feed(tokens.len() as u64);
        for &t in tokens {
            feed(t as u64);
        }
        let a = crate::format::rotation::splitmix64(a);
        BlockHash(((a as u128) << 64) | b as u128)
    }
}

/// Counters the pool keeps about itself.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PoolCounters {
    /// Cached blocks whose hash was dropped because the block was reallocated.
    pub evictions: u64,
    /// Cached blocks revived by [`BlockPool::acquire_cached`].
    pub cache_hits: u64,
}

/// Fixed set of blocks with reference counts, a free queue and a prefix-hash map.
#[derive(Clone, Debug)]
pub struct BlockPool {
    /// `[num_blocks]` references held on each block.
    ref_count: Vec<u32>,
    /// `[num_blocks]` free-queue links (`NULL_BLOCK` = none); meaningful only for free blocks.
    prev: Vec<u32>,
    next: Vec<u32>,
    head: u32,
    tail: u32,
    num_free: usize,
    /// `[num_blocks]` hash of each cached/registered block.
    hash: Vec<Option<BlockHash>>,
    by_hash: HashMap<BlockHash, u32>,
    counters: PoolCounters,
}

impl BlockPool {
    /// A pool of `num_blocks` free blocks, queued in id order (block 0 is allocated first).
    pub fn new(num_blocks: usize) -> BlockPool {
        assert!(num_blocks < NULL_BLOCK as usize, "block ids are u32; validated by CacheConfig");
        let n = num_blocks as u32;
        let prev = (0..n).map(|i| if i == 0 { NULL_BLOCK } else { i - 1 }).collect();
        let next = (0..n).map(|i| if i + 1 == n { NULL_BLOCK } else { i + 1 }).collect();
        BlockPool {
            ref_count: vec![0; num_blocks],
            prev,
            next,
            head: if n == 0 { NULL_BLOCK } else { 0 },
            tail: if n == 0 { NULL_BLOCK } else { n - 1 },
            num_free: num_blocks,
            hash: vec![None; num_blocks],
            by_hash: HashMap::new(),
            counters: PoolCounters::default(),
        }
    }

    pub fn num_blocks(&self) -> usize {
        self.ref_count.len()
    }

    /// Blocks with no reference (cached ones included).
    pub fn num_free(&self) -> usize {
        self.num_free
    }

    /// Blocks with at least one reference.
    pub fn num_used(&self) -> usize {
        self.num_blocks() - self.num_free
    }

    /// Free blocks that still hold a registered prefix (revivable).
    pub fn num_cached(&self) -> usize {
        self.by_hash.values().filter(|&&id| self.ref_count[id as usize] == 0).count()
    }

    /// Blocks registered under a prefix hash, used or free.
    pub fn num_hashed(&self) -> usize {
        self.by_hash.len()
    }

    /// Blocks with more than one reference (shared by forks, prefix hits or the session bank).
    pub fn num_shared(&self) -> usize {
        self.ref_count.iter().filter(|&&n| n > 1).count()
    }

    pub fn ref_count(&self, id: u32) -> u32 {
        self.ref_count[id as usize]
    }

    pub fn counters(&self) -> PoolCounters {
        self.counters
    }

    /// Takes the least recently freed block (evicting its cached prefix, if any) with one
    /// reference; `None` when every block is in use.
    pub fn allocate(&mut self) -> Option<u32> {
        let id = self.head;
        if id == NULL_BLOCK {
            return None;
        }
        self.unlink(id);
        if let Some(h) = self.hash[id as usize].take() {
            self.by_hash.remove(&h);
            self.counters.evictions += 1;
        }
        self.ref_count[id as usize] = 1;
        Some(id)
    }

    /// Takes `n` blocks, all or none.
    pub fn allocate_many(&mut self, n: usize) -> Option<Vec<u32>> {
        if n > self.num_free {
            return None;
        }
        Some((0..n).map(|_| self.allocate().expect("counted free blocks")).collect())
    }

    /// Adds a reference to a block that is in use (sharing by a fork or a prefix hit).
    pub fn retain(&mut self, id: u32) {
        debug_assert!(self.ref_count[id as usize] >= 1, "retain of free block {id}: use acquire_cached");
        self.ref_count[id as usize] += 1;
    }

    /// Drops a reference; the last one returns the block to the back of the free queue, where
    /// it stays cached under its hash until reallocated. Returns whether it became free.
    pub fn release(&mut self, id: u32) -> bool {
        let rc = &mut self.ref_count[id as usize];
        debug_assert!(*rc >= 1, "double free of block {id}");
        *rc -= 1;
        if *rc == 0 {
            self.push_back(id);
            true
        } else {
            false
        }
    }

    /// Registers a full block under `hash`. A hash already registered to another block keeps
    /// its block (the first copy wins); returns whether this block was registered.
    pub fn register(&mut self, id: u32, hash: BlockHash) -> bool {
        if self.by_hash.contains_key(&hash) || self.hash[id as usize].is_some() {
            return false;
        }
        self.by_hash.insert(hash, id);
        self.hash[id as usize] = Some(hash);
        true
    }

    /// Forgets a block's hash (its contents are about to change).
    pub fn unregister(&mut self, id: u32) {
        if let Some(h) = self.hash[id as usize].take() {
            self.by_hash.remove(&h);
        }
    }

    pub fn hash_of(&self, id: u32) -> Option<BlockHash> {
        self.hash[id as usize]
    }

    /// Looks up a cached prefix block without taking it.
    pub fn lookup(&self, hash: BlockHash) -> Option<u32> {
        self.by_hash.get(&hash).copied()
    }

    /// Takes a reference on the block cached under `hash`, reviving it from the free queue if
    /// no one held it. `None` if no block holds that prefix.
    pub fn acquire_cached(&mut self, hash: BlockHash) -> Option<u32> {
        let id = *self.by_hash.get(&hash)?;
        if self.ref_count[id as usize] == 0 {
            self.unlink(id);
        }
        self.ref_count[id as usize] += 1;
        self.counters.cache_hits += 1;
        Some(id)
    }

    /// Evicts the least recently freed cached block, if any cached block is free; returns it.
    /// (Used by byte budgets and TTLs above the pool; allocation evicts on its own.)
    pub fn evict_one(&mut self) -> Option<u32> {
        let mut id = self.head;
        while id != NULL_BLOCK {
            if let Some(h) = self.hash[id as usize].take() {
                self.by_hash.remove(&h);
                self.counters.evictions += 1;
                return Some(id);
            }
            id = self.next[id as usize];
        }
        None
    }

    /// The free queue front to back (the order blocks will be allocated in). For tests and
    /// the debug view; O(free).
    pub fn free_order(&self) -> Vec<u32> {
        let mut out = Vec::with_capacity(self.num_free);
        let mut id = self.head;
        while id != NULL_BLOCK {
            out.push(id);
            id = self.next[id as usize];
        }
        out
    }

    /// Verifies every invariant in the module docs; panics with a description otherwise.
    pub fn check_invariants(&self) {
        let order = self.free_order();
        assert_eq!(order.len(), self.num_free, "free count disagrees with the queue");
        let mut in_queue = vec![false; self.num_blocks()];
        for &id in &order {
            assert!(!in_queue[id as usize], "block {id} queued twice");
            in_queue[id as usize] = true;
        }
        for (id, &rc) in self.ref_count.iter().enumerate() {
            assert_eq!(rc == 0, in_queue[id], "block {id}: ref_count {rc} but queued={}", in_queue[id]);
        }
        for (&h, &id) in &self.by_hash {
            assert_eq!(self.hash[id as usize], Some(h), "hash map and block {id} disagree");
        }
        let registered = self.hash.iter().filter(|h| h.is_some()).count();
        assert_eq!(registered, self.by_hash.len(), "blocks carry hashes missing from the map");
    }

    fn unlink(&mut self, id: u32) {
        let (p, n) = (self.prev[id as usize], self.next[id as usize]);
        if p == NULL_BLOCK {
            self.head = n;
        } else {
            self.next[p as usize] = n;
        }
        if n == NULL_BLOCK {
            self.tail = p;
        } else {
            self.prev[n as usize] = p;
        }
        self.prev[id as usize] = NULL_BLOCK;
        self.next[id as usize] = NULL_BLOCK;
        self.num_free -= 1;
    }

    fn push_back(&mut self, id: u32) {
        self.prev[id as usize] = self.tail;
        self.next[id as usize] = NULL_BLOCK;
        if self.tail == NULL_BLOCK {
            self.head = id;
        } else {
            self.next[self.tail as usize] = id;
        }
        self.tail = id;
        self.num_free += 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn allocates_in_id_order_and_reuses_in_free_order() {
        let mut p = BlockPool::new(4);
        assert_eq!(p.allocate(), Some(0));
        assert_eq!(p.allocate(), Some(1));
        assert_eq!(p.allocate(), Some(2));
        assert_eq!(p.free_order(), vec![3]);
        assert!(p.release(1));
        assert!(p.release(0));
        assert_eq!(p.free_order(), vec![3, 1, 0]);
        assert_eq!(p.allocate(), Some(3));
        assert_eq!(p.allocate(), Some(1));
        assert_eq!(p.allocate(), Some(0));
        assert_eq!(p.allocate(), None, "exhaustion is a status, not a panic");
        assert_eq!((p.num_used(), p.num_free()), (4, 0));
        p.check_invariants();
    }

    #[test]
    fn shared_blocks_free_on_last_release() {
        let mut p = BlockPool::new(2);
        let b = p.allocate().unwrap();
        p.retain(b);
        assert_eq!(p.ref_count(b), 2);
        assert!(!p.release(b));
        assert_eq!(p.num_free(), 1);
        assert!(p.release(b));
        assert_eq!(p.free_order(), vec![1, 0]);
        p.check_invariants();
    }

    #[test]
    fn allocate_many_is_all_or_nothing() {
        let mut p = BlockPool::new(3);
        assert_eq!(p.allocate_many(4), None);
        assert_eq!(p.num_free(), 3);
        assert_eq!(p.allocate_many(3), Some(vec![0, 1, 2]));
    }

    #[test]
    fn cached_blocks_are_revived_or_evicted_lru() {
        let mut p = BlockPool::new(3);
        let h = |i: u32| BlockHash::chain(None, &[i], 0);
        let a = p.allocate().unwrap();
        let b = p.allocate().unwrap();
        assert!(p.register(a, h(1)));
        assert!(p.register(b, h(2)));
        let c = p.allocate().unwrap();
        assert!(!p.register(c, h(1)), "first copy wins");
        // Free tail first: b then a, so b is evicted first.
        p.release(b);
        p.release(a);
        assert_eq!(p.free_order(), vec![b, a]);
        assert_eq!(p.num_cached(), 2);
        // Revive a from the middle of the queue.
        assert_eq!(p.acquire_cached(h(1)), Some(a));
        assert_eq!(p.free_order(), vec![b]);
        p.check_invariants();
        // Allocation evicts b's prefix.
        assert_eq!(p.allocate(), Some(b));
        assert_eq!(p.lookup(h(2)), None);
        assert_eq!(p.counters(), PoolCounters { evictions: 1, cache_hits: 1 });
        p.check_invariants();
    }

    #[test]
    fn chained_hashes_depend_on_parent_tokens_and_identity() {
        let root = BlockHash::chain(None, &[1, 2, 3], 7);
        assert_eq!(root, BlockHash::chain(None, &[1, 2, 3], 7));
        assert_ne!(root, BlockHash::chain(None, &[1, 2, 4], 7));
        assert_ne!(root, BlockHash::chain(None, &[1, 2, 3], 8));
        assert_ne!(BlockHash::chain(Some(root), &[5], 7), BlockHash::chain(None, &[5], 7));
    }
}
