//! The block pool: block ids, reference counts and the free queue — nothing else (no bytes,
//! no policy, no prefix index: which blocks hold which prefix is the engine's session bank's
//! to know, since a prefix spans one block per layer group).
//!
//! Invariants (checked by [`BlockPool::check_invariants`] in debug builds and tests):
//! - every block is either *used* (`ref_count ≥ 1`) or *free* (`ref_count = 0`), and a block is
//!   in the free queue exactly when it is free: `used + free = total`;
//! - allocation pops the queue's front and a freed block joins its back, so the least recently
//!   freed block is reused first.
//!
//! The free queue is an intrusive doubly linked list over block ids, so allocate and free are
//! O(1).

/// Sentinel for "no block" in block tables (a reclaimed position) and in the free list.
pub const NULL_BLOCK: u32 = u32::MAX;

/// Fixed set of blocks with reference counts and a free queue.
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
        }
    }

    pub fn num_blocks(&self) -> usize {
        self.ref_count.len()
    }

    /// Blocks with no reference.
    pub fn num_free(&self) -> usize {
        self.num_free
    }

    /// Blocks with at least one reference.
    pub fn num_used(&self) -> usize {
        self.num_blocks() - self.num_free
    }

    /// Blocks with more than one reference (shared by forks or the session bank).
    pub fn num_shared(&self) -> usize {
        self.ref_count.iter().filter(|&&n| n > 1).count()
    }

    pub fn ref_count(&self, id: u32) -> u32 {
        self.ref_count[id as usize]
    }

    /// Takes the least recently freed block with one
    /// reference; `None` when every block is in use.
    pub fn allocate(&mut self) -> Option<u32> {
        let id = self.head;
        if id == NULL_BLOCK {
            return None;
        }
        self.unlink(id);
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

    /// Adds a reference to a block that is in use (sharing by a fork or the session bank).
    pub fn retain(&mut self, id: u32) {
        debug_assert!(self.ref_count[id as usize] >= 1, "retain of free block {id}");
        self.ref_count[id as usize] += 1;
    }

    /// Drops a reference; the last one returns the block to the back of the free queue.
    /// Returns whether it became free.
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
}
