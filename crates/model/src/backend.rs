//! [`Forward`]: what a generator needs from a model backend — one forward step over a pool of
//! the backend's pages, and the greedy choice of each logit row. [`crate::Model`] (the CPU,
//! pages in host memory) and, with the `cuda` feature, [`crate::cuda::CudaModel`] (device
//! pages) implement it; `pagekv_engine::Generator` runs over either.

use kvcache::{CacheConfig, HostPages, KvPool, PageStore};

use crate::batch::Batch;
use crate::error::ModelError;
use crate::llama::{Model, ModelConfig};

/// A model that runs forward steps over a pool of its own pages.
pub trait Forward {
    /// Where the KV pages live.
    type Pages: PageStore;

    fn config(&self) -> &ModelConfig;

    /// A pool of `cache` (its geometry must be the model's) in the backend's memory.
    fn new_pool(&self, cache: CacheConfig) -> Result<KvPool<Self::Pages>, ModelError>;

    /// Runs one step: writes the batch's K/V into `pool` (every layer) and returns the logits
    /// asked for, `[batch.num_logit_rows(), vocab]` f32 on the host, in sequence order.
    fn forward(&mut self, batch: &Batch, pool: &mut KvPool<Self::Pages>) -> Result<&[f32], ModelError>;

    /// The logits of the last [`Self::forward`] (`[rows, vocab]`, valid up to that call's rows).
    fn last_logits(&self) -> &[f32];

    /// Runs one step like [`Self::forward`] and sets `ids` to the argmax of each logit row
    /// ([`argmax`]'s rule). A backend may skip copying the logits to the host: after this call
    /// [`Self::last_logits`] need not hold them.
    fn forward_greedy(
        &mut self,
        batch: &Batch,
        pool: &mut KvPool<Self::Pages>,
        ids: &mut Vec<u32>,
    ) -> Result<(), ModelError> {
        let vocab = self.config().vocab_size;
        let logits = self.forward(batch, pool)?;
        ids.clear();
        ids.extend(logits.chunks_exact(vocab).map(argmax));
        Ok(())
    }

    /// Bytes one decode step reads from the weights.
    fn weight_bytes_per_token(&self) -> usize;

    /// Where the model runs, for reports (`cpu`, `cuda:0 NVIDIA H200, bf16 weights`).
    fn device_label(&self) -> String;
}

/// Index of the largest value, the first one on ties, NaN skipped (0 when all are NaN) — the
/// rule of the engine's greedy sampler, which every backend's greedy choice follows.
pub fn argmax(row: &[f32]) -> u32 {
    let mut best: Option<(usize, f32)> = None;
    for (i, &l) in row.iter().enumerate() {
        if !l.is_nan() && best.is_none_or(|(_, b)| l > b) {
            best = Some((i, l));
        }
    }
    best.map_or(0, |(i, _)| i as u32)
}

impl Forward for Model {
    type Pages = HostPages;

    fn config(&self) -> &ModelConfig {
        &self.config
    }

    fn new_pool(&self, cache: CacheConfig) -> Result<KvPool<HostPages>, ModelError> {
        Ok(KvPool::new(cache)?)
    }

    fn forward(&mut self, batch: &Batch, pool: &mut KvPool<HostPages>) -> Result<&[f32], ModelError> {
        Model::forward(self, batch, pool)
    }

    fn last_logits(&self) -> &[f32] {
        Model::last_logits(self)
    }

    fn weight_bytes_per_token(&self) -> usize {
        Model::weight_bytes_per_token(self)
    }

    fn device_label(&self) -> String {
        "cpu".into()
    }
}

#[cfg(test)]
mod tests {
    use super::argmax;

    #[test]
    fn argmax_takes_the_first_maximum_and_skips_nan() {
        assert_eq!(argmax(&[1.0, 3.0, 3.0, -1.0]), 1);
        assert_eq!(argmax(&[f32::NAN, -5.0, f32::NAN, -4.0]), 3);
        assert_eq!(argmax(&[f32::NAN, f32::NAN]), 0);
        assert_eq!(argmax(&[f32::NEG_INFINITY, f32::NEG_INFINITY]), 0);
    }
}
