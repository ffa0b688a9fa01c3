//! One forward step queued on the device: [`enqueue`] runs embed (× Gemma's embedding scale) →
//! per layer (RMSNorm, fused QKV product, bias + q/k norms + RoPE (+ Gemma's query scale), cache
//! write into the layer's page plane through its group's slots, paged attention over its group's
//! block tables with its window — decode and prefill kernels —, output product into the residual
//! (Gemma: into a buffer, then its post-norm added to the residual), RMSNorm, gate|up product,
//! SiLU·mul or GELU·mul, down product into the residual (Gemma: post-norm as above)) → final
//! RMSNorm of the logit rows → output product, with the launch shape fixed beforehand in a
//! [`Step`]. The same call is run directly or captured as a CUDA graph (`graphs.rs`).

use kvcache::KvPool;
use pagekv_cuda::{
    DecodeAttention, DecodeBatch, DecodeRoute, DeviceMatrix, DevicePages, DeviceVec, ModelOps, PrefillAttention,
    PrefillBatch, Prologue, QkvRope, RopeParams, GEMV_MAX_N, QGEMV_MAX_N,
};

use super::buffers::dev;
use super::scratch::Bufs;
use super::weights::{DeviceWeights, Weight};
use crate::error::ModelError;
use crate::llama::{Activation, ModelConfig};

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
    /// The decode route of the layers without a window of their own.
    pub(crate) route: DecodeRoute,
    /// The decode route of the layers with a window (`ModelConfig::layer_windows`; their
    /// visible context is at most the window), `route` when there are none.
    pub(crate) route_local: DecodeRoute,
    /// The batch's whole-sequence window (the layers without their own).
    pub(crate) window: Option<usize>,
    /// RoPE of the layers without a window (`rope_base`) and with one (`rope_base_local`).
    pub(crate) rope: RopeParams,
    pub(crate) rope_local: RopeParams,
    /// Multiplies the attention's q·k (1 where the queries carry the scale: `rope.q_scale`).
    pub(crate) scale: f32,
    pub(crate) gemv_max_bytes: usize,
    /// Batch-invariant products (`CudaTuning::batch_invariant`): the matrix-vector kernels for
    /// any number of token rows.
    pub(crate) invariant: bool,
    pub(crate) prefill_tiles: usize,
    pub(crate) decode_rows: DecodeRows,
    /// q, k and v finished and the cache written in one launch (`CudaTuning::qkv_write`).
    pub(crate) qkv_write: bool,
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
    let (n, n_logits, scale) = (st.n, st.n_logits, st.scale);
    match &w.token_embd {
        Weight::Dense(m) => ops.embed(&mut s.x, m, &s.tokens, n).map_err(dev)?,
        Weight::Quant(parts) => ops.quant().rows_f32(&mut s.x, &parts[0], &s.tokens, n).map_err(dev)?,
    }
    let (eps, h) = (c.rms_eps, c.hidden);
    if c.embed_scale != 1.0 {
        ops.scale(&mut s.x, n * h, c.embed_scale).map_err(dev)?;
    }
    let glu = match c.activation {
        Activation::Silu => Prologue::SiluMul,
        Activation::GeluTanh => Prologue::GeluMul,
    };
    // Each layer writes through its group's slots into its page plane and reads through its
    // group's block tables (one group of every layer for most models).
    let groups = pool.groups().clone();
    let center_keys = crate::llama::centres_keys(pool.config().format);
    let pr = Products { ops, w, gemv_max_bytes: st.gemv_max_bytes, invariant: st.invariant };
    for (li, lw) in w.layers.iter().enumerate() {
        let own_window = c.layer_windows.get(li).copied().flatten();
        let (rope, route) = if own_window.is_some() { (&st.rope_local, st.route_local) } else { (&st.rope, st.route) };
        let window = own_window.or(st.window);
        let (group, plane) = groups.locate(li);
        let (slots, tables) = (&s.slots[group], &s.tables[group]);

        // Attention block.
        let norm = Prologue::RmsNorm { w: &lw.attn_norm, eps };
        pr.product(&mut s.qkv, &s.x, norm, None, &mut s.xn, &lw.wqkv, n, false)?;
        let a = QkvRope {
            qkv: &s.qkv,
            bias: lw.bqkv.as_ref(),
            q_norm: lw.q_norm.as_ref(),
            k_norm: lw.k_norm.as_ref(),
            factors: w.rope_factors.as_ref(),
            positions: &s.positions,
            center_keys,
        };
        if st.qkv_write {
            pool.pages_mut().write_qkv(plane, slots, &mut s.q, &a, rope, n).map_err(dev)?;
        } else {
            ops.qkv_rope(&mut s.q, &mut s.k, &mut s.v, &a, rope, n).map_err(dev)?;
            pool.pages_mut().write_device(plane, slots, &s.k, &s.v, n).map_err(dev)?;
        }
        if st.decode_rows != DecodeRows::None {
            let b = DecodeBatch {
                queries: &s.q,
                num_seqs: n,
                num_heads: c.num_heads,
                block_tables: tables,
                max_blocks_per_seq: st.mb,
                context_lens: if st.decode_rows == DecodeRows::Rest { &s.ctx_dec } else { &s.ctx },
                max_context_len: st.max_ctx,
                scale,
                sliding_window: window,
            };
            attention.forward(pool.pages(), plane, &b, route, &mut s.attn).map_err(dev)?;
        }
        if st.prefill_tiles > 0 {
            // After the decode kernel: its (skipped) rows of these tokens are overwritten here.
            let b = PrefillBatch {
                queries: &s.q,
                num_tokens: n,
                num_heads: c.num_heads,
                block_tables: tables,
                max_blocks_per_seq: st.mb,
                context_lens: &s.ctx,
                tiles: &s.tiles,
                num_tiles: st.prefill_tiles,
                scale,
                sliding_window: window,
            };
            prefill.forward(pool.pages(), plane, &b, &mut s.attn).map_err(dev)?;
        }
        match &lw.post_attn_norm {
            None => pr.product(&mut s.x, &s.attn, Prologue::Convert, None, &mut s.attn_t, &lw.wo, n, true)?,
            Some(post) => {
                pr.product(&mut s.proj, &s.attn, Prologue::Convert, None, &mut s.attn_t, &lw.wo, n, false)?;
                ops.rms_norm_add(&mut s.x, &s.proj, post, n, h, eps).map_err(dev)?;
            }
        }

        // MLP block.
        let norm = Prologue::RmsNorm { w: &lw.ffn_norm, eps };
        pr.product(&mut s.gate_up, &s.x, norm, None, &mut s.xn, &lw.w_gate_up, n, false)?;
        match &lw.post_ffn_norm {
            None => pr.product(&mut s.x, &s.gate_up, glu, None, &mut s.act, &lw.w_down, n, true)?,
            Some(post) => {
                pr.product(&mut s.proj, &s.gate_up, glu, None, &mut s.act, &lw.w_down, n, false)?;
                ops.rms_norm_add(&mut s.x, &s.proj, post, n, h, eps).map_err(dev)?;
            }
        }
    }
    if n_logits > 0 {
        let norm = Prologue::RmsNorm { w: &w.output_norm, eps };
        pr.product(&mut s.logits, &s.x, norm, Some(&s.rows), &mut s.normed_rows, w.output(), n_logits, false)?;
    }
    Ok(())
}

/// Routes each matrix product of a step to its kernel.
struct Products<'a> {
    ops: &'a ModelOps,
    w: &'a DeviceWeights,
    /// Dense matrices up to this size go through the fused matrix-vector kernel in decode steps.
    gemv_max_bytes: usize,
    /// Every product of served matrices through the matrix-vector kernels, a launch of at most
    /// `GEMV_MAX_N` / `QGEMV_MAX_N` rows at a time, whatever the step's row count: their sums
    /// per output row do not depend on the rows beside it, cuBLAS's tiles do.
    invariant: bool,
}

/// Most token rows a quantized product runs through the matrix-vector kernel (in launches of
/// [`QGEMV_MAX_N`] rows) before dequantizing tiles for cuBLAS pays off.
const QGEMV_MAX_ROWS: usize = 16;

impl Products<'_> {
    /// `out [n, w.rows] (+)= prologue(x) · wᵀ` (rows `rows [n]` of `x` when given). Decode-sized
    /// products run the fused matrix-vector kernels (prologue inside; a weight of two K-quant
    /// parts in one launch where the paired kernel serves it); others compute the
    /// prologue into `staged` (the product type) and multiply on the tensor cores: quantized
    /// weights of up to `CudaTuning::qmma_max_rows` token rows by `QuantOps::mma` (each weight
    /// tile dequantized in shared memory), larger ones dequantized into a bf16 tile a range of
    /// rows at a time for cuBLAS, dense ones by cuBLAS.
    #[allow(clippy::too_many_arguments)]
    fn product(
        &self,
        out: &mut DeviceVec<f32>,
        x: &DeviceVec<f32>,
        prologue: Prologue,
        rows: Option<&DeviceVec<u32>>,
        staged: &mut DeviceMatrix,
        w: &Weight,
        n: usize,
        accumulate: bool,
    ) -> Result<(), ModelError> {
        let ops = self.ops;
        match w {
            Weight::Dense(m) if m.bytes() <= self.gemv_max_bytes && ops.gemv_serves(m, n) => {
                ops.gemv(out, x, m, prologue, rows, n, accumulate).map_err(dev)
            }
            Weight::Dense(m)
                if self.invariant && m.bytes() <= self.gemv_max_bytes && ops.gemv_serves(m, n.min(GEMV_MAX_N)) =>
            {
                for first in (0..n).step_by(GEMV_MAX_N) {
                    let k = GEMV_MAX_N.min(n - first);
                    ops.gemv_rows(out, x, m, prologue, rows, first, k, accumulate).map_err(dev)?;
                }
                Ok(())
            }
            Weight::Dense(m) => {
                stage(ops, staged, x, prologue, rows, n)?;
                ops.matmul(out, staged, m, n, accumulate).map_err(dev)
            }
            Weight::Quant(parts) => {
                let q = ops.quant();
                let ldo = w.rows();
                let gemv_rows = self.invariant || n <= QGEMV_MAX_ROWS;
                if let [a, b] = parts.as_slice() {
                    if q.gemv_pair_serves(a, b, n) {
                        return q.gemv_pair(out, 0, ldo, x, a, b, prologue, rows, 0, n, accumulate).map_err(dev);
                    }
                }
                if gemv_rows && parts.iter().all(|p| q.gemv_serves(p, n.min(QGEMV_MAX_N))) {
                    // Every launch after the first reads the same x and writes other outputs: a
                    // sibling of the one before it (runs beside that one's tail).
                    let (mut col, mut sibling) = (0, false);
                    for p in parts {
                        for first in (0..n).step_by(QGEMV_MAX_N) {
                            let k = QGEMV_MAX_N.min(n - first);
                            q.gemv(out, col, ldo, x, p, prologue, rows, first, k, accumulate, sibling).map_err(dev)?;
                            sibling = true;
                        }
                        col += p.rows();
                    }
                    return Ok(());
                }
                stage(ops, staged, x, prologue, rows, n)?;
                if parts.iter().all(|p| q.mma_serves(p, n)) {
                    let mut col = 0;
                    for p in parts {
                        q.mma(out, col, ldo, staged, p, n, accumulate).map_err(dev)?;
                        col += p.rows();
                    }
                    return Ok(());
                }
                let tile = self.w.tile(w.cols()).ok_or_else(|| ModelError::Device("no dequantization tile".into()))?;
                let mut col = 0;
                for p in parts {
                    let mut r = 0;
                    while r < p.rows() {
                        let k = tile.rows().min(p.rows() - r);
                        q.dequantize(tile, p, r, k).map_err(dev)?;
                        ops.matmul_cols(out, col + r, ldo, staged, tile, k, n, accumulate).map_err(dev)?;
                        r += k;
                    }
                    col += p.rows();
                }
                Ok(())
            }
        }
    }
}

/// `staged [n, ·]` (product type) ← the prologue applied to `x` (rows `rows` when given).
fn stage(
    ops: &ModelOps,
    staged: &mut DeviceMatrix,
    x: &DeviceVec<f32>,
    prologue: Prologue,
    rows: Option<&DeviceVec<u32>>,
    n: usize,
) -> Result<(), ModelError> {
    match prologue {
        Prologue::RmsNorm { w, eps } => ops.rms_norm(staged, x, w, rows, n, eps),
        Prologue::Convert => ops.convert(staged, x, n * staged.cols()),
        Prologue::SiluMul => ops.silu_mul(staged, x, n),
        Prologue::GeluMul => ops.gelu_mul(staged, x, n),
    }
    .map_err(dev)
}
