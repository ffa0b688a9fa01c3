//! [`Forward`]: what a generator needs from a model backend — one forward step over a pool of
//! the backend's pages, and reduced forms of its logit rows: the greedy choice of each row
//! ([`argmax`]) and each row's best `k` entries ([`top_k`]), so a backend whose logits live on a
//! device need not copy `[rows, vocab]` to the host when the sampler needs less. [`crate::Model`] (the CPU,
//! pages in host memory) and, with the `cuda` feature, [`crate::cuda::CudaModel`] (device
//! pages) implement it; `pagekv_engine::Generator` runs over either.

use kvcache::{CacheConfig, HostPages, KvPool, PageStore};
use pagekv_cpu::attention::AttnNumerics;
use pagekv_cpu::quant::SumOrder;

use crate::batch::Batch;
use crate::error::ModelError;
use crate::llama::{Model, ModelConfig};

/// A model that runs forward steps over a pool of its own pages.
pub trait Forward {
    /// Where the KV pages live.
    type Pages: PageStore;

    fn config(&self) -> &ModelConfig;

    /// Whether the forward reads a hybrid cache (one block table per layer group,
    /// [`kvcache::LayerGroups`]). A backend that does not is given one group: per-layer
    /// windows then apply by masking alone.
    fn reads_layer_groups(&self) -> bool {
        true
    }

    /// A pool of `cache` (its geometry must be the model's) in the backend's memory.
    fn new_pool(&self, cache: CacheConfig) -> Result<KvPool<Self::Pages>, ModelError>;

    /// Runs one step: writes the batch's K/V into `pool` (every layer) and returns the logits
    /// asked for, `[batch.num_logit_rows(), vocab]` f32 on the host, in sequence order.
    fn forward(&mut self, batch: &Batch, pool: &mut KvPool<Self::Pages>) -> Result<&[f32], ModelError>;

    /// The logits of the last [`Self::forward`] (`[rows, vocab]`, valid up to that call's rows).
    fn last_logits(&self) -> &[f32];

    /// Whether the forward methods hand out the last hidden states a batch asks for
    /// (`BatchSeq::hidden`, read with [`Self::last_hidden`]). A backend that does not ignores
    /// the request; a drafter that needs them (next-token-prediction heads) is refused there.
    fn hands_out_hidden(&self) -> bool {
        false
    }

    /// The last hidden states of the last step (the last block's output before the final norm),
    /// `[hidden rows, hidden]` f32: every token of each sequence whose `BatchSeq::hidden` was
    /// set, in batch order. Empty where [`Self::hands_out_hidden`] is false. Sequences that do
    /// not ask cost nothing.
    fn last_hidden(&self) -> &[f32] {
        &[]
    }

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

    /// Runs one step like [`Self::forward`] and writes each logit row's `k` best entries
    /// ([`top_k`]'s order and padding): `ids` and `values` `[rows, k]`. A backend may skip copying
    /// the logits to the host; [`Self::fetch_logits`] then brings them.
    fn forward_top_k(
        &mut self,
        batch: &Batch,
        pool: &mut KvPool<Self::Pages>,
        k: usize,
        ids: &mut Vec<u32>,
        values: &mut Vec<f32>,
    ) -> Result<(), ModelError> {
        let vocab = self.config().vocab_size;
        let logits = self.forward(batch, pool)?;
        ids.clear();
        values.clear();
        for row in logits.chunks_exact(vocab) {
            top_k(row, k, ids, values);
        }
        Ok(())
    }

    /// The logits of the last step on the host, `[rows, vocab]`, after any of the forward
    /// methods (a backend whose [`Self::forward_greedy`] or [`Self::forward_top_k`] leaves them
    /// on the device copies them here; the defaults keep them in [`Self::last_logits`]). After
    /// it, [`Self::last_logits`] holds them too.
    fn fetch_logits(&mut self) -> Result<&[f32], ModelError> {
        Ok(self.last_logits())
    }

    /// Asks for numerics under which a sequence's results do not depend on how its tokens were
    /// batched, chunked, cached or recomputed: what a serving engine's batching, session bank
    /// and preemption promise. A backend whose default numerics depend on a call's shape (the
    /// CPU's `auto`, which follows llama.cpp: one summation order for a prefill chunk, another
    /// for a decode step) switches to ones that do not; a choice made explicitly stays.
    fn ensure_path_invariance(&mut self) {}

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

/// Padding id of [`top_k`] for a row with fewer than `k` non-NaN values (its value is NaN).
pub const TOP_K_NONE: u32 = u32::MAX;

/// Appends `row`'s `k` best entries to `ids` and `values`: larger value first (IEEE order, so
/// `-0.0` and `0.0` are equal), lower index among equals, NaN never; a row with fewer than `k`
/// non-NaN values is padded with ([`TOP_K_NONE`], NaN). The first entry is [`argmax`]'s choice
/// (when the row has a non-NaN value). The rule every backend's top-k follows.
pub fn top_k(row: &[f32], k: usize, ids: &mut Vec<u32>, values: &mut Vec<f32>) {
    if k == 0 {
        return;
    }
    let start = ids.len();
    // Insertion into a sorted list of at most k: k is small (a sampler's top-k).
    for (i, &l) in row.iter().enumerate() {
        if l.is_nan() {
            continue;
        }
        let len = ids.len() - start;
        if len == k && l <= values[start + k - 1] {
            continue;
        }
        // After every entry not smaller (equal values keep the lower index first).
        let at = start + values[start..].partition_point(|&x| x >= l);
        if len == k {
            ids.pop();
            values.pop();
        }
        ids.insert(at, i as u32);
        values.insert(at, l);
    }
    let pad = start + k - ids.len();
    ids.extend(std::iter::repeat_n(TOP_K_NONE, pad));
    values.extend(std::iter::repeat_n(f32::NAN, pad));
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

    fn hands_out_hidden(&self) -> bool {
        true
    }

    fn last_hidden(&self) -> &[f32] {
        Model::last_hidden(self)
    }

    /// `auto` becomes `fast`: ggml's summation order differs between a prefill chunk and a
    /// decode step, so a token's K/V would depend on which of the two computed it. Under the
    /// fast numerics the K-quant products then give every row its one-row result too
    /// ([`SumOrder::RowInvariant`]; llama.cpp's orders depend on the step's row count). An
    /// explicit `ggml` stays llama.cpp's throughout.
    fn ensure_path_invariance(&mut self) {
        if self.attn_numerics() == AttnNumerics::Auto {
            self.set_attn_numerics(AttnNumerics::Fast);
        }
        if self.attn_numerics() == AttnNumerics::Fast {
            self.set_sum_order(SumOrder::RowInvariant);
        }
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
    use super::{argmax, top_k, TOP_K_NONE};
    use rand::{rngs::StdRng, Rng, SeedableRng};

    /// Reference: sort every non-NaN entry by (value desc with -0 == 0, index asc), take k, pad.
    fn top_k_by_sort(row: &[f32], k: usize) -> (Vec<u32>, Vec<f32>) {
        let mut all: Vec<(u32, f32)> =
            row.iter().enumerate().filter(|(_, l)| !l.is_nan()).map(|(i, &l)| (i as u32, l)).collect();
        all.sort_by(|a, b| b.1.partial_cmp(&a.1).unwrap().then(a.0.cmp(&b.0)));
        all.truncate(k);
        let mut ids: Vec<u32> = all.iter().map(|e| e.0).collect();
        let mut values: Vec<f32> = all.iter().map(|e| e.1).collect();
        ids.resize(k, TOP_K_NONE);
        values.resize(k, f32::NAN);
        (ids, values)
    }

    #[test]
    fn top_k_matches_a_full_sort_with_ties_zeros_infinities_and_nan() {
        let mut rng = StdRng::seed_from_u64(5);
        let specials = [0.0f32, -0.0, f32::INFINITY, f32::NEG_INFINITY, f32::NAN, 1.5, -1.5];
        for case in 0..400 {
            let n = rng.gen_range(1..300usize);
            let row: Vec<f32> = (0..n)
                .map(|_| match rng.gen_range(0..4) {
                    0 => specials[rng.gen_range(0..specials.len())],
                    1 => (rng.gen_range(-8.0f32..8.0) * 2.0).round() / 2.0,
                    _ => rng.gen_range(-8.0f32..8.0),
                })
                .collect();
            let k = rng.gen_range(1..40usize);
            let (mut ids, mut values) = (vec![7u32], vec![7.0f32]);
            top_k(&row, k, &mut ids, &mut values);
            assert_eq!((ids[0], values[0]), (7, 7.0), "appends after what is there");
            let (want_ids, want_values) = top_k_by_sort(&row, k);
            assert_eq!(ids[1..], want_ids[..], "case {case}");
            let bits =
                |v: &[f32]| v.iter().map(|x| if x.is_nan() { u32::MAX } else { x.to_bits() }).collect::<Vec<_>>();
            assert_eq!(bits(&values[1..]), bits(&want_values), "case {case}");
            if row.iter().any(|l| !l.is_nan()) {
                assert_eq!(ids[1], argmax(&row), "case {case}: the first entry is the argmax");
            }
        }
    }

    #[test]
    fn argmax_takes_the_first_maximum_and_skips_nan() {
        assert_eq!(argmax(&[1.0, 3.0, 3.0, -1.0]), 1);
        assert_eq!(argmax(&[f32::NAN, -5.0, f32::NAN, -4.0]), 3);
        assert_eq!(argmax(&[f32::NAN, f32::NAN]), 0);
        assert_eq!(argmax(&[f32::NEG_INFINITY, f32::NEG_INFINITY]), 0);
    }
}
