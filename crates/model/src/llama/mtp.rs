//! The forward pass of a model's next-token-prediction (MTP) layer, as DeepSeek-V3, GLM-4.5
//! and Qwen3-Next ship them (`blk.{L}.nextn.*` after the `L` main blocks, see
//! [`super::weights::MtpLayerWeights`]), for drafting.
//!
//! Entry `t` of a sequence's MTP cache is built from the main model's last hidden state `h_t`
//! (before the final norm) and the token after it, `x_{t+1}`, at position `t` (vLLM's indexing;
//! attention sees only relative positions, so numbering entries by the token's position instead
//! is the same model):
//!
//! ```text
//! x      = eh_proj · [enorm(embed(x_{t+1})), hnorm(h_t)]     [hidden]
//! g_t    = block(x)  (attention over the MTP cache's entries ..= t, causal)
//! logits = head(shared_head_norm(g_t))                       [vocab]: token t + 2
//! ```
//!
//! Drafting more than one token chains: `g_t` plays `h` for entry `t + 1` with the token just
//! drafted. Only the first MTP layer runs (as llama.cpp and vLLM do with DeepSeek-V3's and
//! GLM-4.5's single layer): the layers of a file with several were trained each one depth
//! further ahead, so chaining through one layer keeps one cache, one pool layer and one rule
//! however far the draft goes.
//!
//! The block, the norms and the products are the main forward's own (`model.rs`:
//! [`block_forward`], [`embed`], [`mm`]); only the input projection and the head are added here.

use kvcache::KvPool;

use super::model::{block_forward, embed, mm, Block, Model, Parts, Products};
use super::ops::rms_norm;
use crate::batch::{Batch, Logits};
use crate::error::ModelError;

/// Layers of an MTP pool: the one MTP layer the drafter runs.
pub const MTP_POOL_LAYERS: usize = 1;

impl Model {
    /// Whether the model carries next-token-prediction layers.
    pub fn has_mtp(&self) -> bool {
        !self.weights.mtp.is_empty()
    }

    /// Runs the first MTP layer over `batch` in `pool` (one layer, [`MTP_POOL_LAYERS`], the
    /// model's KV geometry): token `i` of the batch is `x_{t+1}` for its entry `t`, and
    /// `hidden[i]` (`[batch tokens, hidden]`) the `h_t` it is combined with. Writes each entry's
    /// K/V into `pool` and returns the logits asked for, `[batch.num_logit_rows(), vocab]`;
    /// [`Model::last_hidden`] then holds those rows' MTP outputs `g_t` (`[logit rows, hidden]`),
    /// the `h` of a chained step.
    pub fn forward_mtp(&mut self, batch: &Batch, pool: &mut KvPool, hidden: &[f32]) -> Result<&[f32], ModelError> {
        let c = &self.config;
        let Some(mtp) = self.weights.mtp.first() else {
            return Err(ModelError::Invalid(format!(
                "{} has no next-token-prediction layers ({}.nextn_predict_layers is 0 or absent)",
                c.name, c.arch_name
            )));
        };
        batch.validate_layers(MTP_POOL_LAYERS, c, pool.geometry(), pool.groups())?;
        let n = batch.num_tokens();
        let h = c.hidden;
        if hidden.len() != n * h {
            return Err(ModelError::Batch(format!(
                "{} hidden values for {n} tokens of {h} (an MTP step needs one hidden state per token)",
                hidden.len()
            )));
        }
        let n_logits = batch.num_logit_rows();
        self.scratch.ensure(c, n, n_logits, n_logits);
        let counters = pool.counters().clone();
        let s = &mut self.scratch;
        let w = &self.weights;
        let threads = self.threads;
        let mx = Products { pool: self.threads, order: self.sum_order };
        if s.cat.len() < n * 2 * h {
            s.cat.resize(n.next_power_of_two() * 2 * h, 0.0);
        }

        // `[n_logits]` the rows whose logits are wanted, in sequence order: the rows kept after
        // the block's attention.
        let mut kept: Vec<usize> = Vec::with_capacity(n_logits);
        for seq in &batch.seqs {
            let end = seq.token_start + seq.num_tokens;
            kept.extend(match seq.logits {
                Logits::None => end..end,
                Logits::Last => end - 1..end,
                Logits::All => seq.token_start..end,
            });
        }
        debug_assert_eq!(kept.len(), n_logits);

        // `[n, 2 * hidden]` rows of [enorm(embed(x_{t+1})), hnorm(h_t)], projected to `[n, hidden]`.
        let table = mtp.embed.as_ref().unwrap_or(&w.token_embd);
        embed(w, table, &batch.tokens, c.embed_scale, &mut s.xn[..n * h], threads)?;
        let (enorm, hnorm) = (w.f32s(&mtp.enorm), w.f32s(&mtp.hnorm));
        for i in 0..n {
            let row = &mut s.cat[i * 2 * h..(i + 1) * 2 * h];
            let (e, g) = row.split_at_mut(h);
            rms_norm(&s.xn[i * h..(i + 1) * h], enorm, c.rms_eps, e);
            rms_norm(&hidden[i * h..(i + 1) * h], hnorm, c.rms_eps, g);
        }
        mm(w, &mtp.eh_proj, &s.cat[..n * 2 * h], n, &mut s.x[..n * h], &mut s.quant, mx)?;

        let parts = Parts { c, w, threads, mx, rope: &self.rope, rope_local: &self.rope };
        let block = Block { weights: &mtp.block, window: None, group: 0, plane: 0 };
        let keep = (n_logits < n).then_some(&kept[..]);
        let rows = block_forward(&parts, &mut self.attention, s, &block, batch, pool, &counters, n, keep)?;
        debug_assert_eq!(rows, n_logits);

        // The block's outputs (the next chained step's `h`), then the head.
        s.hidden[..n_logits * h].copy_from_slice(&s.x[..n_logits * h]);
        let norm = w.f32s(&mtp.shared_head_norm);
        for r in 0..n_logits {
            rms_norm(&s.x[r * h..(r + 1) * h], norm, c.rms_eps, &mut s.rows[r * h..(r + 1) * h]);
        }
        let v = c.vocab_size;
        if n_logits > 0 {
            let head = mtp.head.as_ref().unwrap_or(&w.output);
            mm(w, head, &s.rows[..n_logits * h], n_logits, &mut s.logits[..n_logits * v], &mut s.quant, mx)?;
        }
        Ok(&self.scratch.logits[..n_logits * v])
    }
}
