//! The attention operator: the one entry point the model calls. It validates the call, asks the
//! router for its route, runs that route's kernel and counts the call (route, fallbacks,
//! partitions, dequantized tokens) in the pool's counters.

use kvcache::{AttentionRoute, CacheCounters, KvFormat, LayerView};

use super::config::{AttentionConfig, AttnImpl, AttnNumerics};
use super::error::AttentionError;
use super::ggml::{GgmlAttention, GgmlSteps};
use super::group::QueryBounds;
use super::params::AttentionParams;
use super::pool::PoolHandle;
use super::queries::round_to_cache;
use super::router::{self, Plan};
use super::validate::validate;
use super::workspace::Workspace;
use super::{partitioned, primitive, reference};

/// The attention operator: configuration, thread pool, the ggml-numerics operator and a
/// workspace reused across calls (the decode step allocates nothing once the workspace has
/// grown to the batch's size).
pub struct Attention {
    config: AttentionConfig,
    pool: PoolHandle,
    workspace: Workspace,
    ggml: GgmlAttention,
}

impl Attention {
    pub fn new(config: AttentionConfig, pool: impl Into<PoolHandle>) -> Attention {
        let pool = pool.into();
        let ggml = ggml_operator(&config, &pool);
        Attention { config, pool, workspace: Workspace::default(), ggml }
    }

    pub fn config(&self) -> &AttentionConfig {
        &self.config
    }

    pub fn set_impl(&mut self, impl_: AttnImpl) {
        self.config.impl_ = impl_;
    }

    /// Chooses how attention rounds (see [`AttnNumerics`]).
    pub fn set_numerics(&mut self, numerics: AttnNumerics) {
        self.config.numerics = numerics;
        self.ggml = ggml_operator(&self.config, &self.pool);
    }

    /// The numerics calls over a cache of `format` with heads of `head_dim` run: `Fast` or
    /// `Ggml`, never `Auto`.
    pub fn numerics_for(&self, format: KvFormat, head_dim: usize) -> AttnNumerics {
        router::numerics_for(&self.config, &self.ggml, format, head_dim)
    }

    /// Rounds `queries` as the numerics that serve `layer` take them: to the K cache's precision
    /// under the fast numerics (as ggml's K·Q sees them), untouched under ggml's (its kernels
    /// round them per their steps). The caller applies it before [`Self::forward`].
    pub fn prepare_queries(&self, layer: &LayerView, queries: &mut [f32]) {
        if self.numerics_for(layer.format, layer.head_dim) == AttnNumerics::Fast {
            round_to_cache(layer.format, queries);
        }
    }

    pub fn threads(&self) -> usize {
        self.pool.n_threads()
    }

    /// Computes attention for every query of `p` over `layer` into `out`
    /// (`[num_seqs, q_len, num_heads, head_dim]`), returns the route that served it and counts
    /// it (route, fallbacks, partitions, dequantized tokens) in `counters`.
    pub fn forward(
        &mut self,
        layer: &LayerView,
        p: &AttentionParams,
        counters: &CacheCounters,
        out: &mut [f32],
    ) -> Result<AttentionRoute, AttentionError> {
        validate(layer, p, out)?;
        let plan = router::plan(&self.config, &self.ggml, layer, p, self.pool.n_threads(), counters);
        match plan {
            Plan::Ggml => {
                let kernel = self.ggml.run_validated(layer, p, out)?;
                CacheCounters::add(&counters.partitions, kernel.partitions() as u64);
            }
            Plan::Primitive(isa) => {
                let psize = self.config.router.partition_size;
                primitive::attention(layer, p, psize, isa, &self.pool, &mut self.workspace, out)
            }
            Plan::Partitioned(isa) => {
                let parts = partitioned::attention(
                    layer,
                    p,
                    self.config.router.partition_size,
                    isa,
                    &self.pool,
                    &mut self.workspace,
                    out,
                );
                CacheCounters::add(&counters.partitions, parts as u64);
            }
            Plan::Reference => reference::attention(layer, p, out),
        }
        let route = plan.route();
        counters.count_route(route);
        if layer.format != KvFormat::F32 {
            CacheCounters::add(&counters.dequantized_tokens, dequantized_tokens(layer, p));
        }
        Ok(route)
    }
}

/// The ggml operator `config` asks for: its numerics' steps (every step unless `ggml` with
/// others is chosen) on the configured instruction set.
fn ggml_operator(config: &AttentionConfig, pool: &PoolHandle) -> GgmlAttention {
    let steps = match config.numerics {
        AttnNumerics::Ggml(steps) => steps,
        AttnNumerics::Auto | AttnNumerics::Fast => GgmlSteps::ALL,
    };
    GgmlAttention::new(steps, pool.clone()).with_isa(config.isa.resolve())
}

/// Token positions × kv heads read by a call: what every path decodes.
fn dequantized_tokens(layer: &LayerView, p: &AttentionParams) -> u64 {
    let per_seq: usize = (0..p.num_seqs).map(|s| QueryBounds::of(p, s).read_range().len()).sum();
    (per_seq * layer.num_kv_heads) as u64
}
