//! `StandaloneCache`: the single-request API — one [`SequenceCache`] over its own pool.
//!
//! With growth off the sequence reserves the whole pool (`num_blocks`) up front; with
//! growth on it starts with one block and grows by about 1.5× as tokens arrive.

use crate::config::CacheConfig;
use crate::error::{CacheError, ConfigError};
use crate::kv_pool::KvPool;
use crate::pages::LayerView;
use crate::policy::SequencePolicy;
use crate::sequence::{SequenceCache, Snapshot};
use crate::stats::CacheStats;

pub struct StandaloneCache {
    pool: KvPool,
    seq: SequenceCache,
}

impl StandaloneCache {
    pub fn new(config: CacheConfig) -> Result<StandaloneCache, ConfigError> {
        let reserve = if config.dynamic_growth { config.block_size } else { config.num_blocks * config.block_size };
        let policy = SequencePolicy::from_config(&config);
        let mut pool = KvPool::new(config)?;
        let seq = SequenceCache::new(&mut pool, policy, reserve).expect("a fresh pool holds its own reservation");
        Ok(StandaloneCache { pool, seq })
    }

    pub fn append(&mut self, layer: usize, keys: &[f32], values: &[f32]) -> Result<(), CacheError> {
        self.seq.append(&mut self.pool, layer, keys, values)
    }

    pub fn trim(&mut self, n: usize) -> Result<(), CacheError> {
        self.seq.trim(&mut self.pool, n)
    }

    pub fn snapshot(&self) -> Snapshot {
        self.seq.snapshot()
    }

    pub fn restore(&mut self, snap: &Snapshot) -> Result<(), CacheError> {
        self.seq.restore(snap)
    }

    pub fn gather(&self, layer: usize, positions: std::ops::Range<usize>) -> Result<(Vec<f32>, Vec<f32>), CacheError> {
        self.seq.gather(&self.pool, layer, positions)
    }

    pub fn layer(&self, layer: usize) -> LayerView<'_> {
        self.pool.layer(layer)
    }

    pub fn sequence(&self) -> &SequenceCache {
        &self.seq
    }

    pub fn pool(&self) -> &KvPool {
        &self.pool
    }

    /// Both halves, for callers that need the pool and the sequence at once.
    pub fn parts_mut(&mut self) -> (&mut KvPool, &mut SequenceCache) {
        (&mut self.pool, &mut self.seq)
    }

    pub fn offset(&self) -> usize {
        self.seq.offset()
    }

    pub fn capacity(&self) -> usize {
        self.seq.capacity()
    }

    pub fn allocated_blocks(&self) -> usize {
        self.seq.allocated_blocks()
    }

    pub fn grow_events(&self) -> u64 {
        self.seq.grow_events()
    }

    pub fn stats(&self) -> CacheStats {
        self.pool.stats()
    }
}
