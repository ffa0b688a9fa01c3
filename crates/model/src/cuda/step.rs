//! One forward step queued on the device: [`enqueue`] runs embed → per layer (RMSNorm, fused
//! QKV product, bias + q/k norms + RoPE, cache write, paged attention — decode and prefill
//! kernels —, output product into the residual, RMSNorm, gate|up product, SiLU·mul, down
//! product into the residual) → final RMSNorm of the logit rows → output product, with the
//! launch shape fixed beforehand in a [`Step`]. The same call is run directly or captured as a
//! CUDA graph (`graphs.rs`).

use kvcache::KvPool;
use pagekv_cuda::{
    DecodeAttention, DecodeBatch, DecodeRoute, DeviceMatrix, DevicePages, ModelOps, PrefillAttention, PrefillBatch,
    Prologue, QkvRope, RopeParams,
};

use super::buffers::dev;
use super::scratch::Bufs;
use super::weights::DeviceWeights;
use crate::error::ModelError;
use crate::llama::ModelConfig;

/// Which rows of a step the decode kernel serves.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum DecodeRows {
    /// Every row (no prefill tiles).
    All,
    /// The rows the prefill kernel does not serve (`ctx_dec`: 0 for the others).
    Rest,
    /// None: the prefill kernel serves every row.
    None,
}

/// One step's launch shape and settings (everything the queued work depends on beyond the
/// device buffers' contents).
pub(crate) struct Step {
    pub(crate) n: usize,
    pub(crate) n_logits: usize,
    pub(crate) mb: usize,
    pub(crate) max_ctx: usize,
    pub(crate) route: DecodeRoute,
    pub(crate) window: Option<usize>,
    pub(crate) rope: RopeParams,
    pub(crate) scale: f32,
    pub(crate) gemv_max_bytes: usize,
    pub(crate) prefill_tiles: usize,
    pub(crate) decode_rows: DecodeRows,
}

/// Queues a whole forward step on the device's stream: embed, every layer, the logits of the
/// rows asked for. The step's small arrays are already on the device (`s`).
#[allow(clippy::too_many_arguments)]
pub(crate) fn enqueue(
    ops: &ModelOps,
    w: &DeviceWeights,
    attention: &mut DecodeAttention,
    prefill: &mut PrefillAttention,
    s: &mut Bufs,
    pool: &mut KvPool<DevicePages>,
    c: &ModelConfig,
    st: &Step,
) -> Result<(), ModelError> {
    let (n, n_logits, qd, scale) = (st.n, st.n_logits, c.q_dim(), st.scale);
    ops.embed(&mut s.x, &w.token_embd, &s.tokens, n).map_err(dev)?;
    // Decode-sized steps multiply bf16 weights with the fused matrix-vector kernel (norm,
    // SiLU·mul or conversion in its prologue); other steps go through cuBLAS.
    let gemv = |m: &DeviceMatrix, rows: usize| m.bytes() <= st.gemv_max_bytes && ops.gemv_serves(m, rows);
    let eps = c.rms_eps;
    for (li, lw) in w.layers.iter().enumerate() {
        // Attention block.
        if gemv(&lw.wqkv, n) {
            let norm = Prologue::RmsNorm { w: &lw.attn_norm, eps };
            ops.gemv(&mut s.qkv, &s.x, &lw.wqkv, norm, None, n, false).map_err(dev)?;
        } else {
            ops.rms_norm(&mut s.xn, &s.x, &lw.attn_norm, None, n, eps).map_err(dev)?;
            ops.matmul(&mut s.qkv, &s.xn, &lw.wqkv, n, false).map_err(dev)?;
        }
        let a = QkvRope {
            qkv: &s.qkv,
            bias: lw.bqkv.as_ref(),
            q_norm: lw.q_norm.as_ref(),
            k_norm: lw.k_norm.as_ref(),
            factors: w.rope_factors.as_ref(),
            positions: &s.positions,
        };
        ops.qkv_rope(&mut s.q, &mut s.k, &mut s.v, &a, &st.rope, n).map_err(dev)?;
        pool.pages_mut().write_device(li, &s.slots, &s.k, &s.v, n).map_err(dev)?;
        if st.decode_rows != DecodeRows::None {
            let b = DecodeBatch {
                queries: &s.q,
                num_seqs: n,
                num_heads: c.num_heads,
                block_tables: &s.tables,
                max_blocks_per_seq: st.mb,
                context_lens: if st.decode_rows == DecodeRows::Rest { &s.ctx_dec } else { &s.ctx },
                max_context_len: st.max_ctx,
                scale,
                sliding_window: st.window,
            };
            attention.forward(pool.pages(), li, &b, st.route, &mut s.attn).map_err(dev)?;
        }
        if st.prefill_tiles > 0 {
            // After the decode kernel: its (skipped) rows of these tokens are overwritten here.
            let b = PrefillBatch {
                queries: &s.q,
                num_tokens: n,
                num_heads: c.num_heads,
                block_tables: &s.tables,
                max_blocks_per_seq: st.mb,
                context_lens: &s.ctx,
                tiles: &s.tiles,
                num_tiles: st.prefill_tiles,
                scale,
                sliding_window: st.window,
            };
            prefill.forward(pool.pages(), li, &b, &mut s.attn).map_err(dev)?;
        }
        if gemv(&lw.wo, n) {
            ops.gemv(&mut s.x, &s.attn, &lw.wo, Prologue::Convert, None, n, true).map_err(dev)?;
        } else {
            ops.convert(&mut s.attn_t, &s.attn, n * qd).map_err(dev)?;
            ops.matmul(&mut s.x, &s.attn_t, &lw.wo, n, true).map_err(dev)?;
        }

        // MLP block.
        if gemv(&lw.w_gate_up, n) {
            let norm = Prologue::RmsNorm { w: &lw.ffn_norm, eps };
            ops.gemv(&mut s.gate_up, &s.x, &lw.w_gate_up, norm, None, n, false).map_err(dev)?;
        } else {
            ops.rms_norm(&mut s.xn, &s.x, &lw.ffn_norm, None, n, eps).map_err(dev)?;
            ops.matmul(&mut s.gate_up, &s.xn, &lw.w_gate_up, n, false).map_err(dev)?;
        }
        if gemv(&lw.w_down, n) {
            ops.gemv(&mut s.x, &s.gate_up, &lw.w_down, Prologue::SiluMul, None, n, true).map_err(dev)?;
        } else {
            ops.silu_mul(&mut s.act, &s.gate_up, n).map_err(dev)?;
            ops.matmul(&mut s.x, &s.act, &lw.w_down, n, true).map_err(dev)?;
        }
    }
    if n_logits > 0 {
        if gemv(w.output(), n_logits) {
            let norm = Prologue::RmsNorm { w: &w.output_norm, eps };
            ops.gemv(&mut s.logits, &s.x, w.output(), norm, Some(&s.rows), n_logits, false).map_err(dev)?;
        } else {
            ops.rms_norm(&mut s.normed_rows, &s.x, &w.output_norm, Some(&s.rows), n_logits, eps).map_err(dev)?;
            ops.matmul(&mut s.logits, &s.normed_rows, w.output(), n_logits, false).map_err(dev)?;
        }
    }
    Ok(())
}
