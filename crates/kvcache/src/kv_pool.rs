//! `KvPool`: one block pool plus the page storage its block ids name, and the counters.
//! Every [`crate::SequenceCache`] over the pool borrows it mutably for the operations that
//! change blocks; attention kernels borrow it immutably through [`KvPool::layer`].

use std::sync::Arc;

use crate::config::CacheConfig;
use crate::error::ConfigError;
use crate::groups::LayerGroups;
use crate::pages::{HostPages, LayerView, PageGeometry, PageStore};
use crate::pool::BlockPool;
use crate::stats::{CacheCounters, CacheStats};

/// A block pool with its pages (host memory by default) and counters.
pub struct KvPool<S: PageStore = HostPages> {
    config: CacheConfig,
    /// The layer groups of `config`, shared with every sequence over the pool.
    groups: Arc<LayerGroups>,
    blocks: BlockPool,
    pages: S,
    counters: Arc<CacheCounters>,
}

impl KvPool<HostPages> {
    /// A pool of `config.num_blocks` blocks in host memory (zeroed, committed lazily).
    pub fn new(config: CacheConfig) -> Result<KvPool<HostPages>, ConfigError> {
        config.validate()?;
        let pages = HostPages::new(geometry_of(&config));
        Ok(KvPool::from_parts(config, pages))
    }

    /// Read-only view of one layer's pages for attention kernels.
    pub fn layer(&self, layer: usize) -> LayerView<'_> {
        self.pages.layer(layer)
    }
}

impl<S: PageStore> KvPool<S> {
    /// A pool over storage built elsewhere (the CUDA backend's device pages).
    pub fn with_store(config: CacheConfig, pages: S) -> Result<KvPool<S>, ConfigError> {
        config.validate()?;
        if pages.geometry() != &geometry_of(&config) {
            return Err(ConfigError::Geometry(format!(
                "page store geometry {:?} does not match the config",
                pages.geometry()
            )));
        }
        Ok(KvPool::from_parts(config, pages))
    }

    fn from_parts(config: CacheConfig, pages: S) -> KvPool<S> {
        KvPool {
            blocks: BlockPool::new(config.num_blocks),
            pages,
            counters: Arc::new(CacheCounters::default()),
            groups: Arc::new(config.groups.clone()),
            config,
        }
    }

    pub fn config(&self) -> &CacheConfig {
        &self.config
    }

    /// Layer groups: which block table and page plane each layer uses.
    pub fn groups(&self) -> &Arc<LayerGroups> {
        &self.groups
    }

    pub fn geometry(&self) -> &PageGeometry {
        self.pages.geometry()
    }

    pub fn blocks(&self) -> &BlockPool {
        &self.blocks
    }

    /// Direct access to the block pool, for the engine's session bank (which retains and
    /// releases the blocks it keeps). Sequence bookkeeping goes through [`crate::SequenceCache`].
    pub fn blocks_mut(&mut self) -> &mut BlockPool {
        &mut self.blocks
    }

    pub fn pages(&self) -> &S {
        &self.pages
    }

    pub fn pages_mut(&mut self) -> &mut S {
        &mut self.pages
    }

    pub(crate) fn parts_mut(&mut self) -> (&mut BlockPool, &mut S, &CacheCounters) {
        (&mut self.blocks, &mut self.pages, &self.counters)
    }

    /// The live counters (shared with kernels that count routes and fallbacks).
    pub fn counters(&self) -> &Arc<CacheCounters> {
        &self.counters
    }

    /// A snapshot of counters and occupancy.
    pub fn stats(&self) -> CacheStats {
        let g = self.geometry();
        let (code_per_block, scale_per_block) = g.block_bytes_by_category();
        let mut s = CacheStats {
            format: g.format.name(),
            blocks_total: self.blocks.num_blocks(),
            blocks_used: self.blocks.num_used(),
            blocks_free: self.blocks.num_free(),
            blocks_shared: self.blocks.num_shared(),
            code_bytes_used: code_per_block * self.blocks.num_used(),
            scale_bytes_used: scale_per_block * self.blocks.num_used(),
            bytes_total: (code_per_block + scale_per_block) * self.blocks.num_blocks(),
            ..CacheStats::default()
        };
        CacheStats::read_counters(&self.counters, &mut s);
        s
    }
}

/// The page geometry a configuration describes.
/// Its `num_layers` is the page planes ([`crate::LayerGroups::planes`]): `num_layers` when the
/// cache is one group.
pub fn geometry_of(config: &CacheConfig) -> PageGeometry {
    PageGeometry {
        num_layers: config.groups.planes(),
        num_blocks: config.num_blocks,
        block_size: config.block_size,
        num_kv_heads: config.num_kv_heads,
        head_dim: config.head_dim,
        format: config.format,
        rotation_seed: config.rotation_seed,
    }
}
